"""results.md: the sixty-sixth session's section, and results_sixty_sixth.png."""

import os
import statistics

from bench_served import share
from served_timeline import dry_streams, load_timeline_tar, round_launch_ms, stream_path
from summary.plots import pyplot, save_panels
from summary.raw import HERE, load
from summary.session58 import crowd_stats, level_cells, raw_name, smooth_cells, span

S = "sixtysixth"
# key -> what ran, a short name, its colour in the plot
CODES = {
    "b0": ("4412af2, `audio_round_patches=0` (no bound: the code before this session)", "round unbounded",
           "tab:orange"),
    "b256": ("4412af2, `audio_round_patches=256`", "round bound 256", "tab:purple"),
    "tl": ("e70b860 (the code before this session's GIL change), with `VOXCPM_TIMELINE`", "before (timeline)",
           "tab:orange"),
    "new": ("53282da: no torch call per request row, with `VOXCPM_TIMELINE`", "no torch call per row", "tab:blue"),
    "old": ("e70b860's python_backend (before the change) through `VOXCPM_PYTHON_BACKEND`, with `VOXCPM_TIMELINE`",
            "before", "tab:orange"),
}
# (call, server's place in its call, code key); raw names {code}_call{call}_server{place}
RUNS = [(1, 1, "b0"), (1, 2, "b256"), (2, 1, "tl"), (2, 2, "tl"), (3, 1, "new"), (3, 2, "old")]
TIMELINES = [r for r in RUNS if r[0] > 1]
BEFORE = ("b0", "tl", "old")  # the code before the GIL change (b0: the bound off)
TRANSPORT_LATE_MS = 10.0  # a dry chunk that reached its client this much after the orchestrator sent it


def _timeline(run) -> list:
    return load_timeline_tar(os.path.join(HERE, "raw", f"timeline_{raw_name(*run)}_{S}.tar.gz"))


def _gil_costs() -> dict:
    """raw/gil_torch_calls_*.txt at the 5 ms switch interval: work -> (ms alone, ms beside one thread running Python)."""
    with open(os.path.join(HERE, "raw", f"gil_torch_calls_{S}.txt")) as f:
        lines = {line.split(":")[0]: line.split(": ", 1)[1] for line in f if line.startswith("switch interval 5.0")}
    cells = [dict((c.rsplit(" ", 1)[0], float(c.rsplit(" ", 1)[1])) for c in lines[f"switch interval 5.0 ms, {n} "
                                                                                 "threads running Python"].split("; "))
             for n in (0, 1)]
    return {k: (cells[0][k], cells[1][k]) for k in cells[0]}


