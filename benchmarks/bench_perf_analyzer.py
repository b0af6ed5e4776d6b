#!/usr/bin/env python3
"""perf_analyzer (Triton's own load generator, 2.51) against the served `tts_stream`: gRPC
streaming, one perf_analyzer process per concurrency level, its CSVs merged and summarised.

    python3 benchmarks/bench_perf_analyzer.py --perf-analyzer PATH --url 127.0.0.1:8001 \\
        --levels 1,8,32,64 --min-length 100 --max-length 100 --out-dir OUT
    -> OUT/perf_analyzer.csv (perf_analyzer's -f table, one row per level, --verbose-csv),
       OUT/perf_analyzer.log (each command line and its console output),
       OUT/perf_analyzer.json (the summary below)
    python3 benchmarks/bench_perf_analyzer.py --summarize OUT/perf_analyzer.csv   # CSV -> JSON only

Every request is the same: --text (bench_served.py's), SEED, MIN_LENGTH = MAX_LENGTH (patches),
written as perf_analyzer --input-data JSON (--input-data FILE sends a file's entries instead).
Measurement: each level first sends --warmup-per-stream x level requests (not measured: the
pipeline is full when the first window opens), then time windows of --interval-ms, at most
--max-trials of them, stable when the last 3 windows' throughputs are within --stability percent;
a level that does not stabilise (or sees a window without a finished request) is measured once
more in one window over --fallback-requests-per-stream x level requests (--request-count) and
flagged "stable": false; each perf_analyzer is cut off after --level-timeout seconds (that retry
after half of it + 10 s).

What perf_analyzer 2.51 reports for a decoupled model (src/inference_profiler.cc and
infer_context.cc of triton-inference-server/perf_analyzer, branch r24.10):
  * a request's latency is send -> its LAST response that carries outputs. tts_stream closes each
    stream with a flag-only final response (no outputs); perf_analyzer records that one as a
    "null" response and takes the response before it: latency = send -> last audio chunk, the
    whole utterance. It is not time to first audio (bench_served.py measures that);
  * Inferences/Second: requests (utterances) whose last response landed in the window, per
    second; Response Throughput: their responses (audio chunks, the null final not counted);
  * percentiles are over the requests of the stable windows, merged;
  * the server-side columns (queue, compute) are Triton's statistics of tts_stream's execute(),
    which returns at once for this decoupled model: the time is in "Network+Server Send/Recv".
Its console banner says "Detected decoupled model, using the first response for measuring
latency": that line is stale, the code above is what runs (tests/test_bench_served.py holds the
reported latency against first-audio and end times measured on the same server).
The JSON adds responses per request (Response Throughput / Inferences/Second: the chunks of one
utterance) and, when a probe request says how much audio one request makes, the aggregate
x real time (infer/s x audio seconds per request) and latency / audio seconds (an RTF).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

from bench_served import DEFAULT_TEXT, StreamWorker, build_inputs, positive_ints, wait_ready

LATENCY_DEFINITION = (
    "perf_analyzer 2.51, decoupled model: latency = request sent -> its last response with outputs "
    "(tts_stream's flag-only final response is a null response and is not used), i.e. the whole "
    "utterance, not time to first audio; Inferences/Second counts requests, Response Throughput "
    "their non-null responses (audio chunks)")

# CSV column -> JSON key, microseconds (perf_analyzer writes times in us)
_US_COLUMNS = {
    "Client Send": "client_send", "Network+Server Send/Recv": "network_server_send_recv",
    "Server Queue": "server_queue", "Server Compute Input": "server_compute_input",
    "Server Compute Infer": "server_compute_infer", "Server Compute Output": "server_compute_output",
    "Client Recv": "client_recv", "request/response": "request_response", "response wait": "response_wait",
}


def _num(text: str, column: str, row: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"perf_analyzer CSV row {row}: column {column!r} is not a number: {text!r}") from None


def parse_csv(text: str) -> list[dict]:
    """perf_analyzer's -f CSV (concurrency mode) -> one dict per row, sorted by concurrency.
    Times in ms; columns this does not know are kept under "other" as written."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise ValueError("perf_analyzer CSV has no data rows")
    header = list(rows[0])
    for need in ("Concurrency", "Inferences/Second", "p50 latency", "p95 latency", "p99 latency"):
        if need not in header:
            raise ValueError(f"perf_analyzer CSV has no {need!r} column (columns: {header}); "
                             "run with --concurrency-range (not --request-rate-range)")
    out = []
    for i, r in enumerate(rows, start=1):
        lv: dict = {"concurrency": int(_num(r["Concurrency"], "Concurrency", i)),
                    "infer_per_s": _num(r["Inferences/Second"], "Inferences/Second", i)}
        if "Response Throughput" in r:
            lv["responses_per_s"] = _num(r["Response Throughput"], "Response Throughput", i)
            lv["responses_per_request"] = (lv["responses_per_s"] / lv["infer_per_s"]) if lv["infer_per_s"] else None
        lat = {}
        for col, val in r.items():
            if col.endswith(" latency") and col.startswith("p"):
                lat[col.split()[0]] = _num(val, col, i) / 1000.0
        if "Avg latency" in r:
            lat["avg"] = _num(r["Avg latency"], "Avg latency", i) / 1000.0
        lv["latency_ms"] = lat
        lv["breakdown_ms"] = {key: _num(r[col], col, i) / 1000.0 for col, key in _US_COLUMNS.items() if col in r}
        known = {"Concurrency", "Inferences/Second", "Response Throughput", "Avg latency", *_US_COLUMNS}
        lv["other"] = {c: v for c, v in r.items()
                       if c not in known and not (c.startswith("p") and c.endswith(" latency"))}
        out.append(lv)
    out.sort(key=lambda lv: lv["concurrency"])
    return out


