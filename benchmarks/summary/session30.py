"""results.md: the thirtieth session's section, and results_thirtieth.png."""

import json
import os
import re

from summary.plots import paired_bars, pyplot, save_panels
from summary.raw import HERE, load, ms_per_step_for


def thirtieth_session(res) -> list[str]:
    """2026-11-29 (issue 17): where the GPU's time goes in the closed loop (`closed_loop.py --trace`, split by
    stream with gpu_timeline.py), and the closed loop without the VAE's GPU work (`vae_off`); two engine
    settings and four levers measured and dropped (long VAE decodes
    in graph pieces or groups, the polyphase convs' channels-last threshold, inductor's max-autotune for
    LocDiT's layer, the local attention kernel's launch). Sets res["thirtieth"], returns the markdown, draws
    results_thirtieth.png."""
    run = load("closed_loop_trace_thirtieth.json")
    loop = {int(n): lv for n, lv in run["levels"].items()}
    traces = {int(n): t for n, t in run["traces"].items()}
    pieces = load("vae_pieces_thirtieth.json")["shapes"]
    tuned_run = load("kernel_fused_layer_autotune_thirtieth.json")
    tuned = {r["M"]: r for r in tuned_run["layers"] if "M" in r}
    persistent_us = {p["M"]: p["total_us"] for p in tuned_run["persistent_profiles"]}
    with open(os.path.join(HERE, "raw", "kernel_fused_layer_autotune_thirtieth.log")) as f:
        picks = [json.loads(m) for m in re.findall(r'^(\{"num_choices".*\})$', f.read(), re.M)]
    att = {a: {r["batch"]: r for r in load(f"local_attention_warps_{a}_thirtieth.json")["rows"]} for a in ("s11", "s5")}
    chk = load("gpu_check_thirtieth.json")
    cl = load("vae_channels_last_thirtieth.json")["by_threshold"]
    chkv = load("gpu_check_vae_cl256_thirtieth.json")
    served = {n: [res["twentyninth"]["served_ab"][c]["after"][n]["xrt"] for c in res["twentyninth"]["served_ab"]]
              for n in (8, 64)}
    off = {int(n): lv for n, lv in load("closed_loop_vae_off_thirtieth.json")["levels"].items()}
    target = {8: 150, 64: 500}
    # time per unit of audio (1 / x real time): the VAE's work's share of it, and what a target needs cut
    vae_share = {n: 1 - off[n]["behind"]["x_real_time"] / off[n]["vae_off"]["x_real_time"] for n in off}

    def vae_cut(n, x_now):
        """The share of the VAE's work (call 6, per unit of audio) that `target` needs gone from x_now x real
        time, if the round's time shrinks in proportion to the VAE's work."""
        inv = lambda x: 1 / x  # noqa: E731
        return (inv(x_now) - inv(target[n])) / (inv(off[n]["behind"]["x_real_time"]) - inv(off[n]["vae_off"]["x_real_time"]))

    def rest_cut(n):
        """The same cut taken from the rest of the round instead (its time without the VAE's work)."""
        return off[n]["vae_off"]["x_real_time"] * (1 / off[n]["behind"]["x_real_time"] - 1 / target[n])

    steps = {n: traces[n]["round"]["engine_steps"] for n in traces}
    split = {n: {k: traces[n]["split"][f"{k}_ms"] / steps[n] for k in ("first_only", "both", "second_only", "neither")}
             for n in traces}
    eng = {n: traces[n]["streams"][traces[n]["split"]["first"]] for n in traces}
    vae = {n: traces[n]["streams"][traces[n]["split"]["second"]] for n in traces}
    patches = {n: traces[n]["round"]["requests"] * run["steps"] for n in traces}
    goal = {8: ms_per_step_for(loop[8]["behind"], 150), 64: ms_per_step_for(loop[64]["behind"], 500)}
    gap = {n: loop[n]["behind"]["ms_per_engine_step"] - goal[n] for n in goal}
    traced_step = {n: traces[n]["round"]["ms_per_engine_step"] for n in traces}

    def kernel(n, stream, part):
        """(calls, ms) of the first kernel in a traced stream's top list whose name holds `part`."""
        k = next(k for k in stream[n]["top"] if part in k["name"])
        return k["calls"], k["ms"]

    fp32_conv = kernel(64, vae, "f32f32_f32f32")
    attn = kernel(64, eng, "_local_attention_kernel")
    layer8 = kernel(8, eng, "_layer_kernel")
    gemm8 = sum(k["ms"] for k in eng[8]["top"] if k["name"].startswith("nvjet")) / steps[8]
    attn8, silu8 = kernel(8, eng, "_local_attention_kernel"), kernel(8, eng, "silu")
    locdit8 = (sum(k["calls"] for k in eng[8]["top"] if k["name"].startswith("nvjet") and "bias" not in k["name"])
               + attn8[0] + silu8[0])  # the bias-free GEMMs, attention and SiLU product: LocDiT's layer kernels
    prio8 = [r["x_real_time"] for r in loop[8]["audio_normal"]["rounds"]], [r["x_real_time"] for r in loop[8]["behind"]["rounds"]]
    res["thirtieth"] = {
        "device": "NVIDIA H200",
        "closed_loop": {n: {k: {m: lv[k][m] for m in ("x_real_time", "request_ms_p50", "first_audio_ms_p50",
                                                      "first_audio_ms_p95", "ms_per_engine_step")}
                            for k in run["settings"]} for n, lv in loop.items()},
        "traced_per_step_ms": split, "ms_per_step_needed": goal,
        "closed_loop_vae_off": {n: {k: {m: lv[k][m] for m in ("x_real_time", "ms_per_engine_step", "first_audio_ms_p50",
                                                              "first_audio_ms_p95")}
                                    for k in ("behind", "vae_off")} for n, lv in off.items()},
        "vae_work_share_of_round": vae_share,
        "vae_ms_per_patch_traced": {n: vae[n]["busy_ms"] / patches[n] for n in traces},
        "vae_pieces_gpu_ms": {s: {w: v["gpu_ms"] for w, v in r["ways"].items()} for s, r in pieces.items()},
        "vae_channels_last_from_gpu_ms": {t: {s: r["ways"]["eager"]["gpu_ms"] for s, r in tab.items()} for t, tab in cl.items()},
        "locdit_layer_us": {M: {k: r[k]["us_per_layer"] for k in ("compiled_torch", "compiled_torch_autotuned")}
                            for M, r in tuned.items()},
        "gpu_check_pass": all(chk[k]["pass"] for k in ("teacher_forced", "vae_graphs_vs_eager", "prefill_graph_vs_eager"))
        and all(v["pass"] for v in chk["graph_vs_eager"].values())}
    md = ["", "## Thirtieth session (2026-11-29, H200): where the GPU's time goes; without the VAE's work both "
          "throughput targets pass in process; the levers tried, none kept", "",
          "Six device calls, about 27 of 30 min. No change to the server: the targets of issue 17 stand where the "
          "twenty-ninth session left them. This session measured where a step's wall time goes, with the VAE beside "
          "the steps as served, tried the levers that the split pointed at, and ran the closed loop without the "
          f"VAE's work: {off[8]['vae_off']['x_real_time']:.1f}x at 8 clients and {off[64]['vae_off']['x_real_time']:.1f}x "
          "at 64, past both throughput targets (call 6, below).", "",
          "**Where the time goes** (call 1: `closed_loop.py --checkpoint /tmp/full --clients 8,64 --requests 4 "
          "--rounds 2 --settings behind,no_fence,audio_normal --trace 8,64`, `raw/closed_loop_trace_thirtieth.{json,log}`).",
          f"- `--trace` runs one more round ({traces[8]['round']['requests'] // 8} requests a client) under "
          "torch.profiler, CUDA activity only.",
          "- `gpu_timeline.py` (new) splits its kernels, copies and sets by CUDA stream: the engine's stream and the "
          "audio thread's (the VAE).",
          "- For each instant from the first GPU event to the last it says which of the two was busy: the engine "
          "alone, both, the VAE alone, or neither (the GPU idle: no third stream was busy).",
          f"- Under the profiler a step took {traced_step[8]:.2f} ms against {loop[8]['behind']['ms_per_engine_step']:.2f} "
          f"at 8 clients (+{100 * (traced_step[8] / loop[8]['behind']['ms_per_engine_step'] - 1):.1f}%) and "
          f"{traced_step[64]:.2f} against {loop[64]['behind']['ms_per_engine_step']:.2f} at 64 "
          f"(+{100 * (traced_step[64] / loop[64]['behind']['ms_per_engine_step'] - 1):.1f}%), in a shorter round.", "",
          "ms per engine step (the traced round's time over its engine steps):", "",
          "| clients | engine alone | both | VAE alone | neither (idle) | sum | unprofiled ms per step | needed for the target |",
          "|---|---|---|---|---|---|---|---|"]
    for n in (8, 64):
        x = split[n]
        md.append(f"| {n} | {x['first_only']:.2f} | {x['both']:.2f} | {x['second_only']:.2f} | {x['neither']:.2f} | "
                  f"{sum(x.values()):.2f} | {loop[n]['behind']['ms_per_engine_step']:.2f} | "
                  f"{goal[n]:.2f} ({150 if n == 8 else 500}x) |")
    md += ["", "\"Needed\" is the unprofiled ms per step times the round's x real time over the target: the round's "
           "time in proportion to its steps' (`ms_per_step_for`). The twenty-ninth session's figures held each "
           "request's time over its 100 steps fixed instead, which understated the distance: its section said 8.36 and "
           f"19.82 ms and now says {ms_per_step_for(res['twentyninth']['closed_loop'][8]['behind'], 150):.2f} and "
           f"{ms_per_step_for(res['twentyninth']['closed_loop'][64]['behind'], 500):.2f}.", "",
           "Each stream's own view (ms per step; short gaps: under 20 us between two of its events, the GPU "
           "starting its next kernel; long gaps: the stream had nothing running for longer):", "",
           "| clients | engine: busy | short gaps | long gaps (per step) | events per step | VAE: busy | VAE ms per patch |",
           "|---|---|---|---|---|---|---|"]
    for n in (8, 64):
        e, v = eng[n], vae[n]
        md.append(f"| {n} | {e['busy_ms'] / steps[n]:.2f} | {e['short_gaps_ms'] / steps[n]:.2f} | "
                  f"{e['long_gaps_ms'] / steps[n]:.2f} ({e['long_gaps'] / steps[n]:.1f}) | {e['events'] / steps[n]:.0f} | "
                  f"{v['busy_ms'] / steps[n]:.2f} | {v['busy_ms'] / patches[n]:.3f} |")
    md += ["",
           f"- **8 clients.** The engine's stream is busy {eng[8]['busy_ms'] / steps[8]:.2f} ms a step, with "
           f"{eng[8]['events'] / steps[8]:.0f} events (kernels, copies, sets). Neither stream is busy "
           f"{split[8]['neither']:.2f} ms a step: the engine's stream has {eng[8]['short_gaps_ms'] / steps[8]:.2f} ms "
           f"of short gaps and {eng[8]['long_gaps_ms'] / steps[8]:.2f} ms of long ones a step, and the tool cannot say "
           "which of them the VAE covers.",
           f"  - Its costliest kernels: the persistent LM/LocEnc layers (`_layer_kernel`) {layer8[1] / steps[8]:.2f} ms a "
           f"step; the cuBLAS GEMMs among the eight costliest kernels {gemm8:.2f} ms. Of those eight, the bias-free GEMMs, "
           f"attention and SiLU product make {locdit8 / steps[8]:.0f} launches a step, a count that fits LocDiT's 108 layer "
           "evaluations a step (9 CFM evaluations x 12 layers at 176 tokens); the trace does not attribute kernels to "
           "modules.",
           f"  - The VAE is busy {vae[8]['busy_ms'] / steps[8]:.2f} ms a step, {split[8]['both']:.2f} of them beside the "
           f"engine. At {vae[8]['busy_ms'] / patches[8]:.3f} ms a patch it costs more than at 64 clients: its decodes "
           "are smaller.",
           f"  - 150x needs {goal[8]:.2f} ms a step in process, {gap[8]:.2f} ms less than now. Served, where the server "
           f"makes {min(served[8]):.1f}-{max(served[8]):.1f}x (the twenty-ninth session), it needs about "
           f"{loop[8]['behind']['ms_per_engine_step'] * (1 - max(served[8]) / 150):.2f} ms less.",
           f"- **64 clients.** The VAE is busy alone {split[64]['second_only']:.2f} ms a step: "
           f"{100 * split[64]['second_only'] / (split[64]['second_only'] + split[64]['both']):.0f}% of its time runs while "
           "the engine's stream has nothing running.",
           f"  - The engine's stream has {eng[64]['long_gaps_ms'] / steps[64]:.2f} ms of long gaps a step "
           f"({eng[64]['long_gaps'] / steps[64]:.0f}); whether it waits for the GPU (the VAE's kernels holding the SMs) "
           "or for its host thread (the audio thread's eager decodes run Python beside it) the trace cannot tell.",
           f"  - Neither stream is busy {split[64]['neither']:.2f} ms a step.",
           f"  - 500x needs {goal[64]:.2f} ms a step in process, {gap[64]:.2f} ms less than now (served, "
           f"{min(served[64]):.1f}-{max(served[64]):.1f}x, about as much). The VAE's {split[64]['second_only']:.2f} ms alone "
           f"is {split[64]['second_only'] / gap[64]:.1f} times that gap; whether a cheaper VAE shortens the step by as "
           "much is not measured.", "",
           "**Without the VAE's work** (call 6: `closed_loop.py --clients 64,8 --requests 3 --rounds 2 --settings "
           "behind,vae_off`, `raw/closed_loop_vae_off_thirtieth.{json,log}`). `vae_off` hands back silence for every "
           "decode at once: no VAE kernels, no copies, no launches or waits on the audio thread; the engine, its "
           "fence (which then waits on no decode) and the audio thread's bookkeeping as served. Medians of 2 rounds:", "",
           "| clients | setting | x real time | ms per step | first audio p50 / p95 ms |", "|---|---|---|---|---|"]
    for n in (8, 64):
        for k in ("behind", "vae_off"):
            x = off[n][k]
            md.append(f"| {n} | {'served default' if k == 'behind' else 'no VAE work'} | {x['x_real_time']:.1f} | "
                      f"{x['ms_per_engine_step']:.2f} | {x['first_audio_ms_p50']:.1f} / {x['first_audio_ms_p95']:.1f} |")
    md += ["",
           f"- Without the VAE's work the closed loop makes {off[8]['vae_off']['x_real_time']:.1f}x at 8 clients and "
           f"{off[64]['vae_off']['x_real_time']:.1f}x at 64: past both targets. The VAE's work takes "
           f"{100 * vae_share[8]:.1f}% and {100 * vae_share[64]:.1f}% of the round's time (the rounds without it also "
           "ran a few engine steps fewer).",
           "- Either part can close the distance in process. With the round's time in proportion to each part: "
           f"150x needs {100 * vae_cut(8, off[8]['behind']['x_real_time']):.0f}% of the VAE's work gone at 8 clients, "
           f"or {100 * rest_cut(8):.0f}% of the rest; 500x needs {100 * vae_cut(64, off[64]['behind']['x_real_time']):.0f}% "
           f"of the VAE's work at 64, or {100 * rest_cut(64):.0f}% of the rest. Whether a cheaper VAE shortens the "
           "round in proportion is not measured.",
           f"- Served ({max(served[8]):.1f}x and {max(served[64]):.1f}x at best), if the VAE's work costs what it does "
           f"in process: about {100 * vae_cut(8, max(served[8])):.0f}% and {100 * vae_cut(64, max(served[64])):.0f}% of it.", "",
           "**Two settings, same call as the trace** (rounds rotate the order; medians of 2 rounds):", "",
           "| clients | setting | x real time | request p50 ms | first audio p50 / p95 ms | ms per step |",
           "|---|---|---|---|---|---|"]
    names = {"behind": "served default", "no_fence": "no first-audio fence",
             "audio_normal": "audio stream at normal priority"}
    for n in (8, 64):
        for k in run["settings"]:
            x = loop[n][k]
            md.append(f"| {n} | {names[k]} | {x['x_real_time']:.1f} | {x['request_ms_p50']:.1f} | "
                      f"{x['first_audio_ms_p50']:.1f} / {x['first_audio_ms_p95']:.1f} | {x['ms_per_engine_step']:.2f} |")
    md += ["",
           "- Without the fence: " + ", ".join(f"{loop[n]['ratio_x_real_time_no_fence_over_behind']:.4f}x at {n} clients"
                                               for n in (8, 64)) + ".",
           "- With the audio stream at normal priority: " + ", ".join(
               f"{loop[n]['ratio_x_real_time_audio_normal_over_behind']:.4f}x at {n}" for n in (8, 64))
           + f". At 8 clients both of its rounds ({', '.join(f'{x:.1f}' for x in prio8[0])}) came out above both "
           f"default rounds ({', '.join(f'{x:.1f}' for x in prio8[1])}).",
           "- Each difference is 0.4% or less, in 2 rounds each: too small to call. Only the default was traced. "
           "Nothing changed.", "",
           "**Long VAE decodes in graphs, measured and dropped** (call 2: `benchmarks/vae_pieces.py` (new), "
           "`raw/vae_pieces_thirtieth.{json,log}`).",
           "- Past 256 patches a decode runs eagerly: at 64 streams every 16-patch chunk is a 64 x 16 decode.",
           f"- In call 1's 64-client trace the VAE ran one full-fp32 cuDNN conv kernel (no TF32) {fp32_conv[0]:.0f} times, "
           f"{fp32_conv[1] / fp32_conv[0]:.1f} ms each ({fp32_conv[1] / steps[64]:.2f} ms a step).",
           "- Two alternatives, the same latents and state: \"pieces\", 4-patch graph replays one after another; "
           "\"groups\", 16-stream groups, each a 16-patch graph.",
           "- Call 2 ran this script's first version, which waited for each call's audio before the next: host round "
           "trips inside the timed span of pieces and groups. The kernel time of one profiled decode is in the last "
           "three columns. The committed script queues a way's calls before it waits, as the audio thread does.", "",
           "| streams x patches | eager ms | pieces ms | groups ms | kernel ms: eager / pieces / groups |",
           "|---|---|---|---|---|"]
    for shape, r in pieces.items():
        w = r["ways"]
        md.append(f"| {shape.replace('x', ' x ')} | {w['eager']['gpu_ms']:.2f} | {w['pieces']['gpu_ms']:.2f} | "
                  f"{w['groups']['gpu_ms']:.2f} | {w['eager']['profiled_gpu_ms']:.2f} / {w['pieces']['profiled_gpu_ms']:.2f} / "
                  f"{w['groups']['profiled_gpu_ms']:.2f} |")
    md += ["", "- GPU ms between CUDA events, median of 10; kernel ms from one profiled decode.",
           "- At 48 and 64 streams the eager decode is the fastest by both measures. At 32 streams groups win, and the "
           "eager decode there runs the full-fp32 conv (3.1 ms, below); at 24 they win between events and lose in "
           "kernel time.",
           f"- The ways' audio agrees to {max(v for r in pieces.values() for v in r['max_abs_vs_eager'].values()):.1e}. "
           "Nothing changed.", "",
           "**Which conv that is, and a layout that avoids it, measured and not kept** (call 5: `vae_pieces.py --shapes "
           "32x16,64x16,24x16,64x4,8x16,16x16 --channels-last-from 512,256,64`, `raw/vae_channels_last_thirtieth.{json,log}`; "
           "the script's first version too).",
           "- An upsampling conv's polyphase form runs channels-last from 512 input channels "
           "(`audio_vae.POLYPHASE_CHANNELS_LAST_FROM`, now a constant). From 256, the 32 x 16 decode no longer runs "
           "the full-fp32 kernel: it was the fourth block's conv (256 input channels, row-major).",
           "- The eager or replayed decode, GPU ms, one run per threshold (the first table's 512 column is another run "
           "of the same code):", "",
           "| streams x patches | from 512 (served) | from 256 | from 64 |", "|---|---|---|---|"]
    for shape in cl["512"]:
        md.append(f"| {shape.replace('x', ' x ')} | " + " | ".join(
            f"{cl[t][shape]['ways']['eager']['gpu_ms']:.2f}" for t in ("512", "256", "64")) + " |")
    md += ["",
           "- From 256: 32 x 16 -8%, 64 x 16 -3.5%, 16 x 16 -5.5%, but 24 x 16 +5.5%. From 64: 64 x 16 -5%, but "
           "32 x 16 +5%. The same code's runs differ by about 3% (24 x 16: 23.30 and 22.56 ms in calls 2 and 5).",
           "- cuDNN picks its kernel by shape either way, and no threshold wins at every shape. At 64 streams a "
           "2 ms gain per 64 x 16 decode would be about 0.6% of the throughput. Not changed.",
           f"- The audio moves by {max(w['max_abs_vs_first_threshold'] for t in cl.values() for r in t.values() for w in r['ways'].values()):.1e} "
           "at most. `gpu_check.py --only vae` with the threshold at 256 passes "
           f"({chkv['vae_graphs_vs_eager']['served_vs_exact_fp32_max_abs']:.2e} against exact fp32, "
           "`raw/gpu_check_vae_cl256_thirtieth.{json,log}`).", "",
           "**LocDiT's compiled layer with inductor's max-autotune, measured and dropped** (call 3: "
           "`kernel_fused_layer.py --no-sweep --tokens 176,88,352,1408 --variants compiled_torch_autotuned`, "
           "`raw/kernel_fused_layer_autotune_thirtieth.{json,log}`).",
           "- Inductor benchmarks its Triton GEMM templates against cuBLAS per GEMM and fuses pointwise epilogues into "
           f"a template it picks. It picked a template for {sum(p['best_triton_pos'] == 0 for p in picks)} of the "
           f"{len(picks)} GEMMs it tuned; for each GEMM one of its configs ran out of shared memory and was skipped.",
           "- 12 layers with their own weights, us per layer:", "",
           "| tokens (LocDiT at batch bucket) | compiled path | max-autotune | ratio |", "|---|---|---|---|"]
    for M in sorted(tuned):
        r = tuned[M]
        a, b = r["compiled_torch"]["us_per_layer"], r["compiled_torch_autotuned"]["us_per_layer"]
        md.append(f"| {M} ({M // 22}) | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    a11, a5 = att["s11"], att["s5"]

    def best(row):
        """The fastest launch of a sweep row -> (us, 'H heads, W warps')."""
        us, key = min((v, k) for k, v in row.items() if re.fullmatch(r"fused_h\d+_w\d+_us", k))
        h, w = re.fullmatch(r"fused_h(\d+)_w(\d+)_us", key).groups()
        return us, f"{h} heads, {w} warps"
    md += ["", "- Slower at every size: the templates that won inductor's benchmark GEMM by GEMM lose in the "
           "stacked layers.",
           f"- At 88 tokens the server runs the persistent layer kernel, not the compiled path: {persistent_us[88]:.1f} us "
           "a layer by its phase profile in the same run.", "",
           "**The local attention kernel's launch** (call 4: `kernel_local_attention.py --batches 8 64 128 --warps 1 2 4 8` "
           "and `--seq-len 5 --batches 32 64`, `raw/local_attention_warps_{s11,s5}_thirtieth.json`).",
           f"- At 64 clients the kernel takes about {attn[1] / attn[0] * 1000:.1f} us per call in the trace, "
           f"{attn[0] / steps[64]:.0f} calls a step.",
           "- A sweep of heads per program (1, 2, 4, 8) and warps (1, 2, 4, 8), us per call (CUDA graph); the default "
           "launch is 4 heads and 4 warps, timed once on its own and once in the sweep:", "",
           "| shape | default | fastest of the sweep |", "|---|---|---|"]
    others = []
    for label, row in (("LocDiT, batch 8", a11[8]), ("LocDiT, batch 64", a11[64]), ("LocDiT, batch 128", a11[128]),
                       ("LocEnc, batch 32", a5[32]), ("LocEnc, batch 64", a5[64])):
        us, at = best(row)
        md.append(f"| {label} | {row['fused_h4_us']:.2f} | {us:.2f} ({at}) |")
        if at != "4 heads, 4 warps":
            others.append(f"{at} at {label} by {row['fused_h4_w4_us'] - us:.2f} us")
    md += ["", f"- The sweep's fastest launch is the default's own at {5 - len(others)} of the 5 shapes"
           + (f"; elsewhere {', '.join(others)} (against the default timed in the same sweep)" if others else "")
           + ". Nothing changed.", "",
           "**Correctness on this code** (call 2): `gpu_check.py` passes every check "
           "(`raw/gpu_check_thirtieth.{json,log}`).",
           f"- bf16 against fp32, teacher-forced: cosine min {chk['teacher_forced']['cosine_min']:.5f}.",
           "- Graph against eager: max abs "
           f"{max(v['max_abs'] for v in chk['graph_vs_eager'].values()):.1f} at batches "
           + ", ".join(chk["graph_vs_eager"]) + ".",
           "- The VAE as served against exact fp32: "
           f"{chk['vae_graphs_vs_eager']['served_vs_exact_fp32_max_abs']:.2e} "
           f"(bound {chk['vae_graphs_vs_eager']['served_bound']:.0e}).",
           "- The twenty-ninth session's prefill order had not been through `gpu_check.py` before this call.", "",
           "**Targets** (issue 17), unchanged: one stream RTF 0.043 (target 0.025) and TTFA p50 22.4 ms (target 25, "
           f"met); 8 streams {min(served[8]):.1f}-{max(served[8]):.1f}x served (target 150); 64 streams "
           f"{min(served[64]):.1f}-{max(served[64]):.1f}x served (target 500), 100% smooth, TTFA p95 under 300 ms (met); "
           "capacity 64 all at once and 128 with Poisson arrivals (target 128).",
           "- Where the distance is: without the VAE's work the closed loop passes both throughput targets "
           f"({off[8]['vae_off']['x_real_time']:.0f}x and {off[64]['vae_off']['x_real_time']:.0f}x, call 6). By proportion "
           f"the VAE's work needs to shrink by about {100 * vae_cut(8, off[8]['behind']['x_real_time']):.0f}% at 8 clients "
           f"and {100 * vae_cut(64, off[64]['behind']['x_real_time']):.0f}% at 64 in process, or the rest of the round by "
           f"{100 * rest_cut(8):.0f}% and {100 * rest_cut(64):.0f}%.",
           "- The VAE levers that kept its audio gave 1.04-1.15x each (fused kernels, fewer passes, channels-last "
           "writes: the twenty-first, twenty-third and twenty-fourth sessions); this session's graph pieces and "
           "channels-last threshold gained nothing consistent. The twenty-first session's bf16 decode was 1.42x "
           "faster at 64 x 16 (enough, by proportion, for 64 clients in process) and 1.16x at 8 x 4, but 25 dB "
           "noisier; fp16 1.24x and 7 dB noisier. Neither is offered.", "",
           "![thirtieth session: where a step's time goes](results_thirtieth.png)", ""]
    _plot_thirtieth(split, goal, loop, off)
    return md


def _plot_thirtieth(split, goal, loop, off):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), gridspec_kw={"width_ratios": [1, 1, 1.2]})
    parts = (("first_only", "engine alone", "#286"), ("both", "both", "#8b6"),
             ("second_only", "VAE alone", "#c84"), ("neither", "neither (GPU idle)", "#bbb"))
    for ax, n in zip(axes, (8, 64)):
        bottom = 0.0
        for key, label, color in parts:
            v = split[n][key]
            ax.bar([0], [v], 0.6, bottom=bottom, color=color, label=f"{label}: {v:.2f}")
            bottom += v
        ax.axhline(goal[n], color="k", ls="--", lw=1, label=f"needed for {150 if n == 8 else 500}x: {goal[n]:.2f}")
        ax.axhline(loop[n]["behind"]["ms_per_engine_step"], color="#286", ls=":", lw=1.5,
                   label=f"unprofiled round: {loop[n]['behind']['ms_per_engine_step']:.2f}")
        ax.set_xlim(-0.6, 1.8)
        ax.set_xticks([])
        ax.set_ylabel("ms per engine step")
        ax.set_title(f"call 1: {n} clients, where a step goes", fontsize=9)
        ax.legend(fontsize=7, loc="center right")
    c = axes[2]
    paired_bars(c, ["8 clients", "64 clients"], [
        ("served default", "#999", [off[n]["behind"]["x_real_time"] for n in (8, 64)]),
        ("no VAE work", "#286", [off[n]["vae_off"]["x_real_time"] for n in (8, 64)])], lambda v: f"{v:.0f}x")
    for i, t in enumerate((150, 500)):
        c.plot([i - 0.45, i + 0.45], [t, t], "k--", lw=1)
        c.text(i + 0.47, t, f"{t}x", va="center", fontsize=7)
    c.set_ylabel("x real time, in process")
    c.set_title("call 6: the closed loop without the VAE's work", fontsize=9)
    c.legend(fontsize=7, loc="upper left")
    save_panels(fig, axes, "Thirtieth session, NVIDIA H200, 2026-11-29: where a step's time goes", "results_thirtieth.png")
