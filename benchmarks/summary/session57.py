"""results.md: the fifty-seventh session's section, and results_fifty_seventh.png."""

import gzip
import os
import re

from bench_served import share
from summary.plots import pyplot, save_panels
from summary.raw import HERE, load, metric_value, served_row
from summary.session55 import wave_gaps
from summary.session56 import dry_counts, dry_streams, dry_who

S = "fiftyseventh"
# key -> (call, server's place in its call, what it ran, a short name for it, raw name); 3 requests a stream
RUNS = {
    "lookahead": (1, 1, "playback margin one step ahead (6507b00, reverted)", "margin a step ahead",
                  "lookahead_call1_server1"),
    "before": (1, 2, "final code (e03549c)", "final code", "before_call1_server2"),
    "timed": (2, 1, "final code, its sends timed (the patch)", "final code, timed", "base_call2_server1"),
    "fast": (2, 2, "final code, its sends timed, no cancel check before a send, switch interval 0.5 ms (the "
             "patch's switches)", "no cancel check, switch 0.5 ms", "fastsend_call2_server2"),
}
PARTS = ("lock", "cancel", "build", "send")  # the sink's parts of a delivery, as the patch times them
PATCH = f"fastsend_{S}.patch"


def _send_parts(raw: str) -> dict:
    """The sink's mean ms a delivery, by part, over the run's first deliveries, warm-ups included (the
    server log's last EXPDIAG line: the patch logs every 1000 deliveries)."""
    with gzip.open(os.path.join(HERE, "raw", f"served_{raw}_{S}_tritonserver.log.gz"), "rt") as f:
        line = [ln for ln in f if "EXPDIAG" in ln][-1]
    parts = {k: float(re.search(rf"{k} ([0-9.]+)", line).group(1)) for k in PARTS}
    return parts | {"deliveries_averaged": int(re.search(r"n=(\d+)", line).group(1))}


def _delivery_ms(levels: list) -> float:
    """The mean ms a delivery of the audio thread over levels of a run."""
    steps = [lv["decoder_steps"] for lv in levels]
    return 1000 * sum(d["audio_send_s"] for d in steps) / sum(d["audio_sends"] for d in steps)


def _delivery(lv: dict) -> tuple[float, float]:
    """A level's mean ms a delivery of the audio thread, and the share of its wall time in them."""
    return _delivery_ms([lv]), lv["decoder_steps"]["audio_send_s"] / lv["wall_s"]