def _pct(values, q) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def sixty_sixth_session(res) -> list[str]:
    """2026-12-04 (issue 17): a bound on the audio thread's rounds (measured, removed); the server's timeline
    against the clients at 128 streams at once; no torch call per request row in the decoder's per-step host
    work, against the code before in one call. Sets res["sixty_sixth"], returns the markdown, draws
    results_sixty_sixth.png."""
    levels = {r: load(f"served_{raw_name(*r)}_{S}.json")["levels"] for r in RUNS}
    gil = _gil_costs()
    at = lambda r, c: [lv for lv in levels[r] if lv["concurrency"] == c]  # noqa: E731
    events = {r: _timeline(r) for r in TIMELINES}
    launches = {r: [round_launch_ms(lv, events[r]) for lv in at(r, 128)] for r in TIMELINES}
    # each dry stream of the timelined levels: (run, level's place, ms dry, server-late or transport-late)
    dry = [(r, i, s["underrun_s"] * 1e3, p["client_lag_ms"][s["underrun_chunk"]]
            if len(p["client_lag_ms"]) > s["underrun_chunk"] else None) for r in TIMELINES for i, lv in enumerate(at(r, 128))
           for s in dry_streams(lv) for p in [stream_path(lv, events[r], s)]]
    before = [lv for r in RUNS if r[2] in BEFORE for lv in at(r, 128)]
    stats = {"before": crowd_stats(before), "new": crowd_stats(at(RUNS[4], 128)),
             "old_call3": crowd_stats(at(RUNS[5], 128)), "b256": crowd_stats(at(RUNS[1], 128)),
             "b0": crowd_stats(at(RUNS[0], 128))}
    same_call = [n["x_real_time"] / o["x_real_time"] for n, o in zip(at(RUNS[4], 128), at(RUNS[5], 128))]
    c64 = {k: at(r, 64)[0] for r in RUNS for k in [r[2]] if at(r, 64)}
    rounds = {raw_name(*r): {"p50": [statistics.median(x) for x in launches[r]],
                             "p90": [_pct(x, 0.9) for x in launches[r]], "p99": [_pct(x, 0.99) for x in launches[r]],
                             "max": [max(x) for x in launches[r]]} for r in TIMELINES}
    late = {"server": sum(lag is not None and lag <= TRANSPORT_LATE_MS for *_, lag in dry),
            "transport": sum(lag is not None and lag > TRANSPORT_LATE_MS for *_, lag in dry)}
    pooled = res["sixty_fifth"]["c128_all_smooth_channel"]
    res["sixty_sixth"] = {
        "device": "NVIDIA H200",
        "requests_per_stream": 3,
        "runs": [{"call": c, "server": p, "code": CODES[k][0],
                  "levels": [{"streams": lv["concurrency"], "x_real_time": lv["x_real_time"],
                              "smooth": lv["smooth_playback_frac"], "ttfa_p50": lv["ttfa_ms"]["p50"],
                              "ttfa_p95": lv["ttfa_ms"]["p95"], "rtf_p50": lv["rtf"]["p50"]} for lv in levels[(c, p, k)]]}
                 for c, p, k in RUNS],
        "c128": stats,
        "c128_new_over_before_same_call": same_call,
        "round_launch_ms_c128": rounds,
        "dry_c128_timelined": {"server_late": late["server"], "transport_late": late["transport"]},
        "c128_all_smooth_before_with_sixty_fifth": [pooled[0] + stats["before"]["all_smooth"],
                                                    pooled[1] + stats["before"]["levels"]],
    }
    gain = lambda xs: ", ".join(f"{x:.3f}x" for x in xs)  # noqa: E731
    ms = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
    md = ["", "## Sixty-sixth session (2026-12-04, H200): why streams ran dry at 128 at once: the decoder's threads "
          "waiting for the GIL after every torch call; no torch call per request row now, and every level of 128 at "
          "once smooth in the same call as the code before (1 of 3), 1.009-1.019x; a bound on the audio rounds "
          "measured and removed",
          "", "Three device calls on H200 machines (about 25 of 30 min). The driver is "
          f"`raw/devrun_{S}.sh`; every server ran `SET=\"decoder.timestep_buckets=10,100 ...\" ARRIVALS=burst "
          "REQUESTS=3 bash benchmarks/run_served_gpu.sh` with the levels below. `raw/served_*_"
          f"{S}.{{json.gz,log}}`, `raw/metrics_*_{S}.txt`, the timelines `raw/timeline_*_{S}.tar.gz`.",
          "", "**A bound on a round's patches** (call 1, `LEVELS=1,8,64,128,128`; the code is kept as "
          f"`raw/audio_round_patches_{S}.patch`). Last session's dry streams were in later waves, at their second or "
          "third chunk. A round of the decoder's audio thread decodes every chunk queued, and a chunk queued meanwhile "
          "waits for the whole round: the bound let a round take the newcomers' first chunks, then the clients with "
          "the least audio left, up to 256 patches, the rest going in the next round. It did not help: the bound's "
          "server played its two levels of 128 at "
          f"{share(at(RUNS[1], 128)[0]['smooth_playback_frac'])} and {share(at(RUNS[1], 128)[1]['smooth_playback_frac'])}"
          f" against {share(at(RUNS[0], 128)[0]['smooth_playback_frac'])} and "
          f"{share(at(RUNS[0], 128)[1]['smooth_playback_frac'])}, at {ms(lv['x_real_time'] for lv in at(RUNS[1], 128))}x "
          f"against {ms(lv['x_real_time'] for lv in at(RUNS[0], 128))}x, and 64 streams at "
          f"{c64['b256']['x_real_time']:.1f}x against {c64['b0']['x_real_time']:.1f}x. Removed.",
          "", "**The server's timeline** (calls 2 and 3; new: `VOXCPM_TIMELINE=<dir>` makes the server's processes "
          "record their events, `python_backend/voxcpm_triton/timeline.py`, and `benchmarks/served_timeline.py` lines "
          "them up with bench_served's clients on the machine's monotonic clock). Events: the decoder's `execute`, the "
          "engine's steps, prefills and deliveries, the audio thread's rounds (work taken, decodes launched, each "
          "batch decoded, done) and sends, each orchestrator's emits to its client. Call 2 ran the code before this "
          "session's change on two servers, `LEVELS=128,128,128`. What it showed, at the dry streams of its levels:",
          "- A dry stream's late chunk left the orchestrator too late to be played in time (the server's), or "
          f"reached the client over {TRANSPORT_LATE_MS:.0f} ms after it left (the transport's: Triton's gRPC stream "
          "and the Python "
          "client, 46-91 ms for some 4-patch chunks). Of the timelined levels' "
          f"{len(dry)} dry streams, {late['server']} were the server's and {late['transport']} the transport's.",
          "- The server's: in the window examined (call 2, server 2, its third level), two audio rounds took their "
          "work and launched their decodes 61 and 66 ms later, where that host work takes about a millisecond (the "
          "rounds' median below). In between, the decoder's `execute` admitted a burst of newcomers one after "
          "another (about 1.5 ms each) and the engine thread prefilled them.",
          "- The mechanism (`benchmarks/gil_torch_calls.py`, on the CPU of the machine this was written on, "
          "`raw/gil_torch_calls_sixtysixth.txt`): every torch call that dispatches an op lets go of the GIL, and "
          "taking it back waits for the interpreter's switch interval (5 ms) while another thread runs Python. "
          f"Handing out a step of 128 rows the old way took {gil['step rows, torch'][0]:.2f} ms alone and "
          f"{gil['step rows, torch'][1]:.0f} ms beside one such thread (numpy: {gil['step rows, numpy'][1]:.2f} ms); "
          f"30 requests' latents {gil['round latents, torch'][0]:.2f} and {gil['round latents, torch'][1]:.0f} ms "
          f"(numpy: {gil['round latents, numpy'][1]:.1f} ms). `.numpy()`, `.tolist()` and `torch.from_numpy` keep "
          "the GIL. (A 2-core machine; with a 0.5 ms switch interval one such thread cost nothing, two did.) "
          "The decoder's threads made a "
          "torch call per request row: the engine's delivery of a step (a `bool()` per row, a stack per chunk), the "
          "step's inputs (a block-table row each), the audio round's latents (five ops per request), and closing a "
          "VAE stream (one op per state pool, 26).",
          "", "**Kept: no torch call per request row** (53282da). The engine hands out a step's rows as numpy views "
          "and a list of stop flags (`engine._host_rows`) and makes each chunk with `np.stack`; the step runner "
          "fills the block tables in numpy; the audio thread puts a batch's latents together in numpy "
          "(`StreamAudio._batch_frames`); a VAE stream's rows are zeroed in one call through views made at start-up. "
          "`tests/test_torch_calls_per_row.py` counts the torch calls (they do not grow with the rows; the old step "
          "inputs and stream zeroing fail it). Call 3, `LEVELS=1,64,128,128,128`, this code first, then the code "
          "before through `VOXCPM_PYTHON_BACKEND`, both with the timeline:", "",
          "| call / server | code | streams | x real time | smooth | TTFA p50 / p95 ms | dry | late ms |",
          "|---|---|---|---|---|---|---|---|"]
    for r in RUNS:
        for lv in levels[r]:
            md.append(f"| {r[0]} / {r[1]} | {CODES[r[2]][1]} | {level_cells(lv)} |")
    md += ["", "128 streams at once (before: every level of the code before this session's change, calls 1-3):", "",
           "| code | levels | every stream smooth | least smooth | x real time, median (range) | TTFA p50 range / "
           "worst p95 ms |", "|---|---|---|---|---|---|"]
    for k, name in (("new", "no torch call per row (call 3)"), ("old_call3", "before (call 3)"),
                    ("before", "before (calls 1-3)")):
        st = stats[k]
        md.append(f"| {name} | {smooth_cells(st)} | {st['ttfa_p50_ms'][0]:.0f}-{st['ttfa_p50_ms'][1]:.0f} / "
                  f"{st['ttfa_p95_ms_max']:.0f} |")
    md += ["", "An audio round's host work, ms from taking its work to its decodes launched, by level of 128 at once "
           "(the timelines):", "", "| call / server | code | p50 | p90 | p99 | slowest |", "|---|---|---|---|---|---|"]
    for r in TIMELINES:
        x = rounds[raw_name(*r)]
        md.append(f"| {r[0]} / {r[1]} | {CODES[r[2]][1]} | {ms(x['p50'])} | {ms(x['p90'])} | {ms(x['p99'])} | "
                  f"{ms(x['max'])} |")
    md += ["",
           f"- **Same call**: 128 at once {gain(same_call)} the code before's levels, in order; every stream smooth in "
           f"{stats['new']['all_smooth']} of {stats['new']['levels']} levels against "
           f"{stats['old_call3']['all_smooth']} of {stats['old_call3']['levels']}; TTFA p50 "
           f"{span(stats['new']['ttfa_p50_ms'])} against {span(stats['old_call3']['ttfa_p50_ms'])} ms. 64 streams "
           f"{c64['new']['x_real_time']:.1f}x against {c64['old']['x_real_time']:.1f}x; one stream RTF "
           f"{at(RUNS[4], 1)[0]['rtf']['p50']:.4f} against {at(RUNS[5], 1)[0]['rtf']['p50']:.4f}. One server each; "
           "the new code ran first, on a cold machine.",
           "- **Rounds**: the slower rounds got faster (p90 "
           f"{span(rounds[raw_name(*RUNS[4])]['p90'], '{:.1f}')} against "
           f"{span(rounds[raw_name(*RUNS[5])]['p90'], '{:.1f}')} ms in call 3), but some still take 40-50 ms: a "
           "decode's own torch calls (about ten a batch) and `execute`'s wait on the GIL as well.",
           f"- **The code before**, this session: {stats['before']['all_smooth']} of {stats['before']['levels']} "
           "levels of 128 at once smooth; with the sixty-fifth session's levels of the same code, "
           f"{res['sixty_sixth']['c128_all_smooth_before_with_sixty_fifth'][0]} of "
           f"{res['sixty_sixth']['c128_all_smooth_before_with_sixty_fifth'][1]}. The new code: 3 of 3, a small sample.",
           "- Not measured: the change at 8 streams and with Poisson arrivals; `gpu_check.py` and the GPU tests on "
           "the changed code (the CPU suite holds the engine's batched output to the offline one and the served "
           "audio to the offline decode). The transport's late chunks (Triton's gRPC frontend and the Python client) "
           "are outside the decoder and unchanged.", ""]
    _plot(levels, launches)
    return md


