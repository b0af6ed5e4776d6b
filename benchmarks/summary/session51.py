"""results.md: the fifty-first session's section, and results_fifty_first.png."""

import re
import statistics

from summary.issue17 import ISSUE_RATIO, missed_targets
from summary.plots import paired_bars, pyplot, run_bars, save_panels
from summary.raw import closed_loop_rounds, engine_loop_run, layer_us, load, phase_spans, text

TOKENS = (22, 10)
# kernel_fused_layer.py's stack variants -> (row label, raw file)
STACKS = {"parts_qkv32": ("partials summed by the attention, 32-row QKV tiles (160 items)",
                          "kernel_fused_layer_qkv_parts_fiftyfirst.json", "persistent_stack_qkv32_split2"),
          "parts_qkv64": ("partials summed by the attention, 64-row QKV tiles (80 items)",
                          "kernel_fused_layer_qkv_parts_fiftyfirst.json", "persistent_stack_qkv64_split2"),
          "sums_qkv64": ("fp32 sums by atomic adds, 64-row QKV tiles (80 items)",
                         "kernel_fused_layer_qkv_split_fiftyfirst.json", "persistent_stack_qkv64_split2")}
PHASES = ("norm", "qkv", "attention", "o (split K)")
HOLDS = {"behind": "each round at once (the server's)", "hold50": "held up to 50 ms",
         "hold100": "held up to 100 ms"}


# kernel_fused_layer.py's phase profiles, in the order --profile-launch ran them (each at 22, then 10 tokens):
# name -> (raw file, index of its 22-token profile, split_qkv, QKV tile rows)
PROFILES = {"server_default": ("kernel_fused_layer_qkv_parts_fiftyfirst.json", 0, 1, 32),  # call 2, the default
            "server": ("kernel_fused_layer_qkv_parts_fiftyfirst.json", 2, 1, 32),  # call 2, the same by name
            "parts_qkv32": ("kernel_fused_layer_qkv_parts_fiftyfirst.json", 4, 2, 32),
            "parts_qkv64": ("kernel_fused_layer_qkv_parts_fiftyfirst.json", 6, 2, 64),
            "server_sums_call": ("kernel_fused_layer_qkv_split_fiftyfirst.json", 0, 1, 32),  # call 3
            "sums_qkv64": ("kernel_fused_layer_qkv_split_fiftyfirst.json", 2, 2, 64)}
TIMER_US = 0.256  # the phase spans' step (the GPU's global timer)


def _profiles() -> dict:
    """{PROFILES name: {tokens: phase profile}}, each checked to be the launch its name says."""
    files = {raw: load(raw)["persistent_profiles"] for raw, *_ in PROFILES.values()}  # each read once
    out = {}
    for name, (raw, i, split, rows) in PROFILES.items():
        ps = files[raw][i:i + 2]
        assert [(p["M"], p["launch"].get("split_qkv", 1), p["launch"]["blocks"][0]) for p in ps] == \
            [(m, split, rows) for m in TOKENS], (name, [p["launch"] for p in ps])
        out[name] = {p["M"]: p for p in ps}
    return out


