"""results.md: the sixty-fourth session's section, and results_sixty_fourth.png."""

import statistics

from summary.plots import pyplot, save_panels
from summary.raw import load, text
from summary.session58 import crowd_stats, level_cells, raw_name, smooth_cells, span
from summary.session61 import delivery_ms

S = "sixtyfourth"
PATCH = f"shm_forward_prefault_{S}.patch"
BIG = "--backend-config=python,shm-default-byte-size=134217728 --backend-config=python,shm-growth-byte-size=67108864"
# key -> what ran, a short name, its colour in the plot
CODES = {
    "base": ("1ed7a61, Triton's regions (1 MiB, grown 1 MiB at a time)", "code before", "tab:green"),
    "new": ("the patch: tts_stream passes the decoder's AUDIO tensor on as it came", "passed on", "tab:red"),
    "newbig": (f"the patch, `TRITON_ARGS=\"{BIG}\"`", "passed on, 128 MiB regions", "tab:orange"),
    "prefault": ("the patch, the same regions, `decoder.shm_prefault=true tts_stream.shm_prefault=true`",
                 "passed on, 128 MiB regions, pre-faulted", "tab:purple"),
    "basebig": ("1ed7a61, the same regions", "code before, 128 MiB regions", "tab:blue"),
}
# (call, server's place in its call, code key); raw names {code}_call{call}_server{place}
RUNS = [(1, 1, "new"), (1, 2, "prefault"), (1, 3, "base"), (2, 1, "base"), (2, 2, "prefault"), (2, 3, "new"),
        (3, 1, "newbig"), (3, 2, "basebig")]
PROCESSES = ("tts_stream", "tritonserver", "decoder")


def grown_regions_mib(run) -> list[int] | None:
    """The regions larger than the rest in the server's last /dev/shm snapshot with all its regions (taken
    every 2 s while it ran; call 1's watcher caught only the shutdown, so none), MiB, smallest first."""
    if run[0] == 1:
        return None
    sizes = sorted(int(line.split()[4]) >> 20 for line in text(f"shm_snapshot_{raw_name(*run)}_{S}.txt").splitlines()
                   if "triton_python_backend_shm_region" in line)
    return [s for s in sizes if s > sizes[0]]


