"""results.md: the thirty-second session's section, and results_thirty_second.png."""

import os
import statistics

from summary.plots import decoder_run_bars, pyplot, save_panels
from summary.raw import HERE, load, tests_passed, vae_precision_log_runs


def thirty_second_session(res) -> list[str]:
    """2026-11-29 (issue 17): the VAE's residual units run from their raw input (`kernels.vae.residual_unit`,
    the first snake applied to each tap as it loads): kernel_vae_blocks.py --bandwidth both ways, the decoder
    A/B (vae_precision.py), the round in process (closed_loop.py's vae_plain_units) and served (two servers
    in one call). Sets res["thirty_second"], returns the markdown, draws results_thirty_second.png."""
    # per unit: (C, T, dilation, the unit's kernels after a look-back pass, us; run from its raw input, us)
    rows16 = [(u["C"], u["T"], u["dilation"], u["unit_us"], u["unit_on_load_us"])
              for u in load("vae_bandwidth_on_load_64x16_thirtysecond.json")["units"]]

    # call 1 ran the look-back pass on plain rows (row_align 1, the benchmark's default then); the decoder
    # before this session aligned them from 64 channels: those units' times from the thirty-first session's
    # call 7 (row_align 16, median of its two runs; another machine of the same kind)
    aligned = {}
    for run in (2, 4):
        for u in load(f"vae_bw_row_align16_run{run}_thirtyfirst.json")["units"]:
            aligned.setdefault((u["C"], u["dilation"]), []).append(u["unit_us"])
    aligned = {k: statistics.median(v) for k, v in aligned.items()}

    def served_before(C, d, plain):
        return aligned[(C, d)] if C >= 64 else plain  # ROW_ALIGN_FROM = 64

    def on_load_now(C):
        return C > 128 or C <= 32  # kernels.vae.unit_snake_on_load's default
    before16 = sum(served_before(C, d, old) for C, _, d, old, _ in rows16) / 1e3
    now16 = sum(on if on_load_now(C) else served_before(C, d, old) for C, _, d, old, on in rows16) / 1e3
    wide_gain = [served_before(C, d, old) / on for C, _, d, old, on in rows16 if C > 128]
    narrow_gain = [old / on for C, _, d, old, on in rows16 if C <= 32]
    with open(os.path.join(HERE, "raw", "vae_on_load_thirtysecond.log")) as f:
        runs = vae_precision_log_runs(f.read())
    decoder_rows = [("look-back pass (before)" if "SNAKE_ON_LOAD_UP_TO=0" in v else "from the raw input", r) for v, r in runs]
    before = [r for n, r in decoder_rows if n.startswith("look-back")]
    after = [r for n, r in decoder_rows if n.startswith("from")]
    pair = lambda shape: [b[shape] / a[shape] for b, a in zip(before, after)]  # noqa: E731 - each pair ran before first
    same_audio = load("vae_on_load_thirtysecond.json")["quality"]["fp32"]["vs_served_fp32"]["max_abs"]
    var = load("vae_unit_variants_on_load_thirtysecond.json")["units"]
    launches = {}
    for u in var:
        if u["C"] <= 128:
            for k, v in u.items():
                if k.startswith("unit_tail_on_load[") and "us" in v:
                    launches.setdefault(k[len("unit_tail_on_load[UNIT_LAUNCHES="):-1], {})[(u["C"], u["dilation"])] = v["us"]
    sel = load("vae_bandwidth_tap_select_thirtysecond.json")["units"]
    select_rows = []
    for u in sel:
        k = "unit_tail_on_load" if u["C"] <= 128 else "dwconv_snake_on_load"
        select_rows.append((u["C"], u["dilation"], k, u[k]["us"], u[f"{k}[TAP_SELECT=False]"]["us"]))
    with open(os.path.join(HERE, "raw", "vae_tap_select_thirtysecond.log")) as f:
        select_decoder = [r for v, r in vae_precision_log_runs(f.read()) if v == "fp32"]
    cl = load("closed_loop_plain_units_thirtysecond.json")["levels"]
    loop = {n: {k: [r["x_real_time"] for r in cl[str(n)][k]["rounds"]] for k in ("behind", "vae_plain_units")}
            for n in (64, 8)}
    loop_ratio = {n: cl[str(n)]["behind"]["x_real_time"] / cl[str(n)]["vae_plain_units"]["x_real_time"] for n in (64, 8)}
    step_ms = {n: {k: cl[str(n)][k]["ms_per_engine_step"] for k in ("behind", "vae_plain_units")} for n in (64, 8)}
    served = {}
    for side in ("after", "before"):
        for lv in load(f"served_thirtysecond_ab_{side}.json")["levels"]:
            served.setdefault(lv["concurrency"], {})[side] = {
                "x_real_time": lv["x_real_time"], "ttfa_p50": lv["ttfa_ms"]["p50"], "ttfa_p95": lv["ttfa_ms"]["p95"],
                "smooth": lv["smooth_playback_frac"], "errors": lv["errors"]}
    vae_check = load("gpu_check_vae_thirtysecond.json")["vae_graphs_vs_eager"]
    final_check = load("gpu_check_vae_final_thirtysecond.json")["vae_graphs_vs_eager"]
    gpu_tests, final_tests = (tests_passed(n) for n in ("gpu_tests_thirtysecond.txt", "gpu_tests_final_thirtysecond.txt"))
    res["thirty_second"] = {
        "device": "NVIDIA H200",
        "units_us_64x16": [dict(zip(("C", "T", "dilation", "lookback_pass_us", "on_load_us"), r)) for r in rows16],
        "units_ms_64x16": {"as_served_before": before16, "as_served_now": now16},
        "decoder_ms": [{"units": n, **r} for n, r in decoder_rows],
        "decoder_audio_max_abs_on_load_vs_before": same_audio,
        "tap_select_us_64x16": [dict(zip(("C", "dilation", "kernel", "select_us", "two_loads_us"), r)) for r in select_rows],
        "closed_loop_x_real_time": loop, "closed_loop_ratio_now_over_plain_units": loop_ratio,
        "served_ab": served, "vae_check_vs_exact_fp32": vae_check["served_vs_exact_fp32_max_abs"],
        "gpu_tests": gpu_tests, "final_vae_check": final_check["served_vs_exact_fp32_max_abs"], "final_gpu_tests": final_tests}
    md = ["", "## Thirty-second session (2026-11-29, H200): the VAE's residual units run from their raw input; "
          "with the aligned rows, 1.013x at 64 clients in process; served unchanged", "",
          "Seven device calls (about 25 of 30 min). The thirty-first session found the residual units far from memory "
          "bandwidth, with a look-back pass (`snake_extend`) in front of each: it reads the unit's input and writes "
          "`[saved frames | snake(x)]`, which the depthwise kernel then reads again. This session removes that pass "
          "where it pays, and measures what the two sessions' VAE changes give in the round.", "",
          "**Kept: residual units from their raw input** (`kernels.vae.residual_unit`). The depthwise kernels "
          "(`dwconv_snake`, `unit_tail`) take the unit's input x and the stream's saved frames of it, and apply the "
          "unit's first snake to each tap as they load it. The stream now keeps the raw input frames (zeros are the "
          "same either way: snake(0) = 0). The first time block's programs also write the next chunk's saved "
          "frames.",
          "- Call 1 (`kernel_vae_blocks.py --bandwidth --streams 64 --patches {16,4}`, "
          "`raw/vae_bandwidth_on_load_64x{16,4}_thirtysecond.{json,log}`) timed each unit both ways, with the "
          "look-back pass on plain rows (`--row-align 1`, then the default). Before this session the decoder "
          "aligned those rows from 64 channels: the third column is those units from the thirty-first session's "
          "call 7 (`--row-align 16`, median of two runs, another machine of the same kind). us at 64 x 16:", "",
          "| unit channels x frames | dilation | look-back pass, plain rows | look-back pass, aligned rows | "
          "from the raw input | served before over from the raw input |", "|---|---|---|---|---|---|"]
    for C, T, d, old, on in rows16:
        if d in (1, 9):
            al = f"{aligned[(C, d)]:.0f}" if C >= 64 else "-"
            md.append(f"| {C} x {T} | {d} | {old:.0f} | {al} | {on:.0f} | {served_before(C, d, old) / on:.2f}x |")
    md += ["",
           f"- Units wider than 128 channels (`dwconv_snake`, cuDNN's pointwise conv, `skip_add`) gain "
           f"{min(wide_gain):.2f}-{max(wide_gain):.2f}x over what the decoder ran, at every dilation: the look-back "
           "pass is gone. The depthwise kernel itself is slower on load than on aligned rows: x's rows are T "
           "frames long, unpadded, so none of its taps can be vectorized.",
           f"- `unit_tail` gains {min(narrow_gain):.2f}-{max(narrow_gain):.2f}x at 32 channels (which ran plain "
           "rows) and loses at 64 and 128, most at dilation 9. There each tap costs two masked loads and a snake, "
           "seven times per input frame, in a kernel already at 25% occupancy.",
           "- So the decoder runs from the raw input the units wider than 128 channels and those of up to 32 "
           "(`SNAKE_ON_LOAD_WIDE`, `SNAKE_ON_LOAD_UP_TO = 32`). The 18 units' kernels, as served, at 64 x 16: "
           f"{before16:.1f} ms before and {now16:.1f} ms now (summed over separate calls, part of them from the "
           "thirty-first session).",
           "- Launch variants of `unit_tail` on load at 64 and 128 channels (call 2, `--unit-variants`, "
           "`raw/vae_unit_variants_on_load_thirtysecond.{json,log}`), us at dilation 1 / 9:",
           ]
    for name, by in launches.items():
        md.append(f"  - `{name}`: " + ", ".join(f"{C} channels {by[(C, 1)]:.0f} / {by[(C, 9)]:.0f}" for C in (128, 64)))
    default_on = {(C, d): on for C, _, d, _, on in rows16}
    md += [f"  - against the default's {default_on[(128, 1)]:.0f} / {default_on[(128, 9)]:.0f} (128) and "
           f"{default_on[(64, 1)]:.0f} / {default_on[(64, 9)]:.0f} (64) in call 1: none is faster.", "",
           "**The whole decoder** (call 2: `vae_precision.py --precisions "
           "fp32+SNAKE_ON_LOAD_WIDE=False+SNAKE_ON_LOAD_UP_TO=0,fp32,` the same again, "
           "`raw/vae_on_load_thirtysecond.{json,log}`), ms per call, as served (CUDA graphs up to 256 patches, "
           "64 x 16 eager):", "",
           "| residual units | 8 x 4 | 64 x 4 | 64 x 16 | GPU ms, 64 x 4 |", "|---|---|---|---|---|"]
    for name, r in decoder_rows:
        md.append(f"| {name} | {r['8x4']:.2f} | {r['64x4']:.2f} | {r['64x16']:.2f} | {r['gpu']:.2f} |")
    p16, pg, p8 = pair("64x16"), pair("gpu"), pair("8x4")
    md += ["",
           f"- 64 x 16: {p16[0]:.3f}x and {p16[1]:.3f}x by pair. 64 x 4 in GPU time: {pg[0]:.3f}x and {pg[1]:.3f}x "
           f"(its wall times scatter by 10% between runs). 8 x 4: {p8[0]:.3f}x and {p8[1]:.3f}x.",
           f"- The unit totals above predict {before16 - now16:.1f} ms less at 64 x 16 (kernels timed one by one, "
           "in two sessions); the decoder saves "
           f"{statistics.mean(b['64x16'] - a['64x16'] for b, a in zip(before, after)):.1f} ms on average.",
           f"- In fp32, as served, the audio is bit-identical: max abs {same_audio:.1f} against the variant "
           "without. The snake is the same fp32 arithmetic, done in registers instead of stored and loaded. A "
           "bf16 or fp16 decoder's look-back frames are no longer rounded to its dtype before the conv, so its "
           "audio moves by rounding (`tests/test_vae_kernels.py` holds it to fp32 as before).",
           f"- `gpu_check.py --only vae` (call 3) passes: the VAE as served against exact fp32 "
           f"{vae_check['served_vs_exact_fp32_max_abs']:.2e} (bound {vae_check['served_bound']:.0e}); graph against "
           f"eager {vae_check['graph_vs_eager_max_abs']:.1f}. `tests/test_vae_kernels.py` on the GPU: {gpu_tests} "
           "(`raw/{gpu_check_vae,gpu_tests}_thirtysecond.*`).",
           "- On the session's final kernels (after a review: alpha loaded only in the PRE_SNAKE form, more test "
           f"cases; call 7), `gpu_check.py --only vae` again {final_check['served_vs_exact_fp32_max_abs']:.2e}, "
           f"pass, and the GPU tests {final_tests} (`raw/{{gpu_check_vae,gpu_tests}}_final_thirtysecond.*`).", "",
           "**One load per tap, tried and dropped** (call 6: the same `--bandwidth` run at dilations 1 and 9 with "
           "`--unit-variants TAP_SELECT=False`, `raw/vae_bandwidth_tap_select_thirtysecond.{json,log}`; the switch "
           "is `raw/tap_select_thirtysecond.patch`). A tap that reaches back into the saved frames loaded through a "
           "select of the two addresses, instead of a second masked load in the blocks that reach back. us at "
           "64 x 16:", "",
           "| unit | dilation | kernel | one load, select | two loads |", "|---|---|---|---|---|"]
    for C, d, k, s, two in select_rows:
        md.append(f"| {C} channels | {d} | `{k}` | {s:.0f} | {two:.0f} |")
    md += ["",
           f"- The select is {min(r[3] / r[4] for r in select_rows):.1f}-{max(r[3] / r[4] for r in select_rows):.1f}x "
           "slower in every unit; the whole decoder in the same call took "
           f"{select_decoder[0]['64x16']:.1f} and {select_decoder[1]['64x16']:.1f} ms at 64 x 16 "
           f"(`raw/vae_tap_select_thirtysecond.{{json,log}}`). The likely cause: with its addresses from a select, "
           "the compiler can no longer treat a row's loads as contiguous.",
           "- The patch also computed the snake's 1 / (alpha + 1e-9) once per channel block, outside the tap "
           "loop: the two-load column is within 2% of call 1 at 32-128 channels, so the compiler likely hoists it "
           "already. Neither kept.", "",
           "**In the round, in process** (call 5: `closed_loop.py --checkpoint /tmp/full --clients 64,8 --requests 3 "
           "--rounds 4 --settings behind,vae_plain_units`, `raw/closed_loop_plain_units_thirtysecond.{json,log}`). "
           "`vae_plain_units` (new) runs every residual unit after a look-back pass on plain rows, as before the "
           "thirty-first session: its own stream bank and graphs, captured with those constants. x real time by "
           "round (the order alternates):", "",
           "| clients | now (aligned rows, snake on load) | plain units | now over plain, medians | ms per engine step: now / plain |",
           "|---|---|---|---|---|"]
    for n in (64, 8):
        md.append(f"| {n} | {', '.join(f'{x:.1f}' for x in loop[n]['behind'])} | "
                  f"{', '.join(f'{x:.1f}' for x in loop[n]['vae_plain_units'])} | {loop_ratio[n]:.3f}x | "
                  f"{step_ms[n]['behind']:.2f} / {step_ms[n]['vae_plain_units']:.2f} |")
    md += ["",
           f"- 64 clients: every round of the current VAE beats every round of the plain one; {loop_ratio[64]:.3f}x "
           "on the medians. The thirtieth session put the VAE's work at 19% of this round. The two sessions' "
           "changes make a 64 x 16 decode about 1.08x faster (1.06x and 1.02x), which predicts about 1.015x: "
           "the round gains in proportion.",
           f"- 8 clients: {loop_ratio[8]:.3f}x. Its decodes are small graph replays (8 x 4 about 2.4 ms), "
           "which gained 1-3%, and the VAE is 7% of that round.",
           "- So in process, at 64 clients, a cheaper VAE shortened the round by about its share (4 rounds of "
           "each; served, below, one run of each shows nothing either way).", "",
           "**Served, both servers in one call** (call 4: `SET=\"decoder.timestep_buckets=10,100\" LEVELS=8,64 "
           "REQUESTS=5 bash benchmarks/run_served_gpu.sh`, this session's server first, then the `python_backend` "
           "from before the thirty-first session's VAE change (`27777df^`) through `VOXCPM_PYTHON_BACKEND`; "
           "`raw/served_thirtysecond_ab_{after,before}.json`):", "",
           "| streams | server | x real time | TTFA p50 / p95 ms | smooth | errors |", "|---|---|---|---|---|---|"]
    for n in (8, 64):
        for side, label in (("before", "before both VAE changes"), ("after", "this session")):
            s = served[n][side]
            md.append(f"| {n} | {label} | {s['x_real_time']:.1f} | {s['ttfa_p50']:.1f} / {s['ttfa_p95']:.1f} | "
                      f"{100 * s['smooth']:.0f}% | {s['errors']} |")
    md += ["",
           f"- After over before: {served[8]['after']['x_real_time'] / served[8]['before']['x_real_time']:.3f}x at 8 "
           f"streams, {served[64]['after']['x_real_time'] / served[64]['before']['x_real_time']:.3f}x at 64. One run "
           "each: the 1.3% the closed loop shows at 64 is inside the served runs' spread (1-2% between calls in the "
           "twenty-ninth session), and this call shows none of it.",
           "- Both servers made less than the twenty-ninth session's 468.7-471.1x at 64 on another machine of the "
           "same kind, and 142.8-144.2x at 8 against 144.6-145.4x.", "",
           "**Targets** (issue 17): unchanged. Served this session: 8 streams "
           f"{served[8]['after']['x_real_time']:.1f}x (target 150); 64 streams {served[64]['after']['x_real_time']:.1f}x "
           f"(target 500), {100 * served[64]['after']['smooth']:.0f}% smooth, TTFA p95 "
           f"{served[64]['after']['ttfa_p95']:.0f} ms; in process the closed loop makes "
           f"{statistics.median(loop[8]['behind']):.1f}x and {statistics.median(loop[64]['behind']):.1f}x.",
           "- At 64 clients the VAE remains the lever that moves the round in proportion; by that proportion 500x "
           "in process needs the VAE's work about 18% smaller than now. The six units of 64 and 128 channels "
           "(2.5-3.2 ms each of a 54 ms 64 x 16 decode, with their look-back pass, against 0.47 ms for a copy of "
           "the unit's input) are the largest piece left.", "",
           "![thirty-second session: residual units from their raw input](results_thirty_second.png)", ""]
    _plot_thirty_second(rows16, aligned, decoder_rows, loop)
    return md


