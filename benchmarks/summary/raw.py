"""Readers of benchmarks/raw/, and the small helpers several sessions' sections share."""

import gzip
import json
import os
import re
import statistics

from bench_served import parse_metric_samples


HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # benchmarks/
AUDIO_S_PER_STEP = 0.16  # a decode step's audio: a patch of 4 latent frames at 25 Hz


def load(name):
    """raw/<name>, or raw/<name>.gz: served runs' JSON over 250 KB is kept gzipped (the device tool carries
    the working tree and the tritonserver bundle in 64 MiB); sections may cite such a file without its .gz."""
    path = os.path.join(HERE, "raw", name)
    with (open(path) if os.path.exists(path) else gzip.open(path + ".gz", "rt")) as f:
        return json.load(f)


def model_config() -> dict:
    """benchmarks/voxcpm2_config.json: the full-size model's config, the benchmarks' checkpoint."""
    with open(os.path.join(HERE, "voxcpm2_config.json")) as f:
        return json.load(f)


def layer_weights(h: int, heads: int, kv: int, d: int, ffn: int) -> tuple[int, int]:
    """A decoder layer's weight counts (hidden h, heads query and kv key/value heads of d, gated MLP of
    ffn): (its QKV projection, its output projection and MLP)."""
    return h * (heads + 2 * kv) * d, heads * d * h + 3 * h * ffn


def text(name) -> str:
    """raw/<name> as text (a log, a test run's output)."""
    with open(os.path.join(HERE, "raw", name)) as f:
        return f.read()


def metric_value(name: str, metric: str) -> float:
    """A metric's one sample in raw/<name>, a metrics file (a single decoder instance)."""
    return next(v for m, _, v in parse_metric_samples(text(name)) if m == metric)


def tests_passed(name) -> str:
    """A pytest run's output (raw/<name>) -> its last summary, up to its time ("12 passed, 3 deselected")."""
    return re.findall(r"(\d+ passed[^\n]*?) in ", text(name))[-1]


def layer_us(name) -> dict:
    """kernel_fused_layer.py's whole-layer timings (raw/<name>) -> {tokens: {variant: us per layer}}."""
    return {r["M"]: {k: v["us_per_layer"] for k, v in r.items() if isinstance(v, dict) and "us_per_layer" in v}
            for r in load(name)["layers"] if "M" in r}


def phase_spans(profile: dict) -> dict:
    """A persistent layer's phase profile (`kernel_fused_layer.phase_summary`'s) -> {phase: span us}."""
    return {p["phase"]: p["span_us"] for p in profile["phases"]}


def engine_loop_run(name) -> dict:
    """engine_loop.py's first request (raw/<name>) -> its steps/s, median GPU ms per step, engine ready s."""
    d = load(name)
    run = d["runs"][0]
    return {"steps_per_s": run["steps_per_s_whole_request"], "gpu_step_ms": run["median"]["gpu_step_ms"],
            "ready_s": d["ready_s"]}


def gpu_check_passed(g: dict) -> bool:
    """gpu_check.py's JSON (loaded): the teacher-forced check and every graph-against-eager check passed."""
    return g["teacher_forced"]["pass"] and all(x["pass"] for x in g["graph_vs_eager"].values()) \
        and g["prefill_graph_vs_eager"]["pass"]


def gpu_check_record(g: dict) -> dict:
    """gpu_check.py's JSON (loaded) as results.json keeps it: the least teacher-forced cosine, the largest
    graph-against-eager difference, and whether every check passed."""
    return {"teacher_forced_cosine_min": g["teacher_forced"]["cosine_min"],
            "graph_vs_eager_max_abs": max(x["max_abs"] for x in g["graph_vs_eager"].values()),
            "pass": gpu_check_passed(g)}


def gpu_test_summaries(name) -> dict:
    """raw/<name>, one line per GPU test file ("file: pytest's last line"; "#" and "[" lines are notes) ->
    {file: its last line}."""
    return dict(line.split(": ", 1) for line in text(name).splitlines()
                if not line.startswith(("#", "[")) and ": " in line)


def test_counts(summaries) -> tuple[int, int, int]:
    """pytest summary lines -> (passed, skipped, failed or errors) over them all."""
    count = lambda word: sum(int(m) for s in summaries for m in re.findall(rf"(\d+) {word}", s))  # noqa: E731
    return count("passed"), count("skipped"), count("failed") + count("error")


