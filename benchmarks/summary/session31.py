"""results.md: the thirty-first session's section, and results_thirty_first.png."""

import os
import re
import statistics

from summary.plots import decoder_run_bars, pyplot, save_panels
from summary.raw import HERE, load, tests_passed, vae_precision_log_runs


def thirty_first_session(res) -> list[str]:
    """2026-11-29 (issue 17): whose the engine stream's gaps are (the host's or the device's, gpu_timeline.py's
    split by the runtime calls), two host settings and the VAE on a green context's SMs (closed_loop.py), and
    how near memory bandwidth the VAE's residual units run (kernel_vae_blocks.py --bandwidth). Sets
    res["thirty_first"], returns the markdown, draws results_thirty_first.png."""
    gaps = load("closed_loop_gaps_thirtyfirst.json")
    green = load("closed_loop_green_thirtyfirst.json")
    probe = load("green_probe_thirtyfirst.json")
    bw = {p: load(f"vae_bandwidth_64x{p}_thirtyfirst.json") for p in (16, 4)}
    whole_64x16 = load("vae_pieces_thirtieth.json")["shapes"]["64x16"]["ways"]["eager"]["gpu_ms"]
    per_step = {}
    for n, t in ((int(n), t) for n, t in gaps["traces"].items()):
        steps = t["round"]["engine_steps"]
        eng, vae = t["streams"][t["split"]["first"]], t["streams"][t["split"]["second"]]
        c = eng["long_gaps_by_cause"]
        per_step[n] = {"host_ms": c["host_ms"] / steps, "device_ms": c["device_ms"] / steps,
                       "long_gaps": eng["long_gaps"] / steps, "events": eng["events"] / steps,
                       "short_gaps_ms": eng["short_gaps_ms"] / steps,
                       "graph_launched": c["next_launched_by"].get("cudaGraphLaunch", 0) / sum(c["next_launched_by"].values()),
                       "vae_alone_ms": t["split"]["second_only_ms"] / steps, "idle_ms": t["split"]["neither_ms"] / steps,
                       "both_ms": t["split"]["both_ms"] / steps, "vae_host_late_ms": vae["long_gaps_by_cause"]["host_ms"] / steps,
                       "host_ms_round": c["host_ms"], "traced_ms_per_step": t["round"]["ms_per_engine_step"]}
    ratio = lambda run, n, k: run["levels"][str(n)][f"ratio_x_real_time_{k}_over_behind"]  # noqa: E731
    t9 = load("closed_loop_overlap_thirtyfirst.json")["traces"]["64"]
    e9 = t9["streams"][t9["split"]["first"]]
    ov = {"long_ms": e9["long_gaps_ms"], "within_ms": e9["long_gaps_by_cause"]["within_one_launch_ms"],
          "vae_busy_ms": t9["split"]["first_long_gaps_second_busy_ms"]}
    gms = {k: v["ms_per_engine_step"] for k, v in green["levels"]["64"].items() if isinstance(v, dict)}
    units = {p: b["units"] for p, b in bw.items()}
    totals = {p: b["total_us"] for p, b in bw.items()}
    ncu = _ncu_kernels("ncu_vae_units_thirtyfirst.txt", ["128 x 7680", "128 x 7680", "32 x 30720", "32 x 30720",
                                                        "256 x 3840", "256 x 3840"])
    dil8 = load("vae_bandwidth_dil8_64x16_thirtyfirst.json")["units"]
    dil8_lines = []
    for kernel, widths in (("dwconv_snake", (1024, 512, 256)), ("snake_extend", (1024, 512, 256, 128, 64, 32)),
                           ("unit_tail", (128, 64, 32))):
        share = {(u["C"], u["dilation"]): round(100 * u[kernel]["of_copy"]) for u in dil8 if kernel in u}
        dil8_lines.append(f"`{kernel}`: " + ", ".join(f"{C} channels {share[(C, 1)]}% / {share[(C, 8)]}%" for C in widths))
    var16 = load("vae_unit_variants_64x16_thirtyfirst.json")["units"]
    names = ["default"] + [k[len("unit_tail["):-1] for k in var16[-1] if k.startswith("unit_tail[")]
    label = {"default": "default (taps in a loop, tf32x3)", "UNIT_UNROLL_TAPS=True": "taps unrolled",
             "UNIT_UNROLL_TAPS=True+UNIT_NUM_STAGES=1": "taps unrolled, no pipelining",
             "UNIT_NUM_STAGES=1": "no pipelining", "UNIT_DOT_PRECISION=tf32": "plain TF32 product",
             "UNIT_UNROLL_TAPS=True+UNIT_LAUNCHES={32: (32, 64, 8), 64: (32, 64, 8), 128: (32, 64, 8)}":
                 "taps unrolled, 32 input channels a step and 8 warps at every width",
             "UNIT_UNROLL_TAPS=True+UNIT_BLOCK_CO=64": "taps unrolled, 64 output channels a program"}
    variants16 = []
    for name in names:
        key = "unit_tail" if name == "default" else f"unit_tail[{name}]"
        rows = [u[key] for u in var16 if key in u]
        if all("us" in r for r in rows):  # launches past the SM's shared memory are left out
            variants16.append((label.get(name, name.replace("UNIT_", "")), sum(r["us"] for r in rows) / 1e3))
    tf32_diff = max(u["unit_tail[UNIT_DOT_PRECISION=tf32]"]["max_abs_vs_default"] for u in var16 if "unit_tail" in u)
    align, runs_of = {}, {1: (1, 3), 16: (2, 4)}  # call 7 alternated plain and aligned rows
    for r, numbers in runs_of.items():
        for run in numbers:
            d = load(f"vae_bw_row_align{r}_run{run}_thirtyfirst.json")
            for kernel in ("snake_extend", "dwconv_snake", "unit_tail"):
                for C in (128, 64, 32) if kernel == "unit_tail" else (None,):
                    key = kernel if C is None else f"{kernel} at {C} channels"
                    align.setdefault(key, {}).setdefault(r, []).append(
                        sum(u[kernel]["us"] for u in d["units"] if kernel in u and C in (None, u["C"])) / 1e3)
    align_lines = [f"`{k}`: " + " and ".join(f"{a:.2f}" for a in v[1]) + " / " + " and ".join(f"{a:.2f}" for a in v[16])
                   for k, v in align.items()]
    ra = load("vae_row_align_thirtyfirst.json")
    decoder_rows = []
    # vae_precision.py keys its results by variant: two runs of each share a key, so read both from the log
    with open(os.path.join(HERE, "raw", "vae_row_align_thirtyfirst.log")) as f:
        runs = vae_precision_log_runs(f.read())
    for variant, r in runs:
        decoder_rows.append(("plain (before)" if "ROW_ALIGN_FROM=99999" in variant else "aligned from 64 channels", r))
    def ab(shape):
        """The aligned rows' speed-up at `shape`: median of the plain runs over median of the aligned ones."""
        med = lambda kind: statistics.median(r[shape] for n, r in decoder_rows if n.startswith(kind))  # noqa: E731
        return med("plain") / med("aligned")

    # call 7: the ms at 64 x 16 that aligned rows save in the units the decoder aligns (64 channels and more)
    aligned_units = {r: [sum(u["unit_us"] for u in load(f"vae_bw_row_align{r}_run{run}_thirtyfirst.json")["units"]
                             if u["C"] >= 64) / 1e3 for run in runs_of[r]] for r in (1, 16)}
    saved_ms = statistics.median(aligned_units[1]) - statistics.median(aligned_units[16])
    before16 = [r["64x16"] for n, r in decoder_rows if n.startswith("plain")]
    after16 = [r["64x16"] for n, r in decoder_rows if n.startswith("aligned")]
    same_audio = ra["quality"]["fp32"]["vs_served_fp32"]["max_abs"]
    vae_check = load("gpu_check_vae_thirtyfirst.json")["vae_graphs_vs_eager"]["served_vs_exact_fp32_max_abs"]
    gpu_tests = tests_passed("gpu_tests_thirtyfirst.txt")
    res["thirty_first"] = {
        "device": "NVIDIA H200",
        "engine_stream_per_step_ms": per_step,
        "closed_loop_ratios": {n: {k: ratio(gaps, n, k) for k in ("fast_switch", "long_pieces")}
                               | {k: ratio(green, n, k) for k in ("green66", "green40")} for n in (8, 64)},
        "green_probe_ms": {shape: {k: (v if isinstance(v, float) else v.get("ms")) for k, v in row.items() if k != "graph"}
                           for shape, row in probe["shapes"].items()},
        "vae_units_us": {f"64x{p}": {"kernels": t["unit_us"], "one_copy_per_unit": t["copy_us"]} for p, t in totals.items()},
        "ncu": ncu, "unit_tail_variants_ms_64x16": dict(variants16),
        "row_align_units_ms_64x16": {k: {str(r): v for r, v in d.items()} for k, d in align.items()},
        "decoder_ms_row_align": [{"rows": n, **r} for n, r in decoder_rows],
        "decoder_audio_max_abs_aligned_vs_plain": same_audio, "vae_check_vs_exact_fp32": vae_check}
    md = ["", "## Thirty-first session (2026-11-29, H200): the engine's stream waits on the GPU, not on the host; "
          "a green context for the VAE does not help; the VAE's residual units run far from memory bandwidth, "
          "and aligned rows take the VAE about 1.05x faster", "",
          "Nine device calls (about 28 of 30 min). The thirtieth session left one question open: the engine's "
          "stream has long gaps at 64 clients (2.61 ms a step). Are they the host's or the GPU's? This session "
          "answers it, finds where a cheaper VAE would come from, and takes a first, small step there: the VAE "
          "decodes 64 x 16 patches about 1.05x faster, with bit-identical audio.", "",
          "**Whose the gaps are** (call 1: `closed_loop.py --checkpoint /tmp/full --clients 64,8 --requests 3 --rounds 2 "
          "--settings behind,fast_switch,long_pieces --trace 64,8`, `raw/closed_loop_gaps_thirtyfirst.{json,log}`).",
          "- `gpu_timeline.py` now ties each device event to the CUDA runtime call that queued it (the trace's "
          "`correlation`). A long gap (20 us or more) is the host's up to the moment that call began: nothing was "
          "queued, the launching thread was late. The rest of the gap is the device's: the work was queued and "
          "waited.",
          "- ms per engine step of the profiled round, the engine's stream:", "",
          "| clients | long gaps: host / device | long gaps per step | of them ending at work a graph launch queued | VAE alone | "
          "both | neither (idle) | short gaps | events per step |", "|---|---|---|---|---|---|---|---|---|"]
    for n in (8, 64):
        r = per_step[n]
        md.append(f"| {n} | {r['host_ms']:.3f} / {r['device_ms']:.2f} | {r['long_gaps']:.1f} | "
                  f"{100 * r['graph_launched']:.0f}% | {r['vae_alone_ms']:.2f} | {r['both_ms']:.2f} | {r['idle_ms']:.2f} | "
                  f"{r['short_gaps_ms']:.2f} | {r['events']:.0f} |")
    r8, r64 = per_step[8], per_step[64]
    md += ["",
           f"- **The host is not the cause.** Over the whole profiled round, the host's part of the engine's long gaps "
           f"is {r64['host_ms_round']:.1f} ms at 64 clients and {r8['host_ms_round']:.1f} ms at 8. That is "
           f"{r64['host_ms']:.3f} and {r8['host_ms']:.3f} ms a step. The engine launches each step before the GPU reaches it.",
           f"- **The gaps are inside the step's graph, while the VAE runs.** At 64 clients "
           f"{100 * r64['graph_launched']:.0f}% of the long gaps end at work a graph launch queued "
           f"({r64['long_gaps']:.0f} gaps a step). After a review, one more traced round (call 9, "
           "`closed_loop.py --clients 64 --requests 1 --rounds 1 --settings behind --trace 64`, "
           "`raw/closed_loop_overlap_thirtyfirst.{json,log}`) measured two things directly:",
           f"  - {ov['within_ms']:.0f} of the engine's {ov['long_ms']:.0f} ms of long gaps "
           f"({100 * ov['within_ms'] / ov['long_ms']:.0f}%) lie between two kernels of one graph replay;",
           f"  - the audio stream was busy for {ov['vae_busy_ms']:.0f} ms of them ({100 * ov['vae_busy_ms'] / ov['long_ms']:.0f}%).",
           "  - A graph's next kernel that starts late while the highest-priority stream runs: the likeliest wait is "
           "for SMs the VAE's kernels hold. The trace does not show SM occupancy itself.",
           "  - So the VAE's work adds to the round rather than hiding beside the step, as the thirtieth session's "
           "`vae_off` round implied.",
           f"- **The idle time.** Neither stream busy: {r64['idle_ms']:.2f} ms a step at 64 clients and "
           f"{r8['idle_ms']:.2f} at 8. The engine's short gaps (under 20 us) between its {r64['events']:.0f} and "
           f"{r8['events']:.0f} device events a step (kernels and copies) sum to {r64['short_gaps_ms']:.2f} and "
           f"{r8['short_gaps_ms']:.2f} ms, about as much: mostly the step's own launch bubbles, which fewer kernels "
           "per step would cut.",
           f"- The audio stream's gaps are nearly all the host's ({r64['vae_host_late_ms']:.1f} ms a step at 64), as "
           "expected: its thread launches a decode when the engine hands out chunks, and has nothing queued before.",
           "",
           "**Two host-side settings, same call** (x real time, median of 2 rounds, against the default):",
           f"- `fast_switch`, the interpreter's thread switch interval 0.5 ms instead of 5 ms: "
           f"{ratio(gaps, 8, 'fast_switch'):.3f}x at 8 clients, {ratio(gaps, 64, 'fast_switch'):.3f}x at 64.",
           f"- `long_pieces`, chunks longer than the longest VAE graph decoded as graph pieces, not eagerly (a few "
           "graph replays instead of an eager decode's ~160 kernels launched from Python): "
           f"{ratio(gaps, 8, 'long_pieces'):.3f}x and {ratio(gaps, 64, 'long_pieces'):.3f}x.",
           "- Both within the spread: dropped. No contention for the GIL shows, as the gap split said.", "",
           "**The VAE on a green context** (call 2: `green_probe.py --sms 16,40,66`, then `closed_loop.py "
           "--settings behind,green66,green40`, `raw/{green_probe,closed_loop_green}_thirtyfirst.*`). A CUDA green "
           "context confines a stream's kernels to some of the SMs (`torch.cuda.green_contexts`, torch 2.11). "
           "Confining the VAE would leave the other SMs to the engine's step.",
           "- The decode on a green context's stream gives exactly the same audio as on an ordinary stream (max abs "
           "0.0), Triton kernels included.",
           "- GPU ms per decode:", "",
           "| streams x patches | how it runs | all 132 SMs | 66 SMs | 40 SMs | 16 SMs |", "|---|---|---|---|---|---|"]
    for shape, row in probe["shapes"].items():
        md.append(f"| {shape.replace('x', ' x ')} | {'CUDA graph' if row['graph'] else 'eager'} | {row['all_sms_ms']:.1f} | "
                  + " | ".join(f"{row[f'sms{k}']['ms']:.1f}" for k in (66, 40, 16)) + " |")
    p16 = probe["shapes"]["64x16"]
    md += ["",
           "- Eager decodes are confined: 64 x 16 takes "
           f"{p16['sms66']['ms'] / p16['all_sms_ms']:.2f}x as long on half the SMs, {p16['sms16']['ms'] / p16['all_sms_ms']:.1f}x on 16.",
           "- A CUDA graph captured on the device's own context is not confined when it is replayed on a green "
           "context's stream: its kernels still use every SM.",
           "- After its results were written, the probe aborted at exit (`context is destroyed`): a tensor was "
           "freed after its green context. The script now exits without that teardown. Serving on green contexts "
           "would need that lifetime handled.",
           f"- The closed loop (most of the audio at 64 clients is in eager 16-patch decodes): green66 "
           f"{ratio(green, 8, 'green66'):.3f}x at 8 clients and {ratio(green, 64, 'green66'):.3f}x at 64; green40 "
           f"{ratio(green, 8, 'green40'):.3f}x and {ratio(green, 64, 'green40'):.3f}x.",
           f"- No setting moved the round by more than 1%, nor its ms per engine step at 64 clients "
           f"({gms['behind']:.2f} default, {gms['green66']:.2f} green66, {gms['green40']:.2f} green40).",
           "- Two things confound it: the green context's stream is not of the highest priority, and the decodes "
           "replayed as graphs (the 1- and 4-patch chunks, and every chunk at 8 clients) are not confined.",
           "- What it shows: confining the long eager decodes did not shorten the round. That fits a GPU that is "
           "full, where only less work helps, or work done nearer the hardware's limits. Dropped.", "",
           "**How near memory bandwidth the VAE's residual units run** (call 3: `kernel_vae_blocks.py --bandwidth "
           "--streams 64 --patches {16,4}`, its look-back rows then unpadded by default (`--row-align 1` now), "
           "`raw/vae_bandwidth_64x{16,4}_thirtyfirst.{json,log}`).",
           "- Each kernel is timed at its default launch, fp32, against the bytes it has to move: each [B, C, T] input "
           "read once, its output written once. The look-back frames are not counted (at most 10% more bytes, at "
           "1024 channels and dilation 9). The yardstick is a `copy_` of as many bytes: about 4.2 TB/s on the large "
           "shapes.",
           "- Dilation 1 shown. Dilations 3 and 9 are within a few percent, except `unit_tail` at 32 channels, "
           "which is 17% slower at 9:", "",
           "| unit channels x frames (64 x 16) | copy us | snake_extend | unit_tail | dwconv_snake | pointwise conv "
           "(cuDNN) | skip_add | the unit, us |", "|---|---|---|---|---|---|---|---|"]
    cell = lambda r, k: f"{r[k]['us']:.0f} ({100 * r[k]['of_copy']:.0f}%)" if k in r else "-"  # noqa: E731

    def span(p, kernel, channels=None):
        """'lo-hi%' of a kernel's share of the copy's GB/s over the units (of one width) at 64 x p."""
        v = [round(100 * r[kernel]["of_copy"]) for r in units[p] if kernel in r and channels in (None, r["C"])]
        return f"{min(v)}-{max(v)}%" if min(v) != max(v) else f"{v[0]}%"
    for r in units[16]:
        if r["dilation"] == 1:
            md.append(f"| {r['C']} x {r['T']} | {r['copy_us']:.0f} | " + " | ".join(
                cell(r, k) for k in ("snake_extend", "unit_tail", "dwconv_snake", "pointwise_conv", "skip_add"))
                      + f" | {r['unit_us']:.0f} |")
    t16, t4 = totals[16], totals[4]
    md += ["",
           "In brackets: the share of the copy's GB/s that the kernel reaches.", "",
           f"- The 18 residual units' kernels take {t16['unit_us'] / 1e3:.1f} ms at 64 x 16, summed over separate "
           f"calls. A whole 64 x 16 decode took {whole_64x16:.1f} ms of GPU in the thirtieth session (another call). "
           "So the units are about two thirds of the decode.",
           f"- A copy of each unit's input takes {t16['copy_us'] / 1e3:.1f} ms for all 18 units (64 x 4: "
           f"{t4['unit_us'] / 1e3:.1f} against {t4['copy_us'] / 1e3:.1f} ms). One kernel per unit would move "
           "at least that many bytes: read x with its look-back once, write the output once.",
           f"- `skip_add` reaches {span(16, 'skip_add')} of the copy's GB/s, so plain passes can run at the memory's "
           "speed here.",
           f"- At 64 x 16, `unit_tail` reaches {span(16, 'unit_tail', 128)} of it at 128 channels, "
           f"{span(16, 'unit_tail', 64)} at 64 and {span(16, 'unit_tail', 32)} at 32; `dwconv_snake` "
           f"{span(16, 'dwconv_snake')} at every width, `snake_extend` {span(16, 'snake_extend')}, cuDNN's pointwise "
           f"conv {span(16, 'pointwise_conv')}.",
           "",
           "**What limits them** (call 5: Nsight Compute on one launch each, 64 x 4, before the aligned rows below; "
           "`benchmarks/ncu_vae_units.py`, `raw/ncu_vae_units_thirtyfirst.txt`). ncu runs the GPU at fixed clocks, "
           "so its durations are longer than the timed runs':", "",
           "| kernel | channels x frames | us | DRAM % of peak | L1 % of peak | registers | occupancy, theoretical / "
           "achieved | the main stall |", "|---|---|---|---|---|---|---|---|"]
    for k in ncu:
        md.append(f"| `{k['kernel']}` | {k['shape']} | {k['us']:.0f} | {k['dram']:.0f} | {k['l1']:.0f} | {k['regs']:.0f} | "
                  f"{k['occ_theory']:.0f}% / {k['occ']:.0f}% | {k['stall']} ({k['stall_share']:.0f}% of the cycles between "
                  "a warp's instructions) |")
    dw = next(k for k in ncu if k["kernel"] == "dwconv_snake")
    ut = [k for k in ncu if k["kernel"] == "unit_tail"]
    md += ["",
           f"- `dwconv_snake` is bound by L1: {dw['l1']:.0f}% of its peak, with its DRAM at {dw['dram']:.0f}%. Its seven "
           "taps load the same frames at shifts that are not multiples of four, and its rows are L + T frames long. "
           "So triton cannot use 16-byte loads, and every tap is a separate stream of 4-byte accesses.",
           f"- `unit_tail` runs at {ut[0]['occ_theory']:.0f}% occupancy: {ut[0]['regs']:.0f} and {ut[1]['regs']:.0f} "
           "registers a thread leave room for two or four programs per SM. Its L1 is "
           f"{ut[0]['l1']:.0f}-{ut[1]['l1']:.0f}% busy.",
           "- `snake_extend` waits on its loads (scoreboard stalls). Its output rows are L + T frames long too.", "",
           "**Aligned taps as a probe** (call 6: `kernel_vae_blocks.py --bandwidth --streams 64 --patches 16 "
           "--dilations 1,8,9`, `raw/vae_bandwidth_dil8_64x16_thirtyfirst.{json,log}`).",
           "- A dilation of 8 is not the decoder's. Its taps sit at multiples of 8 elements (32 bytes) and its rows "
           "(L + T frames) at multiples of 16: every access can be 16-byte aligned.",
           "- Share of the copy's GB/s, dilation 1 / 8:",
           ] + [f"  - {line}" for line in dil8_lines] + [
           "- So alignment is about half of what `dwconv_snake` loses against a copy, and much of `snake_extend`'s. "
           "`unit_tail` at 128 channels is not bound by it.",
           "",
           "**unit_tail, launch variants** (call 4: `kernel_vae_blocks.py --bandwidth --unit-variants ...`, "
           "`raw/vae_unit_variants_64x{16,4}_thirtyfirst.{json,log}`; the switches tried are in "
           "`raw/unit_tail_unroll_thirtyfirst.patch`, not kept). The nine units' `unit_tail`, ms at 64 x 16:", "",
           "| variant | ms | against the default |", "|---|---|---|"]
    for name, ms in variants16:
        md.append(f"| {name} | {ms:.1f} | {ms / variants16[0][1]:.2f}x |")
    md += ["",
           "- With the taps unrolled, triton's pipeliner stages their loads in shared memory, as in the twenty-third "
           "session's first version: over 5x slower. Without pipelining, unrolled taps gain at 64 channels and lose at 32.",
           "- Plain TF32 instead of three TF32 products saves 5%, and its output moves by up to "
           f"{tf32_diff:.1e} (max abs, random inputs) from the default's. Not taken: it gives up exactness for little.",
           "- Launches past the SM's shared memory at some width are left out of the table (in the JSON).",
           "- The log prints each unit's variants before that unit's own line. The JSON is right.", "",
           "**Kept: aligned look-back rows for units of 64 channels and more** (`kernels.vae.ROW_ALIGN_FROM`). "
           "`snake_extend` now writes its output for a residual unit into rows padded to a multiple of 16 elements "
           "(`row_align`). The arithmetic is the same.",
           "- Call 7 (`kernel_vae_blocks.py --bandwidth --row-align {1,16}`, alternating, two runs each, "
           "`raw/vae_bw_row_align*_thirtyfirst.json`), ms summed over the 18 units at 64 x 16, row_align 1 / 16:",
           ] + [f"  - {line}" for line in align_lines] + [
           "- So units of 32 channels keep plain rows. Those are the units whose `unit_tail` got slower.",
           "- The whole decoder, call 8 (`vae_precision.py --precisions "
           "fp32+ROW_ALIGN_FROM=99999,fp32,fp32+ROW_ALIGN_FROM=99999,fp32`, `raw/vae_row_align_thirtyfirst.{json,log}`), "
           "ms per call, as served (CUDA graphs up to 256 patches, 64 x 16 eager):", "",
           "| rows | 8 x 4 | 64 x 4 | 64 x 16 | GPU ms, 64 x 4 |", "|---|---|---|---|---|"]
    for name, r in decoder_rows:
        md.append(f"| {name} | {r['8x4']:.2f} | {r['64x4']:.2f} | {r['64x16']:.2f} | {r['gpu']:.2f} |")
    md += ["",
           f"- 64 x 16: {before16[0]:.1f} and {before16[1]:.1f} ms before, {after16[0]:.1f} and {after16[1]:.1f} after. "
           f"By pair (each pair ran plain first): {before16[0] / after16[0]:.3f}x and {before16[1] / after16[1]:.3f}x; "
           f"on the medians {ab('64x16'):.2f}x. Call 7's unit totals predict about "
           f"{whole_64x16 / (whole_64x16 - saved_ms):.2f}x.",
           f"- 64 x 4: {ab('64x4'):.2f}x in wall time but {ab('gpu'):.2f}x in GPU time (profiled). 8 x 4: {ab('8x4'):.2f}x.",
           f"- The audio is bit-identical: max abs {same_audio:.1f} against the first variant's.",
           f"- `gpu_check.py --only vae` passes: the VAE as served against exact fp32 {vae_check:.2e} (bound 2e-03, "
           "`raw/gpu_check_vae_thirtyfirst.{json,log}`). `tests/test_vae_kernels.py` on the GPU: "
           f"{gpu_tests} (`raw/gpu_tests_thirtyfirst.txt`).",
           "- In the round: the VAE's work is about 19% of a 64-client round, so 1.05x on the VAE is worth about 1%. "
           "That is within the spread of the closed loop's rounds, and it was not measured there.", "",
           "**Where a cheaper VAE is.** The thirtieth session found that, by proportion, the VAE's work needs to "
           "shrink by about 29% (8 clients) and 24% (64) for the throughput targets, in process.",
           "- The units hold far more than that between what they take and what their bytes need.",
           "- An estimate, not a measurement: if the units ran in twice the copy's time, a 64 x 16 decode would "
           f"take about {whole_64x16 - t16['unit_us'] / 1e3 + 2 * t16['copy_us'] / 1e3:.0f} ms instead of "
           f"{whole_64x16:.0f}.",
           "- The lead from calls 5-7: the depthwise kernels lose to unaligned taps. With the activations "
           "channels-last ([B, T, C]: a tap moves by whole rows of C), every tap would be aligned. Then `unit_tail`'s "
           "occupancy (25%) is next.",
           "- Not built this session: a layout change reaches every kernel of the decoder and needs its own GPU "
           "iterations.", "",
           "**Targets** (issue 17): unchanged from the thirtieth session. None is met that was not met then.", "",
           "![thirty-first session: whose the gaps are, the VAE on a green context, the residual units against "
           "bandwidth, aligned rows](results_thirty_first.png)", ""]
    _plot_thirty_first(per_step, probe, units[16], decoder_rows)
    return md


