"""Liveness beacons, and the requests each model process holds.

Each model process (`WATCHED_MODELS`) writes `<model>.<pid>.json` into the server's run directory
every second ({pid, beat, error, busy}); `error` is set when the process knows it can no longer
serve (the engine thread died). Triton 2.51 neither restarts a dead stub nor reports it, so the
orchestrators read the beacons to fail fast instead of waiting forever, and the supervisor
reads them to restart the server. `busy`: the requests its executes (`counted`) hold now; the
supervisor reads it while the server stops. No torch here.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import threading
import time

from . import processes, run_state

log = logging.getLogger("voxcpm_triton.liveness")

BEACON_PERIOD_S = 1.0
# A beacon older than this means its process is stuck or gone (the engine loop wakes every
# 50 ms even when idle; one CPU prefill of the largest prompt takes a few seconds).
BEACON_STALE_S = 15.0
INTERNAL_MODELS = ("text_normalizer", "tokenizer", "vae_encoder", "vae_decoder", "decoder")
# Every model writes a beacon: the Python backend of Triton 2.51 does not restart a dead model
# process, whose requests then fail (or hang, if it died with some in flight) until the server is
# restarted. A dead one anywhere makes every request fail as unhealthy, and the supervisor restarts it.
WATCHED_MODELS = (*INTERNAL_MODELS, "tts", "tts_stream", "voices", "loras")


_busy = 0  # requests inside this process's counted executes
_busy_lock = threading.Lock()


def _add_busy(n: int):
    global _busy
    with _busy_lock:
        _busy += n


def busy() -> int:
    """Requests this process's executes hold now (`counted`)."""
    return _busy


def counted(execute):
    """A model's `execute` (plain or async) whose requests count as busy while it runs. An
    orchestrator's execute lasts as long as its requests; a decoupled model that holds requests
    past its execute (the decoder) adds them through its Beacon's `work`."""
    if inspect.iscoroutinefunction(execute):
        @functools.wraps(execute)
        async def run_async(self, requests):
            _add_busy(len(requests))
            try:
                return await execute(self, requests)
            finally:
                _add_busy(-len(requests))
        return run_async

    @functools.wraps(execute)
    def run(self, requests):
        _add_busy(len(requests))
        try:
            return execute(self, requests)
        finally:
            _add_busy(-len(requests))
    return run


class Beacon:
    """Writes this process's beacon every second until `stop`. `status()` -> None when healthy,
    else a reason (written as the beacon's error)."""

    def __init__(self, model: str, status=lambda: None, period_s: float = BEACON_PERIOD_S, work=lambda: 0):
        self.path = os.path.join(run_state.run_dir(), f"{model}.{os.getpid()}.json")
        self.status, self.period, self.work = status, period_s, work  # work: requests held past execute
        self._stop = threading.Event()
        self.write()
        self._thread = threading.Thread(target=self._run, name=f"beacon-{model}", daemon=True)
        self._thread.start()

    def write(self):
        try:
            error = self.status()
        except Exception as e:  # noqa: BLE001 - a broken status check is itself a failure
            error = f"status check failed: {e}"
        try:
            held = busy() + self.work()
        except Exception:  # noqa: BLE001 - unknown counts as busy
            held = 1
        run_state.write_atomic(self.path, json.dumps({"pid": os.getpid(), "beat": time.time(), "error": error,
                                                      "busy": held}))

    def _run(self):
        while not self._stop.wait(self.period):
            try:
                self.write()
            except OSError:
                log.exception("writing the liveness beacon %s failed", self.path)

    def stop(self):
        self._stop.set()
        # A write under way would put the file back after the unlink (a dead pid's beacon, read as
        # "has died"); a stuck status check must not hold up finalize for long either.
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _beacons(directory: str, models) -> list[tuple[str, str, dict]]:
    """(file name, model, contents with an int pid) of each beacon of `models` in `directory` that
    reads whole; one being replaced right now is left out. OSError if the directory cannot be listed."""
    out = []
    for name in os.listdir(directory):
        model, _, rest = name.partition(".")
        if model not in models or not rest.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                b = json.load(f)
            b["pid"] = int(b["pid"])
        except (OSError, ValueError, TypeError, KeyError):
            continue
        out.append((name, model, b))
    return out


def beacon_fault(models=WATCHED_MODELS, now: float | None = None,
                 directory: str | None = None) -> tuple[str, str] | None:
    """None if every beacon of `models` in this server's directory (`directory`: another server's,
    the supervisor's view) is fresh, from a live process and error-free; else (kind, why), kind one of
    "unreadable" (the directory), "dead", "error" (the process says it cannot serve) or "stale". A
    dead or broken process is named before a stale beacon, which may be a clock step. A model with
    no beacon yet counts as healthy (it is loading, or not part of this repository)."""
    now = time.time() if now is None else now
    directory = directory or run_state.run_dir()
    try:
        beacons = _beacons(directory, models)
    except OSError as e:
        return "unreadable", f"cannot read the server's runtime directory: {e}"
    stale = None
    for _, model, b in beacons:
        pid, error = b["pid"], b.get("error")
        try:
            beat = float(b["beat"])
        except (ValueError, TypeError, KeyError):
            continue
        if not processes.process_alive(pid):
            return "dead", f"the {model} model process (pid {pid}) has died"
        if error:
            return "error", f"the {model} model cannot serve: {error}"
        if stale is None and now - beat > BEACON_STALE_S:
            stale = "stale", f"the {model} model process (pid {pid}) has not answered for {now - beat:.0f} s"
    return stale


def busy_beacons(directory: str, models=WATCHED_MODELS) -> dict[str, int] | None:
    """{beacon file name: requests it says its process holds} for each live model process of a
    server (`directory`: its runtime directory); None if the directory cannot be read. A beacon
    without a count counts as busy."""
    try:
        beacons = _beacons(directory, models)
    except OSError:
        return None
    out = {}
    for name, _, b in beacons:
        if processes.process_alive(b["pid"]):
            count = b.get("busy")
            out[name] = count if isinstance(count, int) else 1
    return out


def unhealthy(models=WATCHED_MODELS, now: float | None = None) -> str | None:
    """beacon_fault's reason, for this server's directory; None when healthy."""
    fault = beacon_fault(models, now)
    return None if fault is None else fault[1]
