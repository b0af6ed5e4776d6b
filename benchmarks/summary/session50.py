"""results.md: the fiftieth session's section, and results_fiftieth.png."""

import json
import os

from summary.issue17 import ISSUE_RATIO, ISSUE_RTF
from summary.plots import paired_bars, pyplot, run_bars, save_panels
from summary.raw import HERE, engine_loop_run, layer_us, load, phase_spans, tests_passed

ROWS = (1, 2, 4, 8)
# kernel_lm_layer.py's sweep variants of call 1 (the patch's Launch fields) -> what the row says
LM_VARIANTS = {"merge_o_False_next_False": "neither (the code before)",
               "merge_o_False_next_True": "next layer's QKV asked for",
               "merge_o_True_next_False": "splits merged in the output projection",
               "merge_o_True_next_True": "both"}
ENGINE = {"neither": "neither (the code before; `--launch merge_o=False --launch prefetch_next=False`)",
          "next": "next layer's QKV asked for (`--launch merge_o=False`)", "both": "both (the patch's default)"}
H200_TBS = 4.8  # H200 HBM3e, TB/s (the spec sheet's figure)


def _step_weights(cfg: dict, timesteps: int = 10) -> dict:
    """{module: (layers a lone request's decode step runs, MB of bf16 weights per layer)} from the model config:
    every layer reads its four projections whole (LocDiT once per velocity evaluation, timesteps - 1)."""
    lm, kv = cfg["lm_config"], cfg["lm_config"]["num_key_value_heads"]

    def mb(h, heads, d, ffn):
        return 2 * (h * (heads + 2 * kv) * d + heads * d * h + 3 * h * ffn) / 1e6

    lm_mb = mb(lm["hidden_size"], lm["num_attention_heads"], lm["kv_channels"], lm["intermediate_size"])
    dit, enc = cfg["dit_config"], cfg["encoder_config"]
    return {"LMs (base and residual, 1 row)": (lm["num_hidden_layers"] + cfg["residual_lm_num_layers"], lm_mb),
            "LocDiT (22 tokens, one stack per evaluation)":
                (dit["num_layers"] * (timesteps - 1), mb(dit["hidden_dim"], dit["num_heads"], dit["kv_channels"],
                                                         dit["ffn_dim"])),
            "LocEnc (10 tokens, one stack)":
                (enc["num_layers"], mb(enc["hidden_dim"], enc["num_heads"], enc["kv_channels"], enc["ffn_dim"]))}


