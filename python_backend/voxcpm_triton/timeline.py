"""An opt-in timeline of a process's events, for the benchmarks (`VOXCPM_TIMELINE=<directory>`).

`event(name, value)` keeps (time.monotonic(), thread name, name, value) in memory; a daemon thread
appends what was kept to `<directory>/<pid>.jsonl` once a second (and at exit), one JSON array per
line. The monotonic clock is the machine's, so the lines of a server's processes and a client's
times (time.perf_counter is the same clock on Linux) line up. Off (the default), `event` is one
check; callers whose value costs work to compute test `ON` first. A directory that cannot be
written turns the timeline off, with a warning: it never fails the caller.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import threading
import time

log = logging.getLogger("voxcpm_triton.timeline")

DIRECTORY = os.environ.get("VOXCPM_TIMELINE") or None
ON = DIRECTORY is not None
MAX_EVENTS = 4_000_000  # kept in memory between writes at most: beyond that they are dropped

_events: collections.deque = collections.deque()  # appended by any thread, taken by the writer
_writer: threading.Thread | None = None
_lock = threading.Lock()


def event(name: str, value=None):
    if not ON:
        return
    if _writer is None:
        _start()
    if len(_events) < MAX_EVENTS:
        _events.append((time.monotonic(), threading.current_thread().name, name, value))


def _start():
    global _writer
    with _lock:
        if _writer is None and ON:
            try:
                os.makedirs(DIRECTORY, exist_ok=True)
            except OSError as e:
                _off(e)
                return
            _writer = threading.Thread(target=_write_forever, name="voxcpm-timeline", daemon=True)
            _writer.start()
            atexit.register(flush)


def _off(error: Exception):
    global ON
    ON = False
    _events.clear()
    log.warning("VOXCPM_TIMELINE=%s: %s; the timeline is off", DIRECTORY, error)


def flush():
    """Write what was kept so far (nothing once the timeline is off)."""
    with _lock:
        events = [_events.popleft() for _ in range(len(_events))]
        if not events or not ON:
            return
        try:
            with open(os.path.join(DIRECTORY, f"{os.getpid()}.jsonl"), "a") as f:
                f.writelines(json.dumps(e, default=str) + "\n" for e in events)
        except OSError as e:
            _off(e)


def _write_forever():
    while ON:
        time.sleep(1.0)
        flush()
