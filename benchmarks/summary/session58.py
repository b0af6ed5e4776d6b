"""results.md: the fifty-eighth session's section, and results_fifty_eighth.png."""

import statistics

from bench_served import share
from summary.plots import pyplot, save_panels
from summary.raw import load, metric_value, served_row
from summary.session55 import wave_gaps
from summary.session56 import dry_counts, dry_streams

S = "fiftyeighth"
# key -> its code, a short name, its colour in the plot; 3 requests a stream, timestep_buckets 10,100
CODES = {
    "edf": ("c331348: a batch delivered soonest deadline first, newcomers before everyone (reverted); the checkout",
            "deadline first", "tab:red"),
    "edflast": ("c331348 with `raw/edf_newcomers_last_fiftyeighth.patch`: deadline first, newcomers after everyone",
                "deadline first, newcomers last", "tab:orange"),
    "before": ("final code (17159b7)", "final code", "tab:green"),
    # meant for the final code, but run from the checkout while it held c331348
    "margin150": ("c331348 (deadline first), `decoder.playback_margin_ms=150`; the checkout",
                  "deadline first, margin 150 ms", "tab:blue"),
}
# (call, server's place in its call, code key); each server's raw name is {code}_call{call}_server{place}
RUNS = [(1, 1, "edf"), (1, 2, "before"),
        (2, 1, "edflast"), (2, 2, "before"), (2, 3, "edf"), (2, 4, "edflast"),
        (3, 1, "margin150"), (3, 2, "before"), (3, 3, "edf"), (3, 4, "margin150")]


def raw_name(call: int, place: int, code: str) -> str:
    """A server's name in raw/: {code}_call{call}_server{place}."""
    return f"{code}_call{call}_server{place}"


def smooth_stats(lvs: list) -> dict:
    """Served levels of one code: how many, how many played every stream smoothly, the least smooth share,
    and their x real time's median and range."""
    xrt = [lv["x_real_time"] for lv in lvs]
    return {"levels": len(lvs), "all_smooth": sum(lv["smooth_playback_frac"] == 1 for lv in lvs),
            "smooth_min": min(lv["smooth_playback_frac"] for lv in lvs), "xrt_median": statistics.median(xrt),
            "xrt_range": [min(xrt), max(xrt)]}


def smooth_cells(st: dict) -> str:
    """`smooth_stats` as markdown cells: levels | every stream smooth | least smooth | x real time, median (range)."""
    return (f"{st['levels']} | {st['all_smooth']} | {share(st['smooth_min'])} | {st['xrt_median']:.1f} "
            f"({st['xrt_range'][0]:.1f}-{st['xrt_range'][1]:.1f})")


def level_cells(lv: dict) -> str:
    """A served level as markdown cells: streams | x real time | smooth | TTFA p50 / p95 ms | dry | late ms."""
    return (f"{lv['concurrency']} | {lv['x_real_time']:.1f} | {share(lv['smooth_playback_frac'])} | "
            f"{lv['ttfa_ms']['p50']:.0f} / {lv['ttfa_ms']['p95']:.0f} | {dry_counts(lv)} | {dry_late_ms(lv):.1f}")


def first_audio_stats(lvs: list) -> dict:
    """`smooth_stats` of served levels, with their TTFA p50 range and their worst TTFA p95 (no per-stream data
    needed)."""
    return smooth_stats(lvs) | {
        "ttfa_p50_ms": [min(lv["ttfa_ms"]["p50"] for lv in lvs), max(lv["ttfa_ms"]["p50"] for lv in lvs)],
        "ttfa_p95_ms_max": max(lv["ttfa_ms"]["p95"] for lv in lvs)}


def crowd_stats(lvs: list) -> dict:
    """`first_audio_stats` of served levels, with their dry streams of the first wave and of later ones."""
    return first_audio_stats(lvs) | {
        "first_wave_dry": sum(w == 1 for lv in lvs for _, w, _ in dry_streams(lv)),
        "later_waves_dry": sum(w > 1 for lv in lvs for _, w, _ in dry_streams(lv))}


def span(values, fmt="{:.0f}") -> str:
    """'lo-hi' of values as fmt writes them, or one value where both read the same."""
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def dry_late_ms(lv: dict) -> float:
    """How late the level's latest dry stream was, ms (0 with none)."""
    return max((ms for ms, *_ in dry_streams(lv)), default=0.0)


