#!/usr/bin/env python3
"""SIGTERM to a supervised server (scripts/supervise.py, as `docker stop` sends it) while streams
run: how each stream ends and how the server goes.

    python3 benchmarks/shutdown_drain.py --url 127.0.0.1:8001 --pid SUPERVISOR_PID --log serve.log \
        --streams 64 --length 3000 --exit-timeout 30 --json-out drain.json

Starts --streams gRPC streams on tts_stream (--length patches each: long enough to outlast half the
exit timeout), waits until each has audio, sends SIGTERM to --pid and records, from then, when
each stream ended and with what, and when the supervisor had exited. From --log (the
supervisor's and tritonserver's output): tritonserver's exit code, and whether the exit timeout
cut it off or a process crashed. Expected: every stream ends with "the server is shutting down"
about half the exit timeout after the SIGTERM, and everything gone, tritonserver with code 0, before the exit
timeout. (--pid need not be a child of this process: its own exit code is for the shell that
started it.)
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_served import DEFAULT_TEXT, build_inputs  # noqa: E402


class Stream:
    def __init__(self, url: str, index: int, length: int):
        import tritonclient.grpc as grpcclient

        self.chunks, self.error, self.ended_at = 0, None, None
        self.first = threading.Event()
        self.done = threading.Event()
        self.q: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=self._on)
        self.client.async_stream_infer("tts_stream", build_inputs(grpcclient, DEFAULT_TEXT, length, length, index),
                                       enable_empty_final_response=True)

    def _on(self, result, error):
        if error is not None:
            self.error = str(error)
        elif not result.get_response().parameters["triton_final_response"].bool_param:
            self.chunks += 1
            self.first.set()
            return
        self.ended_at = time.monotonic()
        self.first.set()
        self.done.set()

    def close(self):
        try:
            self.client.stop_stream(cancel_requests=not self.done.is_set())
            self.client.close()
        except Exception:  # noqa: BLE001 - the server is gone
            pass


def _running(pid: int) -> bool:
    """Alive and not a zombie (the shell that started it reaps it, and reads its exit code)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="tritonserver's gRPC address")
    ap.add_argument("--pid", type=int, required=True, help="the supervisor's pid (scripts/supervise.py)")
    ap.add_argument("--log", required=True, help="the supervisor's output (tritonserver's log within it)")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--length", type=int, default=3000, help="patches per stream")
    ap.add_argument("--exit-timeout", type=float, default=30.0, help="tritonserver's --exit-timeout-secs")
    ap.add_argument("--json-out", required=True)
    args = ap.parse_args(argv)

    streams = [Stream(args.url, i, args.length) for i in range(args.streams)]
    deadline = time.monotonic() + 300
    for s in streams:
        if not s.first.wait(max(0.0, deadline - time.monotonic())):
            raise SystemExit("shutdown_drain: a stream had no audio after 300 s")
    t0 = time.monotonic()
    os.kill(args.pid, signal.SIGTERM)
    print(f"[shutdown_drain] {len(streams)} streams with audio; SIGTERM to {args.pid}", flush=True)
    for s in streams:
        s.done.wait(max(0.0, t0 + args.exit_timeout + 30 - time.monotonic()))
    ended = [s.ended_at - t0 for s in streams if s.ended_at is not None]
    for s in streams:  # a client closes its stream once its request has ended (Triton waits for that)
        s.close()
    while _running(args.pid) and time.monotonic() - t0 < args.exit_timeout + 60:
        time.sleep(0.1)
    gone = time.monotonic() - t0
    log = open(args.log, encoding="utf-8", errors="replace").read()
    server = re.findall(r"tritonserver stopped in [0-9.]+ s \(exit code (-?\d+)\)", log)
    result = {
        "streams": len(streams),
        "length": args.length,
        "exit_timeout_s": args.exit_timeout,
        "ended": len(ended),
        "ended_shutting_down": sum("shutting down" in (s.error or "") for s in streams),
        "ended_otherwise": sorted({s.error or "no error" for s in streams if "shutting down" not in (s.error or "")}),
        "ended_s": {"min": min(ended), "median": statistics.median(ended), "max": max(ended)} if ended else None,
        "supervisor_exit_s": gone,
        "tritonserver_exit_code": int(server[-1]) if server else None,
        "exit_timeout_expired": "Exit timeout expired" in log,
        "crashes": len(re.findall(r"Fatal Python error|Signal \((?:6|11)\) received", log)),
    }
    with open(args.json_out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    ok = (result["ended_shutting_down"] == len(streams) and result["tritonserver_exit_code"] == 0
          and not result["exit_timeout_expired"] and not result["crashes"] and gone < args.exit_timeout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
