"""results.md: the fifty-seventh session's section, and results_fifty_seventh.png."""

import gzip
import os
import re

from bench_served import share
from summary.plots import pyplot, save_panels
from summary.raw import HERE, load, metric_value
from summary.session56 import _dry, _dry_streams, _who

S = "fiftyseventh"
# key -> (call, server's place in its call, what it ran, raw name); every run 3 requests a stream
RUNS = {
    "lookahead": (1, 1, "playback margin one step ahead (6507b00, reverted)", "lookahead_call1_server1"),
    "before": (1, 2, "final code (e03549c)", "before_call1_server2"),
    "timed": (2, 1, "final code, its sends timed", "base_call2_server1"),
    "fast": (2, 2, "final code, no cancel check before a send, switch interval 0.5 ms, its sends timed",
             "fastsend_call2_server2"),
}
PARTS = ("lock", "cancel", "build", "send")  # the sink's parts of a delivery, as the patch times them
PATCH = f"fastsend_{S}.patch"


def _send_parts(raw: str) -> dict:
    """The sink's mean ms a delivery, by part, over the whole run (the server log's last EXPDIAG line)."""
    with gzip.open(os.path.join(HERE, "raw", f"served_{raw}_{S}_tritonserver.log.gz"), "rt") as f:
        line = [ln for ln in f if "EXPDIAG" in ln][-1]
    parts = {k: float(re.search(rf"{k} ([0-9.]+)", line).group(1)) for k in PARTS}
    return parts | {"deliveries": int(re.search(r"n=(\d+)", line).group(1))}


def _delivery(lv: dict) -> tuple[float, float]:
    """A level's mean ms a delivery of the audio thread, and the share of its wall time in them."""
    d = lv["decoder_steps"]
    return 1000 * d["audio_send_s"] / d["audio_sends"], d["audio_send_s"] / lv["wall_s"]


