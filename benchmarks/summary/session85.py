"""results.md: the eighty-fifth session's section (four H100 calls: the code that landed at stop 92, then this session's)."""

import re

from summary.raw import load, served_levels, served_table, supervised_gpu_run, text

S = "eightyfifth"


def eighty_fifth_session(res) -> list[str]:
    """2026-12-07: the GPU tests, gpu_check.py and the served run under the supervisor on fa00851, the first
    GPU run of the eighty-second to eighty-fourth sessions' code. Sets res["eighty_fifth"], returns the markdown."""
    res["eighty_fifth"], served, bullets = supervised_gpu_run(S, "fa00851",
                                                              drain_end="nothing left in /dev/shm or /tmp.")
    c3 = served_levels(f"served_supervised_call3_{S}.json")
    drain3 = load(f"drain_call3_{S}.json")
    guard = [line for line in text(f"guard_gpu_{S}.txt").splitlines() if line.startswith("[guard]")]
    call4 = text(f"guard_gpu_call4_{S}.txt").splitlines()
    guard4 = [line for line in call4 if line.startswith("[guard]")]
    guard_line = next(line for line in call4 if "guard: the supervisor is gone" in line).split("] ", 1)[1]
    res["eighty_fifth"]["call3"] = {"commit": "1cdd910", "served_rtf_p50_c1": c3[1]["rtf"]["p50"],
                                    "served_ttfa_p50_ms_c1": c3[1]["ttfa_ms"]["p50"],
                                    "served_xrt_c64": c3[64]["x_real_time"],
                                    "served_smooth_c64": c3[64]["smooth_playback_frac"],
                                    "served_ttfa_p95_ms_c64": c3[64]["ttfa_ms"]["p95"],
                                    "drain_supervisor_exit_s": drain3["supervisor_exit_s"],
                                    "guard": guard, "guard_call4": guard4 + [guard_line]}
    return ["", "## Eighty-fifth session (2026-12-07, NVIDIA H100 80GB HBM3): the last three sessions' code on the GPU, and the guard of a killed supervisor",
            "", "The eighty-second to eighty-fourth sessions got no device machine; their code (serving, supervisor and "
            "structure; engine code renamed and split, no kernel changed) landed at stop 92 untested on a GPU. Two "
            f"calls on fa00851 (`raw/devrun_{S}.sh`):", "",
            *bullets[:-1],
            bullets[-1] + " The seventy-seventh to eighty-first sessions' H100 calls gave one-stream RTF "
            "0.0361-0.0365 and 64 streams 489-507x, which this run is inside, and one-stream TTFA p50 17.2-22.7 ms "
            f"(2 requests each), which this run's is {served[1]['ttfa_ms']['p50'] - 22.7:.1f} ms "
            "above; the H200 headline stands.",
            "", f"**Call 3, this session's code** (1cdd910, `raw/devrun_{S}.sh`'s call 3). Part A: the supervisor "
            "(full-size checkpoint, exit timeout 10 s) killed with SIGKILL 40 s into loading, while "
            f"`scripts/server_guard.py` (new this session) watched (`raw/guard_gpu_{S}.{{txt,log}}`): "
            + "; ".join(g.removeprefix("[guard] ") for g in guard) + " (pgrep's 2 tritonserver at the kill: the "
            "server and the supervisor, whose command line names it). On the GPU every model process exited by "
            "itself (Triton's \"Non-graceful termination detected\"), none hung as on the CPU, but their 21 "
            "shared-memory regions stayed: the guard removed only those of processes it killed. It now also "
            "sweeps the killed supervisor's state directory and the regions recorded there (89dcbc9); call 4 ran "
            f"part A again on it (`raw/guard_gpu_call4_{S}.{{txt,log}}`): "
            + "; ".join(g.removeprefix("[guard] ") for g in guard4 if not re.match(r"\[guard\] [1-9]\d+ s after", g))
            + f"; the guard logged `{guard_line}`. Part B: call 2 again "
            f"(`raw/served_supervised_call3_{S}.{{json,log}}`, `raw/drain_call3_{S}.json`):", "",
            *served_table(dict(sorted(c3.items()))), "",
            f"- The drain: {drain3['ended_shutting_down']} of {drain3['streams']} long streams ended \"shutting "
            f"down\", the supervisor gone at {drain3['supervisor_exit_s']:.1f} s, exit code "
            f"{drain3['tritonserver_exit_code']}, {drain3['crashes']} crashes. The decoder's start-up order "
            "(its engine settings checked before the checkpoint loads) changed nothing served: one stream RTF "
            f"{c3[1]['rtf']['p50']:.4f}, 64 streams {c3[64]['x_real_time']:.1f}x, "
            f"{c3[64]['smooth_playback_frac']:.0%} smooth."]
