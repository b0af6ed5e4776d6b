"""results.md: the eleventh session's section, and results_eleventh.png."""

import os
import re

from summary.plots import figure_path, pyplot
from summary.raw import HERE, engine_runs, load, served_cell, served_levels


def _gemm_sweep_rows() -> list[dict]:
    """The experimental few-token GEMM against cuBLAS: the LM shapes from the printed rows of a run cut
    short (`raw/kernel_skinny_gemm_lm.log`), LocEnc/LocDiT's from its re-run."""
    rows = []
    pat = re.compile(r"^(\w+)\s+M=\s*(\d+) cublas\s+([\d.]+) us \(([\d.]+) TB/s\)\s+best\s+([\d.]+) us")
    with open(os.path.join(HERE, "raw", "kernel_skinny_gemm_lm.log")) as f:
        for line in f:
            m = pat.match(line)
            if m and m.group(1).startswith("lm_"):
                n, k = {"lm_qkv": (2560, 2048), "lm_o": (2048, 2048), "lm_gate_up": (12288, 2048),
                        "lm_down": (2048, 6144)}[m.group(1)]
                rows.append({"shape": m.group(1), "M": int(m.group(2)), "N": n, "K": k, "cublas_us": float(m.group(3)),
                             "cublas_tb_s": float(m.group(4)), "best_us": float(m.group(5))})
    for r in load("kernel_skinny_gemm_loc.json")["rows"]:
        rows.append({"shape": r["shape"], "M": r["M"], "N": r["N"], "K": r["K"], "cublas_us": r["cublas_us"],
                     "cublas_tb_s": r["cublas_tb_s"],
                     "best_us": r["best"]["us"]})
    return rows