def merge_csvs(texts: list[str]) -> str:
    """One CSV with the header once and every level's rows; the headers must agree."""
    header, body = None, []
    for t in texts:
        lines = [ln for ln in t.splitlines() if ln.strip()]
        if not lines:
            continue
        if header is None:
            header = lines[0]
        elif lines[0] != header:
            raise ValueError(f"perf_analyzer CSV headers differ:\n{header}\n{lines[0]}")
        body += lines[1:]
    if header is None:
        raise ValueError("no perf_analyzer CSV to merge")
    return "\n".join([header, *body]) + "\n"


def input_data(text: str, min_length, max_length, seed) -> dict:
    """perf_analyzer --input-data JSON for one tts_stream request (the optional inputs left out
    are the model's defaults)."""
    entry = {"TEXT": {"content": [text], "shape": [1]}}
    for name, value in (("SEED", seed), ("MIN_LENGTH", min_length), ("MAX_LENGTH", max_length)):
        if value is not None:
            entry[name] = {"content": [value], "shape": [1]}
    return {"data": [entry]}


def pa_command(args, level, warmup, data_path: str, csv_path: str, request_count=None) -> list[str]:
    """One level's command line: time windows, or (request_count) one window over that many requests."""
    cmd = [args.perf_analyzer, "-m", args.model, "-u", args.url, "-i", "grpc", "--streaming",
           "--input-data", data_path, "--concurrency-range", str(level), "--warmup-request-count", str(warmup)]
    if request_count is None:
        cmd += ["--measurement-mode", "time_windows", "--measurement-interval", str(args.interval_ms),
                "--max-trials", str(args.max_trials), "--stability-percentage", str(args.stability)]
    else:
        cmd += ["--request-count", str(request_count)]
    return cmd + ["--verbose-csv", "-f", csv_path]


def run_pa(cmd: list[str], csv_path: str, timeout: float, log) -> tuple[str | None, str]:
    """Run one perf_analyzer, its output into `log`: (its CSV, "") or (None, why not)."""
    log.write(f"\n$ {shlex.join(cmd)}\n")
    log.flush()
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        out, rc = r.stdout, r.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = None
    log.write(out)
    log.write(f"# exit {rc if rc is not None else f'killed after {timeout:g} s'}, {time.monotonic() - t0:.1f} s\n")
    log.flush()
    text = ""
    if os.path.exists(csv_path):
        with open(csv_path, encoding="utf-8") as f:
            text = f.read()
    if rc == 0 and text.count("\n") >= 2:
        return text, ""
    tail = [ln.strip() for ln in out.splitlines() if ln.strip()][-2:]
    return None, (f"timed out after {timeout:g} s" if rc is None else f"exit {rc}") + \
        (": " + " / ".join(tail) if tail else "")


def probe_audio(args) -> dict:
    """The benchmark's request on a quiet server, twice (the first warms it up): seconds of audio and
    chunks it makes, time to first audio and to the end, from the second."""
    import tritonclient.grpc as grpcclient

    w = StreamWorker(args.url, args.model, timeout=600.0)
    try:
        for i in range(2):
            rec = w.run_one(build_inputs(grpcclient, args.text, args.min_length, args.max_length, args.seed),
                            f"perf-analyzer-probe-{i}")
            if rec["error"]:
                break
    finally:
        w.close()
    if rec["error"]:
        raise RuntimeError(f"probe request failed: {rec['error']}")
    return {"audio_s": rec["audio_s"], "chunks": rec["chunks"], "total_s": rec["total_s"],
            "ttfa_s": rec["ttfa_s"]}


