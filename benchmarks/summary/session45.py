"""results.md: the forty-fifth session's section, and results_forty_fifth.png."""

from summary.plots import pyplot, save_panels
from summary.raw import load, served_levels, served_summary, tests_passed, text

# engine_loop.py runs: (label, bucket, file), in each call's order
LOOPS_45 = [("call 1: unswapped (the forty-fourth session's launch)", 1, "engine_loop_base_fortyfifth.json"),
            ("call 1: swapped", 1, "engine_loop_swap_fortyfifth.json"),
            ("call 2: swapped", 1, "engine_loop_base_call2_fortyfifth.json"),
            ("call 2: swapped, prefetch 4", 1, "engine_loop_pf4_call2_fortyfifth.json"),
            ("call 2: swapped, prefetch 2", 1, "engine_loop_pf2_call2_fortyfifth.json"),
            ("call 4: this code", 2, "engine_loop_b2_now_fortyfifth.json"),
            ("call 4: the forty-fourth session's launch", 2, "engine_loop_b2_old_fortyfifth.json"),
            ("call 4: this code without the prefetch", 2, "engine_loop_b2_nopf_fortyfifth.json")]
ISSUE_RTF, ISSUE_XRT8, ISSUE_XRT64, ISSUE_TTFA, ISSUE_TTFA95_64, ISSUE_RATIO = 0.025, 150, 500, 25, 300, 0.85
AUDIO_S_PER_STEP = 0.16  # 4 latent frames of 25 Hz


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


def _layers(name: str) -> dict:
    return {r["M"]: {k: v["us_per_layer"] for k, v in r.items() if isinstance(v, dict) and "us_per_layer" in v}
            for r in load(name)["layers"] if "M" in r}


def _lm(name: str) -> dict:
    return {r["rows"]: {k: v["us"] for k, v in r.get("launches", {}).items() if "us" in v} for r in load(name)["rows"]}


def _profiles(name: str) -> list:
    """kernel_fused_layer.py's phase profiles -> [(tokens, swap, prefetch, total us, {phase: span us})]."""
    return [(p["M"], p["launch"].get("swap", False), p["launch"].get("prefetch") or 0, p["total_us"],
             {q["phase"]: q["span_us"] for q in p["phases"]}) for p in load(name)["persistent_profiles"]]


def _loop(name: str) -> dict:
    run = load(name)["runs"][0]
    return {"steps_per_s": run["steps_per_s_whole_request"], "gpu_step_ms": run["median"]["gpu_step_ms"]}