def fifty_seventh_session(res) -> list[str]:
    """2026-12-02 (issue 17): 128 streams at once with 3 requests a stream: the playback margin one step
    ahead (reverted), and where the audio thread's deliveries go (their send, measured; a cheaper send
    tried, not kept). Sets res["fifty_seventh"], returns the markdown, draws results_fifty_seventh.png."""
    levels = {k: load(f"served_{raw}_{S}.json")["levels"] for k, (*_, raw) in RUNS.items()}
    early = {k: metric_value(f"metrics_{raw}_{S}.txt", "voxcpm_early_chunks_total") for k, (*_, raw) in RUNS.items()}
    parts = {k: _send_parts(RUNS[k][3]) for k in ("timed", "fast")}
    at = lambda k, c: [lv for lv in levels[k] if lv["concurrency"] == c]  # noqa: E731
    final128 = [lv for k in ("before", "timed") for lv in at(k, 128)]

    res["fifty_seventh"] = {
        "device": "NVIDIA H200",
        "requests_per_stream": 3,
        "runs": {k: {"call": call, "server": place, "code": what, "early_chunks": early[k],
                     "levels": [{"streams": lv["concurrency"], "x_real_time": lv["x_real_time"],
                                 "smooth": lv["smooth_playback_frac"], "ttfa_p50": lv["ttfa_ms"]["p50"],
                                 "ttfa_p95": lv["ttfa_ms"]["p95"], "dry": _dry(lv),
                                 "delivery_ms": _delivery(lv)[0], "delivery_wall_share": _delivery(lv)[1]}
                                for lv in levels[k]]}
                 for k, (call, place, what, _) in RUNS.items()},
        "send_parts_ms": parts,
        "final_code_c128_smooth": [lv["smooth_playback_frac"] for lv in final128],
    }

    md = ["", "## Fifty-seventh session (2026-12-02, H200): the playback margin one step ahead, measured and reverted; "
          "where the audio thread's time goes at 128 streams: its sends, a round trip to the server each (about three "
          "quarters of a delivery's time); the cancel check dropped and a shorter switch interval did not make them cheaper",
          "", "Two device calls on one H200 (about 24 of 30 min, some 6 of them on four calls that got no machine). The fifty-sixth session "
          "named the next run: 128 at once with 3 requests a stream, the early second chunk sent sooner, with the new "
          "counters of the audio thread's deliveries read.", "",
          "Each server: `ARRIVALS=burst LEVELS=64,128,128 REQUESTS=3 bash benchmarks/run_served_gpu.sh`, "
          "`timestep_buckets` 10,100; the other code through `MODEL_REPOSITORY` and `VOXCPM_PYTHON_BACKEND` (its "
          "`model_repository` and `python_backend` from `git archive`; a copy whose compiled code is unchanged finds "
          f"the compile caches, ready in 60-66 s). `raw/served_*_{S}.{{json.gz,log}}`, `raw/metrics_*_{S}.txt`. "
          "Dry as in the fifty-sixth session: streams that ran out of audio at all, by wave and chunk (1-based). "
          "Deliveries: the audio thread's (`voxcpm_decoder_audio_sends_total` and `..._send_seconds_total`, per "
          "level), their mean time and their share of the level's wall time.", "",
          "| call / server | code | streams | x real time | smooth | TTFA p50 / p95 ms | dry | early chunks (run) | "
          "ms a delivery | deliveries' share of the wall time |", "|---|---|---|---|---|---|---|---|---|---|"]
    for k, (call, place, what, _) in RUNS.items():
        for lv in levels[k]:
            ms, frac = _delivery(lv)
            md.append(f"| {call} / {place} | {what} | {lv['concurrency']} | {lv['x_real_time']:.1f} | "
                      f"{share(lv['smooth_playback_frac'])} | {lv['ttfa_ms']['p50']:.0f} / {lv['ttfa_ms']['p95']:.0f} | "
                      f"{_dry(lv)} | {early[k]:.0f} | {ms:.2f} | {share(frac)} |")
    dry_la = [d for lv in at("lookahead", 128) if (d := _dry_streams(lv))]
    rest = {k: sum(_delivery(lv)[0] * lv["decoder_steps"]["audio_sends"] for lv in levels[k])
            / sum(lv["decoder_steps"]["audio_sends"] for lv in levels[k]) for k in parts}
    md += ["",
           "- **The playback margin one step ahead** (6507b00, reverted by 2c62b3a). The engine decides once a step "
           "whether a chunk goes early, when its client has under `playback_margin_ms` (100) left; the change asked "
           "instead whether it would have under the margin by its next patch, a step (as long as the request's last) "
           "away, so that the early second chunk of a burst's newcomers left a step sooner (about 33 ms at 128 "
           "streams). First on a fresh machine, it played 128 at once at "
           + " and ".join(share(lv["smooth_playback_frac"]) for lv in at("lookahead", 128))
           + " against the code before's " + " and ".join(share(lv["smooth_playback_frac"]) for lv in at("before", 128))
           + f", with {early['lookahead'] / early['before'] - 1:.0%} more early chunks ({early['lookahead']:.0f} "
           f"against {early['before']:.0f}); its dry streams were first-wave ones, most at their third chunk ("
           + "; ".join(f"late by up to {max(d)[0]:.1f} ms, {_who(d)}" for d in dry_la) + "). Sent sooner, the second "
           "chunk left the third with less audio ahead of it, and more one-patch chunks made more deliveries. One "
           "run each, the servers' order mixed in; it gave no sign of helping, and was reverted.",
           "- **Where a delivery's time goes** (call 2, both servers with the patch "
           f"`raw/{PATCH}`, which times the decoder's audio sink: waiting for the stub's lock, the `is_cancelled` "
           "check, building the response, `send`; means over the whole run, warm-ups included): "
           + "; ".join(f"{RUNS[k][2].removeprefix('final code, ').removesuffix(', its sends timed')}: " + ", ".join(
               f"{p} {parts[k][p]:.3f}" for p in PARTS) + f" ms, of {rest[k]:.2f} ms a delivery over the levels"
               for k in parts)
           + ". The send, a round trip to the server (python_backend's stub lets go of the GIL, writes the response to "
           "shared memory and waits for the server's thread to take it), is most of it; the rest is the audio "
           "thread's own Python around the sink. At 128 streams the audio thread spends "
           + ", ".join(share(_delivery(lv)[1]) for lv in at("timed", 128)) + " of the wall time in deliveries, "
           f"about {at('timed', 128)[0]['decoder_steps']['audio_sends'] / 384:.0f} a request: a round's 128 take "
           f"{128 * _delivery(at('timed', 128)[0])[0]:.0f} ms, nearly a first chunk's 160 ms of audio; so a "
           "newcomer's second chunk that misses the rush waits behind a round.",
           "- **A cheaper send, tried** (the same patch's switches, on the second server): no `is_cancelled` round trip "
           "before a send (the engine thread asks it at every chunk after the first anyway), and the interpreter's "
           "switch interval 0.5 ms instead of 5, so that the audio thread, back from its waits, takes the GIL from the "
           f"engine thread sooner. The send itself got slower ({parts['fast']['send']:.2f} against "
           f"{parts['timed']['send']:.2f} ms) and a delivery no cheaper; 128 at once played "
           + " and ".join(f"{share(lv['smooth_playback_frac'])} / {lv['x_real_time']:.1f}x" for lv in at("fast", 128))
           + " against " + " and ".join(f"{share(lv['smooth_playback_frac'])} / {lv['x_real_time']:.1f}x"
                                        for lv in at("timed", 128))
           + " (smooth / throughput). Not kept; the two changes ran together, so which of them slowed the send was not "
           "separated. What is left of a send is python_backend's round trip (the stub's copy into shared memory, the "
           "server's thread), which the model's code does not reach; with the fifty-sixth session's senders side by side (no faster either), "
           "the audio thread's deliveries stay as they are.", "",
           "**Against issue 17's targets**: unchanged (the serving code is the fifty-sixth session's). The final code "
           "at 128 at once with 3 requests a stream in this session: " + ", ".join(
               share(lv["smooth_playback_frac"]) for lv in final128) + " smooth, at "
           + ", ".join(f"{lv['x_real_time']:.1f}x" for lv in final128) + "; every stream smooth in "
           f"{sum(lv['smooth_playback_frac'] == 1 for lv in final128)} of {len(final128)} runs. Capacity at once stays "
           "missed (not met reliably); 64 at once played every stream smoothly in all four runs ("
           + ", ".join(f"{lv['x_real_time']:.1f}x" for k in RUNS for lv in at(k, 64)) + "). results.json's headline "
           "keys stay the fifty-fifth session's.", "",
           "![fifty-seventh session: 128 streams at once per run, and a delivery's parts](results_fifty_seventh.png)",
           ""]
    _plot(levels, at, parts, rest)
    return md


