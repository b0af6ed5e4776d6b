"""results.md: the fifty-sixth session's section, and results_fifty_sixth.png."""

from collections import Counter

from bench_served import share
from summary.plots import pyplot, save_panels
from summary.raw import load, metric_value, served_row
from summary.session54 import dry_chunk
from summary.session55 import wave_gaps

S = "fiftysixth"
# key -> (call, server's place in its call, what it ran, requests a stream, raw name)
RUNS = {
    "norush_c1": (1, 1, "final code, audio_rush=false", 2, "rush128_norush_call1_server1"),
    "rush_c1": (1, 2, "final code", 2, "rush128_new_call1_server2"),
    "sweep_c2_s1": (2, 1, "final code", 2, "sweep_new_call2_server1"),
    "old44_c2": (2, 2, "forty-fourth session's code (d13d6c9)", 2, "sweep_old44_call2_server2"),
    "sweep_c2_s3": (2, 3, "final code", 2, "sweep_new_call2_server3"),
    "four_c3_s1": (3, 1, "audio_senders=4 (334d30a)", 3, "senders_four_call3_server1"),
    "one_c3": (3, 2, "audio_senders=1 (334d30a: one sending thread, as the final code)", 3,
               "senders_one_call3_server2"),
    "four_c3_s3": (3, 3, "audio_senders=4 (334d30a)", 3, "senders_four_call3_server3"),
}
SWEEPS = ("sweep_c2_s1", "old44_c2", "sweep_c2_s3")
FIFTY_FIFTH = "served_closing_sweep_fiftyfifth.json"
EARLIER = {"fifty-fifth session's sweep (final code)": FIFTY_FIFTH,
           "forty-fourth session's sweep (d13d6c9)": "served_fortyfourth_sweep.json"}


def _levels(name: str) -> list:
    """A run's levels in the order it ran them (a level may repeat)."""
    return load(name)["levels"]


def dry_counts(lv: dict) -> str:
    """Streams that ran dry, as 'N at wave w chunk c' (waves and chunks 1-based), most first."""
    dry = Counter((s["index"] + 1, dry_chunk(s)) for s in lv["streams"] if dry_chunk(s))
    return ", ".join(f"{n} w{w} c{c}" for (w, c), n in sorted(dry.items(), key=lambda d: -d[1])) or "none"


def dry_streams(lv: dict) -> list:
    """(their lateness ms, wave, their arrival's place in their wave) for the level's streams that ran
    dry, waves and places 1-based."""
    out = []
    for w in sorted({s["index"] for s in lv["streams"]}):
        wave = sorted((s for s in lv["streams"] if s["index"] == w), key=lambda s: s["start_s"])
        out += [(1000 * s["underrun_s"], w + 1, rank + 1) for rank, s in enumerate(wave) if dry_chunk(s)]
    return out


def dry_who(dry: list) -> str:
    """Where a run's dry streams were: 'wave w, arrivals a-b' for each wave."""
    waves = sorted({w for _, w, _ in dry})
    return "; ".join(f"wave {w}, arrivals {min(r for _, v, r in dry if v == w)}-{max(r for _, v, r in dry if v == w)}"
                     for w in waves)


def _rushes(metrics: str) -> float | None:
    """The run's rushes; None for code without the rush (its metric is missing)."""
    try:
        return metric_value(metrics, "voxcpm_decoder_audio_rushes_total")
    except StopIteration:
        return None