def _plot_thirty_second(rows16, aligned, decoder_rows, loop):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4), gridspec_kw={"width_ratios": [1.5, 1, 1]})
    a = axes[0]
    rows = [r for r in rows16 if r[2] in (1, 9)]
    xs = range(len(rows))
    a.bar([x - 0.27 for x in xs], [r[3] for r in rows], 0.27, color="#bbb", label="look-back pass, plain rows")
    a.bar([x for x in xs], [aligned[(r[0], r[2])] if r[0] >= 64 else 0 for r in rows], 0.27, color="#777",
          label="look-back pass, aligned rows (31st session)")
    a.bar([x + 0.27 for x in xs], [r[4] for r in rows], 0.27, color="#286", label="from the raw input")
    a.set_xticks(list(xs), [f"{r[0]} ch\nd {r[2]}" for r in rows], fontsize=7)
    a.set_ylabel("us per unit, 64 x 16")
    a.set_title("call 1: each residual unit both ways (kept: > 128 and <= 32 channels)", fontsize=9)
    a.legend(fontsize=7)
    b = axes[1]
    decoder_run_bars(b, decoder_rows, {"look-back": "look-back pass", "from": "from the raw input"},
                      {"64x16": "64 x 16 (eager, wall)", "gpu": "64 x 4 (graph, GPU)"})
    b.set_title("call 2: the whole decoder", fontsize=9)
    b.legend(fontsize=6, loc="upper right")
    c = axes[2]
    for i, n in enumerate((64, 8)):
        for j, (k, color, label) in enumerate((("vae_plain_units", "#999", "plain units (before both sessions)"),
                                               ("behind", "#286", "now"))):
            ys = [x / statistics.median(loop[n]["vae_plain_units"]) for x in loop[n][k]]
            c.plot([i + (j - 0.5) * 0.3] * len(ys), ys, "o", color=color, alpha=0.8, label=label if i == 0 else None)
    c.axhline(1.0, color="k", lw=0.8, ls="--")
    c.set_xticks([0, 1], ["64 clients", "8 clients"])
    c.set_ylabel("x real time / plain units' median")
    c.set_title("call 5: closed loop in process, 4 rounds each", fontsize=9)
    c.legend(fontsize=7)
    save_panels(fig, axes, "Thirty-second session, NVIDIA H200, 2026-11-29", "results_thirty_second.png")
