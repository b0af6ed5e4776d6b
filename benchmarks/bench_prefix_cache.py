#!/usr/bin/env python3
"""What the decoder's prefix cache buys, measured through the served `tts_stream` (gRPC streaming).

Phases, against a running server (decoder `enable_prefix_caching` true):

  1. cold:    N requests one after the other, each with a registered voice of its own (its first
              use: nothing of it is cached), 10 s of reference audio each;
  2. cached:  N requests one after the other with one registered voice whose prefix is cached
              (one unmeasured request first), each with a different text;
  3. voice:   C concurrent streams (R requests each) with that voice;
  4. inline:  C concurrent streams sending the same 10 s audio as REFERENCE_AUDIO (encoded by
              vae_encoder per request; they hit the cache only where its latents come out
              bit-identical).

Per phase: TTFA p50/p95, RTF p50, aggregate x real time, and the decoder's prefix-cache counters
over the phase (from the metrics endpoint: requests that hit, blocks reused). Needs numpy and
tritonclient[grpc]; reuses bench_served.py's stream worker.

    python3 benchmarks/bench_prefix_cache.py --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics \\
        --json-out prefix_cache.json
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from datetime import datetime, timezone

import numpy as np

from bench_served import (DEFAULT_TEXT, StreamWorker, _fmt, _stats, _strip_scheme, build_inputs, metric_samples,
                          wait_ready)

RATE = 16000
COUNTERS = ("voxcpm_prefix_cache_hits_total", "voxcpm_prefix_cache_hit_blocks_total", "voxcpm_prefix_cache_blocks")


def voice_audio(seed: int, seconds: float) -> np.ndarray:
    """A speech-like stand-in (speed depends on its length only): gliding tones and noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 120 + 80 * rng.random() + 30 * np.sin(2 * np.pi * 0.7 * t)
    x = 0.3 * np.sin(2 * np.pi * np.cumsum(f0) / RATE) + 0.05 * rng.standard_normal(t.size)
    return x.astype(np.float32)


def _tensor(grpcclient, name, array, datatype):
    t = grpcclient.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


def voices_call(url: str, action: str, name: str | None = None, audio=None) -> list[str]:
    import tritonclient.grpc as grpcclient

    inputs = [_tensor(grpcclient, "ACTION", np.array([action.encode()], dtype=np.object_), "BYTES")]
    if name is not None:
        inputs.append(_tensor(grpcclient, "NAME", np.array([name.encode()], dtype=np.object_), "BYTES"))
    if audio is not None:
        inputs.append(_tensor(grpcclient, "AUDIO", audio, "FP32"))
        inputs.append(_tensor(grpcclient, "SAMPLE_RATE", np.array([RATE], dtype=np.int32), "INT32"))
    c = grpcclient.InferenceServerClient(url=_strip_scheme(url))
    try:
        return [n.decode() for n in c.infer("voices", inputs, client_timeout=300).as_numpy("NAMES").reshape(-1)]
    finally:
        c.close()


def decoder_counters(metrics_url: str) -> dict:
    out = dict.fromkeys(COUNTERS)
    for name, labels, value in metric_samples(metrics_url):
        if name in out and out[name] is None and labels.get("model") == "decoder":
            out[name] = value
    return out


def settled_counters(metrics_url: str) -> dict:
    """The counters once the decoder's metrics thread has published the phase (every 0.2 s)."""
    time.sleep(0.6)
    return decoder_counters(metrics_url)


def request_inputs(text: str, seed: int, length: int, voice: str | None = None, audio=None) -> list:
    """A tts_stream request of exactly `length` patches, with a registered voice or inline audio."""
    import tritonclient.grpc as grpcclient

    inputs = build_inputs(grpcclient, text, length, length, seed)
    if voice is not None:
        inputs.append(_tensor(grpcclient, "VOICE", np.array([voice.encode()], dtype=np.object_), "BYTES"))
    if audio is not None:
        inputs.append(_tensor(grpcclient, "REFERENCE_AUDIO", audio, "FP32"))
        inputs.append(_tensor(grpcclient, "REFERENCE_SAMPLE_RATE", np.array([RATE], dtype=np.int32), "INT32"))
    return inputs


def summarize(records: list[dict], wall: float, before: dict, after: dict) -> dict:
    ok = [r for r in records if r["error"] is None]
    return {
        "requests": len(records), "errors": len(records) - len(ok),
        "error_messages": sorted({r["error"] for r in records if r["error"]})[:5],
        "ttfa_ms": _stats([r["ttfa_s"] for r in ok], 1000.0), "rtf": _stats([r["rtf"] for r in ok]),
        "wall_s": wall, "x_real_time": sum(r["audio_s"] for r in ok) / max(wall, 1e-9),
        "prefix_cache": {k: (after[k] - before[k]) if None not in (after[k], before[k]) else None
                         for k in COUNTERS[:2]} | {"cached_blocks_after": after[COUNTERS[2]]},
        "streams": records,
    }


def sequential(args, label: str, n: int, inputs_for) -> dict:
    """One stream, n requests one after the other: inputs_for(i) -> the i-th request's inputs."""
    before = decoder_counters(args.metrics_url)
    sw = StreamWorker(_strip_scheme(args.url), "tts_stream", args.timeout)
    t0 = time.perf_counter()
    try:
        records = [sw.run_one(inputs_for(i), f"{label}-{i}") for i in range(n)]
    finally:
        sw.close()
    return summarize(records, time.perf_counter() - t0, before, settled_counters(args.metrics_url))


