"""results.md: the thirty-seventh session's section, and results_thirty_seventh.png."""

import os
import re
import statistics

from summary.plots import pyplot, save_panels
from summary.raw import HERE, load, served_ms_per_step, served_row


_CLOSED_LOOP_37 = re.compile(r"\[closed-loop\] (\d+) clients, (\w+), round (\d+): ([\d.]+)x, request p50 [\d.]+ ms, "
                             r"first audio p50 ([\d.]+) / p95 ([\d.]+) ms, (\d+) engine steps, ([\d.]+) ms each, .*?"
                             r"(\d+) launched late")


# (call, process, raw log): the closed-loop engines of the session, each a process of its own
LOOPS_37 = ((1, "HEAD, after the served run", "closed_loop_thirtyseventh.log"),
            (2, "HEAD (VOXCPM_GATED_MLP=0)", "closed_loop_gated0_thirtyseventh.log"),
            (2, "fused gate/up + SiLU", "closed_loop_gated1_thirtyseventh.log"),
            (3, "HEAD, cuBLAS named", "closed_loop_blas_cublas_thirtyseventh.log"),
            (3, "cuBLASLt preferred", "closed_loop_blas_cublaslt_thirtyseventh.log"))


def thirty_seventh_session(res) -> list[str]:
    """2026-11-30 (issue 17): the late-launch counter's first served run; a gate/up GEMM with the SiLU product
    fused (raw/gated_mlp_thirtyseventh.patch) and cuBLASLt for the step's GEMMs, both measured and dropped.
    Sets res["thirty_seventh"], returns the markdown, draws results_thirty_seventh.png."""
    loops = []
    for call, label, name in LOOPS_37:
        with open(os.path.join(HERE, "raw", name)) as f:
            loops += [{"call": call, "process": label, "clients": int(m[1]), "round": int(m[3]),
                       "x_real_time": float(m[4]), "first_audio_p50": float(m[5]), "steps": int(m[7]),
                       "ms_per_step": float(m[8]), "late": int(m[9])} for m in _CLOSED_LOOP_37.finditer(f.read())]
    served = []
    for lv in load("served_thirtyseventh.json")["levels"]:
        served.append({"streams": lv["concurrency"], **served_row(lv),
                       "late_launches": lv["decoder_steps"]["late_launches"],
                       "ms_per_step": served_ms_per_step(lv)})
    gated = load("kernel_gated_mlp_thirtyseventh.json")["shapes"]
    blas = load("kernel_blas_library_thirtyseventh.json")["us"]
    split_k = load("kernel_split_k_thirtyseventh.json")["us"]
    res["thirty_seventh"] = {"device": "NVIDIA H200", "served": served, "closed_loop_rounds": loops,
                             "gated_mlp": {shape: {M: {k: v for k, v in row.items() if k != "launches"}
                                                   for M, row in rows.items()} for shape, rows in gated.items()},
                             "blas_us": {k: {lib: v[lib]["us"] for lib in v} for k, v in blas.items()}}
    lp = lambda process, n, key: [r[key] for r in loops if r["process"] == process and r["clients"] == n]  # noqa: E731
    sv = {x["streams"]: x for x in served}
    md = ["", "## Thirty-seventh session (2026-11-30, H200): launches are almost never late served; a gate/up GEMM with the "
          "SiLU product fused, and cuBLASLt: measured, neither kept; the output projections split along K, opt-in until "
          "measured in the engine", "",
          "Five device calls (about 29 of 30 min). No change to how the server runs by default. The thirty-sixth "
          "session's late-launch counter ran served for the first time, and the levers of this session went after "
          "the step's GPU time, where the counter points.", "",
          "**Served, the start's code** (call 1: `SET=\"decoder.timestep_buckets=10,100\" LEVELS=8,64 REQUESTS=5 bash "
          "benchmarks/run_served_gpu.sh` on 9b05536, `raw/served_thirtyseventh.{json.gz,log}`), then the closed loop "
          "in process on the same machine (`closed_loop.py --checkpoint /tmp/full --clients 64,8 --requests 4 --rounds 3 "
          "--settings behind`, `raw/closed_loop_thirtyseventh.{json,log}`):", "",
          "| streams | x real time | decode steps | wall ms per step | launched late | TTFA p50 / p95 ms | smooth | "
          "in process: x real time (rounds) | in process: ms per step | in process: launched late |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for n in (8, 64):
        x = sv[n]
        md.append(f"| {n} | {x['x_real_time']:.2f} | {x['steps']:.0f} | {x['ms_per_step']:.2f} | "
                  f"{x['late_launches']:.0f} | {x['ttfa_p50']:.1f} / {x['ttfa_p95']:.1f} | {100 * x['smooth']:.1f}% | "
                  f"{', '.join(f'{v:.1f}' for v in lp(LOOPS_37[0][1], n, 'x_real_time'))} | "
                  f"{', '.join(f'{v:.2f}' for v in lp(LOOPS_37[0][1], n, 'ms_per_step'))} | "
                  f"{', '.join(str(v) for v in lp(LOOPS_37[0][1], n, 'late'))} |")
    ratio_ms = lambda n: sv[n]["ms_per_step"] / statistics.median(lp(LOOPS_37[0][1], n, "ms_per_step"))  # noqa: E731
    md += ["",
           f"- **Late launches: {sv[8]['late_launches']:.0f} of {sv[8]['steps']:.0f} steps at 8 streams, "
           f"{sv[64]['late_launches']:.0f} of {sv[64]['steps']:.0f} at 64**, and none in process on the same machine. A step "
           "launched while another is in flight practically always finds the engine's stream still busy: between "
           "pipelined steps the engine's thread keeps the GPU fed, served as in process, and the GIL's switch interval "
           "does not hold it back there (steps launched with none in flight, after a first-chunk fence or an eager "
           "prefill, are not counted). The "
           f"served step's wall share, {ratio_ms(8):.3f}x and {ratio_ms(64):.3f}x the in-process one (8 and 64), is "
           "therefore not the engine's thread falling behind: GPU time, or the waits the counter does not see.",
           f"- 64 streams made {sv[64]['x_real_time']:.2f}x, the highest served figure so far (the same code made "
           "475.72-484.94x in the thirty-sixth session's three runs), 100% smooth; 8 streams "
           f"{sv[8]['x_real_time']:.2f}x (147.94-149.66x there). Both targets stay missed (150x, 500x).", "",
           "**A gate/up GEMM with the SiLU product fused** (`raw/gated_mlp_thirtyseventh.patch`, against 9b05536: "
           "`kernels/gated_mlp.py`, its test under the CPU interpreter, `benchmarks/kernel_gated_mlp.py`, and "
           "`LayerMath.attention_output_mlp` calling it wherever no adapter's delta is added; `VOXCPM_GATED_MLP=0` "
           "turns it off). Each program holds a gate tile and the up tile of the same features (two accumulators "
           "over one read of the activations), rounds both to bf16 as the GEMM's output would be, and writes "
           "silu(g) * u: the [tokens, 8192] projection is neither written nor read back, and the pointwise kernel "
           "goes. At LocDiT's batch-64 shape (1408 tokens) that is 23 MB a layer, 108 layers a step.", "",
           "The kernel alone (call 2: `kernel_gated_mlp.py`, `raw/kernel_gated_mlp_thirtyseventh.{json.gz,log}`; "
           "us per call, a CUDA graph of 12 calls with their own weights; the fastest of a sweep of 8-14 launches "
           "per count, each checked against the fp32 product first; \"MLP\" is the whole MLP with its residual, "
           "torch.compile'd both ways):", "",
           "| weights | tokens | cuBLAS + inductor's product | fused, fastest launch | ratio | MLP unfused | "
           "MLP fused | ratio |", "|---|---|---|---|---|---|---|---|"]
    for shape, label in (("loc", "LocDiT 1024 x 4096"), ("lm", "LM 2048 x 6144")):
        for M, row in gated[shape].items():
            md.append(f"| {label} | {M} | {row['unfused_us']:.2f} | {row['best']['us']:.2f} | "
                      f"{row['unfused_us'] / row['best']['us']:.3f}x | {row['mlp_unfused_us']:.2f} | "
                      f"{row['mlp_fused_us']:.2f} | {row['mlp_unfused_us'] / row['mlp_fused_us']:.3f}x |")
    g0, g1 = LOOPS_37[1][1], LOOPS_37[2][1]
    gm = lambda proc, n: statistics.median(lp(proc, n, "x_real_time"))  # noqa: E731
    loc = gated["loc"]
    md += ["",
           f"- Slower wherever the server would run it: {loc['1408']['unfused_us'] / loc['1408']['best']['us']:.2f}x "
           f"at LocDiT's 1408 tokens, {loc['176']['unfused_us'] / loc['176']['best']['us']:.2f}x at 176 (batch 8). "
           "cuBLAS runs the [1408, 8192] GEMM at about 670 TFLOP/s (call 3, below); the kernel's two dots over a "
           "1024-long K, fed by pointer loads (no TMA, no warp specialization), reach about 450. The product's "
           "pass it saves is small beside that: cuBLAS and inductor's product take 43.5 us, cuBLAS alone 35.1. Only "
           "the LM's [32, 2048] rows (batch 32, past the persistent layer's 16) gain, "
           f"{gated['lm']['32']['mlp_unfused_us'] / gated['lm']['32']['mlp_fused_us']:.2f}x on the MLP: about "
           "0.08 ms a step there (36 LM layers).",
           f"- **The engine** (same call, `VOXCPM_GATED_MLP=0` then `1`, a process each, `closed_loop.py --clients "
           f"64,8 --requests 3 --rounds 2 --settings behind`, `raw/closed_loop_gated{{0,1}}_thirtyseventh.*`; the "
           "launches were first guesses, the 1408-token one the sweep's fastest tile with 4 stages, not 3): "
           f"{gm(g1, 64) / gm(g0, 64):.3f}x at 64 clients ({gm(g0, 64):.1f} -> {gm(g1, 64):.1f}x) and "
           f"{gm(g1, 8) / gm(g0, 8):.3f}x at 8 ({gm(g0, 8):.1f} -> {gm(g1, 8):.1f}x). At 64 clients the loss is what the "
           "kernel's times predict (9 us more in each of 108 layers: about 1 ms a step); at 8 it is three times that "
           "(0.58 against 0.19 ms a step), so part of it is the spread between processes that call 3 shows. The "
           "kernel's own times decide: dropped.", "",
           "**cuBLASLt for the step's GEMMs** (call 3: `benchmarks/kernel_blas_library.py` (new), "
           "`raw/kernel_blas_library_thirtyseventh.{json,log}`). torch sends a plain bf16 mm to `cublasGemmEx`; "
           "`torch.backends.cuda.preferred_blas_library(\"cublaslt\")` sends it to cuBLASLt, whose heuristics pick "
           "among other kernels. At 1408 tokens LocDiT's output and down projections make 88 output tiles of "
           "128 x 128 for 132 SMs, and run at 455-490 TFLOP/s against 575-675 for the other two. us per call, "
           "medians of 3 alternations, 12 weights each (the rows that differ by more than 2%, of 32):", "",
           "| GEMM | tokens | N x K | cublasGemmEx | cuBLASLt | ratio |", "|---|---|---|---|---|---|"]
    for key, v in blas.items():
        r = v["cublas"]["us"] / v["cublaslt"]["us"]
        if abs(r - 1) > 0.02:
            model, name, M = key.split(".")
            n_k = {"loc": {"qkv": "2560 x 1024", "o": "1024 x 2048", "gate_up": "8192 x 1024", "down": "1024 x 4096"},
                   "lm": {"qkv": "2560 x 2048", "o": "2048 x 2048", "gate_up": "12288 x 2048",
                          "down": "2048 x 6144"}}[model][name]
            md.append(f"| {'LocDiT' if model == 'loc' else 'LM'} {name} | {M} | {n_k} | {v['cublas']['us']:.2f} | "
                      f"{v['cublaslt']['us']:.2f} | {r:.3f}x |")
    cb, lt = LOOPS_37[3][1], LOOPS_37[4][1]
    md += ["",
           "- cuBLASLt gains on LocDiT's down projection at 704 and 1408 tokens (and the LM's at 128 rows) and "
           "loses on LocDiT's gate/up projection at 2816 (batch 128); the rest is within 2%. By proportion about 0.14 ms a step at batch 64 (0.7%).",
           "- **The engine** (same call, a process each, `torch.backends.cuda.preferred_blas_library(...)` set before "
           "`closed_loop.py` ran with the arguments above): the run naming cuBLAS (torch's default) finished one round "
           f"in its time limit (a cold compile cache: engine ready in 166 s): {lp(cb, 64, 'x_real_time')[0]:.1f}x at 64 "
           f"clients, {lp(cb, 64, 'ms_per_step')[0]:.2f} ms a step; cuBLASLt "
           f"{', '.join(f'{v:.1f}' for v in lp(lt, 64, 'x_real_time'))}x "
           f"({', '.join(f'{v:.2f}' for v in lp(lt, 64, 'ms_per_step'))} ms) and "
           f"{', '.join(f'{v:.1f}' for v in lp(lt, 8, 'x_real_time'))}x at 8 clients. Both engines of this call "
           f"ran 4-6% longer a step at 64 clients (the cuBLASLt one 6.5-7.5% at 8) than call 1's and call 2's first ({lp(LOOPS_37[0][1], 64, 'ms_per_step')[0]:.2f}"
           f" and {lp(g0, 64, 'ms_per_step')[0]:.2f} ms at 64): the spread between processes and machines is "
           "larger than what cuBLASLt could give, and one round of the baseline cannot pair it. Not changed.", "",
           "**The output and down projections split along K** (call 4: `benchmarks/kernel_split_k.py` (new), "
           "`raw/kernel_split_k_thirtyseventh.{json,log}`). cuBLAS runs y = x W^T as S batched GEMMs over K/S "
           "slices (`torch.bmm` on strided views of x and W, no copies), S times the output tiles, and the partial "
           "products are summed after. us per call as above; \"GEMM\" is the batched GEMM alone, with bf16 partials "
           "(fp32 partials, `bmm(out_dtype=float32)`, ran within 1.3 us of them either way at S = 2); \"+ sum\" adds a separate sum kernel, "
           "which in the model would be the residual add's kernel reading S partials instead of one:", "",
           "| weight | tokens | one GEMM | S = 2: GEMM | S = 2: + sum | S = 4: GEMM | fastest GEMM over one |",
           "|---|---|---|---|---|---|---|"]
    for key, row in split_k.items():
        model, name, M = key.split(".")
        if name not in ("o", "down"):
            continue
        best = min((v["gemm"] for k, v in row.items() if isinstance(v, dict) and "gemm" in v))
        md.append(f"| {'LocDiT' if model == 'loc' else 'LM'} {name} | {M} | {row['linear']:.2f} | "
                  f"{row['S2_bf16']['gemm']:.2f} | {row['S2_bf16']['+sum']:.2f} | {row['S4_bf16']['gemm']:.2f} | "
                  f"{row['linear'] / best:.2f}x |")
    eng = {(r["batch"], i): r["aggregate_xrt"] for i, r in enumerate(load("offline_splitk0_thirtyseventh.json")
                                                                   ["engine"]["graphs"]["runs"])}
    e8 = [v for (b, _), v in eng.items() if b == 8]
    e64 = [v for (b, _), v in eng.items() if b == 64]
    res["thirty_seventh"].update(split_k_us=split_k, engine_alone_xrt={"8": e8, "64": e64},
                                 served_over_engine_c64=sv[64]["x_real_time"] / statistics.median(e64))
    md += ["",
           "- The GEMM alone runs 1.1-1.6x faster split (1.12-1.45x at S = 2, the split the code makes), for both "
           "projections at every count measured. LocDiT's QKV "
           "and gate/up projections (many tiles already) gain nothing (0.83-0.99x, not shown); the LMs' QKV at 32 "
           "and 64 rows would gain 1.15-1.18x (not split). With a separate sum the down projection is 0.88-1.08x: the "
           "gain needs the sum inside the residual add's kernel.",
           "- Kept, opt-in (`model/split_k.py`, `VOXCPM_SPLIT_K=1`; off by default): `LayerMath.attention_output_mlp` "
           "splits the output and down projections in two where the call is on CUDA in bf16/fp16 with a plain weight, "
           "no adapter op on the projection "
           "and at most 1536 rows. torch.compile should fuse the partials' sum into the residual add: its CPU code "
           "does, with the device check stubbed (the review's); its GPU code is not looked at yet. CPU tests: the "
           "partial products summed equal one GEMM and stay within a rounding of it in bf16, the slices are views, "
           "the conditions, the flag's default, the two call sites and none with an adapter op. A GPU test (the "
           "compiled half traced with the split for those two projections only, within two roundings of the "
           "unsplit one, the same from a CUDA graph) has not run yet.",
           "- By proportion (the two GEMMs alone at S = 2, less one more partial read for each sum): about 3.5 us a "
           "LocDiT layer at 176 tokens (1.30 + 2.45 - 0.2) and 8 at 1408 (1.61 + 8.10 - 1.7): 0.38 ms of a 7.97 ms "
           "batch-8 step and 0.86 ms of a 16.9 ms batch-64 step, 4.8% and 5.1%. Not "
           "measured in the engine: call 5 (`VOXCPM_SPLIT_K=0` then `1`, `bench.py --batches 8,64,8,64,32 --reference "
           "none --no-vae --graphs-only --no-profile`, `raw/offline_splitk{0,1}_thirtyseventh.*`) captured every loop "
           "length (72 graphs in 131-145 s), and the split engine ran out of its time limit right after its decode "
           "graphs' capture, which completed (its log stops there): torch.compile and CUDA graph capture accepted "
           "the split; whether its graphs split, and how fast, is not shown. `bench.py` now takes "
           "`--timestep-buckets 10,100` (as served) for a shorter capture. No GPU check of its numerics yet.",
           f"- The engine alone, default (call 5): {', '.join(f'{v:.1f}' for v in e8)}x at batch 8 and "
           f"{', '.join(f'{v:.1f}' for v in e64)}x at batch 64 (no VAE, no request turns). Served over engine at 64: "
           f"{sv[64]['x_real_time'] / statistics.median(e64):.3f} (calls 1 and 5).", "",
           "**What this says about the targets** (issue 17): the served levels now trail the engine in process by "
           f"{100 * (ratio_ms(8) - 1):.1f}% ({100 * (ratio_ms(64) - 1):.1f}%) a step at 8 (64) streams and by the "
           "steps of their requests' turns (516 and 519 for 500 full, against 509 and 515 by the closed loop's "
           "proportion). The counter finds neither in the engine's thread. Unchanged: one stream RTF 0.043 (target 0.025) and TTFA p50 "
           f"22.4 ms (met); 8 streams {sv[8]['x_real_time']:.2f}x this session, 149.66x at best (150, missed); 64 "
           f"streams {sv[64]['x_real_time']:.2f}x (500, missed), 100% smooth, TTFA p95 {sv[64]['ttfa_p95']:.0f} ms "
           "(met); capacity 128 with Poisson arrivals (met); served over engine "
           f"{sv[64]['x_real_time'] / statistics.median(e64):.2f} at 64 streams (0.85, missed).", "",
           "**Next:** the split in the engine: `closed_loop.py --settings behind,split_k` (new: the split on an "
           "engine of its own in the same process, so that both see one machine and the rounds rotate; this session "
           "saw 4-6% between processes) and `bench.py --timestep-buckets 10,100` with `VOXCPM_SPLIT_K` 0 and 1; "
           "`gpu_check.py` with it on; then served. On by default if those agree.", "",
           "![thirty-seventh session: the fused gate/up kernel, cuBLASLt, split K, the engines](results_thirty_seventh.png)", ""]
    _plot_thirty_seventh(gated, blas, loops, split_k)
    return md


def _plot_thirty_seventh(gated, blas, loops, split_k):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.4))
    ax = axes[0]
    for shape, color, label in (("loc", "#a64", "fused gate/up, LocDiT"), ("lm", "#c93", "fused gate/up, LM")):
        Ms = sorted(gated[shape], key=int)
        ax.plot([int(M) for M in Ms], [gated[shape][M]["unfused_us"] / gated[shape][M]["best"]["us"] for M in Ms],
                "o-", color=color, label=label)
    for name, color in (("down", "#286"), ("o", "#6a4"), ("gate_up", "#48a")):
        keys = sorted((k for k in blas if k.startswith(f"loc.{name}.")), key=lambda k: int(k.split(".")[2]))
        ax.plot([int(k.split(".")[2]) for k in keys], [blas[k]["cublas"]["us"] / blas[k]["cublaslt"]["us"] for k in keys],
                "s--", color=color, label=f"cuBLASLt, LocDiT {name}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens")
    ax.set_ylabel("speed over the served path (per call)")
    ax.set_title("kernels (calls 2, 3)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    ax = axes[1]
    for (model, name), color in ((("loc", "down"), "#286"), (("loc", "o"), "#6a4"), (("lm", "down"), "#a64"),
                                 (("lm", "o"), "#c93")):
        keys = sorted((k for k in split_k if k.startswith(f"{model}.{name}.")), key=lambda k: int(k.split(".")[2]))
        for S, style in ((2, "o-"), (4, "s--")):
            ax.plot([int(k.split(".")[2]) for k in keys],
                    [split_k[k]["linear"] / split_k[k][f"S{S}_bf16"]["gemm"] for k in keys], style, color=color,
                    label=f"{'LocDiT' if model == 'loc' else 'LM'} {name}, S = {S}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens")
    ax.set_ylabel("one GEMM's time over the split GEMM's (no sum)")
    ax.set_title("split along K (call 4; opt-in, not yet in the engine)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax = axes[2]
    procs = [label for _, label, _ in LOOPS_37]
    for j, (n, color) in enumerate(((64, "#a64"), (8, "#286"))):
        base = statistics.median(r["ms_per_step"] for r in loops if r["process"] == procs[0] and r["clients"] == n)
        for i, proc in enumerate(procs):
            ys = [r["ms_per_step"] / base for r in loops if r["process"] == proc and r["clients"] == n]
            ax.plot([i + (j - 0.5) * 0.2] * len(ys), ys, "o", color=color,
                    label=f"{n} clients (call 1: {base:.2f} ms)" if i == 0 else None)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(procs)), [f"call {c}: {label}" for c, label, _ in LOOPS_37], fontsize=7, rotation=15)
    ax.set_ylabel("wall ms per engine step, each round, over call 1's")
    ax.set_title("the engine in process (closed loop), a process each", fontsize=9)
    ax.legend(fontsize=8)
    save_panels(fig, axes, "Thirty-seventh session, NVIDIA H200, 2026-11-30: fused gate/up, cuBLASLt, split K, the engines",
                 "results_thirty_seventh.png")