def fifty_first_session(res) -> list[str]:
    """2026-12-01 (issue 17): the QKV projection in two K splits, in two forms, and the audio thread's
    rounds held for more chunks, measured and dropped (raw/qkv_split_parts_fiftyfirst.patch,
    raw/qkv_split_fiftyfirst.patch, raw/audio_hold_fiftyfirst.patch). Sets res["fifty_first"],
    returns the markdown, draws results_fifty_first.png."""
    timed = {f: layer_us(f) for _, f, _ in STACKS.values()}  # each call's raw file, read once
    stack = {"server_parts_call": {m: timed[STACKS["parts_qkv64"][1]][m]["persistent_stack"] for m in TOKENS},
             "server_sums_call": {m: timed[STACKS["sums_qkv64"][1]][m]["persistent_stack"] for m in TOKENS},
             **{k: {m: timed[f][m][v] for m in TOKENS} for k, (_, f, v) in STACKS.items()}}
    prof = _profiles()
    profiles = {k: {m: phase_spans(p[m]) for m in TOKENS} for k, p in prof.items()}
    totals = {k: {m: p[m]["total_us"] for m in TOKENS} for k, p in prof.items()}
    lm_parts = load("kernel_lm_layer_qkv_parts_fiftyfirst.json")["rows"][0]["launches"]
    lm_sums = load("kernel_lm_layer_qkv_split_fiftyfirst.json")["rows"][0]["launches"]
    lm = {"parts": {k: lm_parts[k]["chained_us"] for k in ("default", "qkv32_split2", "qkv64_split2")},
          "sums": {k: lm_sums[k]["chained_us"] for k in ("default", "qkv64_split2")}}
    lm_qkv = phase_spans(load("kernel_lm_layer_qkv_parts_fiftyfirst.json")["rows"][0]["profile"])["qkv"]
    engine = {"parts": {k: engine_loop_run(f"engine_loop_qkv_parts_{k}_fiftyfirst.json")
                        for k in ("base", "split", "base2")},
              "sums": {k: engine_loop_run(f"engine_loop_qkv_split_{k}_fiftyfirst.json")
                       for k in ("base", "both", "base2")}}
    tests = len(re.fullmatch(r"\.+", text("gpu_tests_qkv_split_fiftyfirst.txt").strip()).group())  # cut off: dots
    sm90 = text("kernel_sm90_mma_qkv_split_fiftyfirst.txt")
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", sm90)]
    hold = closed_loop_rounds("closed_loop_hold_fiftyfirst.json")[64]
    med = {k: statistics.median(hold[k]["xrt"]) for k in HOLDS}
    base_e = {k: statistics.mean(engine[k][b]["steps_per_s"] for b in ("base", "base2")) for k in engine}
    last = res["forty_eighth"]
    engine_b64 = last["engine_b64_xrt"]["call7"][0]
    res["fifty_first"] = {
        "device": "NVIDIA H200",
        "patches": ["raw/qkv_split_parts_fiftyfirst.patch", "raw/qkv_split_fiftyfirst.patch",
                    "raw/audio_hold_fiftyfirst.patch"],
        "stack_us_per_layer": stack, "phase_spans_us": profiles, "profile_totals_us": totals,
        "lm_layer_chained_us": lm, "engine_loop": engine,
        "closed_loop_c64_xrt": {k: hold[k]["xrt"] for k in HOLDS}, "closed_loop_c64_median_xrt": med,
    }
    sp, sv, sa = profiles["server"], profiles["parts_qkv64"], profiles["sums_qkv64"]
    sc = profiles["server_sums_call"]
    md = ["", "## Fifty-first session (2026-12-01, H200): the QKV projection in two K splits, its sums in the "
          "attention or in fp32 atomics, and the audio thread's rounds held for more chunks: measured and dropped",
          "", "Four device calls on one H200, and a one-second fifth that looked for call 1's lost files (about "
          "23 of 30 min by the device tool's count). Call 2 re-ran call 1's kernel benchmarks, whose files had "
          "not come back (more than the eight files a call returns). Nothing is kept: the server's code is "
          "the forty-eighth session's. Each change, with its tests, is kept as a patch against e9b81e1 "
          "(`raw/qkv_split_parts_fiftyfirst.patch`, `raw/qkv_split_fiftyfirst.patch`, "
          "`raw/audio_hold_fiftyfirst.patch`). The tools stay: `engine_loop.py --local-launch/--lm-launch` "
          "change only LocDiT/LocEnc's or only the LMs' persistent launches, and `kernel_fused_layer.py "
          "--profile-launch` takes several launches.", "",
          "**Why the QKV phase.** In the server's LocDiT layer at 22 tokens (the forty-seventh session's profile, "
          f"again in call 2: {sp[22]['qkv']:.2f} us) its 2560 columns make 80 tiles of 32 weight rows: 48 of the "
          "launch's 128 programs wait at the barrier while each of the others walks 8 K tiles of 128. Two K "
          "splits halve "
          "each item's walk, and 64-row tiles (80 items again) put its products on Hopper's warpgroup MMA. The "
          "splits' fp32 sums must then reach the attention phase, which reads q, k and v:",
          "- **partials summed by the attention** (calls 1-2): each split writes its own fp32 partials; the "
          "attention loads both and rounds their sum as it loads q, k and v (local and paged attention alike);",
          "- **sums by atomic adds** (call 3): each split adds into one fp32 buffer (`tl.atomic_add`, relaxed; "
          "two addends from zero sum the same in either order, so the result stays deterministic), zero at "
          "rest: every launch's output projection phase zeroes the rows it used. The attention then loads one "
          "fp32 value where it loaded one bf16 one.",
          "", "The launches (`persistent_layer.Launch` fields changed from the server's, in the benchmarks' "
          "variants of calls 1-3, which the patches do not carry): LocDiT/LocEnc `split_qkv=2, "
          "blocks=(32 or 64, 32, 32, 32)`; the LM `split_qkv=2, blocks=(32 or 64, 64, 64, 64)`.",
          "", "Both were checked under the CPU interpreter against the PyTorch layer (local launches, and a paged "
          "LM layer), and mutation-checked there: summing one partial fewer, never zeroing the sums, and storing "
          f"instead of adding each failed. On the GPU, call 3's test run (the atomic form) passed {tests} tests "
          "before its time ran out, none failed (`raw/gpu_tests_qkv_split_fiftyfirst.txt`).", "",
          "**Per layer** (`kernel_fused_layer.py --no-sweep --tokens 22,10 --variants persistent_stack,...`: 12 "
          "layers as one stack, replayed back to back, us per layer; LocDiT's 22 tokens, LocEnc's 10 (two "
          "sequences of 5: a lone request runs one); `raw/kernel_fused_layer_qkv_{parts,split}_fiftyfirst.json`):",
          "", "| stack | LocDiT, 22 tokens | LocEnc, 10 tokens |", "|---|---|---|",
          f"| the server's (call 2) | {stack['server_parts_call'][22]:.2f} | {stack['server_parts_call'][10]:.2f} |"]
    md += [f"| {STACKS[k][0]} (call 2) | {stack[k][22]:.2f} | {stack[k][10]:.2f} |"
           for k in ("parts_qkv32", "parts_qkv64")]
    md += [f"| the server's (call 3) | {stack['server_sums_call'][22]:.2f} | {stack['server_sums_call'][10]:.2f} |",
           f"| {STACKS['sums_qkv64'][0]} (call 3) | {stack['sums_qkv64'][22]:.2f} | {stack['sums_qkv64'][10]:.2f} |",
           "", "Phases of one layer's launch (unchained; the GPU's global timer in every program, spans in us, in "
           f"steps of {TIMER_US} us: differences of a step or two are the timer's):", "",
           "| launch | tokens | norm | qkv | attention | o (split K) | whole launch |", "|---|---|---|---|---|---|---|"]
    rows = (("the server's (call 2, as the default)", "server_default"),
            ("the same launch, by name (call 2's variant `persistent_server`, since removed)", "server"),
            ("partials, 32-row tiles", "parts_qkv32"), ("partials, 64-row tiles", "parts_qkv64"),
            ("the server's (call 3)", "server_sums_call"), ("atomic sums, 64-row tiles", "sums_qkv64"))
    for label, k in rows:
        md += [f"| {label} | {m} | " + " | ".join(f"{profiles[k][m][p]:.2f}" for p in PHASES)
               + f" | {totals[k][m]:.2f} |" for m in TOKENS]
    md += ["",
           f"- The split does shorten the QKV phase: {sp[22]['qkv']:.2f} -> {sv[22]['qkv']:.2f} us at 22 tokens with "
           f"64-row tiles ({sp[10]['qkv']:.2f} -> {sv[10]['qkv']:.2f} at 10). 32-row tiles make 160 items for the "
           "132 programs (one per SM) that launch runs, 28 of which take two: longer, as the item count says.",
           f"- Summing partials, the attention pays more than the split saves ({sp[22]['attention']:.2f} -> "
           f"{sv[22]['attention']:.2f} us at 22 tokens). Loading the atomic sums it pays "
           f"{sa[22]['attention'] - sc[22]['attention']:.2f} of the {sc[22]['qkv'] - sa[22]['qkv']:.2f} us saved "
           f"({sc[22]['attention']:.2f} -> {sa[22]['attention']:.2f}), and the norm phase before it "
           f"{sa[22]['norm'] - sc[22]['norm']:.2f} more (one timer step; it asks L2 for the QKV items' first tiles, "
           "now of 64 rows): one layer's launch takes as long as without "
           f"({totals['server_sums_call'][22]:.2f} and {totals['sums_qkv64'][22]:.2f} us). "
           "The likely reason for the attention's share (not measured apart): fp32 loads are twice bf16's bytes, "
           "in a phase of 32 items that is all latency.",
           "- In the stack, where these layers run, the 64-row splits lose 1.2-1.8 us a layer (the table above). "
           "Compiled for sm_90 on the CPU (`kernel_sm90_mma.py`, `raw/kernel_sm90_mma_qkv_split_fiftyfirst.txt`), "
           f"the 12-layer stack spills {spills[0]} and {spills[1]} bytes at 22 and 10 tokens, {spills[2]} and "
           f"{spills[3]} with the atomic split, at 255 registers a thread either way; whether the spills are what "
           "costs the stack its extra time was not measured.",
           "- The server's launch profiled twice in call 2 (as the default and by name) gives the spread of one "
           f"launch: {totals['server_default'][22]:.2f} and {totals['server'][22]:.2f} us at 22 tokens.",
           f"- The LM's layer at one row, chained (28 layers, context 300; `kernel_lm_layer.py --rows 1 --sweep 1`): "
           f"{lm['parts']['default']:.2f} us as served, {lm['parts']['qkv64_split2']:.2f} with the partials and "
           f"64-row tiles, {lm['parts']['qkv32_split2']:.2f} with 32-row ones (call 2); "
           f"{lm['sums']['default']:.2f} and {lm['sums']['qkv64_split2']:.2f} with the atomic sums (call 3); one "
           f"run each. Its QKV phase is longer ({lm_qkv:.2f} us at one row in call 2's profile, a K of 2048), which "
           "may be why the split helps it a little where it does not help LocDiT's.", "",
           "**The engine, a lone request** (`engine_loop.py --checkpoint /tmp/full --max-batch 1 --steps 200 "
           "--timestep-buckets 10,100`, one process per row, in the order listed; `raw/engine_loop_qkv_"
           "{parts,split}_*_fiftyfirst.json`):", "",
           "| call | run | steps/s | GPU ms a step (median) |", "|---|---|---|---|"]
    labels = {"parts": {"base": "as served", "split": "the LMs' QKV split (partials, 64-row tiles; "
                        "`--lm-launch split_qkv=2 --lm-launch blocks=(64,64,64,64)`)", "base2": "as served"},
              "sums": {"base": "as served", "both": "every QKV split (atomic sums, 64-row tiles; LocDiT/LocEnc "
                       "and the LMs)", "base2": "as served"}}
    for k, call in (("parts", 1), ("sums", 3)):
        md += [f"| {call} | {labels[k][r]} | {engine[k][r]['steps_per_s']:.1f} | {engine[k][r]['gpu_step_ms']:.3f} |"
               for r in labels[k]]
    gain_lm = engine["parts"]["split"]["steps_per_s"] / base_e["parts"]
    loss = engine["sums"]["both"]["steps_per_s"] / base_e["sums"]
    md += ["",
           f"- The LMs' split alone, one run: {gain_lm:.4f}x the mean of its call's two plain runs (its GPU step "
           f"{1e3 * (engine['parts']['base']['gpu_step_ms'] - engine['parts']['split']['gpu_step_ms']):.0f} us "
           "shorter than the first's), about the 36 layers' 0.7 us each. The two plain runs differ by 0.1%, and "
           "the same kernels have spread 0.7% between earlier sessions' runs. Dropped: 0.45% at best, for a "
           "second sum path in both attention kernels. With LocDiT's and LocEnc's split too: "
           f"{loss:.3f}x, slower, as their stacks were. Dropped.", "",
           "**The audio thread's rounds held for more chunks** (call 4). Issue 17's second lever asks for the VAE "
           "batched across the streams with a chunk ready. The decoder's audio thread takes whatever is queued "
           "each round: what came while the last round ran (how much at 64 streams was not measured). The "
           "patch let a round wait up to N ms, until 256 patches were queued (`vae_streams.MAX_GRAPH_PATCHES`, "
           "the largest decode with a CUDA graph), but never for a request's first three chunks, its end, a "
           "request put back for want of a stream slot, a first-audio fence or a stop "
           "(`StreamAudio(hold_s=, hold_patches=)`, decoder parameters `audio_hold_ms`, `audio_hold_patches`, "
           "default off; its CPU test was mutation-checked on the first chunks, the end, the fence and the patch "
           "count). In process, with the server's settings (`closed_loop.py --checkpoint /tmp/full --clients 64 "
           "--requests 3 --rounds 3 --max-batch 64 --settings behind,hold50,hold100`, the settings' order "
           "rotating; `raw/closed_loop_hold_fiftyfirst.{json,log}`), x real time:", "",
           "| rounds | round 1 | round 2 | round 3 | median | over the server's |", "|---|---|---|---|---|---|"]
    md += [f"| {label} | " + " | ".join(f"{x:.1f}" for x in hold[k]["xrt"]) + f" | {med[k]:.1f} | "
           f"{med[k] / med['behind']:.3f}x |" for k, label in HOLDS.items()]
    lo, hi = min(hold["behind"]["xrt"]), max(hold["behind"]["xrt"])
    md += ["",
           f"- Both holds' medians fall inside the server's own rounds ({lo:.1f} to {hi:.1f}x): no gain to tell "
           "from the spread, so the parameter was not added and no served run was spent on it. A likely reason: the "
           "closed loop's clients (like the served burst's) run in near-lockstep waves, so their 16-patch chunks "
           "fill in the same step and a round already takes them all (the thirtieth session's trace saw 64 x 16 "
           "decodes); a hold has little left to gather there. Staggered (Poisson) arrivals were not run. These "
           "rounds are also short (3 requests of 100 steps per client, about 5.4 s), and a 100-step request has "
           "only five chunks after its first three.",
           f"- In process the 64 clients make {med['behind']:.0f}x, against the engine's {engine_b64:.0f}x at batch "
           f"64 (the forty-eighth session): {med['behind'] / engine_b64:.2f} before any serving cost, under the "
           f"{ISSUE_RATIO} the issue asks of the served path (served: {last['served_over_engine_c64']:.3f}).", "",
           "**Against issue 17's targets**: unchanged (the server's code is the forty-eighth session's). "
           f"{missed_targets(last)}", "",
           "![fifty-first session: LocDiT's and LocEnc's stacks with the QKV split; the closed loop's rounds "
           "with the audio "
           "hold](results_fifty_first.png)", ""]
    _plot(stack, hold)
    return md


