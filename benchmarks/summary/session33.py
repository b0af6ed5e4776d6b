"""results.md: the thirty-third session's section, and results_thirty_third.png."""

import gzip
import os
import statistics

from summary.plots import pyplot, save_panels
from summary.raw import HERE, load, served_row


# the thirty-third session's servers, in the order they ran: (label, raw file, call)
SERVERS_33 = (("session start", "served_thirtythird_call1.json", 1),
              ("session start, GIL switch 5 ms", "served_thirtythird_switch5.json", 2),
              ("session start, GIL switch 0.5 ms", "served_thirtythird_switch0.5.json", 2),
              ("session start (A/B)", "served_thirtythird_ab_before.json", 3),
              ("inputs once, int key, list prompt (A/B)", "served_thirtythird_ab_after.json", 3),
              ("final: + run dir path cached", "served_thirtythird_final.json", 4))


def _exec_probe(name: str) -> dict:
    """raw/<name> (.gz too), one line per decoder execute() from raw/decoder_exec_probe_thirtythird.patch (or
    its first form, wall time only): medians of the wall and thread CPU ms and of each segment's ms."""
    path = os.path.join(HERE, "raw", name)
    with (gzip.open(path, "rt") if name.endswith(".gz") else open(path)) as f:
        rows = [line.split() for line in f if line.strip()]
    out = {"executes": len(rows), "wall_ms": statistics.median(float(r[1]) * 1e3 for r in rows)}
    if len(rows[0]) > 3 and "=" not in rows[0][2]:
        out["cpu_ms"] = statistics.median(float(r[2]) * 1e3 for r in rows)
        segs: dict = {}
        for r in rows:
            prev = 0.0
            for kv in r[4:]:
                k, v = kv.split("=")
                segs.setdefault(k, []).append(float(v) * 1e3 - prev)
                prev = float(v) * 1e3
        out["segments_ms"] = {k: statistics.median(v) for k, v in segs.items()}
    return out


