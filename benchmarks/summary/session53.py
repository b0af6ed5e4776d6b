"""results.md: the fifty-third session's section, and results_fifty_third.png."""

import glob
import os
import re
import statistics

from bench_served import parse_metric_samples, share
from summary.issue17 import ISSUE_RATIO, targets_table
from summary.plots import paired_bars, pyplot, save_panels
from summary.raw import HERE, headline_keys, load, metric_value, served_levels, served_row, text
from summary.session52 import AB as AB52, chunk_slack, chunk_times

# 64-stream runs of this session: key -> (call, label, raw file, metrics file)
RUNS = {"off_c1": (1, "audio_rush=false (first server)", "served_rush_off_call1_fiftythird.json",
                   "metrics_rush_off_call1_fiftythird.txt"),
        "on_c1": (1, "audio rush (second server)", "served_rush_on_call1_fiftythird.json",
                  "metrics_rush_on_call1_fiftythird.txt"),
        "nofreeze_c3": (3, "rush, VOXCPM_GC_FREEZE=0 (first server)", "served_gc_nofreeze_call3_fiftythird.json",
                        "metrics_gc_nofreeze_call3_fiftythird.txt"),
        "freeze_c3": (3, "rush, start-up frozen: the final code (second server)",
                      "served_gc_freeze_call3_fiftythird.json", "metrics_gc_freeze_call3_fiftythird.txt")}
COLORS = {"off_c1": "tab:gray", "on_c1": "tab:blue", "nofreeze_c3": "tab:olive", "freeze_c3": "tab:green"}
# The vae_first_decodes.py runs of call 2: key -> (label, raw file)
FIRST = {"eager_cold": ("HEAD, fresh caches", "vae_first_before_cold_fiftythird.json"),
         "eager_warm": ("HEAD, the same caches again", "vae_first_before_warm_fiftythird.json"),
         "plan_cold": ("every decode through graphs (patch), fresh caches", "vae_first_plan_cold_fiftythird.json")}
# gc_pauses.freeze's log line as call 3's servers wrote it (since reworded: "(N objects tracked after it)")
GC_LINE = re.compile(r"(\S+(?: instance \S+)?): a full garbage collection takes (\d+) ms over (\d+) objects"
                     r"(?:; with them frozen, ([\d.]+) ms)?")


def arrivals(lv: dict) -> list:
    """Every chunk's arrival in a served level, s from the level's start, sorted."""
    return sorted(s["start_s"] + c[0] / 1000 for s in lv["streams"] for c in s["chunk_ms"])


def longest_gap(lv: dict) -> tuple:
    """The longest time no stream got a chunk -> (seconds, when it began)."""
    t = arrivals(lv)
    return max((b - a, a) for a, b in zip(t, t[1:]))


_UNITS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8,
          "ninth": 9}
_TEENS = {"tenth": 10, "eleventh": 11, "twelfth": 12, "thirteenth": 13, "fourteenth": 14, "fifteenth": 15,
          "sixteenth": 16, "seventeenth": 17, "eighteenth": 18, "nineteenth": 19}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50}


def session_of(name: str) -> int | None:
    """The session a raw file's name gives ("served_thirtysixth_call2_after.json.gz" -> 36)."""
    words = {**_TEENS, **{t[:-1] + "ieth": v for t, v in _TENS.items()},
             **{t + u: tv + uv for t, tv in _TENS.items() for u, uv in _UNITS.items()}}
    found = [v for w, v in words.items() if re.search(rf"(^|_){w}(_|\.|$)", name)]
    return max(found) if found else None


def earlier_gaps(since: int, before: int) -> list:
    """(longest gap s, file) of each 64-stream burst run with chunk timings in raw/ from session `since`
    up to, not including, session `before`."""
    out = []
    for path in sorted(glob.glob(os.path.join(HERE, "raw", "served*.json*"))):
        name = os.path.basename(path)
        n = session_of(name)
        if n is None or not since <= n < before or "poisson" in name:
            continue
        try:
            levels = load(name.removesuffix(".gz"))["levels"]
        except (KeyError, TypeError, ValueError):
            continue
        for lv in levels:
            if lv.get("concurrency") == 64 and lv.get("streams") and "chunk_ms" in lv["streams"][0]:
                out.append((longest_gap(lv)[0], name))
    return out