def concurrent(args, label: str, inputs_for) -> dict:
    """C streams released together by a barrier, R requests each: inputs_for(worker, i)."""
    before = decoder_counters(args.metrics_url)
    records: list[list[dict]] = [[] for _ in range(args.concurrency)]
    barrier = threading.Barrier(args.concurrency + 1)

    def worker(w: int):
        sw = StreamWorker(_strip_scheme(args.url), "tts_stream", args.timeout)
        try:
            sw._open()
            barrier.wait()
            for i in range(args.requests_per_stream):
                records[w].append(sw.run_one(inputs_for(w, i), f"{label}-w{w}-r{i}"))
        finally:
            sw.close()

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(args.concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return summarize([r for rs in records for r in rs], time.perf_counter() - t0, before,
                     settled_counters(args.metrics_url))


def texts(n: int) -> list[str]:
    return [f"Sentence number {i + 1}. {DEFAULT_TEXT}" for i in range(n)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC address")
    p.add_argument("--metrics-url", default="http://127.0.0.1:8002/metrics")
    p.add_argument("--voice-seconds", type=float, default=10.0)
    p.add_argument("--requests", type=int, default=16, help="requests of each sequential phase (cold, cached)")
    p.add_argument("--length", type=int, default=20,
                   help="MIN_LENGTH = MAX_LENGTH of the sequential phases (TTFA does not depend on it)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests-per-stream", type=int, default=2)
    p.add_argument("--stream-length", type=int, default=100, help="MIN_LENGTH = MAX_LENGTH of the concurrent phases")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    wait_ready(args.url, "tts_stream", 120)
    if decoder_counters(args.metrics_url)[COUNTERS[0]] is None:
        raise SystemExit(f"no {COUNTERS[0]} at {args.metrics_url}: is the decoder's prefix caching there?")
    run_id = f"{int(time.time()) % 100000}"
    cold_names = [f"bench-cold-{run_id}-{i}" for i in range(args.requests)]
    warm, warm_audio = f"bench-warm-{run_id}", voice_audio(10 ** 6, args.voice_seconds)
    log(f"[prefix] registering {len(cold_names) + 1} voices of {args.voice_seconds:g} s")
    for i, name in enumerate(cold_names):
        voices_call(args.url, "add", name, voice_audio(i, args.voice_seconds))
    voices_call(args.url, "add", warm, warm_audio)
    phases = {}
    ts, cs = texts(args.requests), texts(args.concurrency)
    n, short, long_ = args.requests, args.length, args.stream_length
    try:
        # Warm-up (not measured): a voice of its own, twice (the second takes the cached-prefix path).
        warmup = f"bench-warmup-{run_id}"
        voices_call(args.url, "add", warmup, voice_audio(999_999, args.voice_seconds))
        sequential(args, "warmup", 2, lambda i: request_inputs(DEFAULT_TEXT, i, short, voice=warmup))
        voices_call(args.url, "remove", warmup)
        log(f"[prefix] cold: {n} requests, each the first use of its voice")
        phases["cold"] = sequential(args, "cold", n, lambda i: request_inputs(ts[i], i, short, voice=cold_names[i]))
        sequential(args, "fill", 1, lambda i: request_inputs(DEFAULT_TEXT, 0, short, voice=warm))
        log(f"[prefix] cached: {n} requests with one voice, its prefix cached")
        phases["cached"] = sequential(args, "cached", n, lambda i: request_inputs(ts[i], i, short, voice=warm))
        log(f"[prefix] {args.concurrency} concurrent streams x {args.requests_per_stream}: the cached voice")
        phases["voice"] = concurrent(args, "voice", lambda w, i: request_inputs(cs[w], w * 100 + i, long_,
                                                                                voice=warm))
        log(f"[prefix] {args.concurrency} concurrent streams x {args.requests_per_stream}: its audio inline")
        phases["inline"] = concurrent(args, "inline", lambda w, i: request_inputs(cs[w], w * 100 + i, long_,
                                                                                  audio=warm_audio))
    finally:
        for name in cold_names + [warm]:
            try:
                voices_call(args.url, "remove", name)
            except Exception as e:  # noqa: BLE001 - best effort
                log(f"[prefix] could not remove voice {name}: {e}")
    head = "| phase | requests | errors | TTFA p50 ms | TTFA p95 ms | RTF p50 | agg x-RT | cache hits | blocks reused |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, ph in phases.items():
        pc = ph["prefix_cache"]
        lines.append(f"| {name} | {ph['requests']} | {ph['errors']} | {_fmt(ph['ttfa_ms']['p50'], '.1f')} "
                     f"| {_fmt(ph['ttfa_ms']['p95'], '.1f')} | {_fmt(ph['rtf']['p50'], '.3f')} "
                     f"| {_fmt(ph['x_real_time'], '.1f')} | {_fmt(pc[COUNTERS[0]], '.0f')} "
                     f"| {_fmt(pc[COUNTERS[1]], '.0f')} |")
    table = "\n".join(lines)
    print(table, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"config": {**vars(args), "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")},
                       "phases": phases, "table_markdown": table}, f, indent=1)
        log(f"[prefix] wrote {args.json_out}")
    return 1 if any(ph["errors"] for ph in phases.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