def _plot(levels: dict, at, parts: dict, rest: dict):
    """Left: the share of streams smooth at 128 at once, each run; right: a delivery's mean ms by part."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    colors = {"lookahead": "tab:red", "before": "tab:green", "timed": "tab:blue", "fast": "tab:orange"}
    short = {"lookahead": "margin a step ahead", "before": "final code", "timed": "final code, timed",
             "fast": "no cancel check, switch 0.5 ms"}
    bars = [(f"c{call}/s{place} {short[k]}" + (f" #{i + 1}" if i else ""), lv, colors[k])
            for k, (call, place, _, _) in RUNS.items() for i, lv in enumerate(at(k, 128))]
    ax = axes[0]
    ax.barh(range(len(bars)), [100 * lv["smooth_playback_frac"] for _, lv, _ in bars], color=[c for *_, c in bars])
    ax.set_yticks(range(len(bars)), [n for n, *_ in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(80, 101)
    ax.set_xlabel("streams smooth at 128 at once, 3 requests a stream (%)")
    ax = axes[1]
    names = {"timed": "final code", "fast": "no cancel check,\nswitch 0.5 ms"}
    for i, k in enumerate(parts):
        left = 0.0
        for p, c in zip(PARTS + ("rest",), ("tab:gray", "tab:purple", "tab:olive", "tab:blue", "tab:cyan")):
            w = parts[k][p] if p != "rest" else rest[k] - sum(parts[k][q] for q in PARTS)
            ax.barh(i, w, left=left, color=c, label=p if i == 0 else None)
            left += w
    ax.set_yticks(range(len(parts)), [names[k] for k in parts], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms a delivery (rest: the audio thread's Python around the sink)")
    ax.legend(fontsize=7)
    save_panels(fig, axes, "fifty-seventh session (H200): 128 streams at once, and a delivery's parts",
                "results_fifty_seventh.png")
