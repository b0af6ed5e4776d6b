"""results.md: the twenty-fourth session's section, and results_twentyfourth.png."""

import os
import re

from summary.plots import paired_bars, pyplot, save_panels
from summary.raw import HERE, load


def _served_log_levels(name) -> dict:
    """concurrency -> (ok, total, TTFA p50 ms, RTF p50, x real time) from a bench_served.py log, for
    the levels it finished."""
    with open(os.path.join(HERE, "raw", name)) as f:
        text = f.read()
    out = {}
    for c, body in re.findall(r"concurrency (\d+): .*?\n(\[bench\] +\d+/\d+ ok[^\n]*)", text):
        m = re.search(r"(\d+)/(\d+) ok, TTFA p50 ([\d.]+) ms, RTF p50 ([\d.]+), x-RT ([\d.]+)", body)
        if m:
            out[int(c)] = (int(m[1]), int(m[2]), float(m[3]), float(m[4]), float(m[5]))
    return out


def _kernel_ms(vae_run, kernel: str) -> float:
    """ms per 64 x 4 call of one kernel in a vae_precision.py run's fp32 profile."""
    return sum(t["cuda_ms"] for t in vae_run["profile_64x4"]["fp32"]["all"] if kernel in t["kernel"])


def twenty_fourth_session(res) -> list[str]:
    """2026-11-28 (issue 17): the VAE decoder's sample-rate condition in the look-back pass, its
    channels-last inputs without copies, the last conv and tanh in one kernel; LocDiT's GEMMs at
    batch 8 measured; the served stall at 64 streams caught with its threads' stacks. Sets
    res["twentyfourth"], returns the markdown, draws results_twentyfourth.png."""
    before = load("vae_call2_old_twentyfourth.json")
    v1_tanh_ms = next(k["cuda_ms"] for k in load("vae_call2_v1_twentyfourth.json")["profile_64x4"]["fp32"]["top"]
                      if k["kernel"] == "_conv_tanh_kernel")
    old3, new3 = load("vae_call3_old_twentyfourth.json"), load("vae_call3_new2_twentyfourth.json")
    final, ops = load("vae_final_twentyfourth.json"), load("vae_ops_before_twentyfourth.json")
    chk = load("gpu_check_vae_twentyfourth.json")["vae_graphs_vs_eager"]
    skinny = load("kernel_skinny_gemm_176_twentyfourth.json")["rows"]
    eng = load("offline_twentyfourth_b8.json")["engine"]["graphs"]
    runs = {r["batch"]: r for r in eng["runs"]}
    p8 = eng["profile_batch_max"]
    served_old = _served_log_levels("served_twentyfourth_call5_before.log")
    served_new = _served_log_levels("served_twentyfourth_call6_after.log")
    with open(os.path.join(HERE, "raw", "gpu_tests_twentyfourth.txt")) as f:
        gpu_tests = re.search(r"(\d+) passed", f.read()).group(1)
    gpu = lambda d: d["profile_64x4"]["fp32"]["gpu_ms"]  # noqa: E731
    kinds = lambda d: d["profile_64x4"]["fp32"]["by_kind_ms"]  # noqa: E731
    err = lambda d: d["quality"]["fp32"]["vs_exact_fp32"]  # noqa: E731
    shp = lambda d: d["shapes"]["fp32"]  # noqa: E731
    cond_ms = sum(o["self_cuda_ms"] for o in ops["profile_64x4"]["fp32"]["ops"]
                  if o["op"] in ("aten::mul", "aten::add") and "[1, " in o["shapes"])
    last_conv = next(o["self_cuda_ms"] for o in ops["profile_64x4"]["fp32"]["ops"]
                     if o["op"] == "aten::cudnn_convolution" and "[1, 32, 1, 7]" in o["shapes"])
    copies = sum(o["self_cuda_ms"] for o in ops["profile_64x4"]["fp32"]["ops"] if o["op"] == "aten::copy_"
                 and ("512, 1, 769" in o["shapes"] or "1024, 1, 129" in o["shapes"]))
    res["twentyfourth"] = {
        "device": "NVIDIA H200", "vae_gpu_ms_64x4": {"before": gpu(old3), "after_call3": gpu(new3), "final": gpu(final)},
        "vae_ms_per_call_call3": {"before": shp(old3), "after": shp(new3)}, "vae_ms_per_call_final": shp(final),
        "vae_vs_exact_fp32": {"before": err(old3), "after": err(final)},
        "vae_served_vs_exact_fp32_max_abs": chk["served_vs_exact_fp32_max_abs"],
        "engine_b8_xrt": runs[8]["aggregate_xrt"], "engine_b1_rtf": runs[1]["rtf"], "profile_b8_gpu_ms": p8["gpu_ms"],
        "loc_gemm_us": {f"{r['shape']}@{r['M']}": {"cublas": r["cublas_us"], "triton_best": r["best"]["us"]} for r in skinny},
        "served_call5_old_code": served_old, "served_call6_new_code": served_new}
    fmt = lambda d: " | ".join(f"{shp(d)[k]:.2f}" for k in ("1x1", "8x4", "64x4", "64x16"))  # noqa: E731
    kind_row = lambda name, d: (f"| {name} | {fmt(d)} | {gpu(d):.2f} | " + " / ".join(  # noqa: E731
        f"{kinds(d).get(k, 0.0):.2f}" for k in ("Triton kernels (vae_kernels)", "convolution (cuDNN)",
                                               "other (copies, indexing, ...)")) + " |")
    r1, r8 = runs[1], runs[8]
    o1, o8, n1, n8 = served_old[1], served_old[8], served_new[1], served_new[8]
    md = ["", "## Twenty-fourth session (2026-11-28, H200): three passes fewer in the VAE decoder; a stall caught "
          "in the act", "",
          f"Six device calls (about 29 of 30 min). A 64 x 4 call of the VAE decoder takes {gpu(old3):.2f} -> "
          f"{gpu(final):.2f} ms of GPU ({gpu(old3) / gpu(final):.2f}x). The served benchmark at 64 streams stalled twice, on the old code as on the new. "
          "Each time the stall dump showed where the decoder's threads were waiting.", "",
          "**Where a 64 x 4 VAE call went** (call 1, `benchmarks/vae_precision.py --ops`: the PyTorch ops of one "
          "eager call with their shapes, `raw/vae_ops_before_twentyfourth.json`). Three costs were not the "
          "decoder's own work:",
          f"- The sample-rate condition (`x * scale + bias` per channel before each of the six decoder blocks) "
          f"ran as two elementwise passes each: {cond_ms:.2f} ms.",
          f"- The last conv (32 channels to 1, kernel 7) took {last_conv:.2f} ms in cuDNN, where reading "
          "its input takes about 0.05 ms.",
          f"- The two channels-last upsampling convs (512 and 1024 input channels) copied their inputs to "
          f"channels-last first: {copies:.2f} ms.", "",
          "**Changes** (`kernels/vae.py`, `model/audio_vae.py`):",
          "- `snake_extend` applies the condition's scale and shift before its snake (one row per stream, or "
          "one for all). `Decoder` hands a block the condition when the block's first snake runs in its "
          "upsampling conv's look-back pass (`DecoderBlock.takes_condition`).",
          "- For those two convs the same pass writes channels-last. The conv runs as `conv2d` over a "
          "[B, C, 1, T] view, because `conv1d` makes a 3-D input contiguous first. The first version of this "
          "added a copy instead of removing one (call 3: two copies per conv).",
          "- `conv_tanh`: the last conv and its tanh in one kernel, exact fp32. Its first version "
          "unrolled the seven taps over a [32, 256] tile and spilled (4.5 KB of stack, `ptxas -v` for sm_90 on "
          f"this machine). That took {v1_tanh_ms:.2f} ms where cuDNN took 0.41 (call 2, "
          "`raw/vae_call2_v1_twentyfourth.json`). The taps now run in a loop over [8, 256] tiles: 64 registers, "
          "no spills.", "",
          "ms per call, streams x patches (CUDA graphs where captured; 64 x 16 eager), and the GPU time "
          "of a 64 x 4 call by kind (Triton kernels / cuDNN / other; in these runs the cuDNN column also holds "
          f"`conv_tanh`, {_kernel_ms(final, '_conv_tanh_kernel'):.2f} ms in the final code, which the profile's "
          "kinds now count as a Triton kernel):", "",
          "| code | 1x1 | 8x4 | 64x4 | 64x16 | GPU ms, 64 x 4 | by kind |", "|---|---|---|---|---|---|---|",
          kind_row("before (call 3)", old3), kind_row("condition, conv_tanh, channels-last v1 (call 3, same call)", new3),
          kind_row("final, copies gone (call 4)", final), "",
          f"- Same call (call 3): 64 x 16 {shp(old3)['64x16']:.1f} -> {shp(new3)['64x16']:.1f} ms "
          f"({shp(old3)['64x16'] / shp(new3)['64x16']:.2f}x); GPU per 64 x 4 call {gpu(old3):.2f} -> "
          f"{gpu(new3):.2f} ms. In call 2 the code before took {gpu(before):.2f} ms.",
          f"- The final code (call 4, `raw/vae_final_twentyfourth.json`) takes {gpu(final):.2f} ms of GPU, "
          f"against {gpu(old3):.2f} before ({gpu(old3) / gpu(final):.2f}x). Its 64 x 4 wall time ({shp(final)['64x4']:.1f} ms) is "
          "out of line with its GPU time and with call 3. It was timed once, so this is not explained.",
          f"- The audio moved closer to exact fp32: max abs {err(old3)['max_abs']:.2e} -> {err(final)['max_abs']:.2e}, "
          f"SNR {err(old3)['snr_db']:.1f} -> {err(final)['snr_db']:.1f} dB (the last conv no longer in TF32).",
          f"- `gpu_check.py --only vae` passes (call 3, `raw/gpu_check_vae_twentyfourth.json`): the VAE as served "
          f"against exact fp32 {chk['served_vs_exact_fp32_max_abs']:.2e} (bound {chk['served_bound']:.0e}; "
          "1.68e-03 in the twenty-third session).",
          f"- GPU tests in call 3 (`raw/gpu_tests_twentyfourth.txt`): `tests/test_vae_kernels.py` and "
          f"`tests/test_engine_gpu.py -k 'stream_audio or first_audio'`, {gpu_tests} passed. Call 3 ran before "
          "the `conv2d` change. That change was checked on the GPU by call 4's decode only "
          "(the same audio error); its tests ran on the CPU only.", "",
          "**Served: not measured cleanly.**",
          f"- In call 5 the code before this session served 1 stream at TTFA p50 {o1[2]:.1f} ms and "
          f"{o1[4]:.1f}x, and 8 streams at {o8[4]:.1f}x (10 requests each, "
          "`raw/served_twentyfourth_call5_before.log`).",
          f"- In call 6, on another machine, this session's code made {n1[2]:.1f} ms and {n1[4]:.1f}x, and "
          f"{n8[4]:.1f}x at 8 streams (`raw/served_twentyfourth_call6_after.log`).",
          "- The two differ by the spread between machines. At 8 streams the VAE is about 6% of the GPU's "
          "work, so 1.15x there is worth about 1%: too little to see across machines.",
          "- Neither run finished its 64 streams. See the stall below.", "",
          "**The stall at 64 streams** (the twenty-first session's, not explained then).",
          "- Both servers stalled in the level of 64 streams, 10 requests each, right after the 1- and "
          "8-stream levels. One ran the old code (call 5), one the new code (call 6). The liveness check reported "
          "that the engine loop had not come round for 60 s, and the GPU had finished its work.",
          "- The decoder now logs every thread's stack when it stalls (`raw/served_twentyfourth_call{5_before,"
          "6_after}_stall.log`). In both servers:",
          "  - the audio thread was inside the Python backend's `response_sender.send`, holding the process's "
          "IPC lock (call 5: sending a chunk; call 6: sending a request's final flag);",
          "  - the engine thread was waiting for that lock, to ask `is_cancelled`;",
          "  - so was the metrics thread.",
          "- So a `send` to the Triton server process never returned. No device time was left to find out why "
          "or to test a fix, and nothing was changed for it.",
          "- What the send waits for, from a helper's reading of python_backend r24.10 (source, not reproduced). "
          "The stub waits for the server process with no timeout (`response_sender.cc`). The server hands a "
          "decoupled BLS response to the caller's stub, here `tts_stream`'s, and waits for that stub to take it in, "
          "also with no timeout (`python_be.cc: SendBLSDecoupledResponse`). So the decoder's send hangs when "
          "`tts_stream`'s stub stops taking responses. Three ways that can happen:",
          "  - its process is blocked or gone (24.10 does not restart decoupled stubs);",
          "  - its shared-memory region cannot grow (about 0.5 MB of audio per response; `/dev/shm` of the device "
          "machine was not recorded);",
          "  - a lost cross-process wake-up, which python_backend's maintainers acknowledge happens rarely "
          "(python_backend PR #240).",
          "- Next steps for a GPU call: dump the stubs' stacks at the stall (`py-spy dump --native`), record "
          "`/dev/shm`, and try a larger `--backend-config=python,shm-default-byte-size`.",
          "- What the runs show of the caller's side:",
          "  - The liveness check reported the stall in both servers, and orchestrators failed their requests with "
          "`VoxCPM server unhealthy` (21 and 27 logged cancellations in calls 5 and 6, of 64 streams in flight).",
          "  - The other clients had no answer when the benchmark's time ran out, about 140 s later.",
          "  - In call 5 the second benchmark, meant for this session's server, reached the first server, "
          "still stalled. Triton answered `Stub process 'tts_stream_0_1' is not healthy` "
          "(`raw/served_twentyfourth_call5_second_bench.log`).",
          "  - So one orchestrator instance's stub had stopped. That fits the first of the three ways above. "
          "Under `scripts/serve.sh` the supervisor restarts an unhealthy server; the benchmark runs without it.",
          "- The twenty-third session's A/B ran these levels with 10 requests per stream on two servers "
          "without a stall. The sweeps of the last two sessions used 2 requests per stream.", "",
          f"**The engine at batch 8** (call 1, `bench.py --batches 1,8 --reference none --no-vae --graphs-only`, "
          f"`raw/offline_twentyfourth_b8.json`): {r8['aggregate_xrt']:.1f}x real time at batch 8, RTF "
          f"{r1['rtf']:.4f} at batch 1. So 8 served streams (143-146x) run at about 0.92 of the engine. "
          f"A batch-8 step is {p8['gpu_ms']:.2f} ms of GPU work: GEMMs (cuBLAS, nearly all LocDiT's at 176 "
          f"tokens) {p8['by_kind_ms']['GEMM (cuBLAS)']:.2f} ms, the persistent LM/LocEnc layers "
          f"{p8['by_kind_ms']['other (copies, indexing, ...)']:.2f} ms.", "",
          "**LocDiT's GEMMs at batch buckets 4 and 8** (88 and 176 tokens), the experimental split-K Triton kernel "
          "(eleventh session) against cuBLAS. Each call reads its own copy of the weight "
          "(`benchmarks/kernel_skinny_gemm.py --tokens 88,176 --quick`, "
          "`raw/kernel_skinny_gemm_176_twentyfourth.json`), us per call:", "",
          "| weight | tokens | cuBLAS | best Triton | ratio |", "|---|---|---|---|---|"]
    md += [f"| {r['shape']} | {r['M']} | {r['cublas_us']:.2f} | {r['best']['us']:.2f} | "
           f"{r['cublas_us'] / r['best']['us']:.2f}x |" for r in skinny]
    md += ["", "cuBLAS wins at both sizes (the kernel holds all tokens' rows in each program: 256-row tiles at 176). "
           "No GEMM kernel of this kind gets batch 8's LocDiT faster. The 8-stream target (150x) stays missed by "
           "3-5%.", "",
           "![twenty-fourth session: the VAE decoder's GPU time per call](results_twentyfourth.png)", ""]
    _plot_twenty_fourth([("before", old3), ("condition + conv_tanh", new3), ("final", final)])
    return md