def gc_metrics(name: str) -> dict:
    """The decoder's garbage collections while serving, from a metrics file."""
    out = {"collections": {}, "seconds": {}}
    for metric, labels, v in parse_metric_samples(text(name)):
        if metric == "voxcpm_gc_pause_seconds_max":
            out["longest_s"] = v
        elif metric in ("voxcpm_gc_collections_total", "voxcpm_gc_pause_seconds_total"):
            out["collections" if metric.endswith("collections_total") else "seconds"][int(labels["generation"])] = v
    return out


def start_up_collections(name: str) -> dict:
    """A server log's start-up collections (gc_pauses.freeze) -> {process: (ms, objects, frozen ms or None)}."""
    return {m[1]: (int(m[2]), int(m[3]), None if m[4] is None else float(m[4])) for m in GC_LINE.finditer(text(name))}


def names_key(k: tuple) -> str:
    """A streamed_weights variant (coupled, dep, barriers, mma) as results.json's key."""
    return "_".join(n for n, on in zip(("coupled", "reads", "barriers", "products"), k) if on) or "stream_only"


def fifty_third_session(res) -> list[str]:
    """2026-12-02 (issue 17): the audio rush's final form against audio_rush=false (the other order); one
    run's stall of every stream, the VAE's eager decodes ruled out as its cause and the decoder's garbage
    collector found able to cause it, start-up's objects now frozen; weights streamed past the grid
    barriers (Gluon experiment). Sets res["fifty_third"] and the 64-stream headline keys, returns the
    markdown, draws results_fifty_third.png."""
    levels = {k: served_levels(f)[64] for k, (_, _, f, _) in RUNS.items()}
    times = {k: chunk_times(lv) for k, lv in levels.items()}
    rows = {k: served_row(lv) | chunk_slack(times[k]) for k, lv in levels.items()}
    gaps = {k: longest_gap(lv) for k, lv in levels.items()}
    rushes = {k: metric_value(m, "voxcpm_decoder_audio_rushes_total") for k, (*_, m) in RUNS.items()}
    late = {k: levels[k]["decoder_steps"]["late_launches"] for k in levels}
    on, off = levels["on_c1"], levels["off_c1"]
    stalled = [s for s in on["streams"] if s["underrun_s"] > 0.3]
    rest2 = sorted(x for x in times["on_c1"][1] if x > -300)
    first = {k: load(f) for k, (_, f) in FIRST.items()}
    shapes = [(d["streams"], d["patches"]) for d in first["eager_cold"]["decodes"]]
    by = {k: {(d["streams"], d["patches"]): d for d in v["decodes"]} for k, v in first.items()}
    eager_shapes = [s for s in shapes if by["eager_cold"][s]["eager"]]
    extra = {k: [by[k][s]["first_ms"] - by[k][s]["second_ms"] for s in eager_shapes] for k in ("eager_cold", "eager_warm")}
    slow = {s: (by["plan_cold"][s]["second_ms"], by["eager_cold"][s]["second_ms"], by["eager_warm"][s]["second_ms"])
            for s in ((17, 16), (24, 16), (64, 16), (80, 16), (100, 16))}
    gcs = {k: gc_metrics(m) for k, (*_, m) in RUNS.items() if k.endswith("_c3")}
    starts = {k: start_up_collections(f"served_gc_{k.split('_')[0]}_call3_fiftythird_tritonserver.log")
              for k in ("nofreeze_c3", "freeze_c3")}
    final = levels["freeze_c3"]
    sw = load("streamed_weights_call7_fiftythird.json")
    sw_runs, sw_slots = {}, {}
    for r in sw["runs"]:
        key = (r["coupled"], r["dep"], r["barriers"], r["mma"])
        sw_runs.setdefault(key, []).append(r["us_per_layer"])
        sw_slots.setdefault(key, {}).setdefault(r["slots"], []).append(r["us_per_layer"])
    sw_bytes = sum(k * n for k, n in sw["phases"]) * 2  # a layer's bf16 weights
    sw_floor = sw_bytes * 12 / sw["read_all_weights_us"] / 1e6  # TB/s of PyTorch's read of all 12 layers
    sw_med = {k: statistics.median(v) for k, v in sw_runs.items()}
    sw_gain = sw_med[(True, True, True, True)] / sw_med[(False, True, True, True)]
    s52 = served_levels("served_fiftysecond.json")
    s52_64 = {k: served_levels(f)[64] for k, (_, _, f) in AB52.items()}  # its rush run and three without
    engine64 = max(r["aggregate_xrt"] for r in load("offline_b64x2_b1_fiftysecond.json")["engine"]["graphs"]["runs"]
                   if r["batch"] == 64)
    rush_x = [s52_64["on_call2"]["x_real_time"]] + [levels[k]["x_real_time"] for k in ("on_c1", "nofreeze_c3",
                                                                                       "freeze_c3")]
    plain = [s52_64[k] for k in AB52 if k != "on_call2"] + [off]
    plain_x = [lv["x_real_time"] for lv in plain]
    order = [("52/2 rush", s52_64["on_call2"], True), ("52/2 742198c", s52_64["before_call2"], False),
             ("52/3 rush off", s52_64["off_call3"], True), ("52/1 742198c", s52_64["head_call1"], True),
             ("53/1 rush off", off, True), ("53/1 rush", on, False), ("53/3 rush, not frozen", levels["nofreeze_c3"], True),
             ("53/3 rush, frozen", levels["freeze_c3"], False)]
    dry = {label: sum(x["underrun_s"] > 0 for x in lv["streams"]) for label, lv, _ in order}
    waves = {label: {x["index"] for x in lv["streams"] if x["underrun_s"] > 0} for label, lv, _ in order}
    before = earlier_gaps(28, 52)
    sw_spread = max(max(v) - min(v) for v in sw_runs.values())
    n_sw_layers = 12  # the command's --layers
    shapes_b = sorted({b for b, _ in shapes})
    shapes_p = sorted({p for _, p in shapes})
    res["fifty_third"] = {
        "device": "NVIDIA H200",
        "c64": {k: rows[k] | {"late_launches": late[k], "rushes": rushes[k], "longest_gap_s": gaps[k][0],
                              "longest_gap_at_s": gaps[k][1]} for k in rows},
        "vae_first_decodes": {k: v["decodes"] for k, v in first.items()},
        "gc_while_serving": gcs,
        "gc_start_up": {k: {p: {"ms": v[0], "objects": v[1], "frozen_ms": v[2]} for p, v in s.items()}
                        for k, s in starts.items()},
        "rush_xrt_c64_runs": {"rush": rush_x, "without": plain_x},
        "served_over_engine_c64_other_call": final["x_real_time"] / engine64,
        "streamed_weights_us_per_layer": {names_key(k): v for k, v in sw_runs.items()},
    }
    res.update(headline_keys(s52[1], final, "one stream: fifty-second session, NVIDIA H200, 2026-12-01, "
                             "raw/served_fiftysecond.json (742198c, 10 requests per stream); 64 streams: fifty-third "
                             "session, NVIDIA H200, 2026-12-02, raw/served_gc_freeze_call3_fiftythird.json (the final "
                             "code: the audio rush, start-up's objects frozen; 16 requests per stream); 128 streams "
                             "and capacity: forty-fourth session's sweep, raw/served_fortyfourth_sweep*.json"))
    dec = {k: starts[k]["decoder instance decoder_0_0"] for k in starts}
    vae = {k: starts[k]["vae_decoder instance vae_decoder_0_0"] for k in starts}
    orch = [v[0] for k in starts for p, v in starts[k].items() if p.startswith("tts")]
    orch_objects = [v[1] for k in starts for p, v in starts[k].items() if p.startswith("tts")]
    orch_frozen = [v[2] for p, v in starts["freeze_c3"].items() if p.startswith("tts")]
    n_orch = {m: sum(re.fullmatch(rf"{m}_\d+_\d+", p) is not None for p in starts["freeze_c3"])
              for m in ("tts", "tts_stream")}
    md = ["", "## Fifty-third session (2026-12-02, H200): a 64-stream run in which every stream stopped for "
          f"{1000 * gaps['on_c1'][0]:.0f} ms; the decoder's full garbage collection ({dec['freeze_c3'][0]}-"
          f"{dec['nofreeze_c3'][0]} ms) is a cause that fits, and start-up's objects are now frozen out of it. "
          "The audio rush's final form measured in the other order; weights streamed past the grid barriers (a Gluon "
          f"experiment): {sw_gain:.2f}x on LocDiT's projections, no path to the one-stream target",
          "", "Seven device calls on one H200 (about 26 of 30 min). Call 1 ran the audio rush's final form (which "
          "no GPU had run: the fifty-second session's last changes) against `audio_rush=false`, in the other "
          "order than that session's call 2: without the rush first. The rush's run had a stall of every stream; "
          "call 2 tested one suspect for it (the VAE's eager decodes) and ruled it out; call 3 measured another "
          "(the garbage collector) and served with and without the change that came of it. Calls 4-7 measured "
          "the lever earlier sessions left for the one-stream target (below).", "",
          "**64 streams, call 1** (`SET=\"decoder.timestep_buckets=10,100[ decoder.audio_rush=false]\" LEVELS=64 "
          "REQUESTS=16 bash benchmarks/run_served_gpu.sh`, one server after the other, 8ae64da; "
          "`raw/served_rush_{off,on}_call1_fiftythird.json.gz`) **and call 3** (the same with the rush in both, "
          "`VOXCPM_GC_FREEZE=0` then the final code; `raw/served_gc_{nofreeze,freeze}_call3_fiftythird.*`). "
          "Slack: audio a client still had when that chunk came (negative: it ran dry); the longest gap: the "
          "longest time in which no stream got a chunk:", "",
          "| run | x real time | TTFA p50 / p95 ms | smooth | rows a step | steps launched late | rushes | "
          "2nd chunk after the 1st, p50 / p99 / max ms | 2nd chunk slack, min / p1 ms | longest gap, ms (at s) |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for k, (call, label, *_) in RUNS.items():
        r, g = rows[k], rows[k]["second_after_first_ms"]
        md.append(f"| call {call}: {label} | {r['x_real_time']:.1f} | {r['ttfa_p50']:.1f} / {r['ttfa_p95']:.1f} | "
                  f"{share(r['smooth'])} | {r['rows_per_step']:.2f} | {late[k]:.0f} of {r['steps']:.0f} | "
                  f"{rushes[k]:.0f} | {g['p50']:.1f} / {g['p99']:.1f} / {g['max']:.1f} | "
                  f"{r['second_slack_ms']['min']:.1f} / {r['second_slack_ms']['p1']:.1f} | "
                  f"{1000 * gaps[k][0]:.0f} ({gaps[k][1]:.2f}) |")
    md += ["",
           f"- **The stall.** In call 1's rush run no stream got a chunk for {1000 * gaps['on_c1'][0]:.0f} ms from "
           f"{gaps['on_c1'][1]:.2f} s on; {len(stalled)} streams of the second wave (requests just started) ran dry "
           f"at their second chunk, by {min(1000 * s['underrun_s'] for s in stalled):.0f}-"
           f"{max(1000 * s['underrun_s'] for s in stalled):.0f} ms: all the {share(on['smooth_playback_frac'])} "
           "smooth is that. No other run here had a gap over "
           f"{1000 * max(g[0] for k, g in gaps.items() if k != 'on_c1'):.0f} ms; of the {len(before)} 64-stream "
           "burst runs in `raw/` with chunk timings from the twenty-eighth session to the fifty-first, the longest "
           f"gap was {1000 * max(before)[0]:.0f} ms (`raw/{max(before)[1]}`). The rest of that run's streams had "
           f"{rest2[0]:.1f} ms to spare at their second chunk at least, where the run without the rush had "
           f"{rows['off_c1']['second_slack_ms']['min']:.1f}: what the rush is for.",
           f"- **The rush's cost**, again: {on['x_real_time']:.1f}x against {off['x_real_time']:.1f}x "
           f"({100 * (1 - on['x_real_time'] / off['x_real_time']):.1f}% less, the rush second this time). Over "
           f"both sessions' 64-stream runs, the rush's four make {statistics.mean(rush_x):.1f}x on average, the "
           f"four without it {statistics.mean(plain_x):.1f}x ({100 * (1 - statistics.mean(rush_x) / statistics.mean(plain_x)):.1f}% "
           "less; two of those four ran 742198c, the code before the rush, one with 10 requests a stream); smooth "
           "with the rush: "
           + ", ".join(share(lv["smooth_playback_frac"]) for lv in [s52_64["on_call2"]] + [levels[k] for k in (
               "on_c1", "nofreeze_c3", "freeze_c3")])
           + "; without: " + ", ".join(share(lv["smooth_playback_frac"]) for lv in plain)
           + " (the fifty-second session's three, then call 1's). Kept on: the tightest second chunk had "
           f"{rest2[0]:.1f} ms (call 1, past the stall) and {rows['nofreeze_c3']['second_slack_ms']['min']:.1f} ms "
           f"(call 3's first server) to spare with it, {rows['off_c1']['second_slack_ms']['min']:.1f} ms without. "
           f"The {sum(x['underrun_s'] > 0 for x in final['streams'])} of {len(final['streams'])} streams that call "
           "3's final run lost ran dry by about 10 ms: second-wave streams whose second chunk came 170 ms after "
           "their first (where those 170 ms went was not looked into).",
           "- **Server order.** In every run that was the second server of its call some streams ran dry, and in "
           f"{sum(1 for label, _, first_ in order if first_ and dry[label])} of the "
           f"{sum(1 for *_, first_ in order if first_)} first servers: "
           + ", ".join(f"{label} {'first' if first_ else 'second'} {share(lv['smooth_playback_frac'])}"
                       for label, lv, first_ in order)
           + " (session/call). Where in its client's sequence of requests each dry stream was: "
           + "; ".join(f"{label} request {', '.join(str(i + 1) for i in sorted(idx))}" for label, idx in waves.items() if idx)
           + "; never a client's first, all started while others were ending. "
           "Both of this session's A/Bs served the change second, so what they say about smooth playback is "
           "confounded with the order; the throughput figures agree across orders (the rush less in both).",
           "", "**Suspect 1, ruled out: an eager VAE decode of a shape not seen before.** Decodes that the "
           "captured graphs do not cover (more than 16 streams with a chunk over 4 patches, more than 64 streams) "
           "run eagerly, and a kernel meeting a new shape can compile. Call 2 timed each decode's first and second "
           f"run after the same start-up as served (`benchmarks/vae_first_decodes.py`, new; {len(shapes)} shapes, "
           f"{shapes_b[0]}-{shapes_b[-1]} streams x {shapes_p[0]}-{shapes_p[-1]} patches in order, one fresh process "
           "per run, so a shape's first run came after the earlier shapes' ones; `raw/vae_first_*_fiftythird.json`):",
           f"- The first eager run of a shape took {min(extra['eager_cold']):.0f}-{max(extra['eager_cold']):.0f} ms "
           f"more than its second with fresh caches, {min(extra['eager_warm']):.0f}-{max(extra['eager_warm']):.0f} "
           "ms with the caches the first process left (median "
           f"{statistics.median(extra['eager_cold']):.0f} and {statistics.median(extra['eager_warm']):.0f}): no "
           "compile of hundreds of ms.",
           "- Every decode through graphs (a batch past the largest bucket in groups, a chunk past the longest "
           "graph in pieces: `raw/vae_graph_plan_fiftythird.patch`, recreated after the revert with the same "
           "behaviour; its GPU tests passed, `raw/gpu_tests_vae_graph_plan_fiftythird.txt`) removes even those, "
           "but is slower where the eager decode runs only the rows it has. Second runs, ms, graphs / eager "
           "(two processes): "
           + "; ".join(f"{b} x {p}: {v[0]:.1f} / {v[1]:.1f}, {v[2]:.1f}" for (b, p), v in slow.items())
           + ". Dropped.",
           "", "**Suspect 2: the garbage collector.** A collection of Python's oldest generation walks every object "
           "the process tracks, holding the GIL: every thread of the decoder (the engine's launches, the audio "
           "thread's sends) waits for it. The change (`serving/gc_pauses.py`, kept): the decoder, the "
           "orchestrators and vae_decoder end their start-up with one full collection, timed and logged, then "
           "freeze what is left (`gc.freeze`), which later collections skip; `VOXCPM_GC_FREEZE=0` leaves it "
           "out; the decoder's collections are on `/metrics` by generation. At start-up (call 3's logs), ms:", "",
           "| process | full collection, objects (first server / second) | full collection ms, first server (not frozen) | "
           "second server: before freezing / frozen |", "|---|---|---|---|",
           f"| decoder | {dec['nofreeze_c3'][1]:,} / {dec['freeze_c3'][1]:,} | {dec['nofreeze_c3'][0]} | "
           f"{dec['freeze_c3'][0]} / {dec['freeze_c3'][2]:.1f} |",
           f"| vae_decoder | {vae['nofreeze_c3'][1]:,} / {vae['freeze_c3'][1]:,} | {vae['nofreeze_c3'][0]} | "
           f"{vae['freeze_c3'][0]} / {vae['freeze_c3'][2]:.1f} |",
           f"| tts, tts_stream ({n_orch['tts']} and {n_orch['tts_stream']} instances) | "
           f"{min(orch_objects):,}-{max(orch_objects):,} | {min(orch)}-{max(orch)} (either server) | "
           f"- / {max(orch_frozen):.1f} |", "",
           "The first server compiled its kernels (fresh caches), the second loaded them: the decoder's extra "
           "objects are likely the compilers'.", "",
           f"- A full collection in the decoder costs {dec['freeze_c3'][0]}-{dec['nofreeze_c3'][0]} ms, the size of "
           f"call 1's {1000 * gaps['on_c1'][0]:.0f} ms gap in which nothing reached any stream. That it was one is "
           "likely, not shown: call 1 had no counter yet, and neither of call 3's servers ran one while serving "
           "(generation 2: "
           + ", ".join(f"{gcs[k]['collections'][2]:.0f}" for k in gcs) + " collections; generation 0: "
           + ", ".join(f"{gcs[k]['collections'][0]:.0f}" for k in gcs) + "; the longest pause "
           + ", ".join(f"{1000 * gcs[k]['longest_s']:.1f}" for k in gcs) + " ms). CPython runs one when the "
           "objects that survived younger collections since the last reach a quarter of those it already "
           "holds, so in a long-lived server one comes now and then, whenever that is.",
           f"- Frozen, a full collection walks only what serving made since start-up: {dec['freeze_c3'][2]:.1f} ms "
           f"at its end. Served with it (the second server): {final['x_real_time']:.1f}x against "
           f"{levels['nofreeze_c3']['x_real_time']:.1f}x without, the same within the runs' spread; smooth "
           f"{share(final['smooth_playback_frac'])} against {share(levels['nofreeze_c3']['smooth_playback_frac'])}, "
           f"the second chunk's p99 {rows['freeze_c3']['second_after_first_ms']['p99']:.0f} ms after the first "
           f"against {rows['nofreeze_c3']['second_after_first_ms']['p99']:.0f} (see server order above). Kept for "
           "what a full collection would otherwise cost every stream; not shown to change a run.", "",
           "**The one-stream target: weight streaming decoupled from the barriers, measured** (calls 4-7, "
           "`benchmarks/experiments/streamed_weights.py`, new, Gluon; `raw/streamed_weights_call*_fiftythird.json`). "
           "Earlier sessions left one lever for a lone request's step (5.03 ms, 4.0 needed): the persistent layer "
           "kernel's GEMM phases load their weights only once their grid barrier has passed, so DRAM idles through "
           "every barrier and every latency-bound phase. The experiment builds LocDiT's four projections (34.6 MB "
           f"a layer, {n_sw_layers} layers, 32 token rows) as one persistent Gluon kernel in which a producer warp per program "
           "streams the program's weight tiles (TMA, [64, 64] bf16) of every phase of every layer into a ring of "
           "shared-memory slots, waiting only for free slots, while the program's other four warps run the phases "
           "(grid barrier, warpgroup MMAs, each item's output stored, and after the barrier a read of the tile "
           "the previous phase wrote, as the real activations are read). `coupled` makes the producer wait for "
           "each phase's barrier first, as the persistent kernel's loads do. One layer checked against PyTorch: "
           f"max abs {sw['check_max_abs_streamed']:.1e}. Calls 4-6 ran earlier forms (each product waited for "
           "before its slot was freed, the read after the products, items dealt from program 0 in every phase); "
           f"call 7's, the committed one, us a layer over {n_sw_layers} layers (two runs each of 16 and 24 slots):", "",
           "| variant | 16 slots | 24 slots |", "|---|---|---|"]
    names = {(False, True, True, True): "streamed (as built)", (True, True, True, True): "coupled",
             (False, False, True, True): "streamed, no reads of the previous phase",
             (True, False, True, True): "coupled, no reads of the previous phase",
             (False, False, False, True): "streamed, no barriers either (a probe)",
             (False, False, False, False): "the stream alone: no barriers, no products (a probe)"}
    for key, name in names.items():
        md.append(f"| {name} | " + " | ".join(", ".join(f"{v:.1f}" for v in sw_slots[key][n]) for n in (16, 24)) + " |")
    md += ["",
           "- Decoupled, the phases gain a little: medians of the four runs "
           f"{sw_med[(False, True, True, True)]:.1f} against {sw_med[(True, True, True, True)]:.1f} us a layer "
           f"({sw_med[(True, True, True, True)] / sw_med[(False, True, True, True)]:.2f}x), without the reads "
           f"{sw_med[(False, False, True, True)]:.1f} against {sw_med[(True, False, True, True)]:.1f} "
           f"({sw_med[(True, False, True, True)] / sw_med[(False, False, True, True)]:.2f}x); runs of one variant "
           f"spread by up to {sw_spread:.1f} us. The stream alone, with nothing else in the "
           f"way, runs at {sw_bytes / min(sw_runs[(False, False, False, False)]) / 1e6:.2f} TB/s at best "
           f"({min(sw_runs[(False, False, False, False)]):.1f} us a layer; PyTorch reads the same "
           f"{sw_bytes * n_sw_layers / 1e6:.0f} MB at "
           f"{sw_floor:.2f} TB/s). One producer warp issuing 8 KB tiles per SM, with 128-192 KB in flight, does "
           "not keep DRAM busy; why (tile size, in-flight bytes, the TMA units' rate) was not isolated.",
           "- Streamed as built, the four projections alone take "
           f"{min(sw_runs[(False, True, True, True)]):.1f}-{max(sw_runs[(False, True, True, True)]):.1f} us a layer, "
           "with attention, norms and SiLU still to add; the persistent layer kernel runs the whole LocDiT layer "
           "in 25.2 us (forty-seventh to fifty-first sessions, other calls). In this form the lever does not "
           "bring the step near 4 ms; a stream near DRAM's rate would have to come first. Not taken further.", "",
           "**Against issue 17's targets** (one stream and 8 streams: the fifty-second session's closing run, "
           "whose code is this one's but for the rush's final form and the freeze, neither measured at 1 or 8 "
           "streams; 64 streams: call 3's final code):", ""]
    md += targets_table(s52[1], s52[8], final)
    md += [f"| served / engine at 64 >= {ISSUE_RATIO} | {final['x_real_time'] / engine64:.3f} (over the fifty-second "
           f"session's engine run, {engine64:.1f}x: another call) | missed |", "",
           f"The 64-stream row was met by the fifty-second session's rush run and by call 3's first server "
           f"here; the final code's run missed smooth playback: {share(final['smooth_playback_frac'])} of its "
           "streams (the rest ran dry by about 10 ms, at their second chunk). It is met in half the rush's runs, "
           "not reliably. results.json's 64-stream headline keys now come from that final run.", "",
           "![fifty-third session: the stall, and a full garbage collection by process](results_fifty_third.png)",
           ""]
    _plot(levels, starts)
    return md


def _plot(levels: dict, starts: dict):
    """Left: chunks that reached any stream per 50 ms in call 1's two runs; right: a full collection's ms at
    start-up by process, in call 3's two servers."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for k in ("off_c1", "on_c1"):
        t = arrivals(levels[k])
        bins = [i * 0.05 for i in range(int(4 / 0.05) + 1)]
        a.hist([x for x in t if x < 4], bins=bins, histtype="step", color=COLORS[k], label=RUNS[k][1])
    a.set_xlabel("s from the level's start")
    a.set_ylabel("chunks that reached a client, per 50 ms")
    a.legend(fontsize=7)
    procs = [("decoder", "decoder instance decoder_0_0"), ("vae_decoder", "vae_decoder instance vae_decoder_0_0"),
             ("tts_stream", "tts_stream_0_0")]
    series = [("first server, not frozen", COLORS["nofreeze_c3"], [starts["nofreeze_c3"][p][0] for _, p in procs]),
              ("second server, before freezing", "tab:cyan", [starts["freeze_c3"][p][0] for _, p in procs]),
              ("second server, frozen", COLORS["freeze_c3"], [starts["freeze_c3"][p][2] for _, p in procs])]
    paired_bars(b, [n for n, _ in procs], series, lambda v: f"{v:.0f}")
    b.set_ylabel("a full garbage collection, ms")
    b.legend(fontsize=7)
    save_panels(fig, (a, b), "fifty-third session (H200): a stall of every stream at 64 streams; the garbage "
                "collector's full walk by process", "results_fifty_third.png")
