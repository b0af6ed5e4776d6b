"""results.md: the sixty-fifth session's section, and results_sixty_fifth.png."""

import statistics

from bench_served import share
from summary.plots import pyplot, save_panels
from summary.raw import load
from summary.session58 import crowd_stats, dry_late_ms, level_cells, raw_name, smooth_cells, span
from summary.session61 import delivery_ms

S = "sixtyfifth"
# key -> what ran, a short name, its colour in the plot
CODES = {
    "chan": ("`decoder.audio_channel=true` (the new default): chunks and ends over the caller's audio channel",
             "audio channel", "tab:blue"),
    "resp": ("`decoder.audio_channel=false`: every chunk a response, as before this session", "responses",
             "tab:orange"),
}
# (call, server's place in its call, code key); raw names {code}_call{call}_server{place}
RUNS = [(1, 1, "chan"), (1, 2, "resp"), (2, 1, "resp"), (2, 2, "chan"), (3, 1, "chan"), (3, 2, "resp"),
        (3, 3, "chan")]


def sixty_fifth_session(res) -> list[str]:
    """2026-12-04 (issue 17): the decoder's audio over a socket of the caller's process (`audio_channel`)
    against every chunk a response, served. Sets res["sixty_fifth"], returns the markdown, draws
    results_sixty_fifth.png."""
    levels = {r: load(f"served_{raw_name(*r)}_{S}.json")["levels"] for r in RUNS}
    at = lambda r, c: [lv for lv in levels[r] if lv["concurrency"] == c]  # noqa: E731
    c128 = {k: [lv for r in RUNS if r[2] == k for lv in at(r, 128)] for k in CODES}
    stats = {k: crowd_stats(lvs) for k, lvs in c128.items()}
    firsts = {k: [at(r, 128)[0]["x_real_time"] for r in RUNS if r[2] == k] for k in CODES}
    first_smooth = {k: [at(r, 128)[0]["smooth_playback_frac"] for r in RUNS if r[2] == k] for k in CODES}
    deliveries = {k: [delivery_ms(lv) for r in RUNS if r[2] == k for lv in levels[r]] for k in CODES}
    # same call, both codes: each 64- and 128-stream level of the channel over the other code's of that call
    pairs = {c: [statistics.mean(lv["x_real_time"] for r in RUNS if r[0] == call and r[2] == k for lv in at(r, c))
                 for call in (1, 2, 3) if any(r[0] == call and at(r, c) for r in RUNS)
                 for k in ("chan", "resp")] for c in (64, 128)}
    ratios = {c: [v[i] / v[i + 1] for i in range(0, len(v), 2)] for c, v in pairs.items()}
    lone = {k: [at(r, 1)[0] for r in RUNS if r[2] == k and at(r, 1)] for k in CODES}
    before = res["sixty_fourth"]["pooled_c128_all_smooth_default"]
    pooled = [before[0] + stats["resp"]["all_smooth"], before[1] + stats["resp"]["levels"]]
    res["sixty_fifth"] = {
        "device": "NVIDIA H200",
        "requests_per_stream": 3,
        "runs": [{"call": c, "server": p, "code": CODES[k][0],
                  "levels": [{"streams": lv["concurrency"], "x_real_time": lv["x_real_time"],
                              "smooth": lv["smooth_playback_frac"], "ttfa_p50": lv["ttfa_ms"]["p50"],
                              "ttfa_p95": lv["ttfa_ms"]["p95"], "rtf_p50": lv["rtf"]["p50"],
                              "delivery_ms": delivery_ms(lv)} for lv in levels[(c, p, k)]]}
                 for c, p, k in RUNS],
        "c128": {CODES[k][1]: st | {"first_burst_x_real_time": firsts[k], "first_burst_smooth": first_smooth[k]}
                 for k, st in stats.items()},
        "channel_over_responses_same_call": {str(c): v for c, v in ratios.items()},
        "pooled_c128_all_smooth_responses": pooled,
        "c128_all_smooth_channel": [stats["chan"]["all_smooth"], stats["chan"]["levels"]],
    }
    pct = lambda xs: ", ".join(share(x) for x in xs)  # noqa: E731
    gain = lambda xs: ", ".join(f"{x:.3f}x" for x in xs)  # noqa: E731
    md = ["", "## Sixty-fifth session (2026-12-04, H200): the decoder's audio over a socket of the caller's process, "
          "not as responses: its deliveries 15-25x cheaper, 128 streams at once 1.005-1.028x in the same calls, as "
          "smooth or smoother in a small sample; kept, on by default",
          "", "The fifty-seventh session timed a delivery of the decoder's audio thread: about 1 ms, three quarters of "
          "it the response's `send`, a round trip through the server into the orchestrator's stub; at 128 streams a "
          "round of them took 95-146 ms, one after another, against a first chunk's 160 ms of audio. Sending from "
          "several threads (fifty-sixth session) and a cheaper send (fifty-seventh) did not help. This session takes "
          "the audio off that path (`serving/audio_channel.py`, decoder parameter `audio_channel`, default true):",
          "- The orchestrator's process listens on a Unix stream socket in the server's private run directory, beside "
          "its response-count socket (`bls_stream.Inbox`), and names it in each decoder call's parameters.",
          "- The decoder answers the call at once with an empty first response, then its audio thread queues each "
          "chunk and the end as frames for a thread of its own per caller process, which writes them in order and, "
          "after a call's end frame, sends the call's final response. The audio thread never waits on the server.",
          "- The orchestrator reads the frames on its event loop, the socket before any response count (a call's "
          "frames are written before its final response is sent), and ends the client's stream at the end frame.",
          "- A direct client of the decoder, or `audio_channel=false`, gets every chunk as a response, as before.",
          "", "Three device calls, each on an H200 machine of its own; the same code, servers one after another, the "
          "codes alternating: `SET=\"decoder.timestep_buckets=10,100 decoder.audio_channel=true|false\" "
          "ARRIVALS=burst LEVELS=1,8,64,128,128 REQUESTS=3 bash benchmarks/run_served_gpu.sh` in calls 1 and 2 "
          "(`chan resp`, then `resp chan`), `LEVELS=128,128,128` in call 3 (`chan resp chan`); the driver is "
          f"`raw/devrun_{S}.sh`. `raw/served_*_{S}.{{json.gz,log}}`, `raw/metrics_*_{S}.txt`. Delivery: the decoder's "
          "audio thread's deliveries in the level, ms each (with the channel, queueing the frames).", "",
          "| call / server | code | streams | x real time | smooth | TTFA p50 / p95 ms | dry | late ms | delivery ms |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in RUNS:
        for lv in levels[r]:
            md.append(f"| {r[0]} / {r[1]} | {CODES[r[2]][1]} | {level_cells(lv)} | {delivery_ms(lv):.2f} |")
    md += ["", "128 streams at once:", "",
           "| code | levels | every stream smooth | least smooth | x real time, median (range) | first bursts: x real "
           "time | first bursts: smooth | TTFA p50 range / worst p95 ms |", "|---|---|---|---|---|---|---|---|"]
    md += [f"| {CODES[k][1]} | {smooth_cells(st)} | {', '.join(f'{x:.1f}' for x in firsts[k])} | "
           f"{pct(first_smooth[k])} | {st['ttfa_p50_ms'][0]:.0f}-{st['ttfa_p50_ms'][1]:.0f} / "
           f"{st['ttfa_p95_ms_max']:.0f} |" for k, st in stats.items()]
    md += ["",
           f"- **Deliveries**: {span(deliveries['chan'], '{:.2f}')} ms each with the channel against "
           f"{span(deliveries['resp'], '{:.2f}')} ms as responses, at every level.",
           f"- **Throughput, same call**: the channel's levels over the other code's (means of a server's levels): "
           f"64 streams {gain(ratios[64])} (calls 1, 2), 128 streams {gain(ratios[128])} (calls 1-3). Medians over "
           f"all levels of 128: {stats['chan']['xrt_median']:.1f}x against {stats['resp']['xrt_median']:.1f}x; "
           f"first bursts {span(firsts['chan'], '{:.1f}')}x against {span(firsts['resp'], '{:.1f}')}x.",
           f"- **Smooth at 128 at once**: {stats['chan']['all_smooth']} of {stats['chan']['levels']} levels with the "
           f"channel, {stats['resp']['all_smooth']} of {stats['resp']['levels']} without. The channel's dry streams "
           f"({stats['chan']['first_wave_dry']} in first waves, {stats['chan']['later_waves_dry']} in later ones) ran "
           "dry by at most "
           f"{max(dry_late_ms(lv) for lv in c128['chan']):.1f} "
           "ms, at their second or third chunk in a later wave. With deliveries this cheap the audio thread cannot be "
           "what held them up for long; what did (when the engine made those chunks: the early chunk's margin, a step "
           "of 128 rows, the next wave's prefills) was not measured. A small sample either way: two of ten levels "
           "against two of seven not smooth.",
           f"- **One stream**: RTF {span([lv['rtf']['p50'] for lv in lone['chan']], '{:.4f}')} with the channel, "
           f"{span([lv['rtf']['p50'] for lv in lone['resp']], '{:.4f}')} without; TTFA p50 "
           f"{span([lv['ttfa_ms']['p50'] for lv in lone['chan']], '{:.1f}')} against "
           f"{span([lv['ttfa_ms']['p50'] for lv in lone['resp']], '{:.1f}')} ms (3 requests a server).",
           f"- Levels of 128 at once on the code before (responses) since the fifty-ninth session, this session's "
           f"included: {pooled[0]} of {pooled[1]} every stream smooth.",
           "- **Kept, on by default.** The channel carries what the responses carried, in the same order; "
           "`tests/test_bls_stream.py` checks the order against the counts, frames that keep a long call from the "
           "waiting-thread fallback, a caller gone, and the callee's checks of the socket's path; "
           "`tests/test_decode_audio.py` serves the same audio both ways.",
           "- **Changed after the measurement** (a review of a2fb5fc, the measured commit; not run on the GPU since: "
           "the 335 s of device time left do not start a server). A call's end could be counted in the same pass "
           "of the inbox as a channel read made just before its last frames came, and those frames were then "
           "dropped with the call ending well: the inbox now reads its channel again before it takes a final "
           "response, and the orchestrator fails a channel call that ends without its end frame. The decoder writes "
           "an `Opened` frame after the empty first response, and a call that has sent one is never handed to the "
           "waiting-thread fallback (a call queued in the decoder for over 30 s would have been). A channel that "
           "breaks (its caller gone, 60 s without progress, or 256 MiB queued for it) leaves the registry, so the "
           "caller's next calls connect again, and its calls end with an error that says their audio was lost "
           "instead of ending well without it. Each chunk is copied out of the decoded batch's pinned buffer as it "
           "is queued (15 us for 16 patches on this machine's CPU), so a slow caller holds its own bytes, not whole "
           "batches. While the server stops, the orchestrator reads a call to its final response (for at most 30 s) "
           "before it returns. A second review's fixes: a break shuts the channel's socket, so a send stuck on a "
           "caller that reads nothing fails at once and its calls end now; finalize waits for broken channels' "
           "final responses too. The measured code had none of these. Two of them add work to every request: an empty frame "
           "(queued by the decoder's `execute`) and a copy a chunk on the audio thread.", ""]
    _plot(levels)
    return md


def _plot(levels: dict):
    """Left: each server's x real time at each of its levels of 128 at once, by code. Right: each level's
    deliveries, ms each, by streams."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.3))
    for k, (_, name, colour) in CODES.items():
        runs = [r for r in RUNS if r[2] == k]
        for i, r in enumerate(runs):
            xs = [lv["x_real_time"] for lv in levels[r] if lv["concurrency"] == 128]
            a.plot(range(1, len(xs) + 1), xs, "o-", color=colour, label=None if i else name)
            b.scatter([lv["concurrency"] for lv in levels[r]], [delivery_ms(lv) for lv in levels[r]], color=colour,
                      s=30, label=None if i else name)
    a.set_xticks([1, 2, 3])
    a.set_xlabel("the server's burst of 128 streams (1: its first)")
    a.set_ylabel("aggregate x real time")
    a.legend(fontsize=7)
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xlabel("streams at once")
    b.set_ylabel("decoder's audio deliveries, ms each")
    b.legend(fontsize=7)
    save_panels(fig, [a, b], "sixty-fifth session (H200): the decoder's audio over the caller's socket against "
                "responses, 3 requests a stream", "results_sixty_fifth.png")
