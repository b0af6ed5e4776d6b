"""results.md: the eighteenth session's section, and results_eighteenth.png."""

from summary.plots import pyplot, save_panels
from summary.raw import load


def eighteenth_session(res) -> list[str]:
    """2026-11-28 (issue 17): stacked persistent layers hand on the next layer's input norm. Sets
    res["eighteenth"], returns the markdown, draws results_eighteenth.png."""
    lm = {r["rows"]: r for r in load("kernel_lm_layer_chain_eighteenth.json")["rows"]}
    loc = {r["M"]: r for r in load("kernel_fused_layer_chain_eighteenth.json")["layers"] if "M" in r}
    pairs = {f"LM, {n} row{'s' * (n > 1)}": (lm[n]["persistent_us"], lm[n]["chained_us"]) for n in sorted(lm)}
    pairs.update({f"LocDiT/LocEnc, {m} tokens": (loc[m]["persistent"]["us_per_layer"],
                                                 loc[m]["persistent_chained"]["us_per_layer"])
                  for m in sorted(loc, reverse=True)})
    res["eighteenth"] = {"chained_layer_us_before_after": pairs}
    md = ["", "## Eighteenth session (2026-11-28, H100): stacked persistent layers hand on the input norm", "",
          "A persistent layer's last phase (residual add) now also computes the next layer's input RMS norm when "
          "`minicpm.MiniCPM` passes it that layer's norm weight (`next_norm`), and the next layer, given that "
          "result (`h_in`), starts at its QKV phase: one phase and one grid barrier fewer for every layer of a "
          "stack but the first (LM: 27 + 7 per step, LocDiT 11 per CFM evaluation, LocEnc 11). The second norm "
          "now has a buffer of its own, so the handed-on input is only read. The numbers are identical to the "
          "unchained kernel (`chained_max_abs_diff` 0.0 on the LM's 28 layers).", "",
          "us per layer, unchained against chained, each pair from one call (`benchmarks/kernel_lm_layer.py "
          "--rows 1,8`: 28 LM layers with their own weights, context 300; `benchmarks/kernel_fused_layer.py "
          "--no-sweep --variants persistent,persistent_chained --tokens 44,10`: 12 LocDiT layers; one CUDA graph "
          "each; `raw/kernel_lm_layer_chain_eighteenth.json`, `raw/kernel_fused_layer_chain_eighteenth.json`):", "",
          "| layer | unchained | chained | speed-up |", "|---|---|---|---|"]
    md += [f"| {k} | {a:.2f} | {b:.2f} | {a / b:.3f}x |" for k, (a, b) in pairs.items()]
    md += ["", "About 0.6-0.9 us per chained layer (the norm phase's ~0.8 us and its barrier, less the norm's work "
           "moved into the residual phase); at 8 LM rows the saving is within the spread between runs. Over a batch-1 step (34 LM, 99 LocDiT and 11 LocEnc chained layers) that "
           "projects to about 0.1 ms of the 7.1 ms step (1-2%); the engine loop was not re-measured (the "
           "session's device time was spent; `benchmarks/engine_loop.py --no-chain` is the A/B for a later "
           "call). Kept: it removes work and a barrier, the outputs are bit-identical, and the GPU tests of the "
           "chained and paged layers pass on the H100 (`raw/gpu_tests_eighteenth.txt`: "
           "`tests/test_persistent_layer.py -k 'stacked or paged_layer'`, 25 passed; two checks added after that call, "
           "a layer given another norm's output as `h_in` and the engine step's latents against the PyTorch path, "
           "have run on the CPU only).", "",
           "![eighteenth session: chained persistent layers](results_eighteenth.png)", ""]
    _plot_eighteenth(pairs)
    return md


def _plot_eighteenth(pairs):
    plt = pyplot()
    fig, ax = plt.subplots(1, 1, figsize=(7, 3.6))
    names, w = list(pairs), 0.38
    ax.bar([i - w / 2 for i in range(len(names))], [pairs[k][0] for k in names], w, color="#999", label="unchained")
    ax.bar([i + w / 2 for i in range(len(names))], [pairs[k][1] for k in names], w, color="#286",
           label="chained (input norm handed on)")
    for i, k in enumerate(names):
        ax.text(i + w / 2, pairs[k][1], f"{pairs[k][0] / pairs[k][1]:.3f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("us per layer (CUDA graph)")
    ax.legend(fontsize=8, loc="lower right")
    save_panels(fig, [ax], "Eighteenth session, H100, 2026-11-28: persistent layers chained", "results_eighteenth.png")