def _ncu_kernels(name: str, shapes: list) -> list:
    """Nsight Compute's text report (raw/<name>) -> per kernel launch, in order: its duration, DRAM and L1
    throughput (% of peak), registers, occupancy and the main stall of its warps; `shapes` label the launches."""
    with open(os.path.join(HERE, "raw", name)) as f:
        blocks = re.split(r"\n  (?=_\w+_kernel \()", f.read())[1:]
    out = []
    for block, shape in zip(blocks, shapes):
        flat = re.sub(r"\s+", " ", block)

        def num(label):
            return float(re.search(re.escape(label) + r" [^\d]*?([\d.]+)", flat).group(1))

        stall = re.search(r"spends [\d.]+ cycles being stalled (waiting for .*?)(?: on a | to be | Find|\. )", flat)
        share = re.search(r"represents about ([\d.]+)% of the total average", flat)
        out.append({"kernel": block.split(" ", 1)[0].strip("_").removesuffix("_kernel"), "shape": shape,
                    "us": num("Duration"), "dram": num("DRAM Throughput"), "l1": num("L1/TEX Cache Throughput"),
                    "regs": num("Registers Per Thread"), "occ_theory": num("Theoretical Occupancy"),
                    "occ": num("Achieved Occupancy"), "stall": stall.group(1).replace("waiting for ", ""),
                    "stall_share": float(share.group(1))})
    return out


