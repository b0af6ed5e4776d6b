"""results.md: the sixty-first session's section, and results_sixty_first.png."""

import statistics

from bench_served import share
from summary import session60
from summary.plots import pyplot, save_panels
from summary.raw import AUDIO_S_PER_STEP, load, metric_value, served_row
from summary.session56 import dry_counts, dry_streams
from summary.session58 import crowd_stats, dry_late_ms, level_cells, raw_name, smooth_cells, span

S = "sixtyfirst"
SHM_ARGS = ("--backend-config=python,shm-default-byte-size=134217728 "
            "--backend-config=python,shm-growth-byte-size=67108864")
# key -> its code, a short name, its colour in the plot; 3 requests a stream, timestep_buckets 10,100
CODES = {
    "two": ("4f06359, `decoder.chunk_schedule=2,4,16`", "2,4,16", "tab:blue"),
    "base": ("4f06359 (chunk_schedule 1,4,16)", "code before", "tab:green"),
    "shm": (f"4f06359, `TRITON_ARGS=\"{SHM_ARGS}\"`", "128 MiB regions", "tab:purple"),
}
# (call, server's place in its call, code key); raw name {code}_call{call}_server{place}
RUNS = [(1, 1, "two"), (1, 2, "base"), (2, 1, "base"), (2, 2, "two"), (2, 3, "base"), (3, 1, "shm"), (3, 2, "base")]
# the fifty-third session's eager VAE decodes, each shape's first and second run (fresh caches)
FIRST_RUNS = "vae_first_before_cold_fiftythird.json"
WARM_RUNS = "vae_first_before_warm_fiftythird.json"
# the CPU runs of benchmarks/shm_regions.py: (raw name, what it ran)
CPU_SHM = [(f"shm_regions_cpu_{v}_{i}_{S}.json", v) for i in (1, 2, 3) for v in ("default", "growth64")]


def delivery_ms(lv: dict) -> float:
    """The decoder's audio deliveries in a level, ms each (a decoded chunk's wait and its send)."""
    steps = lv["decoder_steps"]
    return 1000 * steps["audio_send_s"] / steps["audio_sends"]


def _places(runs: list, levels: dict, code: str) -> dict:
    """A code's 128-stream levels by their place among their server's 128-stream levels (1: its first burst of
    128), over `runs` [(call, place, code)] whose levels are levels[run]."""
    out = {}
    for r in runs:
        if r[2] == code:
            for i, lv in enumerate(lv for lv in levels[r] if lv["concurrency"] == 128):
                out.setdefault(i + 1, []).append(lv)
    return out



