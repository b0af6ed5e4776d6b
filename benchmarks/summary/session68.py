"""results.md: the sixty-eighth session's section, and results_sixty_eighth.png."""

import re

from bench_served import capacity, share
from summary.plots import pyplot, save_panels
from summary.raw import (gpu_check_record, gpu_check_sentence, gpu_test_summaries, load, served_row, test_counts,
                         text)
from summary.session56 import dry_counts
from summary.session58 import crowd_stats, dry_late_ms, first_audio_stats, level_cells, smooth_cells, span

S = "sixtyeighth"
# calls 3 and 4: (call, server's place in its call, playback_margin_ms); raw name served_margin_c{call}s{place}_m{margin}
MARGIN_RUNS = [(3, 1, 150), (3, 2, 100), (3, 3, 150), (4, 1, 100), (4, 2, 150), (4, 3, 100)]
# the decoder's execute() probe: its parts, in order
EXEC_PARTS = {"x_sender": "the counting sender", "x_prompt": "the prompt", "x_first": "the empty first response",
              "x_submit": "the engine's submit"}
LOG_ONLY = {(3, 3, 150)}  # its files did not come back (8 files a call): the lines the driver printed
# bench_served's markdown row: conc | streams | errors | TTFA p50 | TTFA p95 | RTF p50 | RTF p95 | faster | smooth | x-RT
ROW = re.compile(r"^\| (\d+) \| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| [\d.]+ \| [\d.%]+ \| ([\d.]+)% \| "
                 r"([\d.]+) \|")


def _margin_name(call: int, place: int, margin: int) -> str:
    return f"served_margin_c{call}s{place}_m{margin}_{S}"


def _log_levels(name: str) -> list[dict]:
    """A server's levels from its printed table rows (no per-stream data: no dry streams)."""
    out = []
    for m in map(ROW.match, text(name).splitlines()):
        if m:
            out.append({"concurrency": int(m[1]), "errors": int(m[3]), "ttfa_ms": {"p50": float(m[4]), "p95": float(m[5])},
                        "rtf": {"p50": float(m[6])}, "smooth_playback_frac": float(m[7]) / 100,
                        "x_real_time": float(m[8]), "streams": None})
    return out


def _margin_levels(run) -> list[dict]:
    name = _margin_name(*run)
    return _log_levels(f"{name}.log") if run in LOG_ONLY else load(f"{name}.json")["levels"]