def sixty_fourth_session(res) -> list[str]:
    """2026-12-04 (issue 17): the orchestrator passing the decoder's audio on without copying it, larger
    shared-memory regions, and regions pre-faulted, at 128 streams at once. Sets res["sixty_fourth"], returns
    the markdown, draws results_sixty_fourth.png."""
    levels = {r: load(f"served_{raw_name(*r)}_{S}.json")["levels"] for r in RUNS}
    stats = {k: crowd_stats([lv for r in RUNS if r[2] == k for lv in levels[r]]) for k in CODES}
    firsts = {k: [levels[r][0]["x_real_time"] for r in RUNS if r[2] == k] for k in CODES}
    faults = {k: {p: [[lv["minor_faults"][p] for lv in levels[r]] for r in RUNS if r[2] == k] for p in PROCESSES}
              for k in CODES}
    res["sixty_fourth"] = {
        "device": "NVIDIA H200",
        "requests_per_stream": 3,
        "runs": [{"call": c, "server": p, "code": CODES[k][0], "grown_regions_mib": grown_regions_mib((c, p, k)),
                  "levels": [{"x_real_time": lv["x_real_time"], "smooth": lv["smooth_playback_frac"],
                              "ttfa_p50": lv["ttfa_ms"]["p50"], "ttfa_p95": lv["ttfa_ms"]["p95"],
                              "delivery_ms": delivery_ms(lv), "minor_faults": {q: lv["minor_faults"][q] for q in
                                                                               PROCESSES}}
                             for lv in levels[(c, p, k)]]}
                 for c, p, k in RUNS],
        "c128": {CODES[k][1]: st | {"first_burst_x_real_time": firsts[k]} for k, st in stats.items()},
    }
    # levels of 128 at once with the default code and settings since the fifty-ninth session: every stream smooth, of
    before, malloc = res["sixty_second"]["pooled_c128_all_smooth_default"], res["sixty_second"]["gpu_malloc"]["default"]
    pooled = [before[0] + malloc["all_smooth"] + stats["base"]["all_smooth"],
              before[1] + malloc["levels"] + stats["base"]["levels"]]
    res["sixty_fourth"]["pooled_c128_all_smooth_default"] = pooled
    md = ["", "## Sixty-fourth session (2026-12-04, H200): the orchestrator passing the decoder's audio on "
          "without a copy, larger shared-memory regions, regions pre-faulted; none adopted",
          "", "The sixty-third session's counts put a first burst's page faults in the tts_stream stubs and the server, "
          "which pass every chunk's audio on. Two changes went after them (`raw/" + PATCH + "`, applies to 1ed7a61):",
          "- **Passed on**: tts_stream sent each chunk as a new tensor made from a copy of the decoder's "
          "(`astype`), which the stub then copied into its shared memory. The patch sends the decoder's `AUDIO` "
          "tensor as it came. A tensor read from shared memory is sent by reference to its block there (the Python "
          "backend's `PbTensor::SaveToSharedMemory` skips a tensor that has one), so the stub should copy nothing; "
          "that was read in its source, not measured.",
          "- **Pre-faulted**: a new model parameter `shm_prefault` (decoder, tts_stream) maps the instance's whole "
          "region into its process at start-up (`madvise(MADV_POPULATE_WRITE)`). Triton already allocates a "
          "region's pages when it creates it (its `/dev/shm` file has all its blocks: measured on the CPU, below). "
          "What is left is each process's first touch of each page, and a growth maps the region anew, so only a "
          "region that does not grow keeps the mapping.",
          "", "Three device calls, each on an H200 machine of its own. Each server: `SET=\"decoder.timestep_buckets=10,100"
          "[ ...]\" ARRIVALS=burst LEVELS=128,128 REQUESTS=3 bash benchmarks/run_served_gpu.sh`, one after "
          "another in a call. The code before ran from a copy of 1ed7a61's `python_backend` and `model_repository` "
          "(`MODEL_REPOSITORY=...`, `SERVER_ENV=\"VOXCPM_PYTHON_BACKEND=...\"`; the driver is `raw/devrun_"
          f"{S}.sh`). `raw/served_*_{S}.{{json.gz,log}}`, `raw/metrics_*_{S}.txt`, `raw/shm_snapshot_*_{S}.txt`. "
          "What ran:", ""]
    md += [f"- {CODES[k][1]}: {CODES[k][0]}" for k in CODES]
    md += ["", "Each server's two levels (its first burst of 128, then its second); dry and late as in the fifty-sixth "
           "session; delivery: the decoder's audio thread's deliveries, ms each. Faults: each level's minor page "
           "faults, thousands, in the tts_stream stubs / the server / the decoder stub. Regions: the /dev/shm "
           "regions that grew past the rest, MiB: four, as many as tts_stream's instances (call 1's snapshots missed "
           "them).", "",
           "| call / server | code | streams | x real time | smooth | TTFA p50 / p95 ms | dry | late ms | delivery ms | "
           "faults, thousands | regions grown, MiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in RUNS:
        grown = grown_regions_mib(r)
        for lv in levels[r]:
            f = " / ".join(f"{lv['minor_faults'][p] / 1000:.0f}" for p in PROCESSES)
            md.append(f"| {r[0]} / {r[1]} | {CODES[r[2]][1]} | {level_cells(lv)} | {delivery_ms(lv):.2f} | {f} | "
                      f"{', '.join(map(str, grown)) if grown else '-'} |")
    med = lambda xs: statistics.median(xs) / 1000  # noqa: E731
    md += ["", "| levels of | levels | every stream smooth | least smooth | x real time, median (range) | first "
           "bursts' x real time | tts_stream faults, first / second burst (median, thousands) | server's |",
           "|---|---|---|---|---|---|---|---|"]
    md += [f"| {CODES[k][1]} | {smooth_cells(st)} | {', '.join(f'{x:.1f}' for x in firsts[k])} | "
           f"{med([f[0] for f in faults[k]['tts_stream']]):.0f} / {med([f[1] for f in faults[k]['tts_stream']]):.0f} | "
           f"{med([f[0] for f in faults[k]['tritonserver']]):.0f} / {med([f[1] for f in faults[k]['tritonserver']]):.0f} |"
           for k, st in stats.items()]
    def burst(k, i, get):  # a code's servers' i-th levels (0: first burst), each through get
        return [get(levels[r][i]) for r in RUNS if r[2] == k]

    def fk(k, p, i):  # a code's servers' faults in p at their i-th level, thousands
        return [f[i] / 1000 for f in faults[k][p]]

    def grown(k):
        return [x for r in RUNS if r[2] == k and grown_regions_mib(r) for x in grown_regions_mib(r)]

    gain = [100 * (levels[(c, 2, "prefault")][0]["x_real_time"] / levels[(c, p, "base")][0]["x_real_time"] - 1)
            for c, p in ((1, 3), (2, 1))]
    pct = lambda xs: ", ".join(f"{100 * x:.1f}%" for x in xs)  # noqa: E731
    md += ["",
           "- **Passing the audio on, with Triton's regions, made first bursts worse**, in both calls, first and "
           f"last in its call: {span(firsts['new'], '{:.1f}')}x real time against {span(firsts['base'], '{:.1f}')}x "
           f"for the code before, {pct(burst('new', 0, lambda lv: lv['smooth_playback_frac']))} of the streams "
           f"smooth, deliveries of {span(burst('new', 0, delivery_ms), '{:.2f}')} ms against "
           f"{span(burst('base', 0, delivery_ms), '{:.2f}')}. The tts_stream stubs faulted less "
           f"({span(fk('new', 'tts_stream', 0))} thousand against {span(fk('base', 'tts_stream', 0))} in a first "
           f"burst, {span(fk('new', 'tts_stream', 1))} against {span(fk('base', 'tts_stream', 1))} in a second), the "
           f"server more ({span(fk('new', 'tritonserver', 0))} thousand against {span(fk('base', 'tritonserver', 0))}, "
           f"and {span(fk('new', 'tritonserver', 1))} against {span(fk('base', 'tritonserver', 1))} in second "
           f"bursts). The four regions grew to {span(grown('new'))} MiB one MiB at a time, "
           f"{span(grown('base'))} with the code before: each growth maps the whole region anew in both processes, "
           "whose pages then fault again, but they grew about as much either way. Why the server faults more when it "
           "is handed the block it wrote itself was not found.",
           f"- **With 128 MiB regions** (grown once, to {span(grown('newbig') + grown('prefault') + grown('basebig'))} "
           "MiB, in every run that recorded them) passing on cost the server as many faults in second bursts "
           f"({span(fk('newbig', 'tritonserver', 1) + fk('prefault', 'tritonserver', 1))} thousand) as the code "
           f"before with Triton's regions ({span(fk('base', 'tritonserver', 1))}), against "
           f"{span(fk('basebig', 'tritonserver', 1))} for the code before with the same regions, and more "
           f"in first bursts ({span(fk('newbig', 'tritonserver', 0) + fk('prefault', 'tritonserver', 0))} thousand, "
           f"against {span(fk('basebig', 'tritonserver', 0))} for the code before with the same regions). Side by "
           f"side in call 3, passed on and the code before made {firsts['newbig'][0]:.1f}x and "
           f"{firsts['basebig'][0]:.1f}x in their first bursts, {levels[(3, 1, 'newbig')][1]['x_real_time']:.1f}x "
           f"and {levels[(3, 2, 'basebig')][1]['x_real_time']:.1f}x in their second: the same. Pre-faulted too: "
           f"{span(firsts['prefault'], '{:.1f}')}x in first bursts, each server second in its call, "
           f"{span(gain, '{:.1f}')}% faster than the code before's server of the same call, within the spread between "
           "servers. Those regions grew once too, which maps them anew, so pre-faulting was not tested with a region "
           "that keeps its size; and it did not cut the tts_stream stubs' first-burst faults "
           f"({span(fk('prefault', 'tts_stream', 0))} thousand, against {span(fk('newbig', 'tts_stream', 0))} "
           "without it, another call).",
           "- The code before with 128 MiB regions had the fastest first-burst deliveries of the session, "
           f"{burst('basebig', 0, delivery_ms)[0]:.2f} ms against {span(burst('base', 0, delivery_ms), '{:.2f}')} "
           "with Triton's regions, as the sixty-first session's one such server did (1.04 against 1.24). One "
           "server each time: not enough to tell.",
           f"- The code before's levels: {stats['base']['all_smooth']} of {stats['base']['levels']} every stream "
           f"smooth with Triton's regions, {stats['basebig']['all_smooth']} of {stats['basebig']['levels']} with "
           "128 MiB ones (one server: no gain to tell). With the sixty-third session's servers of glibc's defaults, "
           f"{pooled[0]} of {pooled[1]} levels of 128 at once with the default code and settings played every stream "
           "smoothly since the fifty-ninth session (the sixty-second session's count left those out).",
           "- **None adopted**: passing on is slower with the regions a server gets by default, and no faster with "
           "larger ones; pre-faulting, tried only with it and with regions that still grew once, showed no gain. The "
           "code is the patch. A first burst still costs the server about "
           f"{statistics.median(fk('base', 'tritonserver', 0)):.0f} thousand faults and tts_stream about "
           f"{statistics.median(fk('base', 'tts_stream', 0)):.0f} thousand. Where they come from was not "
           "established: not mainly from the regions' many growths, since with 128 MiB regions (one growth instead of "
           f"about 180) the code before took {fk('basebig', 'tts_stream', 0)[0]:.0f} and "
           f"{fk('basebig', 'tritonserver', 0)[0]:.0f} thousand. One candidate is the stubs' heap: the Python "
           "backend copies every chunk a stub receives into a NumPy array of its own.", ""]
    md += _cpu()
    _plot(levels, faults)
    return md


def _cpu() -> list[str]:
    """This machine: the code before against the patch (passed on), four servers, and what Triton allocates."""
    runs = {(w, i): load(f"shm_regions_cpu_{w}_{i}_{S}.json")["bursts"] for w in ("base", "new") for i in (1, 2)}
    big = load(f"shm_regions_128mib_cpu_{S}.json")

    def first(w, key):
        return ", ".join(f"{runs[(w, i)][0]['minor_faults'][key] / 1000:.1f}" for i in (1, 2))

    return ["**On the CPU** (this machine, the tiny checkpoint; `benchmarks/shm_regions.py --bursts 3`: three bursts of 32 "
            "streams of 40 patches a server, two pairs of servers, the code before first in each; "
            f"`raw/shm_regions_cpu_{{base,new}}_{{1,2}}_{S}.json`) the same shift, on a smaller scale: in first bursts "
            f"the tts_stream stubs took {first('new', 'tts_stream')} thousand faults passing the audio on against "
            f"{first('base', 'tts_stream')} thousand, the server {first('new', 'tritonserver')} thousand against "
            f"{first('base', 'tritonserver')}. Triton allocates every page of a region as it creates it: with "
            "`-- --backend-config=python,shm-default-byte-size=134217728` all "
            f"{len(big['after_start_mib'])} regions held {span(big['after_start_allocated_mib'])} MiB of "
            f"RAM each after start-up (`raw/shm_regions_128mib_cpu_{S}.json`; shm_regions.py records it now, "
            f"`after_start_allocated_mib`), {sum(big['after_start_allocated_mib']) / 1024:.1f} GiB in all: a larger "
            "`shm-default-byte-size` costs that size for every Python model instance (20 here), not only for those "
            "that use it.", ""]


def _plot(levels: dict, faults: dict):
    """Left: each server's x real time in its first and second burst of 128, by code. Right: each server's first
    burst's faults in the tts_stream stubs against the server's."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.3))
    for k, (_, name, colour) in CODES.items():
        for i, r in enumerate(r for r in RUNS if r[2] == k):
            a.plot([1, 2], [lv["x_real_time"] for lv in levels[r]], "o-", color=colour, label=None if i else name)
        b.scatter([f[0] / 1000 for f in faults[k]["tts_stream"]], [f[0] / 1000 for f in faults[k]["tritonserver"]],
                  color=colour, s=40, label=name)
    a.set_xticks([1, 2])
    a.set_xlabel("the server's burst of 128 streams (1: its first)")
    a.set_ylabel("aggregate x real time")
    a.legend(fontsize=7)
    b.set_xlabel("first burst: tts_stream stubs' minor faults, thousands")
    b.set_ylabel("first burst: server's minor faults, thousands")
    b.legend(fontsize=7)
    save_panels(fig, [a, b], "sixty-fourth session (H200): 128 streams at once, 3 requests a stream; audio passed on "
                "without a copy, 128 MiB regions, pre-faulted", "results_sixty_fourth.png")