def sixty_first_session(res) -> list[str]:
    """2026-12-03 (issue 17): the fifty-ninth session's fixed 2,4,16 schedule re-measured at 128 at once; a
    fresh server's first burst of 128; larger Python backend shared-memory regions. Sets res["sixty_first"],
    returns the markdown, draws results_sixty_first.png."""
    levels = {r: load(f"served_{raw_name(*r)}_{S}.json")["levels"] for r in RUNS}
    early = {r: metric_value(f"metrics_{raw_name(*r)}_{S}.txt", "voxcpm_early_chunks_total") for r in RUNS}
    at = lambda r, c: [lv for lv in levels[r] if lv["concurrency"] == c]  # noqa: E731
    c128 = lambda code, calls: [lv for r in RUNS if r[2] == code and r[0] in calls for lv in at(r, 128)]  # noqa: E731
    # the sixtieth session's servers of the code before (raw), for the first-burst count
    levels60 = {r: load(f"served_{raw_name(*r)}_{session60.S}.json")["levels"] for r in session60.RUNS}


    by_row = {"2,4,16, calls 1-2": crowd_stats(c128("two", (1, 2))), "code before, calls 1-2": crowd_stats(c128("base", (1, 2))),
              "code before, call 3": crowd_stats(c128("base", (3,))), "128 MiB regions, call 3": crowd_stats(c128("shm", (3,)))}
    one = {r: at(r, 1)[0] for r in RUNS if at(r, 1)}
    # first bursts: this session's and the sixtieth's servers of the code before, and this session's 2,4,16
    places = {"code before": _places(RUNS, levels, "base"), "2,4,16": _places(RUNS, levels, "two")}
    for p, lvs in _places(session60.RUNS, levels60, "base").items():
        places["code before"].setdefault(p, []).extend(lvs)
    first_later = {name: {"first": by[1], "later": [lv for p, lvs in by.items() if p > 1 for lv in lvs]}
                   for name, by in places.items()}
    # every level of 128 at once of each code so far: the fifty-ninth session's notes, the sixtieth's and this one's
    pooled = {
        "2,4,16": [lv["smooth_playback_frac"] for lv in c128("two", (1, 2, 3))]
        + [sm / 100 for _, code, n, _, sm, _ in session60.FIFTY_NINTH if n == 128 and code == "chunk_schedule 2,4,16"],
        "code before": [lv["smooth_playback_frac"] for lv in c128("base", (1, 2, 3))]
        + [lv["smooth_playback_frac"] for r in session60.RUNS if r[2] == "base" for lv in levels60[r]
           if lv["concurrency"] == 128]
        + [sm / 100 for _, code, n, _, sm, _ in session60.FIFTY_NINTH if n == 128 and code == "code before"],
    }
    cpu = [(load(name), v) for name, v in CPU_SHM]
    extra, largest = {"all": [], "smaller": []}, 0
    for d in load(FIRST_RUNS)["decodes"]:
        if d["eager"]:
            extra["all"].append(d["first_ms"] - d["second_ms"])
            if d["streams"] * d["patches"] <= largest:
                extra["smaller"].append(d["first_ms"] - d["second_ms"])
        largest = max(largest, d["streams"] * d["patches"])
    warm_extra = [d["first_ms"] - d["second_ms"] for d in load(WARM_RUNS)["decodes"] if d["eager"]]

    res["sixty_first"] = {
        "device": "NVIDIA H200",
        "requests_per_stream": 3,
        "runs": [{"call": call, "server": place, "code": CODES[k][0], "early_chunks": early[(call, place, k)],
                  "levels": [served_row(lv) | {"streams": lv["concurrency"], "dry": dry_counts(lv),
                                               "dry_late_ms": dry_late_ms(lv), "delivery_ms": delivery_ms(lv)}
                             for lv in levels[(call, place, k)]]}
                 for call, place, k in RUNS],
        "c128": by_row,
        "first_burst": {name: {k: {"levels": len(lvs), "all_smooth": sum(lv["smooth_playback_frac"] == 1 for lv in lvs),
                                   "delivery_ms_median": statistics.median(map(delivery_ms, lvs))}
                               for k, lvs in fl.items()} for name, fl in first_later.items()},
        "pooled_c128_all_smooth": {name: [sum(x == 1 for x in fr), len(fr)] for name, fr in pooled.items()},
        "cpu_shm_regions": [{"server": v, **d} for d, v in cpu],
        "eager_first_run_extra_ms_fiftythird": extra,
    }

    two, base = by_row["2,4,16, calls 1-2"], by_row["code before, calls 1-2"]
    md = ["", "## Sixty-first session (2026-12-03, H200): a first chunk of two patches at 128 at once re-measured "
          f"({two['all_smooth']} of {two['levels']} levels smooth against {base['all_smooth']} of {base['levels']}, "
          "first audio later); most streams that ran dry were in a server's first burst of 128; larger Python backend "
          "shared-memory regions measured once; `audio_eager_pad` (off) for the next call",
          "", "Three device calls (about 28 of 30 min), each on an H200 machine of its own. Each server: `SET=\"decoder.timestep_buckets=10,100"
          "[ decoder.chunk_schedule=2,4,16]\" ARRIVALS=burst REQUESTS=3 bash benchmarks/run_served_gpu.sh`, one "
          "after another in a call, LEVELS 1,128,128,128,128 in calls 1 and 2 (the orders 2,4,16 / code before and "
          "code before / 2,4,16 / code before) and 128,128 in call 3. Call 3's first server ran with "
          f"`TRITON_ARGS=\"{SHM_ARGS}\"` (new: more tritonserver arguments for `run_served_gpu.sh`). The code is "
          "4f06359 throughout. "
          f"`raw/served_*_{S}.{{json.gz,log}}`, `raw/metrics_*_{S}.txt`. Dry as in the fifty-sixth session (wave and "
          "chunk 1-based); late: the latest dry stream; delivery: the decoder's audio thread's deliveries in the "
          "level, ms each (a decoded chunk's wait and its send to the client).", "",
          "| call / server | code | streams | x real time | smooth | TTFA p50 / p95 ms | dry | late ms | delivery ms | "
          "early chunks (run) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in RUNS:
        for lv in levels[r]:
            md.append(f"| {r[0]} / {r[1]} | {CODES[r[2]][1]} | {level_cells(lv)} | {delivery_ms(lv):.2f} | "
                      f"{early[r]:.0f} |")
    md += ["", "At 128 at once:", "",
           "| levels of | levels | every stream smooth | least smooth | x real time, median (range) | TTFA p50 ms | "
           "TTFA p95 ms, worst | dry streams, first wave / later |", "|---|---|---|---|---|---|---|---|"]
    md += [f"| {name} | {smooth_cells(st)} | {span(st['ttfa_p50_ms'])} | {st['ttfa_p95_ms_max']:.0f} | "
           f"{st['first_wave_dry']} / {st['later_waves_dry']} |" for name, st in by_row.items()]
    one_two = [one[r]["ttfa_ms"]["p50"] for r in one if r[2] == "two"]
    one_base = [one[r]["ttfa_ms"]["p50"] for r in one if r[2] == "base"]
    c1_two = c128("two", (1,))
    p50 = {k: statistics.median(lv["ttfa_ms"]["p50"] for lv in c128(k, (1, 2))) for k in ("two", "base")}
    # the same calls only: the fifty-ninth session's notes (calls 1 and 3 ran both) and this session's calls 1-2
    same_calls = {k: [lv["smooth_playback_frac"] for lv in c128(k, (1, 2))]
                  + [sm / 100 for _, code, n, _, sm, _ in session60.FIFTY_NINTH if n == 128 and code == name]
                  for k, name in (("two", "chunk_schedule 2,4,16"), ("base", "code before"))}
    # servers whose first burst of 128 had the slowest deliveries of their bursts of 128
    servers = [[lv for lv in levels[r] if lv["concurrency"] == 128] for r in RUNS] + \
        [[lv for lv in levels60[r] if lv["concurrency"] == 128] for r in session60.RUNS if r[2] == "base"]
    first_slowest = sum(delivery_ms(s[0]) == max(map(delivery_ms, s)) for s in servers if len(s) > 1)
    multi = sum(len(s) > 1 for s in servers)
    md += ["",
           f"- **2,4,16 played 128 at once smoothly more often, and started later.** Every stream smooth in "
           f"{two['all_smooth']} of {two['levels']} levels against {base['all_smooth']} of {base['levels']} for the "
           f"code before in the same calls; no early chunks at all ({', '.join(f'{early[r]:.0f}' for r in RUNS if r[2] == 'two')} "
           f"against {', '.join(f'{early[r]:.0f}' for r in RUNS if r[2] == 'base' and r[0] < 3)}). First audio came "
           f"later: TTFA p50 {span(two['ttfa_p50_ms'])} ms at 128 against {span(base['ttfa_p50_ms'])}, p95 up to "
           f"{two['ttfa_p95_ms_max']:.0f} against {base['ttfa_p95_ms_max']:.0f} ms; one stream's TTFA p50 "
           f"{' and '.join(f'{x:.1f}' for x in one_two)} ms against {', '.join(f'{x:.1f}' for x in one_base)} "
           "(issue 17 asks <= 25 ms). x real time median "
           f"{two['xrt_median']:.1f} against {base['xrt_median']:.1f}; call 1's 2,4,16 server, the first of its "
           f"machine, made {span([lv['x_real_time'] for lv in c1_two], '{:.1f}')}x with "
           f"{span([lv['decoder_steps']['late_launches'] for lv in c1_two])} steps launched late a level (the code "
           f"before in the same call: {span([lv['decoder_steps']['late_launches'] for lv in c128('base', (1,))])}).",
           "- Every level of 128 at once measured so far, every stream smooth (the fifty-ninth session's from its "
           "notes, the sixtieth's code before, this session's calls 1-3): "
           + "; ".join(f"{name} {sum(x == 1 for x in fr)} of {len(fr)}" for name, fr in pooled.items())
           + "; in the calls where both ran (the fifty-ninth session's and this one's calls 1-2): "
           + "; ".join(f"{CODES[k][1]} {sum(x == 1 for x in v)} of {len(v)}" for k, v in same_calls.items())
           + f". The default stays 1,4,16: 2,4,16 would miss the one-stream first-audio target, and at 128 at once "
           f"its TTFA p50 was {p50['two'] - p50['base']:.0f} ms later (the levels' medians, {p50['two']:.1f} against "
           f"{p50['base']:.1f} ms). README's `chunk_schedule` row now says when 2,4,16 is the "
           "better choice.", "",
           "**A server's first burst** (this session's and the sixtieth session's servers of the code before, "
           "and this session's 2,4,16; a server's 128-stream levels by their place: its first, or a later one):", "",
           "| code | levels | first burst of 128: every stream smooth | its delivery ms, median | later bursts: every "
           "stream smooth | their delivery ms, median |", "|---|---|---|---|---|---|"]
    for name, fl in first_later.items():
        f, later = fl["first"], fl["later"]
        md.append(f"| {name} | {len(f) + len(later)} | {sum(lv['smooth_playback_frac'] == 1 for lv in f)} of {len(f)} | "
                  f"{statistics.median(map(delivery_ms, f)):.2f} | "
                  f"{sum(lv['smooth_playback_frac'] == 1 for lv in later)} of {len(later)} | "
                  f"{statistics.median(map(delivery_ms, later)):.2f} |")
    shm1, base3 = c128("shm", (3,)), c128("base", (3,))
    fb = first_later["code before"]
    misses = {k: sum(lv["smooth_playback_frac"] < 1 for lv in fb[k]) for k in ("first", "later")}
    dry_at = {k: sum(len(dry_streams(lv)) for lv in fb[k]) for k in ("first", "later")}
    md += ["",
           f"- A server's first burst of 128 is where the code before runs dry: {sum(lv['smooth_playback_frac'] == 1 for lv in fb['first'])} "
           f"of {len(fb['first'])} first bursts played every stream smoothly, "
           f"{sum(lv['smooth_playback_frac'] == 1 for lv in fb['later'])} of {len(fb['later'])} later ones. In "
           f"{first_slowest} of the {multi} servers with more than one burst of 128 (all three codes), the first burst's "
           "deliveries were the slowest of the server's: something the audio thread does is slower the first time a "
           f"crowd passes through a server. Of the code before's {misses['first'] + misses['later']} levels with "
           f"streams that ran dry here, {misses['first']} were first bursts, with {dry_at['first']} of the "
           f"{dry_at['first'] + dry_at['later']} dry streams. What makes a first burst slower was not found.",
           "- One candidate is the Python backend's shared memory: Triton 2.51 makes each model instance's region 1 MiB "
           "and grows it by 1 MiB when a tensor does not fit, mapping the whole region again in both processes each "
           f"time, and a 16-patch chunk's audio is {16 * AUDIO_S_PER_STEP * 48000 * 4 / 1e6:.2f} MB (48 kHz, "
           "float32). Call 3 ran one server with 128 MiB regions grown by 64 MiB beside the code before on a slower "
           "machine (a snapshot of /dev/shm taken as each server stopped, one model's region left, shows the setting "
           f"took: 128 MiB against 1 MiB, `raw/shm_snapshot_*_{S}.txt`; x real time {span([lv['x_real_time'] for lv in shm1 + base3], '{:.1f}')}): smooth "
           f"{', '.join(share(lv['smooth_playback_frac']) for lv in shm1)} with it against "
           f"{', '.join(share(lv['smooth_playback_frac']) for lv in base3)}, delivery "
           f"{' -> '.join(f'{delivery_ms(lv):.2f}' for lv in shm1)} ms against "
           f"{' -> '.join(f'{delivery_ms(lv):.2f}' for lv in base3)}. One server each: not enough to tell, and no "
           "level of either was all smooth. Not adopted.",
           "- The lead for the next GPU call: the audio thread's eager VAE decodes. The VAE's graphs cover at most 64 "
           "streams and 256 patches a replay, so a round of more than 64 streams, or of more than 16 with 16-patch "
           "chunks, decodes eagerly, each batch size a shape of its own; a 64-stream level never makes the decodes of "
           "65-128 streams. The fifty-third session timed each eager shape's first and second run after a served "
           f"start-up (`raw/{FIRST_RUNS}`, fresh caches, 17-100 streams x 2-16 patches): the first run took "
           f"{span(extra['all'], '{:.1f}')} ms more (median {statistics.median(extra['all']):.1f}; "
           f"{span(warm_extra, '{:.1f}')} with the compile caches a first process left, `raw/{WARM_RUNS}`), and the "
           f"{len(extra['smaller'])} shapes no larger than one run before them "
           f"{span(extra['smaller'], '{:.1f}')} ms more (median {statistics.median(extra['smaller']):.1f}): a cost "
           "per shape, not the CUDA caching allocator's growth. A round merges a stream's pending chunks up to 16 "
           "patches, so any length up to 16 comes, each a shape with each batch size. A first burst of 128 meets such shapes for the "
           "first time at its second and third chunks, where its dry streams are. `decoder.audio_eager_pad` (new, "
           "off: the code of this section's last commit) pads such a decode with scratch rows to a multiple of 8 "
           "streams and runs each of those shapes once at start-up (up to max_batch_size streams, every length up to "
           "the longest chunk), then gives its memory back before the KV cache is sized; its CPU tests check the audio and every stream's state against the unpadded decode. The "
           "run to make: `SET=\"decoder.timestep_buckets=10,100 decoder.audio_eager_pad=true\"` against the "
           "default at LEVELS 128,128, several servers each, and its start-up time.",
           "- On the CPU (this machine, the tiny checkpoint; `benchmarks/shm_regions.py`, new: a real server, "
           "three bursts of 32 streams of 40 patches, each server's run in a process of its own, the two settings "
           "alternating; the regions' sizes after each burst, MiB, only those that grew):", "",
           "| server | run | burst 1 x real time | burst 2 | burst 3 | delivery ms, bursts 1 / 2 / 3 | regions after "
           "burst 3, MiB |", "|---|---|---|---|---|---|---|"]
    for i, (d, v) in enumerate(cpu):
        b = d["bursts"]
        md.append(f"| {'1 MiB growth (default)' if v == 'default' else '64 MiB growth'} | {i // 2 + 1} | "
                  + " | ".join(f"{x['x_real_time']:.2f}" for x in b) + " | "
                  + " / ".join(f"{x['delivery_ms']:.2f}" for x in b) + " | "
                  + ", ".join(str(x) for x in b[-1]["sizes_mib"] if x > 1) + " |")
    growth = {v: [d["bursts"][0]["x_real_time"] for d, w in cpu if w == v] for v in ("default", "growth64")}
    faster = sum(d["bursts"][-1]["x_real_time"] > d["bursts"][0]["x_real_time"] for d, _ in cpu)
    grown = max(x for d, w in cpu if w == "default" for x in d["bursts"][-1]["sizes_mib"])
    md += ["", f"- With the default growth the regions that grew reached {grown} MiB in 1 MiB steps (as many remaps "
           "in both processes); with 64 MiB steps each grew once. The first bursts' x real time: "
           f"{', '.join(f'{x:.1f}' for x in growth['default'])} with the default, "
           f"{', '.join(f'{x:.1f}' for x in growth['growth64'])} with 64 MiB steps: within this machine's spread "
           f"between runs. On the CPU {faster} of the {len(cpu)} servers ran their third burst faster than their first "
           "(a warm-up of its own, not looked into), so this says nothing of the GPU's first burst either way."]
    md += ["", "**Against issue 17's targets**: unchanged; results.json's headline keys stay the fifty-fifth "
           "session's. Capacity at once: the code before played 128 at once smoothly in "
           f"{sum(x == 1 for x in pooled['code before'])} of {len(pooled['code before'])} levels measured since the "
           f"fifty-ninth session; {misses['first']} of the {misses['first'] + misses['later']} misses with raw data "
           "were a server's first burst of 128.", "",
           "![sixty-first session: 128 at once, smoothness against first audio; a server's first burst](results_sixty_first.png)",
           ""]
    _plot({k: c128(k, (1, 2, 3)) for k in CODES}, places)
    return md


def _plot(by_code, places):
    """Left: each level of 128 at once, the share of streams smooth against TTFA p50, by code. Right: the audio
    thread's delivery ms by the level's place among its server's bursts of 128."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.3))
    for k, lvs in by_code.items():
        a.scatter([lv["ttfa_ms"]["p50"] for lv in lvs], [100 * lv["smooth_playback_frac"] for lv in lvs],
                  color=CODES[k][2], s=36, label=f"{CODES[k][1]} ({len(lvs)} levels)")
    a.set_xlabel("TTFA p50 ms")
    a.set_ylabel("streams smooth (%)")
    a.legend(fontsize=8)
    for (name, by), colour, dx in zip(places.items(), ("tab:green", "tab:blue"), (-0.08, 0.08)):
        for p, lvs in sorted(by.items()):
            b.scatter([p + dx] * len(lvs), [delivery_ms(lv) for lv in lvs], color=colour, s=30,
                      marker="o" if p > 1 else "D", label=name if p == 1 else None)
    b.set_xticks(sorted({p for by in places.values() for p in by}))
    b.set_xlabel("the level's place among its server's bursts of 128 (1: the server's first)")
    b.set_ylabel("audio delivery, ms each")
    b.legend(fontsize=8)
    save_panels(fig, [a, b], "sixty-first session (H200): 128 streams at once, 3 requests a stream; "
                "code before: sixtieth and sixty-first sessions", "results_sixty_first.png")
