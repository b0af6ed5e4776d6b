"""results.md: the eighty-eighth session's section (the committed closing check, benchmarks/closing_check.sh, on an
H100; the session's code changed nothing the GPU runs)."""

from summary.raw import load, served_levels, served_record, served_table, supervised_gpu_run

S = "eightyeighth"


def eighty_eighth_session(res) -> list[str]:
    """2026-12-07: `closing_check.sh tests`, then its served part twice, on 40172a8. Sets res["eighty_eighth"],
    returns the markdown."""
    res["eighty_eighth"], served, bullets = supervised_gpu_run(S, "40172a8", drain_end="no shared-memory region left.")
    again = served_levels(f"served_supervised_{S}_repeat.json")
    rd = load(f"drain_{S}_repeat.json")
    now, prev = res["eighty_eighth"], res["eighty_seventh"]
    res["eighty_eighth"]["repeat"] = served_record(again)
    return ["", "## Eighty-eighth session (2026-12-07, NVIDIA H100 80GB HBM3): the committed closing check", "",
            "The GPU check the eighty-fifth to eighty-seventh sessions copied into their device scripts is now "
            "`benchmarks/closing_check.sh` (`tests`: the GPU test files side by side with `gpu_check.py`; `served`: "
            "the run below under the supervisor, with its drain and the leftovers). This session's code changes "
            "(the client's `loras` commands, the supervisor's port hint, the gateway's `param`, the `loras` model's "
            "messages) run nothing on the GPU. Three calls on 40172a8, one warm machine after twelve refused or "
            f"untried calls (`raw/devrun_{S}.sh`): the two parts, then the served part again.", "",
            *bullets[:-1],
            f"- The served part again on the same machine (`raw/served_supervised_{S}_repeat.{{json,log}}`, "
            f"`raw/drain_{S}_repeat.json`; start-up 89 s with the kernels compiled by the first; its drain the same: "
            f"{rd['ended_shutting_down']} of {rd['streams']} streams ended \"shutting down\", the supervisor gone at "
            f"{rd['supervisor_exit_s']:.1f} s, exit code {rd['tritonserver_exit_code']}):", "",
            *served_table(dict(sorted(again.items()))), "",
            bullets[-1] + f" Again: {again[64]['x_real_time']:.1f}x, "
            f"{again[64]['smooth_playback_frac']:.1%} smooth, TTFA p95 {again[64]['ttfa_ms']['p95']:.0f} ms. Both "
            "runs are below the seventy-eighth to eighty-seventh sessions' seven H100 runs of this table "
            f"(489.4-507.1x, 100% smooth, TTFA p95 117-191 ms at 64 streams): {now['served_xrt_c64'] / prev['served_xrt_c64']:.3f}x "
            "the eighty-seventh session's throughput. The served path's code is the eighty-seventh session's "
            "(d748d2c) but for the decoder's message for a prompt past the positions, built only when it is refused, "
            "so the cause is not in the code; most likely the machine, or its GPU tests just before (the earlier "
            "sessions served on a fresh machine). No device time was left to run d748d2c beside it. The H200 headline "
            "stands."]
