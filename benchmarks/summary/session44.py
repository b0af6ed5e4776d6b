"""results.md: the forty-fourth session's section, and results_forty_fourth.png."""

from summary.issue17 import ISSUE_RATIO, ISSUE_RTF, ISSUE_TTFA, ISSUE_TTFA95_64, ISSUE_XRT64, ISSUE_XRT8, met, ok_c64
from summary.plots import save_stream_panels, stream_panels
from summary.raw import engine_runs, load, served_levels, served_summary, set_served_headline, tests_passed, text

SWEEP_44 = {"burst": "served_fortyfourth_sweep.json", "poisson": "served_fortyfourth_sweep_poisson.json"}
SWEEP_26 = {"burst": "served_twentysixth_sweep.json", "poisson": "served_twentysixth_sweep_poisson.json"}


def forty_fourth_session(res) -> list[str]:
    """2026-12-01 (issue 17): the model processes' abort at exit found and fixed (CPU); the served sweep at 1-128
    streams, burst and Poisson, with the engine at batch 64 and 1 in the same call, one and 64 streams, fp8 against
    bf16 at one stream and the GPU tests, all on this code. Replaces the served headline keys (the twenty-sixth
    session's sweep) and the fp8 ones. Sets res["forty_fourth"], returns the markdown, draws results_forty_fourth.png."""
    sweep = {a: served_levels(n) for a, n in SWEEP_44.items()}
    cap = {a: load(n)["capacity"] for a, n in SWEEP_44.items()}
    before = {a: served_levels(n) for a, n in SWEEP_26.items()}
    engine = engine_runs("offline_b64_b1_fortyfourth.json", "aggregate_xrt")
    engine_b1 = next(r for r in load("offline_b64_b1_fortyfourth.json")["engine"]["graphs"]["runs"] if r["batch"] == 1)
    r5 = served_levels("served_r5_fortyfourth.json")
    one = {p: served_levels(f"served_{p}_fortyfourth.json")[1] for p in ("bf16", "fp8")}
    log = text("served_fortyfourth_sweep_tritonserver.log")
    fatal, unloaded = log.count("Fatal Python error"), log.count("successfully unloaded")
    pa, pa_h100 = load("perf_analyzer_fortyfourth.json"), served_levels("perf_analyzer.json")
    pa_fatal = text("perf_analyzer_fortyfourth_tritonserver.log").count("Fatal Python error")
    chained = {r["M"]: {k: v["us_per_layer"] for k, v in r.items() if k.startswith("persistent_chained")}
               for r in load("kernel_fused_layer_pdl_modes_fortythird.json")["layers"] if "M" in r}
    tests = {"fp8_engine": tests_passed("gpu_tests_fp8_engine_fortyfourth.txt"),
             "engine": tests_passed("gpu_tests_engine_fortyfourth.txt")}
    b = sweep["burst"]
    ratio = b[64]["x_real_time"] / engine[64]
    set_served_headline(res, b, cap, "forty-fourth session, NVIDIA H200, 2026-12-01, raw/served_fortyfourth_sweep*.json "
                        "(one stream: raw/served_bf16_fortyfourth.json, 10 requests)")
    # The sweep's one-stream level ran 2 requests; call 4's bf16 server ran 10 on the same code.
    res.update({"single_stream_rtf_triton": one["bf16"]["rtf"]["p50"], "ttfa_ms_p50": one["bf16"]["ttfa_ms"]["p50"],
                "ttfa_ms_p95": one["bf16"]["ttfa_ms"]["p95"],
                "single_stream_rtf_triton_fp8": one["fp8"]["rtf"]["p50"], "ttfa_ms_p50_fp8": one["fp8"]["ttfa_ms"]["p50"]})
    res["forty_fourth"] = {
        "device": "NVIDIA H200",
        "served_sweep": {a: {c: served_summary(lv) for c, lv in x.items()} for a, x in sweep.items()},
        "capacity": cap,
        "engine_same_call_xrt": engine, "engine_b1_steps_per_s": engine_b1["steps_per_s"],
        "served_over_engine_c64_same_call": ratio,
        "served_1_64_requests_5": {c: served_summary(lv) for c, lv in r5.items()},
        "one_stream_10_requests": {p: served_summary(lv) for p, lv in one.items()},
        "sweep_server_exit": {"fatal_python_errors": fatal, "models_unloaded": unloaded},
        "gpu_tests": tests,
        "perf_analyzer_tts_stream": {lv["concurrency"]: {"infer_per_s": lv["infer_per_s"], "latency_ms_p50":
                                                         lv["latency_ms"]["p50"], "x_real_time": lv["x_real_time"]}
                                     for lv in pa["levels"]},
    }
    cell = lambda lv: (f"{lv['smooth_playback_frac']:.0%} / {lv['x_real_time']:.1f} / {lv['ttfa_ms']['p50']:.0f} / "  # noqa: E731
                       f"{lv['ttfa_ms']['p95']:.0f}")
    all_smooth = all(lv["smooth_playback_frac"] == 1 and not lv["errors"] for x in sweep.values() for lv in x.values())
    md = ["", "## Forty-fourth session (2026-12-01, H200): model processes no longer abort at exit; the served sweep "
          f"on this code: 128 streams at {b[128]['x_real_time']:.0f}x, "
          f"{'every level smooth' if all_smooth else 'not every level smooth'}", "",
          "Five device calls (about 23 of 30 min). No new speed lever: the session fixed the exit abort that failed CI "
          "now and then, then measured the code as it stands, for the record and for the targets.", "",
          "**The abort at exit** (CPU; `runtime.exit_without_teardown`). Now and then, while Triton unloaded the "
          "models, a model process printed `terminate called without an active exception` / `Fatal Python error: "
          "Aborted` and the exit tests failed (the thirty-fourth and forty-third sessions' CI runs).",
          "- Cause: CPython's teardown (3.11 here; up to 3.13) ends each daemon thread that next takes the GIL with "
          "`pthread_exit`. Inside "
          "a C++ call that released the GIL (any torch op) the unwinding meets a noexcept frame and the whole process "
          "aborts. An embedded Python 3.11 with one daemon thread in `torch.mm` aborted 15 of 15 times with the same "
          "output (faulthandler's list of extension modules included); with threads in `time.sleep` or `Event.wait`, "
          "0 of 30.",
          "- Which thread did it in CI is not known: 47 runs of the two exit tests here did not fail, and at exit the "
          "processes' remaining threads were all idle in pure C waits. So the fix covers every thread: each model.py "
          "calls `exit_without_teardown` first, before torch is imported; in a stub process it registers an exit "
          "handler that runs after the stub has finalized the model and let go of its shared memory, and after the exit "
          "handlers registered later (torch's among them); it flushes logging and stdio and calls `os._exit(0)`. "
          "Skipped: the interpreter's teardown itself, C-level exit handlers and static destructors.",
          "- Test: `tests/test_infra.py` serves a model whose daemon thread is always inside `torch.mm` "
          "(`tests/fixtures/exit_repo`), with and without the handler; with it, the server "
          "exits 0, the model unloads, no fatal error, an exit handler registered after it still runs and the line it "
          "prints unflushed reaches the log. Without it, the fixture aborted in all 14 runs here. Another test checks that "
          "every model.py calls it before its other imports.",
          f"- On the GPU, the sweep's server (call 1, this code): {unloaded} models unloaded, {fatal} fatal errors.", "",
          "**The served sweep** (call 1: `SET=\"decoder.timestep_buckets=10,100\" ARRIVALS=burst,poisson "
          "LEVELS=1,8,32,64,96,128 REQUESTS=2 bash benchmarks/run_served_gpu.sh`, `raw/served_fortyfourth_sweep*`; "
          "the twenty-sixth session's command, whose sweep was the headline until now). Smooth / x real time / TTFA "
          "p50 / p95 ms:", "",
          "| streams | burst | Poisson | burst, twenty-sixth session | Poisson, twenty-sixth session |",
          "|---|---|---|---|---|"]
    for c in b:
        md.append(f"| {c} | {cell(b[c])} | {cell(sweep['poisson'][c])} | {cell(before['burst'][c])} | "
                  f"{cell(before['poisson'][c])} |")
    md += ["", f"- Capacity (every stream smooth and TTFA p95 <= 500 ms at every level up to it): burst {cap['burst']}, "
           f"Poisson {cap['poisson']} (the sweep's top level)"
           f"{': every level of both played smoothly, with no errors' if all_smooth else ''}. 8 streams at once: "
           f"{b[8]['x_real_time']:.1f}x; 128: {b[128]['x_real_time']:.1f}x (TTFA p95 {b[128]['ttfa_ms']['p95']:.0f} ms).",
           f"- Engine alone in the same call, after the server (`bench.py --checkpoint /tmp/full --timestep-buckets "
           f"10,100 --reference none --no-vae --graphs-only --no-profile --batches 64,1`, "
           f"`raw/offline_b64_b1_fortyfourth.{{json,log}}`): batch 64 {engine[64]:.1f}x, batch 1 "
           f"{engine_b1['steps_per_s']:.1f} steps/s (RTF {engine_b1['rtf']:.4f}). Served over engine at 64 streams: "
           f"{b[64]['x_real_time']:.1f} / {engine[64]:.1f} = {ratio:.3f}.",
           f"- The sweep's one-stream level ran 2 requests: RTF {b[1]['rtf']['p50']:.4f}, TTFA p50 "
           f"{b[1]['ttfa_ms']['p50']:.1f} ms. The headline's one-stream keys come from call 4's bf16 server below "
           "(10 requests).", "",
           "**One and 64 streams** (call 3: `SET=\"decoder.timestep_buckets=10,100\" LEVELS=1,64 REQUESTS=5`, the "
           "forty-second and forty-third sessions' command, `raw/served_r5_fortyfourth.*`): "
           f"1 stream RTF {r5[1]['rtf']['p50']:.4f}, TTFA p50 / p95 {r5[1]['ttfa_ms']['p50']:.1f} / "
           f"{r5[1]['ttfa_ms']['p95']:.1f} ms; 64 streams {r5[64]['x_real_time']:.1f}x, "
           f"{r5[64]['smooth_playback_frac']:.0%} smooth, TTFA p95 {r5[64]['ttfa_ms']['p95']:.0f} ms "
           "(the forty-third session: 0.0365, 20.4 ms; 532.17x, 100%, 200 ms).", "",
           "**fp8 against bf16 at one stream** (call 4: `SET=\"decoder.precision=fp8|bf16 "
           "decoder.timestep_buckets=10,100\" LEVELS=1 REQUESTS=10`, one server after the other, "
           "`raw/served_{fp8,bf16}_fortyfourth.*`): fp8 RTF "
           f"{one['fp8']['rtf']['p50']:.4f}, TTFA p50 {one['fp8']['ttfa_ms']['p50']:.1f} ms; bf16 "
           f"{one['bf16']['rtf']['p50']:.4f}, {one['bf16']['ttfa_ms']['p50']:.1f} ms. fp8 is "
           f"{'still slower' if one['fp8']['rtf']['p50'] > one['bf16']['rtf']['p50'] else 'now faster'} at one "
           "stream (the fortieth session: 0.051 against 0.043); `single_stream_rtf_triton_fp8` and `ttfa_ms_p50_fp8` "
           "now come from this call.", "",
           f"**GPU tests** (call 2): `tests/test_fp8_model.py -k engine` {tests['fp8_engine']} "
           "(`raw/gpu_tests_fp8_engine_fortyfourth.txt`): bf16 and fp8 engines compiled and captured, fp8 through "
           "the compiled Euler steps, for the first time on a GPU (it ran out of its time limit in the forty-second "
           "session). `tests/test_engine_gpu.py -k 'graphs_compile or lora_rows or sweep'` "
           f"{tests['engine']} (`raw/gpu_tests_engine_fortyfourth.txt`).", "",
           "**`perf_analyzer --streaming` on the H200** (call 5: `PERF_ANALYZER=1 SET=\"decoder.timestep_buckets=10,100\" "
           "bash benchmarks/run_served_gpu.sh`, perf_analyzer 2.51 from `.cache/perf_analyzer_bundle`, 100-step requests, "
           "windows of 6 s; `raw/perf_analyzer_fortyfourth.{json,csv,log}`; latency is a request's whole utterance, "
           f"send to last audio chunk; the server log holds {pa_fatal} fatal errors). Against the ninth session's run on "
           "an H100 (`raw/perf_analyzer.json`):", "",
           "| concurrency | requests/s | latency p50 ms | x real time | ninth session (H100): requests/s, x real time |",
           "|---|---|---|---|---|"]
    for lv in pa["levels"]:
        old = pa_h100.get(lv["concurrency"], {})
        md.append(f"| {lv['concurrency']} | {lv['infer_per_s']:.2f} | {lv['latency_ms']['p50']:.0f} | "
                  f"{lv['x_real_time']:.1f} | {old.get('infer_per_s', 0):.2f}, {old.get('x_real_time', 0):.1f} |")
    md += ["", "- perf_analyzer keeps every stream busy for its windows (no burst's ramp up and down), so its 64-stream "
           f"figure ({pa['levels'][-1]['x_real_time']:.1f}x) is above `bench_served.py`'s burst level.", "",
           "**The forty-third session's one lead, not run.** Six pipeline stages with programmatic dependent launch "
           "were about 1 us faster per layer in isolation. In the same call (`raw/kernel_fused_layer_pdl_modes_"
           "fortythird.json`), the chained layers the engine runs took "
           f"{chained[22]['persistent_chained']:.2f} -> {chained[22]['persistent_chained_stages6_pdl']:.2f} us at 22 "
           f"tokens (LocDiT) and {chained[10]['persistent_chained']:.2f} -> "
           f"{chained[10]['persistent_chained_stages6_pdl']:.2f} us at 10 (LocEnc)"
           + (": slower at one of the two, so nothing to take into the engine." if any(
               c["persistent_chained_stages6_pdl"] > c["persistent_chained"] for c in chained.values()) else "."), "",
           "**Against issue 17's targets** (this session's figures):", "",
           "| target | measured | |", "|---|---|---|",
           f"| one stream RTF <= {ISSUE_RTF} | {one['bf16']['rtf']['p50']:.4f} | "
           f"{met(one['bf16']['rtf']['p50'] <= ISSUE_RTF)} |",
           f"| one stream TTFA p50 <= {ISSUE_TTFA} ms | {one['bf16']['ttfa_ms']['p50']:.1f} ms | "
           f"{met(one['bf16']['ttfa_ms']['p50'] <= ISSUE_TTFA)} |",
           f"| 8 streams >= {ISSUE_XRT8}x | {b[8]['x_real_time']:.1f}x | {met(b[8]['x_real_time'] >= ISSUE_XRT8)} |",
           f"| 64 streams >= {ISSUE_XRT64}x, smooth 100%, TTFA p95 <= {ISSUE_TTFA95_64} ms | "
           f"{b[64]['x_real_time']:.1f}x, {b[64]['smooth_playback_frac']:.0%}, {b[64]['ttfa_ms']['p95']:.0f} ms | "
           f"{met(ok_c64(b[64]))} |",
           f"| capacity >= 128 (burst / Poisson) | {cap['burst']} / {cap['poisson']} | "
           f"{met(min(cap.values()) >= 128)} |",
           f"| served / engine at 64 streams >= {ISSUE_RATIO} | {ratio:.3f} | {met(ratio >= ISSUE_RATIO)} |", "",
           "![forty-fourth session: the served sweep, burst and Poisson, against the twenty-sixth session's]"
           "(results_forty_fourth.png)", ""]
    _plot(sweep, before)
    return md


def _plot(sweep, before):
    fig, (a, b) = stream_panels()
    for runs, style, when in ((sweep, "-", "this session"), (before, ":", "twenty-sixth session")):
        for arrivals, marker, color in (("burst", "o", "#26a"), ("poisson", "s", "#d72")):
            xs = sorted(runs[arrivals])
            for ax, y in ((a, lambda lv: lv["x_real_time"]), (b, lambda lv: lv["ttfa_ms"]["p95"])):
                ax.plot(xs, [y(runs[arrivals][x]) for x in xs], marker + style, color=color,
                        label=f"{arrivals}, {when}")
    a.axhline(500, color="#c33", lw=0.8, ls="--", label="target at 64 streams")
    a.set_ylabel("aggregate x real time")
    b.axhline(300, color="#c33", lw=0.8, ls="--", label="64 streams' TTFA p95 target")
    b.set_ylabel("TTFA p95, ms")
    save_stream_panels(fig, (a, b), "concurrent streams", "Served sweep (H200): every level smooth",
                       "results_forty_fourth.png")
