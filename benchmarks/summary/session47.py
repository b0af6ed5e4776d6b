"""results.md: the forty-seventh session's section, and results_forty_seventh.png."""

import re

from summary.issue17 import targets_table
from summary.plots import paired_bars, pyplot, run_bars, save_panels
from summary.raw import (AUDIO_S_PER_STEP, engine_loop_run, gpu_check_record, headline_keys, layer_us, load,
                         phase_spans, served_levels, served_ms_per_step, served_summary, served_table, text)

# engine_loop.py --max-batch 1 runs: key -> (label, file)
ENGINE = {"layers": ("call 1: VOXCPM_FUSED_STACKS=0 (a launch per layer)", "engine_loop_layers_fortyseventh.json"),
          "stack": ("call 1: stacks (the forty-sixth session's final code)", "engine_loop_stack_fortyseventh.json"),
          "unbalanced": ("call 3: --launch balance=False", "engine_loop_unbalanced_fortyseventh.json"),
          "balanced": ("call 3: balance on every Hopper launch (not the final policy)",
                       "engine_loop_balanced_fortyseventh.json")}


def _lm(name: str) -> dict:
    """kernel_lm_layer.py -> rows -> {launch name: us per layer, "profile": [(phase, span us)]}."""
    out = {}
    for r in load(name)["rows"]:
        out[r["rows"]] = {k: v["us"] for k, v in r["launches"].items()}
        out[r["rows"]]["profile"] = [(p["phase"], p["span_us"]) for p in r["profile"]["phases"]]
    return out


def _tests_line(name: str) -> str:
    """The dots pytest printed before a `timeout` ended it (no summary line): how many passed, none failed."""
    body = text(name).split("python3 -m pytest", 1)[1]
    line = next(ln for ln in body.splitlines() if ln.startswith("."))
    dots = re.match(r"[.FEsx]+", line)[0]
    return f"{dots.count('.')} passed, {dots.count('F') + dots.count('E')} failed"


