"""What a torch call costs a thread while another thread of its process runs Python (CPU only).

Each torch call that dispatches an op lets go of the GIL around the op; taking it back waits for the
interpreter's switch interval (5 ms by default) whenever another thread runs Python meanwhile. The
decoder's process runs its engine thread, its audio thread and Triton's `execute` side by side, so a
torch call per request row made its per-step host work wait (benchmarks/results.md, sixty-sixth
session). This times the per-row host work of the code before and after that session's change, alone
and beside 0-2 threads running Python, at the switch intervals given.

    python benchmarks/gil_torch_calls.py [--rows 128] [--switch-ms 5,0.5]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np
import torch


def _rows_torch(patches, stops):  # the engine's delivery before: a view and a bool() per row
    return [(p, bool(s)) for p, s in zip(patches, stops)]


def _rows_numpy(patches, stops):  # after: numpy views and a list
    return list(zip(patches.numpy(), stops.tolist()))


def _latents_torch(requests, frames):  # an audio round's latents before: five ops per request
    zs = []
    for chunks in requests:
        z = torch.cat(chunks).reshape(-1, chunks[0].shape[-1]).T[None]
        zs.append(torch.nn.functional.pad(z, (0, frames - z.shape[-1])))
    return torch.cat(zs)


def _latents_numpy(requests, frames):  # after: numpy, one array
    d = requests[0][0].shape[-1]
    z = np.zeros((len(requests), d, frames), np.float32)
    for row, chunks in zip(z, requests):
        x = np.concatenate([c.numpy() for c in chunks]).reshape(-1, d)
        row[:, :len(x)] = x.T
    return torch.from_numpy(z)


def _timed(fn, *args, repeat: int = 5) -> float:
    """The median of `repeat` runs, ms."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--requests", type=int, default=30, help="requests in an audio round")
    ap.add_argument("--switch-ms", default="5,0.5")
    args = ap.parse_args(argv)
    patches, stops = torch.randn(args.rows, 4, 64), torch.rand(args.rows) > 0.5
    requests = [[torch.randn(1, 4, 64)] for _ in range(args.requests)]
    work = {"step rows, torch": (_rows_torch, patches, stops), "step rows, numpy": (_rows_numpy, patches, stops),
            "round latents, torch": (_latents_torch, requests, 8), "round latents, numpy": (_latents_numpy, requests, 8)}
    print(f"ms, median of 5: {args.rows} step rows, {args.requests} requests' latents")
    for switch in (float(x) for x in args.switch_ms.split(",")):
        sys.setswitchinterval(switch / 1e3)
        for busy in (0, 1, 2):
            stop = threading.Event()

            def spin():
                x = 0
                while not stop.is_set():
                    x += 1

            threads = [threading.Thread(target=spin, daemon=True) for _ in range(busy)]
            for t in threads:
                t.start()
            cells = "; ".join(f"{name} {_timed(*w):.2f}" for name, w in work.items())
            stop.set()
            for t in threads:
                t.join()
            print(f"switch interval {switch} ms, {busy} threads running Python: {cells}")


if __name__ == "__main__":
    main()