def fiftieth_session(res) -> list[str]:
    """2026-12-01 (issue 17, one stream): the LM's context splits merged in its output projection and
    each chained layer asking L2 for the next one's QKV tiles, measured per layer and in the engine and
    dropped (raw/merge_o_next_qkv_fiftieth.patch); the forty-ninth session's GPU-only tests on the GPU;
    where a lone request's step stands against its weight reads. Sets res["fiftieth"], returns the
    markdown, draws results_fiftieth.png."""
    lm_raw = {r["rows"]: r for r in load("kernel_lm_layer_fiftieth.json")["rows"]}
    lm = {n: {k: v["chained_us"] for k, v in lm_raw[n]["launches"].items()} for n in ROWS}
    lm_alone = {n: {k: v["us"] for k, v in lm_raw[n]["launches"].items()} for n in ROWS}
    diff = {n: lm_raw[n]["launches"]["merge_o_True_next_False"]["chained_max_abs_diff"] for n in ROWS}
    prof1, prof2 = (phase_spans(lm_raw[n]["profile"]) for n in (1, 2))
    local = layer_us("kernel_fused_layer_fiftieth.json")
    engine = {k: engine_loop_run(f"engine_loop_{k}_fiftieth.json") for k in ENGINE}
    tests = {c: tests_passed(f"gpu_tests_call{c}_fiftieth.txt") for c in (2, 3)}
    last = res["forty_eighth"]
    with open(os.path.join(HERE, "voxcpm2_config.json")) as f:
        weights = _step_weights(json.load(f))
    # the launches as the code before the patch runs them (neither change; stacks not asking for layer 0's QKV)
    measured = {"LMs (base and residual, 1 row)": lm[1]["merge_o_False_next_False"],
                "LocDiT (22 tokens, one stack per evaluation)": local[22]["persistent_stack_no_next"],
                "LocEnc (10 tokens, one stack)": local[10]["persistent_stack_no_next"]}
    gain = engine["both"]["steps_per_s"] / engine["neither"]["steps_per_s"]
    res["fiftieth"] = {
        "device": "NVIDIA H200", "patch": "raw/merge_o_next_qkv_fiftieth.patch",
        "lm_layer_chained_us": lm, "lm_layer_alone_us": lm_alone,
        "local_layer_us": {m: local[m] for m in (22, 10)},
        "engine_loop": engine, "engine_gain_both": gain, "gpu_tests": tests,
        "step_weights": {k: {"layers": n, "mb_per_layer": w, "us_per_layer": measured[k]}
                         for k, (n, w) in weights.items()},
    }
    step_us = sum(n * measured[k] for k, (n, _) in weights.items())
    floor_us = sum(n * w for n, w in weights.values()) / H200_TBS
    md = ["", "## Fiftieth session (2026-12-01, H200): the LM's context-split merge folded into its output "
          "projection and the next layer's QKV tiles asked of L2 across launches, measured and dropped (engine "
          f"{gain:.3f}x); the forty-ninth session's GPU-only tests pass",
          "", "Three device calls on one H200 (about 15 of 30 min). Two of the small leads the forty-eighth session "
          "left for a lone request's step, both in the LM's decode layers (36 a step, one row each, each its own "
          "launch of the persistent layer kernel). Neither gains in the engine, so the server's code is unchanged; "
          "the patch is kept as a record (`raw/merge_o_next_qkv_fiftieth.patch`, against ffff83c, with its tests).",
          "", "- **Splits merged in the output projection** (`Launch.merge_o`): no merge phase and no barrier after "
          "the paged attention; each output projection item first merges its own K split's 4 query heads from the "
          "16 context splits' partial softmaxes into scratch rows of its program, which its product then reads.",
          "- **The next layer's QKV asked for** (`layer(next_qkv=)`, `Launch.prefetch_next`): a chained layer starts "
          "at its QKV phase with cold weights; its predecessor's last phase now asked L2 for that layer's first K "
          "tiles, as a stack's layers already do for each other. Stacks also asked, after their last layer, for "
          "layer 0's (the next CFM evaluation's start).", "",
          "**Per layer** (call 1: `kernel_lm_layer.py --rows 1,2,4,8 --sweep 1,2,4,8 --variants ...`, the LM's 28 "
          "layers at a context of 300 in a CUDA graph, chained as the engine runs them (the sweep's new "
          "`chained_us`); us per layer; `raw/kernel_lm_layer_fiftieth.{json,log}`):", "",
          "| LM layer, chained | " + " | ".join(f"{n} row{'s' if n > 1 else ''}" for n in ROWS) + " |",
          "|---|" + "---|" * len(ROWS)]
    md += [f"| {label} | " + " | ".join(f"{lm[n][k]:.2f}" for n in ROWS) + " |" for k, label in LM_VARIANTS.items()]
    same = (lm[1]["default"], lm[1]["merge_o_True_next_True"])  # one launch, two runs
    merge = {n: lm[n]["merge_o_True_next_False"] - lm[n]["merge_o_False_next_False"] for n in ROWS}
    nxt = {n: lm[n]["merge_o_False_next_True"] - lm[n]["merge_o_False_next_False"] for n in ROWS}
    md += ["",
           f"- Two runs of the same launch differ by up to {abs(same[0] - same[1]):.2f} us (at one row `default` "
           f"was the patch's launch with both on: {same[0]:.2f} and {same[1]:.2f}). Against that the merge in the "
           f"output projection gains {-merge[1]:.2f} us at one row and costs from two rows on ({merge[8]:.1f} us at "
           "8: every item merges its heads for every row, one row after another); the patch took it at one row "
           "only. Asking for the next QKV moves the layer by " + ", ".join(f"{nxt[n]:+.2f}" for n in ROWS)
           + " us at 1, 2, 4 and 8 rows: about the spread between runs of one launch.",
           "- Where the merge went (one layer's launch, the phase profile): at one row with it, o (split K) "
           f"{prof1['o (split K)']:.2f} us and no merge phase; at two rows without it, merge splits "
           f"{prof2['merge splits']:.2f} and o {prof2['o (split K)']:.2f}. The merging moved into the output "
           "phase at its full length: only the barrier between them went.",
           f"- The layer's output against the merge phase's after 28 layers: the same bits at 1 and 2 rows, "
           f"{diff[4]:.3f} and {diff[8]:.3f} at 4 and 8 (bf16; the compiled PyTorch layers differ from the "
           f"persistent ones by {lm_raw[4]['max_abs_diff']:.3f} there). The merge sums the splits in another "
           "reduction layout; one layer at 4 rows stays within bf16's tolerance of the PyTorch path (the patch's GPU "
           "test, call 2).",
           f"- LocDiT's and LocEnc's stacks with and without layer 0's QKV asked for at their end "
           f"(`kernel_fused_layer.py --no-sweep --tokens 22,10 --variants ...`, a stack replayed back to back, "
           f"`raw/kernel_fused_layer_fiftieth.json`): {local[22]['persistent_stack']:.2f} and "
           f"{local[22]['persistent_stack_no_next']:.2f} us per layer at 22 tokens, "
           f"{local[10]['persistent_stack']:.2f} and {local[10]['persistent_stack_no_next']:.2f} at 10.", "",
           "**The engine, a lone request** (call 2: `engine_loop.py --checkpoint /tmp/full --max-batch 1 --steps 200 "
           "--timestep-buckets 10,100 [--launch ...]`, three processes in one call; "
           "`raw/engine_loop_{both,neither,next}_fiftieth.json`):", "",
           "| patch's launches | steps/s over the request | GPU ms a step (median) | engine ready s |",
           "|---|---|---|---|"]
    md += [f"| {label} | {engine[k]['steps_per_s']:.1f} | {engine[k]['gpu_step_ms']:.3f} | "
           f"{engine[k]['ready_s']:.1f} |" for k, label in ENGINE.items()]
    saved_us = 1e3 * (engine["neither"]["gpu_step_ms"] - engine["both"]["gpu_step_ms"])
    md += ["",
           f"- Both against neither: {gain:.4f}x, {saved_us:.0f} us of a 5 ms step. Under the spread between runs "
           "(the forty-eighth session measured 197.0 to 198.4 steps/s for the same kernels), and well under what "
           "one LM layer's barrier (about 1 us) times 36 promised; both dropped. The sweep's `chained_us` and "
           "`kernel_sm90_mma.py --lm` (an LM decode layer compiled for sm_90 on the CPU: registers, spills, MMA "
           "counts) stay as tools.", "",
           f"**GPU tests** the forty-ninth session could only run on the CPU: on the final code (call 3, "
           "`tests/test_persistent_layer.py -k 'e4m3_stack_compiles or compiled_stack_is_one_graph'`, "
           f"`raw/gpu_tests_call3_fiftieth.txt`) {tests[3]}: `test_an_e4m3_stack_compiles_captures_and_replays` and "
           "`test_a_compiled_stack_is_one_graph` with 16-bit and e4m3 weights (the `compiled_graph` helper "
           f"extracted last session included). With the patch (call 2, `raw/gpu_tests_call2_fiftieth.txt`): "
           f"{tests[2]}, those and the patch's own tests. Call 1's test run ran past its time limit after 39 "
           "tests passed (`raw/gpu_tests_call1_fiftieth.txt`).", "",
           "**A lone request's step against its weight reads** (bf16; the weights from the model config, "
           f"`benchmarks/voxcpm2_config.json`; the floor at the H200's {H200_TBS} TB/s; us per layer from call 1, "
           "the launches of the code before the patch):", "",
           "| module | layers a step | MB a layer | floor us a layer | measured us a layer | measured / floor | "
           "ms a step |", "|---|---|---|---|---|---|---|"]
    for k, (n, w) in weights.items():
        md.append(f"| {k} | {n} | {w:.1f} | {w / H200_TBS:.1f} | {measured[k]:.2f} | "
                  f"{measured[k] * H200_TBS / w:.1f} | {n * measured[k] / 1e3:.2f} |")
    md += ["",
           f"- These layers make {step_us / 1e3:.2f} ms of the step's {engine['neither']['gpu_step_ms']:.2f} ms; "
           f"reading their weights once at full bandwidth would take {floor_us / 1e3:.2f} ms. The LMs' layers run "
           "at under half the bandwidth, LocDiT's and LocEnc's at under a third: LocDiT's 35 MB layer is seven "
           "phases and barriers long over 22 tokens, each phase a few of a program's K tiles deep, and its 108 "
           "layers a step are strictly one after another (each evaluation of the Euler solver needs the last).",
           f"- Issue 17's one-stream target (RTF <= {ISSUE_RTF}) needs a step near 4.0 ms of a 0.16 s patch: "
           f"about {engine['neither']['gpu_step_ms'] - 4.0:.1f} ms off, most of it from LocDiT. The levers left "
           "by this project's sessions are each worth 1-2% by their profiles, and the two taken here gave less than "
           "their profiles said.", "",
           "**Against issue 17's targets**: unchanged (the server's code is the forty-eighth session's, bf16). "
           f"Missed: one stream RTF <= {ISSUE_RTF} ({last['served'][1]['rtf_p50']:.4f}) and served/engine at 64 "
           f"streams >= {ISSUE_RATIO} ({last['served_over_engine_c64']:.3f}); the others met.", "",
           "![fiftieth session: an LM layer chained, with the patch's two changes and without; the engine's lone "
           "request](results_fiftieth.png)", ""]
    _plot(lm, engine)
    return md


def _plot(lm, engine):
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = ("tab:gray", "tab:orange", "tab:green", "tab:blue")
    paired_bars(a, [f"{n} row{'s' if n > 1 else ''}" for n in ROWS],
                [(label, c, [lm[n][k] for n in ROWS]) for (k, label), c in zip(LM_VARIANTS.items(), colors)],
                lambda v: f"{v:.1f}")
    a.set_ylabel("us per LM layer, chained")
    a.set_ylim(0, 75)
    a.legend(fontsize=7, loc="upper left")
    run_bars(b, [(label.split(" (")[0], engine[k]["steps_per_s"]) for k, label in ENGINE.items()],
             ["tab:gray", "tab:orange", "tab:blue"], (0, 230), "engine steps/s, lone request")
    save_panels(fig, (a, b), "fiftieth session (H200): the LM layer's split merge and next-QKV prefetch, dropped",
                "results_fiftieth.png")