def gpu_check_sentence(check: dict) -> str:
    """A markdown bullet: `gpu_check.py --checkpoint /tmp/full --timestep-buckets 10,100` (its loaded JSON) passing."""
    vae = check["vae_graphs_vs_eager"]
    return (f"- `gpu_check.py --checkpoint /tmp/full --timestep-buckets 10,100` passes every check: bf16 against fp32 "
            f"teacher-forced cosine min {check['teacher_forced']['cosine_min']:.5f}; graph replay against the eager "
            f"step max abs {gpu_check_record(check)['graph_vs_eager_max_abs']:.1f} at batches "
            f"{', '.join(check['graph_vs_eager'])}; the VAE's graphs against eager "
            f"{vae['graph_vs_eager_max_abs']:.1f}, the VAE as served against exact fp32 {vae['served_vs_exact_fp32_max_abs']:.2e} (bound "
            f"{vae['served_bound']:.0e}).")


def served_table(served: dict, prev: dict | None = None, prev_label: str = "") -> list[str]:
    """A markdown table of served levels ({streams: level}); with prev, an earlier run's figures ({streams:
    `served_summary`}) in a last column headed prev_label."""
    head = ["| streams | requests | errors | x real time | RTF p50 | TTFA p50 / p95 ms | smooth |",
            "|---|---|---|---|---|---|---|"]
    rows = [f"| {n} | {len(lv['streams'])} | {lv['errors']} | {lv['x_real_time']:.2f} | {lv['rtf']['p50']:.4f} "
            f"| {lv['ttfa_ms']['p50']:.1f} / {lv['ttfa_ms']['p95']:.1f} | {lv['smooth_playback_frac']:.0%} |"
            for n, lv in served.items()]
    if prev:
        head = [head[0] + f" {prev_label} |", head[1] + "---|"]
        rows = [row + f" {prev[n]['xrt']:.2f}x, RTF {prev[n]['rtf_p50']:.4f} |" for row, n in zip(rows, served)]
    return head + rows


def served_summary(lv) -> dict:
    """One served level's figures as results.json keeps them in a sweep."""
    return {"xrt": lv["x_real_time"], "smooth": lv["smooth_playback_frac"], "ttfa_ms_p50": lv["ttfa_ms"]["p50"],
            "ttfa_ms_p95": lv["ttfa_ms"]["p95"], "rtf_p50": lv["rtf"]["p50"], "streams": len(lv["streams"]),
            "errors": lv["errors"]}


def served_levels(name):
    return {lv["concurrency"]: lv for lv in load(name)["levels"]}


def served_row(lv) -> dict:
    """One served level's headline figures, with the decoder's steps over it (bench_served.py's level)."""
    return {"x_real_time": lv["x_real_time"], "ttfa_p50": lv["ttfa_ms"]["p50"], "ttfa_p95": lv["ttfa_ms"]["p95"],
            "smooth": lv["smooth_playback_frac"], "errors": lv["errors"], "steps": lv["decoder_steps"]["steps"],
            "rows_per_step": lv["decoder_steps"]["rows_per_step"]}


def served_ms_per_step(lv) -> float:
    """A served level's wall time over the decoder's steps in it, ms (not a step's GPU time)."""
    return 1000 * lv["wall_s"] / lv["decoder_steps"]["steps"]


def served_xrt(name):
    """Aggregate x real time by concurrency, from a served run."""
    return {c: lv["x_real_time"] for c, lv in served_levels(name).items()}


def engine_runs(name, key="aggregate_xrt"):
    """`key` by batch, from an offline run's graph engine."""
    return {x["batch"]: x[key] for x in load(name)["engine"]["graphs"]["runs"]}


def served_cell(lv) -> str:
    """A served level as "smooth / x real time / TTFA p95" in a table cell."""
    return (f"{lv['smooth_playback_frac']:.0%} / {lv['x_real_time']:.0f} / {lv['ttfa_ms']['p95']:.0f}")


def served_step_levels(name) -> dict:
    """A served run -> {streams: `served_row` with its RTF p50 and wall ms per decoder step} (`served_step_table`)."""
    return {n: {**served_row(lv), "rtf_p50": lv["rtf"]["p50"], "ms_per_step": served_ms_per_step(lv)}
            for n, lv in served_levels(name).items()}


def served_step_run(call: int, name: str) -> tuple[dict, list[str]]:
    """A `run_served_gpu.sh` run at 1 and 64 streams (raw/<name>, gzipped, and its log) -> its
    `served_step_levels`, and markdown: which call ran what, then `served_step_table`."""
    served = served_step_levels(f"{name}.json")
    return served, [f"**Served** (call {call}: `SET=\"decoder.timestep_buckets=10,100\" LEVELS=1,64 REQUESTS=5 bash "
                    f"benchmarks/run_served_gpu.sh`, `raw/{name}.{{json.gz,log}}`):", "", *served_step_table(served)]


