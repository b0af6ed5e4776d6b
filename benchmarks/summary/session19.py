"""results.md: the nineteenth session's section, and results_nineteenth.png."""

from summary.plots import paired_bars, pyplot, save_panels
from summary.raw import load, served_levels


NINETEENTH_RUNS = (("call 1", "ab1"), ("call 2", "ab2"))


def nineteenth_session(res) -> list[str]:
    """2026-11-28 (issue 17): the decoder decodes its own audio (`decode_audio`). Sets res["nineteenth"],
    returns the markdown, draws results_nineteenth.png."""
    rows, out = [], {}
    for call, tag in NINETEENTH_RUNS:
        for mode, label in (("vae_decoder", "vae_decoder"), ("decode_audio", "decode_audio")):
            levels = served_levels(f"served_nineteenth_{tag}_{mode}.json")
            for c, lv in sorted(levels.items()):
                ph = lv.get("first_audio_phases_ms") or {}
                vae = lv["server_models"].get("vae_decoder", {})
                out.setdefault(call, {}).setdefault(mode, {})[c] = {
                    "ttfa_ms_p50": lv["ttfa_ms"]["p50"], "ttfa_ms_p95": lv["ttfa_ms"]["p95"],
                    "rtf_p50": lv["rtf"]["p50"], "smooth": lv["smooth_playback_frac"], "xrt": lv["x_real_time"]}
                rows.append(f"| {call} | {c} | {label} | {lv['ttfa_ms']['p50']:.1f} / {lv['ttfa_ms']['p95']:.1f} | "
                            f"{lv['rtf']['p50']:.3f} | {lv['smooth_playback_frac']:.0%} | {lv['x_real_time']:.1f} | "
                            + " / ".join(f"{ph.get(k, 0.0):.1f}" for k in ("prepare", "decoder", "vae")) + " | "
                            + (f"{vae['batch_mean']:.1f}, {vae['busy_frac']:.0%}" if vae else "-") + " |")
    res["nineteenth"] = {"device": "NVIDIA H200", "served_ab": out}
    gain64 = [out[call]["decode_audio"][64]["xrt"] / out[call]["vae_decoder"][64]["xrt"] for call in out]
    cmp = load("served_nineteenth_ab1_audio_compare.json")
    md = ["", "## Nineteenth session (2026-11-28, H200): the decoder decodes its own audio", "",
          "Served, the VAE ran as `vae_decoder`, a process of its own: the GPU time-slices two processes, so "
          "every chunk's decode waited for the decoder's slice and the decoder's steps for the VAE's (at 64 streams "
          "`vae_decoder` was busy 60% of the time at 7-8 streams per call), and every chunk took two more hops "
          "between models. With the new decoder parameter `decode_audio` (default true) the decoder's process "
          "decodes the chunks itself (`engine/stream_audio.py`): the engine thread only queues a request's chunks "
          "and its end; one thread takes whatever is queued, decodes every request's pending chunks in batches by "
          "length (the same `VAEStreams`, CUDA graphs per chunk_schedule length) on a CUDA stream of the highest "
          "priority, and sends each chunk's AUDIO with its LATENTS; the orchestrators then skip `vae_decoder` "
          "(`decode_audio` false keeps the old pipeline).", "",
          "A/B on one H200 (the device tool gave an H200 for every call this session), two calls, each "
          "with both servers on the same machine and checkpoint, the other order in the second call "
          "(`SET=\"decoder.timestep_buckets=10,100 [decoder.decode_audio=true]\" AUDIO=1 LEVELS=1,8,64 REQUESTS=3 "
          "bash benchmarks/run_served_gpu.sh`; call 1 ran `decode_audio` first, call 2 `vae_decoder` first and "
          "levels 1 and 64 only; `raw/served_nineteenth_ab{1,2}_{vae_decoder,decode_audio}.json`). First audio "
          "in the server: mean ms of the orchestrator's phases; vae_decoder: streams per call, time busy:", "",
          "| call | streams | audio made in | TTFA p50 / p95 ms | RTF p50 | smooth | x real time | "
          "prepare / decoder / vae ms | vae_decoder |", "|---|---|---|---|---|---|---|---|---|"] + rows
    md += ["", f"At 64 streams the aggregate grows {gain64[0]:.2f}x and {gain64[1]:.2f}x, TTFA p50 falls by "
           f"{out['call 1']['vae_decoder'][64]['ttfa_ms_p50'] - out['call 1']['decode_audio'][64]['ttfa_ms_p50']:.0f} "
           f"and {out['call 2']['vae_decoder'][64]['ttfa_ms_p50'] - out['call 2']['decode_audio'][64]['ttfa_ms_p50']:.0f} "
           "ms, and at most 2% of the streams (1-4 of 192) underrun either way; one stream's TTFA falls by 0.8 and "
           "2.8 ms (its first chunk's decode still waits behind the step in flight: the decoder phase grows by 3-5 "
           "ms where the vae phase's ~6 ms goes) and its RTF stays 0.042-0.043. Capacity (every stream smooth and "
           "TTFA p95 <= 500 ms at each level up to it) came out alike for both servers in each call: 8 in call 1 "
           "(a stream or two of the 64 underran on both), 64 in call 2. The served runs used the first version of "
           "the decoder's audio thread; the changes since (below) bound and order its work, and leave the decode "
           "itself as it was.", "",
          "Audio: `benchmarks/served_audio.py` recorded 4 fixed-seed 100-step streams, all at once, on each "
          "server. In call 1 two of them got the same latents on both servers (bf16 rounding depends on the "
          "batches the timing made): their 16 s of audio, decoded in the decoder's process against "
          "`vae_decoder`, differ by at most " + ", ".join(f"{v['max_abs']:.1e}" for v in cmp.values()
                                                         if v.get("max_abs", 1) < 1e-2)
           + " (peaks 0.71-0.78, cosine 0.9999995); the other two, and all four in call 2 (also one at a time, "
           "after the prefix cache held the concurrent run's prompts), got other latents from the first patch on, "
           "so they do not compare the VAE. On the CPU, in fp32, the two paths agree within 2e-6 "
           "(`tests/test_decode_audio.py`, which also runs test_server's parity checks on both pipelines).", "",
           "On the GPU the decoder's audio thread is also tested alone (`tests/test_engine_gpu.py -k stream_audio`, "
           "passed on the H200: `raw/gpu_tests_nineteenth.txt`): three requests' chunks of 1, 4, 3 and 1 patches "
           "decoded on the high-priority stream while matrix products keep the default stream busy, each "
           "request's audio within 1e-3 of the eager decode, chunk by chunk. In the version that ran, all chunks "
           "were queued at once, so timing decided how rounds merged them; after a review the test waits for each "
           "step's chunks (graph replays and 1 + 1 + 1 pieces every time) and checks the stream's priority, and "
           "the decoder's thread now decodes at most the longest graph's length per request and round and waits "
           "for a stream slot instead of failing: those versions have run on the CPU only (no device time was "
           "left).", "",
           "Start-up, not explained: with 16 decode graphs (`timestep_buckets` 10,100) the decoder took 142-153 s "
           "on a machine's first server (cold inductor cache; both pipelines alike) and, on the second server of "
           "a call, 33 s for `vae_decoder` (call 1) but 91 s for `decode_audio` (call 2), 73 s of it in the decode "
           "graphs' compile and capture, which `decode_audio` does not change. One pair per order is too few to "
           "tell a cost of `decode_audio` (its VAE's compiled snakes and graphs come before the engine's) from "
           "the spread between machines; the earlier H100 start-ups (45-84 s) are not comparable.", "",
           "![nineteenth session: audio decoded in the decoder](results_nineteenth.png)", ""]
    _plot_nineteenth(out)
    return md


def _plot_nineteenth(out):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    calls = list(out)
    for ax, (metric, label) in zip(axes, (("xrt", "aggregate x real time, 64 streams"),
                                           ("ttfa_ms_p50", "TTFA p50 ms, 1 and 64 streams"))):
        keys = [(call, c) for call in calls for c in ((64,) if metric == "xrt" else (1, 64))]
        paired_bars(ax, [f"{call}\n{c} stream{'s' * (c > 1)}" for call, c in keys],
                     [(mode, color, [out[call][mode][c][metric] for call, c in keys])
                      for mode, color in (("vae_decoder", "#999"), ("decode_audio", "#286"))],
                     lambda v: f"{v:.0f}" if v > 30 else f"{v:.1f}")
        ax.set_title(label, fontsize=9)
        ax.set_yscale("log" if metric == "ttfa_ms_p50" else "linear")
        ax.legend(fontsize=8, loc="lower right" if metric == "xrt" else "center left")
    save_panels(fig, axes, "Nineteenth session, H200, 2026-11-28: audio decoded in the decoder's process",
                 "results_nineteenth.png")
