"""results.md: the seventeenth session's section, and results_seventeenth.png."""

from summary.plots import save_panels, stream_panels
from summary.raw import load, served_levels


def seventeenth_session(res) -> list[str]:
    """2026-11-25, ninth session of the day (issue 17): three ways to hide the persistent layer's
    memory latency, measured and dropped; the served sweep on the current code. Sets the final served
    keys of `res`, returns the markdown, draws results_seventeenth.png."""
    def layers(name):  # kernel_fused_layer: {M: {variant: us per layer}}
        return {r["M"]: {k: v["us_per_layer"] for k, v in r.items() if isinstance(v, dict) and "us_per_layer" in v}
                for r in load(name)["layers"] if "M" in r}

    def lm(name):  # kernel_lm_layer: {rows: {variant: us per layer}}
        return {r["rows"]: {k: v["us"] for k, v in r["launches"].items()} for r in load(name)["rows"]}

    def step(name):
        return load(f"engine_loop_seventeenth_{name}.json")["runs"][-1]["median"]["gpu_step_ms"]

    pf, pre, ao = (layers(f"kernel_fused_layer_{k}_seventeenth.json") for k in ("prefetch_pieces", "preload", "att_o"))
    lm_pf, lm_pf128, lm_pre = (lm(f"kernel_lm_layer_{k}_seventeenth.json")
                               for k in ("prefetch_pieces", "prefetch", "preload"))
    prof = {(p["M"], p["launch"]["att_o"]): p for p in load("kernel_fused_layer_att_o_seventeenth.json")["persistent_profiles"]}
    steps = {"prefetch, 128 pieces": (step("prefetch_on"), step("prefetch_off")),
             "prefetch, 1 piece": (step("prefetch1_on"), step("prefetch1_off")),
             "preload 16 KB": (step("preload16k"), step("preload0")),
             "attention + output": (step("att_o_on"), step("att_o_off"))}
    burst, poisson = served_levels("served_seventeenth_sweep.json"), served_levels("served_seventeenth_sweep_poisson.json")
    cap = {"burst": load("served_seventeenth_sweep.json")["capacity"],
           "poisson": load("served_seventeenth_sweep_poisson.json")["capacity"]}
    res.update({"ttfa_ms_p95_c64": burst[64]["ttfa_ms"]["p95"], "smooth_frac_c64": burst[64]["smooth_playback_frac"],
                "aggregate_xrt_c64": burst[64]["x_real_time"], "aggregate_xrt_c128": burst[128]["x_real_time"],
                "capacity_streams": cap, "single_stream_rtf_triton": burst[1]["rtf"]["p50"],
                "ttfa_ms_p50": burst[1]["ttfa_ms"]["p50"], "ttfa_ms_p95": burst[1]["ttfa_ms"]["p95"]})
    res["seventeenth"] = {"engine_b1_gpu_step_ms_with_without": steps,
                          "served_xrt": {a: {c: lv["x_real_time"] for c, lv in lv_.items()}
                                         for a, lv_ in (("burst", burst), ("poisson", poisson))}}
    md = ["", "## Seventeenth session (2026-11-25, H100): hiding the persistent layer's memory latency, "
          "measured and dropped; the served sweep", "",
          "The persistent layer (LocDiT's at 22 and 44 tokens, the LM's at 1 and 8 rows) spends most of its time in "
          "latency-bound phases and ~1 us barriers while DRAM idles, and each GEMM phase starts its weight stream "
          "from cold. Three ways to overlap them were built, checked against the reference on the CPU "
          "(interpreter tests pass) and timed in the same calls as the committed kernel. None gains; the kernel "
          "is as it was (each one's diff: `raw/prefetch_l2_seventeenth.patch`, `raw/preload_seventeenth.patch`, "
          "`raw/att_o_seventeenth.patch`; the last holds the untimed block-diagonal variant below, the timed one "
          "looped over the sequences with the same `attend_tiles`).", "",
          "1. **Bulk L2 prefetch** (`cp.async.bulk.prefetch.L2`, sm_90): each program prefetches its share of "
          "the next GEMM phases' weights while the latency-bound phases run (QKV during the first norm, the "
          "output and gate/up weights during attention, down during the second norm), in 128 pieces per program "
          "(one per thread) or 4 or 1.",
          "2. **Preloaded K tiles**: the barrier split into arrive and wait, and between them each program loads "
          "the first one or two K tiles of its next GEMM item into registers (up to 8-64 KB), so that their "
          "latency overlaps the wait.",
          "3. **Attention and output projection in one phase** (LocDiT/LocEnc): work items (query head, 128 "
          "output columns), each recomputing its head's attention for every sequence and multiplying it by its "
          "head's slice of the output weights (split K by head), which removes a phase and a barrier.", "",
          "us per layer (12 LocDiT layers or 28 LM layers with their own weights, one CUDA graph; "
          "`benchmarks/kernel_fused_layer.py --no-sweep --variants ...`, `benchmarks/kernel_lm_layer.py --sweep "
          "1,8 --variants ...`), each row from one call, the committed kernel first:", "",
          "| lever | LocDiT 44 tokens | LocDiT 22 tokens | LM 1 row | LM 8 rows |", "|---|---|---|---|---|"]

    def cells(d44, d22, l1, l8):
        return " | ".join(f"{v:.1f}" if v is not None else "" for v in (d44, d22, l1, l8))
    md += [f"| committed kernel (calls of 1. with 1 piece) | {cells(pf[44]['persistent'], pf[22]['persistent'], lm_pf[1]['pf1_none'], lm_pf[8]['pf1_none'])} |",
           f"| 1. prefetch all four, 1 piece (LM: QKV, output, 40% of gate/up) | {cells(pf[44]['persistent_pf1_all'], pf[22]['persistent_pf1_all'], lm_pf[1]['pf1_gu40'], lm_pf[8]['pf1_gu40'])} |",
           f"| 1. prefetch output and gate/up only, 1 piece | {cells(pf[44]['persistent_pf1_o_gu'], pf[22]['persistent_pf1_o_gu'], lm_pf[1]['pf1_o_gu40'], lm_pf[8]['pf1_o_gu40'])} |",
           f"| 1. prefetch all four, 4 pieces | {cells(pf[44]['persistent_pf4_all'], pf[22]['persistent_pf4_all'], lm_pf[1]['pf4_gu40'], lm_pf[8]['pf4_gu40'])} |",
           f"| 1. prefetch all four, 128 pieces | {cells(pf[44]['persistent_pf128_all'], pf[22]['persistent_pf128_all'], lm_pf128[1]['pf_gu40'], lm_pf128[8]['pf_gu40'])} |",
           f"| 2. the same code preloading nothing (the committed kernel's work) | {cells(pre[44]['persistent_pre0'], pre[22]['persistent_pre0'], lm_pre[1]['pre0k'], lm_pre[8]['pre0k'])} |",
           f"| 2. preload up to 8 KB | {cells(pre[44]['persistent_pre8k'], pre[22]['persistent_pre8k'], lm_pre[1]['pre8k'], lm_pre[8]['pre8k'])} |",
           f"| 2. preload up to 16 KB | {cells(pre[44]['persistent'], pre[22]['persistent'], lm_pre[1]['default'], lm_pre[8]['default'])} |",
           f"| 2. preload up to 32 KB | {cells(pre[44]['persistent_pre32k'], pre[22]['persistent_pre32k'], lm_pre[1]['pre32k'], lm_pre[8]['pre32k'])} |",
           f"| committed kernel (call of 3.) | {cells(ao[44]['persistent_no_att_o'], ao[22]['persistent_no_att_o'], None, None)} |",
           f"| 3. attention + output projection | {cells(ao[44]['persistent'], ao[22]['persistent'], None, None)} |", ""]
    p_on, p_off = prof[(22, True)]["phases"], prof[(22, False)]["phases"]
    md += ["Why, from the phase profiles (`persistent_layer.layer(timings=)`, the GPU's global timer in every "
           "program):", "",
           "- The prefetch does speed the GEMM phases (22 tokens, everything prefetched in 128 pieces: QKV 4.35 -> "
           "3.58 us, output 3.07 -> 2.56, gate/up 8.45 -> 7.30, down 4.61 -> 3.33: "
           "`raw/kernel_fused_layer_prefetch_seventeenth.txt`), but the phases that issue it slow down by more (norm "
           "0.77 -> 2.82, attention 3.33 -> 6.91, the second norm 1.02 -> 3.58): their L2 reads queue behind tens of "
           "MB of DRAM traffic. One piece per program instead of 128 costs them as much (norm 2.05-2.56 us, "
           "attention 6.1-6.4 us: `raw/kernel_fused_layer_prefetch_pieces_seventeenth.json`), so it is the traffic, "
           "not the instruction count.",
           "- The preloaded tiles lengthen the barriers instead of hiding in them (44 tokens, 16 KB: waits of 2.0-2.6 "
           "us after attention, the output projection and gate/up, against ~1 us: "
           "`raw/kernel_fused_layer_preload_seventeenth.json`), and the phases after them are no shorter. The "
           "cause was not isolated (the compiler waiting for the loads before the spin, or the registers they "
           "hold through it, are the candidates).",
           f"- The fused attention and output projection phase takes {p_on[2]['span_us']:.1f} us at 22 tokens "
           f"against {p_off[2]['span_us']:.1f} + {p_off[2]['barrier_us']:.1f} + {p_off[3]['span_us']:.1f} us for "
           "attention, its barrier and the output projection: each item's attention runs one sequence after "
           "another (a chain of dependent loads, two products and a softmax per sequence), and summing 16 head "
           f"partials instead of 4 K splits costs the next phase {p_on[3]['span_us'] - p_off[4]['span_us']:.1f} us "
           "more. A variant attending to all sequences at once (one block-diagonal score tile) needed 368 KB of "
           "shared memory beside the GEMM pipelines and was not timed.", "",
           "The engine, batch-1 GPU step (`benchmarks/engine_loop.py --steps 400`, CUDA events; with and without "
           "the lever, one call each):", "",
           "| lever | with ms | without ms |", "|---|---|---|"]
    md += [f"| {k} | {a:.2f} | {b:.2f} |" for k, (a, b) in steps.items()]
    md += ["", "(`raw/engine_loop_seventeenth_*.json`; `engine_loop.py --launch FIELD=VALUE` now changes a field "
           "of the persistent layer's launch for such an A/B, and `kernel_fused_layer.py` takes `--variants` and "
           "`--profile-launch`.)", "",
           "Served on the current code (6839958 plus benchmark tools only), a fresh machine, `ARRIVALS=burst,poisson "
           "LEVELS=1,8,32,64,96,128 bash benchmarks/run_served_gpu.sh` (`raw/served_seventeenth_sweep{,_poisson}.json`, "
           "no error lines in the server log), smooth / x real time / TTFA p50 / p95 ms:", "",
           "| streams | burst | Poisson |", "|---|---|---|"]
    for c in sorted(burst):
        md.append(f"| {c} | " + " | ".join(
            f"{100 * lv['smooth_playback_frac']:.0f}% / {lv['x_real_time']:.0f} / {lv['ttfa_ms']['p50']:.0f} / "
            f"{lv['ttfa_ms']['p95']:.0f}" for lv in (burst[c], poisson[c])) + " |")
    md += ["", f"Capacity (every stream smooth and TTFA p95 <= 500 ms at every level up to it): burst {cap['burst']}, "
           f"Poisson {cap['poisson']} (the thirteenth session's: 64 and 32). Above 64 streams the rest wait for a "
           "decoder row (`max_batch_size` 64), so TTFA p95 passes 2.7 s at 128 and some streams underrun; the "
           "aggregate stays at ~330-340x, where the GPU is full. One stream: RTF "
           f"{burst[1]['rtf']['p50']:.3f}, TTFA p50 {burst[1]['ttfa_ms']['p50']:.1f} ms (burst) and "
           f"{poisson[1]['ttfa_ms']['p50']:.1f} ms (Poisson), against 27.6 ms on the sixteenth session's server: "
           "the spread between servers.", "",
           "![seventeenth session: three levers against the committed kernel](results_seventeenth.png)", ""]
    _plot_seventeenth(steps, pf, pre, ao)
    return md


