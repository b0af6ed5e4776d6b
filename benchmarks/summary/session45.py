"""results.md: the forty-fifth session's section, and results_forty_fifth.png."""

import re

from summary.issue17 import ISSUE_RATIO, ISSUE_RTF, ISSUE_TTFA, ISSUE_TTFA95_64, ISSUE_XRT64, ISSUE_XRT8, met, ok_c64
from summary.plots import pyplot, save_panels
from summary.raw import (AUDIO_S_PER_STEP, layer_us, load, phase_spans, served_levels, served_summary, served_table,
                         tests_passed, text)

# engine_loop.py runs: (key, label, bucket, file), in each call's order
LOOPS_45 = [("c1_unswapped", "call 1: unswapped (the forty-fourth session's launch)", 1,
             "engine_loop_base_fortyfifth.json"),
            ("c1_swapped", "call 1: swapped", 1, "engine_loop_swap_fortyfifth.json"),
            ("c2_swapped", "call 2: swapped", 1, "engine_loop_base_call2_fortyfifth.json"),
            ("c2_pf4", "call 2: swapped, prefetch 4 (LM too)", 1, "engine_loop_pf4_call2_fortyfifth.json"),
            ("c2_pf2", "call 2: swapped, prefetch 2 (LM too)", 1, "engine_loop_pf2_call2_fortyfifth.json"),
            ("c4_now", "call 4: this code", 2, "engine_loop_b2_now_fortyfifth.json"),
            ("c4_old", "call 4: the forty-fourth session's launch", 2, "engine_loop_b2_old_fortyfifth.json"),
            ("c4_nopf", "call 4: this code without the prefetch", 2, "engine_loop_b2_nopf_fortyfifth.json")]
GEMMS = {"qkv": "QKV", "o (split K)": "output", "gate/up+silu": "gate/up", "down (split K)": "down"}


def _lm(name: str, key: str = "us") -> dict:
    return {r["rows"]: {k: v[key] for k, v in r.get("launches", {}).items() if key in v} for r in load(name)["rows"]}


def _profiles(name: str) -> list:
    """kernel_fused_layer.py's phase profiles -> [(tokens, swap, prefetch, total us, {phase: span us})]."""
    return [(p["M"], p["launch"].get("swap", False), p["launch"].get("prefetch") or 0, p["total_us"],
             phase_spans(p)) for p in load(name)["persistent_profiles"]]


def _loop(name: str) -> dict:
    run = load(name)["runs"][0]
    return {"steps_per_s": run["steps_per_s_whole_request"], "gpu_step_ms": run["median"]["gpu_step_ms"]}


def _sm90(name: str = "kernel_sm90_mma_fortyfifth.txt") -> list:
    """kernel_sm90_mma.py's output -> [(tokens, swapped, prefetch lines, wgmma, mma.sync)]."""
    pat = r"(\d+) tokens .*'SWAP': (\w+), 'PF_O': (\d+).*: wgmma (\d+), mma.sync (\d+)"
    return [(int(m[1]), m[2] == "True", int(m[3]), int(m[4]), int(m[5])) for m in re.finditer(pat, text(name))]


def _range(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.1f}-{hi:.1f}"