def _plot_twenty_fourth(variants):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    names = ("Triton kernels (vae_kernels)", "convolution (cuDNN)", "other (copies, indexing, ...)")
    bottom = [0.0] * len(variants)
    for name, color in zip(names, ("#286", "#59c", "#999")):
        vals = [d["profile_64x4"]["fp32"]["by_kind_ms"].get(name, 0.0) for _, d in variants]
        axes[0].bar([v for v, _ in variants], vals, bottom=bottom, color=color, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, b in enumerate(bottom):
        axes[0].text(i, b, f"{b:.2f}", ha="center", va="bottom", fontsize=8)
    axes[0].set_ylabel("GPU ms per call (64 streams x 4 patches)")
    axes[0].legend(fontsize=7)
    axes[0].set_title("VAE decoder, by kind", fontsize=9)
    shapes = ("1x1", "8x4", "16x4", "64x1", "64x4")
    paired_bars(axes[1], list(shapes), [(v, c, [d["shapes"]["fp32"][s] for s in shapes])
                                         for (v, d), c in zip(variants[:2], ("#999", "#286"))], "{:.1f}".format)
    axes[1].legend(fontsize=7)
    axes[1].set_xlabel("streams x patches (call 3, same call)")
    axes[1].set_ylabel("ms per call")
    axes[1].set_title("VAE decoder, wall time per call", fontsize=9)
    save_panels(fig, axes, "Twenty-fourth session, H200, 2026-11-28", "results_twentyfourth.png")
