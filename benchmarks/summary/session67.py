"""results.md: the sixty-seventh session's section, and results_sixty_seventh.png."""

import os
import re

from served_timeline import dry_streams, load_timeline_tar, stream_path
from summary.plots import pyplot, save_panels
from summary.raw import HERE, gpu_check_record, load, text
from summary.session58 import crowd_stats, level_cells, smooth_cells, span

S = "sixtyseventh"
TRANSPORT_LATE_MS = 10.0  # as the sixty-sixth session: a chunk that reached its client this much after its emit
# the LoRA merge diagnostic's variants (raw/lora_merge_diag_<variant>_*.txt): what each changed
DIAG = {
    "default": "as the test (fp32, PyTorch attention, the LoRA Triton kernel)",
    "log": "as the test, each run also against the offline API's run",
    "dtype_bf16": "bf16 (the served default) instead of fp32",
    "nokernel": "the LoRA ops in PyTorch, not the kernel",
    "lm_only": "adapters on the LMs' sites only",
    "dit_only": "adapters on LocDiT's sites only",
    "alone": "request A alone (no B beside it)",
    "ownpool": "every decode graph in a memory pool of its own",
    "noprefix": "prefix caching off",
    "otherprompt": "B on another prompt",
    "nob1": "`batch_buckets=(2, 4)`: no bucket of 1",
    "nofsq": "the FSQ's rounding taken out (tanh, then the projection back)",
}


def _diag(variant: str) -> dict:
    """The diagnostic's per-patch errors of request A: merged-vs-ops (and each against the offline run, where
    printed), max over patches, and the first patch over 1e-3 (None: none)."""
    out = {}
    for line in text(f"lora_merge_diag_{variant}_{S}.txt").splitlines():
        m = re.match(r"DIAG \S+ A (?:scale \S+ )?(merged-vs-ops per patch|merged-vs-offline|ops-vs-offline):? (.*)",
                     line)
        if m:
            errs = [float(x) for x in m.group(2).split()]
            out[m.group(1).split()[0]] = {"max": max(errs), "first_over_1e-3": next(
                (i for i, e in enumerate(errs) if e > 1e-3), None)}
    return out


def _fsq_distances() -> list[float]:
    """The offline run's FSQ calls (the prefill, then each step): the least distance of tanh(in_proj(x)) * scale
    to a rounding boundary."""
    line = next(x for x in text(f"lora_merge_diag_fsqdist_{S}.txt").splitlines() if x.startswith("FSQDIST"))
    return [float(x) for x in line.split(":", 1)[1].split()]


def _bisect() -> list[tuple[str, bool]]:
    return [(line.split()[0], "passed" in line) for line in text(f"lora_merge_bisect_{S}.txt").splitlines()
            if line and not line.startswith("#")]


def _pytest_tail(name: str) -> str:
    return next(x for x in reversed(text(name).splitlines()) if " in " in x and ("passed" in x or "failed" in x))


