"""results.md: the fifty-fifth session's section, and results_fifty_fifth.png."""

import statistics

import numpy as np

from bench_served import share
from summary.issue17 import ISSUE_RATIO, targets_table
from summary.plots import pyplot, save_panels
from summary.raw import headline_keys, load, metric_value, served_levels, served_row
from summary.session52 import chunk_times

S = "fiftyfifth"
# 64-stream runs: key -> (call, server's place in its call, code, raw file, metrics file)
RUNS = {f"{code}_c{call}_s{place}": (call, place, code, f"served_endfinal_{code}_call{call}_server{place}_{S}.json",
                                     f"metrics_endfinal_{code}_call{call}_server{place}_{S}.txt")
        for call, place, code in ((1, 1, "old"), (1, 2, "new"), (2, 1, "new"), (2, 2, "old"))}
CODE = {"new": "end with the last chunk (fdea39a)", "old": "438bd02 (before)"}
HEADLINE = "new_c2_s1"  # the final code's run that served first in its call, as the sessions before
ONE_STREAM = "served_closing_call4_fiftyfourth.json"  # 10 requests; this session's sweep ran 2
SWEEP = f"served_closing_sweep_{S}.json"
PA = {"new_c3": ("new", 3, "after the sweep's server, levels 1, 8, 32, 64"),
      "old_c4": ("old", 4, "levels 1, 8, 32, 64"), "new_c5": ("new", 5, "64 alone")}
CLOSE_MS = 3.0  # consecutive requests' last chunks this close at the clients: delivered back to back


def end_gaps(lv: dict) -> np.ndarray:
    """ms between consecutive last chunks (requests' ends) reaching the level's clients, in time order."""
    return 1000 * np.diff(sorted(s["start_s"] + s["chunk_ms"][-1][0] / 1000 for s in lv["streams"]))


def wave(lv: dict, index: int) -> dict:
    """The level with only its streams of one wave: each worker's `index`-th request."""
    return {"streams": [s for s in lv["streams"] if s["index"] == index]}


def wave_gaps(lv: dict, index: int) -> dict:
    """The level's streams of one wave: TTFA and the 1st -> 2nd and 2nd -> 3rd chunk gaps at the client,
    p50 and max ms, and how many ran dry."""
    ss = wave(lv, index)["streams"]
    stat = lambda xs: {"p50": statistics.median(xs), "max": max(xs)}  # noqa: E731
    return {"ttfa": stat([1000 * s["ttfa_s"] for s in ss]), "g12": stat(chunk_times(wave(lv, index))[0]),
            "g23": stat([s["chunk_ms"][2][0] - s["chunk_ms"][1][0] for s in ss]),
            "dry": sum(s["underrun_s"] > 0 for s in ss), "streams": len(ss)}