def eleventh_session(res) -> list[str]:
    """2026-11-25, third session of the day: three levers for issues 17 and 18, measured and dropped, and
    the served path re-run on the head. Reads and sets nothing in `res`."""
    gemm = _gemm_sweep_rows()
    lora_sites = load("kernel_skinny_gemm_lora.json")["rows"]
    fused = load("lora_fused.json")
    plain = [engine_runs(f"offline_eleventh_{n}.json", "steps_per_s") for n in ("plain", "plain2")]
    pdl = engine_runs("offline_eleventh_inductor_pdl.json", "steps_per_s")
    cublas1 = engine_runs("offline_eleventh_cublas_call1.json", "steps_per_s")
    untuned = engine_runs("offline_eleventh_skinny_untuned.json", "steps_per_s")
    tuned = engine_runs("offline_eleventh_skinny_tuned.json", "steps_per_s")
    ratios = [r["cublas_us"] / r["best_us"] for r in gemm]
    tbs = [r["cublas_tb_s"] for r in gemm]
    mb = [r["N"] * r["K"] * 2 / 1e6 for r in gemm]
    tried = [r["tried"] for r in load("kernel_skinny_gemm_loc.json")["rows"]]
    md = ["", "## Eleventh session (2026-11-25, H100): a few-token Triton GEMM, LoRA inside it, PDL: measured, "
          "dropped", "",
          "Three levers; none is worth its code, and the product code is unchanged. The kernel is kept as an "
          "experiment with its sweep and tests (`benchmarks/experiments/skinny_gemm.py`, "
          "`benchmarks/kernel_skinny_gemm.py`, `tests/test_skinny_gemm.py`) so the results can be re-measured; "
          "the engine-level wiring used for items 1 and 3 was not kept.", "",
          "1. A few-token GEMM (split-K with a last-arriving-program reduction, one kernel per call) against cuBLAS, "
          "each call reading a different copy of the weight (copies past 128 MB, so nothing is served from L2, "
          f"as in a step that reads 7.5 GB), best of {min(tried)}-{max(tried)} launch configs per pair (the "
          "LocDiT/LocEnc rows; the LM rows' run swept the same candidates). Both sweep runs stopped at their time limit: measured are the four LM "
          "shapes at 1-64 tokens (`raw/kernel_skinny_gemm_lm.log`, printed rows) and LocDiT/LocEnc's q/k/v at "
          "10/22/44 tokens and o at 10 (`raw/kernel_skinny_gemm_loc.json`); their o at 22/44, gate/up and down "
          "were not.", "",
          "| weight | tokens | cuBLAS us | cuBLAS TB/s | best Triton us | ratio |", "|---|---|---|---|---|---|"]
    for r in gemm:
        if r["M"] in (2, 44) or (r["shape"].startswith("loc") and r["M"] == 10):
            md.append(f"| {r['shape']} | {r['M']} | {r['cublas_us']:.2f} | {r['cublas_tb_s']:.2f} | "
                      f"{r['best_us']:.2f} | {r['cublas_us'] / r['best_us']:.2f}x |")
    md += ["", f"Across the {len(gemm)} measured pairs the best config runs at {min(ratios):.2f}x to "
           f"{max(ratios):.2f}x cuBLAS's speed, and cuBLAS moves {min(tbs):.1f}-{max(tbs):.1f} TB/s on "
           f"{min(mb):.0f}-{max(mb):.0f} MB weights: a call of this size is bound by the kernel's ramp and tail, "
           "not by bandwidth, so no GEMM kernel alone gets the batch-1 step to 4 ms; that takes fewer, larger "
           "kernels (a fused layer, a megakernel) or overlapped ones. In the engine (`bench.py --graphs-only`, "
           "steps/s, with a dispatch in `kernels.fp8.linear` and a `bench.py --gemm cublas|auto` option, neither "
           f"kept): a first untuned launch heuristic gave {untuned[1]:.1f} at batch 1 against cuBLAS's "
           f"{cublas1[1]:.1f} in the same call; the tuned table {tuned[1]:.1f} at batch 1 and {tuned[64]:.1f} at "
           "batch 64, and with programmatic dependent launch wired into it (not kept) and inductor's kernels 120.3 "
           "and 50.6, in later calls (`raw/offline_eleventh_skinny_tuned*`), against 116.3-116.8 and 50.3-51.5 "
           "for cuBLAS across this session's calls: +1-3% at batch 1, not A/B-confirmed in one call, and about "
           "-4% at batch 64.", "",
           "2. Programmatic dependent launch for inductor's kernels alone (`TORCHINDUCTOR_ENABLE_PDL=1`), cuBLAS "
           "GEMMs, one call, runs in the order plain, PDL, plain (`raw/offline_eleventh_plain.json`, "
           "`_inductor_pdl.json`, `_plain2.json`): batch 1 "
           f"{plain[0][1]:.1f} / {pdl[1]:.1f} / {plain[1][1]:.1f} steps/s, batch 64 {plain[0][64]:.1f} / "
           f"{pdl[64]:.1f} / {plain[1][64]:.1f}: no difference beyond run-to-run spread. Most kernels of a step "
           "follow a cuBLAS GEMM, which does not take part in PDL.", "",
           "3. Issue 18: the LoRA delta inside the GEMM (the same kernel: the shrink x A^T in its K loop, "
           "the expand as its epilogue) for calls of at most 2 batch rows, to save the separate `kernels.lora` "
           "launch per adapted projection. Per site, rank 32, batch 1 in its bucket of 2 rows "
           "(`kernel_skinny_gemm.py --lora`, `raw/kernel_skinny_gemm_lora.json`):", "",
           "| site | tokens | cuBLAS alone us | cuBLAS + kernels.lora us | fused, best config us |", "|---|---|---|---|---|"]
    tiles = [r["N"] // r["best"]["cfg"][1] for r in lora_sites]
    for r in lora_sites:
        md.append(f"| {r['site']} | {r['M']} | {r['cublas_us']:.2f} | {r['unfused_us']:.2f} | {r['best']['us']:.2f} |")
    steps = [fused[f"kernel:unfused_over_base_step_b{b}"] for b in (1, 8, 64)]
    md += ["", f"Every program re-reads its target's A rows (the best configs run {min(tiles)}-{max(tiles)} "
           "column tiles, each with its own pass over A), where `kernels.lora` reads them once per chunk of "
           "128-512 columns: that costs what the saved launch saves. In the engine (`raw/lora_fused.json`, from "
           "`bench_lora.py` with the kernel wired into `model.lora` for the layers' projections, not kept: its "
           "variant `kernel` there is that wiring, with an untuned launch for LocDiT's o, and `kernel:unfused` "
           "is what `--variants kernel` runs today), LoRA over plain step time:", "",
           "| batch | fused where it applies | what runs |", "|---|---|---|"]
    for b in (1, 8, 64):
        md.append(f"| {b} | {fused[f'kernel_over_base_step_b{b}']:.2f}x | "
                  f"{fused[f'kernel:unfused_over_base_step_b{b}']:.2f}x |")
    md += ["", "(At batches 8 and 64 the fused kernel does not apply: both columns run the same kernels.) The "
           "graph-vs-eager and solo-vs-batched checks passed for both. Issue 18's 1.10x stays missed: "
           f"{min(steps):.2f}-{max(steps):.2f}x.", ""]
    head, tenth = served_levels("served_eleventh_head.json"), served_levels("served_tenth_final.json")
    md += ["4. The served path on this session's head (the product code of the tenth session's last commit: "
           "its served runs predate one rule added after review, that a client already run dry gets every "
           "pending patch). Fresh machine, `ARRIVALS=burst LEVELS=8,64,128 bash benchmarks/run_served_gpu.sh` "
           "(`raw/served_eleventh_head.json`; no error lines in the tritonserver log); smooth / x real time / "
           "TTFA p95 ms:", "", "| streams | tenth session's final run | now |", "|---|---|---|"]
    for c in (8, 64, 128):
        md.append(f"| {c} | {served_cell(tenth[c])} | {served_cell(head[c])} |")
    md += ["", "One call each; earlier calls of one policy varied by tens of points at 64 and 128 streams, so "
           "this shows the rule costs nothing measurable, not that it gains. (This run's capacity figure covers "
           "only the levels it ran: the recorded capacity stays the tenth session's.)", "",
           "![eleventh session: GEMM and LoRA per call](results_eleventh.png)", ""]
    _plot_eleventh(gemm, lora_sites)
    return md


def _plot_eleventh(gemm, lora_sites):
    plt = pyplot()

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    for shape in dict.fromkeys(r["shape"] for r in gemm):
        rs = [r for r in gemm if r["shape"] == shape]
        line, = a.plot([r["M"] for r in rs], [r["cublas_us"] for r in rs], "o-", label=f"{shape} cuBLAS")
        a.plot([r["M"] for r in rs], [r["best_us"] for r in rs], "x--", color=line.get_color(),
               label=f"{shape} Triton (best)")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("tokens in the call")
    a.set_ylabel("us per call (weights from HBM)")
    a.set_title("Few-token GEMM: cuBLAS vs the best Triton config")
    a.legend(fontsize=6, ncol=2)
    a.grid(alpha=0.3)
    xs = range(len(lora_sites))
    w = 0.27
    for i, (key, label) in enumerate((("cublas_us", "cuBLAS alone"), ("unfused_us", "cuBLAS + kernels.lora"),
                                      ("best", "LoRA inside the GEMM"))):
        vals = [r[key]["us"] if key == "best" else r[key] for r in lora_sites]
        b.bar([x + (i - 1) * w for x in xs], vals, w, label=label)
    b.set_xticks(list(xs), [f"{r['site']} ({r['M']} tok)" for r in lora_sites])
    b.set_ylabel("us per call")
    b.set_title("LoRA sites at batch 1, rank 32")
    b.legend(fontsize=8)
    fig.suptitle("Eleventh session, H100, 2026-11-25: levers measured and dropped")
    fig.tight_layout()
    fig.savefig(figure_path("results_eleventh.png"), dpi=110)