def thirty_third_session(res) -> list[str]:
    """2026-11-30 (issue 17): partial steps counted (voxcpm_engine_decode_rows_total, closed_loop.py's launches by
    rows), the decoder's execute() timed and shortened, six servers over four calls. Sets
    res["thirty_third"], returns the markdown, draws results_thirty_third.png."""
    servers = []
    for label, name, call in SERVERS_33:
        d = load(name)
        for lv in d["levels"]:
            dec = lv["server_models"]["decoder"]
            servers.append({"server": label, "call": call, "streams": lv["concurrency"], **served_row(lv),
                            "execute_ms": dec["infer_ms_per_execution"], "queued_ms": dec["queue_ms_per_request"],
                            "client_cpu_per_s": lv.get("client_cpu_per_s"), "waves": _waves(lv),
                            "first_wave_ttfa_ms": [1e3 * f(s_["ttfa_s"] for s_ in lv["streams"] if s_["index"] == 0)
                                                   for f in (min, max)]})
    loop = load("closed_loop_thirtythird.json")["levels"]
    launches = {n: loop[str(n)]["behind"]["rounds"][0]["launch_rows"] for n in (8, 64)}
    loop_steps = {n: loop[str(n)]["behind"]["rounds"][0]["engine_steps"] for n in (8, 64)}
    loop_xrt = {n: loop[str(n)]["behind"]["rounds"][0]["x_real_time"] for n in (8, 64)}
    probes = {"switch 5 ms": _exec_probe("exec_thirtythird_switch5.txt"),
              "switch 0.5 ms": _exec_probe("exec_thirtythird_switch0.5.txt"),
              "A/B after": _exec_probe("exec_thirtythird_ab_after.txt.gz")}
    res["thirty_third"] = {"device": "NVIDIA H200", "servers": servers, "closed_loop_launch_rows": launches,
                           "closed_loop_steps": loop_steps, "closed_loop_x_real_time": loop_xrt,
                           "execute_probes": probes}
    at = lambda label, n: next(x for x in servers if x["server"] == label and x["streams"] == n)  # noqa: E731
    start = [x for x in servers if x["server"].startswith("session start")]
    rng = lambda n, k, f: f"{min(x[k] for x in start if x['streams'] == n):{f}}-{max(x[k] for x in start if x['streams'] == n):{f}}"  # noqa: E731
    fin = "final: + run dir path cached"
    steps_all = [x["steps"] for x in servers]
    md = ["", "## Thirty-third session (2026-11-30, H200): the decoder's intake does less work per request; "
          "partial steps counted, unchanged by it", "",
          "Four device calls (about 26 of 30 min). The served figures trail the closed loop in process by a few "
          "percent, and this session looked for why on the request path, not the GPU. The decoder now publishes "
          "`voxcpm_engine_decode_rows_total` (request rows in its decode steps; over `voxcpm_engine_decode_steps_total`, "
          "the mean batch), `bench_served.py` records both per level (and its own CPU time per second), and "
          "`closed_loop.py` each round's launches by rows.", "",
          "**Partial steps** (call 1: `SET=\"decoder.timestep_buckets=10,100\" LEVELS=8,64 REQUESTS=5 bash "
          "benchmarks/run_served_gpu.sh` on the session's starting code (its first commit, 6486c4b, which adds only the "
          "rows counter and these records), then `closed_loop.py --checkpoint /tmp/full "
          "--clients 8,64 --requests 3 --rounds 1 --settings behind`; `raw/served_thirtythird_call1.{json.gz,log}`, "
          "`raw/closed_loop_thirtythird.{json,log}`).",
          f"- Served, each stream's five 100-step requests need 500 full steps (a few more for the start). The "
          f"servers of this session ran {min(steps_all):.0f}-{max(steps_all):.0f} at both levels: "
          f"{at('session start', 8)['rows_per_step']:.2f} rows a step at 8 streams and "
          f"{at('session start', 64)['rows_per_step']:.2f} at 64 (call 1).",
          f"- In process: {loop_steps[8]} steps for 3 waves at 8 clients, {launches[8]['8']} of them full; "
          f"{loop_steps[64]} at 64 clients, {launches[64]['64']} full.",
          "- The waves drift apart. Requests of one wave, ms between the first and the last (start / end at the "
          "client), in call 1 and in call 4 (the final code):", ""]
    md += ["| call | streams | " + " | ".join(f"wave {i}" for i in range(5)) + " |", "|---|---|" + "---|" * 5]
    for label, call in (("session start", 1), (fin, 4)):
        for n in (8, 64):
            md.append(f"| {call} | {n} | " + " | ".join(f"{a:.0f} / {b:.0f}" for a, b in at(label, n)["waves"]) + " |")
    first = at("session start", 8)["first_wave_ttfa_ms"]
    md += ["", f"  At 8 streams the first wave's requests left the client within "
           f"{at('session start', 8)['waves'][0][0]:.0f} ms; their first audio came {first[0]:.0f}-{first[-1]:.0f} ms "
           "later. A client sends its next request when its last audio has come, so each wave starts as spread as "
           "the one before ended: the later waves kept the spread.",
           f"- One suspect: the decoder has one instance, and Triton said each `execute()` took "
           f"{at('session start', 8)['execute_ms']:.2f} ms at 8 streams and {at('session start', 64)['execute_ms']:.2f} "
           f"at 64, one after the other: 64 requests need about "
           f"{64 * at('session start', 64)['execute_ms']:.0f} ms to get in, some 9 steps.", "",
           "**The interpreter's switch interval** (call 2, two servers, `VOXCPM_SWITCH_INTERVAL_MS` 5 and 0.5 through a "
           "first form of the probe below, wall time only, not kept; `raw/served_thirtythird_switch{5,0.5}.json.gz`, "
           "`raw/exec_thirtythird_switch*.txt`): "
           f"execute() took {probes['switch 5 ms']['wall_ms']:.2f} and {probes['switch 0.5 ms']['wall_ms']:.2f} ms "
           "(median, timed inside it), the steps "
           + " and ".join(f"{at(f'session start, GIL switch {v}', 8)['steps']:.0f} / "
                          f"{at(f'session start, GIL switch {v}', 64)['steps']:.0f}" for v in ("5 ms", "0.5 ms"))
           + " (8 / 64 streams). A shorter switch interval did not shorten it: the time is mostly the body's own "
           "work (below: most of it on the thread's CPU).", "",
           "**Kept: less work per request in `execute()`.**",
           "- Inputs are read once (`triton_io.arrays`): each `get_input_tensor_by_name` lists every input again, and "
           "the decoder asked for 13.",
           "- The request's noise key is computed on a Python int (`noise.request_key` takes one; `tests/test_noise.py` "
           "holds it to the int64 tensor form over the seed range's edges), not with 37 tensor ops.",
           "- `build_prompt` makes its tensors from Python lists: five ops instead of eleven for a text-only prompt. The "
           "same tensors: `tests/test_prompt.py` (new) checks every position in the four modes, and the old function "
           "passes it too; `tests/test_model_parity.py` holds generations to the reference. Features of another shape "
           "are refused (ValueError) where they would now broadcast.",
           "- The run directory's real path, against which every request's counting inbox is checked, is worked out once "
           "(`runtime.run_dir_realpath`), not with a read of `/proc`, a `makedirs` and a second `realpath` per request.",
           f"- A probe inside `execute()` (`raw/decoder_exec_probe_thirtythird.patch`, call 3, before the last item): "
           f"{probes['A/B after']['wall_ms']:.2f} ms wall, {probes['A/B after']['cpu_ms']:.2f} ms of the thread's CPU "
           "(median): the host's CPU is slow, the work is real. Segments: "
           + ", ".join(f"{k} {v:.2f}" for k, v in probes["A/B after"]["segments_ms"].items())
           + " ms (\"counting\" is the key check and the counting sender, where the path lookups were).", "",
           "**Six servers, four calls** (the same command as call 1; call 3 ran this session's code first, then the "
           "start's through `VOXCPM_PYTHON_BACKEND`, `raw/served_thirtythird_ab_{after,before}.json.gz`; call 4 the "
           "final code, `raw/served_thirtythird_final.{json.gz,log}`). Execute and queued: Triton's statistics for the "
           "decoder, ms per request:", "",
           "| call | server | streams | execute ms | queued ms | TTFA p50 / p95 ms | steps | rows a step | x real time "
           "| smooth |", "|---|---|---|---|---|---|---|---|---|---|"]
    for x in servers:
        md.append(f"| {x['call']} | {x['server']} | {x['streams']} | {x['execute_ms']:.2f} | {x['queued_ms']:.2f} | "
                  f"{x['ttfa_p50']:.1f} / {x['ttfa_p95']:.1f} | {x['steps']:.0f} | {x['rows_per_step']:.2f} | "
                  f"{x['x_real_time']:.1f} | {100 * x['smooth']:.0f}% |")
    f8, f64 = at(fin, 8), at(fin, 64)
    ab_b8, ab_b64 = at("session start (A/B)", 8), at("session start (A/B)", 64)
    ab_a8, ab_a64 = at("inputs once, int key, list prompt (A/B)", 8), at("inputs once, int key, list prompt (A/B)", 64)
    md += ["",
           f"- `execute()`, paired in call 3 (before the path cache): {ab_b8['execute_ms']:.2f} -> "
           f"{ab_a8['execute_ms']:.2f} ms at 8 streams, {ab_b64['execute_ms']:.2f} -> {ab_a64['execute_ms']:.2f} at 64 "
           f"({ab_b8['execute_ms'] / ab_a8['execute_ms']:.1f}x and {ab_b64['execute_ms'] / ab_a64['execute_ms']:.1f}x). "
           f"The final code, one run without a pair in its call: {f8['execute_ms']:.2f} and {f64['execute_ms']:.2f} ms "
           f"(the session's start in four: {rng(8, 'execute_ms', '.2f')} and {rng(64, 'execute_ms', '.2f')}). At 64 "
           f"streams a request waited {f64['queued_ms']:.1f} ms for it ({rng(64, 'queued_ms', '.1f')}).",
           f"- First audio at 64 streams: p50 {f64['ttfa_p50']:.1f} ms, p95 {f64['ttfa_p95']:.1f} "
           f"(start: {rng(64, 'ttfa_p50', '.1f')} and {rng(64, 'ttfa_p95', '.1f')}); at 8, p50 {f8['ttfa_p50']:.1f} "
           f"({rng(8, 'ttfa_p50', '.1f')}). One run of the final code.",
           f"- The steps did not move: {f8['steps']:.0f} and {f64['steps']:.0f} in the final run, "
           f"{min(steps_all):.0f}-{max(steps_all):.0f} over all six. The final run's first wave ended less spread "
           "(the wave table), its later waves not: the intake's time is not what keeps the steps partial in these runs.",
           f"- Throughput: {f8['x_real_time']:.1f}x at 8 streams and {f64['x_real_time']:.1f}x at 64, one run, against "
           f"{rng(8, 'x_real_time', '.1f')} and {rng(64, 'x_real_time', '.1f')} for four servers of the starting code (one "
           "with the 0.5 ms switch interval). The "
           "call-3 A/B, before the path cache, was even "
           f"({at('inputs once, int key, list prompt (A/B)', 8)['x_real_time']:.1f} against "
           f"{at('session start (A/B)', 8)['x_real_time']:.1f}, "
           f"{at('inputs once, int key, list prompt (A/B)', 64)['x_real_time']:.1f} against "
           f"{at('session start (A/B)', 64)['x_real_time']:.1f}): no throughput gain is claimed.",
           f"- The client is not the limit: it used {f8['client_cpu_per_s']:.2f} and {f64['client_cpu_per_s']:.2f} s of "
           "CPU per second at 8 and 64 streams (call 4).", "",
           "**Targets** (issue 17), unchanged: TTFA p50 (22.4 ms, the twenty-eighth session), 64 streams 100% smooth "
           f"with TTFA p95 under 300 ms ({f64['ttfa_p95']:.0f} ms now) and capacity 128 (Poisson) stay met. Missed: "
           f"8 streams {f8['x_real_time']:.1f}x (150), 64 streams {f64['x_real_time']:.1f}x (500), one-stream RTF 0.043 "
           "(0.025), served over engine about 0.80 (0.85).",
           f"- What this leaves: the served levels run {100 * (f8['steps'] / 500 - 1):.0f}% (8 streams) and "
           f"{100 * (f64['steps'] / 500 - 1):.0f}% (64) more steps than 500, the full steps their requests need; the "
           "closed loop in process about 3% and 4%. Were every step full at the same cost per step, the final run would "
           f"make {f8['x_real_time'] * f8['steps'] / 500:.0f}x and {f64['x_real_time'] * f64['steps'] / 500:.0f}x; a "
           "partial step costs at most what a full one does (less where it runs in a smaller batch bucket), so those "
           "are upper bounds. Where the "
           "first wave's spread comes from beyond the intake (the "
           "first request starting alone, prefills a step apart) was not measured, nor what re-aligning the waves "
           "would give.", "",
           "![thirty-third session: the decoder's intake](results_thirty_third.png)", ""]
    _plot_thirty_third(servers)
    return md


