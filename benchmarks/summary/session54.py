"""results.md: the fifty-fourth session's section, and results_fifty_fourth.png."""

import statistics

from bench_served import _pct, share
from summary.issue17 import ISSUE_RATIO, ok_c64, targets_table
from summary.plots import pyplot, save_panels
from summary.raw import headline_keys, load, metric_value, served_levels, served_row
from summary.session52 import chunk_slack, chunk_times
from summary.session53 import longest_gap

# 64-stream runs: key -> (call, server's place in its call, code, raw file, metrics file)
RUNS = {f"{code}_c{call}_s{place}": (call, place, code, f"served_ends_{code}_call{call}_server{place}_fiftyfourth.json",
                                     f"metrics_ends_{code}_call{call}_server{place}_fiftyfourth.txt")
        for call, place, code in ((1, 1, "old"), (1, 2, "new"), (2, 1, "new"), (2, 2, "old"), (3, 1, "old"),
                                  (3, 2, "new"), (3, 3, "new"), (3, 4, "old"))}
CODE = {"new": "rush before ends too (d6b98ef)", "old": "8a36f50 (before)"}
CLOSING = "served_closing_call4_fiftyfourth.json"
HEADLINE = "new_c2_s1"  # the final code's run that served first in its call, as the closing runs before


def dry_chunk(stream: dict) -> int | None:
    """The first chunk (1-based) that came after a player starting at the stream's first chunk had run
    out of audio; None if none did."""
    c = stream["chunk_ms"]  # [[arrival ms, audio ms], ...]
    return next((i + 1 for i in range(1, len(c)) if sum(x[1] for x in c[:i]) < c[i][0] - c[0][0]), None)


def ends_wave(lv: dict) -> dict | None:
    """A served level's streams that ran dry at their 2nd chunk, and what reached the clients between the
    last of their first chunks and the first of their second ones: how many of those were requests' last
    chunks (the audio that goes out with an end), and over how many ms those came. None if none ran dry."""
    dry = [s for s in lv["streams"] if dry_chunk(s) == 2]
    if not dry:
        return None
    t1 = max(s["start_s"] + s["chunk_ms"][0][0] / 1000 for s in dry)
    t2 = min(s["start_s"] + s["chunk_ms"][1][0] / 1000 for s in dry)
    between = [(s["start_s"] + c[0] / 1000, i == len(s["chunk_ms"]) - 1) for s in lv["streams"]
               for i, c in enumerate(s["chunk_ms"]) if t1 < s["start_s"] + c[0] / 1000 < t2]
    lasts = sorted(t for t, last in between if last)
    return {"dry": len(dry), "window_ms": 1000 * (t2 - t1), "delivered": len(between), "last_chunks": len(lasts),
            "last_chunks_span_ms": 1000 * (lasts[-1] - lasts[0]) if len(lasts) > 1 else 0.0}


