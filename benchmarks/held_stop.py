#!/usr/bin/env python3
"""How long a supervised server takes to stop after clients cancelled their gRPC streams right
after the final responses (what Triton 2.51 can keep a model loaded for: the supervisor's
"held" stop, `TritonServer.wait_exit` in python_backend/voxcpm_triton/supervisor/tritonserver.py).

Each run starts scripts/serve.sh (the supervisor, no gateway, no probes) on the given checkpoint
(with --environ: scripts/supervise.py over $TRITONSERVER_BIN and $TRITON_BACKEND_DIR as this process
has them, e.g. after gpu_box/device_serve_env.sh on the GPU machine),
sends --rounds rounds of 4 `tts_stream` requests on one gRPC stream, cancels the stream as soon as
all 4 final responses are in, then sends SIGTERM and times the stop. One JSON line per run:
the stop's seconds, the supervisor's exit code, processes left, and the supervisor's lines about
a held or late server.

    .venv/bin/python benchmarks/held_stop.py --runs 6 --rounds 20
    source gpu_box/device_serve_env.sh && python3 benchmarks/held_stop.py --environ --checkpoint /tmp/full
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.server import _free_ports, _pids_in_group, triton_env  # noqa: E402


def _round(url: str, streams: int, max_length: int):
    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i in range(streams):
        text = grpcclient.InferInput("TEXT", [1], "BYTES")
        text.set_data_from_numpy(np.array([f"hello number {i}".encode()], dtype=object))
        length = grpcclient.InferInput("MAX_LENGTH", [1], "INT32")
        length.set_data_from_numpy(np.array([max_length], np.int32))
        client.async_stream_infer("tts_stream", [text, length], enable_empty_final_response=True)
    done = 0
    while done < streams:
        result, error = answers.get(timeout=60)
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
            done += 1
    client.stop_stream(cancel_requests=True)  # the hostile part: every request has already ended
    client.close()


def _ready(http: int, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def run_once(checkpoint: str, rounds: int, log_path: str, environ: bool = False) -> dict:
    http, grpc, metrics = _free_ports(3)
    if environ:
        env = dict(os.environ, VOXCPM_CHECKPOINT=checkpoint, VOXCPM_PROBE_INTERVAL="0")
        cmd = [sys.executable, str(ROOT / "scripts" / "supervise.py"), "--", env["TRITONSERVER_BIN"],
               f"--model-repository={ROOT / 'model_repository'}", f"--backend-directory={env['TRITON_BACKEND_DIR']}",
               "--http-address=127.0.0.1", f"--http-port={http}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
               "--metrics-address=127.0.0.1", f"--metrics-port={metrics}", "--exit-timeout-secs=30"]
    else:
        env = triton_env()
        env.update(SKIP_SETUP="1", TRITON_HTTP_PORT=str(http), TRITON_GRPC_PORT=str(grpc),
                   TRITON_METRICS_PORT=str(metrics), VOXCPM_CHECKPOINT=checkpoint, VOXCPM_PROBE_INTERVAL="0",
                   OPENAI_API_PORT="0")
        cmd = ["bash", str(ROOT / "scripts" / "serve.sh")]
    with open(log_path, "wb") as f:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        if not _ready(http, proc, 900):
            raise RuntimeError(f"the server did not become ready; see {log_path}")
        for _ in range(rounds):
            _round(f"127.0.0.1:{grpc}", 4, 4)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        stop_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    text = Path(log_path).read_text(errors="replace")
    said = [line for line in text.splitlines()
            if "still holds" in line or "did not exit in time" in line or "Exit timeout expired" in line]
    return {"stop_s": round(stop_s, 1), "exit_code": code, "left": _pids_in_group(proc.pid), "said": said}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "tiny"))
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=20, help="rounds of 4 streams per server")
    ap.add_argument("--environ", action="store_true",
                    help="scripts/supervise.py over $TRITONSERVER_BIN and $TRITON_BACKEND_DIR, not scripts/serve.sh")
    ap.add_argument("--logs", help="keep each run's server log here (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="held-stop-") as d:
        logs = args.logs or d
        os.makedirs(logs, exist_ok=True)
        for k in range(args.runs):
            print(f"[held_stop] run {k + 1}/{args.runs}: starting a server", file=sys.stderr, flush=True)
            result = run_once(args.checkpoint, args.rounds, os.path.join(logs, f"serve_{k}.log"), args.environ)
            print(json.dumps({"run": k, **result}), flush=True)


if __name__ == "__main__":
    main()