def sixty_seventh_session(res) -> list[str]:
    """2026-12-04 (issue 17): the GPU checks on the sixty-sixth session's code, the LoRA merge test's failure
    traced to the FSQ's rounding (the test fixed), and one server at 1-128 streams with the clients in one
    process and in four, the engine alone at batch 64 in the same call. Sets res["sixty_seventh"], returns the
    markdown, draws results_sixty_seventh.png."""
    served = load(f"served_c67_{S}.json")
    levels = served["levels"]
    at = lambda c, p: [lv for lv in levels if lv["concurrency"] == c and lv["client_processes"] == p]  # noqa: E731
    engine = [r["aggregate_xrt"] for r in load(f"offline_b64_{S}.json")["engine"]["graphs"]["runs"]]
    check = load(f"gpu_check_{S}.json")
    events = load_timeline_tar(os.path.join(HERE, "raw", f"timeline_c67_{S}.tar.gz"))
    crowd = {p: crowd_stats(at(128, p)) for p in (1, 4)}
    # every dry stream of the levels of 128 and its chunks' path, once
    paths = [(s, stream_path(lv, events, s)) for p in (1, 4) for lv in at(128, p) for s in dry_streams(lv)]
    # ms dry, and the ms its late chunk took from the orchestrator's emit to the client
    dry = [(s["underrun_s"] * 1e3, path["client_lag_ms"][s["underrun_chunk"]]) for s, path in paths
           if len(path["client_lag_ms"]) > s["underrun_chunk"]]
    all_lags = [lag for _, path in paths for lag in path["client_lag_ms"]]
    diag = {v: _diag(v) for v in DIAG}
    nofsq_max = max(diag["nofsq"][k]["max"] for k in ("ops-vs-offline", "merged-vs-offline"))
    steps_fsq = _fsq_distances()[1:]  # the first FSQ call is the prefill's
    bisect = _bisect()
    first_bad = next(c for c, ok in bisect if not ok)
    last_good = [c for c, ok in bisect if ok][-1]
    c64 = max(lv["x_real_time"] for lv in levels if lv["concurrency"] == 64)
    res["sixty_seventh"] = {
        "device": "NVIDIA H200",
        "requests_per_stream": 3,
        "levels": [{"streams": lv["concurrency"], "client_processes": lv["client_processes"],
                    "x_real_time": lv["x_real_time"], "smooth": lv["smooth_playback_frac"],
                    "ttfa_p50": lv["ttfa_ms"]["p50"], "ttfa_p95": lv["ttfa_ms"]["p95"], "rtf_p50": lv["rtf"]["p50"],
                    "client_cpu_per_s": lv["client_cpu_per_s"]} for lv in levels],
        "c128_by_client_processes": crowd,
        "dry_c128": {"streams": len(dry), "ms_max": max(ms for ms, _ in dry) if dry else 0.0,
                     "transport_late": sum(lag > TRANSPORT_LATE_MS for _, lag in dry)},
        "engine_b64_xrt": engine,
        "served_over_engine_c64": c64 / max(engine),
        "gpu_check": gpu_check_record(check),
        "lora_merge_test": {"first_failing_commit": first_bad, "last_passing_commit": last_good,
                            "fsq_boundary_distance_min_steps": min(steps_fsq),
                            "diag": diag},
    }
    near = min(range(len(steps_fsq)), key=lambda i: steps_fsq[i])
    rest = sorted(steps_fsq)[1]
    md = ["", "## Sixty-seventh session (2026-12-04, H200): the GPU checks on the sixty-sixth session's code; the LoRA "
          "merge test's failure is the FSQ's rounding of a ~1e-6 difference (merged weights against LoRA ops) "
          "near a boundary, not a bug (the test fixed); one server at 1-128 streams with the clients in one process and in four, and the engine "
          "alone at batch 64 in the same call",
          "", "Seven device calls on H200 machines (nearly all of the 30 min; one more was lost when the machine was taken "
          f"back). The driver is `raw/devrun_{S}.sh`.",
          "", f"**GPU correctness on the sixty-sixth session's code** (call 1): `gpu_check.py --checkpoint /tmp/full "
          f"--only decoder --timestep-buckets 10,100` passes (`raw/gpu_check_{S}.{{json,log}}`: bf16 against fp32 "
          f"teacher-forced cosine min {check['teacher_forced']['cosine_min']:.5f}, graph replay against the eager "
          f"step max abs {res['sixty_seventh']['gpu_check']['graph_vs_eager_max_abs']:.1f} at batches "
          f"{', '.join(check['graph_vs_eager'])}). `tests/test_engine_gpu.py tests/test_torch_calls_per_row.py` on the GPU: "
          f"{_pytest_tail(f'gpu_tests_{S}.txt')} (`raw/gpu_tests_{S}.txt`); the failure was "
          "`test_one_adapter_merged_on_the_gpu_gives_its_lora_ops_latents`, max error 0.475 where it allows 1e-3.",
          "", "**Why the LoRA merge test failed.** The test runs request A on an adapter alone, then with base "
          "request B beside it, then alone again, once with the adapter merged into the weights and once with "
          "each row's LoRA ops, and holds the two runs' latents within 1e-3 (fp32). No raw record shows it run on a "
          "GPU since the twenty-ninth session. A diagnostic copy printed A's error patch by patch, and each run "
          "against the offline API's run of A (`VoxCPM2.generate_latents`: eager, alone; call 3 on) (calls 2, 3, "
          f"5, 6; `raw/lora_merge_diag_<variant>_{S}.txt`):", "",
          "| variant | merged vs LoRA ops, max | first patch over 1e-3 |", "|---|---|---|"]
    for v, what in DIAG.items():
        d = diag[v].get("merged-vs-ops") or {}
        if d:
            md.append(f"| {what} | {d['max']:.1e} | {d['first_over_1e-3'] if d['first_over_1e-3'] is not None else 'none'} |")
    md += ["",
           f"- Every run repeated itself exactly, and in the failing ones the LoRA-op run left the offline run at patch "
           f"{diag['log']['ops-vs-offline']['first_over_1e-3']} (errors of 1e-6 to 6e-6 before it, 0.045 at it), "
           "while the merged run stayed within 4e-6 of it throughout. B's prompt, prefix caching and the graphs' "
           "memory pool changed nothing; A alone, or either adapter group alone, did not fail. In bf16 the two "
           "runs differ from the first patch on (bf16 rounds the merged weights), as expected.",
           f"- Each commit's own test, thirteen commits side by side (call 4, `raw/lora_merge_bisect_{S}.txt`): "
           f"it passed up to {last_good} and failed from {first_bad} on, the commit that gave a lone request a "
           "batch bucket of 1. Both runs launch the same buckets (1 alone, 2 beside B, before it 2 throughout); "
           "what differs between them is merged weights against LoRA ops, ~1e-6 to 6e-6 in A's latents with or "
           "without the bucket of 1 (`nob1`). The bucket of 1 changed A's arithmetic, so its path.",
           "- The base LM's output goes through the FSQ bottleneck, `round(tanh(x W) * scale) / scale`. The offline "
           "run's FSQ inputs (call 6's `fsqdist`): the nearest to a rounding boundary at each step was "
           f"{rest:.0e} or more in units of tanh * scale, except step {near}'s, {steps_fsq[near]:.1e} from it "
           f"({steps_fsq[near] / 9:.1e} in tanh's output; scale 9): within the two runs' differences by then, so "
           "the LoRA-op run rounded the other way there, and the next patch differed by 0.045. With the rounding "
           "taken out (`nofsq`) "
           f"every patch of both runs stays within {nofsq_max:.1e} of the offline run.",
           "- So no bug in the merge or in serving: two computations that round differently (here merged weights "
           "against LoRA ops; also one batch size against another) can part at an FSQ boundary. The test now quantizes finely (`fsq_layer.scale = 2**22` in it), so it still checks the merge "
           f"against the LoRA ops through the graphs: {_pytest_tail(f'gpu_test_merged_fixed_{S}.txt')} on the GPU "
           f"(call 7, `raw/gpu_test_merged_fixed_{S}.txt`). After that call the test also holds A's merged run over "
           "0.1 from A's run without the adapter, so a merge that did nothing fails it (on the CPU, with the test's "
           "adapter sizes, two draws moved A by 0.67 and 1.40 at the first patch); not yet run on a GPU. The twenty-ninth session's unexplained failures of "
           "the same test (0.74, 1.37) may have been the same rounding with that experiment's other timing, or a race "
           "(the experiment also hung); not checked.",
           "", "**The served levels** (call 7, one server, this code; `SERVER_ENV=VOXCPM_TIMELINE=... "
           "SET=decoder.timestep_buckets=10,100 ARRIVALS=burst LEVELS=1,8,64,128,128,128 REQUESTS=3 "
           "CLIENT_PROCESSES=1,4 bash benchmarks/run_served_gpu.sh`, `raw/served_c67_"
           f"{S}.{{json.gz,log}}`, `raw/metrics_c67_{S}.txt`, `raw/timeline_c67_{S}.tar.gz`). New: "
           "`bench_served.py --client-processes`, the level's workers spread over client processes (one Python "
           "process's threads share one GIL, and a chunk can wait for it before it is timestamped); each level ran "
           "with the clients in one process, then in four (dry: any stream behind its player at some chunk, "
           "smooth: none more than 1 ms behind):", "",
           "| client processes | streams | x real time | smooth | TTFA p50 / p95 ms | dry | late ms |",
           "|---|---|---|---|---|---|---|"]
    for lv in levels:
        md.append(f"| {lv['client_processes']} | {level_cells(lv)} |")
    md += ["", "| client processes | levels of 128 | every stream smooth | least smooth | x real time, median (range) "
           "| TTFA p50 range / worst p95 ms |", "|---|---|---|---|---|---|"]
    for p in (1, 4):
        st = crowd[p]
        md.append(f"| {p} | {smooth_cells(st)} | {span(st['ttfa_p50_ms'])} / {st['ttfa_p95_ms_max']:.0f} |")
    engine_s = ", ".join(f"{x:.1f}" for x in engine)
    ones = [lv for lv in levels if lv["concurrency"] == 1]
    ttfa128 = ", ".join("{:.0f}".format(lv["ttfa_ms"]["p50"]) for lv in levels if lv["concurrency"] == 128)
    md += ["",
           f"- 128 at once: every stream smooth in {crowd[1]['all_smooth'] + crowd[4]['all_smooth']} of 6 levels "
           "(the sixty-sixth session's 3 of 3 was a small sample). Its "
           f"{len(dry)} dry streams ({sum(ms > 1 for ms, _ in dry)} over 1 ms) were all a later wave's second "
           f"chunk, at most {max(ms for ms, _ in dry):.1f} ms late. Their chunks reached the clients "
           f"{min(all_lags):.1f}-{max(all_lags):.1f} ms after the orchestrator sent them, with the clients in one "
           "process or four: the lateness was the server's. The transport's late chunks of the sixty-sixth session "
           "(over 10 ms) did not come back.",
           "- Four client processes against one: throughput the same (64 streams "
           f"{at(64, 4)[0]['x_real_time']:.1f}x and {at(64, 1)[0]['x_real_time']:.1f}x); TTFA p50 lower at 8 and 64 "
           f"streams ({at(8, 4)[0]['ttfa_ms']['p50']:.0f}, {at(64, 4)[0]['ttfa_ms']['p50']:.0f} against "
           f"{at(8, 1)[0]['ttfa_ms']['p50']:.0f}, {at(64, 1)[0]['ttfa_ms']['p50']:.0f} ms), higher at 128, where "
           "each four-process level ran after a one-process one (TTFA p50 " f"{ttfa128}" " ms in the order run, the last "
           "two levels the highest, the last also the slowest). One server: no claim either way. The levels' "
           "client CPU (in the raw JSON) counted the four processes' start, spawn and imports, in this run; "
           "bench_served now counts a client process from its streams' setup.",
           f"- The engine alone at batch 64 after the server, same call (`bench.py --checkpoint /tmp/full "
           "--timestep-buckets 10,100 --reference none --no-vae --graphs-only --no-profile --batches 64,64`, "
           f"`raw/offline_b64_{S}.{{json,log}}`): {engine_s}x. Served (the faster 64-stream level) over "
           f"the faster engine run: {c64 / max(engine):.3f} (issue 17 asks 0.85; the fifty-fifth session's call 0.743).",
           f"- One stream (its two levels; a level of one stream runs in one client process): RTF "
           f"{ones[0]['rtf']['p50']:.4f} and {ones[1]['rtf']['p50']:.4f} ({ones[0]['x_real_time']:.1f}x, "
           f"{ones[1]['x_real_time']:.1f}x), TTFA p50 {ones[0]['ttfa_ms']['p50']:.1f} and "
           f"{ones[1]['ttfa_ms']['p50']:.1f} ms; 8 streams {at(8, 1)[0]['x_real_time']:.1f}x and "
           f"{at(8, 4)[0]['x_real_time']:.1f}x.",
           "- Issue 17's targets: unchanged. Met: TTFA p50, 8 streams, 64 streams (aggregate, smooth, TTFA p95), "
           "capacity 128 with Poisson arrivals (carried over: not re-measured). Missed: one stream RTF <= 0.025, served/engine >= 0.85, 128 at once "
           "reliably smooth.", ""]
    _plot(levels)
    return md


