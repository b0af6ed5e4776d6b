"""The supervisor's log line: stderr, a timestamp, flushed (it runs under docker and serve.sh)."""

from __future__ import annotations

import sys
import time


def log(msg: str):
    print(f"[supervise {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