def sixty_eighth_session(res) -> list[str]:
    """2026-12-04 (issue 17): every GPU test file and gpu_check on f987a71; the closing sweep (burst and
    Poisson, 1-128 streams) with the engine alone in the same call; `playback_margin_ms` 150 against 100 at 64
    and 128 streams at once. Sets res["sixty_eighth"] and the 128-stream and capacity headline keys, returns the
    markdown, draws results_sixty_eighth.png."""
    tests = gpu_test_summaries(f"gpu_tests_summary_{S}.txt")
    execute = {m[1]: (float(m[2]), float(m[3])) for m in re.finditer(
        r"^(\w+) \d+ p50 ([\d.]+) mean ([\d.]+)$", text(f"decoder_execute_probe_{S}.txt"), re.M)}
    check = load(f"gpu_check_{S}.json")
    vae = check["vae_graphs_vs_eager"]
    burst = {lv["concurrency"]: lv for lv in load(f"served_closing_{S}.json")["levels"]}
    poisson = {lv["concurrency"]: lv for lv in load(f"served_closing_{S}_poisson.json")["levels"]}
    cap = {"burst": capacity(list(burst.values())), "poisson": capacity(list(poisson.values()))}
    engine = load(f"offline_b64_b1_{S}.json")["engine"]["graphs"]["runs"]
    e64 = [r["aggregate_xrt"] for r in engine if r["batch"] == 64]
    e1 = next(r for r in engine if r["batch"] == 1)
    ratio = burst[64]["x_real_time"] / max(e64)
    margins = {run: _margin_levels(run) for run in MARGIN_RUNS}
    by_margin = {m: [lv for run, lvs in margins.items() if run[2] == m for lv in lvs if lv["concurrency"] == 128]
                 for m in (100, 150)}
    c64_by_margin = {m: [lv["x_real_time"] for run, lvs in margins.items() if run[2] == m for lv in lvs
                         if lv["concurrency"] == 64] for m in (100, 150)}
    # the dry streams of the levels with per-stream data; the rest over every level, those known from a log too
    stats = {m: {k: v for k, v in crowd_stats([lv for lv in lvs if lv["streams"] is not None]).items()
                 if k.endswith("_dry")} | first_audio_stats(lvs) for m, lvs in by_margin.items()}
    # the default's levels of 128 at once this session: the sweep's and the margin servers' at 100 ms
    default128 = [burst[128]] + by_margin[100]
    res["sixty_eighth"] = {
        "device": "NVIDIA H200",
        "gpu_tests": tests,
        "gpu_check": gpu_check_record(check) | {"vae_served_vs_exact_fp32": vae["served_vs_exact_fp32_max_abs"],
                                                "vae_pass": vae["pass"]},
        "sweep": {"burst": {n: served_row(lv) for n, lv in burst.items()},
                  "poisson": {n: served_row(lv) for n, lv in poisson.items()}, "capacity": cap,
                  "requests_per_stream": 2},
        "engine": {"xrt_b64": e64, "rtf_b1": e1["rtf"], "steps_per_s_b1": e1["steps_per_s"]},
        "served_over_engine_c64": ratio,
        "margin_c128": {str(m): st for m, st in stats.items()},
        "margin_c64_xrt": {str(m): v for m, v in c64_by_margin.items()},
        "decoder_execute_ms_cpu": {k: {"p50": v[0], "mean": v[1]} for k, v in execute.items()},
        "default_c128_levels_all_smooth": [sum(lv["smooth_playback_frac"] == 1 for lv in default128), len(default128)],
    }
    # the levels of 128 at once on this serving code: the sixty-seventh session's (f987a71's serving code too)
    prev128 = [lv for lv in res["sixty_seventh"]["levels"] if lv["streams"] == 128]
    ok, levels128 = res["sixty_eighth"]["default_c128_levels_all_smooth"]
    ok_all, n_all = ok + sum(lv["smooth"] == 1 for lv in prev128), levels128 + len(prev128)
    least = min([lv["smooth"] for lv in prev128] + [lv["smooth_playback_frac"] for lv in default128])
    source = res["served_headline_source"].split("; 128 streams and capacity:")[0]
    res.update({"aggregate_xrt_c128": burst[128]["x_real_time"], "capacity_streams": cap,
                "served_headline_source": f"{source}; 128 streams and capacity: sixty-eighth session's sweep, "
                                          f"raw/served_closing_{S}*.json (f987a71, 2 requests per stream; at once, "
                                          f"{ok_all} of {n_all} levels of 128 on this serving code played every "
                                          "stream smoothly, sixty-seventh and sixty-eighth sessions)"})
    passed, skipped, failed = test_counts(tests.values())
    md = ["", "## Sixty-eighth session (2026-12-04, H200): every GPU test and `gpu_check.py` pass on f987a71; "
          f"the closing sweep: capacity {cap['burst']} at once and {cap['poisson']} with Poisson arrivals, every "
          "level smooth; `playback_margin_ms` 150 against 100 at 128 at once: no difference shown",
          "", "Four device calls on H200 machines (about 26 of 30 min), all on f987a71, whose serving code the "
          "sixty-sixth session left (its review commits 6b360fc and c5524db included; the sixty-seventh changed "
          f"benchmarks and tests only). The driver is `raw/devrun_{S}.sh`.",
          "", f"**GPU correctness** (call 1): each GPU test file in its own pytest process, side by side, "
          f"`gpu_check.py` beside them (`raw/gpu_tests_summary_{S}.txt`, the files' own logs "
          f"`raw/gpu_tests_<file>_{S}.txt` where they came back, `raw/gpu_check_{S}.{{json,log}}`): "
          f"{passed} passed, {skipped} skipped, {failed} failed.", "",
          "| test file | result |", "|---|---|"]
    md += [f"| `tests/test_{f}.py` | {r} |" for f, r in tests.items()]
    md += ["",
           "- The LoRA merge test with its new check (A's merged run more than 0.1 from its run without the "
           "adapter) passed with the rest of `test_engine_gpu.py`; so did the VAE kernels' suite, last run whole on a GPU in "
           "the thirty-fourth session, and the persistent layer's whole suite, of which the records show only parts "
           "(`-k` selections in sessions 40-49; the twenty-eighth session's full run stopped at its time limit).",
           gpu_check_sentence(check),
           "", "**The closing sweep** (call 2: `SET=\"decoder.timestep_buckets=10,100\" ARRIVALS=burst,poisson "
           "LEVELS=1,8,32,64,96,128 REQUESTS=2 bash benchmarks/run_served_gpu.sh`, the fifty-fifth session's command; "
           f"`raw/served_closing_{S}*`). Smooth / x real time / TTFA p50 / p95 ms:", "",
           "| streams | burst | Poisson | burst, fifty-fifth session |", "|---|---|---|---|"]
    prev = res["fifty_fifth"]["sweep"]["burst"]
    cell = lambda r: f"{share(r['smooth'])} / {r['x_real_time']:.1f} / {r['ttfa_p50']:.0f} / {r['ttfa_p95']:.0f}"  # noqa: E731
    for n in burst:
        p = prev.get(n) or prev.get(str(n))
        md.append(f"| {n} | {cell(served_row(burst[n]))} | {cell(served_row(poisson[n]))} | "
                  f"{cell(p) if p else '-'} |")
    md += ["",
           f"- Capacity (every stream smooth and TTFA p95 <= 500 ms at every level up to it): {cap['burst']} at once, "
           f"{cap['poisson']} with Poisson arrivals; the fifty-fifth session's sweep made 96 and 128.",
           f"- The engine alone after the server, same call (`bench.py --checkpoint /tmp/full --timestep-buckets "
           f"10,100 --reference none --no-vae --graphs-only --no-profile --batches 64,64,1`, `raw/offline_b64_b1_{S}."
           f"{{json,log}}`): batch 64 {', '.join(f'{x:.1f}' for x in e64)}x; batch 1 {e1['steps_per_s']:.1f} "
           f"steps/s, RTF {e1['rtf']:.4f}. Served at 64 streams over the faster engine run: {ratio:.3f} (2 requests "
           f"a stream; the sixty-seventh session's {res['sixty_seventh']['served_over_engine_c64']:.3f} with 3).",
           f"- One stream: RTF {burst[1]['rtf']['p50']:.4f}, TTFA p50 {burst[1]['ttfa_ms']['p50']:.1f} ms "
           f"(Poisson {poisson[1]['ttfa_ms']['p50']:.1f}); 2 requests, so the one-stream headline keys stay the "
           "fifty-fourth session's 10-request run. results.json's 128-stream and capacity keys now come from this sweep.",
           "", "**`playback_margin_ms` 150 against the default 100** (calls 3 and 4, three servers each, one after "
           "another, in the orders 150, 100, 150 and 100, 150, 100; each `SET=\"decoder.timestep_buckets=10,100 "
           "decoder.playback_margin_ms=<m>\" ARRIVALS=burst LEVELS=64,128,128,128 REQUESTS=3 bash "
           f"benchmarks/run_served_gpu.sh`; `raw/served_margin_c<call>s<server>_m<margin>_{S}.{{json.gz,log}}`). "
           "The fifty-eighth session measured 150 only on code it reverted. A stream is dry when its player ran out "
           "at some chunk, smooth when none is more than 1 ms behind. Call 3's third server: only its printed "
           "table came back (the device tool returns 8 files a call), so its dry streams are not known (n/a):", "",
           "| call / server | margin ms | streams | x real time | smooth | TTFA p50 / p95 ms | dry | late ms |",
           "|---|---|---|---|---|---|---|---|"]
    for (call, place, m), lvs in margins.items():
        for lv in lvs:
            cells = level_cells(lv) if lv["streams"] is not None else _log_cells(lv)
            md.append(f"| {call} / {place} | {m} | {cells} |")
    md += ["", "| margin ms | levels of 128 | every stream smooth | least smooth | x real time, median (range) | "
           "TTFA p50 range / worst p95 ms | 64 streams, x real time |", "|---|---|---|---|---|---|---|"]
    for m, st in stats.items():
        md.append(f"| {m} | {smooth_cells(st)} | {span(st['ttfa_p50_ms'])} / {st['ttfa_p95_ms_max']:.0f} | "
                  f"{', '.join(f'{x:.1f}' for x in c64_by_margin[m])} |")
    lv100 = min((lv for lv in by_margin[100] if lv["streams"] is not None), key=lambda lv: lv["smooth_playback_frac"])
    worst100 = dry_counts(lv100)
    md += ["",
           f"- 150 ms: every stream smooth in {stats[150]['all_smooth']} of {stats[150]['levels']} levels of 128; "
           f"100 ms: {stats[100]['all_smooth']} of {stats[100]['levels']}, the least smooth at "
           f"{share(stats[100]['smooth_min'])} (dry: {worst100}, wave and chunk 1-based, {dry_late_ms(lv100):.1f} ms "
           "late). Throughput and first audio overlap "
           f"(medians above; 64 streams the same). {stats[100]['levels']} levels each cannot separate that from "
           "chance: the default stays 100.",
           f"- The default at 128 at once this session: {ok} of {levels128} levels every stream smooth (the sweep's and the "
           "margin calls' at 100 ms). With the sixty-seventh session's on the same serving code "
           f"({sum(lv['smooth'] == 1 for lv in prev128)} of {len(prev128)}): {ok_all} of {n_all}, the least smooth "
           f"{share(least)}.",
           "", "**Where the decoder's `execute` goes, per request** (this machine, 2 CPU cores, no GPU; a real "
           "tritonserver with the tiny checkpoint, bench_served at 16 streams, 96 requests; the probe is "
           f"`raw/decoder_execute_probe_{S}.{{patch,py}}`, its output `raw/decoder_execute_probe_{S}.txt`): "
           + "; ".join(f"{EXEC_PARTS[k]} {v[0]:.2f} (mean {v[1]:.2f})" for k, v in execute.items() if k in EXEC_PARTS)
           + f" ms, of {execute['execute'][0]:.2f} (mean {execute['execute'][1]:.2f}) ms in all, p50. The largest "
           "part is the empty first response's send (the call's admission, which its return in the orchestrator "
           "waits for: Triton's decoupled BLS call returns at its first response), timed with its wait for the "
           "process's IPC lock (`triton_io.IPC_LOCK`), which the engine thread's cancel checks and the channel's "
           "final sends also take. The stub lets go of the GIL while the send waits for the server "
           "(python_backend's `ResponseSender::Send`), but not of that lock: a burst of admissions can hold up "
           "running streams' cancel checks too. Taking the GIL back can wait for another thread's switch "
           "interval, which the means' tails fit. The probe did not split the lock's wait from the send's. "
           "Not changed: with the audio channel the call "
           "still needs a first response to return; a change here would want a GPU measurement of its own.",
           "", "**Against issue 17's targets** (one stream: the fifty-fourth session's 10-request run; 64 streams: "
           "the fifty-fifth session's 16-request server; capacity: this sweep):", "",
           "| target | measured | status |", "|---|---|---|",
           f"| one stream RTF <= 0.025 | {res['single_stream_rtf_triton']:.4f} (this sweep {burst[1]['rtf']['p50']:.4f}; "
           f"the engine alone {e1['rtf']:.4f}) | missed |",
           f"| one stream TTFA p50 <= 25 ms | {res['ttfa_ms_p50']:.1f} ms (this sweep {burst[1]['ttfa_ms']['p50']:.1f}) | met |",
           f"| 8 streams >= 150x | {res['fifty_fifth']['sweep']['burst'][8]['x_real_time']:.1f}x (this sweep {burst[8]['x_real_time']:.1f}x) | met |",
           f"| 64 streams >= 500x / smooth 100% / TTFA p95 <= 300 ms | {res['aggregate_xrt_c64']:.1f}x / "
           f"{share(res['smooth_frac_c64'])} / {res['ttfa_ms_p95_c64']:.0f} ms (this sweep {burst[64]['x_real_time']:.1f}x"
           f" / {share(burst[64]['smooth_playback_frac'])} / {burst[64]['ttfa_ms']['p95']:.0f} ms) | met |",
           f"| capacity >= 128 (at once / Poisson) | {cap['burst']} / {cap['poisson']} | met in this sweep; at once not "
           f"in every level ({ok_all} of {n_all} levels of 128 on this serving code) |",
           f"| served / engine at 64 >= 0.85 | {ratio:.3f} (one call) | missed |", "",
           "![sixty-eighth session: the closing sweep, and 128 streams at once by playback margin]"
           "(results_sixty_eighth.png)", ""]
    _plot(burst, poisson, margins)
    return md


