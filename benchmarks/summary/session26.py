"""results.md: the twenty-sixth session's section, and results_twentysixth.png."""

import os
import re

from bench_served import parse_metric_samples
from summary.plots import paired_bars, save_panels, stream_panels
from summary.raw import HERE, load, served_levels, served_summary, set_served_headline


def twenty_sixth_session(res) -> list[str]:
    """2026-11-29 (issue 17): the served benchmark on the GPU with the counted BLS reads (the
    64-stream stall gone), the engine in the same call, the sweep on this code; every model
    process with metrics crashed at exit, fixed. Updates the served headline keys, sets
    res["twentysixth"], returns the markdown, draws results_twentysixth.png."""
    r10 = served_levels("served_twentysixth_r10.json")
    eng = load("offline_twentysixth_b8_b64.json")["engine"]["graphs"]["runs"]
    e8 = next(x["aggregate_xrt"] for x in eng if x["batch"] == 8)
    e64 = [x["aggregate_xrt"] for x in eng if x["batch"] == 64]
    sw = {a: served_levels(f"served_twentysixth_sweep{s}.json") for a, s in (("burst", ""), ("poisson", "_poisson"))}
    cap = {a: load(f"served_twentysixth_sweep{s}.json")["capacity"] for a, s in (("burst", ""), ("poisson", "_poisson"))}
    before = {a: served_levels(f"served_twentythird_sweep{s}.json") for a, s in (("burst", ""), ("poisson", "_poisson"))}
    ext = served_levels("served_twentysixth_exit.json")
    with open(os.path.join(HERE, "raw", "metrics_twentysixth_r10.txt")) as f:
        reads = {labels["read"]: int(v) for name, labels, v in parse_metric_samples(f.read())
                 if name == "voxcpm_decoder_calls_read_total" and labels["model"] == "tts_stream"}
    counted, waiting = reads["counted"], reads["waiting"]
    chk = load("gpu_check_twentysixth.json")
    with open(os.path.join(HERE, "raw", "served_twentysixth_sweep_tritonserver.log")) as f:
        crashes_before = f.read().count("Fatal Python error: Segmentation fault")
    with open(os.path.join(HERE, "raw", "served_twentysixth_exit_tritonserver.log")) as f:
        text = f.read()
        crashes_after, unloaded = text.count("Fatal Python error"), text.count("successfully unloaded")
    with open(os.path.join(HERE, "raw", "gpu_tests_twentysixth.txt")) as f:
        gpu_tests = re.search(r"(\d+) passed", f.read()).group(1)
    b = sw["burst"]
    set_served_headline(res, b, cap, "twenty-sixth session, NVIDIA H200, 2026-11-29, "
                         "raw/served_twentysixth_sweep*.json")
    res["twentysixth"] = {
        "device": "NVIDIA H200", "served_10_requests_per_stream": {c: served_summary(lv) for c, lv in r10.items()},
        "engine_same_call_xrt": {"8": e8, "64": e64},
        "served_over_engine_same_call": {"8": r10[8]["x_real_time"] / e8, "64": r10[64]["x_real_time"] / e64[-1]},
        "decoder_calls_read": {"counted": counted, "waiting": waiting},
        "served_sweep": {a: {c: served_summary(lv) for c, lv in x.items()} for a, x in sw.items()},
        "model_processes_crashed_at_exit": {"before": crashes_before, "after": crashes_after},
        "gpu_check": {"bf16_vs_fp32_teacher_forced_cosine_min": chk["teacher_forced"]["cosine_min"],
                      "vae_served_vs_exact_fp32_max_abs":
                          chk["vae_graphs_vs_eager"]["served_vs_exact_fp32_max_abs"]}}
    md = ["", "## Twenty-sixth session (2026-11-29, H200): the 64-stream stall is gone on the GPU; model "
          "processes no longer crash at exit", "",
          "Three device calls (about 23 of 30 min), all on this session's code with the twenty-fifth session's "
          "counted BLS reads (`serving/bls_stream.py`).", "",
          "**64 streams x 10 requests finish.** Call 1: `SET=\"decoder.timestep_buckets=10,100\" "
          "LEVELS=1,8,64,128 REQUESTS=10 bash benchmarks/run_served_gpu.sh`, then in the same call the engine "
          "alone (`bench.py --batches 8,64,64 --reference none --no-vae --graphs-only --no-profile`; "
          "`raw/served_twentysixth_r10.{json,log}`, `raw/offline_twentysixth_b8_b64.json`, "
          "`raw/metrics_twentysixth_r10.txt`). The twenty-fourth session's two servers both stalled in the "
          "64-stream level of this command.", "",
          "| streams | requests | errors | TTFA p50 / p95 ms | smooth | x real time | engine alone, same call | served / engine |",
          "|---|---|---|---|---|---|---|---|"]
    for c, lv in r10.items():
        e = {8: f"{e8:.1f}", 64: " / ".join(f"{x:.1f}" for x in e64)}.get(c, "-")
        ratio = {8: r10[8]["x_real_time"] / e8, 64: r10[64]["x_real_time"] / e64[-1]}.get(c)
        md.append(f"| {c} | {len(lv['streams'])} | {lv['errors']} | {lv['ttfa_ms']['p50']:.1f} / {lv['ttfa_ms']['p95']:.1f} | "
                  f"{lv['smooth_playback_frac']:.0%} | {lv['x_real_time']:.1f} | {e} | "
                  + (f"{ratio:.2f}" if ratio else "-") + " |")
    md += ["", f"- Every decoder call of the run was read as counted: {counted:,} counted, {waiting} by a waiting "
           "thread (`voxcpm_decoder_calls_read_total`, now saved by `run_served_gpu.sh` as `metrics.txt`). No "
           "stall, no error, and 128 streams x 10 requests finished too.",
           f"- Throughput did not move: 64 streams made {r10[64]['x_real_time']:.1f}x (the twenty-third session's "
           "same command: 452.1 and 456.6). Served over the engine at batch 64 in the same call: "
           f"{r10[64]['x_real_time'] / e64[-1]:.2f} (the engine's second run, {e64[-1]:.1f}x; "
           f"{r10[64]['x_real_time'] / e64[0]:.2f} against its first). The target is 0.85: missed. The gap is the "
           "VAE's work on the same GPU (60.8 ms per call of 64 streams x 16 patches in the twenty-fourth "
           "session: about 0.38 s per 100-step round of 64 streams, against the engine's 1.72 s) and each request's turnaround; dropping a waiting thread per stream did not show.",
           f"- 8 streams: {r10[8]['x_real_time']:.1f}x, {r10[8]['x_real_time'] / e8:.2f} of the engine's "
           f"{e8:.1f}x at batch 8 in the same call. The target (150x) is missed; the engine alone is above it.",
           "", "**The sweep on this code** (call 2, `SET=\"decoder.timestep_buckets=10,100\" ARRIVALS=burst,poisson "
           "LEVELS=1,8,32,64,96,128 REQUESTS=2`, `raw/served_twentysixth_sweep*.json`; the twenty-third "
           "session's command). Smooth / x real time / TTFA p50 / p95 ms:", "",
           "| streams | burst | Poisson | burst, twenty-third session | Poisson, twenty-third session |",
           "|---|---|---|---|---|"]
    cell = lambda lv: (f"{lv['smooth_playback_frac']:.0%} / {lv['x_real_time']:.0f} / {lv['ttfa_ms']['p50']:.0f} / "  # noqa: E731
                       f"{lv['ttfa_ms']['p95']:.0f}")
    for c in sw["burst"]:
        md.append(f"| {c} | {cell(sw['burst'][c])} | {cell(sw['poisson'][c])} | {cell(before['burst'][c])} | "
                  f"{cell(before['poisson'][c])} |")
    md += ["", f"Capacity (every stream smooth, TTFA p95 <= 500 ms at every level up to it): burst {cap['burst']}, "
           f"Poisson {cap['poisson']}, as in the twenty-third session. At 96 and 128 streams all at once 2 of 192 "
           "and 5 of 256 streams underran; the Poisson levels played 100% smoothly.", "",
           "**Every model process with metrics crashed on its way out.** The sweep's server log "
           f"(`raw/served_twentysixth_sweep_tritonserver.log`) holds {crashes_before} `Fatal Python error: "
           "Segmentation fault` after `All models are stopped`: one for each process with metrics (8 `tts` "
           "instances, 4 `tts_stream`, the decoder, `vae_decoder`) and none for the others (the twenty-fifth "
           "session's faulthandler made them visible). On this CPU (gdb on each stub during a SIGTERM) every one was in `Metric::Clear` under "
           "`~MetricFamily` under `Stub::~Stub`: python_backend r24.10 destroys the Python objects it still holds "
           "after its shared memory, and the models kept their `MetricFamily` objects to the end. Now each model "
           "with metrics (tts, tts_stream, decoder, vae_decoder) lets go of them in `finalize` "
           "(`metrics.release_all`). Call 3 (`LEVELS=8,64 REQUESTS=3`, `raw/served_twentysixth_exit*`): "
           f"{crashes_after} crashes, {unloaded} models unloaded, 64 streams at {ext[64]['x_real_time']:.1f}x. "
           "`tests/test_server.py::test_every_model_process_exits_cleanly` fails on the code before (the same "
           "crashes in its server's log) and passes now.", "",
           f"**Correctness on this code** (call 3): `gpu_check.py` passes every check "
           f"(`raw/gpu_check_twentysixth.json`): bf16 against fp32 teacher-forced cosine min "
           f"{chk['teacher_forced']['cosine_min']:.5f}, graph against eager 0.0 at batches 1, 5, 32 and 64, the VAE "
           f"as served against exact fp32 {chk['vae_graphs_vs_eager']['served_vs_exact_fp32_max_abs']:.2e} "
           f"(bound 2e-03); `tests/test_engine_gpu.py` {gpu_tests} passed (`raw/gpu_tests_twentysixth.txt`).", "",
           "![twenty-sixth session: served against the engine in one call; the sweep](results_twentysixth.png)", ""]
    _plot_twenty_sixth(r10, e8, e64[-1], sw, before)
    return md


