"""results.md: the sixty-ninth session's section, and results_sixty_ninth.png."""

from bench_served import share
from summary.plots import pyplot, save_panels
from summary.raw import gpu_correctness, gpu_test_summaries, load, served_row
from summary.session58 import first_audio_stats, level_cells, smooth_cells

S = "sixtyninth"
# call 4: (server's place in the call, code); raw name served_ab_s{place}_{code}
AB_RUNS = [(1, "old"), (2, "new"), (3, "old"), (4, "new")]
CODE = {"old": "847c88a (before this session)", "new": "this session's final code"}


def sixty_ninth_session(res) -> list[str]:
    """2026-12-04 (issue 17): the GPU tests and gpu_check on this session's final code; its served path at 1-128
    streams with the engine alone in the same call; 128 at once again, then the code before this session against
    it in alternation. Sets res["sixty_ninth"], returns the markdown, draws results_sixty_ninth.png."""
    tests = gpu_test_summaries(f"gpu_tests_summary_{S}.txt")
    gpu_keys, gpu_md = gpu_correctness(S, tests, load(f"gpu_check_{S}.json"))
    final = {lv["concurrency"]: lv for lv in load(f"served_final_{S}.json")["levels"]}
    engine = load(f"offline_b64_b1_{S}.json")["engine"]["graphs"]["runs"]
    e64 = [r["aggregate_xrt"] for r in engine if r["batch"] == 64]
    e1 = next(r for r in engine if r["batch"] == 1)
    ratio = final[64]["x_real_time"] / max(e64)
    again = load(f"served_c128_{S}.json")["levels"]
    ab = {run: load(f"served_ab_s{run[0]}_{run[1]}_{S}.json")["levels"] for run in AB_RUNS}
    by_code = {c: [lv for run, lvs in ab.items() if run[1] == c for lv in lvs] for c in CODE}
    stats = {c: first_audio_stats(lvs) for c, lvs in by_code.items()}
    new128 = [final[128]] + [lv for lv in again if lv["concurrency"] == 128] + by_code["new"]
    res["sixty_ninth"] = {
        "device": "NVIDIA H200",
        **gpu_keys,
        "final": {n: served_row(lv) for n, lv in final.items()},
        "engine": {"xrt_b64": e64, "rtf_b1": e1["rtf"], "steps_per_s_b1": e1["steps_per_s"]},
        "served_over_engine_c64": ratio,
        "c128_again": [served_row(lv) for lv in again],
        "ab_c128": {f"{place} {code}": [served_row(lv) for lv in ab[(place, code)]] for place, code in AB_RUNS},
        "final_c128_levels_all_smooth": [sum(lv["smooth_playback_frac"] == 1 for lv in new128), len(new128)],
    }
    ok, n128 = res["sixty_ninth"]["final_c128_levels_all_smooth"]
    md = ["", "## Sixty-ninth session (2026-12-04, H200): the final code's GPU tests and `gpu_check.py` pass; "
          f"served at 1-128 streams, 64 at {final[64]['x_real_time']:.1f}x; 128 at once against the code before "
          "this session, alternating: no difference shown, both slower as the call went on",
          "", "Four device calls on one H200 machine (about 26 of 30 min; the first start was refused once), all on "
          "840ce37, whose serving changes are all off the GPU: an idle audio-channel writer ends when its caller "
          "closed the channel, StreamAudio's late ends, LoRA adds refused before reading the files and withdrawn when "
          "they time out (the gateway's fixes do not run on the device). The review's changes after it (the idle "
          "check by poll, the audio thread's end flag set however it ends) ran on the CPU only. \"The final code\" "
          f"below is 840ce37. The driver is `raw/devrun_{S}.sh`.",
          *gpu_md,
           "", "**Served, all at once** (call 2: `SET=\"decoder.timestep_buckets=10,100\" ARRIVALS=burst "
           "LEVELS=1,8,64,128 REQUESTS=2 bash benchmarks/run_served_gpu.sh`, then the engine alone, `bench.py "
           "--checkpoint /tmp/full --timestep-buckets 10,100 --reference none --no-vae --graphs-only --no-profile "
           f"--batches 64,64,1`; `raw/served_final_{S}.{{json.gz,log}}`, `raw/offline_b64_b1_{S}.{{json,log}}`). "
           "Smooth / x real time / TTFA p50 / p95 ms, beside the sixty-eighth session's sweep:", "",
           "| streams | this session | sixty-eighth session |", "|---|---|---|"]
    prev = res["sixty_eighth"]["sweep"]["burst"]
    cell = lambda r: f"{share(r['smooth'])} / {r['x_real_time']:.1f} / {r['ttfa_p50']:.0f} / {r['ttfa_p95']:.0f}"  # noqa: E731
    for n in final:
        md.append(f"| {n} | {cell(served_row(final[n]))} | {cell(prev.get(n) or prev[str(n)])} |")
    md += ["",
           f"- The engine alone in the same call: batch 64 {', '.join(f'{x:.1f}' for x in e64)}x; batch 1 "
           f"{e1['steps_per_s']:.1f} steps/s, RTF {e1['rtf']:.4f}. Served at 64 streams over the faster engine run: "
           f"{ratio:.3f} (the sixty-eighth session's {res['sixty_eighth']['served_over_engine_c64']:.3f}).",
           f"- One stream: RTF {final[1]['rtf']['p50']:.4f}, TTFA p50 {final[1]['ttfa_ms']['p50']:.1f} ms (2 requests; "
           "the headline keys stay the fifty-fourth session's 10-request run).",
           "", "**128 at once again** (call 3: one server, `LEVELS=64,128,128,128 REQUESTS=3`, the sixty-eighth "
           f"session's margin runs' command; `raw/served_c128_{S}.{{json.gz,log}}`). A stream is dry when its player "
           "ran out at some chunk (wave and chunk 1-based), smooth when none is more than 1 ms behind:", "",
           "| streams | x real time | smooth | TTFA p50 / p95 ms | dry | late ms |", "|---|---|---|---|---|---|"]
    md += [f"| {level_cells(lv)} |" for lv in again]
    md += ["",
           "- Every stream smooth at 64; at 128 in none of the three levels, where the sixty-eighth session's same "
           "command made 8 of 9 at the default margin. This session's serving changes act only when a channel has "
           "been idle for 5 s, at shutdown or on a LoRA add, none of which a level does; call 4 ran the code before "
           "them beside it all the same.",
           "", "**The code before this session against the final code** (call 4: four servers on one machine, "
           "847c88a's `python_backend` through `VOXCPM_PYTHON_BACKEND`, then the final code, in the order old, new, "
           "old, new; each `SET=\"decoder.timestep_buckets=10,100\" ARRIVALS=burst LEVELS=128,128 REQUESTS=3 bash "
           f"benchmarks/run_served_gpu.sh`; `raw/served_ab_s<server>_<code>_{S}.{{json.gz,log}}`):", "",
           "| server | code | streams | x real time | smooth | TTFA p50 / p95 ms | dry | late ms |",
           "|---|---|---|---|---|---|---|---|"]
    for (place, code), lvs in ab.items():
        md += [f"| {place} | {CODE[code]} | {level_cells(lv)} |" for lv in lvs]
    md += ["", "| code | levels of 128 | every stream smooth | least smooth | x real time, median (range) |",
           "|---|---|---|---|---|"]
    md += [f"| {CODE[c]} | {smooth_cells(st)} |" for c, st in stats.items()]
    xrt = {run: ", ".join(f"{lv['x_real_time']:.1f}" for lv in lvs) for run, lvs in ab.items()}
    md += ["",
           "- No difference between the codes shows: the first server (old) made "
           f"{xrt[AB_RUNS[0]]}x and the third (old too) {xrt[AB_RUNS[2]]}x; the second (new) {xrt[AB_RUNS[1]]}x "
           f"and the last (new) {xrt[AB_RUNS[3]]}x. Throughput fell from the first server to "
           "the third whatever the code ran, and stayed there: the machine slowed through the call (its cause, "
           "thermal or otherwise, not looked into). The order favours the old code (it ran first); the new code's "
           "first server still made more than the old code's second. Smooth playback at 128 at once was poor in both "
           "codes' later servers, and call 3, before the slowdown (588.7-594.1x), played no level of 128 fully "
           "smoothly either: the slowdown does not explain it all.",
           f"- The final code at 128 at once this session: {ok} of {n128} levels with every stream smooth (calls 2-4). "
           "Capacity at once stays 128 in the sweeps, and unreliable: the levels of 128 at once are at the edge of "
           "what this machine plays smoothly.",
           "", "**Against issue 17's targets**: unchanged from the sixty-eighth session (no performance lever this "
           f"session). One stream RTF {res['single_stream_rtf_triton']:.4f}, the fifty-fourth session's 10-request "
           f"headline (this call {final[1]['rtf']['p50']:.4f}; target 0.025, missed; the engine alone "
           f"{e1['rtf']:.4f}); served over engine at 64 {ratio:.3f} in this call (target 0.85, missed).", "",
           "![sixty-ninth session: 128 streams at once, the code before this session against the final code]"
           "(results_sixty_ninth.png)", ""]
    _plot(ab)
    return md


def _plot(ab: dict):
    """Left: call 4's levels of 128 at once in the order they ran, x real time by code. Right: their smooth share."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.3))
    i = 0
    for (place, code), lvs in ab.items():
        colour = "tab:blue" if code == "old" else "tab:orange"
        xs = list(range(i, i + len(lvs)))
        i += len(lvs)
        label = CODE[code] if place <= 2 else None
        a.plot(xs, [lv["x_real_time"] for lv in lvs], "o-", color=colour, label=label)
        b.plot(xs, [100 * lv["smooth_playback_frac"] for lv in lvs], "o-", color=colour, label=label)
    for ax, ylabel in ((a, "aggregate x real time"), (b, "streams smooth, %")):
        ax.set_xlabel("level of 128 at once, in the order run (two per server)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    save_panels(fig, [a, b], "sixty-ninth session (H200): 128 streams at once, old and new code alternating",
                "results_sixty_ninth.png")
