"""results.md: the eighth session's section, and results_serving.png."""

from summary.plots import save_stream_panels, stream_panels
from summary.raw import load, served_levels


def eighth_session(res) -> list[str]:
    """Issues 15-19 (2026-11-24): staggered arrivals and capacity, prefix caching, the OpenAI gateway,
    LoRA, FP8, two GPUs. Adds their keys to `res`, returns the markdown, draws results_serving.png."""
    burst, poisson = served_levels("served_issue17_burst.json"), served_levels("served_issue17_poisson.json")
    pc, gw, lora, fp8 = (load(n) for n in ("prefix_cache.json", "gateway.json", "lora_torch_formulations.json",
                                           "fp8_quality.json"))
    one, two = served_levels("served_h200_1gpu.json"), served_levels("served_h200_2gpu.json")
    cap = {"burst": load("served_issue17_burst.json")["capacity"], "poisson": load("served_issue17_poisson.json")["capacity"]}
    res.update({
        "ttfa_ms_p95_c64": burst[64]["ttfa_ms"]["p95"], "smooth_frac_c64": burst[64]["smooth_playback_frac"],
        "aggregate_xrt_c64": burst[64]["x_real_time"], "aggregate_xrt_c128": burst[128]["x_real_time"],
        "capacity_streams": cap, "single_stream_rtf_triton": burst[1]["rtf"]["p50"],
        "ttfa_ms_p50": burst[1]["ttfa_ms"]["p50"],
        "fp8_patch_cosine_min": fp8["fp8_patch_cosine_min"],
        "single_stream_rtf_offline_fp8": fp8["single_stream_rtf_offline_fp8"],
        "prefix_cache_ttfa_ms_p50": {k: p["ttfa_ms"]["p50"] for k, p in pc["phases"].items()},
        "gateway_ttfb_delta_ms_p50": gw["single"]["delta_p50_ms"], "gateway_c32_aggregate_ratio": gw["concurrent"]["ratio"],
        "lora_torch_over_base_step": {k: lora[k] for k in lora if "_over_base_step_" in k},
        "two_gpus_h200": {c: {"one_gpu_xrt": one[c]["x_real_time"], "two_gpus_xrt": two[c]["x_real_time"],
                              "ratio": two[c]["x_real_time"] / one[c]["x_real_time"],
                              "smooth_two_gpus": two[c]["smooth_playback_frac"]} for c in (64, 128)},
    })
    md = ["", "## Eighth session (2026-11-24): capacity, prefix caching, gateway, LoRA, FP8, two GPUs", "",
          "Served on the final code (H100, prefix caching on; `ARRIVALS=burst,poisson`: all streams at once, or "
          "each request after an exponential gap of mean 2 s):", "",
          "| streams | burst: TTFA p50 / p95 ms | smooth | x real time | poisson: TTFA p50 / p95 ms | smooth |",
          "|---|---|---|---|---|---|"]
    for c in sorted(burst):
        b, p = burst[c], poisson[c]
        md.append(f"| {c} | {b['ttfa_ms']['p50']:.0f} / {b['ttfa_ms']['p95']:.0f} | {b['smooth_playback_frac']:.0%} "
                  f"| {b['x_real_time']:.0f} | {p['ttfa_ms']['p50']:.0f} / {p['ttfa_ms']['p95']:.0f} "
                  f"| {p['smooth_playback_frac']:.0%} |")
    md += ["", f"Capacity (most streams with every stream smooth and TTFA p95 <= 500 ms): burst {cap['burst']}, "
           f"Poisson {cap['poisson']}.", "",
           "Two GPUs (2 x H200, one call: the same repository on one GPU, then on both with KIND_AUTO):", "",
           "| streams | one GPU x real time | two GPUs | ratio | smooth (two) |", "|---|---|---|---|---|"]
    for c, r in res["two_gpus_h200"].items():
        md.append(f"| {c} | {r['one_gpu_xrt']:.0f} | {r['two_gpus_xrt']:.0f} | {r['ratio']:.2f} "
                  f"| {r['smooth_two_gpus']:.0%} |")
    ph = pc["phases"]
    md += ["", "Prefix caching (`bench_prefix_cache.py`): TTFA p50 of a registered 10 s voice, cold "
           f"{ph['cold']['ttfa_ms']['p50']:.1f} ms vs cached {ph['cached']['ttfa_ms']['p50']:.1f} ms; 32 streams x 2 of "
           f"one voice {ph['voice']['ttfa_ms']['p50']:.0f} ms p50 / {ph['voice']['x_real_time']:.0f}x vs its audio inline "
           f"{ph['inline']['ttfa_ms']['p50']:.0f} ms / {ph['inline']['x_real_time']:.0f}x.", "",
           f"OpenAI gateway (`bench_gateway.py`): time to first byte +{gw['single']['delta_p50_ms']:.1f} ms at p50 over "
           f"the direct gRPC stream (1 stream, pcm); 32 streams x 2: {gw['concurrent']['ratio']:.3f} of the direct "
           "aggregate.", "",
           "LoRA in the torch formulations (`bench_lora.py`, rank 32, every row its own adapter), step time over "
           "no LoRA: " + ", ".join(f"{k} {v:.2f}x" for k, v in res["lora_torch_over_base_step"].items())
           + " (target <= 1.10; the ninth session's kernel below replaces them on the GPU).", ""]
    md += ["", f"FP8 (random weights: no real outlier channels): teacher-forced patch cosine vs bf16 over 50 steps "
           f"min {fp8['fp8_patch_cosine_min']:.3f}; offline batch-1 RTF {fp8['single_stream_rtf_offline_fp8']:.3f}.",
           ""]

    fig, (a, b) = stream_panels()
    for lv, style, label in ((burst, "o-", "burst"), (poisson, "s--", "Poisson arrivals")):
        xs = sorted(lv)
        a.plot(xs, [lv[x]["ttfa_ms"]["p95"] for x in xs], style, label=f"TTFA p95, {label}")
        b.plot(xs, [100 * lv[x]["smooth_playback_frac"] for x in xs], style, label=label)
    a.axhline(300, color="#c33", lw=0.8, ls="--", label="target (64 streams)")
    a.set_yscale("log")
    a.set_ylabel("ms")
    b.set_ylabel("smooth playback, % of streams")
    save_stream_panels(fig, (a, b), "concurrent streams",
                        "Served tts_stream on one H100, 2026-11-24 (prefix caching on)", "results_serving.png")
    return md
