"""results.md: the fifteenth session's section, and results_fifteenth.png."""

import statistics

from summary.plots import save_panels, stream_panels
from summary.raw import load


def fifteenth_session(res) -> list[str]:
    """2026-11-25, seventh session of the day (issue 17): a LocDiT/LocEnc layer of a few tokens as one
    persistent kernel with grid barriers (kept: the server runs it), after a five-kernel fusion and L2
    prefetching (measured, not kept)."""
    sweep = load("kernel_fused_layer_sweep_fifteenth.json")
    runs = [load("kernel_fused_layer_persistent_fifteenth.json"), load("kernel_fused_layer_prefetchers_fifteenth.json")]
    v1 = load("persistent_profile_v1_fifteenth.json")
    on, off = load("offline_fifteenth_persistent_on.json"), load("offline_fifteenth_persistent_off.json")
    gpu = load("gpu_check_fifteenth.json")
    layers = {}  # M -> variant -> [us per layer, one per run]
    for run in runs:
        for r in run["layers"]:
            if "M" in r:
                for k, v in r.items():
                    if isinstance(v, dict) and "us_per_layer" in v:
                        layers.setdefault(r["M"], {}).setdefault(k, []).append(v["us_per_layer"])
    med = statistics.median
    # the server's launch: "persistent_attn1" in these runs, "persistent" in kernel_fused_layer.py since
    server = lambda M: "persistent_attn1" if "persistent_attn1" in layers[M] else "persistent"  # noqa: E731
    row = lambda M, k: med(layers[M][server(M) if k == "server" else k])  # noqa: E731
    res["persistent_layer_us"] = {M: row(M, "server") for M in layers}
    res["persistent_layer_speedup"] = {M: row(M, "compiled_torch") / row(M, "server") for M in layers}
    g_on, g_off = on["engine"]["graphs"], off["engine"]["graphs"]
    p_on, p_off = g_on["profile_batch1"], g_off["profile_batch1"]
    res["step_ms_b1_profiled"] = {"persistent": p_on["wall_ms_per_step"], "before": p_off["wall_ms_per_step"]}
    res["engine_b1_rtf"] = {"persistent": g_on["runs"][0]["rtf"], "before": g_off["runs"][0]["rtf"]}
    md = ["", "## Fifteenth session (2026-11-25, H100): LocDiT's layers as one persistent kernel each", "",
          "At batch 1 a decode step evaluates LocDiT's 12 layers 9 times over a few dozen tokens (2 x 11 per "
          "request, the CFG halves; a lone request runs in the batch bucket of 2, so 44), about a dozen kernels "
          "per layer, each bound by its launch, ramp and tail rather than by its bytes. Three ways to fewer, "
          "fuller kernels, each measured per layer in a CUDA graph of 12 layers with their own weights (420 MB, "
          "past the 50 MB L2) against the compiled path the model ran (`benchmarks/kernel_fused_layer.py`; two "
          "runs, `raw/kernel_fused_layer_{persistent,prefetchers}_fifteenth.json`, median), us per layer:", "",
          "| tokens | compiled path | five kernels (swept) | persistent kernel (the server's launch) | speed-up | "
          "compiled, weights in L2 | persistent, weights in L2 |", "|---|---|---|---|---|---|---|"]
    for M in sorted(layers, reverse=True):
        five = row(M, "fused_tuned")
        l2p = f"{row(M, 'persistent_l2_resident'):.1f}" if "persistent_l2_resident" in layers[M] else "-"
        md.append(f"| {M}{' (one run)' if len(layers[M]['compiled_torch']) == 1 else ''} | "
                  f"{row(M, 'compiled_torch'):.1f} | {five:.1f} | {row(M, 'server'):.1f} | "
                  f"{res['persistent_layer_speedup'][M]:.2f}x | {row(M, 'compiled_torch_l2_resident'):.1f} | {l2p} |")
    server_launch = ({"attn_heads": 1}, {"blocks": [32, 32, 32, 32], "splits": [4, 4], "block_k": 128, "attn_heads": 1,
                                         "num_warps": 4})
    prof = next(p for p in runs[1]["persistent_profiles"] if p["M"] == 44 and p["launch"] in server_launch)
    pf = [row(M, k) for M in (44, 22) for k in layers[M] if k.startswith("persistent_attn1_pf")]
    pf_ratio = [row(M, "server") / row(M, k) for M in (44, 22) for k in layers[M] if k.startswith("persistent_attn1_pf")]
    assert pf
    md += ["", "1. **Five kernels** (`benchmarks/experiments/five_kernel_layer.py`, not kept): the norms in the "
           "prologue of the GEMM that reads them, SiLU-times-up and the residuals in the epilogues, split-K sums "
           "by the tile's last program. Its GEMMs are slower than cuBLAS's: every program normalises all "
           "tokens' rows again, and re-reads them from L2 (the sweep of "
           f"{sum(r['tried'] for r in sweep['linears'] if r['M'] == 44)} launches per token count over its four "
           "linears, `raw/kernel_fused_layer_sweep_fifteenth.json`: QKV with its norm "
           f"{next(r['best']['us'] for r in sweep['linears'] if r['M'] == 44 and r['linear'] == 'qkv'):.1f} us at "
           "44 tokens, where cuBLAS "
           "alone took 5.5 in the eleventh session's sweep, `raw/kernel_skinny_gemm_loc.json`). A win only at "
           "LocEnc's 10 tokens.",
           "2. **L2 prefetch** (`benchmarks/experiments/l2_prefetch.py`, not kept): `cp.async.bulk.prefetch.L2` holds "
           "its program until the bytes arrive (one layer's 35 MB in "
           f"{runs[0]['layers'][-1]['us']:.1f} us from 132 programs, {runs[0]['layers'][-3]['us']:.1f} from 4), "
           f"so on the decode stream it costs more than it saves (next layer's weights: "
           f"{row(44, 'compiled_torch') / row(44, 'compiled_torch_prefetch_next'):.2f}x); from a second stream "
           f"{row(44, 'compiled_torch') / row(44, 'compiled_torch_prefetch_side4'):.2f}x at 44 tokens and "
           f"{row(22, 'compiled_torch') / row(22, 'compiled_torch_prefetch_side4'):.2f}x at 22. The bound: with "
           f"every weight already in L2 the compiled layer is only {row(44, 'compiled_torch') / row(44, 'compiled_torch_l2_resident'):.2f}x "
           "faster: DRAM is not what these kernels wait for.",
           "3. **One persistent kernel per layer** (`voxcpm_triton/kernels/persistent_layer.py`, kept): one program "
           "per SM at most, eight phases (norm, QKV, attention, output projection in 4 K splits, their sum with the "
           "residual and the second norm, gate/up with SiLU, down in 4 K splits, their sum with the residual) "
           "separated by grid-wide barriers that spin on a counter in global memory. The GPU's global timer in "
           "every program (`layer(timings=)`) shows where a layer's time goes, at 44 tokens "
           f"(start of the first program to the end of the last, {prof['total_us']:.1f} us; median of 12 layers x 5 runs):", "",
           "| phase | span us | barrier us |", "|---|---|---|"]
    for ph in prof["phases"]:
        md.append(f"| {ph['phase']} | {ph['span_us']:.2f} | " + (f"{ph['barrier_us']:.2f} |" if ph["barrier_us"] is not None else "- |"))
    v1p = next(p for p in v1["persistent_profiles"] if p["M"] == 44 and p["launch"] == {"prefetch": False})
    down_v1 = next(ph for ph in v1p["phases"] if ph["phase"].startswith("down"))
    md += ["", f"A barrier costs ~{med(ph['barrier_us'] for ph in prof['phases'] if ph['barrier_us']):.1f} us. The "
           f"first version (`raw/persistent_profile_v1_fifteenth.json`) gave each output column to one program over "
           f"all of K: the down projection alone took {down_v1['span_us']:.1f} us, every program re-reading the "
           "[tokens, 4096] activations; splitting K four ways (partials summed in order by rows, fused with the next "
           "norm) and one query head per attention item made the launch above. Asking for the weights in L2 from "
           "inside the kernel did not pay either way: from the worker programs at their start (they then wait for "
           f"the bytes), or from 4-16 extra prefetching programs ({min(pf_ratio):.2f}-{max(pf_ratio):.2f}x of the launch "
           "without, `raw/kernel_fused_layer_prefetchers_fifteenth.json`). The GEMM phases "
           "still run at 1-2 TB/s: each program walks its K loop with little in flight.", "",
           "The engine, same call, `bench.py --batches 1,8,64 --reference none --no-vae` with the kernel and with "
           "`VOXCPM_FUSED_LOCAL_LAYERS=0` (`raw/offline_fifteenth_persistent_{on,off}.json`):", "",
           "| | persistent layers | before | ratio |", "|---|---|---|---|"]
    for i, b in enumerate((1, 8, 64)):
        a, z = g_on["runs"][i], g_off["runs"][i]
        md.append(f"| batch {b}: steps/s (RTF, x real time) | {a['steps_per_s']:.1f} ({a['rtf']:.4f}, "
                  f"{a['aggregate_xrt']:.0f}x) | {z['steps_per_s']:.1f} ({z['rtf']:.4f}, {z['aggregate_xrt']:.0f}x) | "
                  f"{a['steps_per_s'] / z['steps_per_s']:.2f} |")
    md += [f"| batch 1 profiled: ms per step / GPU ms / kernels | {p_on['wall_ms_per_step']:.2f} / {p_on['gpu_ms']:.2f} / "
           f"{p_on['kernels']:.0f} | {p_off['wall_ms_per_step']:.2f} / {p_off['gpu_ms']:.2f} / {p_off['kernels']:.0f} | "
           f"{p_off['wall_ms_per_step'] / p_on['wall_ms_per_step']:.2f}x |",
           f"| first patch of a lone request, ms | {g_on['first_audio']['first_patch_ms_p50']:.1f} | "
           f"{g_off['first_audio']['first_patch_ms_p50']:.1f} | |",
           f"| start-up (graphs, compiles), s | {g_on['startup_s']:.0f} | {g_off['startup_s']:.0f} | |", "",
           f"Batch 1: the profiled step is {p_off['wall_ms_per_step'] / p_on['wall_ms_per_step']:.2f}x shorter "
           f"({p_off['kernels']:.0f} kernels to {p_on['kernels']:.0f}; the same GPU time, {p_on['gpu_ms']:.2f} ms, "
           "without the gaps between kernels), the engine loop "
           f"{g_on['runs'][0]['steps_per_s'] / g_off['runs'][0]['steps_per_s']:.2f}x faster: at "
           f"{1000 / g_on['runs'][0]['steps_per_s']:.2f} ms per step against {p_on['wall_ms_per_step']:.2f} ms of "
           "step on the GPU, the loop's host side now shows (not investigated: no device time was left). Batches "
           "8 and 64 do not run the kernel for LocDiT (88 tokens and more; LocEnc's 40 at batch 8 do): their "
           "differences here (-3%) are between-run spread, not measured twice. Start-up grows because the 64-token "
           "bound is a branch in the compiled LocDiT and LocEnc: torch.compile builds each twice (capture of the "
           f"batch buckets 4 and 16, where LocDiT and LocEnc first pass 64 tokens: "
           f"{g_on['capture_s_per_bucket']['4']:.1f} and {g_on['capture_s_per_bucket']['16']:.1f} s against "
           f"{g_off['capture_s_per_bucket']['4']:.1f} and {g_off['capture_s_per_bucket']['16']:.1f}; the compile "
           "cache keeps them for the next start). GPU correctness with it (`benchmarks/gpu_check.py`, `raw/gpu_check_fifteenth.json`): bf16 vs "
           f"fp32 teacher-forced cosine min {gpu['teacher_forced']['cosine_min']:.5f}, every graph-vs-eager check "
           "PASS. GPU tests (`raw/gpu_tests_fifteenth.txt`): `tests/test_persistent_layer.py` and "
           "`tests/test_local_attention_triton.py` 58 passed (compiled, captured, replayed 60 times with new inputs). "
           f"The profile counts {p_on['top'][0]['calls']:.0f} launches of the kernel per step, where LocDiT's 9 x 12 "
           "layers and LocEnc's 12 make 120; the run without it counted the attention kernel, which every one of "
           f"those layers calls once, {next(t['calls'] for t in p_off['top'] if t['kernel'] == '_local_attention_kernel'):.0f} "
           "times, so the profile's per-step counts run ~10% low in both. On the CPU the engine's step hands the "
           "kernel LocDiT's and LocEnc's layers (`tests/test_persistent_layer.py`, eager), and a torch.compile'd "
           "LocEnc first compiled at a prompt's size still does at a decode step's (checked by hand, not a test). "
           "On the GPU, `gpu_check.py`'s compiled step (bf16, the kernel in LocDiT at batch buckets 2 and LocEnc at "
           "2 and 8) against the plain eager PyTorch step is the model-level check above. After these measurements "
           "a review's fixes changed the kernel module's host side (barrier counters per thread, so that two "
           "engines on two streams in one process cannot share them; contiguous weights required; the timings "
           "buffer's shape checked; the fake op's strides) and dropped a branch the kernel never took: tested on "
           "the CPU, not re-run on the GPU (no device time left).",
           "", "![fifteenth session: per-layer time and the persistent kernel's phases](results_fifteenth.png)", ""]
    _plot_fifteenth(layers, prof)
    return md