def fifty_fourth_session(res) -> list[str]:
    """2026-12-02 (issue 17): the audio rush before an ending request's delivery too, against the code
    before it in both orders; the closing run at 1 and 8 streams. Sets res["fifty_fourth"] and the served
    headline keys, returns the markdown, draws results_fifty_fourth.png."""
    levels = {k: served_levels(f)[64] for k, (*_, f, _) in RUNS.items()}
    times = {k: chunk_times(lv) for k, lv in levels.items()}
    rows = {k: served_row(lv) | chunk_slack(times[k]) for k, lv in levels.items()}
    gaps = {k: longest_gap(lv) for k, lv in levels.items()}
    rushes = {k: metric_value(m, "voxcpm_decoder_audio_rushes_total") for k, (*_, m) in RUNS.items()}
    dry = {k: sum(s["underrun_s"] > 0 for s in lv["streams"]) for k, lv in levels.items()}
    dry_at = {k: sorted({dry_chunk(s) for s in lv["streams"] if s["underrun_s"] > 0}) for k, lv in levels.items()}
    x = {code: [levels[k]["x_real_time"] for k in RUNS if RUNS[k][2] == code] for code in CODE}
    p95 = {code: [levels[k]["ttfa_ms"]["p95"] for k in RUNS if RUNS[k][2] == code] for code in CODE}
    smooth = {code: [levels[k]["smooth_playback_frac"] for k in RUNS if RUNS[k][2] == code] for code in CODE}
    met64 = {code: sum(ok_c64(levels[k]) for k in RUNS if RUNS[k][2] == code) for code in CODE}
    before = load("served_gc_freeze_call3_fiftythird.json")
    wave53 = ends_wave(next(lv for lv in before["levels"] if lv["concurrency"] == 64))
    wave_old = ends_wave(levels["old_c2_s2"])
    closing = served_levels(CLOSING)
    engine64 = max(r["aggregate_xrt"] for r in load("offline_b64x2_b1_fiftysecond.json")["engine"]["graphs"]["runs"]
                   if r["batch"] == 64)
    final = levels[HEADLINE]
    later = [k for k in RUNS if RUNS[k][1] > 1]
    p5 = {k: _pct(times[k][1], 5) for k in RUNS}
    res["fifty_fourth"] = {
        "device": "NVIDIA H200",
        "c64": {k: rows[k] | {"call": RUNS[k][0], "server": RUNS[k][1], "code": RUNS[k][2], "rushes": rushes[k],
                              "dry_streams": dry[k], "late_launches": levels[k]["decoder_steps"]["late_launches"],
                              "longest_gap_s": gaps[k][0]} for k in RUNS},
        "xrt_c64_mean": {code: statistics.mean(v) for code, v in x.items()},
        "ends_wave_fifty_third_final": wave53, "ends_wave_old_c2_s2": wave_old,
        "closing": {n: served_row(closing[n]) | {"rtf_p50": closing[n]["rtf"]["p50"]} for n in (1, 8)},
        "served_over_engine_c64_other_call": final["x_real_time"] / engine64,
    }
    res.update(headline_keys(closing[1], final, "one stream: fifty-fourth session, NVIDIA H200, 2026-12-02, "
                             f"raw/{CLOSING} (d6b98ef, 10 requests per stream); 64 streams: fifty-fourth session, "
                             f"raw/{RUNS[HEADLINE][3]} (d6b98ef, the first server of its call, 16 requests per "
                             "stream); 128 streams and capacity: forty-fourth session's sweep, "
                             "raw/served_fortyfourth_sweep*.json"))
    ratio = statistics.mean(x["new"]) / statistics.mean(x["old"])
    md = ["", "## Fifty-fourth session (2026-12-02, H200): streams that ran dry at 64 streams waited behind a "
          "wave of ends with no rush between them; the rush now runs before every delivery of a round's last "
          f"batch: every stream smooth in all {len(x['new'])} runs, TTFA p95 {min(p95['new']):.0f}-"
          f"{max(p95['new']):.0f} ms, throughput within the runs' spread",
          "", "Four device calls on one H200 (about 24 of 30 min). No kernel changed; the change is the audio "
          "thread's (`engine/stream_audio.py`).", "",
          "**What ran dry.** In the fifty-third session's final run (`raw/served_gc_freeze_call3_fiftythird.json`) "
          f"{wave53['dry']} second-wave streams ran dry at their second chunk. Between the last of their first "
          f"chunks and the first of their second ones ({wave53['window_ms']:.0f} ms), {wave53['delivered']} chunks "
          f"reached clients, {wave53['last_chunks']} of them requests' last chunks, one every "
          f"{wave53['last_chunks_span_ms'] / max(1, wave53['last_chunks'] - 1):.1f} ms over "
          f"{wave53['last_chunks_span_ms']:.0f} ms: the first wave's requests ending together (every request of the "
          "benchmark is 100 steps, so a burst's clients end together). Those are arrival times at the clients; "
          "the server's sends were not timed. What fits them: the round's last batch was all ends, and the rush "
          "ran only after a batch's ends, so nothing went between them, and the newcomers' second chunks waited "
          "for the next round. The rush's estimate of a round's rest (deliveries left times a moving "
          "average of one) counted an end as a send but timed only chunks' sends, not the end's.", "",
          "**The change** (d6b98ef): the rush looks at what is queued before every delivery of a round's last "
          "batch, ends' included, and an end's close and delivery count in its moving average of a send. CPU "
          "tests (`tests/test_decode_audio.py`): a rush before an ending request's delivery (the rush test's "
          "order), and an end's delivery time in the estimate; each fails with its half of the change undone.",
          "", "**64 streams, before and after, in both orders** (calls 1-3: `ORDER=\"old new\"`, `\"new old\"`, "
          "`\"old new new old\"`; each server `SET=\"decoder.timestep_buckets=10,100\" LEVELS=64 REQUESTS=16 bash "
          "benchmarks/run_served_gpu.sh`, the code before through `VOXCPM_PYTHON_BACKEND`; "
          "`raw/served_ends_*_fiftyfourth.json.gz`, `raw/metrics_ends_*_fiftyfourth.txt`). Slack: audio a client "
          "still had when that chunk came (negative: it ran dry); the longest gap: the longest time no stream got "
          "a chunk:", "",
          "| call / server | code | x real time | TTFA p50 / p95 ms | smooth | streams dry (at chunk) | rushes | "
          "steps launched late | 2nd chunk after the 1st, p50 / p99 ms | 2nd chunk slack, min / p1 ms | "
          "3rd chunk slack, min ms | longest gap ms |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k, (call, place, code, *_) in RUNS.items():
        r = rows[k]
        md.append(f"| {call} / {place} | {CODE[code]} | {r['x_real_time']:.1f} | {r['ttfa_p50']:.1f} / "
                  f"{r['ttfa_p95']:.1f} | {share(r['smooth'])} | {dry[k]}"
                  + (f" ({', '.join(map(str, dry_at[k]))})" if dry_at[k] else "") + f" | {rushes[k]:.0f} | "
                  f"{levels[k]['decoder_steps']['late_launches']:.0f} of {r['steps']:.0f} | "
                  f"{r['second_after_first_ms']['p50']:.1f} / {r['second_after_first_ms']['p99']:.1f} | "
                  f"{r['second_slack_ms']['min']:.1f} / {r['second_slack_ms']['p1']:.1f} | "
                  f"{r['third_slack_ms']['min']:.1f} | {1000 * gaps[k][0]:.0f} |")
    md += ["",
           f"- **Smooth playback:** with the change every stream played smoothly in all {len(x['new'])} runs, first "
           "or later in its call; the tightest second chunk came "
           f"{min(rows[k]['second_slack_ms']['min'] for k in RUNS if RUNS[k][2] == 'new'):.1f} ms ahead of its player "
           "at worst. Before it: " + ", ".join(share(v) for v in smooth["old"]) + " (in call order). Call 2's "
           f"second server (before) lost {wave_old['dry']} streams at their second chunk, with "
           f"{wave_old['last_chunks']} last chunks reaching clients over {wave_old['last_chunks_span_ms']:.0f} ms "
           "between their first and second chunks, as in the fifty-third session's run; "
           + "; ".join(f"call {RUNS[k][0]}'s server {RUNS[k][1]} lost {dry[k]} at chunk "
                       f"{', '.join(map(str, dry_at[k]))}" for k in RUNS
                       if RUNS[k][2] == "old" and dry[k] and k != "old_c2_s2") + ".",
           f"- **TTFA p95:** {', '.join(f'{v:.0f}' for v in p95['new'])} ms with it against "
           f"{', '.join(f'{v:.0f}' for v in p95['old'])} without: newcomers' first chunks no longer wait for a "
           "wave of ends either.",
           "- **Past the tightest streams** the two overlap (the plot's left panel): the 5th percentile of the "
           "second chunks' slack, by run, "
           + ", ".join(f"{p5[k]:.1f}" for k in RUNS if RUNS[k][2] == "new") + " ms with it against "
           + ", ".join(f"{p5[k]:.1f}" for k in RUNS if RUNS[k][2] == "old") + " without.",
           f"- **The cost:** {statistics.mean(x['new']):.1f}x on average against {statistics.mean(x['old']):.1f}x "
           f"({100 * (1 - ratio):.1f}% less; runs {min(x['new']):.1f}-{max(x['new']):.1f} against "
           f"{min(x['old']):.1f}-{max(x['old']):.1f}: a difference within the runs' spread, not resolved by "
           "four runs each). The rushes counted (`voxcpm_decoder_audio_rushes_total` as it counted then: a rush "
           "that took chunks, one that only put them back for want of a stream slot too, which at 64 streams of "
           "256 slots does not happen; later this session it was made to count only rushes that decoded) went from "
           f"{min(rushes[k] for k in RUNS if RUNS[k][2] == 'old'):.0f}-"
           f"{max(rushes[k] for k in RUNS if RUNS[k][2] == 'old'):.0f} a run to "
           f"{min(rushes[k] for k in RUNS if RUNS[k][2] == 'new'):.0f}-"
           f"{max(rushes[k] for k in RUNS if RUNS[k][2] == 'new'):.0f}, each a small decode on the GPU beside the "
           "steps, and an end now waits for the rushes before it. Kept: the 64-stream row of the targets held in "
           f"{met64['new']} of {len(x['new'])} runs with the change, {met64['old']} of {len(x['old'])} without (a "
           "small sample: it supports the change, it does not prove it).",
           "- **Server order:** of the runs that served second or later in their call, "
           f"{sum(1 for k in later if RUNS[k][2] == 'old' and dry[k])} of "
           f"{sum(1 for k in later if RUNS[k][2] == 'old')} without the change had dry streams, "
           f"{sum(1 for k in later if RUNS[k][2] == 'new' and dry[k])} of "
           f"{sum(1 for k in later if RUNS[k][2] == 'new')} with it; of the first servers, "
           f"{sum(1 for k in RUNS if RUNS[k][1] == 1 and RUNS[k][2] == 'old' and dry[k])} of "
           f"{sum(1 for k in RUNS if RUNS[k][1] == 1 and RUNS[k][2] == 'old')} without and "
           f"{sum(1 for k in RUNS if RUNS[k][1] == 1 and RUNS[k][2] == 'new' and dry[k])} of "
           f"{sum(1 for k in RUNS if RUNS[k][1] == 1 and RUNS[k][2] == 'new')} with.", "",
           "**The closing run at 1 and 8 streams** (call 4, d6b98ef: `SET=\"decoder.timestep_buckets=10,100\" "
           f"LEVELS=1,8 REQUESTS=10 bash benchmarks/run_served_gpu.sh`; `raw/{CLOSING}.gz`): one stream RTF p50 "
           f"{closing[1]['rtf']['p50']:.4f}, TTFA p50 / p95 {closing[1]['ttfa_ms']['p50']:.1f} / "
           f"{closing[1]['ttfa_ms']['p95']:.1f} ms; 8 streams {closing[8]['x_real_time']:.1f}x, smooth "
           f"{share(closing[8]['smooth_playback_frac'])}.", "",
           "**Against issue 17's targets** (1 and 8 streams: call 4; 64 streams: call 2's first server, the final "
           "code's run that served first in its call; its other three runs are in the table above):", ""]
    md += targets_table(closing[1], closing[8], final)
    md += [f"| served / engine at 64 >= {ISSUE_RATIO} | {final['x_real_time'] / engine64:.3f} (over the fifty-second "
           f"session's engine run, {engine64:.1f}x: another call) | missed |", "",
           "results.json's one-stream and 64-stream headline keys now come from call 4 and call 2's first server.",
           "", "![fifty-fourth session: second-chunk slack and throughput, before and after](results_fifty_fourth.png)",
           ""]
    _plot(rows, times, levels)
    return md


def _plot(rows: dict, times: dict, levels: dict):
    """Left: the tightest 5% of each run's second chunks (slack, sorted); right: each run's x real time."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for k, (call, place, code, *_) in RUNS.items():
        s2 = sorted(times[k][1])[: max(1, len(times[k][1]) // 20)]
        a.plot([100 * (i + 1) / len(times[k][1]) for i in range(len(s2))], s2,
               color="tab:green" if code == "new" else "tab:gray", alpha=0.8,
               label=f"call {call} / server {place}: {CODE[code]}")
    a.axhline(0, color="black", lw=0.8)
    a.set_xlabel("tightest streams, % of the run's 1024")
    a.set_ylabel("audio left at the 2nd chunk, ms (below 0: ran dry)")
    a.legend(fontsize=6)
    keys = list(RUNS)
    b.bar(range(len(keys)), [levels[k]["x_real_time"] for k in keys],
          color=["tab:green" if RUNS[k][2] == "new" else "tab:gray" for k in keys])
    for i, k in enumerate(keys):
        b.text(i, levels[k]["x_real_time"] + 1, share(levels[k]["smooth_playback_frac"]), ha="center", fontsize=7)
    b.set_xticks(range(len(keys)), [f"{RUNS[k][0]}/{RUNS[k][1]}" for k in keys])
    b.set_ylim(500, 545)
    b.set_xlabel("call / server (green: the change, gray: before); label: smooth")
    b.set_ylabel("x real time, 64 streams")
    save_panels(fig, (a, b), "fifty-fourth session (H200): the rush before ends too, 64 streams in both orders",
                "results_fifty_fourth.png")