def fifty_fifth_session(res) -> list[str]:
    """2026-12-02 (issue 17): a request's end sent with its last chunk, against the code before in both
    orders; the engine, the in-process loop with and without the VAE, the burst and Poisson sweep and
    perf_analyzer on the final code. Sets res["fifty_fifth"] and the served headline keys, returns the
    markdown, draws results_fifty_fifth.png."""
    levels = {k: served_levels(f)[64] for k, (*_, f, _) in RUNS.items()}
    rows = {k: served_row(lv) for k, lv in levels.items()}
    gaps = {k: end_gaps(lv) for k, lv in levels.items()}
    close = {k: float(np.mean(g < CLOSE_MS)) for k, g in gaps.items()}
    rushes = {k: metric_value(m, "voxcpm_decoder_audio_rushes_total") for k, (*_, m) in RUNS.items()}
    x = {code: [levels[k]["x_real_time"] for k in RUNS if RUNS[k][2] == code] for code in CODE}
    final = levels[HEADLINE]
    one = served_levels(ONE_STREAM)[1]

    engine = load(f"offline_b64x2_b1_{S}.json")["engine"]["graphs"]
    e64 = max(r["aggregate_xrt"] for r in engine["runs"] if r["batch"] == 64)
    e1 = next(r for r in engine["runs"] if r["batch"] == 1)
    p1, p64 = engine["profile_batch1"], engine["profile_batch_max"]
    layer1 = next(t["cuda_ms"] for t in p1["all"] if t["kernel"] == "_layer_kernel")
    loop = load(f"closed_loop_vae_off_{S}.json")["levels"]["64"]
    with_vae = statistics.mean(r["x_real_time"] for r in loop["behind"]["rounds"])
    free_vae = statistics.mean(r["x_real_time"] for r in loop["vae_off"]["rounds"])
    ratios = {"served_over_engine": final["x_real_time"] / e64, "served_over_in_process": final["x_real_time"] / with_vae,
              "vae_in_process": with_vae / free_vae, "loop_over_engine": free_vae / e64}

    burst, poisson = served_levels(SWEEP), served_levels(f"served_closing_sweep_{S}_poisson.json")
    cap = {"burst": load(SWEEP)["capacity"], "poisson": load(f"served_closing_sweep_{S}_poisson.json")["capacity"]}
    waves = {name: {i: wave_gaps(lv, i) for i in (0, 1)}
             for name, lv in (("now", burst[128]), ("44th", served_levels("served_fortyfourth_sweep.json")[128]))}
    pa = {k: load(f"perf_analyzer_{code}_call{call}_{S}.json") for k, (code, call, _) in PA.items()}
    pa64 = {k: next(lv for lv in d["levels"] if lv["concurrency"] == 64) for k, d in pa.items()}
    pa44 = next(lv for lv in load("perf_analyzer_fortyfourth.json")["levels"] if lv["concurrency"] == 64)["x_real_time"]
    late = {k: metric_value(f"metrics_perf_analyzer_{code}_call{call}_{S}.txt", "voxcpm_engine_late_launches_total")
            for k, (code, call, _) in PA.items()}

    res["fifty_fifth"] = {
        "device": "NVIDIA H200",
        "c64": {k: rows[k] | {"call": RUNS[k][0], "server": RUNS[k][1], "code": RUNS[k][2], "rushes": rushes[k],
                              "late_launches": levels[k]["decoder_steps"]["late_launches"],
                              "ends_back_to_back_frac": close[k]} for k in RUNS},
        "xrt_c64_mean": {code: statistics.mean(v) for code, v in x.items()},
        "engine": {"xrt_b64": e64, "steps_per_s_b1": e1["steps_per_s"], "rtf_b1": e1["rtf"],
                   "gpu_ms_b1": p1["gpu_ms"], "kernels_b1": p1["kernels"], "layer_kernel_ms_b1": layer1,
                   "gpu_ms_b64": p64["gpu_ms"], "by_kind_ms_b64": p64["by_kind_ms"]},
        "in_process_c64": {"with_vae": with_vae, "vae_off": free_vae}, "ratios_c64": ratios,
        "sweep": {"burst": {n: served_row(lv) for n, lv in burst.items()},
                  "poisson": {n: served_row(lv) for n, lv in poisson.items()}, "capacity": cap,
                  "c128_waves": waves},
        "perf_analyzer_c64": {k: {"infer_per_s": lv["infer_per_s"], "x_real_time": lv["x_real_time"],
                                  "latency_ms": lv["latency_ms"], "late_launches_run": late[k]}
                              for k, lv in pa64.items()},
    }
    res.update(headline_keys(one, final, f"one stream: fifty-fourth session, NVIDIA H200, 2026-12-02, raw/{ONE_STREAM} "
                             "(d6b98ef, 10 requests per stream); 64 streams: fifty-fifth session, "
                             f"raw/{RUNS[HEADLINE][3]} (fdea39a, the first server of its call, 16 requests per "
                             "stream); 128 streams and capacity: fifty-fifth session's sweep, "
                             f"raw/served_closing_sweep_{S}*.json (fdea39a)"))
    res.update({"aggregate_xrt_c128": burst[128]["x_real_time"], "capacity_streams": cap})

    w, w44 = waves["now"], waves["44th"]
    md = ["", "## Fifty-fifth session (2026-12-02, H200): a request's end goes with its last chunk; the closing "
          "measurement of the final code: 64 streams within the runs' spread, where their throughput goes (the VAE: 19%), and "
          f"128 streams at once no longer all smooth ({share(burst[128]['smooth_playback_frac'])}): capacity "
          f"{cap['burst']} at once, {cap['poisson']} with Poisson arrivals",
          "", "Five device calls on one H200 (about 28 of 30 min).", "",
          "**The change** (fdea39a). With `decode_audio` the decoder's audio thread sent a request's last chunk, then "
          "its final flag as a response of its own: a second round trip to the server for each request (the "
          "fifty-fourth session's follow-up). `StreamAudio` now hands a request its end with its last chunk when "
          "both are taken in one round (`deliver(patches, audio, end)`), and the decoder sends that chunk with the "
          "final flag when the request ended well (an error, or a client that left, still gets the flag alone). "
          "The orchestrator already reads the outputs of any response, a final one too. The engine thread queues a "
          "request's last chunk and its end one after the other, so they are nearly always in one round; when not, "
          "the end goes alone as before. CPU tests: `tests/test_decode_audio.py`'s ordering test now checks that "
          "the ends came with the last chunks, and a served test reads the decoder's responses straight (the last "
          "one final and carrying LATENTS and AUDIO); each fails with its half of the change undone. Test helpers "
          "that stream the decoder read data in a final response.", "",
          "**64 streams, before and after, in both orders** (call 1 `ORDER=\"old new\"`, call 2 `\"new old\"`; each "
          "server `SET=\"decoder.timestep_buckets=10,100\" LEVELS=64 REQUESTS=16 bash benchmarks/run_served_gpu.sh`, "
          "the code before through `VOXCPM_PYTHON_BACKEND`; `raw/served_endfinal_*_fiftyfifth.json.gz`, "
          "`raw/metrics_endfinal_*_fiftyfifth.txt`). Ends back to back: the share of consecutive requests' last "
          f"chunks that reached their clients under {CLOSE_MS:.0f} ms apart:", "",
          "| call / server | code | x real time | TTFA p50 / p95 ms | smooth | rushes | steps launched late | "
          "ends back to back |", "|---|---|---|---|---|---|---|---|"]
    for k, (call, place, code, *_) in RUNS.items():
        r = rows[k]
        md.append(f"| {call} / {place} | {CODE[code]} | {r['x_real_time']:.1f} | {r['ttfa_p50']:.1f} / "
                  f"{r['ttfa_p95']:.1f} | {share(r['smooth'])} | {rushes[k]:.0f} | "
                  f"{levels[k]['decoder_steps']['late_launches']:.0f} of {r['steps']:.0f} | {share(close[k])} |")
    md += ["",
           f"- Throughput: {', '.join(f'{v:.1f}' for v in x['new'])}x with the change against "
           f"{', '.join(f'{v:.1f}' for v in x['old'])}x without (means {statistics.mean(x['new']):.1f} and "
           f"{statistics.mean(x['old']):.1f}): in each call the second server made more, whichever code it ran; "
           "the change is within that spread. Every stream played smoothly in all four runs.",
           "- What the change does show: a round's ends reach their clients closer together ("
           + ", ".join(share(close[k]) for k in RUNS if RUNS[k][2] == "new") + " of consecutive ends back to back "
           "against " + ", ".join(share(close[k]) for k in RUNS if RUNS[k][2] == "old") + "). Kept: one send a "
           "request fewer, throughput and smooth playback within the runs' spread. First audio p50 was higher "
           "with it in both calls (" + ", ".join(f"{rows[k]['ttfa_p50']:.1f}" for k in RUNS if RUNS[k][2] == "new")
           + " against " + ", ".join(f"{rows[k]['ttfa_p50']:.1f}" for k in RUNS if RUNS[k][2] == "old") + " ms), p95 "
           "mixed; two runs each cannot tell that from noise.",
           "- The rush ran less often with the change (" + ", ".join(f"{rushes[k]:.0f}" for k in RUNS if RUNS[k][2] == "new")
           + " rushes against " + ", ".join(f"{rushes[k]:.0f}" for k in RUNS if RUNS[k][2] == "old") + "): its estimate of "
           "a round's remaining deliveries counts an ending request as one send now, not two, and a round's deliveries "
           "take less time, with fewer chances to rush; which of these it is was not looked into.", "",
           "**Where 64 served streams' throughput goes** (call 2, after its servers: the engine alone, `bench.py "
           "--checkpoint /tmp/full --timestep-buckets 10,100 --reference none --no-vae --graphs-only --batches "
           f"64,64,1`, `raw/offline_b64x2_b1_{S}.{{json,log}}`; then the served loop in process, `closed_loop.py "
           "--checkpoint /tmp/full --clients 64 --requests 3 --rounds 2 --max-batch 64 --settings behind,vae_off`, "
           f"`raw/closed_loop_vae_off_{S}.{{json,log}}`; `vae_off` hands back silence at once for every decode):", "",
           "| stage | x real time at 64 | over the stage before |", "|---|---|---|",
           f"| engine alone, batch 64 (second run) | {e64:.1f} | |",
           f"| the served loop in process, the VAE free | {free_vae:.1f} | {ratios['loop_over_engine']:.3f} |",
           f"| the served loop in process, with the VAE | {with_vae:.1f} | {ratios['vae_in_process']:.3f} |",
           f"| served (call 2, first server) | {final['x_real_time']:.1f} | {ratios['served_over_in_process']:.3f} |",
           "",
           f"- Served over the engine: {ratios['served_over_engine']:.3f}, one call's ratio (the issue asks "
           f"{ISSUE_RATIO}). The VAE's work on the same GPU takes {100 * (1 - ratios['vae_in_process']):.0f}% of the "
           f"in-process throughput; the engine's loop and its audio thread's bookkeeping "
           f"{100 * (1 - ratios['loop_over_engine']):.0f}%; Triton, the BLS hops and the clients "
           f"{100 * (1 - ratios['served_over_in_process']):.0f}%. Without a cheaper VAE, a served path free of every "
           f"other cost but the engine loop's would reach {ratios['vae_in_process'] * ratios['loop_over_engine']:.2f} of "
           f"the engine alone, and {ratios['vae_in_process']:.2f} with that loop free too.",
           f"- The engine at batch 1: {e1['steps_per_s']:.1f} steps/s (RTF {e1['rtf']:.4f}). Profiled, "
           f"{p1['gpu_ms']:.2f} ms of GPU work a step in {p1['kernels']:.0f} kernels, {layer1:.2f} ms of it "
           f"({100 * layer1 / p1['gpu_ms']:.0f}%) the persistent layer kernels. At batch 64: {p64['gpu_ms']:.2f} ms, "
           + ", ".join(f"{k} {v:.2f}" for k, v in p64["by_kind_ms"].items()) + ". The one-stream target needs a "
           "step under 4 ms: a quarter less of the persistent kernels' time, which sessions 15-53 did not find.", "",
           "**The closing sweep on the final code** (call 3: `SET=\"decoder.timestep_buckets=10,100\" "
           "ARRIVALS=burst,poisson LEVELS=1,8,32,64,96,128 REQUESTS=2 bash benchmarks/run_served_gpu.sh`, the forty-"
           f"fourth session's command; `raw/served_closing_sweep_{S}*`). Smooth / x real time / TTFA p50 / p95 ms:",
           "", "| streams | burst | Poisson | burst, forty-fourth session |", "|---|---|---|---|"]
    old_burst = served_levels("served_fortyfourth_sweep.json")
    cell = lambda lv: (f"{share(lv['smooth_playback_frac'])} / {lv['x_real_time']:.1f} / {lv['ttfa_ms']['p50']:.0f} / "  # noqa: E731
                       f"{lv['ttfa_ms']['p95']:.0f}")
    md += [f"| {n} | {cell(burst[n])} | {cell(poisson[n])} | {cell(old_burst[n])} |" for n in sorted(burst)]
    md += ["",
           f"- Capacity (every stream smooth and TTFA p95 <= 500 ms at every level up to it): {cap['burst']} at once, "
           f"{cap['poisson']} with Poisson arrivals. The forty-fourth session's code made 128 and 128.",
           f"- At 128 at once, {sum(s['underrun_s'] > 0 for s in burst[128]['streams'])} of "
           f"{len(burst[128]['streams'])} streams ran dry ({sum(s['underrun_s'] > 1e-3 for s in burst[128]['streams'])} "
           "by more than the 1 ms that smooth playback allows), all at their second or third chunk (1 and 4 patches, after "
           f"a first of 1): {w[0]['dry']} of the first wave's {w[0]['streams']} and {w[1]['dry']} of the second's. "
           "Measured at the clients, by wave (p50 / max ms):", "",
           "| wave | run | TTFA | 1st -> 2nd chunk | 2nd -> 3rd chunk | dry |", "|---|---|---|---|---|---|"]
    for i in (0, 1):
        for name, ww in (("this session", w), ("forty-fourth session", w44)):
            g = ww[i]
            md.append(f"| {i + 1} | {name} | {g['ttfa']['p50']:.0f} / {g['ttfa']['max']:.0f} | "
                      f"{g['g12']['p50']:.0f} / {g['g12']['max']:.0f} | {g['g23']['p50']:.0f} / {g['g23']['max']:.0f} | "
                      f"{g['dry']} |")
    md += ["",
           f"- The first wave's second chunks came later: by {w[0]['g12']['p50'] - w44[0]['g12']['p50']:.0f} ms at the "
           "median, and the two runs' distributions (the plot's right panel) differ over their whole range, not in "
           "their tail alone. No "
           "request ends in the first wave, so the change of this session cannot be what delays them; what does "
           "(the audio rush of the fifty-second to fifty-fourth sessions, which decodes newcomers' chunks apart "
           "from the round, is the first suspect; the machine, another) was not measured: no device time was "
           "left. The next run to make: the 128-stream burst with `decoder.audio_rush=false` beside the default, "
           "and with the forty-fourth session's code, in one call.", "",
           "**`perf_analyzer --streaming`** (calls 3-5: `PERF_ANALYZER=1 SET=\"decoder.timestep_buckets=10,100\" bash "
           "benchmarks/run_served_gpu.sh`, perf_analyzer 2.51, 100-step requests, windows of 6 s; call 5 with "
           f"`PA_LEVELS=64`; `raw/perf_analyzer_*_{S}.{{json,csv,log}}`). At 64 streams:", "",
           "| call | code | levels run | requests/s | latency p50 / p99 ms | x real time | steps launched late (whole run) |",
           "|---|---|---|---|---|---|---|"]
    for k, (code, call, how) in PA.items():
        lv = pa64[k]
        md.append(f"| {call} | {CODE[code]} | {how} | {lv['infer_per_s']:.2f} | {lv['latency_ms']['p50']:.0f} / "
                  f"{lv['latency_ms']['p99']:.0f} | {lv['x_real_time']:.1f} | {late[k]:.0f} |")
    md += ["",
           f"- Run the same way (levels 1 to 64), the change made {pa64['new_c3']['x_real_time']:.1f}x against the "
           f"code before's {pa64['old_c4']['x_real_time']:.1f}x, {100 * (1 - pa64['new_c3']['x_real_time'] / pa64['old_c4']['x_real_time']):.0f}% "
           f"less, its engine thread launching more steps late ({late['new_c3']:.0f} against {late['old_c4']:.0f} over "
           f"the run); a second run of the change, 64 alone on a fresh server, made {pa64['new_c5']['x_real_time']:.1f}x. "
           "The change's two runs differ by as much as the like-for-like pair, so whether it costs under "
           "perf_analyzer is not settled: the next run to repeat, in both orders. The change's slower run started "
           "right after the sweep's server on the same machine; why it fell behind was not found.",
           f"- The forty-fourth session's code made {pa44:.1f}x here; the code before this session "
           f"{pa64['old_c4']['x_real_time']:.1f}x, so most of that drop came earlier (sessions 45-54, or the machine), as "
           f"the burst sweep's (64 streams {burst[64]['x_real_time']:.1f}x against {old_burst[64]['x_real_time']:.1f}x, "
           f"128 streams {burst[128]['x_real_time']:.1f}x against {old_burst[128]['x_real_time']:.1f}x); which of the "
           "two was not measured.", "",
           "**Against issue 17's targets** (one stream: the fifty-fourth session's closing run, 10 requests, on the "
           "ending path before this session's change; 8 streams: this session's sweep; 64 streams: call 2's first "
           "server):", ""]
    md += targets_table(one, burst[8], final)
    md += [f"| capacity >= 128 (at once / Poisson) | {cap['burst']} / {cap['poisson']} | "
           f"{'met' if min(cap.values()) >= 128 else 'missed at once'} |",
           f"| served / engine at 64 >= {ISSUE_RATIO} | {ratios['served_over_engine']:.3f} (one call) | missed |", "",
           "results.json's 64-stream headline keys now come from call 2's first server, its 128-stream and "
           "capacity keys from this session's sweep (fdea39a), the one-stream keys still from the fifty-fourth "
           "session.", "", "![fifty-fifth session: where 64 streams' throughput goes, and the 128-stream burst's "
           "first wave](results_fifty_fifth.png)", ""]
    _plot(e64, free_vae, with_vae, final["x_real_time"], burst[128], old_burst[128])
    return md


