"""results.md: the sixty-second session's section, and results_sixty_second.png."""

import re
import statistics

from summary.plots import pyplot, save_panels
from summary.raw import load, metric_value, served_row, tests_passed, text
from summary.session56 import dry_counts
from summary.session58 import crowd_stats, level_cells, raw_name, smooth_cells, span
from summary.session61 import delivery_ms

S = "sixtysecond"
# key -> its code, a short name, its colour in the plot; 3 requests a stream, timestep_buckets 10,100
CODES = {
    "pad": ("bbdd824 (call 1), c70ab76 (call 2), `decoder.audio_eager_pad=true`", "eager shapes warmed",
            "tab:orange"),
    "base": ("bbdd824 (call 1), c70ab76 (call 2)", "default", "tab:green"),
}
# (call, server's place in its call, code key); raw name {code}_call{call}_server{place}
RUNS = [(1, 1, "pad"), (1, 2, "base"), (2, 1, "base"), (2, 2, "pad"), (2, 3, "base")]
PATCH = f"audio_eager_pad_{S}.patch"
# the CPU runs of benchmarks/shm_regions.py with minor page faults: (raw name, glibc malloc tunables or not)
CPU_FAULTS = [(f"page_faults_cpu_{v}_{i}_{S}.json", v, i) for i in (1, 2, 3, 4, 5) for v in ("default", "malloc")]
MALLOC_ENV = "MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456 MALLOC_TOP_PAD_=67108864"
# the H200 runs of the same (sixty-third session): (call, server's place, setting); raw served_{setting}_call{c}_server{p}
GPU_MALLOC = [(1, 1, "default"), (1, 2, "malloc"), (1, 3, "default"), (2, 1, "malloc"), (2, 2, "default"), (2, 3, "malloc")]


def by_model(faults: dict) -> dict:
    """A burst's faults summed by model (the defaults' run 1 wrote a stub's instances as model_pid)."""
    out = {}
    for k, v in faults.items():
        name = re.sub(r"_\d+$", "", k)
        out[name] = out.get(name, 0) + v
    return out


def start_up(run) -> dict:
    """The decoder's ready line in a server's log: seconds to ready, its listed phases (load and the
    engine's; call 2's code lists the audio thread's too), what is outside them, and its KV blocks."""
    line = re.search(r"decoder instance \S+ ready in .*", text(f"served_{raw_name(*run)}_{S}.log"))[0]
    ready = float(re.search(r"ready in ([\d.]+) s", line)[1])
    listed = line[line.index("(load"):line.index("GPU memory")]
    phases = {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+) s\b", listed)}
    return {"ready_s": ready, "phases_s": phases, "kv_blocks": int(re.search(r"kv_blocks=(\d+)", line)[1]),
            "outside_engine_phases_s": ready - sum(v for k, v in phases.items() if k != "audio")}


