"""Issue 17's served targets, and the table a session's section checks its served run against."""

from bench_served import share

ISSUE_RTF, ISSUE_XRT8, ISSUE_XRT64, ISSUE_TTFA, ISSUE_TTFA95_64, ISSUE_RATIO = 0.025, 150, 500, 25, 300, 0.85


def met(ok: bool) -> str:
    return "met" if ok else "missed"


def ok_c64(many: dict) -> bool:
    """A served level at 64 streams against its three targets: aggregate, smooth playback, TTFA p95."""
    return many["x_real_time"] >= ISSUE_XRT64 and many["smooth_playback_frac"] == 1 \
        and many["ttfa_ms"]["p95"] <= ISSUE_TTFA95_64


def targets_table(one: dict, eight: dict, many: dict) -> list[str]:
    """Markdown rows for served levels at 1, 8 and 64 streams (bench_served.py's levels)."""
    return ["| target | measured | status |", "|---|---|---|",
            f"| one stream RTF <= {ISSUE_RTF} | {one['rtf']['p50']:.4f} | {met(one['rtf']['p50'] <= ISSUE_RTF)} |",
            f"| one stream TTFA p50 <= {ISSUE_TTFA} ms | {one['ttfa_ms']['p50']:.1f} ms | "
            f"{met(one['ttfa_ms']['p50'] <= ISSUE_TTFA)} |",
            f"| 8 streams >= {ISSUE_XRT8}x | {eight['x_real_time']:.1f}x | {met(eight['x_real_time'] >= ISSUE_XRT8)} |",
            f"| 64 streams >= {ISSUE_XRT64}x / smooth 100% / TTFA p95 <= {ISSUE_TTFA95_64} ms | "
            f"{many['x_real_time']:.1f}x / {share(many['smooth_playback_frac'])} / {many['ttfa_ms']['p95']:.0f} ms | "
            f"{met(ok_c64(many))} |"]


def missed_targets(last: dict) -> str:
    """The two targets still missed, as a session's served run measured them (results.json's entry of
    the forty-eighth session, whose code later sessions left unchanged): a sentence for its section."""
    return (f"Missed: one stream RTF <= {ISSUE_RTF} ({last['served'][1]['rtf_p50']:.4f}) and served/engine at 64 "
            f"streams >= {ISSUE_RATIO} ({last['served_over_engine_c64']:.3f}); the others met.")
