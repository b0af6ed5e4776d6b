"""An opt-in timeline of a process's events, for the benchmarks (`VOXCPM_TIMELINE=<directory>`).

`event(name, value)` keeps (time.monotonic(), thread name, name, value) in memory; a daemon thread
appends what was kept to `<directory>/<pid>.jsonl` once a second, one JSON array per line. The
monotonic clock is the machine's, so the lines of a server's processes and a client's times
(time.perf_counter is the same clock on Linux) line up. Off (the default), `event` is one check.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time

DIRECTORY = os.environ.get("VOXCPM_TIMELINE") or None
MAX_EVENTS = 4_000_000  # kept in memory between writes at most: beyond that they are dropped

_events: collections.deque = collections.deque()  # appended by any thread, taken by the writer
_writer: threading.Thread | None = None
_lock = threading.Lock()


def event(name: str, value=None):
    if DIRECTORY is None:
        return
    if _writer is None:
        _start()
    if len(_events) < MAX_EVENTS:
        _events.append((time.monotonic(), threading.current_thread().name, name, value))


def _start():
    global _writer
    with _lock:
        if _writer is None:
            os.makedirs(DIRECTORY, exist_ok=True)
            _writer = threading.Thread(target=_write_forever, name="voxcpm-timeline", daemon=True)
            _writer.start()


def flush():
    """Write what was kept so far."""
    with _lock:
        events = [_events.popleft() for _ in range(len(_events))]
        if events:
            with open(os.path.join(DIRECTORY, f"{os.getpid()}.jsonl"), "a") as f:
                f.writelines(json.dumps(e, default=str) + "\n" for e in events)


def _write_forever():
    while True:
        time.sleep(1.0)
        flush()
