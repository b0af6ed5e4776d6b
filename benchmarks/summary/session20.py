"""results.md: the twentieth session's section, and results_twentieth.png."""

from bench_served import share
from summary.plots import paired_bars, pyplot, save_panels
from summary.raw import engine_runs, load, served_levels


# (call, the fence's version on the "true" server, which server ran first)
TWENTIETH_RUNS = (
    ("call 1", "v1: every step with a first chunk; waits behind a busy round", "off first"),
    ("call 2", "v2: every step with a first chunk", "on first"),
    ("call 3", "v3: only steps all of whose rows are newcomers (the rule kept)", "off first"),
)


def twentieth_session(res) -> list[str]:
    """2026-11-28 (issue 17): a newcomer's first audio before the next step (decoder parameter
    first_audio_priority). Sets res["twentieth"], returns the markdown, draws results_twentieth.png."""
    rows, out = [], {}
    for i, (call, version, order) in enumerate(TWENTIETH_RUNS, 1):
        for fence in ("false", "true"):
            levels = served_levels(f"served_twentieth_call{i}_fap_{fence}.json")
            for c, lv in sorted(levels.items()):
                ph = lv.get("first_audio_phases_ms") or {}
                out.setdefault(call, {}).setdefault(fence, {})[c] = {
                    "ttfa_ms_p50": lv["ttfa_ms"]["p50"], "ttfa_ms_p95": lv["ttfa_ms"]["p95"],
                    "decoder_phase_ms": ph.get("decoder", 0.0), "smooth": lv["smooth_playback_frac"],
                    "xrt": lv["x_real_time"], "rtf_p50": lv["rtf"]["p50"]}
                label = "off" if fence == "false" else version.split(":")[0]
                rows.append(f"| {call} ({order}) | {label} | {c} | {lv['ttfa_ms']['p50']:.1f} / "
                            f"{lv['ttfa_ms']['p95']:.1f} | {ph.get('decoder', 0.0):.1f} | {lv['rtf']['p50']:.3f} | "
                            f"{share(lv['smooth_playback_frac'])} | {lv['x_real_time']:.1f} |")
    eng = engine_runs("offline_twentieth_b64.json")  # two runs at batch 64: the second is warm
    runs64 = [r for r in load("offline_twentieth_b64.json")["engine"]["graphs"]["runs"] if r["batch"] == 64]
    eng1 = [r for r in load("offline_twentieth_b1_cold64.json")["engine"]["graphs"]["runs"] if r["batch"] == 1][0]
    first = load("offline_twentieth_b1_cold64.json")["engine"]["graphs"]["first_audio"]
    loop = {k: load(f"engine_loop_twentieth_{k}.json")["runs"][-1]["median"]["gpu_step_ms"] for k in ("chain", "no_chain")}
    chk = load("gpu_check_twentieth.json")
    final = out["call 3"]
    served64 = final["true"][64]["xrt"]
    res["twentieth"] = {"device": "NVIDIA H200", "served_ab": out,
                        "engine_b64_xrt": [r["aggregate_xrt"] for r in runs64],
                        "served_over_engine_c64": served64 / runs64[-1]["aggregate_xrt"],
                        "engine_b1": {"rtf": eng1["rtf"], "steps_per_s": eng1["steps_per_s"],
                                      "first_patch_ms_p50": first["first_patch_ms_p50"]},
                        "engine_loop_gpu_step_ms": loop,
                        "gpu_check_bf16_vs_fp32_cosine_min": chk["teacher_forced"]["cosine_min"]}
    del eng
    one = {call: (out[call]["false"][1]["ttfa_ms_p50"], out[call]["true"][1]["ttfa_ms_p50"]) for call in out}
    dec = {call: (out[call]["false"][1]["decoder_phase_ms"], out[call]["true"][1]["decoder_phase_ms"]) for call in out}
    x64 = {call: out[call]["true"][64]["xrt"] / out[call]["false"][64]["xrt"] for call in out}
    md = ["", "## Twentieth session (2026-11-28, H200): a newcomer's first audio before the next step", "",
          "The engine pipelines its steps: step N+1 is launched before step N's patches are read, so the GPU never "
          "waits for the host. A request's first chunk therefore reached the decoder's audio thread "
          "(`decode_audio`) after the next step's kernels were queued. Its decode then trickled in between that "
          "step's persistent kernels, which hold every SM: stream priority only orders kernels that wait at the "
          "same time. The nineteenth session saw the decoder phase grow by 3-5 ms where the vae phase went; this "
          "is a part of that (below, the decoder phase falls by 1.0-1.3 ms).", "",
          "The new decoder parameter `first_audio_priority` (default true) changes this for some steps. When the "
          "step in flight fills first chunks, the engine hands it out before it launches the next one. It asks "
          "`StreamAudio.fence` for an event and makes its stream wait on it. The fence returns once a round has "
          "launched the decode of everything queued; it waits at most 20 ms, and never behind a round busy with "
          "older chunks. The next step then runs after that decode, and the host work in between is not "
          "pipelined.", "",
          "After these calls a review found a gap in the first wave of a burst. The engine hands out one row's "
          "chunk at a time, and the audio thread can wake and take only part of the wave. The measured "
          "version's fence then saw a round busy with other work and returned at once. Now:",
          "- the engine marks the queue (`StreamAudio.mark`) before it hands out the step;",
          "- the fence waits for a round that took any chunk queued since the mark, and then for the rest;",
          "- a fence that got no event is counted apart (`voxcpm_engine_first_audio_fence_misses_total`).", "",
          "This changes nothing for a lone request. It ran on the CPU and in the GPU tests (call 6: "
          "`tests/test_engine_gpu.py -k 'stream_audio or first_audio'`, an engine with CUDA graphs and the "
          "decoder's `StreamAudio`: fenced once, no miss, the same latents). It was not run served.", "",
          "Three versions of the rule were measured. In each call both servers ran on one machine and checkpoint "
          "(`SET=\"decoder.timestep_buckets=10,100 decoder.first_audio_priority={false,true}\" LEVELS=1,8,64 "
          "REQUESTS=5 bash benchmarks/run_served_gpu.sh`; `raw/served_twentieth_call{1,2,3}_fap_{false,true}.json`). "
          "Columns: TTFA, the orchestrator's decoder phase of first audio (mean ms), RTF, smooth playback and "
          "aggregate:", "",
          *[f"- {call}: {version} ({order})" for call, version, order in TWENTIETH_RUNS], "",
          "| call (order) | fence | streams | TTFA p50 / p95 ms | decoder phase ms | RTF p50 | smooth | x real time |",
          "|---|---|---|---|---|---|---|---|"] + rows
    md += ["", "**One stream.**",
           "- TTFA p50 fell " + ", ".join(f"{a:.1f} -> {b:.1f} ms ({call})" for call, (a, b) in one.items()) + ".",
           "- The decoder phase fell " + ", ".join(f"{a:.1f} -> {b:.1f}" for a, b in dec.values()) + " ms.",
           "- A lone request is fenced the same way by all three versions. Calls 1 and 2 show the gain: 1.5 and "
           "2.8 ms.",
           "- In call 3 the server without the fence was already at 23.3 ms. Between servers the baseline spread "
           "over 23.3-26.4 ms, as large as the effect. With the fence every server stayed at 23.0-23.6 ms.",
           "", "**64 streams.**",
           "- Aggregate ratio, fence on against off: " + ", ".join(f"{r:.2f}x ({call})" for call, r in x64.items())
           + ".",
           "- v1 and v2 fenced every step that filled any first chunk. In a wave of newcomers, that is most steps. "
           "Each fence idles the GPU for the hand-off and the decode, and holds back all 64 rows.",
           "- v2 also lost 5% of its streams to underruns, with TTFA p95 at 868 ms. It was the first server on a "
           "fresh machine, and the same level ran "
           + ", ".join(share(out[c][f][64]["smooth"]) for c in sorted(out) for f in ("false", "true")
                       if (c, f) != ("call 2", "true"))
           + " smooth on the other five servers. One run does not tell "
           "whether the fence or the cold machine caused it.",
           "- v3, the rule kept (`Scheduler.first_audio_first`), fences only a step all of whose running rows are "
           "newcomers: a lone request, or a burst's first wave. No request that is already playing waits for a "
           "newcomer's audio. In its one call it left 64 streams as they were (1.01x; smooth "
           f"{share(final['false'][64]['smooth'])} without the fence and {share(final['true'][64]['smooth'])} with it). "
           "8 streams' TTFA p50 / p95 fell "
           f"{final['false'][8]['ttfa_ms_p50']:.0f} / {final['false'][8]['ttfa_ms_p95']:.0f} -> "
           f"{final['true'][8]['ttfa_ms_p50']:.0f} / {final['true'][8]['ttfa_ms_p95']:.0f} ms, which is within "
           "the spread of the servers without the fence (p50 104-126 ms).", "",
           "**Same calls, more.**",
           f"- Engine alone, batch 64: {runs64[-1]['aggregate_xrt']:.0f}x real time "
           f"({runs64[-1]['steps_per_s']:.1f} steps/s, the second of two runs; the first made "
           f"{runs64[0]['aggregate_xrt']:.0f}x). Command: `bench.py --batches 64,64 --reference none --no-vae "
           "--graphs-only --no-profile`, `raw/offline_twentieth_b64.json`, call 3.",
           f"  - The 64 served streams of that call made {served64:.0f}x: {served64 / runs64[-1]['aggregate_xrt']:.2f} "
           "of the engine. The issue's target is 0.85.",
           "  - In call 2 a single run at batch 64 timed something that happens once: 228x, with a TTFA of "
           "2.8 s (`raw/offline_twentieth_b1_cold64.json`). A compile is the likely cause, not checked. Hence two "
           "runs in call 3.",
           f"- Engine alone, batch 1 (call 2): RTF {eng1['rtf']:.3f}, {eng1['steps_per_s']:.0f} steps/s; first "
           f"patch of a lone request {first['first_patch_ms_p50']:.1f} ms (its prefill graph "
           f"{first['prefill_graph_ms_p50']:.1f} ms).",
           f"- The eighteenth session's chained layers, at last measured in the engine loop "
           f"(`engine_loop.py --steps 400 [--no-chain]`, `raw/engine_loop_twentieth_{{chain,no_chain}}.json`): "
           f"GPU step {loop['chain']:.3f} ms chained against {loop['no_chain']:.3f} ms unchained "
           f"({loop['no_chain'] / loop['chain']:.3f}x).",
           f"- `gpu_check.py` passes every check on this session's code (`raw/gpu_check_twentieth.json`): bf16 "
           f"against fp32 teacher-forced cosine min {chk['teacher_forced']['cosine_min']:.5f}; graph against eager "
           "0.0 at batches 1, 5, 32 and 64; VAE graphs against eager 0.0.",
           "- `tests/test_engine_gpu.py -k stream_audio` passed in calls 1 and 2 (`raw/gpu_tests_twentieth.txt`). "
           "It now also takes the fence's event and has a second stream wait on it.",
           "", "**Start-up, still not explained.** In the servers, the decoder's `decode_graphs` phase took:",
           "- 113-124 s for 16 graphs on a machine's first server;",
           "- 80-89 s on its second server.",
           "- Standalone on the same machines it is much shorter: `gpu_check.py` captured 72 graphs in 31 s, "
           "`bench.py` 72 in 35-36 s, `engine_loop.py` 9 in 15-27 s.",
           "- So compiling and capturing is 3-4x slower per graph inside tritonserver. The eight models load side "
           "by side there (`vae_decoder` compiles too, on 16 cores), but that was not measured.", "",
           "![twentieth session: first audio before the next step](results_twentieth.png)", ""]
    _plot_twentieth(out)
    return md


def _plot_twentieth(out):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    calls = list(out)
    for ax, (c, metric, label) in zip(axes, ((1, "ttfa_ms_p50", "one stream: TTFA p50 ms"),
                                              (64, "xrt", "64 streams: aggregate x real time"))):
        paired_bars(ax, [f"{call}\n{('v1', 'v2', 'v3')[i]}" for i, call in enumerate(calls)],
                     [(name, color, [out[call][fence][c][metric] for call in calls])
                      for fence, color, name in (("false", "#999", "first_audio_priority false"),
                                                 ("true", "#286", "true (v1, v2, v3)"))],
                     lambda v: f"{v:.1f}" if v < 100 else f"{v:.0f}")
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    save_panels(fig, axes, "Twentieth session, H200, 2026-11-28: a newcomer's first audio before the next step",
                 "results_twentieth.png")
