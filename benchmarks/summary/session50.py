"""results.md: the fiftieth session's section, and results_fiftieth.png."""

from summary.issue17 import ISSUE_RTF, missed_targets
from summary.plots import paired_bars, pyplot, run_bars, save_panels
from summary.raw import (AUDIO_S_PER_STEP, engine_loop_run, layer_us, layer_weights, load, model_config, phase_spans,
                         tests_passed, text)

ROWS = (1, 2, 4, 8)
# kernel_lm_layer.py's sweep variants of call 1 (the patch's Launch fields) -> what the row says
LM_VARIANTS = {"merge_o_False_next_False": "neither (the code before)",
               "merge_o_False_next_True": "next layer's QKV asked for",
               "merge_o_True_next_False": "splits merged in the output projection",
               "merge_o_True_next_True": "both"}
ENGINE = {"neither": "neither (the code before; `--launch merge_o=False --launch prefetch_next=False`)",
          "next": "next layer's QKV asked for, and stacks' layer 0's (`--launch merge_o=False`)",
          "both": "both (the patch's default)"}
H200_TBS = 4.8  # H200 HBM3e, TB/s (the spec sheet's figure)
LM, DIT, ENC = ("LMs (base and residual, 1 row)", "LocDiT (22 tokens, one stack per evaluation)",
                "LocEnc (5 tokens, one stack; timed at 10, two sequences of 5)")


def _step_weights(cfg: dict, timesteps: int = 10) -> dict:
    """{module: (layers a lone request's decode step runs, MB of bf16 weights per layer)} from the model config:
    every layer reads its four projections whole, LocDiT's once per velocity evaluation (timesteps - 1, the
    server's default of 10 timesteps). LocDiT and LocEnc have the LM's KV heads (as `summarize.step_flops`)."""
    lm, kv = cfg["lm_config"], cfg["lm_config"]["num_key_value_heads"]

    def mb(h, heads, d, ffn):
        return 2 * sum(layer_weights(h, heads, kv, d, ffn)) / 1e6

    dit, enc = cfg["dit_config"], cfg["encoder_config"]
    return {LM: (lm["num_hidden_layers"] + cfg["residual_lm_num_layers"],
                 mb(lm["hidden_size"], lm["num_attention_heads"], lm["kv_channels"], lm["intermediate_size"])),
            DIT: (dit["num_layers"] * (timesteps - 1),
                  mb(dit["hidden_dim"], dit["num_heads"], dit["kv_channels"], dit["ffn_dim"])),
            ENC: (enc["num_layers"], mb(enc["hidden_dim"], enc["num_heads"], enc["kv_channels"], enc["ffn_dim"]))}


