"""results.md: the twenty-seventh session's section, and results_twentyseventh.png."""

import os
import re

from summary.plots import paired_bars, save_panels, stream_panels
from summary.raw import HERE, load, served_levels


def twenty_seventh_session(res) -> list[str]:
    """2026-11-29 (issue 17, and SIGTERM): the served benchmark on this session's code with 64 long
    streams in flight at a SIGTERM after it; a larger steady chunk, measured and dropped; FP8 served
    on today's code (updates the FP8 served keys); gpu_check. Sets res["twentyseventh"], returns the
    markdown, draws results_twentyseventh.png."""
    lv = served_levels("served_twentyseventh.json")
    drain = load("drain_twentyseventh.json")
    base, c32 = served_levels("served_twentyseventh_chunks_default.json"), served_levels(
        "served_twentyseventh_chunks_1_4_32.json")
    fp8 = served_levels("served_twentyseventh_fp8.json")
    chk = load("gpu_check_twentyseventh.json")
    with open(os.path.join(HERE, "raw", "gpu_tests_twentyseventh.txt")) as f:
        gpu_tests = re.search(r"(\d+) passed", f.read()).group(1)
    with open(os.path.join(HERE, "raw", "served_twentyseventh_tritonserver.log")) as f:
        log = f.read()
    server_s = float(re.findall(r"tritonserver stopped in ([0-9.]+) s \(exit code 0\)", log)[-1])
    res.update({"single_stream_rtf_triton_fp8": fp8[1]["rtf"]["p50"], "ttfa_ms_p50_fp8": fp8[1]["ttfa_ms"]["p50"]})
    short = lambda x: {"xrt": x["x_real_time"], "smooth": x["smooth_playback_frac"],  # noqa: E731
                       "ttfa_ms_p50": x["ttfa_ms"]["p50"], "ttfa_ms_p95": x["ttfa_ms"]["p95"], "rtf_p50": x["rtf"]["p50"]}
    res["twentyseventh"] = {
        "device": "NVIDIA H200", "served": {c: short(x) for c, x in lv.items()}, "sigterm_drain": drain,
        "tritonserver_stopped_s": server_s,
        "chunk_schedule_ab": {"1,4,16": {c: short(x) for c, x in base.items()},
                              "1,4,32": {c: short(x) for c, x in c32.items()}},
        "fp8_served": {c: short(x) for c, x in fp8.items()},
        "gpu_check": {"bf16_vs_fp32_teacher_forced_cosine_min": chk["teacher_forced"]["cosine_min"],
                      "vae_served_vs_exact_fp32_max_abs":
                          chk["vae_graphs_vs_eager"]["served_vs_exact_fp32_max_abs"]}}
    row = lambda x: (f"{x['ttfa_ms']['p50']:.1f} / {x['ttfa_ms']['p95']:.1f} | {x['rtf']['p50']:.3f} | "  # noqa: E731
                     f"{x['smooth_playback_frac']:.0%} | {x['x_real_time']:.1f}")
    e = drain["ended_s"]
    md = ["", "## Twenty-seventh session (2026-11-29, H200): SIGTERM with 64 streams in flight; a larger chunk "
          "and FP8 served, measured", "",
          "Four device calls on one machine (about 13 of 30 min). This session's serving change is about "
          "shutdown and errors, not speed: a SIGTERM gives running requests half of Triton's exit timeout and "
          "then ends them with `the server is shutting down`, and a decoder error after a call's first "
          "response reaches the client (python_backend 24.10 lost it, and a final one left the orchestrator's "
          "event loop waiting for ever). Call 1 checks both on the GPU, with the served benchmark first "
          "(`SET=\"decoder.timestep_buckets=10,100\" LEVELS=1,8,64 REQUESTS=5 DRAIN=64 DRAIN_LENGTH=3000 bash "
          "benchmarks/run_served_gpu.sh`: the server under `scripts/supervise.py`, as `scripts/serve.sh` runs it; "
          "`raw/served_twentyseventh.{json,log}`, `raw/drain_twentyseventh.json`):", "",
          "| streams | TTFA p50 / p95 ms | RTF p50 | smooth | x real time |", "|---|---|---|---|---|"]
    md += [f"| {c} | {row(x)} |" for c, x in lv.items()]
    md += ["", "The same figures as the twenty-sixth session's (23.4x, 145.2x, 453.5x with 10 requests per stream).", "",
           f"**SIGTERM with {drain['streams']} streams of {drain['length']} patches in flight** "
           "(`benchmarks/shutdown_drain.py`, right after the benchmark; exit timeout "
           f"{drain['exit_timeout_s']:.0f} s): {drain['ended_shutting_down']} of {drain['streams']} streams ended with "
           f"`the server is shutting down`, {e['min']:.2f}-{e['max']:.2f} s after the SIGTERM (the deadline: 15 s, "
           "read every 0.5 s); tritonserver exited with code 0 "
           f"{server_s:.1f} s after it, and the supervisor with code 0 (gone after {drain['supervisor_exit_s']:.1f} s); "
           f"no crash, the exit timeout never expired. Before this session the same SIGTERM kept tts_stream and "
           "the decoder loaded until the exit timeout, which then ended tritonserver hard (exit code 1, or a "
           "malloc abort) and dropped every client's connection (on the CPU; not run on the GPU).", "",
           "**A larger steady chunk** (call 2, one machine, `chunk_schedule` 1,4,32 first, then the default "
           "1,4,16; `raw/served_twentyseventh_chunks_*.json`): fewer, larger VAE calls did not pay:", "",
           "| streams | 1,4,32: TTFA p50 / p95 ms | RTF p50 | smooth | x real time | 1,4,16 (default): TTFA p50 / "
           "p95 ms | RTF p50 | smooth | x real time |", "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {c} | {row(c32[c])} | {row(base[c])} |" for c in base]
    md += ["", f"- 8 streams {c32[8]['x_real_time']:.1f}x against {base[8]['x_real_time']:.1f}x, 64 streams "
           f"{c32[64]['x_real_time']:.1f}x against {base[64]['x_real_time']:.1f}x, and at 64 streams "
           f"{c32[64]['smooth_playback_frac']:.0%} smooth against {base[64]['smooth_playback_frac']:.0%}: dropped.",
           "", "**FP8 served on today's code** (call 3, same machine, `decoder.precision=fp8`, "
           "`raw/served_twentyseventh_fp8.json`; against call 2's default server):", "",
           "| streams | fp8: TTFA p50 / p95 ms | RTF p50 | smooth | x real time | bf16: TTFA p50 / p95 ms | RTF p50 | "
           "smooth | x real time |", "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {c} | {row(fp8[c])} | {row(base[c])} |" for c in base]
    md += ["", f"- One stream: RTF {fp8[1]['rtf']['p50']:.3f} against {base[1]['rtf']['p50']:.3f}. The persistent "
           "layer kernels take bf16 weights only, so FP8 runs the batch-1 step on `_scaled_mm` with per-token "
           f"scaling. 8 streams: {fp8[8]['x_real_time']:.1f}x against {base[8]['x_real_time']:.1f}x. 64 streams: "
           f"{fp8[64]['x_real_time']:.1f}x against {base[64]['x_real_time']:.1f}x "
           f"({fp8[64]['x_real_time'] / base[64]['x_real_time']:.2f}x; the engine alone gained 1.09x at batch 64 in the "
           "thirteenth session). The VAE's share of the GPU is the same either way, so served FP8 stays below 500x. "
           "`single_stream_rtf_triton_fp8` and `ttfa_ms_p50_fp8` in results.json now come from this call.",
           "", f"**Correctness on this code** (call 4): `gpu_check.py` passes every check "
           f"(`raw/gpu_check_twentyseventh.json`): bf16 against fp32 teacher-forced cosine min "
           f"{chk['teacher_forced']['cosine_min']:.5f}, graph against eager 0.0, the VAE as served against exact fp32 "
           f"{chk['vae_graphs_vs_eager']['served_vs_exact_fp32_max_abs']:.2e} (bound 2e-03); "
           f"`tests/test_engine_gpu.py` {gpu_tests} passed (`raw/gpu_tests_twentyseventh.txt`).", "",
           "![twenty-seventh session: SIGTERM with 64 streams in flight; served variants](results_twentyseventh.png)", ""]
    _plot_twenty_seventh(drain, server_s, base, c32, fp8)
    return md


