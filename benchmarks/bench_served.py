#!/usr/bin/env python3
"""Concurrent gRPC streaming load generator for the served `tts_stream` model.

Each concurrency level starts C workers together (a barrier): every worker owns
one gRPC client and one bidirectional stream and sends its requests one after
the other on it (the next when the previous one's final response arrived).
With `--arrivals burst` (default) every worker sends its first request at the
barrier; with `--arrivals poisson` each request waits an exponential gap first
(mean `--mean-gap` s), so arrivals are staggered as in steady traffic. With
`--client-processes N` a level's workers are spread over N client processes
(one Python process's threads share its GIL, and a chunk may wait for it
before the client timestamps it).

Per stream (request) it measures
  * TTFA: send -> first non-empty AUDIO chunk (timestamped in the gRPC
    callback, not when the worker gets round to it);
  * total: send -> final response;
  * audio seconds: samples / SAMPLE_RATE (from the response);
  * RTF = total / audio seconds (< 1: faster than real time);
  * underrun: how far the stream fell behind a player that starts playing at
    the first chunk (0 = smooth playback).
Per level: p50/p95 TTFA (ms) and RTF, the fraction of streams faster than real
time (and with smooth playback), aggregate x-real-time = sum(audio s) / wall
time of the level (barrier release -> last final response), errors.
Capacity: the largest level with every stream smooth and TTFA p95 <= 500 ms,
with no smaller level failing that (`capacity` in the JSON).

Needs only numpy and tritonclient[grpc] (grpc, protobuf), so it runs on a bare
GPU box too (see gpu_box/device_serve_env.sh). With --server-pid (a server on this
machine): each level's minor page faults of the server and of each model's stubs.

    python benchmarks/bench_served.py --url 127.0.0.1:8001 --concurrency 1,8,32,64 \\
        --requests-per-worker 4 --min-length 100 --max-length 100 --warmup 2 \\
        --json-out bench.json
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import json
import math
import os
import platform
import queue
import socket
import sys
import threading
import time
from datetime import datetime, timezone

import numpy as np

import page_faults

DEFAULT_TEXT = (
    "The quick brown fox jumps over the lazy dog near the quiet river bank, "
    "while the children laugh and play in the warm afternoon sun."
)


class _Timeout(Exception):
    pass


def _strip_scheme(url: str) -> str:
    for scheme in ("grpc://", "http://", "https://"):
        if url.startswith(scheme):
            return url[len(scheme):]
    return url


def build_inputs(grpcclient, text: str, min_length=None, max_length=None, seed=None,
                 cfg_value=None, inference_timesteps=None) -> list:
    arrays = {"TEXT": ("BYTES", np.array([text.encode("utf-8")], dtype=np.object_))}
    for name, value, dt, np_t in (("MIN_LENGTH", min_length, "INT32", np.int32),
                                  ("MAX_LENGTH", max_length, "INT32", np.int32),
                                  ("SEED", seed, "INT64", np.int64),
                                  ("CFG_VALUE", cfg_value, "FP32", np.float32),
                                  ("INFERENCE_TIMESTEPS", inference_timesteps, "INT32", np.int32)):
        if value is not None:
            arrays[name] = (dt, np.array([value], dtype=np_t))
    out = []
    for name, (dt, arr) in arrays.items():
        t = grpcclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


class StreamWorker:
    """One gRPC client + one stream; sends requests one at a time on it.

    After an error or a timeout the stream is cancelled and a fresh client and
    stream are made for the next request (a late response of the failed request
    must not be taken for the next one's).
    """

    def __init__(self, url: str, model: str, timeout: float):
        self.url, self.model, self.timeout = url, model, timeout
        self.client = None
        self.q: queue.Queue = queue.Queue()

    def _open(self) -> None:
        import tritonclient.grpc as grpcclient

        self.q = queue.Queue()
        q = self.q
        self.client = grpcclient.InferenceServerClient(url=self.url)
        # the callback runs on the stream's reader thread: timestamp there
        self.client.start_stream(callback=lambda result, error: q.put((time.perf_counter(), result, error)))

    def close(self, cancel: bool = False) -> None:
        if self.client is None:
            return
        try:
            self.client.stop_stream(cancel_requests=cancel)
        except Exception:
            pass
        try:
            self.client.close()
        except Exception:
            pass
        self.client = None

    def run_one(self, inputs, request_id: str) -> dict:
        rec = {"request_id": request_id, "ttfa_s": None, "total_s": None, "audio_s": 0.0, "samples": 0,
               "sample_rate": 0, "chunks": 0, "underrun_s": None, "max_gap_s": None, "error": None}
        arrivals: list[tuple[float, int]] = []  # (time since send, samples in chunk)
        t0 = None
        try:
            if self.client is None:
                self._open()
            t0 = time.perf_counter()
            rec["t_send"] = t0
            self.client.async_stream_infer(self.model, inputs, request_id=request_id,
                                           enable_empty_final_response=True)
            deadline = t0 + self.timeout
            while True:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    raise _Timeout()
                try:
                    t_recv, result, error = self.q.get(timeout=remaining)
                except queue.Empty:
                    raise _Timeout() from None
                if error is not None:
                    raise RuntimeError(getattr(error, "message", lambda: str(error))() or str(error))
                audio = result.as_numpy("AUDIO")
                rate = result.as_numpy("SAMPLE_RATE")
                if rate is not None and rate.size and not rec["sample_rate"]:
                    rec["sample_rate"] = int(rate.reshape(-1)[0])
                if audio is not None and audio.size:
                    arrivals.append((t_recv - t0, int(audio.size)))
                params = result.get_response().parameters
                if "triton_final_response" in params and params["triton_final_response"].bool_param:
                    rec["total_s"] = t_recv - t0
                    rec["t_end"] = t_recv
                    break
        except _Timeout:
            rec["error"] = f"timeout: no final response within {self.timeout:g} s"
        except Exception as exc:  # noqa: BLE001 - every failure is a data point
            rec["error"] = f"{type(exc).__name__}: {exc}"
        if rec["error"] is not None:
            rec["t_end"] = time.perf_counter()
            self.close(cancel=True)
        rec["chunks"] = len(arrivals)
        rec["samples"] = sum(n for _, n in arrivals)
        if arrivals:
            rec["ttfa_s"] = arrivals[0][0]
            gaps = [b[0] - a[0] for a, b in zip(arrivals, arrivals[1:])]
            rec["max_gap_s"] = max(gaps) if gaps else 0.0
        if rec["sample_rate"] and arrivals:
            sr = rec["sample_rate"]
            rec["audio_s"] = rec["samples"] / sr
            # playback starts at the first chunk; chunk k is due when the audio before it has played
            played, worst, late = 0, 0.0, []
            for t, n in arrivals:
                late.append(t - (arrivals[0][0] + played / sr))
                worst = max(worst, late[-1])
                played += n
            rec["underrun_s"] = worst
            # where a stream fell behind: each chunk's arrival (ms after the send) and audio (ms)
            rec["chunk_ms"] = [[round(t * 1e3, 1), round(n / sr * 1e3, 1)] for t, n in arrivals]
            rec["underrun_chunk"] = late.index(worst) if worst > 0 else None
        if rec["error"] is None and rec["samples"] and not rec["sample_rate"]:
            rec["error"] = "no SAMPLE_RATE in the responses"
        if rec["error"] is None and rec["audio_s"] <= 0:
            rec["error"] = "no audio"
        rec["rtf"] = (rec["total_s"] / rec["audio_s"]) if rec["error"] is None else None
        return rec


def _pct(values, q):
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def _stats(values, scale=1.0) -> dict:
    vals = [v * scale for v in values if v is not None]
    if not vals:
        return {"p50": None, "p95": None, "mean": None, "min": None, "max": None}
    return {"p50": _pct(vals, 50), "p95": _pct(vals, 95), "mean": float(np.mean(vals)),
            "min": float(min(vals)), "max": float(max(vals))}


def _run_workers(args, ws, label: str, concurrency: int, requests_per_worker: int | None,
                 duration: float | None, barrier, wait_s: float | None = None) -> list[dict]:
    """Workers `ws` of a level, a thread each, released together by `barrier` (threading's, or
    multiprocessing's when the level's workers are spread over client processes; wait_s: how long
    they wait for it). Their records, and per worker the time it left the barrier (`t_released`,
    the machine's monotonic clock)."""
    import tritonclient.grpc as grpcclient

    url = _strip_scheme(args.url)
    records: dict[int, list[dict]] = {w: [] for w in ws}
    unstarted: list[str] = []

    def worker(w: int) -> None:
        try:
            sw = StreamWorker(url, args.model, args.timeout)
            inputs = build_inputs(grpcclient, args.text, args.min_length, args.max_length, args.seed,
                                  args.cfg_value, args.inference_timesteps)
        except BaseException as exc:  # noqa: BLE001 - the level cannot run whole: nobody waits for this worker
            unstarted.append(f"worker {w}: {type(exc).__name__}: {exc}")
            barrier.abort()
            return
        setup_error = None
        try:
            sw._open()  # connect before the barrier: the level measures requests, not channel setup
        except Exception as exc:  # noqa: BLE001
            setup_error = f"{type(exc).__name__}: {exc}"
            sw.close()
        try:
            barrier.wait(wait_s)
        except threading.BrokenBarrierError:  # another client process never got there (or its parent gave up)
            sw.close()
            return
        released = time.perf_counter()
        i = 0
        rng = np.random.default_rng((args.seed or 0) * 1000003 + w)
        try:
            while True:
                if duration is not None:
                    if time.perf_counter() - released >= duration:
                        break
                elif i >= requests_per_worker:
                    break
                if args.arrivals == "poisson":
                    time.sleep(float(rng.exponential(args.mean_gap)))
                rec = sw.run_one(inputs, f"{label}-c{concurrency}-w{w}-r{i}")
                if setup_error and rec["error"]:
                    rec["error"] = f"{rec['error']} (stream setup: {setup_error})"
                rec["worker"], rec["index"], rec["t_released"], rec["client_pid"] = w, i, released, os.getpid()
                records[w].append(rec)
                i += 1
        finally:
            sw.close(cancel=False)

    threads = [threading.Thread(target=worker, args=(w,), daemon=True, name=f"bench-w{w}") for w in ws]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if unstarted:
        raise RuntimeError(f"the level's workers could not start ({'; '.join(unstarted)})")
    return [r for w in ws for r in records[w]]


BARRIER_TIMEOUT_S = 120.0  # client processes that are not all at the barrier by then: one failed to start


def _client_process(args, ws, label, concurrency, requests_per_worker, duration, barrier, conn) -> None:
    """A client process's share of a level's workers: its records and its CPU seconds from its streams'
    setup on (as the parent's own level counts them) go back over `conn`."""
    importlib.import_module("tritonclient.grpc")  # before the CPU count starts, as in the parent

    try:
        cpu0 = time.process_time()
        records = _run_workers(args, ws, label, concurrency, requests_per_worker, duration, barrier,
                               BARRIER_TIMEOUT_S)
        conn.send((records, time.process_time() - cpu0))
    finally:
        conn.close()


def _wait_for_clients(barrier, procs: list, timeout: float) -> bool:
    """Release the client processes `procs` once all their workers wait at the level's barrier: True. The
    parent arrives last, so its arrival is what releases them. A process that ends before that (its imports
    failed, it was killed), or `timeout` passing, breaks the barrier instead, so that neither the parent nor
    the other processes wait any longer: False. (A worker that cannot start breaks it itself.)"""
    from multiprocessing.connection import wait

    deadline = time.monotonic() + timeout
    while barrier.n_waiting < barrier.parties - 1:
        if wait([p.sentinel for p in procs], timeout=0.05) or time.monotonic() > deadline:
            barrier.abort()
            return False
    try:
        barrier.wait()
        return True
    except threading.BrokenBarrierError:  # a client's own wait timed out just now
        return False


def _spread_workers(args, processes: int, label: str, concurrency: int, requests_per_worker: int | None,
                    duration: float | None) -> tuple[list[dict], float]:
    """The level's workers dealt round-robin to `processes` client processes (spawned: no gRPC state
    forked), released by one barrier across them -> their records and CPU seconds. Real clients are
    separate processes: one Python process's threads share its GIL, and a chunk can wait for it
    before it is timestamped."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(concurrency + 1)
    procs = []
    for k in range(processes):
        ws = list(range(k, concurrency, processes))
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_client_process, name=f"bench-client-{k}", daemon=True,
                           args=(args, ws, label, concurrency, requests_per_worker, duration, barrier, send))
        proc.start()
        send.close()
        procs.append((proc, recv))
    broken = not _wait_for_clients(barrier, [proc for proc, _ in procs], BARRIER_TIMEOUT_S)
    flat, cpu_s, failed = [], 0.0, []
    for k, (proc, recv) in enumerate(procs):
        try:
            records, cpu = recv.recv()
            flat += records
            cpu_s += cpu
        except EOFError:
            failed.append(k)
        recv.close()
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if failed:
        codes = ", ".join(f"{k} (exit code {procs[k][0].exitcode})" for k in failed)
        raise RuntimeError(f"client process(es) {codes} ended without their records")
    if broken:
        raise RuntimeError(f"the client processes were not all ready within {BARRIER_TIMEOUT_S:g} s")
    return sorted(flat, key=lambda r: (r["worker"], r["index"])), cpu_s


def run_level(args, concurrency: int, label: str, requests_per_worker: int | None,
              duration: float | None, processes: int = 1) -> dict:
    asked, processes = processes, max(1, min(processes, concurrency))
    cpu0 = time.process_time()
    if processes == 1:
        flat = _run_workers(args, range(concurrency), label, concurrency, requests_per_worker, duration,
                            threading.Barrier(concurrency))
        children_cpu_s = 0.0
    else:
        flat, children_cpu_s = _spread_workers(args, processes, label, concurrency, requests_per_worker, duration)
    cpu_s = time.process_time() - cpu0 + children_cpu_s
    # the level starts when its first worker leaves the barrier
    t_start = min((r["t_released"] for r in flat), default=time.perf_counter())
    for r in flat:
        r.pop("t_released", None)
    t_last = max((r["t_end"] for r in flat), default=t_start)
    wall = max(t_last - t_start, 1e-9)
    for r in flat:  # times relative to the level's start
        r["start_s"] = r.pop("t_send", t_start) - t_start
        r["end_s"] = r.pop("t_end", t_last) - t_start
    ok = [r for r in flat if r["error"] is None]
    errs = [r for r in flat if r["error"] is not None]
    audio_total = sum(r["audio_s"] for r in ok)
    level = {
        "concurrency": concurrency,
        "client_processes": processes,
        "client_processes_asked": asked,
        "requests": len(flat),
        "ok": len(ok),
        "errors": len(errs),
        "error_messages": sorted({r["error"] for r in errs})[:10],
        "wall_s": wall,
        # the client's CPU seconds over the level (its threads, its client processes from their streams'
        # setup on), per second of the level: near 1 or more in one process, its Python (one core at a
        # time) may be what holds the streams back
        "client_cpu_per_s": cpu_s / wall,
        "t0_monotonic": t_start,  # the level's start on the machine's monotonic clock (VOXCPM_TIMELINE's)
        "audio_s_total": audio_total,
        "x_real_time": audio_total / wall,
        "requests_per_s": len(ok) / wall,
        "sample_rate": next((r["sample_rate"] for r in ok if r["sample_rate"]), None),
        "ttfa_ms": _stats([r["ttfa_s"] for r in ok], 1000.0),
        "total_s": _stats([r["total_s"] for r in ok]),
        "audio_s": _stats([r["audio_s"] for r in ok]),
        "rtf": _stats([r["rtf"] for r in ok]),
        "max_gap_ms": _stats([r["max_gap_s"] for r in ok], 1000.0),
        "underrun_ms": _stats([r["underrun_s"] for r in ok], 1000.0),
        "faster_than_realtime_frac": (sum(r["rtf"] < 1.0 for r in ok) / len(flat)) if flat else None,
        "smooth_playback_frac": (sum(r["underrun_s"] <= 1e-3 for r in ok) / len(flat)) if flat else None,
        "streams": flat,
    }
    return level


CAPACITY_TTFA_P95_MS = 500.0


def capacity(levels: list[dict]) -> int:
    """The largest level with no error, every stream smooth and TTFA p95 <= 500 ms, below which
    every measured level also met that (0: none did)."""
    best = 0
    for lv in sorted(levels, key=lambda lv: lv["concurrency"]):
        p95 = lv["ttfa_ms"]["p95"]
        if lv["errors"] or lv["smooth_playback_frac"] != 1.0 or p95 is None or p95 > CAPACITY_TTFA_P95_MS:
            break
        best = lv["concurrency"]
    return best


def _fmt(v, spec):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def share(frac) -> str:
    """A share as a percentage, rounded down to 0.1% below 1 (0.9969 is 99.6%, never 100%)."""
    if frac is None:
        return "-"
    return "100%" if frac >= 1 else f"{math.floor(frac * 1000) / 10:.1f}%"


def markdown_table(levels: list[dict]) -> str:
    """One row per level; a last column with its client processes where levels ran with several."""
    procs = any(lv.get("client_processes", 1) > 1 for lv in levels)
    head = ("| conc | streams | errors | TTFA p50 ms | TTFA p95 ms | RTF p50 | RTF p95 | faster than RT "
            "| smooth | agg x-RT | audio s/stream | wall s |" + (" client processes |" if procs else ""))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for lv in levels:
        lines.append(
            f"| {lv['concurrency']} | {lv['requests']} | {lv['errors']} "
            f"| {_fmt(lv['ttfa_ms']['p50'], '.1f')} | {_fmt(lv['ttfa_ms']['p95'], '.1f')} "
            f"| {_fmt(lv['rtf']['p50'], '.3f')} | {_fmt(lv['rtf']['p95'], '.3f')} "
            f"| {share(lv['faster_than_realtime_frac'])} | {share(lv['smooth_playback_frac'])} "
            f"| {_fmt(lv['x_real_time'], '.2f')} | {_fmt(lv['audio_s']['mean'], '.2f')} | {_fmt(lv['wall_s'], '.2f')} |"
            + (f" {lv.get('client_processes', 1)} |" if procs else "")
        )
    return "\n".join(lines)


def server_info(url: str, timeout: float) -> dict:
    """Server version and the decoder's parameters (best effort)."""
    import tritonclient.grpc as grpcclient

    info: dict = {}
    try:
        c = grpcclient.InferenceServerClient(url=_strip_scheme(url))
        try:
            md = c.get_server_metadata(as_json=True, client_timeout=timeout)
            info["server"] = {"name": md.get("name"), "version": md.get("version")}
            for m in ("decoder", "tts_stream"):
                try:
                    cfg = c.get_model_config(m, as_json=True, client_timeout=timeout)["config"]
                    info[m] = {k: v.get("string_value") for k, v in cfg.get("parameters", {}).items()}
                except Exception:  # noqa: BLE001
                    pass
        finally:
            c.close()
    except Exception as exc:  # noqa: BLE001
        info["error"] = str(exc)
    return info


def model_stats(url: str) -> dict:
    """Triton's cumulative per-model statistics: {model: {counter: value}} (best effort)."""
    import tritonclient.grpc as grpcclient

    out: dict = {}
    try:
        c = grpcclient.InferenceServerClient(url=_strip_scheme(url))
        try:
            for m in c.get_inference_statistics(as_json=True, client_timeout=10).get("model_stats", []):
                st = m.get("inference_stats", {})
                row = {"inferences": int(m.get("inference_count", 0)), "executions": int(m.get("execution_count", 0))}
                for k in ("queue", "compute_input", "compute_infer", "compute_output"):
                    row[f"{k}_ns"] = int(st.get(k, {}).get("ns", 0))
                # inference_stats count each request of a batch with the whole execution's time;
                # batch_stats count each execution once.
                row["execution_infer_ns"] = sum(int(b.get("compute_infer", {}).get("ns", 0))
                                                for b in m.get("batch_stats", []))
                out[m["name"]] = row
        finally:
            c.close()
    except Exception as exc:  # noqa: BLE001
        out["error"] = str(exc)
    return out


FIRST_AUDIO = "voxcpm_time_to_first_audio_seconds"
PHASES = "voxcpm_time_to_first_audio_phase_seconds_sum"


def metric_samples(metrics_url: str) -> list[tuple[str, dict, float]]:
    """Every labelled sample on Triton's metrics endpoint: (name, labels, value)."""
    import urllib.request

    return parse_metric_samples(urllib.request.urlopen(metrics_url, timeout=10).read().decode())


def parse_metric_samples(text: str) -> list[tuple[str, dict, float]]:
    """Every labelled sample of a Prometheus text page (or run_served_gpu.sh's metrics.txt)."""
    import re

    return [(name, dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(v))
            for name, labels, v in re.findall(r'^(\w+)\{([^}]*)\} ([0-9.eE+-]+)$', text, re.M)]


def first_audio_sums(metrics_url: str, model: str) -> dict:
    """The orchestrator's cumulative first-audio metrics for `model` from Triton's /metrics:
    {"count": requests, "total": seconds, phase: seconds, ...} (best effort: {} on failure)."""
    try:
        samples = metric_samples(metrics_url)
    except Exception:  # noqa: BLE001
        return {}
    out = {}
    for name, labels, value in samples:
        if labels.get("model") != model:
            continue
        if name == FIRST_AUDIO + "_count":
            out["count"] = value
        elif name == FIRST_AUDIO + "_sum":
            out["total"] = value
        elif name == PHASES:
            out[labels["phase"]] = value
    return out


ENGINE_COUNTERS = {"voxcpm_engine_decode_steps_total": "steps", "voxcpm_engine_decode_rows_total": "rows",
                   "voxcpm_engine_late_launches_total": "late_launches",
                   # the decoder's audio thread (decode_audio), where the server has them
                   "voxcpm_decoder_audio_sends_total": "audio_sends",
                   "voxcpm_decoder_audio_send_seconds_total": "audio_send_s",
                   "voxcpm_decoder_audio_ends_alone_total": "ends_alone",
                   "voxcpm_decoder_audio_rushes_total": "rushes"}


def engine_sums(metrics_url: str) -> dict:
    """The decoder engines' decode steps, the request rows in them, the steps launched late and the
    audio thread's deliveries (`ENGINE_COUNTERS`), summed over instances (best effort: {} on failure). With
    several instances, rows over steps is their mean batch."""
    try:
        samples = metric_samples(metrics_url)
    except Exception:  # noqa: BLE001
        return {}
    out: dict = {}
    for name, _, value in samples:
        if name in ENGINE_COUNTERS:
            out[ENGINE_COUNTERS[name]] = out.get(ENGINE_COUNTERS[name], 0.0) + value
    return out


def settled_engine_sums(metrics_url: str, tries: int = 10, gap_s: float = 0.3) -> dict:
    """engine_sums once two reads `gap_s` apart agree (the engine publishes its counters every 0.2 s;
    between levels it is idle, so they settle): the last read after `tries`."""
    last = engine_sums(metrics_url)
    for _ in range(tries):
        time.sleep(gap_s)
        now = engine_sums(metrics_url)
        if now == last:
            break
        last = now
    return last


def engine_delta(before: dict, after: dict) -> dict | None:
    """Decode steps and rows over one level, and the mean rows a step ran (None without both counters,
    e.g. a server from before the rows counter): how full the batches were. With the late-launch
    counter, also the steps whose launch found the engine's GPU stream idle; with the audio thread's
    counters (decode_audio), its deliveries, their seconds, the ends it sent alone and its rushes."""
    if not {"steps", "rows"} <= before.keys() & after.keys():
        return None
    steps, rows = after["steps"] - before["steps"], after["rows"] - before["rows"]
    out = {"steps": steps, "rows": rows, "rows_per_step": rows / steps if steps > 0 else None}
    for k in ENGINE_COUNTERS.values():
        if k not in ("steps", "rows") and k in before.keys() & after.keys():
            out[k] = after[k] - before[k]
    return out


def first_audio_phases(before: dict, after: dict) -> dict | None:
    """Mean ms per request of first audio and of each of its phases over one level (None without
    the metrics): where the time to first audio goes, as the server measures it."""
    n = after.get("count", 0) - before.get("count", 0)
    if n <= 0:
        return None
    return {k: (after[k] - before.get(k, 0.0)) * 1000 / n for k in after if k != "count"}


def stats_delta(before: dict, after: dict, wall_s: float) -> dict:
    """Per model, over one level: executions, requests per execution, mean ms a request spent
    queued, mean ms per execute() and the share of the wall time spent in execute() (for one
    instance, 1.0 is saturated; for a decoupled model, execute() only hands the request on)."""
    rows = {}
    for name, a in after.items():
        b = before.get(name)
        if name == "error" or not isinstance(b, dict):
            continue
        d = {k: a[k] - b[k] for k in a}
        if d["executions"] <= 0:
            continue
        rows[name] = {"inferences": d["inferences"], "executions": d["executions"],
                      "batch_mean": d["inferences"] / d["executions"],
                      "queue_ms_per_request": d["queue_ns"] / 1e6 / max(d["inferences"], 1),
                      "infer_ms_per_execution": d["execution_infer_ns"] / 1e6 / d["executions"],
                      "busy_frac": d["execution_infer_ns"] / 1e9 / wall_s if wall_s > 0 else 0.0}
    return rows


def wait_ready(url: str, model: str, timeout: float) -> None:
    import tritonclient.grpc as grpcclient

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            c = grpcclient.InferenceServerClient(url=_strip_scheme(url))
            try:
                if c.is_model_ready(model, client_timeout=5):
                    return
            finally:
                c.close()
        except Exception as exc:  # noqa: BLE001
            last = exc
        time.sleep(0.5)
    raise SystemExit(f"bench_served: {model} at {url} not ready within {timeout:g} s ({last})")


def positive_ints(parser: argparse.ArgumentParser, flag: str, text, what: str) -> list[int]:
    """A comma-separated list of integers >= 1 given to `flag`; a usage error naming it otherwise."""
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        parser.error(f"{flag}: comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{flag}: {what} must be >= 1")
    return values


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC address host:port")
    p.add_argument("--model", default="tts_stream")
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated concurrency levels")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--requests-per-worker", type=int, default=None,
                   help="requests each worker sends one after the other (default 2 without --duration)")
    g.add_argument("--duration", type=float, default=None,
                   help="seconds per level: workers start new requests until then (started ones finish)")
    p.add_argument("--arrivals", choices=("burst", "poisson"), default="burst",
                   help="burst: every worker starts at once; poisson: exponential gaps before each request")
    p.add_argument("--mean-gap", type=float, default=2.0,
                   help="with --arrivals poisson: mean seconds a worker waits before each request")
    p.add_argument("--text", default=DEFAULT_TEXT)
    p.add_argument("--min-length", type=int, default=None, help="MIN_LENGTH in patches (pin = max for benchmarks)")
    p.add_argument("--max-length", type=int, default=None, help="MAX_LENGTH in patches")
    p.add_argument("--seed", type=int, default=0, help="SEED sent with every request; -1: not sent")
    p.add_argument("--cfg-value", type=float, default=None)
    p.add_argument("--inference-timesteps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=2,
                   help="warm-up requests (sent concurrently, not measured) before the first level")
    p.add_argument("--warmup-each-level", action="store_true",
                   help="also run one unmeasured request per worker at each level's concurrency first")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request limit, seconds")
    p.add_argument("--ready-timeout", type=float, default=60.0, help="wait this long for the model to be ready")
    p.add_argument("--json-out", default=None, help="write the full results (per-stream records included) here")
    p.add_argument("--metrics-url", default=None,
                   help="Triton's metrics endpoint (http://host:8002/metrics): also record where first audio's time "
                        "goes per level (the orchestrator's phase metrics)")
    p.add_argument("--server-pid", type=int, default=None,
                   help="a local server's pid: each level's minor page faults of it and its processes, by name")
    p.add_argument("--client-processes", default="1",
                   help="client processes a level's workers are spread over; comma-separated: each level is "
                        "run once per value, in turn (1,4: a level in one process, then the same level in 4)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args(argv)
    args.levels = positive_ints(p, "--concurrency", args.concurrency, "levels")
    args.processes = positive_ints(p, "--client-processes", args.client_processes, "values")
    if args.duration is None and args.requests_per_worker is None:
        args.requests_per_worker = 2
    if args.requests_per_worker is not None and args.requests_per_worker < 1:
        p.error("--requests-per-worker must be >= 1")
    if args.duration is not None and args.duration <= 0:
        p.error("--duration must be > 0")
    if args.mean_gap <= 0:
        p.error("--mean-gap must be > 0")
    if args.server_pid is not None and not page_faults.usage(args.server_pid):
        p.error(f"--server-pid: no process {args.server_pid} on this machine (the server must run here)")
    if args.seed is not None and args.seed < 0:
        args.seed = None
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    wait_ready(args.url, args.model, args.ready_timeout)
    info = server_info(args.url, 10.0)
    if args.warmup > 0:
        log(f"[bench] warm-up: {args.warmup} concurrent request(s)")
        wu = run_level(args, args.warmup, "warmup", 1, None)
        if wu["errors"]:
            log(f"[bench] warm-up errors: {wu['error_messages']}")
    levels = []
    for c, procs in itertools.product(args.levels, args.processes):
        if args.warmup_each_level:
            log(f"[bench] concurrency {c}: warm-up round")
            run_level(args, c, "warmup", 1, None, procs)
        log(f"[bench] concurrency {c}: "
            + (f"{args.duration:g} s" if args.duration is not None else f"{args.requests_per_worker} request(s)/worker")
            + (f", {min(procs, c)} client processes" if min(procs, c) > 1 else ""))
        before = model_stats(args.url)
        fa_before = first_audio_sums(args.metrics_url, args.model) if args.metrics_url else {}
        eng_before = settled_engine_sums(args.metrics_url) if args.metrics_url else {}  # the warm-up's too
        faults0 = page_faults.usage(args.server_pid) if args.server_pid else None
        lv = run_level(args, c, "bench", args.requests_per_worker, args.duration, procs)
        if faults0 is not None:
            lv["minor_faults"] = page_faults.delta(faults0, page_faults.usage(args.server_pid))
        lv["server_models"] = stats_delta(before, model_stats(args.url), lv["wall_s"])
        if args.metrics_url:
            lv["first_audio_phases_ms"] = first_audio_phases(fa_before, first_audio_sums(args.metrics_url, args.model))
            lv["decoder_steps"] = engine_delta(eng_before, settled_engine_sums(args.metrics_url))
        levels.append(lv)
        log(f"[bench]   {lv['ok']}/{lv['requests']} ok, TTFA p50 {_fmt(lv['ttfa_ms']['p50'], '.1f')} ms, "
            f"RTF p50 {_fmt(lv['rtf']['p50'], '.3f')}, x-RT {lv['x_real_time']:.2f}, wall {lv['wall_s']:.2f} s, "
            f"client CPU {lv['client_cpu_per_s']:.2f} s/s"
            + (f", errors: {lv['error_messages'][:3]}" if lv["errors"] else ""))
        if lv.get("first_audio_phases_ms"):
            log("[bench]   first audio, mean ms in the server: " + ", ".join(
                f"{k} {v:.1f}" for k, v in lv["first_audio_phases_ms"].items()))
        if lv.get("decoder_steps"):
            d = lv["decoder_steps"]
            log(f"[bench]   decoder: {d['steps']:.0f} steps, {_fmt(d['rows_per_step'], '.2f')} request rows each"
                + (f", {d['late_launches']:.0f} launched late" if "late_launches" in d else ""))
            if d.get("audio_sends"):
                log(f"[bench]   decoder's audio thread: {d['audio_sends']:.0f} deliveries, "
                    f"{1000 * d['audio_send_s'] / d['audio_sends']:.2f} ms each, "
                    f"{d['audio_send_s'] / lv['wall_s']:.2f} s of them a second of the level (summed over instances); "
                    f"{d.get('ends_alone', 0):.0f} ends alone, {d.get('rushes', 0):.0f} rushes")
        if lv.get("minor_faults"):
            log("[bench]   minor page faults: " + ", ".join(f"{k} {v}" for k, v in list(lv["minor_faults"].items())[:5]))
        for name, row in lv["server_models"].items():
            log(f"[bench]   {name}: {row['executions']} executions, {row['batch_mean']:.1f} requests each, "
                f"{row['infer_ms_per_execution']:.2f} ms in execute ({100 * row['busy_frac']:.0f}% busy), queued "
                f"{row['queue_ms_per_request']:.2f} ms")
    table = markdown_table(levels)
    print(table, flush=True)
    # capacity per --client-processes value (the first value's is the JSON's `capacity`)
    caps = {n: capacity([lv for lv in levels if lv.get("client_processes_asked", 1) == n]) for n in args.processes}
    cap = caps[args.processes[0]]
    for n, c in caps.items():
        print(f"capacity ({args.arrivals}{f', {n} client processes' if len(caps) > 1 else ''}): {c} streams smooth "
              f"with TTFA p95 <= {CAPACITY_TTFA_P95_MS:g} ms", flush=True)
    result = {
        "config": {
            "url": args.url, "model": args.model, "levels": args.levels, "text": args.text,
            "text_chars": len(args.text), "min_length": args.min_length, "max_length": args.max_length,
            "seed": args.seed, "cfg_value": args.cfg_value, "inference_timesteps": args.inference_timesteps,
            "requests_per_worker": args.requests_per_worker, "duration_s": args.duration,
            "warmup": args.warmup, "warmup_each_level": args.warmup_each_level, "timeout_s": args.timeout,
            "arrivals": args.arrivals, "mean_gap_s": args.mean_gap if args.arrivals == "poisson" else None,
            "client_processes": args.processes,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "client_host": socket.gethostname(), "client_python": platform.python_version(),
            "client_cpus": os.cpu_count(),
        },
        "server_info": info,
        "levels": levels,
        "capacity": cap,
        "capacity_by_client_processes": caps,
        "table_markdown": table,
    }
    if args.json_out:
        d = os.path.dirname(os.path.abspath(args.json_out))
        os.makedirs(d, exist_ok=True)
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
        log(f"[bench] wrote {args.json_out}")
    return 1 if any(lv["errors"] for lv in levels) else 0


if __name__ == "__main__":
    sys.exit(main())
