"""Liveness probe: one real, tiny synthesis through `tts_stream` (HTTP generate_stream).

Triton's own health endpoints keep answering 200 after a model process has died (the
Python backend of 2.51 does not restart it), so this asks the whole pipeline to make
two patches of audio instead. Standard library only: it runs in the container's healthcheck
(scripts/probe.py, which needs this checkout's python_backend/ beside it) and in the supervisor.

    python3 scripts/probe.py [--url http://127.0.0.1:8000] [--timeout 60] [--metrics-url http://127.0.0.1:8002]

Exit status: 0 healthy (audio came back, or the server refused the probe as busy: it is
alive, only full; or, given the metrics URL, no audio in time while the engine kept decoding
the requests still queued ahead of the probe), 1 not healthy (unreachable, an error, no audio in
time), 2 broken (a model process is dead: restart the server now).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.request

HEALTHY, UNHEALTHY, BROKEN = 0, 1, 2
UNHEALTHY_PREFIX = "VoxCPM server unhealthy: "  # serving/triton_io.Unhealthy
BUSY_MARKERS = ("server busy", "shutting down")
# Triton's answer for a model whose process has died: 2.51 does not start it again
DEAD_STUB = re.compile(r"Stub process '[^']*' is not healthy")
STEPS_METRIC = "voxcpm_engine_decode_steps_total"  # serving/metrics.py
WAITING_METRIC = "voxcpm_engine_waiting_requests"
PROBE_STEPS = 2  # the probe's own MAX_LENGTH: at most this many decode steps are its own
METRICS_TIMEOUT_S = 2.0


def engine_load(metrics_url: str | None) -> tuple[float, float] | None:
    """(decode steps run, requests waiting for admission) over every decoder instance; None if unknown."""
    if not metrics_url:
        return None
    try:
        with urllib.request.urlopen(f"{metrics_url.rstrip('/')}/metrics", timeout=METRICS_TIMEOUT_S) as r:
            text = r.read().decode(errors="replace")
    except Exception:  # refused, timed out, a broken HTTP answer: unknown
        return None

    def total(name):
        values = re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
        return sum(float(v) for v in values) if values else None

    steps, waiting = total(STEPS_METRIC), total(WAITING_METRIC)
    return None if steps is None or waiting is None else (steps, waiting)


def probe(url: str = "http://127.0.0.1:8000", timeout: float = 60.0, model: str = "tts_stream",
          metrics_url: str | None = None) -> tuple[int, str]:
    """-> (status, what happened). With `metrics_url`, a probe that times out while requests still
    wait for the decoder and the engine ran more decode steps than the probe's own is healthy: it
    waited behind other requests (a full queue of long ones)."""
    try:
        return _probe(url, timeout, model, metrics_url)
    except Exception as e:  # whatever breaks in here is the probe's verdict, not its crash
        return UNHEALTHY, f"probe failed: {type(e).__name__}: {e}"


def _probe(url, timeout, model, metrics_url) -> tuple[int, str]:
    before = engine_load(metrics_url)
    body = json.dumps({"TEXT": "Probe.", "SEED": 1, "MIN_LENGTH": 1, "MAX_LENGTH": PROBE_STEPS}).encode()
    req = urllib.request.Request(f"{url.rstrip('/')}/v2/models/{model}/generate_stream", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            events = [json.loads(line[5:]) for line in (x.decode().strip() for x in r) if line.startswith("data:")]
    except urllib.error.HTTPError as e:
        return _classify(e.read().decode(errors="replace"))
    except (OSError, ValueError) as e:  # refused, reset, timed out, garbled
        after = engine_load(metrics_url) if before is not None and "timed out" in str(e) else None
        if after is not None and after[0] - before[0] > PROBE_STEPS and after[1] > 0:
            return HEALTHY, (f"alive but busy: no audio within {timeout:g} s while the engine ran "
                             f"{after[0] - before[0]:.0f} decode steps and {after[1]:.0f} requests still "
                             "wait for it")
        return UNHEALTHY, f"no answer: {e}"
    errors = [str(e["error"]) for e in events if "error" in e]
    if errors:
        return _classify(errors[0])
    if not any(e.get("AUDIO") for e in events):
        return UNHEALTHY, "the synthesis returned no audio"
    return HEALTHY, f"synthesized in {time.monotonic() - t0:.2f} s"


def _classify(message: str) -> tuple[int, str]:
    if UNHEALTHY_PREFIX in message or DEAD_STUB.search(message):
        return BROKEN, message
    if any(m in message for m in BUSY_MARKERS):
        return HEALTHY, f"alive but busy: {message}"
    return UNHEALTHY, message


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="Triton's HTTP endpoint (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the audio (default %(default)s)")
    ap.add_argument("--metrics-url", help="Triton's metrics endpoint (http://host:8002): a probe that times out "
                                          "while the engine keeps decoding is healthy, only queued")
    ap.add_argument("--quiet", action="store_true", help="print no verdict; the exit status alone says it")
    args = ap.parse_args(argv)
    status, what = probe(args.url, args.timeout, metrics_url=args.metrics_url)
    if not args.quiet:
        print(("healthy: " if status == HEALTHY else "UNHEALTHY: ") + what, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
