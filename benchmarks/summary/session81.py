"""results.md: the eighty-first session's section (CPU only)."""

from summary.raw import load

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
    res["eighty_first"] = {"device": "CPU (2 cores)", "bare_held_of_runs": [len(held), len(bare)],
                           "bare_held_stop_s": held, "supervised_held_stop_s": f_held,
                           "supervised_clean_stop_s": f_clean}
    md = ["", "## Eighty-first session (2026-12-06, CPU only): a stop held by gRPC streams cancelled right after "
          "their last responses, on the product models; the supervisor ends it at half the exit timeout plus 5 s",
          "", "No device time: no GPU code changed. On this machine (2 cores, the tiny checkpoint) the closing note's "
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
          f"- A clean stop takes about 10 s here: {d['clean_stop']}."]
    return md