def fifty_eighth_session(res) -> list[str]:
    """2026-12-02 (issue 17): 128 streams at once with 3 requests a stream: a round's batch delivered soonest
    deadline first (two placements of newcomers; reverted), and `playback_margin_ms=150`, each beside the final
    code in the same calls. Sets res["fifty_eighth"], returns the markdown, draws results_fifty_eighth.png."""
    levels = {r: load(f"served_{raw_name(*r)}_{S}.json")["levels"] for r in RUNS}
    early = {r: metric_value(f"metrics_{raw_name(*r)}_{S}.txt", "voxcpm_early_chunks_total") for r in RUNS}
    at = lambda r, c: [lv for lv in levels[r] if lv["concurrency"] == c]  # noqa: E731
    by_code = {k: [lv for r in RUNS if r[2] == k for lv in at(r, 128)] for k in CODES}
    stats = {k: smooth_stats(lvs) | {"ttfa_p95_ms_max": max(lv["ttfa_ms"]["p95"] for lv in lvs),
                                     "dry_late_ms_max": max(dry_late_ms(lv) for lv in lvs)}
             for k, lvs in by_code.items()}
    res["fifty_eighth"] = {
        "device": "NVIDIA H200",
        "requests_per_stream": 3,
        "runs": [{"call": call, "server": place, "code": CODES[k][0], "early_chunks": early[(call, place, k)],
                  "levels": [served_row(lv) | {"streams": lv["concurrency"], "dry": dry_counts(lv),
                                               "dry_late_ms": dry_late_ms(lv)} for lv in levels[(call, place, k)]]}
                 for call, place, k in RUNS],
        "c128_by_code": stats,
    }

    md = ["", "## Fifty-eighth session (2026-12-02, H200): a round's batch delivered soonest deadline first, measured "
          "and reverted; `playback_margin_ms=150` measured on the deadline-first code; the final code played 128 "
          "at once smoothly in 5 of 6 levels",
          "", "Three device calls ran on one H200 (about 24 of 30 min); a call before them got no machine. "
          "Each server: "
          "`ARRIVALS=burst LEVELS=64,128,128 REQUESTS=3 bash benchmarks/run_served_gpu.sh` with `timestep_buckets` "
          "10,100, one after another in a call. c331348 ran from the checkout (`SET`); the final code (17159b7) and "
          "the newcomers-last variant from `git archive` copies through `MODEL_REPOSITORY` and "
          "`VOXCPM_PYTHON_BACKEND` (compile caches found: ready in 57-69 s, the first call's first server 270 s)."
          f" `raw/served_*_{S}.{{json.gz,log}}`, `raw/metrics_*_{S}.txt`. Dry as in the fifty-sixth "
          "session: streams that ran out of audio at all, by wave and chunk (1-based); late: the latest of them.", "",
          "**The change** (c331348, reverted by caa3be5). The audio thread delivers a round's decodes batch by batch "
          "(requests whose chunks have the same length), and within a batch the requests that end first, then in the "
          "order their chunks were queued. A round of 128 deliveries takes about as long as a first chunk plays "
          "(fifty-seventh session), so the order decides who waits. The change delivered the rest of a batch soonest "
          "deadline first: the clients that would run out of audio first (a client's first chunk's time plus the audio "
          "sent it), a client that has heard nothing yet before any. `edflast` placed those after everyone instead "
          "(their wait costs time to first audio, not smoothness). A CPU test (mutation-checked) pinned the order; it "
          "went with the revert.", "",
          "| call / server | code | streams | x real time | smooth | TTFA p50 / p95 ms | dry | late ms | early chunks "
          "(run) |", "|---|---|---|---|---|---|---|---|---|"]
    for call, place, k in RUNS:
        for lv in levels[(call, place, k)]:
            md.append(f"| {call} / {place} | {CODES[k][1]} | {level_cells(lv)} | {early[(call, place, k)]:.0f} |")
    md += ["", "At 128 at once, by code (two levels a server):", "",
           "| code | levels | every stream smooth | least smooth | x real time, median (range) | TTFA p95 ms, worst | "
           "latest dry stream ms |", "|---|---|---|---|---|---|---|"]
    md += [f"| {CODES[k][1]} | {smooth_cells(s)} | {s['ttfa_p95_ms_max']:.0f} | {s['dry_late_ms_max']:.1f} |"
           for k, s in stats.items()]
    gaps = {k: [wave_gaps(lv, 0)["g12"]["p50"] for lv in by_code[k]] for k in CODES}
    longer = [x - y for x, y in zip(gaps["edf"], gaps["before"])]  # level for level, both sorted by call
    e, b, m = stats["edf"], stats["before"], stats["margin150"]
    more_early = (statistics.mean(early[r] for r in RUNS if r[2] == "margin150")
                  / statistics.mean(early[r] for r in RUNS if r[2] == "edf") - 1)
    md += ["",
           f"- **Deadline first**: every stream smooth in {e['all_smooth']} of {e['levels']} levels against the final "
           f"code's {b['all_smooth']} of {b['levels']}, though its worst level was better ({share(e['smooth_min'])} "
           f"against {share(b['smooth_min'])}): it left one to three streams a little late in most levels (up to "
           f"{e['dry_late_ms_max']:.1f} ms), where the code before was mostly clean. Its throughput at 128 "
           f"({e['xrt_median']:.1f}x median) was within the code before's range. Newcomers last: "
           f"{stats['edflast']['all_smooth']} of {stats['edflast']['levels']}, one level at "
           f"{share(stats['edflast']['smooth_min'])}. The first wave's 1st -> 2nd chunk gap p50 did not shrink: "
           "level for level against the final code in the same call it was "
           f"{round(min(longer))}-{round(max(longer))} ms "
           "longer (ms: "
           + "; ".join(f"{CODES[k][1]} " + ", ".join(f"{g:.0f}" for g in gaps[k]) for k in ("edf", "before"))
           + "). A round's queue order is the order the engine hands chunks out, its batch's rows in admission order "
           "(`Scheduler.running`), which mostly is deadline order already; by that reading, not measured, the change "
           "moved mostly the newcomers of later waves and a few early chunks. No sign that it helps: "
           "reverted. Neither placement of newcomers separates from noise in 4-6 levels.",
           "- **`playback_margin_ms=150`, on the deadline-first code**: the run asked for since the fifty-sixth "
           "session was meant for the final code, but it ran from the checkout while that held c331348, so it measured "
           "deadline first with the wider margin. Against deadline first at 100 ms in the same calls: "
           f"{m['all_smooth']} "
           f"of {m['levels']} levels all smooth against {e['all_smooth']} of {e['levels']}, one at "
           f"{share(m['smooth_min'])} (first wave, second and third chunks, up to {m['dry_late_ms_max']:.1f} ms late), "
           f"{more_early:.0%} more early chunks, TTFA p95 up to {m['ttfa_p95_ms_max']:.0f} ms: not separable "
           "from noise "
           "in 4 and 6 levels. The final code with the wider margin is still to run.",
           f"- **The final code**: at 128 at once with 3 requests a stream, every stream smooth in {b['all_smooth']} "
           f"of {b['levels']} levels this session ({b['xrt_range'][0]:.1f}-{b['xrt_range'][1]:.1f}x, TTFA p95 at most "
           f"{b['ttfa_p95_ms_max']:.0f} ms), against 1 of 4 in the fifty-seventh session's. "
           "At 64 at once every server of every code played every stream smoothly ("
           + ", ".join(f"{lv['x_real_time']:.1f}x" for r in RUNS for lv in at(r, 64)) + ").", "",
           "**Against issue 17's targets**: unchanged (the serving code is the fifty-sixth session's). Capacity at "
           "once: 128 played smoothly in 5 of 6 levels of the final code here, so still not met reliably. "
           "results.json's "
           "headline keys stay the fifty-fifth session's.", "",
           "![fifty-eighth session: 128 streams at once per level, by code](results_fifty_eighth.png)", ""]
    _plot(at)
    return md


def _plot(at):
    """Left: the share of streams smooth at 128 at once, each level; right: its x real time."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    bars = [(f"c{call}/s{place} {CODES[k][1]}" + (f" #{i + 1}" if i else ""), lv, CODES[k][2])
            for call, place, k in RUNS for i, lv in enumerate(at((call, place, k), 128))]
    for ax, value, label, lims in ((axes[0], lambda lv: 100 * lv["smooth_playback_frac"],
                                  "streams smooth at 128 at once, 3 requests a stream (%)", (85, 101)),
                                 (axes[1], lambda lv: lv["x_real_time"], "x real time at 128 at once", (570, 610))):
        ax.barh(range(len(bars)), [value(lv) for _, lv, _ in bars], color=[c for *_, c in bars])
        ax.set_yticks(range(len(bars)), [n for n, *_ in bars], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(*lims)
        ax.set_xlabel(label)
    save_panels(fig, axes, "fifty-eighth session (H200): 128 streams at once, by code", "results_fifty_eighth.png")