def served_step_table(served: dict) -> list[str]:
    """`served_step_levels` as a markdown table."""
    return ["| streams | x real time | RTF p50 | TTFA p50 / p95 ms | smooth | wall ms per decoder step |",
            "|---|---|---|---|---|---|"] + [
        f"| {n} | {r['x_real_time']:.2f} | {r['rtf_p50']:.4f} | {r['ttfa_p50']:.1f} / {r['ttfa_p95']:.1f} | "
        f"{100 * r['smooth']:.0f}% | {r['ms_per_step']:.2f} |" for n, r in served.items()]


def headline_keys(one: dict, many: dict, source: str) -> dict:
    """results.json's one-stream and 64-stream headline keys from served levels at 1 and 64 streams."""
    return {"ttfa_ms_p95_c64": many["ttfa_ms"]["p95"], "smooth_frac_c64": many["smooth_playback_frac"],
            "aggregate_xrt_c64": many["x_real_time"], "single_stream_rtf_triton": one["rtf"]["p50"],
            "ttfa_ms_p50": one["ttfa_ms"]["p50"], "ttfa_ms_p95": one["ttfa_ms"]["p95"],
            "served_headline_source": source}


def set_served_headline(res, burst: dict, cap: dict, source: str):
    """The served headline keys of results.json from a sweep: its burst levels and its capacity."""
    res.update({**headline_keys(burst[1], burst[64], source), "aggregate_xrt_c128": burst[128]["x_real_time"],
                "capacity_streams": cap})


def closed_loop_rounds(name: str) -> dict:
    """closed_loop.py's JSON -> {clients: {setting: {"xrt": [x real time per round], "ms": [ms per engine
    step per round], "ttfa_p50": the rounds' median first audio p50}}}."""
    levels = load(name)["levels"]
    return {int(n): {s: {"xrt": [r["x_real_time"] for r in v["rounds"]],
                         "ms": [r["ms_per_engine_step"] for r in v["rounds"]],
                         "ttfa_p50": statistics.median(r["first_audio_ms_p50"] for r in v["rounds"])}
                     for s, v in lv.items() if isinstance(v, dict)} for n, lv in levels.items()}


def ms_per_step_for(level: dict, target: float) -> float:
    """The engine's ms per step at which a closed-loop level (`closed_loop.py`: x_real_time, and
    ms_per_engine_step, its round's wall time over its steps) would make `target` x real time, the
    round's time taken in proportion to its steps' (the thirtieth session corrected the twenty-ninth's
    figures, which held each request's time over its 100 steps fixed and so understated the distance)."""
    return level["ms_per_engine_step"] * level["x_real_time"] / target


def vae_precision_log_runs(text: str) -> list:
    """vae_precision.py's log -> [(variant, {"8x4", "64x4", "64x16": ms per call, "gpu": GPU ms of a 64 x 4
    call})] in the order run (its JSON keeps one entry per variant name)."""
    runs = []
    for line in text.splitlines():
        m = re.match(r"\[(\S+)\]\s+(\d+) streams x\s+(\d+) patches:\s+([\d.]+) ms", line)
        if m:
            if not runs or runs[-1][0] != m.group(1) or "gpu" in runs[-1][1]:
                runs.append((m.group(1), {}))
            runs[-1][1][f"{m.group(2)}x{m.group(3)}"] = float(m.group(4))
        m = re.match(r"\[(\S+)\] profile 64 x 4: ([\d.]+) ms GPU", line)
        if m:
            runs[-1][1]["gpu"] = float(m.group(2))
    return runs


def gpu_correctness(session: str, tests: dict, check: dict) -> tuple[dict, list[str]]:
    """A session's call 1 in the sixty-eighth session's form (each GPU test file in its own pytest process, gpu_check
    beside them; raw names gpu_tests_*_<session>, gpu_check_<session>) -> (its results.json keys, its markdown)."""
    vae = check["vae_graphs_vs_eager"]
    keys = {"gpu_tests": tests,
            "gpu_check": gpu_check_record(check) | {"vae_served_vs_exact_fp32": vae["served_vs_exact_fp32_max_abs"],
                                                    "vae_pass": vae["pass"]}}
    passed, skipped, failed = test_counts(tests.values())
    md = ["", f"**GPU correctness** (call 1, the sixty-eighth session's call 1: each GPU test file in its own pytest "
          f"process, side by side, `gpu_check.py` beside them; `raw/gpu_tests_summary_{session}.txt`, "
          f"`raw/gpu_tests_<file>_{session}.txt`, `raw/gpu_check_{session}.{{json,log}}`): {passed} passed, "
          f"{skipped} skipped, {failed} failed.", "",
          "| test file | result |", "|---|---|"]
    md += [f"| `tests/test_{f}.py` | {r} |" for f, r in tests.items()]
    return keys, md + ["", gpu_check_sentence(check)]