def _plot(stack, hold):
    """Left: us per stacked layer, the server's and split, per token count; right: the closed loop's rounds."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    series = [("the server's (call 2)", "tab:gray", [stack["server_parts_call"][m] for m in TOKENS]),
              ("partials, 32-row QKV", "tab:orange", [stack["parts_qkv32"][m] for m in TOKENS]),
              ("partials, 64-row QKV", "tab:red", [stack["parts_qkv64"][m] for m in TOKENS]),
              ("the server's (call 3)", "tab:olive", [stack["server_sums_call"][m] for m in TOKENS]),
              ("atomic sums, 64-row QKV", "tab:blue", [stack["sums_qkv64"][m] for m in TOKENS])]
    paired_bars(a, ["LocDiT, 22 tokens", "LocEnc, 10 tokens"], series, lambda v: f"{v:.1f}")
    a.set_ylabel("us per layer (stack of 12)")
    a.set_ylim(0, 38)
    a.legend(fontsize=7, loc="upper center", ncol=3)
    runs = [(f"{k}, round {i + 1}", x) for k in HOLDS for i, x in enumerate(hold[k]["xrt"])]
    colors = [c for c in ("tab:gray", "tab:orange", "tab:blue") for _ in range(3)]
    run_bars(b, runs, colors, (540, 585), "x real time, 64 clients in process")
    save_panels(fig, (a, b), "fifty-first session (H200): the QKV split and the audio hold, dropped",
                "results_fifty_first.png")