def _waves(lv) -> list:
    """Per request index (wave): ms between the first and the last start, and between the first and the last end."""
    out = []
    for i in sorted({s["index"] for s in lv["streams"]}):
        w = [s for s in lv["streams"] if s["index"] == i]
        out.append((1e3 * (max(s["start_s"] for s in w) - min(s["start_s"] for s in w)),
                    1e3 * (max(s["end_s"] for s in w) - min(s["end_s"] for s in w))))
    return out


def _plot_thirty_third(servers):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    labels = [label for label, *_ in SERVERS_33]
    colors = ["#bbb", "#aaa", "#999", "#888", "#6a6", "#286"]
    xs = range(len(labels))
    for ax, key, title in ((axes[0], "execute_ms", "decoder execute(), ms per request (Triton)"),
                           (axes[1], "ttfa_p95", "first audio p95, ms"),
                           (axes[2], "steps", "decode steps in the level (500: every step full)")):
        for j, n in enumerate((8, 64)):
            ys = [next(x[key] for x in servers if x["server"] == label and x["streams"] == n) for label in labels]
            for i, y in enumerate(ys):
                ax.bar(i + (j - 0.5) * 0.4, y, 0.38, color=colors[i], hatch="//" if n == 64 else None,
                       edgecolor="k", lw=0.3)
        ax.set_xticks(list(xs), [f"{i + 1}" for i in xs])
        ax.set_xlabel("server (left bar 8 streams, hatched 64)")
        ax.set_title(title, fontsize=9)
    axes[2].set_ylim(480, 540)
    axes[2].axhline(500, color="k", lw=0.8, ls="--")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors]
    axes[0].legend(handles, [f"{i + 1}: {label}" for i, label in enumerate(labels)], fontsize=6, loc="upper right")
    save_panels(fig, axes, "Thirty-third session, NVIDIA H200, 2026-11-30", "results_thirty_third.png")