def forty_seventh_session(res) -> list[str]:
    """2026-12-01 (issue 17): the forty-sixth session's final code run on the GPU (tests, stacks in the engine,
    gpu_check, the step's profile), `Launch.balance` for the LM's layers, and 999dd44 served at 1, 8 and 64
    streams. Sets res["forty_seventh"] and the one-stream and 64-stream headline keys, returns the
    markdown, draws results_forty_seventh.png."""
    e = {k: engine_loop_run(name) for k, (_, name) in ENGINE.items()}
    prof = load("fused_layer_profile_fortyseventh.json")
    g = load("gpu_check_fortyseventh.json")
    check = gpu_check_record(g)
    step = load("offline_b1_profile_fortyseventh.json")["engine"]["graphs"]["profile_batch1"]
    persistent_ms = sum(k["cuda_ms"] for k in step["all"] if k["kernel"] == "_layer_kernel")
    persistent_calls = sum(k["calls"] for k in step["all"] if k["kernel"] == "_layer_kernel")
    lay = layer_us("kernel_fused_layer_balance_fortyseventh.json")
    lm = _lm("kernel_lm_layer_balance_fortyseventh.json")
    lm5 = {k: v for k, v in _lm("kernel_lm_layer_balance_call5_fortyseventh.json")[1].items() if k != "profile"}
    gu_only = load("kernel_lm_layer_gate_up_only_fortyseventh.json")["rows"][0]
    lm5["gate_up_only"], lm5["gate_up_only_persistent"] = gu_only["launches"]["default"]["us"], gu_only["persistent_us"]
    served = served_levels("served_fortyseventh.json")
    one, eight, many = served[1], served[8], served[64]
    tests1 = re.search(r"^(\d+ passed[^\n]*?) in [\d.]+s", text("gpu_fortyseventh_call1.txt"), re.M)[1]
    tests3 = _tests_line("gpu_fortyseventh_call3.txt")
    log = text("served_fortyseventh_tritonserver.log")
    fatal = log.count("Fatal Python error")
    ready = float(re.search(r"decoder instance decoder_0_0 ready in ([\d.]+) s", log)[1])
    stack_gain = e["stack"]["steps_per_s"] / e["layers"]["steps_per_s"]
    lm_gain = {r: lm[r]["pf1"] / lm[r]["default"] for r in lm}
    prev = res["forty_sixth"]["served"]
    step_ratio = served_ms_per_step(one) / e["stack"]["gpu_step_ms"]
    res["forty_seventh"] = {
        "device": "NVIDIA H200",
        "engine": {k: {"run": ENGINE[k][0], **v} for k, v in e.items()},
        "stack_over_layers": stack_gain, "rtf_in_process": 1 / (e["stack"]["steps_per_s"] * AUDIO_S_PER_STEP),
        "phase_profile_us": {p["M"]: {"total": p["total_us"], "phases": phase_spans(p),
                                      "barriers": sum(q["barrier_us"] or 0 for q in p["phases"])}
                             for p in prof["persistent_profiles"]},
        "step_profile_b1": {"gpu_ms": step["gpu_ms"], "kernels": step["kernels"], "persistent_ms": persistent_ms,
                            "persistent_launches": persistent_calls},
        "layer_us_local": lay,
        "layer_us_lm": {r: {k: v for k, v in x.items() if k != "profile"} for r, x in lm.items()},
        "lm_balanced_over_tiles": lm_gain,
        "lm_1_row_call5_us": {"whole_tiles": lm5["pf1"], "qkv_and_gate_up_narrowed": lm5["default"],
                              "gate_up_narrowed": lm5["gate_up_only"]},
        "served": {c: served_summary(lv) for c, lv in served.items()}, "served_step_over_engine_step": step_ratio,
        "decoder_ready_s": ready,
        "gpu_check": check,
        "gpu_tests": [tests1, tests3],
    }
    res.update(headline_keys(one, many, "one and 64 streams: forty-seventh session, NVIDIA H200, 2026-12-01, "
                             "raw/served_fortyseventh.json (10 requests per stream, commit 999dd44); 128 streams "
                             "and capacity: forty-fourth session's sweep, raw/served_fortyfourth_sweep*.json"))
    p22 = res["forty_seventh"]["phase_profile_us"][22]
    md = ["", "## Forty-seventh session (2026-12-01, H200): the stacks checked on the GPU without graph breaks, the "
          f"LM's gate/up items spread over all its programs (its layer about 2% faster at one row), one served stream at RTF "
          f"{one['rtf']['p50']:.4f}, 64 streams at {many['x_real_time']:.1f}x",
          "", "Five device calls (about 28 of 30 min). The forty-sixth session's final code had not run on a GPU: calls "
          "1 and 2 ran it (422fc1b). Call 3 measured one new change (999dd44), call 4 served it, call 5 split it "
          "in two, and the final code keeps the half that pays.", "",
          f"**The forty-sixth session's code on the H200** (call 1, `raw/gpu_fortyseventh_call1.txt`): `tests/"
          f"test_persistent_layer.py -k 'stack or compiles_captures or hands_it'`, {tests1}, "
          "`test_a_compiled_stack_is_one_graph` among them, which failed there last session. With the graph "
          "breaks gone, the stacks' gain in the engine (`engine_loop.py --checkpoint /tmp/full --max-batch 1 --steps "
          "200 --timestep-buckets 10,100`, `VOXCPM_FUSED_STACKS=0` and not; `raw/engine_loop_{layers,stack}_"
          f"fortyseventh.json`): {e['layers']['steps_per_s']:.1f} -> {e['stack']['steps_per_s']:.1f} steps/s "
          f"({stack_gain:.3f}x; the forty-sixth session measured 1.050x and 1.039x with the breaks), engine ready "
          f"{e['layers']['ready_s']:.1f} and {e['stack']['ready_s']:.1f} s. In process that is RTF "
          f"{res['forty_seventh']['rtf_in_process']:.4f}.", "",
          "**GPU correctness** (call 2: `gpu_check.py --checkpoint /tmp/full --only decoder --timestep-buckets 10,100`, "
          f"`raw/gpu_check_fortyseventh.{{json,log}}`): bf16 against fp32 teacher-forced, patch cosine min "
          f"{g['teacher_forced']['cosine_min']:.5f}; graph replay against the eager step, max abs "
          f"{check['graph_vs_eager_max_abs']:.1f} at every batch: "
          f"{'PASS' if check['pass'] else 'FAIL'}. (Call 1's try ran out of its 150 s limit while capturing.)", "",
          "**Where a lone request's step goes** (call 2: `bench.py --checkpoint /tmp/full --timestep-buckets 10,100 "
          "--reference none --no-vae --graphs-only --batches 1`, 8 profiled steps, `raw/offline_b1_profile_"
          f"fortyseventh.json`): {step['gpu_ms']:.2f} ms of GPU work in {step['kernels']:.0f} kernels a step; the "
          f"persistent layer kernel {persistent_ms:.2f} ms ({persistent_ms / step['gpu_ms']:.0%}) in "
          f"{persistent_calls:.0f} launches (LocDiT's 9 stacks, one per CFM evaluation, LocEnc's one, and the LMs' "
          "36 layers one by one). "
          "Everything else, cuBLAS's few GEMMs, inductor's glue and the copies, is "
          f"{step['gpu_ms'] - persistent_ms:.2f} ms.", "",
          "One LocDiT layer at 22 tokens, phase by phase (call 1: `kernel_fused_layer.py --profile-only --tokens "
          "22,10`, one layer's launch, the GPU's global timer; `raw/fused_layer_profile_fortyseventh.json`), us: "
          + ", ".join(f"{k} {v:.2f}" for k, v in p22["phases"].items())
          + f"; barriers {p22['barriers']:.2f} of {p22['total']:.2f}.", "",
          "**Work items spread over every program** (`Launch.balance`, `persistent_layer._columns`). The QKV and gate/up "
          "phases hand out column tiles, one item each: QKV's 2560 columns in 32-row tiles make 80 items, the LM's "
          "gate/up (6144 columns in 64-row tiles) 96, so a quarter of the LM's 128 programs (one per SM, at most "
          "132 on the H200) idled through its largest phase while the rest read whole tiles. With balance an item fills only "
          "`ceil(columns / programs)` of its tile's rows (a multiple of 8; the rest masked, neither read nor "
          "written): the LM's gate/up items become 48 columns (128 items). The tiles, products and pipelines are "
          "unchanged. Call 3's version (999dd44) narrowed QKV's items too (24 columns, 107 items).", "",
          "Per layer (call 3, 999dd44's kernel with balance on every Hopper launch: `kernel_fused_layer.py --no-sweep "
          "--tokens 22,10 --variants persistent,persistent_pf2,persistent_stack,persistent_stack_unbalanced`, "
          "`kernel_lm_layer.py --rows 1,8 --sweep 1,8 --variants default,pf1`; 12 LocDiT or 28 LM layers in a CUDA "
          "graph, us per layer; `raw/kernel_{fused,lm}_layer_balance_fortyseventh.json`):", "",
          "| layer | whole tiles | narrowed (999dd44) |", "|---|---|---|"]
    for r in lm:
        md.append(f"| LM, {r} row{'s' if r > 1 else ''} | {lm[r]['pf1']:.2f} | {lm[r]['default']:.2f} |")
    for m in (22, 10):
        name = "LocDiT" if m == 22 else "LocEnc"
        md.append(f"| {name}, {m} tokens, a launch per layer | {lay[m]['persistent_pf2']:.2f} | "
                  f"{lay[m]['persistent']:.2f} |")
        md.append(f"| {name}, {m} tokens, one stack | {lay[m]['persistent_stack_unbalanced']:.2f} | "
                  f"{lay[m]['persistent_stack']:.2f} |")
    md += ["",
           "- The LM's layer, call 3 (QKV and gate/up narrowed): "
           + ", ".join(f"{lm_gain[r]:.3f}x at {r} row{'s' if r > 1 else ''}" for r in lm)
           + ", the outputs identical (max abs diff 0.0 between the launches). Its phases at one row, balanced: "
           + ", ".join(f"{k} {v:.2f}" for k, v in lm[1]["profile"]) + " us.",
           "- LocDiT's layers were slower with QKV narrowed at 22 tokens, stacked or not, and LocEnc's level at 10 "
           "(table; their gate/up tiles are 128 already, so QKV was all that changed). Why was not looked into.",
           "- Call 5 (another machine; `kernel_lm_layer.py --rows 1 --sweep 1 --variants default,pf1`, then the same "
           "in a process whose `_columns` left QKV whole; `raw/kernel_lm_layer_{balance_call5,gate_up_only}_"
           f"fortyseventh.json`), the LM at one row: whole tiles {lm5['pf1']:.2f} us, QKV and gate/up narrowed "
           f"{lm5['default']:.2f}, gate/up alone {lm5['gate_up_only']:.2f} ({lm5['pf1'] / lm5['gate_up_only']:.3f}x; "
           f"that process's own figure for the same launch, {lm5['gate_up_only_persistent']:.2f} us, gives "
           f"{lm5['pf1'] / lm5['gate_up_only_persistent']:.3f}x: about 2%, from two processes). "
           "Narrowing QKV gains the LM nothing and costs LocDiT, so the final code narrows gate/up only, on every "
           "launch `choose_launch` swaps or prefetches for (Hopper, 16-bit weights, up to 64 rows). LocDiT's and "
           "LocEnc's 128 gate/up tiles are already one per program (their grid is 128), so there it changes "
           "nothing: their sm_90 compile (`kernel_sm90_mma.py --tokens 22,10 --layers 0|12 --launch swap=True "
           "--launch prefetch=2 --launch balance=False|True`, `raw/kernel_sm90_mma_fortyseventh.txt`) is the same "
           "either way and the forty-sixth session's (the 12-layer stack: 255 registers, 24 bytes spilled, "
           "122,880 B of shared memory at 22 tokens). The final code ran on the CPU only.",
           f"- In the engine (call 3, `engine_loop.py --max-batch 1 ...`, with and without `--launch balance=False`, "
           f"balance then on for LocDiT too): {e['unbalanced']['steps_per_s']:.1f} and "
           f"{e['balanced']['steps_per_s']:.1f} steps/s, level. By the table the LMs' 36 layers would gain about "
           "50 us a step and LocDiT's 108 (9 stacks of 12) lose about 100, a step about 1% slower; the engine "
           "measured no difference, not explained. The final code (gate/up alone) was not run in the engine; "
           "call 4 served call 3's.",
           f"- GPU tests on that kernel (call 3): `test_persistent_layer.py -k 'every_launch or layer_matches_layer_math "
           f"or balanced or a_stack_is'`, {tests3} before its 110 s limit cut the run (no summary line): the new "
           "balanced launches and LocDiT's/LocEnc's full-size layers against `LayerMath` among them.", "",
           "**Served** (call 4, 999dd44, the LM's QKV and gate/up narrowed; the final code narrows gate/up only: `SET=\"decoder.timestep_buckets=10,100\" LEVELS=1,8,64 "
           "REQUESTS=10 bash benchmarks/run_served_gpu.sh`, on call 3's machine, its compile caches warm; "
           "`raw/served_fortyseventh.{json.gz,log}`, `raw/served_fortyseventh_tritonserver.log`):", "",
           *served_table(served, prev, "forty-sixth session")]
    md += ["",
           f"- One stream: the served wall time per decoder step is {step_ratio:.2f}x call 1's engine GPU step with "
           "stacks; the VAE's decodes and the request's prefill and end are the difference. 64 streams: the most "
           "served so far, one run.",
           f"- The decoder was ready in {ready:.1f} s (22 graphs, warm caches). The server's log: {fatal} fatal Python "
           "errors.", "",
           "**Against issue 17's targets** (this session's served run; capacity and 128 streams: the forty-fourth "
           "session's sweep; served over engine at 64 streams: the forty-fifth session's 0.776, not re-measured):", "",
           *targets_table(one, eight, many), "",
           "results.json's one-stream and 64-stream headline keys are now this run's.", "",
           "![forty-seventh session: balanced work items and the lone request's engine step](results_forty_seventh.png)",
           ""]
    _plot(lm, lay, e)
    return md