def forty_fifth_session(res) -> list[str]:
    """2026-12-01 (issue 17): the persistent layer's products swapped onto Hopper's warpgroup MMA below 64 token
    rows and its next GEMM items' first K tiles prefetched into L2 (kept), per layer and in the engine at a lone
    request's buckets of 1 and 2; served at 1, 8 and 64 streams on the intermediate commit. Sets res["forty_fifth"],
    returns the markdown, draws results_forty_fifth.png."""
    swap1 = layer_us("kernel_fused_layer_swap_fortyfifth.json")
    pf2 = layer_us("kernel_fused_layer_prefetch_fortyfifth.json")
    lm1, lm2 = _lm("kernel_lm_layer_swap_fortyfifth.json"), _lm("kernel_lm_layer_prefetch_fortyfifth.json")
    lm_diff = max(v for name in ("kernel_lm_layer_swap_fortyfifth.json", "kernel_lm_layer_prefetch_fortyfifth.json")
                  for rows in _lm(name, "max_abs_diff").values() for v in rows.values())
    fp8, fp8_diff = _lm("kernel_lm_layer_fp8_swap_fortyfifth.json")[1], \
        _lm("kernel_lm_layer_fp8_swap_fortyfifth.json", "max_abs_diff")[1]["fp8_swap"]
    u22, u10, s22, s10 = (p[4] for p in _profiles("kernel_fused_layer_swap_fortyfifth.json"))
    p_swapped2, _, p_pf4, _ = _profiles("kernel_fused_layer_prefetch_fortyfifth.json")
    sm90 = {(t, s): (wg, ms) for t, s, _, wg, ms in _sm90()}
    loops = {key: (label, bucket, _loop(name)) for key, label, bucket, name in LOOPS_45}
    r = {key: v[2] for key, v in loops.items()}
    gain_b2 = r["c4_now"]["steps_per_s"] / r["c4_old"]["steps_per_s"]
    engine = {x["batch"]: x for x in load("offline_b64_b1_fortyfifth.json")["engine"]["graphs"]["runs"]}
    served = served_levels("served_r10_call3_fortyfifth.json")
    ratio = served[64]["x_real_time"] / engine[64]["aggregate_xrt"]
    fatal = text("served_r10_call3_fortyfifth_tritonserver.log").count("Fatal Python error")
    tests = tests_passed("gpu_tests_fortyfifth.txt")
    b1_44 = res["forty_fourth"]["engine_b1_steps_per_s"]
    rtf_b2 = 1 / (r["c4_now"]["steps_per_s"] * AUDIO_S_PER_STEP)
    served_step_over_engine = res["forty_third"]["served"]["1"]["ms_per_step"] * \
        res["forty_third"]["engine_b1"]["now, run 3"]["steps_per_s"] / 1000
    lm_gain = [lm1[n]["default"] - lm1[n]["swap"] for n in (1, 8)] + \
              [lm2[n]["unswapped"] - lm2[n]["default"] for n in (1, 8)]
    wide = {"LocDiT at 22 tokens": (swap1[22]["persistent_swap64"], swap1[22]["persistent_swap"]),
            "LocEnc at 10": (swap1[10]["persistent_swap64"], swap1[10]["persistent_swap"]),
            "the LM at one row": (lm1[1]["swap_qkv64"], lm1[1]["swap"]),
            "the LM at eight": (lm1[8]["swap_qkv64"], lm1[8]["swap"])}
    wide_faster = [k for k, (w, d) in wide.items() if w < d]
    lm_best_pf = {n: min((k for k in lm2[n] if k.startswith("pf")), key=lm2[n].get) for n in (1, 8)}
    pf8_slower = all(pf2[t]["persistent_pf8"] > pf2[t]["persistent"] for t in (22, 10)) and \
        all(lm2[n]["pf8"] > lm2[n]["default"] for n in (1, 8))
    res["forty_fifth"] = {
        "device": "NVIDIA H200",
        "layer_us": {"call1": swap1, "call2": pf2},
        "lm_layer_us": {"call1": lm1, "call2": lm2, "fp8_row": fp8},
        "sm90_compile_wgmma_mma_sync": {f"{t} tokens{' swapped' if s else ''}": v for (t, s), v in sm90.items()},
        "engine_loop_steps_per_s": [{"run": label, "bucket": b, **x} for label, b, x in loops.values()],
        "engine_b2_now_over_forty_fourth_launch": gain_b2,
        "engine_b2_rtf_in_process": rtf_b2,
        "served_commit_1b3fabf_requests_10": {c: served_summary(lv) for c, lv in served.items()},
        "engine_same_call": {"xrt_b64": engine[64]["aggregate_xrt"], "steps_per_s_b1": engine[1]["steps_per_s"]},
        "served_over_engine_c64_same_call": ratio,
        "gpu_tests": tests,
    }
    md = ["", "## Forty-fifth session (2026-12-01, H200): the persistent layer's products on Hopper's warpgroup MMA, "
          f"its next tiles asked of L2 before each barrier: a lone request's engine step {gain_b2:.3f}x", "",
          "Four device calls (all 30 min). The persistent layer kernel is about 90% of a lone request's step. "
          "Compiled for sm_90 on this machine (new: `benchmarks/kernel_sm90_mma.py`, no GPU needed; "
          f"`raw/kernel_sm90_mma_fortyfifth.txt`), its 22-token LocDiT layer multiplies with {sm90[(22, False)][1]} "
          f"`mma.sync` and {sm90[(22, False)][0]} warpgroup MMAs (`wgmma`). Triton gives a product wgmma only from "
          "64 rows on its M side, and a few tokens' rows never get there. This fits the forty-third session's Nsight "
          "Compute profile, where gate/up spent 41% of its stall samples on tensor-core instructions. Two changes "
          "were kept:", "",
          "- **Swapped products** (`Launch.swap`). Below 64 token rows the kernel multiplies W x^T instead of "
          "x W^T, so the weight tile is the product's M side. Gate/up stacks its 32 gate rows over its 32 up rows "
          "into one 64-row tile, one product; that tile and the LM's 64-column output and down tiles reach wgmma, "
          "QKV's 32-row tiles do not. From 64 token rows the tokens' own tile takes wgmma: the 44-token layer (a "
          f"lone request, padded to 2 rows) compiles to {sm90[(44, False)][0]} wgmma as it is, and swapped to "
          f"{sm90[(44, True)][0]} wgmma and {sm90[(44, True)][1]} `mma.sync`.",
          "- **First K tiles prefetched into L2** (`Launch.prefetch`). In the phase before each GEMM phase, every "
          "program issues a `prefetch.global.L2` for each line of its next item's first K tiles. LocDiT and LocEnc "
          "ask for two tiles, the LM's wider layers for one. A chained layer starts at QKV, so its QKV weights are "
          "not asked for.",
          "- `choose_launch` turns them on with 16-bit weights on compute capability 9.x, up to 64 token rows "
          "(swap: below 64), the sizes measured. e4m3 layers keep neither. Swapped, the LM's e4m3 layer at one row "
          f"took {fp8['fp8_swap']:.1f} us against {fp8['default']:.1f} (call 2), and its output differed from the "
          f"default launch's by up to {fp8_diff:.4g} over 28 layers. The prefetch was not measured with e4m3 "
          "weights.", "",
          "**Per layer** (12 LocDiT/LocEnc layers or 28 LM layers in a CUDA graph, us per layer; "
          "`kernel_fused_layer.py --no-sweep --tokens 22,10`, `kernel_lm_layer.py --rows 1,8 --sweep 1,8`; "
          "`raw/kernel_{fused,lm}_layer_{swap,prefetch}_fortyfifth.json`). Call 1 ran the kernel change before "
          "`choose_launch` swapped anything, so its default was unswapped; from call 2 on the default was swapped:",
          "", "| launch | LocDiT 22 tokens | LocEnc 10 tokens | LM 1 row | LM 8 rows |", "|---|---|---|---|---|",
          f"| unswapped (call 1) | {swap1[22]['persistent']:.2f} | {swap1[10]['persistent']:.2f} | "
          f"{lm1[1]['default']:.2f} | {lm1[8]['default']:.2f} |",
          f"| swapped (call 1) | {swap1[22]['persistent_swap']:.2f} | {swap1[10]['persistent_swap']:.2f} | "
          f"{lm1[1]['swap']:.2f} | {lm1[8]['swap']:.2f} |",
          "| swapped, 64-row tiles in more phases (LocDiT/LocEnc: QKV, output and down, K split 8; LM: QKV) "
          f"(call 1) | {swap1[22]['persistent_swap64']:.2f} | {swap1[10]['persistent_swap64']:.2f} | "
          f"{lm1[1]['swap_qkv64']:.2f} | {lm1[8]['swap_qkv64']:.2f} |",
          f"| unswapped (call 2) | {pf2[22]['persistent_unswapped']:.2f} | {pf2[10]['persistent_unswapped']:.2f} | "
          f"{lm2[1]['unswapped']:.2f} | {lm2[8]['unswapped']:.2f} |",
          f"| swapped (call 2) | {pf2[22]['persistent']:.2f} | {pf2[10]['persistent']:.2f} | {lm2[1]['default']:.2f} | "
          f"{lm2[8]['default']:.2f} |",
          f"| swapped, gate/up 64 columns (call 2) | {pf2[22]['persistent_gu64']:.2f} | "
          f"{pf2[10]['persistent_gu64']:.2f} | | |"]
    for n in (1, 2, 4, 8):
        md.append(f"| swapped, prefetch {n} K tile{'s' if n > 1 else ''} (call 2) | {pf2[22][f'persistent_pf{n}']:.2f} "
                  f"| {pf2[10][f'persistent_pf{n}']:.2f} | {lm2[1][f'pf{n}']:.2f} | {lm2[8][f'pf{n}']:.2f} |")
    md += ["",
           f"- Swapped, LocDiT's layer at 22 tokens is {swap1[22]['persistent'] / swap1[22]['persistent_swap']:.3f}x "
           f"faster in call 1 and {pf2[22]['persistent_unswapped'] / pf2[22]['persistent']:.3f}x in call 2. "
           f"LocEnc's at 10 tokens gains less ({pf2[10]['persistent_unswapped'] / pf2[10]['persistent']:.3f}x; its "
           f"gate/up phase {u10['gate/up+silu']:.2f} -> {s10['gate/up+silu']:.2f} us). The LM's "
           f"layers gain {_range(lm_gain)} us.",
           "- 64-row tiles in more phases were faster than the swapped default for "
           + (", ".join(f"{k} ({wide[k][0]:.2f} against {wide[k][1]:.2f} us)" for k in wide_faster) or "no layer")
           + (", slower for the rest." if len(wide_faster) < len(wide) else "."),
           f"- Two prefetched tiles take LocDiT's layer to {pf2[22]['persistent_pf2']:.2f} us "
           f"({pf2[22]['persistent'] / pf2[22]['persistent_pf2']:.3f}x over swapped alone) and LocEnc's to "
           f"{pf2[10]['persistent_pf2']:.2f}. For the LM the fastest was "
           + " and ".join(f"{lm_best_pf[n][2:]} tile{'s' if lm_best_pf[n] != 'pf1' else ''} at {w}"
                          for n, w in ((1, "one row"), (8, "eight"))) + ". Eight tiles were "
           f"{'slower than none in every column' if pf8_slower else 'not slower everywhere'}.",
           "- Outputs: every bf16 LM variant "
           + ("equals the default launch to the bit (max abs difference 0.0" if lm_diff == 0 else
              f"differs from the default launch by at most {lm_diff:.3g} (max abs difference")
           + ", both sweeps). LocDiT's differ from the eager PyTorch layer as much as the default's "
           "(`max_err_vs_eager` in the JSON).", "",
           "Phase profiles (`persistent_layer.layer(timings=)`, the GPU's global timer, whose spans come in steps of "
           "about 0.26 us; unchained, so the first norm runs; prefetch 4 is the only prefetching launch profiled):", "",
           "| tokens | launch | total | norm | qkv | attention | o | sum+norm | gate/up | down | sum |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    profs = _profiles("kernel_fused_layer_swap_fortyfifth.json") + \
        _profiles("kernel_fused_layer_prefetch_fortyfifth.json")
    for i, (m, swap, pf, total, ph) in enumerate(profs):
        launch = ("swapped" if swap else "unswapped") + (f", prefetch {pf}" if pf else "")
        md.append(f"| {m} | {launch} (call {1 if i < 4 else 2}) | {total:.2f} | "
                  + " | ".join(f"{v:.2f}" for v in ph.values()) + " |")
    s2, p4 = p_swapped2[4], p_pf4[4]
    md += ["",
           f"- Swapping cuts only gate/up at 22 tokens ({u22['gate/up+silu']:.2f} -> {s22['gate/up+silu']:.2f} us), "
           "the one LocDiT phase whose tile reaches 64 rows.",
           "- Against the swapped profile of the same call, prefetching 4 tiles shortens the GEMM phases ("
           + ", ".join(f"{name} {s2[k]:.2f} -> {p4[k]:.2f}" for k, name in GEMMS.items())
           + " us). The phases that issue the prefetches get longer: the first norm (QKV's) "
           f"{s2['norm']:.2f} -> {p4['norm']:.2f}, attention {s2['attention']:.2f} -> {p4['attention']:.2f} us, the "
           f"second norm {s2['sum+residual+norm']:.2f} -> "
           f"{p4['sum+residual+norm']:.2f}. These are differences of one to four timer steps. Per layer, four tiles "
           "cost more than they save and two do not (the table above); two were not profiled.", "",
           "**The engine, a lone request** (`engine_loop.py --checkpoint /tmp/full --steps 200 --timestep-buckets "
           "10,100`, a 200-step request after a warm-up, one process per row; `raw/engine_loop_*_fortyfifth.json`).",
           "- Calls 1 and 2 ran the engine with `max_batch_size` 1, which puts the request in a bucket of 1 (LocDiT "
           "at 22 tokens). Call 1's tree swapped only on `--launch swap=True`. Call 2's swapped by default and took "
           "`--launch prefetch=N` for every layer, so its prefetching rows asked for N tiles in the LM too, where this "
           "code asks for one.",
           "- The server has no bucket of 1: a lone request runs padded to 2 rows, LocDiT at 44 tokens. There the "
           "unswapped kernel is on wgmma already and the swapped one mostly on `mma.sync` (the compile above). Call "
           "3's `bench.py` batch 1 (bucket 2) made "
           f"{engine[1]['steps_per_s']:.1f} steps/s on the commit that swapped at every size (1b3fabf), against "
           f"{b1_44:.1f} in the forty-fourth session on another machine. There was no same-call A/B of swapping at "
           "44 tokens. So swapping stops below 64 token rows (2404aee).",
           "- Call 4 ran the server's bucket (`--max-batch 2`, new) on this code:", "",
           "| run | bucket | steps/s over the request | GPU ms per step (median) |", "|---|---|---|---|"]
    for label, bucket, x in loops.values():
        md.append(f"| {label} | {bucket} | {x['steps_per_s']:.1f} | {x['gpu_step_ms']:.3f} |")
    now, old, nopf = r["c4_now"], r["c4_old"], r["c4_nopf"]
    md += ["",
           f"- In the server's bucket this code makes {gain_b2:.3f}x the forty-fourth session's launch "
           f"({now['steps_per_s']:.1f} against {old['steps_per_s']:.1f} steps/s; GPU step {old['gpu_step_ms']:.3f} -> "
           f"{now['gpu_step_ms']:.3f} ms). Without the prefetch it makes {nopf['steps_per_s']:.1f}. In this bucket "
           "the swap covers only the LM's 2 rows and LocEnc's 10 tokens (LocDiT's 44 stay unswapped) and gains "
           "nothing measurable; the prefetch is the gain. One run each, in one call.",
           f"- In a bucket of 1 the swap gave {r['c1_swapped']['steps_per_s'] / r['c1_unswapped']['steps_per_s']:.3f}x "
           f"(call 1), and two prefetched tiles everywhere "
           f"{r['c2_pf2']['steps_per_s'] / r['c2_swapped']['steps_per_s']:.3f}x more (call 2; four: "
           f"{r['c2_pf4']['steps_per_s'] / r['c2_swapped']['steps_per_s']:.3f}x). That run "
           f"({r['c2_pf2']['steps_per_s']:.1f} steps/s) beats bucket 2 on this code ({now['steps_per_s']:.1f}), in "
           "another call on another machine. This is the next lead for one stream: a bucket of 1 in the server. The "
           "cost is a batch dimension of 1 that torch.compile specialises, so start-up gets longer. Neither start-up "
           "nor the served stream was measured.",
           f"- In process, this code's bucket 2 is RTF {rtf_b2:.4f} ({AUDIO_S_PER_STEP} s of audio a step). In the "
           f"forty-third session the served step was {served_step_over_engine:.2f}x the engine's, which would put one "
           f"served stream near {rtf_b2 * served_step_over_engine:.3f}. It was not served: the device time ran "
           "out.", "",
           "**Served, on the intermediate commit 1b3fabf** (call 3: `SET=\"decoder.timestep_buckets=10,100\" "
           "LEVELS=1,8,64 REQUESTS=10 bash benchmarks/run_served_gpu.sh`, then `bench.py --checkpoint /tmp/full "
           "--timestep-buckets 10,100 --reference none --no-vae --graphs-only --no-profile --batches 64,1` in the "
           "same call; `raw/served_r10_call3_fortyfifth.*`, `raw/offline_b64_b1_fortyfifth.*`).",
           "- That commit swapped at every token count and prefetched at every size; this code does neither past 64 "
           "rows. They differ in LocDiT's 44 tokens at one stream and LocEnc's 40 at 8 streams.",
           "- At 64 streams no decode step runs a persistent layer (LocDiT 1,408 tokens, LocEnc 320, 64 LM rows: all "
           "past the kernel's bounds). So that level and the engine's batch 64 stand for this code too.", "",
           *served_table(served)]
    ok64 = ok_c64(served[64])
    md += ["",
           f"- Engine alone, same call: batch 64 {engine[64]['aggregate_xrt']:.1f}x, batch 1 "
           f"{engine[1]['steps_per_s']:.1f} steps/s. Served over engine at 64 streams: "
           f"{served[64]['x_real_time']:.1f} / {engine[64]['aggregate_xrt']:.1f} = {ratio:.3f}.",
           f"- The server's log: {fatal} fatal Python errors.",
           "- GPU tests on 1b3fabf (call 3, `raw/gpu_tests_fortyfifth.txt`): `tests/test_persistent_layer.py -k "
           "'(layer_matches and 1024) or every_launch or stacked or paged_layer_matches or compiles_captures'`, "
           f"{tests}. They ran the swapped, prefetching kernel against the PyTorch layer at LocDiT's 22, 44 and 88 "
           "tokens, LocEnc's 10 and 80, and the LM's paged rows, compiled, captured and replayed.",
           "- The review's changes after call 4 ran on the CPU only: each phase's prefetch line count comes from the "
           "host (a power of two), one helper applies the e4m3 scale and the transpose, and the prefetch stops past "
           "64 token rows (LocDiT's 88 and LocEnc's 80 were never measured with it). Compiled for sm_90, the "
           "measured launches give the same instruction counts as before. The new test of e4m3 weights in swapped "
           "products runs under the interpreter.", "",
           "**Against issue 17's targets.** These are this session's figures; the capacity and the 128-stream sweep "
           "are the forty-fourth session's.", "",
           "| target | measured | status |", "|---|---|---|",
           f"| one stream RTF <= {ISSUE_RTF} | {served[1]['rtf']['p50']:.4f} served on 1b3fabf; {rtf_b2:.4f} in "
           f"process on this code | {met(min(served[1]['rtf']['p50'], rtf_b2) <= ISSUE_RTF)} |",
           f"| one stream TTFA p50 <= {ISSUE_TTFA} ms | {served[1]['ttfa_ms']['p50']:.1f} ms (1b3fabf) | "
           f"{met(served[1]['ttfa_ms']['p50'] <= ISSUE_TTFA)} |",
           f"| 8 streams >= {ISSUE_XRT8}x | {served[8]['x_real_time']:.1f}x (1b3fabf) | "
           f"{met(served[8]['x_real_time'] >= ISSUE_XRT8)} |",
           f"| 64 streams >= {ISSUE_XRT64}x / smooth 100% / TTFA p95 <= {ISSUE_TTFA95_64} ms | "
           f"{served[64]['x_real_time']:.1f}x / {served[64]['smooth_playback_frac']:.0%} / "
           f"{served[64]['ttfa_ms']['p95']:.0f} ms | {met(ok64)} |",
           f"| served / engine at 64 >= {ISSUE_RATIO} | {ratio:.3f} | {met(ratio >= ISSUE_RATIO)} |", "",
           "The headline keys of results.json stay the forty-fourth session's (a full sweep on one commit).", "",
           "![forty-fifth session: per-layer launches and the lone request's engine step](results_forty_fifth.png)", ""]
    _plot(pf2, lm2, list(loops.values()))
    return md


def _plot(pf2, lm2, loops):
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    groups = ["LocDiT 22 tokens", "LocEnc 10 tokens", "LM 1 row", "LM 8 rows"]
    series = [("unswapped", [pf2[22]["persistent_unswapped"], pf2[10]["persistent_unswapped"], lm2[1]["unswapped"],
                             lm2[8]["unswapped"]]),
              ("swapped", [pf2[22]["persistent"], pf2[10]["persistent"], lm2[1]["default"], lm2[8]["default"]]),
              ("swapped + prefetch (2 local, 1 LM)", [pf2[22]["persistent_pf2"], pf2[10]["persistent_pf2"],
                                                     lm2[1]["pf1"], lm2[8]["pf1"]])]
    w = 0.27
    for i, (label, ys) in enumerate(series):
        xs = [g + (i - 1) * w for g in range(len(groups))]
        a.bar(xs, ys, w, label=label)
        for x, y in zip(xs, ys):
            a.text(x, y + 0.3, f"{y:.1f}", ha="center", fontsize=7)
    a.set_xticks(range(len(groups)), groups, fontsize=8)
    a.set_ylabel("us per layer (call 2)")
    a.legend(fontsize=7, loc="upper left")
    labels = [f"b{bucket}: {label}" for label, bucket, _ in loops]
    ys = [x["steps_per_s"] for _, _, x in loops]
    colors = ["tab:gray" if "forty-fourth" in label or "unswapped" in label else
              ("tab:green" if label.endswith("this code") else "tab:blue") for label, _, _ in loops]
    b.barh(range(len(ys)), ys, color=colors)
    for y, v in enumerate(ys):
        b.text(v + 0.3, y, f"{v:.1f}", va="center", fontsize=7)
    b.set_yticks(range(len(ys)), labels, fontsize=7)
    b.invert_yaxis()
    b.set_xlim(170, 192)
    b.set_xlabel("engine steps/s, lone request (engine_loop.py; b = bucket)")
    save_panels(fig, (a, b), "forty-fifth session (H200): swapped products and L2 prefetch in the persistent layer",
                "results_forty_fifth.png")