def _plot(levels: list):
    """Left: x real time of each level of 128 in order, by client processes. Right: its TTFA p50 and p95."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.3))
    crowd = [lv for lv in levels if lv["concurrency"] == 128]
    for p, colour in ((1, "tab:blue"), (4, "tab:orange")):
        idx = [i + 1 for i, lv in enumerate(crowd) if lv["client_processes"] == p]
        xs = [lv for lv in crowd if lv["client_processes"] == p]
        a.plot(idx, [lv["x_real_time"] for lv in xs], "o", color=colour, label=f"clients in {p} process(es)")
        b.plot(idx, [lv["ttfa_ms"]["p50"] for lv in xs], "o", color=colour, label=f"p50, {p} process(es)")
        b.plot(idx, [lv["ttfa_ms"]["p95"] for lv in xs], "^", color=colour, label=f"p95, {p} process(es)")
    a.set_xlabel("level of 128 streams at once, in the order run")
    a.set_ylabel("aggregate x real time")
    a.legend(fontsize=7)
    b.set_xlabel("level of 128 streams at once, in the order run")
    b.set_ylabel("first audio, ms")
    b.legend(fontsize=7)
    save_panels(fig, [a, b], "sixty-seventh session (H200): 128 streams at once, clients in one process or four",
                "results_sixty_seventh.png")