def _plot_fifteenth(layers, prof):
    fig, axes = stream_panels()
    Ms = sorted(layers)
    names = (("compiled_torch", "compiled path"), ("fused_tuned", "five kernels"),
             ("persistent_attn1", "persistent kernel"), ("compiled_torch_l2_resident", "compiled, weights in L2"))
    w = 0.2
    for i, (k, label) in enumerate(names):
        axes[0].bar([j + (i - 1.5) * w for j in range(len(Ms))], [statistics.median(layers[M][k]) for M in Ms], w,
                    label=label)
    axes[0].set_xticks(range(len(Ms)), [f"{M} tokens" for M in Ms])
    axes[0].set_ylabel("us per layer")
    axes[0].set_title("LocDiT/LocEnc layer, 12 in a CUDA graph", fontsize=9)
    axes[0].set_ylim(0, 62)
    axes[0].legend(fontsize=7, ncol=2, loc="upper center")
    left = 0.0
    for ph in prof["phases"]:
        axes[1].barh(0, ph["span_us"], left=left, label=ph["phase"])
        left += ph["span_us"]
        if ph["barrier_us"]:
            axes[1].barh(0, ph["barrier_us"], left=left, color="lightgrey")
            left += ph["barrier_us"]
    axes[1].set_yticks([])
    axes[1].set_xlabel("us (grey: barriers)")
    axes[1].set_title("persistent kernel at 44 tokens: phases in order", fontsize=9)
    axes[1].legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    save_panels(fig, axes, "Fifteenth session, H100, 2026-11-25", "results_fifteenth.png")