def _plot_twenty_sixth(r10, e8, e64, sw, before):
    fig, (a, b) = stream_panels()
    paired_bars(a, ["8 streams", "64 streams"], [
        ("served, 10 requests per stream", "#286", [r10[8]["x_real_time"], r10[64]["x_real_time"]]),
        ("engine alone, same call", "#999", [e8, e64])], lambda v: f"{v:.0f}x")
    a.set_ylabel("aggregate x real time")
    a.set_title("call 1: served and the engine alone", fontsize=9)
    a.legend(fontsize=7)
    levels = sorted(sw["burst"])
    for runs, style, label in ((sw["burst"], "o-", "burst, this session"), (sw["poisson"], "s-", "Poisson, this session"),
                               (before["burst"], "o:", "burst, twenty-third"),
                               (before["poisson"], "s:", "Poisson, twenty-third")):
        b.plot(levels, [runs[c]["ttfa_ms"]["p95"] for c in levels], style, label=label)
    b.axhline(300, color="#c33", lw=0.8, ls="--", label="target at 64 streams")
    b.set_xscale("log", base=2)
    b.set_xlabel("concurrent streams")
    b.set_ylabel("TTFA p95, ms")
    b.set_title("call 2: the sweep", fontsize=9)
    b.legend(fontsize=7)
    save_panels(fig, [a, b], "Twenty-sixth session, NVIDIA H200, 2026-11-29", "results_twentysixth.png")