def served_record(served: dict) -> dict:
    """results.json's figures of a 1- and 64-stream served run (served_levels' {streams: level})."""
    one, c64 = served[1], served[64]
    return {"served_rtf_p50_c1": one["rtf"]["p50"], "served_ttfa_p50_ms_c1": one["ttfa_ms"]["p50"],
            "served_xrt_c64": c64["x_real_time"], "served_smooth_c64": c64["smooth_playback_frac"],
            "served_ttfa_p95_ms_c64": c64["ttfa_ms"]["p95"]}


def supervised_gpu_run(s: str, commit: str, tests_note: str = "", drain_end: str = "") -> tuple[dict, dict, list[str]]:
    """The closing GPU call of a session (`raw/devrun_<s>.sh`): the GPU tests file by file, gpu_check.py, and
    run_served_gpu.sh's 1- and 64-stream burst with the drain under the supervisor. -> (results.json's record,
    the served levels {streams: level}, the markdown bullets); tests_note follows the test files' raw name,
    drain_end ends the drain's bullet."""
    chk = load(f"gpu_check_{s}.json")
    tests = [line for line in text(f"gpu_tests_{s}.txt").splitlines() if line and not line.startswith("#")]
    served = served_levels(f"served_supervised_{s}.json")
    drain = load(f"drain_{s}.json")
    one, c64 = served[1], served[64]
    passed = sum(int(t.split(": ")[1].split(" passed")[0]) for t in tests)
    record = {"device": chk["device"], "commit": commit, "gpu_test_files": len(tests), "gpu_tests_passed": passed,
              "gpu_check_pass": all(v["pass"] for k, v in chk.items() if isinstance(v, dict) and "pass" in v)
              and all(g["pass"] for g in chk["graph_vs_eager"].values()),
              "teacher_forced_cosine_min": chk["teacher_forced"]["cosine_min"],
              **served_record(served),
              "drain": {k: drain[k] for k in ("streams", "ended_shutting_down", "supervisor_exit_s",
                                              "tritonserver_exit_code", "exit_timeout_expired", "crashes")}}
    bullets = [
        f"- **GPU tests**, each file in its own pytest process: {len(tests)} files, {passed} passed, no failure "
        f"(`raw/gpu_tests_{s}.txt`{tests_note}).",
        f"- **`gpu_check.py`** (`raw/gpu_check_{s}.{{json,log}}`): bf16 against fp32 teacher-forced cosine min "
        f"{chk['teacher_forced']['cosine_min']:.5f}; decode graphs against eager max abs 0 at batches "
        f"{', '.join(chk['graph_vs_eager'])}; prefill graph max abs {chk['prefill_graph_vs_eager']['max_abs']:.0f}; "
        f"the served VAE {chk['vae_graphs_vs_eager']['served_vs_exact_fp32_max_abs']:.2e} from exact fp32 (bound "
        f"{chk['vae_graphs_vs_eager']['served_bound']:.0e}): all pass.",
        "- **Served under the supervisor** (`SET=\"decoder.timestep_buckets=10,100\" ARRIVALS=burst LEVELS=1,64 "
        f"REQUESTS=2 DRAIN=4 bash benchmarks/run_served_gpu.sh`; `raw/served_supervised_{s}.{{json,log}}`, "
        f"`raw/drain_{s}.json`, `raw/served_supervised_{s}_tritonserver.log.gz`):", "",
        *served_table(dict(sorted(served.items()))), "",
        f"- The drain: {drain['ended_shutting_down']} of {drain['streams']} long streams ended with \"the server is "
        f"shutting down\" at {drain['ended_s']['median']:.1f} s, the supervisor was gone at "
        f"{drain['supervisor_exit_s']:.1f} s, tritonserver's exit code {drain['tritonserver_exit_code']}, "
        f"{drain['crashes']} crashes; {drain_end}",
        f"- Issue 17 on this {'H200' if 'H200' in chk['device'] else 'H100'}: one stream RTF {one['rtf']['p50']:.4f} (target 0.025: missed), TTFA p50 "
        f"{one['ttfa_ms']['p50']:.1f} ms; 64 streams at once {c64['x_real_time']:.1f}x, "
        f"{c64['smooth_playback_frac']:.0%} smooth, TTFA p95 {c64['ttfa_ms']['p95']:.0f} ms."]
    return record, served, bullets