def _plot_twenty_seventh(drain, server_s, base, c32, fp8):
    fig, (a, b) = stream_panels()
    e, t = drain["ended_s"], drain["exit_timeout_s"]
    a.barh([1], [e["median"]], color="#286", label=f"{drain['streams']} streams running")
    a.barh([0], [server_s - e["median"]], left=[e["median"]], color="#999", label="models unloading")
    a.axvline(t / 2, color="#c93", ls="--", lw=1, label="the running requests' deadline (half)")
    a.axvline(t, color="#c33", ls="--", lw=1, label="Triton's exit timeout")
    a.set_yticks([1, 0], ["streams", "server"])
    a.set_xlabel("seconds after SIGTERM")
    a.set_xlim(0, t + 2)
    a.set_title(f"call 1: all {drain['ended_shutting_down']} end with 'shutting down'; exit code 0", fontsize=9)
    a.legend(fontsize=7, loc="upper right")
    paired_bars(b, ["8 streams", "64 streams"], [
        ("bf16, chunks 1,4,16 (default)", "#286", [base[8]["x_real_time"], base[64]["x_real_time"]]),
        ("chunks 1,4,32", "#c93", [c32[8]["x_real_time"], c32[64]["x_real_time"]])], lambda v: f"{v:.0f}x")
    for x, c in ((-0.19, 8), (0.81, 64)):
        b.plot([x], [fp8[c]["x_real_time"]], "kD", label="fp8" if c == 8 else None)
        b.annotate(f"fp8 {fp8[c]['x_real_time']:.0f}x", (x, fp8[c]["x_real_time"]), xytext=(6, -12),
                   textcoords="offset points", fontsize=7)
    b.set_ylabel("aggregate x real time")
    b.set_title("calls 2-3, one machine: served variants", fontsize=9)
    b.legend(fontsize=7)
    save_panels(fig, [a, b], "Twenty-seventh session, NVIDIA H200, 2026-11-29", "results_twentyseventh.png")