def fiftieth_session(res) -> list[str]:
    """2026-12-01 (issue 17, one stream): the LM's context splits merged in its output projection and
    each chained layer asking L2 for the next one's QKV tiles, measured per layer and in the engine and
    dropped (raw/merge_o_next_qkv_fiftieth.patch); GPU-only tests added after the forty-ninth session's
    device calls, on the GPU; where a lone request's step stands against its weight reads. Sets
    res["fiftieth"], returns the markdown, draws results_fiftieth.png."""
    lm_raw = {r["rows"]: r for r in load("kernel_lm_layer_fiftieth.json")["rows"]}
    lm = {n: {k: v["chained_us"] for k, v in lm_raw[n]["launches"].items()} for n in ROWS}
    lm_alone = {n: {k: v["us"] for k, v in lm_raw[n]["launches"].items()} for n in ROWS}
    # the patch merged in the output projection at one row only: there the sweep's reference (`fused()`, the
    # default launch) merges, elsewhere it does not; each row's comparison is the other kind against it
    merges = {n: lm_raw[n]["launch"]["merge_o"] for n in ROWS}
    assert merges == {1: True, 2: False, 4: False, 8: False}, merges
    other = {n: lm_raw[n]["launches"]["merge_o_False_next_False" if merges[n] else "merge_o_True_next_False"]
             for n in ROWS}
    diff = {n: other[n]["chained_max_abs_diff"] for n in ROWS}
    prof1, prof2 = (phase_spans(lm_raw[n]["profile"]) for n in (1, 2))
    local = layer_us("kernel_fused_layer_fiftieth.json")
    engine = {k: engine_loop_run(f"engine_loop_{k}_fiftieth.json") for k in ENGINE}
    deep = layer_us("kernel_fused_layer_stages_fiftieth.json")
    deep_engine = {k: engine_loop_run(f"engine_loop_{k}_fiftieth.json") for k in ("base", "stages_all")}
    tests = {c: tests_passed(f"gpu_tests_call{c}_fiftieth.txt") for c in (2, 3)}
    call1_tests = text("gpu_tests_call1_fiftieth.txt").count(".")
    last = res["forty_eighth"]
    spread = (res["forty_ninth"]["engine_loop"]["bf16"]["steps_per_s"],
              last["engine_loop"]["sums_patch_sums_off"]["steps_per_s"])
    weights = _step_weights(model_config())
    # the launches as the code before the patch runs them (neither change; stacks not asking for layer 0's QKV)
    measured = {LM: lm[1]["merge_o_False_next_False"], DIT: local[22]["persistent_stack_no_next"],
                ENC: local[10]["persistent_stack_no_next"]}
    gain = engine["both"]["steps_per_s"] / engine["neither"]["steps_per_s"]
    res["fiftieth"] = {
        "device": "NVIDIA H200", "patch": "raw/merge_o_next_qkv_fiftieth.patch",
        "lm_layer_chained_us": lm, "lm_layer_alone_us": lm_alone,
        "local_layer_us": {m: local[m] for m in (22, 10)},
        "engine_loop": engine, "engine_gain_both": gain, "gpu_tests": tests,
        "deeper_pipelines": {"layer_us": {m: deep[m] for m in (22, 10)}, "engine_loop": deep_engine},
        "step_weights": {k: {"layers": n, "mb_per_layer": w, "us_per_layer": measured[k]}
                         for k, (n, w) in weights.items()},
    }
    step_us = sum(n * measured[k] for k, (n, _) in weights.items())
    floor_us = sum(n * w for n, w in weights.values()) / H200_TBS
    over = {k: n * (measured[k] - w / H200_TBS) / 1e3 for k, (n, w) in weights.items()}  # ms a step over the floor
    step_for_target = ISSUE_RTF * AUDIO_S_PER_STEP * 1e3  # ms
    n_lm, n_dit = weights[LM][0], weights[DIT][0]
    md = ["", "## Fiftieth session (2026-12-01, H200): the LM's context-split merge folded into its output "
          "projection and the next layer's QKV tiles asked of L2 across launches, measured and dropped (engine "
          f"{gain:.3f}x), deeper GEMM pipelines in LocDiT's stack too; GPU-only tests of the forty-ninth session's "
          "code pass",
          "", "Four device calls on one H200 (about 20 of 30 min by the device tool's count). Two of the small leads "
          "the forty-eighth session left for a lone request's step, both in the LM's decode layers "
          f"({n_lm} a step, one row each, each its own launch of the persistent layer kernel). Neither gains in the "
          "engine, so the server's code is unchanged (call 4 then tried deeper pipelines in LocDiT's and LocEnc's "
          "stacks, a launch field only: no gain either); the patch is kept as a record "
          "(`raw/merge_o_next_qkv_fiftieth.patch`, against ffff83c, with its tests). Calls 1 and 2's variants "
          "and `--launch` fields (`merge_o`, `prefetch_next`) exist only with the patch applied.",
          "", "- **Splits merged in the output projection** (`Launch.merge_o`, on at one row only): no merge phase and "
          "no barrier of its own after the paged attention; each output projection item first merges its own K "
          "split's 4 query heads from the 16 context splits' partial softmaxes into scratch rows of its program, "
          "which its product then reads.",
          "- **The next layer's QKV asked for** (`layer(next_qkv=)`, `Launch.prefetch_next`): a chained layer starts "
          "at its QKV phase with cold weights; its predecessor's last phase now asked L2 for that layer's first K "
          "tiles, as a stack's layers already do for each other. Every stack also asked, after its last layer, "
          "for its layer 0's: the next launch's start where the same stack runs again (LocDiT's evaluations but "
          "the last), of no use after LocEnc's or a step's last evaluation.", "",
          "**Per layer** (call 1: `kernel_lm_layer.py --rows 1,2,4,8 --sweep 1,2,4,8 --variants ...`, the LM's 28 "
          "layers at a context of 300 in a CUDA graph, chained as the engine runs them (the sweep's new "
          "`chained_us`); us per layer, one run each; `raw/kernel_lm_layer_fiftieth.{json,log}`):", "",
          "| LM layer, chained | " + " | ".join(f"{n} row{'s' if n > 1 else ''}" for n in ROWS) + " |",
          "|---|" + "---|" * len(ROWS)]
    md += [f"| {label} | " + " | ".join(f"{lm[n][k]:.2f}" for n in ROWS) + " |" for k, label in LM_VARIANTS.items()]
    # one launch timed three times at one row: the sweep's default, its "both" variant, and the row's own timing
    same = (lm[1]["default"], lm[1]["merge_o_True_next_True"], lm_raw[1]["chained_us"])
    merge = {n: lm[n]["merge_o_True_next_False"] - lm[n]["merge_o_False_next_False"] for n in ROWS}
    nxt = {n: lm[n]["merge_o_False_next_True"] - lm[n]["merge_o_False_next_False"] for n in ROWS}
    assert all(merge[n] > max(same) - min(same) for n in ROWS[1:]), merge
    md += ["",
           "- One launch timed three times at one row (the patch's, both on) took "
           + ", ".join(f"{v:.2f}" for v in sorted(same)) + f" us: a spread of {max(same) - min(same):.2f} us. The "
           f"merge in the output projection moves the one-row layer by {merge[1]:+.2f} us against one run of the "
           f"code before ({lm[1]['merge_o_True_next_True'] - lm[1]['merge_o_False_next_True']:+.2f} with the next "
           "QKV asked for in both): the two pairings disagree, each of single runs. From two rows on it costs ("
           + ", ".join(f"{merge[n]:+.1f}" for n in ROWS[1:]) + " us at 2, 4 and 8 rows: every item merges its "
           "heads for every row, one row after another); the patch took it at one row only. Asking for the next "
           "QKV moves the layer by " + ", ".join(f"{nxt[n]:+.2f}" for n in ROWS)
           + " us at 1, 2, 4 and 8 rows: about the spread.",
           "- Where the merge went (one layer's launch, the phase profile, spans in steps of the GPU timer's 0.128 "
           f"us): at one row with it, o (split K) {prof1['o (split K)']:.2f} us and no merge phase; at two rows "
           f"without it, merge splits {prof2['merge splits']:.2f} and o {prof2['o (split K)']:.2f}. By these two "
           "profiles (of different row counts) the merging moved into the output phase at its full length, and "
           "only the barrier between them went.",
           "- The outputs after 28 layers, one merge against the other: "
           + ", ".join(f"{diff[n]:.3f}" for n in ROWS) + " at 1, 2, 4 and 8 rows (bf16; the compiled PyTorch layers "
           "differ from the persistent ones by " + ", ".join(f"{lm_raw[n]['max_abs_diff']:.3f}" for n in ROWS)
           + "). Probably the splits' sums in another reduction layout, not traced. One layer at 4 rows with 4 "
           "context splits (the patch's GPU test, call 2; the engine's 16 splits were not tested) stays within "
           "bf16's tolerance of the PyTorch path.",
           f"- LocDiT's and LocEnc's stacks with and without layer 0's QKV asked for at their end "
           f"(`kernel_fused_layer.py --no-sweep --tokens 22,10 --variants ...`, a stack replayed back to back, "
           f"`raw/kernel_fused_layer_fiftieth.json`): {local[22]['persistent_stack']:.2f} and "
           f"{local[22]['persistent_stack_no_next']:.2f} us per layer at 22 tokens, "
           f"{local[10]['persistent_stack']:.2f} and {local[10]['persistent_stack_no_next']:.2f} at 10.", "",
           "**The engine, a lone request** (call 2: `engine_loop.py --checkpoint /tmp/full --max-batch 1 --steps 200 "
           "--timestep-buckets 10,100 [--launch ...]`, three processes in one call, one run each; "
           "`raw/engine_loop_{both,neither,next}_fiftieth.json`):", "",
           "| the patch's launches | steps/s over the request | GPU ms a step (median) |", "|---|---|---|"]
    md += [f"| {label} | {engine[k]['steps_per_s']:.1f} | {engine[k]['gpu_step_ms']:.3f} |"
           for k, label in ENGINE.items()]
    saved_us = 1e3 * (engine["neither"]["gpu_step_ms"] - engine["both"]["gpu_step_ms"])
    md += ["",
           f"- Both against neither: {gain:.4f}x, {saved_us:.0f} us of a 5 ms step. Within the spread between "
           f"runs of the same kernels (`engine_loop.py`: {spread[0]:.1f} steps/s in the forty-ninth session, "
           f"{spread[1]:.1f} in the forty-eighth's), and well under what one LM layer's barrier (about 1 us) times "
           f"{n_lm} promised; both dropped. The sweep's `chained_us` and `kernel_sm90_mma.py --lm` (an LM decode "
           "layer compiled for sm_90 on the CPU: registers, spills, MMA counts) stay as tools.", "",
           "**GPU-only tests added after the forty-ninth session's device calls** (035dabd, 5ccc7bb), run for the "
           "first time: on the final code (call 3, `tests/test_persistent_layer.py -k 'e4m3_stack_compiles or "
           f"compiled_stack_is_one_graph'`, `raw/gpu_tests_call3_fiftieth.txt`) {tests[3]}: "
           "`test_an_e4m3_stack_compiles_captures_and_replays` and `test_a_compiled_stack_is_one_graph` with 16-bit "
           "and e4m3 weights. With the patch (call 2, `-k 'merges_the_context or next_qkv or e4m3_stack_compiles or "
           f"compiled_stack_is_one_graph'`, `raw/gpu_tests_call2_fiftieth.txt`): {tests[2]}. Call 1's test run "
           f"ran past its time limit after {call1_tests} tests passed (`raw/gpu_tests_call1_fiftieth.txt`).", "",
           "**Deeper pipelines, measured and not taken** (call 4, no code change but two benchmark variants: "
           "`kernel_fused_layer.py --no-sweep --tokens 22,10 --variants persistent_stack,persistent_stack_stages_all,"
           "persistent_stack_bk256`, then `engine_loop.py ... --launch stages=0` and without; "
           "`raw/kernel_fused_layer_stages_fiftieth.{json,log}`, `raw/engine_loop_{stages_all,base}_fiftieth.json`). "
           "The GEMM phases with 32-row weight tiles (QKV, output, down) read their weights at 1.6-2.5 TB/s (the "
           "forty-seventh session's phase profile at 22 tokens). If each program's few K tiles in flight were what "
           "held them there, more in flight would help; it did not. "
           "Per layer, us (the server's stack, as many pipeline stages as K tiles and shared memory allow, K "
           f"tiles of 256): at 22 tokens {deep[22]['persistent_stack']:.2f}, "
           f"{deep[22]['persistent_stack_stages_all']:.2f}, {deep[22]['persistent_stack_bk256']:.2f}; at 10 "
           f"{deep[10]['persistent_stack']:.2f}, {deep[10]['persistent_stack_stages_all']:.2f}, "
           f"{deep[10]['persistent_stack_bk256']:.2f}. The engine with every launch's stages uncapped: "
           f"{deep_engine['stages_all']['steps_per_s']:.1f} steps/s against {deep_engine['base']['steps_per_s']:.1f} "
           "(one run each, the latter the code before this session again). The sixteenth session found the cap of "
           "5 as good on the launches of then (H100, unswapped, without the prefetch).", "",
           "**A lone request's step against its weight reads** (bf16; the weights from the model config, "
           f"`benchmarks/voxcpm2_config.json`; the floor at the H200's {H200_TBS} TB/s; us per layer from call 1, "
           "the launches of the code before the patch, microbenchmarks: the LM at a context of 300, LocEnc at 10 "
           "tokens where a lone request runs 5):", "",
           "| module | layers a step | MB a layer | floor us a layer | measured us a layer | measured / floor | "
           "ms a step | over the floor, ms a step |", "|---|---|---|---|---|---|---|---|"]
    for k, (n, w) in weights.items():
        md.append(f"| {k} | {n} | {w:.1f} | {w / H200_TBS:.1f} | {measured[k]:.2f} | "
                  f"{measured[k] * H200_TBS / w:.1f} | {n * measured[k] / 1e3:.2f} | {over[k]:.2f} |")
    md += ["",
           f"- These layers make about {step_us / 1e3:.2f} ms of the engine's {engine['neither']['gpu_step_ms']:.2f} "
           f"ms step; reading their weights once at full bandwidth would take {floor_us / 1e3:.2f} ms. The LMs' "
           "layers run at under half the bandwidth, LocDiT's and LocEnc's at under a third, and LocDiT's "
           f"{n_dit} layers a step are the furthest over their floor ({over[DIT]:.2f} ms): each is seven phases "
           "and barriers over 22 tokens, and they run strictly one after another (each evaluation of the Euler "
           "solver needs the last).",
           f"- Issue 17's one-stream target (RTF <= {ISSUE_RTF}) needs less than {step_for_target:.1f} ms a step "
           f"({AUDIO_S_PER_STEP} s of audio each; the served path adds to the step): at least "
           f"{engine['neither']['gpu_step_ms'] - step_for_target:.1f} ms off today's. The leads earlier sessions "
           "left for it were each estimated at 1-2% from their profiles; the two taken here gave less than theirs.",
           "",
           "**Against issue 17's targets**: unchanged (the server's code is the forty-eighth session's, bf16). "
           f"{missed_targets(last)}", "",
           "![fiftieth session: an LM layer chained, with the patch's two changes and without; the engine's lone "
           "request](results_fiftieth.png)", ""]
    _plot(lm, engine)
    return md


def _plot(lm, engine):
    """Left: the LM layer chained per variant and row count; right: the engine's steps/s per variant."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = ("tab:gray", "tab:orange", "tab:green", "tab:blue")
    paired_bars(a, [f"{n} row{'s' if n > 1 else ''}" for n in ROWS],
                [(label, c, [lm[n][k] for n in ROWS]) for (k, label), c in zip(LM_VARIANTS.items(), colors)],
                lambda v: f"{v:.0f}")
    a.set_ylabel("us per LM layer, chained")
    a.set_ylim(0, 75)
    a.legend(fontsize=7, loc="upper left")
    run_bars(b, [(label.split(" (")[0], engine[k]["steps_per_s"]) for k, label in ENGINE.items()],
             ["tab:gray", "tab:orange", "tab:blue"], (0, 230), "engine steps/s, lone request")
    save_panels(fig, (a, b), "fiftieth session (H200): the LM layer's split merge and next-QKV prefetch, dropped",
                "results_fiftieth.png")
