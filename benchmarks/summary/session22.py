"""results.md: the twenty-second session's section, and results_twentysecond.png."""

import os
import re

from summary.plots import pyplot, save_panels, ttfa_bars
from summary.raw import HERE, load, served_levels, set_served_headline


def twenty_second_session(res) -> list[str]:
    """2026-11-28 (issue 17): a burst's prompts prefill in packed CUDA graphs, max_batch_size 128 by
    default, the full served sweep on the final code. Updates the served headline keys, sets
    res["twentysecond"], returns the markdown, draws results_twentysecond.png."""
    burst_ab = load("prefill_burst_twentysecond.json")
    chk = load("gpu_check_twentysecond.json")
    c1 = {a: served_levels(f"served_twentysecond_call1_nopacks{s}.json") for a, s in (("burst", ""), ("poisson", "_poisson"))}
    c3 = {a: served_levels(f"served_twentysecond_call3_packs{s}.json") for a, s in (("burst", ""), ("poisson", "_poisson"))}
    cap = {a: load(f"served_twentysecond_call3_packs{s}.json")["capacity"] for a, s in (("burst", ""), ("poisson", "_poisson"))}
    cap1 = {a: load(f"served_twentysecond_call1_nopacks{s}.json")["capacity"] for a, s in (("burst", ""), ("poisson", "_poisson"))}
    ab = {m: served_levels(f"served_twentysecond_call4_{f}.json") for m, f in (("on", "packs"), ("off", "nopacks"))}
    with open(os.path.join(HERE, "raw", "gpu_tests_twentysecond.txt")) as f:
        gpu_tests = re.search(r"(\d+) passed", f.read()).group(1)
    engine64 = res["twentieth"]["engine_b64_xrt"][-1]
    b = c3["burst"]
    set_served_headline(res, b, cap, "twenty-second session, NVIDIA H200, 2026-11-28, "
                         "raw/served_twentysecond_call3_packs*.json")
    short = lambda lv: {"xrt": lv["x_real_time"], "smooth": lv["smooth_playback_frac"],  # noqa: E731
                        "ttfa_ms_p50": lv["ttfa_ms"]["p50"], "ttfa_ms_p95": lv["ttfa_ms"]["p95"], "rtf_p50": lv["rtf"]["p50"]}
    res["twentysecond"] = {
        "device": "NVIDIA H200", "prefill_burst_in_process": burst_ab["runs"],
        "served_sweep_packs": {a: {c: short(lv) for c, lv in x.items()} for a, x in c3.items()},
        "served_sweep_no_packs_max_batch_128": {a: {c: short(lv) for c, lv in x.items()} for a, x in c1.items()},
        "served_ab_same_call": {m: {c: short(lv) for c, lv in x.items()} for m, x in ab.items()},
        "served_over_engine_c64": b[64]["x_real_time"] / engine64,
        "vae_served_vs_exact_fp32_max_abs": chk["vae_graphs_vs_eager"]["served_vs_exact_fp32_max_abs"]}
    runs = burst_ab["runs"]
    sizes = burst_ab["sizes"]
    md = ["", "## Twenty-second session (2026-11-28, H200): a burst's prompts prefill in packed CUDA graphs", "",
          "A lone prompt's prefill replayed a CUDA graph, but prompts admitted together (every wave of a burst) "
          "ran one eager packed prefill: hundreds of kernels launched from Python and a causal attention per "
          "prompt and layer, launch-bound, and the engine thread launches nothing else meanwhile. Now they replay "
          "one graph per total-length bucket (`engine/prefill_packs.py`, decoder parameter `prefill_pack_graphs`, "
          "default true): every new position is a query row of the paged decode kernel, its K/V written first, "
          "attending causally through its prompt's block table. The graph's shapes then depend only on the "
          "bucket (64-2048 positions), whatever the prompts' count, lengths and cached prefixes; a larger wave is "
          "split into packs, in order. The decoder's `max_batch_size` is now 128 by default (it was 64: above "
          "it, requests waited a whole request for a row).", "",
          f"**In process, one call** (call 2, `benchmarks/prefill_burst.py`, `raw/prefill_burst_twentysecond.json`): "
          f"an engine as served (bf16, compile, graphs, max batch 128) takes waves of requests submitted at "
          f"once, with and without the pack graphs, {burst_ab['reps']} waves per size (median); prompts of "
          f"{burst_ab['prompt_positions']} positions, each with its own text (no prefix cached) or all one text "
          "(the first wave of a size prefills every prompt whole, the later ones start every prompt from the "
          "text's cached blocks). ms from the submit to the first latent patch (p50), and the engine thread's "
          "time in its prefills, each the median of its column:", "",
          "| prompts | packed graphs: first patch / prefill host | eager packed: first patch / prefill host | "
          "first patch ratio |", "|---|---|---|---|"]
    for kind in ("distinct", "shared"):
        for n in sizes:
            on, off = runs["true"][f"{kind}_{n}"], runs["false"][f"{kind}_{n}"]
            md.append(f"| {n}, {'own texts' if kind == 'distinct' else 'one text'} | "
                      f"{on['first_patch_ms_p50']:.1f} / {on['prefill_host_ms']:.1f} ms | "
                      f"{off['first_patch_ms_p50']:.1f} / {off['prefill_host_ms']:.1f} ms | "
                      f"{off['first_patch_ms_p50'] / on['first_patch_ms_p50']:.1f}x |")
    md += ["", "**Served, one call, both servers** (call 4: `SET=\"decoder.timestep_buckets=10,100 "
           "decoder.prefill_pack_graphs={true,false}\" ARRIVALS=burst LEVELS=8,64,128 REQUESTS=2 bash "
           "benchmarks/run_served_gpu.sh`, `max_batch_size` 128 for both, `raw/served_twentysecond_call4_*.json`). "
           "All streams start at once and send one text, whose blocks are cached from the warm-up on: every "
           "prompt prefills only its last block:",
           "", "| streams | pack graphs: TTFA p50 / p95 ms, smooth, x real time | eager packed | aggregate ratio |",
           "|---|---|---|---|"]
    for c in sorted(ab["on"]):
        on, off = ab["on"][c], ab["off"][c]
        md.append(f"| {c} | {on['ttfa_ms']['p50']:.1f} / {on['ttfa_ms']['p95']:.1f}, "
                  f"{on['smooth_playback_frac']:.0%}, {on['x_real_time']:.1f} | {off['ttfa_ms']['p50']:.1f} / "
                  f"{off['ttfa_ms']['p95']:.1f}, {off['smooth_playback_frac']:.0%}, {off['x_real_time']:.1f} | "
                  f"{on['x_real_time'] / off['x_real_time']:.2f}x |")
    md += ["", "The aggregate grows because the steps of the streams already playing no longer wait behind "
           "tens of milliseconds of launches per wave. At 128 streams all at once the share that played "
           f"smoothly went from {ab['off'][128]['smooth_playback_frac']:.0%} to "
           f"{ab['on'][128]['smooth_playback_frac']:.0%} in this call; in the two sweeps below (two machines) it "
           f"was {c1['burst'][128]['smooth_playback_frac']:.0%} without and {c3['burst'][128]['smooth_playback_frac']:.0%} "
           "with the pack graphs, so the size of that gain is not settled.", "",
           "**The full sweep on the final code** (call 3, default parameters but `timestep_buckets` 10,100 for "
           "start-up; `ARRIVALS=burst,poisson LEVELS=1,8,32,64,96,128 REQUESTS=2`, "
           "`raw/served_twentysecond_call3_packs*.json`), against the same sweep without the pack graphs on "
           "another fresh machine (call 1, `max_batch_size` 128 set, `raw/served_twentysecond_call1_nopacks*.json`): "
           "smooth / x real time / TTFA p50 / p95 ms:", "",
           "| streams | burst, pack graphs | burst, eager packed (call 1) | Poisson, pack graphs | "
           "Poisson, eager packed (call 1) |", "|---|---|---|---|---|"]
    cell = lambda lv: (f"{lv['smooth_playback_frac']:.0%} / {lv['x_real_time']:.0f} / "  # noqa: E731
                       f"{lv['ttfa_ms']['p50']:.0f} / {lv['ttfa_ms']['p95']:.0f}")
    for c in sorted(c3["burst"]):
        md.append(f"| {c} | {cell(c3['burst'][c])} | {cell(c1['burst'][c])} | {cell(c3['poisson'][c])} | "
                  f"{cell(c1['poisson'][c])} |")
    md += ["", f"Capacity (every stream smooth and TTFA p95 <= 500 ms at every level up to it): burst "
           f"{cap['burst']}, Poisson {cap['poisson']} (call 1: {cap1['burst']} and {cap1['poisson']}; the "
           "seventeenth session's H100 sweep at `max_batch_size` 64: 64 and 64). The burst figure stops at 64 "
           f"because at 96 streams one stream of 192 underran (in both calls). The Poisson figures differ by "
           f"{round((1 - c1['poisson'][96]['smooth_playback_frac']) * c1['poisson'][96]['requests'])} streams of "
           f"{c1['poisson'][96]['requests']} that underran at 96 streams in call 1, on another machine: not a "
           "measured effect of the pack graphs. 64 served streams made "
           f"{b[64]['x_real_time']:.0f}x, {b[64]['x_real_time'] / engine64:.2f} of the engine's batch 64 "
           f"({engine64:.0f}x, twentieth session, another call).", "",
           "**Correctness.** `gpu_check.py` passes every check on this code (call 2, "
           "`raw/gpu_check_twentysecond.json`): bf16 against fp32 teacher-forced cosine min "
           f"{chk['teacher_forced']['cosine_min']:.5f}; graph against eager 0.0 at batches 1, 5, 32 and 64; the "
           f"VAE as served against exact fp32 {chk['vae_graphs_vs_eager']['served_vs_exact_fp32_max_abs']:.2e} "
           f"(bound {chk['vae_graphs_vs_eager']['served_bound']:.0e}; the twenty-first session's VAE changes "
           "had not been checked). `tests/test_engine_gpu.py` passed on the final code "
           f"({gpu_tests} passed, call 4, `raw/gpu_tests_twentysecond.txt`), with a new test: a burst of seven "
           "prompts, cached prefixes among them, split by small buckets into packs (two at least of several "
           "prompts), gives the latents of the "
           "eager packed prefill within 1e-3 in fp32, and nothing is captured while serving. On the CPU the "
           "padded pack body runs eagerly against the offline API (`tests/test_engine.py`).", "",
           "**The twenty-first session's stall** did not come back: call 1 ran the same configuration on a fresh "
           "machine (levels 1-128, burst and Poisson) without one, as did calls 3 and 4. A stuck loop's log line "
           "now also says whether the GPU has finished the engine's and the audio thread's streams.", "",
           "![twenty-second session: packed prefill graphs](results_twentysecond.png)", ""]
    _plot_twenty_second(runs, sizes, ab)
    return md


def _plot_twenty_second(runs, sizes, ab):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for packed, color in (("true", "#286"), ("false", "#999")):
        for kind, style in (("distinct", "o-"), ("shared", "s--")):
            axes[0].plot(sizes, [runs[packed][f"{kind}_{n}"]["first_patch_ms_p50"] for n in sizes], style,
                         color=color, label=f"{'packed graphs' if packed == 'true' else 'eager packed'}, "
                                            f"{'own texts' if kind == 'distinct' else 'one text'}")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(sizes, [str(n) for n in sizes])
    axes[0].set_xlabel("requests submitted at once")
    axes[0].set_ylabel("ms to first latent patch, p50")
    axes[0].set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    axes[0].set_title("in process (engine alone)", fontsize=9)
    ttfa_bars(axes[1], [("packed graphs", "#286", ab["on"]), ("eager packed", "#999", ab["off"])],
               "streams, all at once (served, same call)", "{:.0f}".format)
    save_panels(fig, axes, "Twenty-second session, H200, 2026-11-28: a burst's prefills", "results_twentysecond.png")