def _plot(e64: float, free_vae: float, with_vae: float, served: float, now: dict, before: dict):
    """Left: x real time at 64 streams, stage by stage; right: the 128-stream burst's first-wave gaps
    between the 1st and 2nd chunks, sorted, this session against the forty-fourth."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    stages = [("engine", e64), ("in process,\nVAE free", free_vae), ("in process,\nwith VAE", with_vae),
              ("served", served)]
    a.bar(range(len(stages)), [v for _, v in stages], color=["tab:gray", "tab:blue", "tab:orange", "tab:green"])
    for i, (_, v) in enumerate(stages):
        a.text(i, v + 5, f"{v:.0f}x", ha="center", fontsize=8)
    a.set_xticks(range(len(stages)), [s for s, _ in stages], fontsize=8)
    a.set_ylabel("x real time, 64 streams")
    a.set_title("where 64 streams' throughput goes (call 2)", fontsize=9)
    for lv, name, color in ((before, "forty-fourth session", "tab:gray"), (now, "this session", "tab:red")):
        g = sorted(chunk_times(wave(lv, 0))[0])
        b.plot(range(len(g)), g, color=color, label=name)
    b.axhline(160, color="black", lw=0.8, ls="--", label="the first chunk's audio (160 ms)")
    b.set_xlabel("first-wave streams at 128, sorted")
    b.set_ylabel("1st -> 2nd chunk at the client, ms")
    b.legend(fontsize=7)
    save_panels(fig, (a, b), "fifty-fifth session (H200): 64 streams stage by stage; the 128-stream burst's first wave",
                "results_fifty_fifth.png")