def _plot_seventeenth(steps, pf, pre, ao):
    fig, axes = stream_panels()
    rows = [("committed", pf[22]["persistent"]), ("prefetch\n1 piece", pf[22]["persistent_pf1_all"]),
            ("prefetch\n128 pieces", pf[22]["persistent_pf128_all"]), ("committed", pre[22]["persistent_pre0"]),
            ("preload\n16 KB", pre[22]["persistent"]), ("committed", ao[22]["persistent_no_att_o"]),
            ("attention\n+ output", ao[22]["persistent"])]
    colors = ["#286" if n == "committed" else "#c96" for n, _ in rows]
    axes[0].bar(range(len(rows)), [v for _, v in rows], color=colors)
    axes[0].set_xticks(range(len(rows)), [n for n, _ in rows], fontsize=7)
    axes[0].set_ylim(30, 42)
    axes[0].set_ylabel("us per layer")
    axes[0].set_title("LocDiT layer, 22 tokens (each pair from one call)", fontsize=9)
    names = list(steps)
    w = 0.38
    axes[1].bar([i - w / 2 for i in range(len(names))], [steps[k][0] for k in names], w, color="#c96", label="with")
    axes[1].bar([i + w / 2 for i in range(len(names))], [steps[k][1] for k in names], w, color="#286",
                label="without (committed)")
    axes[1].set_xticks(range(len(names)), names, fontsize=7)
    axes[1].set_ylim(6.5, 8.0)
    axes[1].set_ylabel("GPU ms per step (engine loop)")
    axes[1].set_title("batch-1 decode step, each pair from one call", fontsize=9)
    axes[1].legend(fontsize=8)
    save_panels(fig, axes, "Seventeenth session, H100, 2026-11-25: levers measured and dropped",
                 "results_seventeenth.png")