def fifty_seventh_session(res) -> list[str]:
    """2026-12-02 (issue 17): 128 streams at once with 3 requests a stream: the playback margin one step
    ahead (reverted), and where the audio thread's deliveries go (their send, measured; a cheaper send
    tried, not kept). Sets res["fifty_seventh"], returns the markdown, draws results_fifty_seventh.png."""
    levels = {k: load(f"served_{raw}_{S}.json")["levels"] for k, (*_, raw) in RUNS.items()}
    early = {k: metric_value(f"metrics_{raw}_{S}.txt", "voxcpm_early_chunks_total") for k, (*_, raw) in RUNS.items()}
    parts = {k: _send_parts(RUNS[k][4]) for k in ("timed", "fast")}
    per_delivery = {k: _delivery_ms(levels[k]) for k in parts}
    at = lambda k, c: [lv for lv in levels[k] if lv["concurrency"] == c]  # noqa: E731
    final128 = [lv for k in ("before", "timed") for lv in at(k, 128)]

    res["fifty_seventh"] = {
        "device": "NVIDIA H200",
        "requests_per_stream": 3,
        "runs": {k: {"call": call, "server": place, "code": what, "early_chunks": early[k],
                     "levels": [served_row(lv) | {"streams": lv["concurrency"], "dry": dry_counts(lv)}
                                | dict(zip(("delivery_ms", "delivery_wall_share"), _delivery(lv))) for lv in levels[k]]}
                 for k, (call, place, what, *_) in RUNS.items()},
        "send_parts_ms": parts,
        "delivery_ms_over_levels": per_delivery,
        "final_code_c128_smooth": [lv["smooth_playback_frac"] for lv in final128],
    }

    md = ["", "## Fifty-seventh session (2026-12-02, H200): the playback margin one step ahead, measured and reverted; "
          "where the audio thread's time goes at 128 streams: its sends, a round trip to the server each (about three "
          "quarters of a delivery's time); without the cancel check and with a shorter switch interval they got dearer",
          "", "Two device calls ran on one H200 (about 18 min); four more got no machine (about 6 min). The fifty-sixth "
          "session named the next run: 128 at once with 3 requests a stream, `decoder.playback_margin_ms=150` beside "
          "the default, reading the new counters of the audio thread's deliveries. The same burst ran with the early "
          "chunk decided one step ahead instead (below); the 150 ms run is still to make.", "",
          "Each server: `ARRIVALS=burst LEVELS=64,128,128 REQUESTS=3 bash benchmarks/run_served_gpu.sh`, "
          "`timestep_buckets` 10,100; the other code through `MODEL_REPOSITORY` and `VOXCPM_PYTHON_BACKEND` (its "
          "`model_repository` and `python_backend` from `git archive`; a copy whose compiled code is unchanged finds "
          f"the compile caches, ready in 60-66 s). `raw/served_*_{S}.{{json.gz,log}}`, `raw/metrics_*_{S}.txt`. "
          "Dry as in the fifty-sixth session: streams that ran out of audio at all, by wave and chunk (1-based). "
          "Deliveries: the audio thread's (`voxcpm_decoder_audio_sends_total` and `..._send_seconds_total`, per "
          "level), their mean time and their share of the level's wall time.", "",
          "| call / server | code | streams | x real time | smooth | TTFA p50 / p95 ms | dry | early chunks (run) | "
          "ms a delivery | deliveries' share of the wall time |", "|---|---|---|---|---|---|---|---|---|---|"]
    for k, (call, place, what, *_) in RUNS.items():
        for lv in levels[k]:
            ms, frac = _delivery(lv)
            md.append(f"| {call} / {place} | {what} | {lv['concurrency']} | {lv['x_real_time']:.1f} | "
                      f"{share(lv['smooth_playback_frac'])} | {lv['ttfa_ms']['p50']:.0f} / {lv['ttfa_ms']['p95']:.0f} | "
                      f"{dry_counts(lv)} | {early[k]:.0f} | {ms:.2f} | {share(frac)} |")
    late = {k: [max(d)[0] for lv in at(k, 128) if (d := dry_streams(lv))] for k in ("lookahead", "before")}
    gaps = {k: [wave_gaps(lv, 0) for lv in at(k, 128)] for k in ("lookahead", "before")}
    gap = lambda k, g: " and ".join(f"{w[g]['p50']:.0f}" for w in gaps[k])  # noqa: E731
    timed128 = at("timed", 128)
    per_request = timed128[0]["decoder_steps"]["audio_sends"] / len(timed128[0]["streams"])
    md += ["",
           "- **The playback margin one step ahead** (6507b00, reverted by 2c62b3a). The engine decides once a step "
           "whether a chunk goes early, when its client has under `playback_margin_ms` (100) left; the change asked "
           "instead whether it would have under the margin by its next patch, a step (as long as the request's last) "
           "away, so that the early second chunk of a burst's newcomers would leave a step sooner (about 32 ms at 128 "
           "streams). First on a fresh machine, it played 128 at once at "
           + " and ".join(share(lv["smooth_playback_frac"]) for lv in at("lookahead", 128))
           + " against the code before's " + " and ".join(share(lv["smooth_playback_frac"]) for lv in at("before", 128))
           + f", with {early['lookahead'] / early['before'] - 1:.0%} more early chunks ({early['lookahead']:.0f} "
           f"against {early['before']:.0f}). Its dry streams were first-wave ones, most at their third chunk ("
           + "; ".join(dry_who(d) for lv in at("lookahead", 128) if (d := dry_streams(lv))) + "), late by up to "
           + " and ".join(f"{x:.1f}" for x in late["lookahead"]) + " ms, against the code before's "
           + " and ".join(f"{x:.1f}" for x in late["before"]) + " ms. The first wave's second chunks did not reach "
           f"their clients sooner (1st -> 2nd chunk gap p50 {gap('lookahead', 'g12')} ms against {gap('before', 'g12')}), "
           f"and their third chunks came later (2nd -> 3rd p50 {gap('lookahead', 'g23')} against "
           f"{gap('before', 'g23')} ms). One run each, the servers' order mixed in; it gave no sign of helping, and was "
           "reverted.",
           "- **Where a delivery's time goes** (call 2, both servers with the patch "
           f"`raw/{PATCH}`, which times the decoder's audio sink: waiting for the stub's lock, the `is_cancelled` "
           "check, building the response, `send`; means over each run's first "
           f"{parts['timed']['deliveries_averaged']} deliveries, warm-ups included, as the patch logs them): "
           + "; ".join(f"{RUNS[k][3]}: " + ", ".join(f"{p} {parts[k][p]:.3f}" for p in PARTS)
                       + f" ms, against {per_delivery[k]:.2f} ms a delivery over the levels (the counters)" for k in parts)
           + ". The send is most of it: python_backend's stub lets go of the GIL, writes the response to shared memory, "
           "waits for the server's thread to take it, then takes the GIL back (from the engine thread, when that "
           "holds it). What is left, roughly, is the audio thread's own Python around the sink (two averages over "
           "different deliveries: approximate). At 128 streams the audio thread spent "
           + " and ".join(share(_delivery(lv)[1]) for lv in timed128) + " of the wall time in deliveries, about "
           f"{per_request:.0f} a request: a round's 128 took "
           + "-".join(f"{128 * _delivery(lv)[0]:.0f}" for lv in sorted(timed128, key=lambda lv: _delivery(lv)[0]))
           + " ms, against a first chunk's 160 ms of audio; so a newcomer's second chunk that misses the rush can "
           "wait behind most of a round.",
           "- **A cheaper send, tried** (the same patch's switches, on the second server): no `is_cancelled` round trip "
           "before a send (the engine thread asks it at every chunk after the first anyway), and the interpreter's "
           "switch interval 0.5 ms instead of 5, so that the audio thread, back from its waits, would take the GIL "
           f"from the engine thread sooner. The send got slower ({parts['fast']['send']:.2f} against "
           f"{parts['timed']['send']:.2f} ms) and a delivery dearer ({per_delivery['fast']:.2f} against "
           f"{per_delivery['timed']:.2f} ms over the levels); 128 at once played "
           + " and ".join(f"{share(lv['smooth_playback_frac'])} / {lv['x_real_time']:.1f}x" for lv in at("fast", 128))
           + " against " + " and ".join(f"{share(lv['smooth_playback_frac'])} / {lv['x_real_time']:.1f}x"
                                        for lv in timed128)
           + " (smooth / throughput): less throughput in both runs. Not kept; the two changes ran together, so which "
           "of them slowed the send was not separated. With the fifty-sixth session's senders side by side (no faster "
           "either), these are the levers on the model's side of a send that were measured; none made it cheaper.", "",
           "**Against issue 17's targets**: unchanged (the serving code is the fifty-sixth session's). The final code "
           "at 128 at once with 3 requests a stream in this session (two of the four runs with the timing patch): "
           + ", ".join(share(lv["smooth_playback_frac"]) for lv in final128) + " smooth, at "
           + ", ".join(f"{lv['x_real_time']:.1f}x" for lv in final128) + "; every stream smooth in "
           f"{sum(lv['smooth_playback_frac'] == 1 for lv in final128)} of {len(final128)} runs. Capacity at once stays "
           "missed (not met reliably). 64 at once played every stream smoothly on all four servers, two of them other "
           "code (" + ", ".join(f"{lv['x_real_time']:.1f}x" for k in RUNS for lv in at(k, 64)) + "). results.json's "
           "headline keys stay the fifty-fifth session's.", "",
           "![fifty-seventh session: 128 streams at once per run, and a delivery's parts](results_fifty_seventh.png)",
           ""]
    _plot(at, parts, per_delivery)
    return md