def fifty_sixth_session(res) -> list[str]:
    """2026-12-02 (issue 17): the 128-at-once regression of the fifty-fifth session's sweep looked into
    (the rush off, the forty-fourth session's code, the final code's sweep twice), and the audio sent by
    several threads (audio_senders, reverted). Sets res["fifty_sixth"], returns the markdown, draws
    results_fifty_sixth.png."""
    levels = {k: _levels(f"served_{raw}_{S}.json") for k, (*_, raw) in RUNS.items()}
    rushes = {k: _rushes(f"metrics_{raw}_{S}.txt") for k, (*_, raw) in RUNS.items()}
    late = {k: metric_value(f"metrics_{raw}_{S}.txt", "voxcpm_engine_late_launches_total")
            for k, (*_, raw) in RUNS.items()}
    cap = {k: load(f"served_{RUNS[k][4]}_{S}.json")["capacity"] for k in SWEEPS}
    earlier = {name: next(lv for lv in _levels(f) if lv["concurrency"] == 128) for name, f in EARLIER.items()}
    at = lambda k, c: [lv for lv in levels[k] if lv["concurrency"] == c]  # noqa: E731
    final128 = [lv for k in RUNS if RUNS[k][2] == "final code" for lv in at(k, 128)]

    res["fifty_sixth"] = {
        "device": "NVIDIA H200",
        "runs": {k: {"call": call, "server": place, "code": what, "requests_per_stream": reqs,
                     "levels": [served_row(lv) | {"streams": lv["concurrency"], "dry": dry_counts(lv)} for lv in levels[k]],
                     "rushes": rushes[k], "late_launches": late[k]}
                 for k, (call, place, what, reqs, _) in RUNS.items()},
        "capacity_at_once": {k: cap[k] for k in SWEEPS},
        "final_code_c128_smooth": [lv["smooth_playback_frac"] for lv in final128],
    }

    md = ["", "## Fifty-sixth session (2026-12-02, H200): the fifty-fifth session's 128-at-once regression not "
          "reproduced, the forty-fourth session's code no smoother here; the audio sent by several threads, measured "
          "and reverted",
          "", "Three device calls on one H200 (about 28 of 30 min). The fifty-fifth session's sweep played 128 streams "
          "at once at 83.9% smooth where the forty-fourth session's played them all smoothly; it named the next run: "
          "the 128-stream burst without the audio rush beside the default, and the forty-fourth session's code.", "",
          "Each server: `SET=\"decoder.timestep_buckets=10,100[ decoder.audio_rush=false| decoder.audio_senders=1]\" "
          "ARRIVALS=burst LEVELS=... REQUESTS=... bash benchmarks/run_served_gpu.sh`; the forty-fourth session's code "
          "through `MODEL_REPOSITORY` and `VOXCPM_PYTHON_BACKEND` (its own `model_repository` and `python_backend` at "
          "d13d6c9, `timestep_buckets` 10,100 in its config: it refuses the parameters that came later). "
          f"`raw/served_*_{S}.{{json.gz,log}}`, `raw/metrics_*_{S}.txt`. Dry: streams that ran out of audio at all (smooth "
          "playback allows 1 ms), by wave (each worker's n-th request) and chunk (1-based). The chunk schedule is 1, 4, 16 patches (a patch "
          "160 ms of audio); a chunk goes early, at 1 patch, once the engine reckons its client has less than "
          "`playback_margin_ms` (100) left: at 128 streams the second chunks came that way.", "",
          "| call / server | code | requests a stream | streams | x real time | smooth | TTFA p50 / p95 ms | dry | "
          "rushes, late launches (whole run) |", "|---|---|---|---|---|---|---|---|---|"]
    for k, (call, place, what, reqs, _) in RUNS.items():
        for lv in levels[k]:
            if lv["concurrency"] < 64:
                continue
            md.append(f"| {call} / {place} | {what} | {reqs} | {lv['concurrency']} | {lv['x_real_time']:.1f} | "
                      f"{share(lv['smooth_playback_frac'])} | {lv['ttfa_ms']['p50']:.0f} / {lv['ttfa_ms']['p95']:.0f} | "
                      f"{dry_counts(lv)} | {'no rush' if rushes[k] is None else f'{rushes[k]:.0f}'}, {late[k]:.0f} |")
    for name, lv in earlier.items():
        md.append(f"| earlier | {name} | 2 | 128 | {lv['x_real_time']:.1f} | {share(lv['smooth_playback_frac'])} | "
                  f"{lv['ttfa_ms']['p50']:.0f} / {lv['ttfa_ms']['p95']:.0f} | {dry_counts(lv)} | |")
    w_old = wave_gaps(at("old44_c2", 128)[0], 1)
    dry_final = [d for k in RUNS if RUNS[k][2] == "final code" or k == "one_c3" for lv in at(k, 128)
                 if (d := dry_streams(lv))]
    dry_norush = [d for lv in at("norush_c1", 128) if (d := dry_streams(lv))]
    w_new = [wave_gaps(lv, 1) for lv in at("rush_c1", 128)]
    stalled = at("four_c3_s1", 128)[1]
    four128 = [lv["x_real_time"] for k in ("four_c3_s1", "four_c3_s3") for lv in at(k, 128) if lv is not stalled]
    one128 = [lv["x_real_time"] for lv in at("one_c3", 128)]
    md += ["",
           "- **The forty-fourth session's code was no smoother here.** Its own code, run between two runs of the "
           f"final code, played 96 streams at once at {share(at('old44_c2', 96)[0]['smooth_playback_frac'])} and 128 at "
           f"{share(at('old44_c2', 128)[0]['smooth_playback_frac'])} (capacity {cap['old44_c2']}), its dry streams "
           f"second-wave newcomers at their second chunk (that wave's 1st -> 2nd chunk gap at 128: p50 "
           f"{w_old['g12']['p50']:.0f} ms, max {w_old['g12']['max']:.0f}). The final code's two sweeps made capacity "
           f"{cap['sweep_c2_s1']} and {cap['sweep_c2_s3']} at once (128 at "
           f"{share(at('sweep_c2_s1', 128)[0]['smooth_playback_frac'])} and "
           f"{share(at('sweep_c2_s3', 128)[0]['smooth_playback_frac'])}). So the forty-fourth session's 100% at 128 "
           "looks like a good run rather than a better code, and the fifty-fifth session's 83.9% like a bad one: one "
           "run of the older code cannot settle it, and the sweeps' one run a level cannot tell such runs apart.",
           "- **The audio rush: fewer dry streams, by less.** Without it (call 1, first server) 128 at once "
           + " and ".join(share(lv["smooth_playback_frac"]) for lv in at("norush_c1", 128)) + ", 96 at "
           + share(at("norush_c1", 96)[0]["smooth_playback_frac"]) + ", nearly all of its dry streams second-wave "
           "newcomers, most at their second chunk, as with the forty-fourth session's code (which has no rush); "
           "with it (second server, so the servers' order is mixed in) "
           + " and ".join(share(lv["smooth_playback_frac"]) for lv in at("rush_c1", 128)) + " (the second wave's "
           "1st -> 2nd chunk gap p50 " + " and ".join(f"{w['g12']['p50']:.0f}" for w in w_new) + " ms, max "
           + " and ".join(f"{w['g12']['max']:.0f}" for w in w_new) + ").",
           "- **Over all of this session's runs of the final code with 2 requests a stream**, 128 at once played "
           + ", ".join(share(lv["smooth_playback_frac"]) for lv in final128) + " smooth: every stream in "
           f"{sum(lv['smooth_playback_frac'] == 1 for lv in final128)} of {len(final128)}. With 3 requests a stream "
           "(call 3) no run at 128 had every stream smooth, with either sender setting, the rush on in every one; "
           "with one sender the dry streams were second-wave newcomers but for two of the third wave. 128 at once is "
           "this code's edge, not inside it.",
           "- **How dry, and who.** The final code's runs at 128 with dry streams, and call 3's with one sender, had "
           "them late by at most " + ", ".join(f"{max(d)[0]:.1f} ms ({dry_who(d)})" for d in dry_final)
           + " (smooth playback allows 1 ms), against " + ", ".join(f"{max(d)[0]:.1f}" for d in dry_norush)
           + " ms without the rush: early arrivals of their wave, in later waves newcomers that started while the "
           "wave before was ending, all at their second chunk. That chunk, an early one of 1 patch, leaves the engine "
           "with the first step that ends at least 60 ms after their first left, and has the rest of the 160 ms to "
           "get through the audio thread and both hops. The next run to make: 128 at once, 3 requests a stream, with "
           "`decoder.playback_margin_ms=150` beside the default.", "",
           "**Tried and reverted: the audio sent by several threads** (334d30a, reverted by 90b6197). A send is a "
           "round trip to the server, and the audio thread made a round's sends one after another: 128 of them a "
           "round at 128 streams. python_backend's decoupled example sends from a thread per request, its stub lets go "
           "of the GIL while it waits, and the server takes sends on a pool of threads; so the change sent a batch's "
           "requests from `audio_senders` threads (4; the audio thread one of them, rushing between its own sends), "
           "each request from one thread, under a lock that let sends share it and kept every other stub call "
           "exclusive. CPU tests covered the order, the sends side by side and the lock. Call 3, in one call, "
           "4-1-4 senders:",
           "",
           "- At 64 streams: " + ", ".join(f"{at(k, 64)[0]['x_real_time']:.1f}x" for k in ("four_c3_s1", "four_c3_s3"))
           + f" with 4 senders against {at('one_c3', 64)[0]['x_real_time']:.1f}x with 1 (one run: not resolved).",
           "- At 128 at once: 4 senders " + ", ".join(
               f"{share(lv['smooth_playback_frac'])} / {lv['x_real_time']:.1f}x" for k in ("four_c3_s1", "four_c3_s3")
               for lv in at(k, 128)) + " smooth / throughput, against " + ", ".join(
               f"{share(lv['smooth_playback_frac'])} / {lv['x_real_time']:.1f}x" for lv in at("one_c3", 128))
           + " with 1. The first server's second run (on the machine this call started) stalled: its first wave's "
           "2nd -> 3rd chunk gap reached "
           f"{wave_gaps(stalled, 0)['g23']['max']:.0f} ms (no collection of the oldest generation "
           "ran: the decoder's gc metrics); its engine thread launched more steps late over the run "
           f"({late['four_c3_s1']:.0f} against {late['one_c3']:.0f} and {late['four_c3_s3']:.0f}).",
           "- Reverted: it did not make 128 at once smoother, which was its purpose, and gained no throughput there "
           f"(without the stalled run {min(four128):.1f}-{max(four128):.1f}x, against "
           f"{min(one128):.1f}-{max(one128):.1f}x with one sender). Four threads building responses in "
           "Python contend for the GIL with the engine thread that launches the steps; whether that is what the "
           "late launches show was not measured.", "",
           "**Against issue 17's targets**: unchanged from the fifty-fifth session (the serving code is the same but for "
           "three counters of the audio thread's deliveries, below). Capacity at "
           f"once: {cap['sweep_c2_s1']} and {cap['sweep_c2_s3']} in this session's two sweeps, "
           f"{load(FIFTY_FIFTH)['capacity']} in the fifty-fifth's: "
           "missed, since it is not met reliably. results.json's headline keys stay the fifty-fifth session's.", "",
           "**New counters** (no device run yet): `voxcpm_decoder_audio_sends_total`, "
           "`voxcpm_decoder_audio_send_seconds_total` and `voxcpm_decoder_audio_ends_alone_total`, the audio thread's "
           "deliveries, its time in them and the ends it sent alone; `bench_served.py` logs them per level and keeps "
           "them in each level's `decoder_steps`. This session could only infer how long the thread's sends take at "
           "128 streams; the next run shows it.", "",
           "![fifty-sixth session: 128 streams at once, smooth and throughput per run](results_fifty_sixth.png)", ""]
    _plot(levels, earlier)
    return md