def _plot_thirty_first(per_step, probe, units, decoder_rows):
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(19, 4), gridspec_kw={"width_ratios": [1, 1, 1.4, 0.9]})
    a = axes[0]
    parts = (("host_ms", "engine's long gaps: host late", "#c33"), ("device_ms", "engine's long gaps: queued, waiting", "#c84"),
             ("vae_alone_ms", "VAE alone", "#48c"), ("idle_ms", "neither stream busy", "#bbb"))
    width = 0.2
    for j, (key, label, color) in enumerate(parts):
        xs = [i + (j - 1.5) * width for i in range(2)]
        vs = [per_step[n][key] for n in (8, 64)]
        a.bar(xs, vs, width, color=color, label=label)
        for x, v in zip(xs, vs):
            a.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=6)
    a.set_xticks([0, 1], ["8 clients", "64 clients"])
    a.set_ylabel("ms per engine step (they overlap: not a sum)")
    a.set_title("call 1: the engine stream's long gaps, by cause", fontsize=9)
    a.legend(fontsize=7, loc="upper left")
    b = axes[1]
    sms = [16, 40, 66, 132]
    for shape, color in (("64x16", "#286"), ("64x4", "#c84"), ("8x4", "#999")):
        row = probe["shapes"][shape]
        ms = [row[f"sms{k}"]["ms"] for k in sms[:-1]] + [row["all_sms_ms"]]
        b.plot(sms, ms, "o-", color=color, label=f"{shape.replace('x', ' x ')} ({'graph' if row['graph'] else 'eager'})")
    b.set_yscale("log")
    b.set_xlabel("SMs of the green context (132: an ordinary stream)")
    b.set_ylabel("GPU ms per decode")
    b.set_title("call 2: a VAE decode confined to a green context", fontsize=9)
    b.legend(fontsize=7)
    c = axes[2]
    rows = [r for r in units if r["dilation"] == 1]
    kernels = (("snake_extend", "#8b6"), ("unit_tail", "#c33"), ("dwconv_snake", "#c84"), ("pointwise_conv", "#48c"),
               ("skip_add", "#999"))
    width = 0.16
    for j, (k, color) in enumerate(kernels):
        xs = [i + (j - 2) * width for i, r in enumerate(rows) if k in r]
        c.bar(xs, [100 * r[k]["of_copy"] for r in rows if k in r], width, color=color, label=k)
    c.axhline(100, color="k", ls="--", lw=1)
    c.set_xticks(range(len(rows)), [f"{r['C']} ch" for r in rows])
    c.set_ylabel("% of a copy's GB/s")
    c.set_title("call 3: residual units at 64 x 16, each kernel against a copy of its bytes", fontsize=9)
    c.legend(fontsize=7, ncol=2)
    d = axes[3]
    decoder_run_bars(d, decoder_rows, {"plain": "plain rows", "aligned": "aligned from 64 channels"},
                      {"64x4": "64 x 4 (graph)", "64x16": "64 x 16 (eager)"})
    d.set_title("call 8: the decoder with aligned look-back rows", fontsize=9)
    d.legend(fontsize=6, loc="upper left")
    save_panels(fig, axes, "Thirty-first session, NVIDIA H200, 2026-11-29", "results_thirty_first.png")