def forty_fifth_session(res) -> list[str]:
    """2026-12-01 (issue 17): the persistent layer's products swapped onto Hopper's warpgroup MMA below 64 token
    rows and its next GEMM items' first K tiles prefetched into L2 (kept), measured per layer and in the engine
    at a lone request's buckets of 1 and 2; served at 1, 8 and 64 streams on the intermediate commit. Sets
    res["forty_fifth"], returns the markdown, draws results_forty_fifth.png."""
    swap1, pf2 = _layers("kernel_fused_layer_swap_fortyfifth.json"), _layers("kernel_fused_layer_prefetch_fortyfifth.json")
    lm1, lm2 = _lm("kernel_lm_layer_swap_fortyfifth.json"), _lm("kernel_lm_layer_prefetch_fortyfifth.json")
    fp8 = _lm("kernel_lm_layer_fp8_swap_fortyfifth.json")[1]
    prof = _profiles("kernel_fused_layer_swap_fortyfifth.json") + _profiles("kernel_fused_layer_prefetch_fortyfifth.json")[2:]
    loops = [(label, bucket, _loop(name)) for label, bucket, name in LOOPS_45]
    by = {label: r for label, _, r in loops}
    now, old, nopf = (by[f"call 4: {k}"] for k in ("this code", "the forty-fourth session's launch",
                                                    "this code without the prefetch"))
    gain_b2 = now["steps_per_s"] / old["steps_per_s"]
    engine = {r["batch"]: r for r in load("offline_b64_b1_fortyfifth.json")["engine"]["graphs"]["runs"]}
    served = served_levels("served_r10_call3_fortyfifth.json")
    ratio = served[64]["x_real_time"] / engine[64]["aggregate_xrt"]
    log = text("served_r10_call3_fortyfifth_tritonserver.log")
    fatal = log.count("Fatal Python error")
    tests = tests_passed("gpu_tests_fortyfifth.txt")
    rtf_b2 = 1 / (now["steps_per_s"] * AUDIO_S_PER_STEP)
    res["forty_fifth"] = {
        "device": "NVIDIA H200",
        "layer_us": {"locdit_22": pf2[22], "locenc_10": pf2[10], "call1_locdit_22": swap1[22], "call1_locenc_10": swap1[10]},
        "lm_layer_us": {"call1": lm1, "call2": lm2, "fp8_row": fp8},
        "engine_loop_steps_per_s": [{"run": label, "bucket": b, **r} for label, b, r in loops],
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
          "Compiled for sm_90 on this machine (new: `benchmarks/kernel_sm90_mma.py`, no GPU needed), its "
          "22-token LocDiT layer turned out to multiply with 124 `mma.sync` and no warpgroup MMA (`wgmma`). "
          "Triton gives a product wgmma only from 64 rows on its M side, and a few tokens' rows never get there. "
          "The Nsight Compute profile of the forty-third session fits this: gate/up spent 41% of its stall samples "
          "on tensor-core instructions. Two changes were kept:", "",
          "- **Swapped products** (`Launch.swap`). Below 64 token rows the kernel multiplies W x^T instead of "
          "x W^T, so the weight tile is the product's M side. Gate/up stacks its 32 gate rows over its 32 up rows "
          "into one 64-row tile, one product. From 64 token rows the tokens' own tile takes wgmma as it is: at 44 "
          "tokens (a lone request, padded to 2 rows) the plain kernel compiles to 40 wgmma.",
          "- **First K tiles prefetched into L2** (`Launch.prefetch`). Before the barrier that starts a GEMM phase, "
          "each program issues a `prefetch.global.L2` for every line of its next item's first K tiles. LocDiT and "
          "LocEnc ask for two tiles, the LM's wider layers for one. More tiles queue behind the issuing phase's own "
          "reads, as the seventeenth session's bulk prefetch of whole phases did.",
          "- `choose_launch` turns both on with bf16 weights on compute capability 9.x only. e4m3 layers keep "
          f"neither: swapped, the LM's e4m3 layer at one row took {fp8['fp8_swap']:.1f} us against "
          f"{fp8['default']:.1f} (call 2), because its fp16-widened weights then go through registers.", "",
          "**Per layer** (12 LocDiT/LocEnc layers or 28 LM layers in a CUDA graph, us per layer; "
          "`kernel_fused_layer.py --no-sweep --tokens 22,10`, `kernel_lm_layer.py --rows 1,8 --sweep 1,8`; "
          "`raw/kernel_{fused,lm}_layer_{swap,prefetch}_fortyfifth.json`):", "",
          "| launch | LocDiT 22 tokens | LocEnc 10 tokens | LM 1 row | LM 8 rows |", "|---|---|---|---|---|",
          f"| unswapped (call 1) | {swap1[22]['persistent']:.2f} | {swap1[10]['persistent']:.2f} | "
          f"{lm1[1]['default']:.2f} | {lm1[8]['default']:.2f} |",
          f"| swapped (call 1) | {swap1[22]['persistent_swap']:.2f} | {swap1[10]['persistent_swap']:.2f} | "
          f"{lm1[1]['swap']:.2f} | {lm1[8]['swap']:.2f} |",
          f"| swapped, every GEMM tile 64 rows, K split 8 (call 1) | {swap1[22]['persistent_swap64']:.2f} | "
          f"{swap1[10]['persistent_swap64']:.2f} | {lm1[1]['swap_qkv64']:.2f} | {lm1[8]['swap_qkv64']:.2f} |",
          f"| unswapped (call 2) | {pf2[22]['persistent_unswapped']:.2f} | {pf2[10]['persistent_unswapped']:.2f} | "
          f"{lm2[1]['unswapped']:.2f} | {lm2[8]['unswapped']:.2f} |",
          f"| swapped (call 2) | {pf2[22]['persistent']:.2f} | {pf2[10]['persistent']:.2f} | {lm2[1]['default']:.2f} | "
          f"{lm2[8]['default']:.2f} |",
          f"| swapped, gate/up 64 columns (call 2) | {pf2[22]['persistent_gu64']:.2f} | {pf2[10]['persistent_gu64']:.2f} | | |"]
    for n in (1, 2, 4, 8):
        md.append(f"| swapped, prefetch {n} K tile{'s' if n > 1 else ''} (call 2) | {pf2[22][f'persistent_pf{n}']:.2f} | "
                  f"{pf2[10][f'persistent_pf{n}']:.2f} | {lm2[1][f'pf{n}']:.2f} | {lm2[8][f'pf{n}']:.2f} |")
    md += ["",
           f"- Swapped, LocDiT's layer at 22 tokens is {swap1[22]['persistent'] / swap1[22]['persistent_swap']:.3f}x "
           f"faster in call 1 and {pf2[22]['persistent_unswapped'] / pf2[22]['persistent']:.3f}x in call 2. "
           f"LocEnc's at 10 tokens gains less ({pf2[10]['persistent_unswapped'] / pf2[10]['persistent']:.3f}x; its "
           f"gate/up phase {prof[1][4]['gate/up+silu']:.2f} -> {prof[3][4]['gate/up+silu']:.2f} us). The LM's layers "
           "gain 0.7-1.4 us.",
           f"- Two prefetched tiles take LocDiT's layer to {pf2[22]['persistent_pf2']:.2f} us "
           f"({pf2[22]['persistent'] / pf2[22]['persistent_pf2']:.3f}x over swapped alone) and LocEnc's to "
           f"{pf2[10]['persistent_pf2']:.2f}. One tile suits the LM best ({lm2[1]['pf1']:.2f} us at one row). Eight "
           "tiles are slower than none everywhere.",
           "- Outputs: the LM's variants equal the default launch to the bit (max abs difference 0.0 in both sweeps); "
           "LocDiT's differ from the eager PyTorch layer as much as before (`max_err_vs_eager` in the JSON).", "",
           "Phase profiles (`persistent_layer.layer(timings=)`, the GPU's global timer; us; unchained, so the first "
           "norm runs; prefetch 4, the only prefetching launch profiled):", "",
           "| tokens | launch | total | norm | qkv | attention | o | sum+norm | gate/up | down | sum |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, (m, swap, pf, total, ph) in enumerate(prof):
        call = 1 if i < 4 else 2
        launch = ("swapped" if swap else "unswapped") + (f", prefetch {pf}" if pf else "")
        md.append(f"| {m} | {launch} (call {call}) | {total:.2f} | " + " | ".join(f"{v:.2f}" for v in ph.values()) + " |")
    p22, pf22 = prof[2][4], prof[4][4]
    md += ["",
           f"- Swapping cuts only gate/up at 22 tokens ({prof[0][4]['gate/up+silu']:.2f} -> {p22['gate/up+silu']:.2f} "
           "us): it is the one phase whose stacked tile reaches 64 rows. QKV, output and down keep 32-row tiles and "
           "`mma.sync`. A variant with 64-row tiles for every phase (more K splits to keep the items) was no faster "
           "per layer.",
           "- Prefetching speeds every GEMM phase (QKV, output, gate/up, down: "
           + ", ".join(f"{p22[k]:.2f} -> {pf22[k]:.2f}" for k in ("qkv", "o (split K)", "gate/up+silu", "down (split K)"))
           + " us). The phases that issue the prefetches slow down (attention "
           f"{p22['attention']:.2f} -> {pf22['attention']:.2f}, the second norm {p22['sum+residual+norm']:.2f} -> "
           f"{pf22['sum+residual+norm']:.2f}). With four tiles that costs more than it saves; with two it does not "
           "(the table above).", "",
           "**The engine, a lone request** (`engine_loop.py --checkpoint /tmp/full --steps 200 --timestep-buckets "
           "10,100`, a 200-step request after a warm-up, one process per row; `raw/engine_loop_*_fortyfifth.json`). "
           "Calls 1 and 2 ran the engine with `max_batch_size` 1, which puts the request in a bucket of 1 (LocDiT at 22 "
           "tokens). The server has no bucket of 1: a lone request runs padded to 2 rows, LocDiT at 44 tokens, where "
           "the unswapped kernel already multiplies with wgmma. Call 3 showed this: `bench.py`'s batch 1, bucket "
           f"2, made {engine[1]['steps_per_s']:.1f} steps/s on the commit that swapped at every size (1b3fabf), against "
           "176.2 in the forty-fourth session. So swapping stops at 64 token rows (2404aee), and call 4 measured the "
           "server's bucket (`--max-batch 2`, new):", "",
           "| run | bucket | steps/s over the request | GPU ms per step (median) |", "|---|---|---|---|"]
    for label, bucket, r in loops:
        md.append(f"| {label} | {bucket} | {r['steps_per_s']:.1f} | {r['gpu_step_ms']:.3f} |")
    md += ["",
           f"- In the server's bucket, this code makes {gain_b2:.3f}x the forty-fourth session's launch "
           f"({now['steps_per_s']:.1f} against {old['steps_per_s']:.1f} steps/s; GPU step {old['gpu_step_ms']:.3f} -> "
           f"{now['gpu_step_ms']:.3f} ms). Without the prefetch it makes {nopf['steps_per_s']:.1f}: in this bucket "
           "the swap (the LM's 2 rows, LocEnc's 10 tokens; LocDiT's 44 stay unswapped) gains nothing measurable, and "
           "the prefetch is the gain. One run each, in one call.",
           f"- In a bucket of 1 the swap gave {by['call 1: swapped']['steps_per_s'] / by['call 1: unswapped (the forty-fourth session' + chr(39) + 's launch)']['steps_per_s']:.3f}x "
           f"(call 1), and two prefetched tiles {by['call 2: swapped, prefetch 2']['steps_per_s'] / by['call 2: swapped']['steps_per_s']:.3f}x "
           f"more (call 2; four: {by['call 2: swapped, prefetch 4']['steps_per_s'] / by['call 2: swapped']['steps_per_s']:.3f}x). "
           f"Bucket 1 with both ({by['call 2: swapped, prefetch 2']['steps_per_s']:.1f} steps/s) beats bucket 2 with "
           f"this code ({now['steps_per_s']:.1f}), in another call on another machine. This is the next lead for "
           "one stream: a bucket of 1 in the server. The cost is a batch dimension of 1 that torch.compile "
           "specialises, so start-up gets longer; neither start-up nor the served stream was measured.",
           f"- In process, the final code's bucket 2 is RTF {rtf_b2:.4f} ({AUDIO_S_PER_STEP} s of audio a step). The "
           "served step has run about 1.04x the engine's (forty-third session), so served one stream should land "
           "near 0.036. It was not served: the device time ran out.", "",
           "**Served, on the intermediate commit 1b3fabf** (call 3: `SET=\"decoder.timestep_buckets=10,100\" "
           "LEVELS=1,8,64 REQUESTS=10 bash benchmarks/run_served_gpu.sh`, then `bench.py --checkpoint /tmp/full "
           "--timestep-buckets 10,100 --reference none --no-vae --graphs-only --no-profile --batches 64,1` in the "
           "same call; `raw/served_r10_call3_fortyfifth.*`, `raw/offline_b64_b1_fortyfifth.*`). That commit "
           "swapped at every token count, the final code only below 64: they differ in LocDiT's 44 tokens at one "
           "stream and LocEnc's 40 at 8 streams. At 64 streams no decode step runs a persistent layer (LocDiT 1,408 "
           "tokens, LocEnc 320, 64 LM rows: all past the kernel's bounds), so that level and the engine's batch 64 "
           "stand for this code as well.", "",
           "| streams | requests | errors | x real time | RTF p50 | TTFA p50 / p95 ms | smooth |", "|---|---|---|---|---|---|---|"]
    for n, lv in served.items():
        md.append(f"| {n} | {len(lv['streams'])} | {lv['errors']} | {lv['x_real_time']:.2f} | {lv['rtf']['p50']:.4f} | "
                  f"{lv['ttfa_ms']['p50']:.1f} / {lv['ttfa_ms']['p95']:.1f} | {lv['smooth_playback_frac']:.0%} |")
    md += ["",
           f"- Engine alone, same call: batch 64 {engine[64]['aggregate_xrt']:.1f}x, batch 1 "
           f"{engine[1]['steps_per_s']:.1f} steps/s. Served over engine at 64 streams: "
           f"{served[64]['x_real_time']:.1f} / {engine[64]['aggregate_xrt']:.1f} = {ratio:.3f}.",
           f"- The server's log: {fatal} fatal Python errors.",
           f"- GPU tests on 1b3fabf (call 3, `raw/gpu_tests_fortyfifth.txt`): `tests/test_persistent_layer.py -k "
           f"'(layer_matches and 1024) or every_launch or stacked or paged_layer_matches or compiles_captures'`, "
           f"{tests}. These ran the swapped, prefetching kernel against the PyTorch layer at LocDiT's 22, 44 and 88 "
           "tokens, LocEnc's 10 and 80, and the LM's paged rows, compiled, captured and replayed. The final code's "
           "unswapped launches from 64 rows are the forty-fourth session's, plus the prefetch hint. The hint does "
           "not change a layer's output: 0.0 difference in the LM sweeps.", "",
           "**Against issue 17's targets** (this session's figures; the capacity and the 128-stream sweep are the "
           "forty-fourth session's):", "",
           "| target | measured | status |", "|---|---|---|",
           f"| one stream RTF <= {ISSUE_RTF} | {served[1]['rtf']['p50']:.4f} served on 1b3fabf; {rtf_b2:.4f} in "
           f"process on this code | {_met(served[1]['rtf']['p50'] <= ISSUE_RTF)} |",
           f"| one stream TTFA p50 <= {ISSUE_TTFA} ms | {served[1]['ttfa_ms']['p50']:.1f} ms (1b3fabf) | "
           f"{_met(served[1]['ttfa_ms']['p50'] <= ISSUE_TTFA)} |",
           f"| 8 streams >= {ISSUE_XRT8}x | {served[8]['x_real_time']:.1f}x (1b3fabf) | "
           f"{_met(served[8]['x_real_time'] >= ISSUE_XRT8)} |",
           f"| 64 streams >= {ISSUE_XRT64}x / smooth 100% / TTFA p95 <= {ISSUE_TTFA95_64} ms | "
           f"{served[64]['x_real_time']:.1f}x / {served[64]['smooth_playback_frac']:.0%} / "
           f"{served[64]['ttfa_ms']['p95']:.0f} ms | "
           f"{_met(served[64]['x_real_time'] >= ISSUE_XRT64 and served[64]['smooth_playback_frac'] == 1 and served[64]['ttfa_ms']['p95'] <= ISSUE_TTFA95_64)} |",
           f"| served / engine at 64 >= {ISSUE_RATIO} | {ratio:.3f} | {_met(ratio >= ISSUE_RATIO)} |", "",
           "The headline keys of results.json stay the forty-fourth session's (a full sweep on one commit).", "",
           "![forty-fifth session: per-layer launches and the lone request's engine step](results_forty_fifth.png)", ""]
    _plot(pf2, lm2, loops)
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
    ys = [r["steps_per_s"] for _, _, r in loops]
    colors = ["tab:gray" if "forty-fourth" in label or "unswapped" in label else
              ("tab:green" if label.endswith("this code") else "tab:blue") for label, _, _ in loops]
    b.barh(range(len(ys)), ys, color=colors)
    for y, v in enumerate(ys):
        b.text(v + 0.3, y, f"{v:.1f}", va="center", fontsize=7)
    b.set_yticks(range(len(ys)), labels, fontsize=7)
    b.invert_yaxis()
    b.set_xlim(170, 192)
    b.set_xlabel("engine steps/s, lone request (engine_loop.py; b = bucket)")
    save_panels(fig, (a, b), "forty-fifth session (H200): wgmma-swapped products and L2 prefetch in the persistent layer",
                "results_forty_fifth.png")