def _plot(lm, lay, e):
    plt = pyplot()
    fig, (a, c) = plt.subplots(1, 2, figsize=(12, 4.2))
    groups = [(f"LM\n{r} row{'s' if r > 1 else ''}", lm[r]["pf1"], lm[r]["default"]) for r in lm] + \
        [(f"{'LocDiT' if m == 22 else 'LocEnc'} stack\n{m} tokens", lay[m]["persistent_stack_unbalanced"],
          lay[m]["persistent_stack"]) for m in (22, 10)]
    paired_bars(a, [grp[0] for grp in groups],
                [("whole tiles", "tab:gray", [grp[1] for grp in groups]),
                 ("QKV and gate/up narrowed (999dd44)", "tab:green", [grp[2] for grp in groups])], lambda v: f"{v:.1f}")
    a.set_ylabel("us per layer (CUDA graph, call 3)")
    a.set_ylim(0, 68)
    a.legend(fontsize=7, loc="upper right")
    run_bars(c, [(ENGINE[k][0], e[k]["steps_per_s"]) for k in ENGINE],
             ["tab:gray", "tab:blue", "tab:gray", "tab:green"], (180, 202), "engine steps/s, lone request (engine_loop.py --max-batch 1)")
    save_panels(fig, (a, c), "forty-seventh session (H200): the LM's work items over every SM; stacks in the engine",
                "results_forty_seventh.png")