def _log_cells(lv: dict) -> str:
    return (f"{lv['concurrency']} | {lv['x_real_time']:.1f} | {share(lv['smooth_playback_frac'])} | "
            f"{lv['ttfa_ms']['p50']:.0f} / {lv['ttfa_ms']['p95']:.0f} | n/a | n/a")


def _plot(burst: dict, poisson: dict, margins: dict):
    """Left: the sweep's x real time by streams, burst and Poisson. Right: each level of 128 at once of calls 3
    and 4, x real time against TTFA p95, by margin."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.3))
    for runs, label, colour in ((burst, "all at once", "tab:blue"), (poisson, "Poisson arrivals", "tab:orange")):
        n = sorted(runs)
        a.plot(n, [runs[k]["x_real_time"] for k in n], "o-", color=colour, label=label)
    a.set_xscale("log", base=2)
    a.set_xlabel("streams")
    a.set_ylabel("aggregate x real time")
    a.legend(fontsize=8)
    for m, colour in ((100, "tab:green"), (150, "tab:purple")):
        lvs = [lv for run, x in margins.items() if run[2] == m for lv in x if lv["concurrency"] == 128]
        b.plot([lv["ttfa_ms"]["p95"] for lv in lvs], [lv["x_real_time"] for lv in lvs], "o", color=colour,
               label=f"margin {m} ms")
        dry = [lv for lv in lvs if lv["smooth_playback_frac"] < 1]
        b.plot([lv["ttfa_ms"]["p95"] for lv in dry], [lv["x_real_time"] for lv in dry], "x", color="black",
               markersize=10, label="a stream not smooth" if m == 100 else None)
    b.set_xlabel("first audio p95, ms")
    b.set_ylabel("aggregate x real time")
    b.legend(fontsize=8)
    save_panels(fig, [a, b], "sixty-eighth session (H200): the closing sweep; 128 streams at once by playback margin",
                "results_sixty_eighth.png")