def add_derived(levels: list[dict], audio_s) -> None:
    for lv in levels:
        if audio_s:
            lv["x_real_time"] = lv["infer_per_s"] * audio_s
            lv["latency_over_audio"] = {k: v / 1000.0 / audio_s for k, v in lv["latency_ms"].items()}


def table(levels: list[dict]) -> str:
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    lines = ["| conc | infer/s | chunks/req | p50 ms | p95 ms | p99 ms | x real time |",
             "|---|---|---|---|---|---|---|"]
    for lv in levels:
        lat = lv["latency_ms"]
        lines.append(f"| {lv['concurrency']} | {f(lv['infer_per_s'], '.2f')} "
                     f"| {f(lv.get('responses_per_request'), '.1f')} | {f(lat.get('p50'), '.0f')} | {f(lat.get('p95'), '.0f')} | {f(lat.get('p99'), '.0f')} "
                     f"| {f(lv.get('x_real_time'), '.1f')} |")
    return "\n".join(lines)


def pa_version(exe: str) -> str | None:
    try:
        r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise SystemExit(f"bench_perf_analyzer: cannot run --perf-analyzer {exe!r}: {e}") from None
    for line in (r.stdout + r.stderr).splitlines():
        if "Perf Analyzer Version" in line:
            return line.strip()
    raise SystemExit(f"bench_perf_analyzer: {exe} --version does not print a version (exit {r.returncode}):\n"
                     f"{(r.stdout + r.stderr)[-2000:]}")


