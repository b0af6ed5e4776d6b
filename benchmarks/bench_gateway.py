#!/usr/bin/env python3
"""What the OpenAI speech API gateway costs: time to first byte and aggregate throughput through
the gateway (POST /v1/audio/speech, raw audio streamed) against the same requests sent straight to
Triton's `tts_stream` over gRPC streaming.

  1 stream:   N requests one after the other, direct and gateway alternating (drift hits both);
              TTFB = request sent -> first audio bytes in (gRPC: the first non-empty AUDIO chunk;
              HTTP: the first body bytes). Target: gateway p50 at most 5 ms above direct.
  C streams:  C workers, each sending R requests one after the other, direct and gateway in turn;
              aggregate = seconds of audio / wall time. Target: no loss through the gateway.

Only the standard library, numpy and tritonclient's gRPC client (what a bare GPU box carries): the
HTTP side is a minimal HTTP/1.1 client on asyncio streams, one connection per request.

    python3 benchmarks/bench_gateway.py --grpc-url 127.0.0.1:8001 --gateway-url http://127.0.0.1:9000 \\
        --requests 30 --concurrency 32 --requests-per-stream 2 --min-length 100 --max-length 100 \\
        --json-out gateway.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import sys
import time
from datetime import datetime, timezone
from urllib.parse import urlparse

import numpy as np

TEXT = ("The quick brown fox jumps over the lazy dog near the quiet river bank, "
        "while the children laugh and play in the warm afternoon sun.")


def _stats(values) -> dict:
    v = [x for x in values if x is not None]
    if not v:
        return {"n": 0, "p50": None, "p95": None, "mean": None, "min": None, "max": None}
    a = np.asarray(v, dtype=np.float64)
    return {"n": len(v), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "mean": float(a.mean()), "min": float(a.min()), "max": float(a.max())}


# ---------------------------------------------------------------------------- direct: gRPC stream
async def direct_once(client, args, seed: int) -> dict:
    from tritonclient.grpc import InferInput

    arrays = {"TEXT": np.array([TEXT.encode()], dtype=np.object_), "SEED": np.array([seed], np.int64),
              "MIN_LENGTH": np.array([args.min_length], np.int32),
              "MAX_LENGTH": np.array([args.max_length], np.int32)}
    inputs = []
    for name, a in arrays.items():
        t = InferInput(name, list(a.shape), {np.object_: "BYTES", np.int64: "INT64", np.int32: "INT32"}[a.dtype.type])
        t.set_data_from_numpy(a)
        inputs.append(t)
    done = asyncio.Event()

    async def requests():
        yield {"model_name": "tts_stream", "inputs": inputs,
               "parameters": {"triton_enable_empty_final_response": True}}
        await done.wait()

    rec = {"ttfb_s": None, "total_s": None, "audio_s": 0.0, "error": None}
    t0 = time.perf_counter()
    it = client.stream_infer(requests(), stream_timeout=args.timeout)
    samples, rate = 0, 0
    try:
        async for result, error in it:
            if error is not None:
                raise RuntimeError(error.message())
            audio = result.as_numpy("AUDIO")
            r = result.as_numpy("SAMPLE_RATE")
            if r is not None and r.size:
                rate = int(r.reshape(-1)[0])
            if audio is not None and audio.size:
                if rec["ttfb_s"] is None:
                    rec["ttfb_s"] = time.perf_counter() - t0
                samples += audio.size
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
        rec["total_s"] = time.perf_counter() - t0
        rec["audio_s"] = samples / rate if rate else 0.0
    except Exception as e:  # noqa: BLE001 - every failure is a data point
        rec["error"] = f"{type(e).__name__}: {e}"
        it.cancel()
    finally:
        done.set()
    return rec


# ---------------------------------------------------------------------------- gateway: HTTP/1.1
async def gateway_once(args, seed: int, fmt: str = "pcm") -> dict:
    u = urlparse(args.gateway_url)
    body = json.dumps({"model": args.model, "input": TEXT, "voice": "default", "response_format": fmt,
                       "seed": seed, "min_length": args.min_length, "max_length": args.max_length}).encode()
    head = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n")
    if args.api_key:
        head += f"Authorization: Bearer {args.api_key}\r\n"
    rec = {"ttfb_s": None, "total_s": None, "audio_s": 0.0, "error": None}
    writer = None
    try:
        reader, writer = await asyncio.open_connection(u.hostname, u.port or 80, limit=1 << 22)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()  # connected: an SDK reuses its connections
        writer.write(head.encode() + b"\r\n" + body)
        lines = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), args.timeout)).decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {(await reader.read(2000)).decode(errors='replace')}")
        rate = int(headers.get("x-sample-rate", "0"))
        nbytes = 0
        while True:
            size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), args.timeout)).split(b";")[0], 16)
            if size == 0:
                break
            await reader.readexactly(size + 2)
            if rec["ttfb_s"] is None:
                rec["ttfb_s"] = time.perf_counter() - t0
            nbytes += size
        rec["total_s"] = time.perf_counter() - t0
        rec["audio_s"] = nbytes / 2 / rate if fmt == "pcm" and rate else 0.0
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        if writer is not None:
            writer.close()
    return rec


# ---------------------------------------------------------------------------- the two measurements
async def single_stream(args) -> dict:
    import tritonclient.grpc.aio as grpcaio

    client = grpcaio.InferenceServerClient(args.grpc_url)
    out = {"direct": [], **{f"gateway_{f}": [] for f in args.formats}}
    try:
        for i in range(args.warmup):
            await direct_once(client, args, 1000 + i)
            await gateway_once(args, 1000 + i)
        for i in range(args.requests):
            out["direct"].append(await direct_once(client, args, i))
            for f in args.formats:
                out[f"gateway_{f}"].append(await gateway_once(args, i, f))
    finally:
        await client.close()
    res = {k: {"ttfb_ms": _stats([r["ttfb_s"] * 1e3 for r in v if r["ttfb_s"] is not None]),
               "errors": [r["error"] for r in v if r["error"]][:5], "n_errors": sum(bool(r["error"]) for r in v)}
           for k, v in out.items()}
    d, g = res["direct"]["ttfb_ms"]["p50"], res["gateway_pcm"]["ttfb_ms"]["p50"] if "pcm" in args.formats else None
    res["delta_p50_ms"] = None if d is None or g is None else g - d
    res["target_delta_p50_ms"] = 5.0
    res["ok"] = res["delta_p50_ms"] is not None and res["delta_p50_ms"] <= 5.0 and not any(
        v["n_errors"] for k, v in res.items() if isinstance(v, dict) and "n_errors" in v)
    return res


async def concurrent(args, path: str) -> dict:
    import tritonclient.grpc.aio as grpcaio

    clients = []
    recs: list[dict] = []

    async def worker(w: int):
        client = None
        if path == "direct":
            client = grpcaio.InferenceServerClient(args.grpc_url)
            clients.append(client)
        await start.wait()
        for r in range(args.requests_per_stream):
            seed = w * 1000 + r
            rec = await (direct_once(client, args, seed) if path == "direct" else gateway_once(args, seed))
            recs.append(rec)

    start = asyncio.Event()
    tasks = [asyncio.create_task(worker(w)) for w in range(args.concurrency)]
    await asyncio.sleep(0.5)  # every worker is waiting (and its gRPC client made)
    t0 = time.perf_counter()
    start.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    for c in clients:
        await c.close()
    ok = [r for r in recs if not r["error"]]
    audio = sum(r["audio_s"] for r in ok)
    return {"streams": args.concurrency, "requests": len(recs), "errors": len(recs) - len(ok),
            "first_errors": [r["error"] for r in recs if r["error"]][:5], "wall_s": wall, "audio_s": audio,
            "x_real_time": audio / wall if wall > 0 else None,
            "ttfb_ms": _stats([r["ttfb_s"] * 1e3 for r in ok if r["ttfb_s"] is not None]),
            "rtf": _stats([r["total_s"] / r["audio_s"] for r in ok if r["audio_s"]])}


async def main_async(args) -> dict:
    result = {"bench": "gateway", "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "host": socket.gethostname(), "python": platform.python_version(), "args": vars(args)}
    print(f"[bench_gateway] 1 stream: {args.requests} requests each way ({args.max_length} patches)", flush=True)
    result["single"] = s = await single_stream(args)
    for k, v in s.items():
        if isinstance(v, dict) and "ttfb_ms" in v:
            t = v["ttfb_ms"]
            print(f"  {k:12s} TTFB p50 {t['p50']:.1f} ms  p95 {t['p95']:.1f} ms  (n={t['n']}, errors "
                  f"{v['n_errors']})" if t["n"] else f"  {k}: no data {v['errors']}", flush=True)
    print(f"  gateway - direct p50: {s['delta_p50_ms']} ms (target <= 5): {'OK' if s['ok'] else 'NOT MET'}")
    if args.concurrency:
        result["concurrent"] = c = {}
        for path in ("direct", "gateway"):
            print(f"[bench_gateway] {args.concurrency} streams x {args.requests_per_stream}: {path}", flush=True)
            c[path] = r = await concurrent(args, path)
            print(f"  {r['x_real_time']:.1f}x real time, TTFB p50 {r['ttfb_ms']['p50']} ms, errors {r['errors']}",
                  flush=True)
        d, g = c["direct"]["x_real_time"], c["gateway"]["x_real_time"]
        c["ratio"] = g / d if d else None
        c["ok"] = bool(c["ratio"] is not None and c["ratio"] >= 1 - args.tolerance and not c["gateway"]["errors"])
        print(f"  gateway / direct aggregate: {c['ratio']:.3f} (tolerance {args.tolerance}): "
              f"{'OK' if c['ok'] else 'NOT MET'}")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grpc-url", default="127.0.0.1:8001")
    ap.add_argument("--gateway-url", default="http://127.0.0.1:9000")
    ap.add_argument("--api-key", default=os.environ.get("VOXCPM_OPENAI_API_KEY"))
    ap.add_argument("--model", default="voxcpm2")
    ap.add_argument("--requests", type=int, default=30, help="single-stream requests each way")
    ap.add_argument("--formats", default="pcm", help="gateway formats for the single-stream TTFB, e.g. pcm,wav,mp3")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=32, help="0: skip the concurrent measurement")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--min-length", type=int, default=100)
    ap.add_argument("--max-length", type=int, default=100)
    ap.add_argument("--tolerance", type=float, default=0.03, help="aggregate loss still counted as none")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    args.formats = [f for f in args.formats.split(",") if f]
    result = asyncio.run(main_async(args))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"[bench_gateway] wrote {args.json_out}")
    return 0 if result["single"]["ok"] and result.get("concurrent", {}).get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
