"""results.md: the eighty-first session's section (CPU; one H100 call)."""

from summary.raw import load, served_levels, served_table

S = "eightyfirst"


def _span(xs) -> str:
    return f"{min(xs):.1f}-{max(xs):.1f}" if min(xs) != max(xs) else f"{xs[0]:.1f}"


def eighty_first_session(res) -> list[str]:
    """2026-12-06: a stop held by gRPC streams cancelled right after their last responses, reproduced on the
    product models; the supervisor's held check. Sets res["eighty_first"], returns the markdown."""
    d = load(f"held_stop_{S}.json")
    bare = d["bare"]["runs"] + d["bare"]["verbose_runs"]
    held = [r["stop_s"] for r in bare if r["exit_code"] == 1]
    clean = [r["stop_s"] for r in bare if r["exit_code"] == 0]
    sup = d["supervised"]
    final = sup["final"]["runs"] + sup["final"]["held_stop_py"]["runs"]
    first = sup["first_form"]["runs"]
    f_held = [r["stop_s"] for r in final if r["held"]]
    f_clean = [r["stop_s"] for r in final if not r["held"]]
    echo = d["echo_stream"]["variants"]
    served = served_levels(f"served_supervised_{S}.json")
    drain = load(f"drain_{S}.json")
    res["eighty_first"] = {"device": "CPU (2 cores)", "bare_held_of_runs": [len(held), len(bare)],
                           "bare_held_stop_s": held, "supervised_held_stop_s": f_held,
                           "supervised_clean_stop_s": f_clean,
                           "gpu": {"device": "NVIDIA H100 80GB HBM3", "commit": "6cc5f1d",
                                   "served_rtf_p50_c1": served[1]["rtf"]["p50"],
                                   "served_ttfa_p50_ms_c1": served[1]["ttfa_ms"]["p50"],
                                   "served_xrt_c64": served[64]["x_real_time"],
                                   "served_smooth_c64": served[64]["smooth_playback_frac"],
                                   "drain": {k: drain[k] for k in ("streams", "ended_shutting_down", "supervisor_exit_s",
                                                                   "tritonserver_exit_code", "exit_timeout_expired",
                                                                   "crashes")}}}
    md = ["", "## Eighty-first session (2026-12-06, CPU; one H100 call): a stop held by gRPC streams cancelled right after "
          "their last responses, on the product models; the supervisor ends it at half the exit timeout plus 5 s",
          "", "No GPU code changed; one device call checked the stop on the GPU (below). On this machine (2 cores, the "
          "tiny checkpoint) the closing note's "
          "open item, a client that cancels its gRPC stream right after a final response making tritonserver 2.51 "
          f"hold the model, was reproduced on the product and measured (`raw/held_stop_{S}.json`). The pattern: "
          f"{d['pattern']}.",
          "",
          f"- **Bare tritonserver** ({d['bare']['how']}): {len(held)} of {len(bare)} stops ran out the exit timeout "
          f"({_span(held)} s, \"Exit timeout expired\", exit code 1), the others took {_span(clean)} s (exit 0). "
          f"Each held one held `{d['bare']['held_model']}` alone. With `--log-verbose=1` the held stream's handler "
          "state was at `WRITTEN` (the empty final response's write under way) when the cancellation arrived, then "
          "waited in `CANCELLATION_ISSUED` \"for the callback to retrieve cancellation\" for good: the handler's "
          "state keeps the inference request, which keeps its model loaded.",
          f"- Not reproduced with {d['echo_stream']['how']}: "
          + "; ".join(f"{v['variant']}, {v['held']} of {v['runs']} runs" for v in echo) + ".",
          f"- **Supervised** ({sup['how']}, then `{sup['final']['held_stop_py']['command']}`), with the supervisor's "
          f"new held check ({sup['final']['rule']}): held stops {_span(f_held)} s in {len(f_held)} of {len(final)} "
          f"runs (the supervisor logs `tritonserver still holds tts_stream 20 s after SIGTERM, every model process "
          f"idle and nothing unloaded for 5 s ...: SIGKILL`), the others {_span(f_clean)} s; supervisor exit code "
          f"{sup['final']['supervisor_exit_code']} in all, {sup['final']['left']} left. Without the check the "
          "supervisor waits for Triton's own exit timeout (30 s, exit 1), as the bare runs show; that was not "
          "re-measured under the supervisor. The check's first form "
          f"({sup['first_form']['rule']}) stopped held servers in "
          f"{_span([r['stop_s'] for r in first if r['held']])} s ({sum(r['held'] for r in first)} of {len(first)}), "
          "but a review showed it would cut responses still queued for a slow reader.",
          f"- A clean stop takes about 10 s here: {d['clean_stop']}.",
          "", "**On the GPU** (one call on an H100, 6cc5f1d: `SET=\"decoder.timestep_buckets=10,100\" ARRIVALS=burst "
          "LEVELS=1,64 REQUESTS=2 DRAIN=4 bash benchmarks/run_served_gpu.sh`, the server under the supervisor with "
          f"the held check on; `raw/devrun_{S}.sh`, `raw/served_supervised_{S}.{{json,log}}`, `raw/drain_{S}.json`, "
          f"`raw/served_supervised_{S}_tritonserver.log.gz`): the stop with long streams in flight is where a wrong "
          "held verdict would show (a decoder's finalize on the GPU is the slowest).", "",
          *served_table(dict(sorted(served.items()))),
          "",
          f"- The drain: {drain['ended_shutting_down']} of {drain['streams']} long streams ended with \"the server is "
          f"shutting down\" at {drain['ended_s']['median']:.1f} s, the supervisor was gone at "
          f"{drain['supervisor_exit_s']:.1f} s, tritonserver's exit code {drain['tritonserver_exit_code']}, "
          f"{drain['crashes']} crashes; the supervisor logged no held verdict (`stopping tritonserver (asked to "
          "stop)`, then `stopped in 21.9 s (exit code 0)`); nothing left in /dev/shm or /tmp.",
          f"- Issue 17 on this H100: one stream RTF {served[1]['rtf']['p50']:.4f} (target 0.025: missed), TTFA p50 "
          f"{served[1]['ttfa_ms']['p50']:.1f} ms; 64 streams {served[64]['x_real_time']:.1f}x, "
          f"{served[64]['smooth_playback_frac']:.0%} smooth (the H200 headline stands)."]
    return md
