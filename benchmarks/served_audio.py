#!/usr/bin/env python3
"""Fixed-seed audio from a served `tts_stream`, to compare two server configurations on the GPU.

    python3 benchmarks/served_audio.py --url 127.0.0.1:8001 --out a.npz    # N streams at once
    python3 benchmarks/served_audio.py --compare a.npz b.npz              # per request: max |a - b|

Each request (a text, a seed, 100 steps) runs as its own gRPC stream, all at once, so that the
server batches them (bf16 rounding then depends on the batches, which depend on timing), or with
--sequential one after the other (batch 1: the same latents on both servers); every chunk's size
is kept with the audio.
"""
from __future__ import annotations

import argparse
import json
import queue
import sys
import threading

import numpy as np

from bench_served import build_inputs

TEXTS = ("The quick brown fox jumps over the lazy dog near the quiet river bank.",
         "Streaming speech should sound the same whichever process decodes it.",
         "A third voice, a little shorter.",
         "Numbers like 42 and 7 are read out too.")


def _stream(url: str, text: str, seed: int, length: int, out: dict):
    import tritonclient.grpc as grpcclient

    q: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    c.async_stream_infer("tts_stream", build_inputs(grpcclient, text, length, length, seed),
                         enable_empty_final_response=True)
    chunks = []
    try:
        while True:
            r, e = q.get(timeout=120)
            if e is not None:
                raise RuntimeError(str(e))
            if r.get_response().parameters["triton_final_response"].bool_param:
                break
            chunks.append(r.as_numpy("AUDIO"))
    finally:
        c.stop_stream()
        c.close()
    out[seed] = chunks


def record(url: str, path: str, n: int, length: int, sequential: bool = False) -> None:
    got: dict = {}
    threads = [threading.Thread(target=_stream, args=(url, TEXTS[i % len(TEXTS)], 1000 + i, length, got))
               for i in range(n)]
    for t in threads:
        t.start()
        if sequential:
            t.join()
    for t in threads:
        t.join()
    arrays = {}
    for seed, chunks in got.items():
        arrays[f"audio_{seed}"] = np.concatenate(chunks)
        arrays[f"chunks_{seed}"] = np.array([c.size for c in chunks])
    np.savez(path, **arrays)
    print(f"[served_audio] {len(got)} of {n} requests recorded in {path}")


def compare(a_path: str, b_path: str) -> dict:
    a, b = np.load(a_path), np.load(b_path)
    rows = {}
    for k in sorted(x for x in a.files if x.startswith("audio_")):
        x, y = a[k], b[k]
        if x.shape != y.shape:
            rows[k] = {"shape_a": list(x.shape), "shape_b": list(y.shape)}
            continue
        cos = float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y) + 1e-30))
        rows[k] = {"max_abs": float(np.abs(x - y).max()), "peak": float(np.abs(x).max()), "cosine": cos}
    print(json.dumps(rows, indent=1))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="127.0.0.1:8001")
    ap.add_argument("--out")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--length", type=int, default=100, help="steps per request (MIN = MAX_LENGTH)")
    ap.add_argument("--sequential", action="store_true", help="one request at a time")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args(argv)
    if args.compare:
        compare(*args.compare)
    elif args.out:
        record(args.url, args.out, args.streams, args.length, args.sequential)
    else:
        ap.error("--out or --compare")
    return 0


if __name__ == "__main__":
    sys.exit(main())
