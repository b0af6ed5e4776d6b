"""EXPERIMENT, not used by the server: do two decode engines in one process, each on its own CUDA
stream, make more audio per second than one engine running the same requests as one batch? On an
H100 they do not: 0.72-0.78x at 2-64 requests (benchmarks/results.md, "Fourteenth session").

At small batches a decode step is a chain of ~2000 kernels each bound by its start and tail, not by
the GPU's bandwidth or FLOPs, and nothing inside one step can overlap (each stage needs the one
before). Two independent groups of requests could: engine B's kernels might fill the SMs that engine A's
leave idle. This measures that bound before any engine work: both engines share one `VoxCPM2`
(the weights), each has its own KV cache, graphs and thread; the requests of a batch of b are split
b/2 + b/2 over them and submitted at once, against b on engine A alone, in alternating order.
Throughput only: the outputs are not compared (the two engines share no buffers but the weights and
the compiled code).

    python3 benchmarks/experiments/two_engines.py --checkpoint /tmp/full --out $OUT/two_engines.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python_backend"))
from bench import TEXT, audio_seconds, run_batch  # noqa: E402
from voxcpm_triton import VoxCPM2  # noqa: E402
from voxcpm_triton.engine import Engine, EngineConfig  # noqa: E402


class StreamEngine(Engine):
    """An Engine whose thread issues its GPU work on a stream of its own (the stock one uses the
    thread's current stream, the legacy default stream, which serialises with every other)."""

    def __init__(self, vox, config):
        self.gpu_stream = torch.cuda.Stream(vox.device)
        super().__init__(vox, config)

    def _loop(self):
        with torch.cuda.stream(self.gpu_stream):
            return super()._loop()


def together(engines_and_batches, vox, prompt, steps: int, tag: str) -> dict:
    """run_batch on each (engine, batch) at once, from a thread each -> aggregate over the slowest."""
    out, threads = [None] * len(engines_and_batches), []
    t0 = time.perf_counter()
    for i, (eng, b) in enumerate(engines_and_batches):
        def go(i=i, eng=eng, b=b):
            out[i] = run_batch(eng, vox, prompt, b, steps, f"{tag}{i}")
        threads.append(threading.Thread(target=go))
        threads[-1].start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    total = sum(b for _, b in engines_and_batches)
    return {"batch": total, "wall_s": wall, "aggregate_xrt": total * audio_seconds(vox, steps) / wall,
            "parts": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batches", default="2,4,8,16,32,64")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--kv-gb", type=float, default=4.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    t0 = time.perf_counter()
    vox = VoxCPM2.from_pretrained(args.checkpoint, device="cuda", dtype="bfloat16", attention="triton", compile=True)
    prompt = vox.prepare_prompt(TEXT)
    cfg = dict(max_num_seqs=max(batches), kv_memory_bytes=int(args.kv_gb * 2**30), timestep_buckets=(10, 100))
    a = StreamEngine(vox, EngineConfig(**cfg))
    b = StreamEngine(vox, EngineConfig(**cfg))
    print(f"[two_engines] both engines ready after {time.perf_counter() - t0:.0f} s", flush=True)
    run_batch(a, vox, prompt, 2, 8, "warm-a")
    run_batch(b, vox, prompt, 2, 8, "warm-b")
    rows = []
    for n in batches:
        one, two = [], []
        for r in range(args.reps):  # alternate the order
            for kind in (("one", "two") if r % 2 == 0 else ("two", "one")):
                if kind == "one":
                    one.append(together([(a, n)], vox, prompt, args.steps, f"one{n}-{r}-")["aggregate_xrt"])
                else:
                    two.append(together([(a, n // 2), (b, n - n // 2)], vox, prompt, args.steps,
                                        f"two{n}-{r}-")["aggregate_xrt"])
        row = {"batch": n, "one_engine_xrt": one, "two_engines_xrt": two,
               "ratio_median": statistics.median(two) / statistics.median(one)}
        rows.append(row)
        print(f"[two_engines] batch {n:3d}: one engine {statistics.median(one):7.1f}x  two engines "
              f"{statistics.median(two):7.1f}x  ratio {row['ratio_median']:.2f}", flush=True)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                       "torch": torch.__version__, "steps": args.steps, "rows": rows}, f, indent=1)
    a.shutdown()
    b.shutdown()


if __name__ == "__main__":
    main()