def run(args) -> int:
    os.makedirs(args.out_dir, exist_ok=True)
    csv_out = os.path.join(args.out_dir, "perf_analyzer.csv")
    log_out = os.path.join(args.out_dir, "perf_analyzer.log")
    json_out = os.path.join(args.out_dir, "perf_analyzer.json")
    if os.path.exists(csv_out):  # a table from an earlier run must not pass for this one's
        os.remove(csv_out)
    version = pa_version(args.perf_analyzer)
    wait_ready(args.url, args.model, args.ready_timeout)
    probe = None
    if args.input_data is None:
        try:
            probe = probe_audio(args)  # also warms the server up before the first level
        except Exception as e:  # noqa: BLE001 - the levels still run; x real time is left out
            print(f"[perf_analyzer] {e}", file=sys.stderr)
    texts, failed, meta, started = [], [], {}, time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pa-") as tmp, open(log_out, "w", encoding="utf-8") as log:
        data_path = args.input_data
        if data_path is None:
            data_path = os.path.join(tmp, "input.json")
            with open(data_path, "w", encoding="utf-8") as f:
                json.dump(input_data(args.text, args.min_length, args.max_length, args.seed), f)
        with open(data_path, encoding="utf-8") as f:
            log.write(f"# {version}; input data: {f.read(2000).strip()}\n")
        for level in args.levels:
            print(f"[perf_analyzer] concurrency {level}", file=sys.stderr, flush=True)
            warmup = level * args.warmup_per_stream
            level_csv = os.path.join(tmp, f"c{level}.csv")
            text, why = run_pa(pa_command(args, level, warmup, data_path, level_csv), level_csv,
                               args.level_timeout, log)
            meta[level] = {"measurement": "time_windows", "stable": True}
            if text is None and not why.startswith("timed out"):
                # not stable (or a window without a finished request): one window over a fixed count
                n = max(args.fallback_requests_per_stream * level, 8)
                print(f"[perf_analyzer]   {why}; again over {n} requests", file=sys.stderr, flush=True)
                meta[level] = {"measurement": f"request_count {n}", "stable": False, "time_windows_failed": why}
                text, why = run_pa(pa_command(args, level, warmup, data_path, level_csv, request_count=n),
                                   level_csv, args.level_timeout / 2 + 10, log)
            if text is not None:
                texts.append(text)
            else:
                failed.append({"concurrency": level, "reason": why})
                print(f"[perf_analyzer]   failed: {why}", file=sys.stderr, flush=True)
    levels = []
    if texts:
        merged = merge_csvs(texts)
        with open(csv_out, "w", encoding="utf-8") as f:
            f.write(merged)
        levels = parse_csv(merged)
        add_derived(levels, probe["audio_s"] if probe else None)
        for lv in levels:
            lv.update(meta.get(lv["concurrency"], {}))
    result = {
        "tool": version,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "command": shlex.join(pa_command(args, "LEVEL", f"{args.warmup_per_stream}xLEVEL", "INPUT.json", "OUT.csv")),
        "config": {"url": args.url, "model": args.model, "levels": args.levels, "text": args.text,
                   "min_length": args.min_length, "max_length": args.max_length, "seed": args.seed,
                   "input_data": args.input_data, "interval_ms": args.interval_ms,
                   "max_trials": args.max_trials, "stability_percent": args.stability,
                   "warmup_per_stream": args.warmup_per_stream,
                   "fallback_requests_per_stream": args.fallback_requests_per_stream,
                   "level_timeout_s": args.level_timeout},
        "latency_definition": LATENCY_DEFINITION,
        "probe": probe,
        "levels": levels,
        "failed_levels": failed,
        "wall_s": time.monotonic() - started,
    }
    with open(json_out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(table(levels))
    if failed:
        print(f"[perf_analyzer] {len(failed)} level(s) without a result: "
              f"{', '.join(str(x['concurrency']) for x in failed)} (see {log_out})", file=sys.stderr)
    return 1 if failed or not levels else 0


def summarize(args) -> int:
    with open(args.summarize, encoding="utf-8") as f:
        try:
            levels = parse_csv(f.read())
        except ValueError as e:
            raise SystemExit(f"bench_perf_analyzer: {args.summarize}: {e}") from None
    add_derived(levels, args.audio_s)
    result = {"source": args.summarize, "latency_definition": LATENCY_DEFINITION, "levels": levels}
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    print(table(levels))
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--perf-analyzer", default=os.environ.get("PERF_ANALYZER_BIN", "perf_analyzer"),
                   help="the perf_analyzer executable ($PERF_ANALYZER_BIN)")
    p.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC address host:port")
    p.add_argument("--model", default="tts_stream")
    p.add_argument("--levels", default="1,8,32,64", help="comma-separated concurrency levels")
    p.add_argument("--text", default=DEFAULT_TEXT)
    p.add_argument("--min-length", type=int, default=100, help="MIN_LENGTH in patches; -1: not sent")
    p.add_argument("--max-length", type=int, default=100, help="MAX_LENGTH in patches; -1: not sent")
    p.add_argument("--seed", type=int, default=0, help="SEED; -1: not sent")
    p.add_argument("--input-data", default=None,
                   help="send this perf_analyzer input JSON instead (no probe, no x real time)")
    p.add_argument("--interval-ms", type=int, default=6000, help="measurement window")
    p.add_argument("--max-trials", type=int, default=5, help="windows per level at most (>= 3)")
    p.add_argument("--warmup-per-stream", type=int, default=1,
                   help="unmeasured requests per stream before each level's first window (0: none)")
    p.add_argument("--fallback-requests-per-stream", type=int, default=4,
                   help="a level that does not stabilise is measured once over this many requests per "
                        "stream (at least 8; --request-count), flagged stable: false")
    p.add_argument("--stability", type=float, default=30.0,
                   help="percent: the last 3 windows' max/min throughput must be within it")
    p.add_argument("--level-timeout", type=float, default=None,
                   help="seconds per level before perf_analyzer is stopped "
                        "(default: (max-trials + 1) windows + 30 s)")
    p.add_argument("--ready-timeout", type=float, default=120.0)
    p.add_argument("--out-dir", default="benchmarks/out")
    p.add_argument("--summarize", metavar="CSV", default=None,
                   help="only turn this perf_analyzer CSV into JSON (--json-out) and a table; runs nothing")
    p.add_argument("--audio-s", type=float, default=None,
                   help="with --summarize: audio seconds per request, for x real time")
    p.add_argument("--json-out", default=None, help="with --summarize: where the JSON goes")
    args = p.parse_args(argv)
    args.levels = positive_ints(p, "--levels", args.levels, "levels")
    if args.interval_ms < 100:
        p.error("--interval-ms must be >= 100")
    if args.max_trials < 3:
        p.error("--max-trials must be >= 3 (perf_analyzer judges stability over 3 windows)")
    if args.fallback_requests_per_stream < 1:
        p.error("--fallback-requests-per-stream must be >= 1")
    if args.warmup_per_stream < 0:
        p.error("--warmup-per-stream must be >= 0")
    if args.stability <= 0:
        p.error("--stability must be > 0")
    for name in ("min_length", "max_length", "seed"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            setattr(args, name, None)
    if args.min_length is not None and args.max_length is not None and args.min_length > args.max_length:
        p.error("--min-length must be <= --max-length")
    if args.input_data is not None and not os.path.isfile(args.input_data):
        p.error(f"--input-data: no such file: {args.input_data}")
    if args.level_timeout is None:
        args.level_timeout = (args.max_trials + 1) * args.interval_ms / 1000.0 + 30.0
    if args.level_timeout <= 0:
        p.error("--level-timeout must be > 0")
    if args.audio_s is not None and args.audio_s <= 0:
        p.error("--audio-s must be > 0")
    if args.summarize is not None and not os.path.isfile(args.summarize):
        p.error(f"--summarize: no such file: {args.summarize}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.summarize is not None:
        return summarize(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