def _plot(at, parts: dict, per_delivery: dict):
    """Left: the share of streams smooth at 128 at once, each run; right: a delivery's mean ms by part."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    colors = {"lookahead": "tab:red", "before": "tab:green", "timed": "tab:blue", "fast": "tab:orange"}
    bars = [(f"c{call}/s{place} {short}" + (f" #{i + 1}" if i else ""), lv, colors[k])
            for k, (call, place, _, short, _) in RUNS.items() for i, lv in enumerate(at(k, 128))]
    ax = axes[0]
    ax.barh(range(len(bars)), [100 * lv["smooth_playback_frac"] for _, lv, _ in bars], color=[c for *_, c in bars])
    ax.set_yticks(range(len(bars)), [n for n, *_ in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(80, 101)
    ax.set_xlabel("streams smooth at 128 at once, 3 requests a stream (%)")
    ax = axes[1]
    for i, k in enumerate(parts):
        left = 0.0
        for p, c in zip(PARTS + ("rest",), ("tab:gray", "tab:purple", "tab:olive", "tab:blue", "tab:cyan")):
            w = parts[k][p] if p != "rest" else per_delivery[k] - sum(parts[k][q] for q in PARTS)
            ax.barh(i, w, left=left, color=c, label=p if i == 0 else None)
            left += w
    ax.set_yticks(range(len(parts)), [RUNS[k][3].replace(", s", ",\ns") for k in parts], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms a delivery (rest, approximate: Python around the sink)")
    ax.legend(fontsize=7)
    save_panels(fig, axes, "fifty-seventh session (H200): 128 streams at once, and a delivery's parts",
                "results_fifty_seventh.png")
