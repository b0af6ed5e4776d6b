"""results.md: the twenty-third session's section, and results_twentythird.png."""

import os
import re

from summary.plots import paired_bars, pyplot, save_panels, ttfa_bars
from summary.raw import HERE, load, served_levels, set_served_headline


def twenty_third_session(res) -> list[str]:
    """2026-11-28 (issue 17): the VAE's residual units of up to 128 channels in one kernel
    (`unit_tail`), first audio with fewer IPC round trips before it; the served sweep on the final
    code. Updates the served headline keys, sets res["twentythird"], returns the markdown, draws
    results_twentythird.png."""
    v1, final = (load(f"vae_unit{s}_twentythird.json") for s in ("_v1", ""))
    chk, chk_tf32 = load("gpu_check_vae_twentythird.json"), load("gpu_check_vae_tf32_twentythird.json")
    sweep_units = load("vae_unit_sweep_precision_twentythird.json")["units"]["fp32"]
    ab = {k: served_levels(f"served_twentythird_ab_{k}.json") for k in ("before", "after")}
    sw = {a: served_levels(f"served_twentythird_sweep{s}.json") for a, s in (("burst", ""), ("poisson", "_poisson"))}
    cap = {a: load(f"served_twentythird_sweep{s}.json")["capacity"] for a, s in (("burst", ""), ("poisson", "_poisson"))}
    with open(os.path.join(HERE, "raw", "vae_tests_twentythird.txt")) as f:
        vae_tests = re.search(r"(\d+) passed", f.read()).group(1)
    with open(os.path.join(HERE, "raw", "gpu_tests_twentythird.txt")) as f:
        final_tests = [int(n) for n in re.findall(r"(\d+) passed", f.read())]
    engine64 = res["twentieth"]["engine_b64_xrt"][-1]
    b = sw["burst"]
    set_served_headline(res, b, cap, "twenty-third session, NVIDIA H200, 2026-11-28, "
                         "raw/served_twentythird_sweep*.json")

    def best(row, precision):  # the fastest launch of a precision in the sweep -> (us, max abs vs exact)
        return min((v for k, v in row.items() if k.startswith("(") and f"'{precision}'" in k), key=lambda v: v[0])

    units = [(r["C"], r["dilation"], r["three_kernels"], r["three_kernels_diff_vs_exact"], best(r, "tf32"),
              best(r, "tf32x3"), r["None"]) for r in sweep_units]
    short = lambda lv: {"xrt": lv["x_real_time"], "smooth": lv["smooth_playback_frac"],  # noqa: E731
                        "ttfa_ms_p50": lv["ttfa_ms"]["p50"], "ttfa_ms_p95": lv["ttfa_ms"]["p95"], "rtf_p50": lv["rtf"]["p50"]}
    res["twentythird"] = {
        "device": "NVIDIA H200", "vae_ms_per_call": final["shapes"], "vae_gpu_ms_64x4": {
            k: v["gpu_ms"] for k, v in final["profile_64x4"].items()}, "vae_quality": final["quality"],
        "served_ab_same_call": {k: {c: short(lv) for c, lv in x.items()} for k, x in ab.items()},
        "served_sweep": {a: {c: short(lv) for c, lv in x.items()} for a, x in sw.items()},
        "served_over_engine_c64": b[64]["x_real_time"] / engine64,
        "vae_served_vs_exact_fp32_max_abs": chk["vae_graphs_vs_eager"]["served_vs_exact_fp32_max_abs"]}
    q0, q1 = final["quality"]["fp32:0"]["vs_exact_fp32"], final["quality"]["fp32:128"]["vs_exact_fp32"]
    md = ["", "## Twenty-third session (2026-11-28, H200): a residual unit in one kernel; fewer round trips "
          "before first audio", "",
          "Two changes, each measured against the code before it in one call.", "",
          "**The VAE decoder's narrow residual units in one kernel** (`kernels/vae.py: unit_tail`). A residual "
          "unit after its first snake was three kernels: `dwconv_snake` wrote the depthwise conv's snake, "
          "cuDNN's pointwise conv read it and wrote its product, `skip_add` read that and the unit's input. "
          "`unit_tail` makes the depthwise conv and its snake 16-32 channels at a time and multiplies them "
          "straight into an accumulator of up to 128 output channels, then adds the bias and the skip: two "
          "tensors' round trips to memory fewer per unit.", "",
          "- The first version (call 1, `raw/vae_unit_v1_twentythird.json`) made the whole decode 4.6x slower "
          f"({v1['profile_64x4']['fp32:0']['gpu_ms']:.1f} against {v1['profile_64x4']['fp32:256']['gpu_ms']:.1f} ms "
          "of GPU for 64 streams x 4 patches). Compiled for sm_90 on this machine (`ptxas -v`, "
          "`raw/unit_tail_ptxas_twentythird.txt`), its launch (128, 32, 64, 4 warps) took 255 registers and "
          "spilled, and 174 KB of shared memory: triton's pipeliner staged the seven unrolled taps' loads, which "
          "leaves one program per SM. With the taps in a loop that launch takes 32 KB, and the sweep below picked "
          "launches that do not spill. Which of the three made the difference was not isolated.",
          "- A sweep of launches per unit at 64 x 4 (calls 2 and 3, `benchmarks/kernel_vae_blocks.py --unit`, "
          "`raw/vae_unit_sweep{,_precision}_twentythird.json`): up to 128 channels the kernel wins; at 256 each "
          "of two output blocks makes the depthwise conv again, and it lost at every launch (1,050-1,180 against "
          "590 us). So units of up to 128 channels run it (`UNIT_MAX_CHANNELS`), with a launch per width.",
          "- triton's plain TF32 product was twice as far from exact fp32 as cuDNN's TF32 conv, so the kernel "
          "multiplies in three TF32 products (`tf32x3`): as exact as fp32, and still faster.", "",
          "us per unit, 64 streams x 4 patches (call 3), the fastest launch of each; in brackets the largest "
          "difference from exact fp32 (the three kernels with TF32 off):", "",
          "| channels | dilation | three kernels (cuDNN TF32) | unit_tail, TF32 | unit_tail, tf32x3 (kept) |",
          "|---|---|---|---|---|"]
    for C, d, t3, e3, t1, t33, _ in units:
        md.append(f"| {C} | {d} | {t3:.0f} ({e3:.1e}) | {t1[0]:.0f} ({t1[1]:.1e}) | {t33[0]:.0f} ({t33[1]:.1e}) |")
    tot3, tot33 = sum(u[2] for u in units), sum(u[5][0] for u in units)
    fin = load("vae_unit_sweep_final_twentythird.json")["units"]["fp32"]
    fin3, fin_def = sum(r["three_kernels"] for r in fin), sum(r["None"][0] for r in fin)
    with open(os.path.join(HERE, "raw", "gpu_tests_final_twentythird.txt")) as f:
        fin_tests = re.search(r"(\d+) passed", f.read()).group(1)
    md += ["", f"Over those nine units: {tot3:.0f} us with three kernels, {tot33:.0f} us with `unit_tail` "
           f"({tot3 / tot33:.2f}x). After a review the kernel's grid puts time first, on the axis without "
           "a 65,535-block limit (a one-shot decode of more than ~87 s would have passed it). On that final "
           f"code (call 7, `raw/vae_unit_sweep_final_twentythird.json`, default launches): {fin3:.0f} against "
           f"{fin_def:.0f} us ({fin3 / fin_def:.2f}x), at most "
           f"{max(r['None'][1] for r in fin):.1e} from exact fp32; `tests/test_vae_kernels.py` {fin_tests} passed "
           "(`raw/gpu_tests_final_twentythird.txt`). The whole-decoder and served figures below ran before "
           "that change.", "",
           "The whole decoder as served (`VAEStreams`, CUDA graphs where captured; call 5, "
           "`benchmarks/vae_precision.py --precisions fp32:0,fp32:128`, `raw/vae_unit_twentythird.json`), ms "
           "per call:", "",
           "| residual units in unit_tail | 1x1 | 8x4 | 64x4 | 64x16 | GPU ms, 64 x 4 | audio vs exact fp32: max abs, SNR |",
           "|---|---|---|---|---|---|---|"]
    for k, label in (("fp32:0", "none (before)"), ("fp32:128", "up to 128 channels")):
        sh, q = final["shapes"][k], final["quality"][k]["vs_exact_fp32"]
        md.append(f"| {label} | {sh['1x1']:.2f} | {sh['8x4']:.2f} | {sh['64x4']:.2f} | {sh['64x16']:.2f} | "
                  f"{final['profile_64x4'][k]['gpu_ms']:.2f} | {q['max_abs']:.2e}, {q['snr_db']:.1f} dB |")
    md += ["", f"- 64 x 16 patches: {final['shapes']['fp32:0']['64x16'] / final['shapes']['fp32:128']['64x16']:.2f}x; "
           f"64 x 4: {final['shapes']['fp32:0']['64x4'] / final['shapes']['fp32:128']['64x4']:.2f}x. One stream's "
           f"one patch moved {final['shapes']['fp32:0']['1x1']:.2f} -> {final['shapes']['fp32:128']['1x1']:.2f} ms, "
           "less than the same baseline moved between calls (0.74-0.91 ms). The audio moved "
           f"closer to exact fp32 ({q0['max_abs']:.2e} to {q1['max_abs']:.2e}).",
           "- `gpu_check.py --only vae` passes on the final code (`raw/gpu_check_vae_twentythird.json`): the VAE "
           f"as served against exact fp32 {chk['vae_graphs_vs_eager']['served_vs_exact_fp32_max_abs']:.2e} "
           f"(bound {chk['vae_graphs_vs_eager']['served_bound']:.0e}; with plain TF32 it was "
           f"{chk_tf32['vae_graphs_vs_eager']['served_vs_exact_fp32_max_abs']:.2e}, call 3).",
           f"- GPU tests on the final code (call 6, `raw/gpu_tests_twentythird.txt`): `tests/test_vae_kernels.py` "
           f"{final_tests[0]} passed (with plain TF32 in call 3: {vae_tests}); `tests/test_engine_gpu.py -k "
           f"'stream_audio or first_audio'` {final_tests[1]} passed: the decoder's audio thread against the eager "
           "decode. Neither reopens a closed row, so the zeroing at close is tested on the CPU only "
           "(`tests/test_audio_vae.py`).", "",
           "**First audio with fewer round trips before it.** A helper traced a lone request's path. The "
           "python backend's calls to the parent process (metrics, `is_cancelled`) are IPC round trips, and "
           "several ran before the first chunk left:",
           "- the orchestrator recorded its six TTFA metrics before sending the audio (now after);",
           "- the decoder's engine thread asked whether the client had left before queueing the first chunk "
           "(now from the second chunk on; the audio thread still asks before it sends anything);",
           "- a VAE stream's state rows (26 tensors) were zeroed when a stream opened on them (now when the "
           "last one closes, in one `_foreach_zero_`).", "",
           "Same call, both servers (call 4: the `python_backend` of the twenty-second session's last commit "
           "through `VOXCPM_PYTHON_BACKEND`, then this session's with all three changes and `unit_tail`; "
           "`SET=\"decoder.timestep_buckets=10,100\" "
           "LEVELS=1,8,64 REQUESTS=10 bash benchmarks/run_served_gpu.sh`, "
           "`raw/served_twentythird_ab_{before,after}.json`):", "",
           "| streams | TTFA p50 / p95 ms, before | after | first audio in the server, mean ms | x real time, before / after |",
           "|---|---|---|---|---|"]
    for c in sorted(ab["after"]):
        o, n = ab["before"][c], ab["after"][c]
        md.append(f"| {c} | {o['ttfa_ms']['p50']:.1f} / {o['ttfa_ms']['p95']:.1f} | {n['ttfa_ms']['p50']:.1f} / "
                  f"{n['ttfa_ms']['p95']:.1f} | {o['first_audio_phases_ms']['total']:.1f} -> "
                  f"{n['first_audio_phases_ms']['total']:.1f} | {o['x_real_time']:.1f} / {n['x_real_time']:.1f} |")
    o1, n1 = ab["before"][1], ab["after"][1]
    md += ["", f"- One stream: TTFA p50 fell by {o1['ttfa_ms']['p50'] - n1['ttfa_ms']['p50']:.1f} ms, the mean "
           f"by {o1['ttfa_ms']['mean'] - n1['ttfa_ms']['mean']:.1f} ms ({o1['ttfa_ms']['mean']:.1f} -> "
           f"{n1['ttfa_ms']['mean']:.1f}); p95 rose by {n1['ttfa_ms']['p95'] - o1['ttfa_ms']['p95']:.1f} ms. The "
           f"mean first audio inside the server fell by "
           f"{o1['first_audio_phases_ms']['total'] - n1['first_audio_phases_ms']['total']:.1f} ms; the metrics now "
           "recorded after the send are outside that window. 10 requests each, one call: which change gave "
           "how much is not separated.",
           f"- With 10 requests the server before the change also had a p50 under 25 ms "
           f"({o1['ttfa_ms']['p50']:.1f}), where the earlier sweeps' medians of 2 requests were 25-26 ms.",
           "- The aggregates moved by 1% or less, within the spread between servers.", "",
           "**The full sweep on the final code** (call 5, `SET=\"decoder.timestep_buckets=10,100\" "
           "ARRIVALS=burst,poisson LEVELS=1,8,32,64,96,128 REQUESTS=2`, `raw/served_twentythird_sweep*.json`; "
           "the same command as the twenty-second session's call 3). Smooth / x real time / TTFA p50 / p95 ms:", "",
           "| streams | burst | Poisson | burst, twenty-second session |", "|---|---|---|---|"]
    prev = res["twentysecond"]["served_sweep_packs"]
    cell = lambda lv: (f"{lv['smooth_playback_frac']:.0%} / {lv['x_real_time']:.0f} / "  # noqa: E731
                       f"{lv['ttfa_ms']['p50']:.0f} / {lv['ttfa_ms']['p95']:.0f}")
    pcell = lambda lv: f"{lv['smooth']:.0%} / {lv['xrt']:.0f} / {lv['ttfa_ms_p50']:.0f} / {lv['ttfa_ms_p95']:.0f}"  # noqa: E731
    for c in sorted(b):
        md.append(f"| {c} | {cell(b[c])} | {cell(sw['poisson'][c])} | {pcell(prev['burst'][c])} |")
    md += ["", f"Capacity: burst {cap['burst']}, Poisson {cap['poisson']}. At 96 streams all at once, one "
           f"stream of {b[96]['requests']} underran again, as in both of the last session's sweeps. 128 "
           f"streams all at once played {b[128]['smooth_playback_frac']:.0%} smoothly "
           f"({b[128]['x_real_time']:.0f}x). 64 served streams made {b[64]['x_real_time']:.0f}x, "
           f"{b[64]['x_real_time'] / engine64:.2f} of the engine's batch 64 ({engine64:.0f}x, twentieth "
           "session, another call).", "",
           "![twenty-third session: unit_tail and first audio](results_twentythird.png)", ""]
    _plot_twenty_third(units, ab)
    return md


def _plot_twenty_third(units, ab):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    paired_bars(axes[0], [f"{C}/d{d}" for C, d, *_ in units],
                 [("three kernels", "#999", [u[2] for u in units]),
                  ("unit_tail (tf32x3)", "#286", [u[5][0] for u in units])], "{:.0f}".format)
    axes[0].legend(fontsize=7)
    axes[0].set_xlabel("residual unit: channels / dilation (64 streams x 4 patches)")
    axes[0].set_ylabel("us per unit")
    axes[0].tick_params(axis="x", labelsize=7)
    axes[0].set_title("VAE residual units", fontsize=9)
    ttfa_bars(axes[1], [("before", "#999", ab["before"]), ("after", "#286", ab["after"])],
               "streams, all at once (served, same call, 10 requests each)", "{:.1f}".format)
    save_panels(fig, axes, "Twenty-third session, H200, 2026-11-28", "results_twentythird.png")