def _plot(levels: dict, launches: dict):
    """Left: each server's x real time at its levels of 128 at once. Right: the distribution of the audio
    rounds' host work at 128, by server."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.3))
    seen = set()
    for r in RUNS:
        xs = [lv["x_real_time"] for lv in levels[r] if lv["concurrency"] == 128]
        name, colour = CODES[r[2]][1], CODES[r[2]][2]
        a.plot(range(1, len(xs) + 1), xs, "o-" if r[2] == "new" else "s--", color=colour,
               label=f"{name} (call {r[0]})" if (name, r[0]) not in seen else None)
        seen.add((name, r[0]))
    for r in TIMELINES:
        xs = sorted(x for lv in launches[r] for x in lv)
        b.plot(xs, [1 - i / len(xs) for i in range(len(xs))], color=CODES[r[2]][2],
               ls="-" if r[2] == "new" else "--", label=f"{CODES[r[2]][1]} (call {r[0]} / {r[1]})")
    a.set_xticks([1, 2, 3])
    a.set_xlabel("the server's burst of 128 streams (1: its first)")
    a.set_ylabel("aggregate x real time")
    a.legend(fontsize=7)
    b.set_xscale("log")
    b.set_yscale("log")
    b.set_xlabel("audio round: work taken to decodes launched, ms")
    b.set_ylabel("share of rounds taking longer")
    b.legend(fontsize=7)
    save_panels(fig, [a, b], "sixty-sixth session (H200): 128 streams at once, and the audio rounds' host work",
                "results_sixty_sixth.png")