def sixty_second_session(res) -> list[str]:
    """2026-12-03 (issue 17): `audio_eager_pad` (the sixty-first session's lead) against the default at 128
    streams at once. Sets res["sixty_second"], returns the markdown, draws results_sixty_second.png."""
    levels = {r: load(f"served_{raw_name(*r)}_{S}.json")["levels"] for r in RUNS}
    early = {r: metric_value(f"metrics_{raw_name(*r)}_{S}.txt", "voxcpm_early_chunks_total") for r in RUNS}
    ups = {r: start_up(r) for r in RUNS}
    by_code = {k: [lv for r in RUNS if r[2] == k for lv in levels[r]] for k in CODES}
    first = {k: [levels[r][0] for r in RUNS if r[2] == k] for k in CODES}
    later = {k: [lv for r in RUNS if r[2] == k for lv in levels[r][1:]] for k in CODES}
    stats = {k: crowd_stats(lvs) for k, lvs in by_code.items()}
    p50 = {k: statistics.median(lv["ttfa_ms"]["p50"] for lv in lvs) for k, lvs in by_code.items()}
    audio_s = {k: [ups[r]["phases_s"]["audio"] for r in RUNS if r[2] == k and "audio" in ups[r]["phases_s"]]
               for k in CODES}
    pooled = res["sixty_first"]["pooled_c128_all_smooth"]["code before"]
    pooled_now = [pooled[0] + stats["base"]["all_smooth"], pooled[1] + stats["base"]["levels"]]

    res["sixty_second"] = {
        "device": "NVIDIA H200",
        "requests_per_stream": 3,
        "runs": [{"call": call, "server": place, "code": CODES[k][0], "early_chunks": early[(call, place, k)],
                  "start_up": ups[(call, place, k)],
                  "levels": [served_row(lv) | {"streams": lv["concurrency"], "dry": dry_counts(lv),
                                               "delivery_ms": delivery_ms(lv)} for lv in levels[(call, place, k)]]}
                 for call, place, k in RUNS],
        "c128": {CODES[k][1]: st for k, st in stats.items()},
        "delivery_ms": {CODES[k][1]: {"first_burst": [delivery_ms(lv) for lv in first[k]],
                                      "later": [delivery_ms(lv) for lv in later[k]]} for k in CODES},
        "gpu_test": tests_passed(f"gpu_test_eager_pad_{S}.log"),
        "pooled_c128_all_smooth_default": pooled_now,
    }

    md = ["", "## Sixty-second session (2026-12-03, H200): the VAE's eager decode shapes run once at start-up "
          "(`audio_eager_pad`) did not speed a server's first burst of 128; removed",
          "", "Two device calls (two more were lost: no machine could be started, then the machine was taken back "
          "mid-call), each on an H200 machine of its own. Each server: `SET=\"decoder.timestep_buckets=10,100"
          "[ decoder.audio_eager_pad=true]\" ARRIVALS=burst LEVELS=128,128 REQUESTS=3 bash "
          "benchmarks/run_served_gpu.sh`, one after another in a call: eager shapes warmed / default in call 1, "
          "default / warmed / default in call 2. Call 2 ran c70ab76, which only adds the audio thread's start-up "
          "to the decoder's ready line. "
          f"`raw/served_*_{S}.{{json.gz,log}}`, `raw/metrics_*_{S}.txt`; the parameter's code, removed after this "
          f"measurement, is `raw/{PATCH}` (applies to e83ddea, with its CPU and GPU tests). Its GPU test "
          f"(`tests/test_engine_gpu.py -k eager_pad`, call 1) passed: {res['sixty_second']['gpu_test']} "
          f"(`raw/gpu_test_eager_pad_{S}.log`). Columns as in the sixty-first session; start-up: the "
          "decoder's ready time, and the part of it outside load and the engine's phases (the audio thread's VAE "
          "graphs, and with the parameter its warm-up of the eager shapes).", "",
          "| call / server | code | streams | x real time | smooth | TTFA p50 / p95 ms | dry | late ms | delivery ms | "
          "early chunks (run) | ready s | outside the engine's phases s | kv_blocks |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in RUNS:
        u = ups[r]
        for lv in levels[r]:
            md.append(f"| {r[0]} / {r[1]} | {CODES[r[2]][1]} | {level_cells(lv)} | {delivery_ms(lv):.2f} | "
                      f"{early[r]:.0f} | {u['ready_s']:.1f} | {u['outside_engine_phases_s']:.1f} | {u['kv_blocks']} |")
    md += ["", "| levels of | levels | every stream smooth | least smooth | x real time, median (range) | TTFA p50 ms "
           "(median) | TTFA p95 ms, worst | delivery ms, first bursts | later bursts |", "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {CODES[k][1]} | {smooth_cells(st)} | {span(st['ttfa_p50_ms'])} ({p50[k]:.1f}) | "
           f"{st['ttfa_p95_ms_max']:.0f} | {', '.join(f'{delivery_ms(lv):.2f}' for lv in first[k])} | "
           f"{', '.join(f'{delivery_ms(lv):.2f}' for lv in later[k])} |" for k, st in stats.items()]
    kv = {k: [ups[r]["kv_blocks"] for r in RUNS if r[2] == k] for k in CODES}
    md += ["",
           "- **Every level of 128 at once played every stream smoothly**, with the parameter and without "
           f"({stats['pad']['all_smooth']} of {stats['pad']['levels']} and {stats['base']['all_smooth']} of "
           f"{stats['base']['levels']}), so this session could not show a smoothness gain either way.",
           "- **The first burst's deliveries were as slow with the shapes warmed**: "
           f"{', '.join(f'{delivery_ms(lv):.2f}' for lv in first['pad'])} ms against "
           f"{', '.join(f'{delivery_ms(lv):.2f}' for lv in first['base'])} without; the later bursts "
           f"{span([delivery_ms(lv) for lv in later['pad']], '{:.2f}')} against "
           f"{span([delivery_ms(lv) for lv in later['base']], '{:.2f}')}. The eager shapes' first runs "
           "(the sixty-first session's lead) are not what makes a first burst slower; what does was not found.",
           f"- Its one clear cost: a start-up of {span(audio_s['pad'], '{:.1f}')} s for the audio thread against "
           f"{span(audio_s['base'], '{:.1f}')} (call 2: 200 shapes run once). Besides, on two servers against three: "
           f"TTFA p50 median {p50['pad']:.1f} against {p50['base']:.1f} ms, x real time median "
           f"{stats['pad']['xrt_median']:.1f} against {stats['base']['xrt_median']:.1f}, KV blocks {span(kv['pad'])} "
           f"against {span(kv['base'])}: too few servers to call these costs.",
           "- **Removed** (e83ddea): an option that measured no gain is code to keep for nothing. The decoder's "
           "ready line keeps the audio thread's start-up as a phase of its own (c70ab76).",
           ""]
    md += _cpu_faults(res)
    md += _gpu_malloc(res)
    md += ["**Against issue 17's targets**: unchanged; results.json's headline keys stay the fifty-fifth "
           "session's. Capacity at once: the default played 128 at once smoothly in "
           f"{pooled_now[0]} of {pooled_now[1]} levels measured since the fifty-ninth session (the sixty-first "
           f"section's {pooled[0]} of {pooled[1]} and this session's {stats['base']['all_smooth']} of "
           f"{stats['base']['levels']}).", "",
           "![sixty-second session: audio deliveries of a server's first and second burst of 128, and TTFA]"
           "(results_sixty_second.png)", ""]
    _plot(levels)
    return md


def _cpu_faults(res) -> list[str]:
    """The CPU runs of shm_regions.py with page faults, glibc's malloc tunables against its defaults."""
    runs = [(load(name), v) for name, v, _ in CPU_FAULTS]
    bursts = {v: [b for d, w in runs if w == v for b in d["bursts"]] for v in ("default", "malloc")}
    firsts = {v: [d["bursts"][0] for d, w in runs if w == v] for v in bursts}
    laters = {v: [b for d, w in runs if w == v for b in d["bursts"][1:]] for v in bursts}
    med = lambda bs, f: statistics.median(f(b) for b in bs)  # noqa: E731
    model = lambda name: lambda b: by_model(b["minor_faults"])[name]  # noqa: E731
    rss = {v: [d["bursts"][-1]["resident_mib"]["decoder"] for d, w in runs if w == v and "resident_mib" in d["bursts"][-1]]
           for v in bursts}
    res["sixty_second"]["cpu_page_faults"] = {
        v: {"runs": sum(w == v for _, w in runs), "bursts": len(bs),
            "x_real_time_median": med(bs, lambda b: b["x_real_time"]),
            "x_real_time_range": [min(b["x_real_time"] for b in bs), max(b["x_real_time"] for b in bs)],
            "decoder_faults_median": med(bs, model("decoder")),
            "server_faults_first_median": med(firsts[v], model("tritonserver")),
            "server_faults_later_median": med(laters[v], model("tritonserver")),
            "delivery_ms_first_median": med(firsts[v], lambda b: b["delivery_ms"]),
            "delivery_ms_later_median": med(laters[v], lambda b: b["delivery_ms"]),
            "decoder_resident_mib_max": max(rss[v], default=None)} for v, bs in bursts.items()}
    md = ["**On the CPU** (this machine, 2 cores, the tiny checkpoint): `benchmarks/shm_regions.py --bursts 4` "
          "(a real server, four bursts of 32 streams of 40 patches) now also counts each process's minor page "
          "faults in a burst (new `benchmarks/page_faults.py`: the server and each model's stubs), and its resident "
          "memory after (runs 3-5). Two settings, a server each, five pairs one after the other (pairs 1-2 the "
          f"defaults first, 3-5 the tunables first): glibc's defaults, and `{MALLOC_ENV}` in the run's "
          "environment (the server's, its stubs' and the clients'): big blocks from the heap instead of fresh mappings, and the heap's "
          f"freed top kept. `raw/page_faults_cpu_*_{S}.json`.", "",
          "| malloc | run | x real time, bursts 1-4 | delivery ms, bursts 1-4 | decoder stub's minor faults, thousands | "
          "server's | orchestrator stubs' (tts_stream) | decoder resident MiB after burst 4 |", "|---|---|---|---|---|---|---|---|"]
    for (d, v), (_, _, i) in zip(runs, CPU_FAULTS):
        bs = d["bursts"]
        md.append(f"| {'defaults' if v == 'default' else 'tunables'} | {i} | "
                  + " / ".join(f"{b['x_real_time']:.1f}" for b in bs) + " | "
                  + " / ".join(f"{b['delivery_ms']:.2f}" for b in bs) + " | "
                  + " / ".join(f"{model('decoder')(b) / 1000:.0f}" for b in bs) + " | "
                  + " / ".join(f"{model('tritonserver')(b) / 1000:.1f}" for b in bs) + " | "
                  + " / ".join(f"{model('tts_stream')(b) / 1000:.1f}" for b in bs) + " | "
                  + (f"{bs[-1]['resident_mib']['decoder']:.0f}" if "resident_mib" in bs[-1] else "-") + " |")
    c = res["sixty_second"]["cpu_page_faults"]
    md += ["", f"- The decoder's stub (the model on the CPU) took {c['default']['decoder_faults_median'] / 1000:.0f} "
           f"thousand minor faults a burst with glibc's defaults (median), {c['malloc']['decoder_faults_median'] / 1000:.0f} "
           "thousand with the tunables: a freed tensor's pages went back to the kernel and the next one faulted them in "
           f"again. x real time, median over the bursts: {c['default']['x_real_time_median']:.1f} "
           f"({span(c['default']['x_real_time_range'], '{:.1f}')}) against {c['malloc']['x_real_time_median']:.1f} "
           f"({span(c['malloc']['x_real_time_range'], '{:.1f}')}) with the tunables; the spread between bursts "
           "on this 2-core machine is as wide as the difference. The tunables' cost is memory the heap keeps: "
           f"the decoder stub held up to {c['malloc']['decoder_resident_mib_max']:.0f} MiB resident after four "
           f"bursts, against up to {c['default']['decoder_resident_mib_max']:.0f} with the defaults.",
           "- A first burst touches pages later ones reuse, in both settings: the server took "
           f"{c['default']['server_faults_first_median'] / 1000:.1f} thousand faults in its first burst against "
           f"{c['default']['server_faults_later_median'] / 1000:.1f} thousand in later ones (median, defaults; tunables "
           f"{c['malloc']['server_faults_first_median'] / 1000:.1f} against {c['malloc']['server_faults_later_median'] / 1000:.1f}), "
           "and the audio deliveries were slower in the first burst (median "
           f"{c['default']['delivery_ms_first_median']:.2f} against {c['default']['delivery_ms_later_median']:.2f} ms, "
           f"tunables {c['malloc']['delivery_ms_first_median']:.2f} against {c['malloc']['delivery_ms_later_median']:.2f}). "
           "On the GPU the decoder's model runs on the device, so its faults there are to be measured: "
           "`run_served_gpu.sh` now passes `--server-pid` to `bench_served.py`, which records each level's minor "
           "faults by process (new).", ""]
    return md


def _gpu_malloc(res) -> list[str]:
    """The H200 runs: 128 at once, three levels a server, glibc's defaults against the tunables, a call each order."""
    md = ["**On the H200** (continued as the sixty-third session, 2026-12-04; two calls, a loop of servers each running "
          f"`SERVER_ENV=\"{MALLOC_ENV}\"` or none, `SET=\"decoder.timestep_buckets=10,100\" ARRIVALS=burst "
          "LEVELS=128,128,128 REQUESTS=3 bash benchmarks/run_served_gpu.sh`, three servers a call, the tunables in "
          "the server's environment alone; `raw/served_{default,malloc}_call*_server*_sixtythird.*`). Each level's "
          "minor faults, thousands, by process:", "",
          "| call | server | malloc | x real time, levels 1-3 | smooth % | TTFA p50 ms | tts_stream stubs' faults | "
          "server's | decoder stub's |", "|---|---|---|---|---|---|---|---|---|"]
    out = {"default": [], "malloc": []}  # each server's levels
    per_call = {}  # (call, setting) -> each server's median x real time
    for c, p, v in GPU_MALLOC:
        lvs = load(f"served_{v}_call{c}_server{p}_sixtythird.json")["levels"]
        out[v].append(lvs)
        per_call.setdefault((c, v), []).append(statistics.median(lv["x_real_time"] for lv in lvs))
        f = lambda name: " / ".join(f"{lv['minor_faults'].get(name, 0) / 1000:.0f}" for lv in lvs)  # noqa: E731
        md.append(f"| {c} | {p} | {'tunables' if v == 'malloc' else 'defaults'} | "
                  + " / ".join(f"{lv['x_real_time']:.1f}" for lv in lvs) + " | "
                  + " / ".join(f"{100 * lv['smooth_playback_frac']:.1f}" for lv in lvs) + " | "
                  + " / ".join(f"{lv['ttfa_ms']['p50']:.0f}" for lv in lvs) + f" | {f('tts_stream')} | "
                  f"{f('tritonserver')} | {f('decoder')} |")
    every = {v: [lv for lvs in servers for lv in lvs] for v, servers in out.items()}
    g = {v: {"levels": len(every[v]), "all_smooth": sum(lv["smooth_playback_frac"] == 1 for lv in every[v]),
             "x_real_time_median": statistics.median(lv["x_real_time"] for lv in every[v]),
             "tts_stream_faults_first_median": statistics.median(
                 lvs[0]["minor_faults"]["tts_stream"] for lvs in servers),
             "tts_stream_faults_later_median": statistics.median(
                 lv["minor_faults"]["tts_stream"] for lvs in servers for lv in lvs[1:])}
         for v, servers in out.items()}
    # which burst of its server each level with a dry stream was (1 = the server's first)
    dry_bursts = sorted(i + 1 for servers in out.values() for lvs in servers
                        for i, lv in enumerate(lvs) if lv["smooth_playback_frac"] < 1)
    ratios = sorted(100 * (mv / dv - 1) for c in (1, 2) for mv in per_call[(c, "malloc")]
                    for dv in per_call[(c, "default")])
    g["malloc"]["x_real_time_vs_default_same_call_pct"] = [round(ratios[0], 2), round(ratios[-1], 2)]
    res["sixty_second"]["gpu_malloc"] = g
    d, m = g["default"], g["malloc"]
    md += ["", f"- Every stream smooth in {m['all_smooth']} of {m['levels']} levels with the tunables, "
           f"{d['all_smooth']} of {d['levels']} with the defaults; x real time median {m['x_real_time_median']:.1f} "
           f"against {d['x_real_time_median']:.1f} pooled over both calls; within a call, a tunables server's median "
           f"against a defaults server's: {span(ratios, '{:+.1f}')}%.",
           "- On the GPU the decoder's stub hardly faults after its first burst; the faults are the orchestrator's "
           "stubs' and the server's, which pass the audio on. A first burst of 128 costs "
           f"~{d['tts_stream_faults_first_median'] / 1000:.0f} thousand faults in the tts_stream stubs with either "
           "setting (pages touched for the first time, which no malloc setting avoids), later bursts "
           f"{d['tts_stream_faults_later_median'] / 1000:.0f} thousand with the defaults and "
           f"{m['tts_stream_faults_later_median'] / 1000:.0f} thousand with the tunables.",
           "- **Not adopted**: no gain in smooth playback, and a first burst faults the same either way. Here no "
           "first burst left a stream dry (the levels that did were their servers' bursts "
           f"{', '.join(map(str, dry_bursts))}), unlike the sixty-first session's first bursts. Pre-touching the stubs' and the server's buffers at start-up is the lead the "
           "counts point at (not built).", ""]
    return md


def _plot(levels: dict):
    """Left: each server's audio delivery ms in its first and second burst of 128, by code. Right: the levels'
    TTFA p50 and p95."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.3))
    for r in RUNS:
        name, colour = CODES[r[2]][1:]
        a.plot([1, 2], [delivery_ms(lv) for lv in levels[r]], "o-", color=colour,
               label=name if r == next(x for x in RUNS if x[2] == r[2]) else None)
        b.scatter([lv["ttfa_ms"]["p50"] for lv in levels[r]], [lv["ttfa_ms"]["p95"] for lv in levels[r]],
                  color=colour, s=36, label=name if r == next(x for x in RUNS if x[2] == r[2]) else None)
    a.set_xticks([1, 2])
    a.set_xlabel("the server's burst of 128 streams (1: its first)")
    a.set_ylabel("audio delivery, ms each")
    a.legend(fontsize=8)
    b.set_xlabel("TTFA p50 ms")
    b.set_ylabel("TTFA p95 ms")
    b.legend(fontsize=8)
    save_panels(fig, [a, b], "sixty-second session (H200): 128 streams at once, 3 requests a stream; "
                "audio_eager_pad against the default", "results_sixty_second.png")
