#!/usr/bin/env python3
"""Stress the decoupled-BLS pattern the orchestrator uses, with no model behind it.

`benchmarks/bls_stress/` holds two toy models: `streamer` (decoupled; one thread sends every
request's responses, then each final flag, as the decoder's audio thread does) and `caller`
(decoupled, `async def execute`; keeps CONCURRENCY decoupled BLS calls to `streamer` in flight,
read as --mode says: `counted`, the orchestrator's reader; `waiting`, the thread per call it
used before). Each round sends CLIENTS requests to `caller` for --seconds; a round that does
not answer in time is a stall: the native stacks of both stub processes go to the log (gdb),
and the run stops.

    .venv/bin/python benchmarks/bls_stress.py --mode waiting --rounds 12 --seconds 10 --responses 5
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.server import TritonServer, _cmdline  # noqa: E402


def _round(url: str, clients: int, seconds: float, concurrency: int, responses: int, mode: str, timeout: float):
    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for _ in range(clients):
        inputs = []
        for name, value, dtype in (("DURATION_S", seconds, np.float32), ("CONCURRENCY", concurrency, np.int32),
                                   ("RESPONSES", responses, np.int32)):
            t = grpcclient.InferInput(name, [1], "FP32" if dtype is np.float32 else "INT32")
            t.set_data_from_numpy(np.array([value], dtype))
            inputs.append(t)
        t = grpcclient.InferInput("MODE", [1], "BYTES")
        t.set_data_from_numpy(np.array([mode.encode()], dtype=object))
        inputs.append(t)
        client.async_stream_infer("caller", inputs)
    calls, waiting, errors, answered = 0, 0, [], 0
    deadline = time.monotonic() + seconds + timeout
    try:
        for answered in range(clients):
            result, error = answers.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                errors.append(str(error))
            else:
                calls += int(result.as_numpy("CALLS")[0])
                waiting += int(result.as_numpy("WAITING")[0])
        answered = clients
    except queue.Empty:
        return None, None, errors
    finally:
        # Cancel only what is still open: a stream cancelled right after its last final response
        # sometimes leaves tritonserver 2.51 holding `caller` (it never unloads, and the server's stop
        # runs out its exit timeout), as the project's client does.
        client.stop_stream(cancel_requests=answered < clients)
        client.close()
    return calls, waiting, errors


def _stacks(pids: list[int]) -> str:
    out = []
    for pid in pids:
        gdb = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"],
                             capture_output=True, text=True, timeout=120)
        out.append(f"===== pid {pid}: {_cmdline(pid)}\n{gdb.stdout[-60000:]}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of one round")
    ap.add_argument("--clients", type=int, default=2, help="requests to `caller` per round")
    ap.add_argument("--concurrency", type=int, default=64, help="BLS calls each request keeps in flight")
    ap.add_argument("--responses", type=int, default=20, help="responses per BLS call, before its final flag")
    ap.add_argument("--mode", choices=("counted", "waiting"), default="counted",
                    help="counted: read as the orchestrator does (serving/bls); waiting: a thread per call "
                         "waiting in the response iterator (before)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds past a round's length that make a stall")
    ap.add_argument("--out", default=None, help="JSON summary here")
    ap.add_argument("--stacks", default=None, help="on a stall, the stub processes' stacks here")
    ap.add_argument("--log", default=None, help="the server's log here")
    a = ap.parse_args()

    summary = {"args": vars(a), "rounds": [], "stalled": False}
    with TritonServer(ROOT / "benchmarks" / "bls_stress", log_path=a.log) as srv:
        for i in range(a.rounds):
            t0 = time.monotonic()
            calls, waiting, errors = _round(srv.grpc_url, a.clients, a.seconds, a.concurrency, a.responses,
                                            a.mode, a.timeout)
            wall = time.monotonic() - t0
            summary["rounds"].append({"calls": calls, "read_waiting": waiting, "errors": errors[:3],
                                      "wall_s": round(wall, 2)})
            print(f"[bls_stress] round {i + 1}/{a.rounds}: "
                  + (f"{calls} calls in {wall:.1f} s, {waiting} read by a waiting thread" if calls is not None
                     else f"STALLED ({wall:.0f} s)")
                  + (f", errors {errors[:2]}" if errors else ""), flush=True)
            if calls is None:
                summary["stalled"] = True
                stubs = srv.stub_pids()
                print(f"[bls_stress] live stub processes: {[_cmdline(p).split()[-2] for p in stubs]}", flush=True)
                stacks = _stacks(stubs)
                if a.stacks:
                    Path(a.stacks).write_text(stacks)
                print(stacks[-20000:] if not a.stacks else f"[bls_stress] stacks in {a.stacks}", flush=True)
                break
    # A stub that crashed (its stacks are in the log: both models register faulthandler, runtime.model_process) or did not stop.
    summary["crashed"] = "Fatal Python error" in srv.log
    summary["exit_code"], summary["leftover_processes"] = srv.returncode, srv.leftover_processes
    if summary["crashed"]:
        print("[bls_stress] a stub process crashed:\n" + srv.log[srv.log.index("Fatal Python error"):][:3000])
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1))
    print(f"[bls_stress] {'STALLED' if summary['stalled'] else 'no stall'} after "
          f"{len(summary['rounds'])} round(s); {'a stub CRASHED' if summary['crashed'] else 'no crash'}; "
          f"server exit code {srv.returncode}")
    return 1 if summary["stalled"] or summary["crashed"] else 0


if __name__ == "__main__":
    sys.exit(main())