def _plot(levels: dict, earlier: dict):
    """Left: the share of streams smooth at 128 at once, each run; right: their x real time."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    bars = [(f"{name.split(' (')[0]}", lv, "tab:gray") for name, lv in earlier.items()]
    colors = {"final code": "tab:green", "final code, audio_rush=false": "tab:orange"}
    for k, (call, place, what, reqs, _) in RUNS.items():
        for i, lv in enumerate(lv for lv in levels[k] if lv["concurrency"] == 128):
            bars.append((f"c{call}/s{place} {what.split(' (')[0]}, {reqs} req" + (f" #{i + 1}" if i else ""), lv,
                         colors.get(what, "tab:purple" if "=4" in what else "tab:blue" if "=1" in what else "tab:red")))
    for ax, key, label in ((axes[0], "smooth_playback_frac", "streams smooth at 128 at once"),
                           (axes[1], "x_real_time", "x real time at 128 at once")):
        ys = [lv[key] * (100 if key == "smooth_playback_frac" else 1) for _, lv, _ in bars]
        ax.barh(range(len(bars)), ys, color=[c for *_, c in bars])
        ax.set_yticks(range(len(bars)), [n for n, *_ in bars], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(label + (" (%)" if key == "smooth_playback_frac" else ""))
        if key == "smooth_playback_frac":
            ax.set_xlim(50, 101)
        else:
            ax.set_xlim(500, 620)
    save_panels(fig, axes, "fifty-sixth session (H200): 128 streams at once, run by run", "results_fifty_sixth.png")
