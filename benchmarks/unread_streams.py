"""Memory a tts_stream client that stops reading makes tritonserver hold (README, "A streaming
client that stops reading").

Opens `--streams` gRPC streams of `--patches` patches each whose response callback blocks, so the
client reads nothing past its first response, samples the resident memory of the server process
`--pid` every `--every` seconds for `--seconds`, then closes the clients and samples it again.

  python benchmarks/unread_streams.py --url 127.0.0.1:8001 --pid $(pgrep -x tritonserver) \
      --streams 1 --patches 4000 --seconds 50 [--out unread.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _input(grpcclient, name: str, arr: np.ndarray, datatype: str):
    t = grpcclient.InferInput(name, list(arr.shape), datatype)
    t.set_data_from_numpy(arr)
    return t


def open_unread(grpcclient, url: str, patches: int, seed: int, release: threading.Event):
    """A client whose one stream asks for `patches` patches (one CFM step each: the fastest) and reads none."""
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: release.wait())
    n = np.array([patches], np.int32)
    c.async_stream_infer("tts_stream", [
        _input(grpcclient, "TEXT", np.array([b"Nobody reads this."], dtype=object), "BYTES"),
        _input(grpcclient, "SEED", np.array([seed], np.int64), "INT64"),
        _input(grpcclient, "MIN_LENGTH", n, "INT32"), _input(grpcclient, "MAX_LENGTH", n, "INT32"),
        _input(grpcclient, "INFERENCE_TIMESTEPS", np.array([1], np.int32), "INT32")])
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="127.0.0.1:8001", help="Triton's gRPC address")
    ap.add_argument("--pid", type=int, required=True, help="the tritonserver process to sample")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--patches", type=int, default=4000)
    ap.add_argument("--seconds", type=float, default=50.0)
    ap.add_argument("--every", type=float, default=5.0)
    ap.add_argument("--out", help="write the samples here as JSON")
    args = ap.parse_args(argv)
    import tritonclient.grpc as grpcclient

    release = threading.Event()
    base = rss_mb(args.pid)
    samples = [(0.0, 0.0)]
    print(f"tritonserver {args.pid}: {base:.0f} MB before; {args.streams} unread stream(s) of {args.patches} patches",
          flush=True)
    clients = [open_unread(grpcclient, args.url, args.patches, i, release) for i in range(args.streams)]
    t0 = time.monotonic()
    try:
        while (t := time.monotonic() - t0) < args.seconds:
            time.sleep(min(args.every, args.seconds - t))
            samples.append((round(time.monotonic() - t0, 1), round(rss_mb(args.pid) - base, 1)))
            print(f"{samples[-1][0]:6.1f} s: +{samples[-1][1]:.0f} MB", flush=True)
    finally:
        release.set()
        for c in clients:
            c.stop_stream(cancel_requests=True)
            c.close()
    time.sleep(args.every)
    after = round(rss_mb(args.pid) - base, 1)
    print(f"{args.every:g} s after the clients closed: +{after:.0f} MB", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"streams": args.streams, "patches": args.patches, "base_mb": round(base, 1),
                       "samples_s_mb": samples, "after_close_mb": after}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
