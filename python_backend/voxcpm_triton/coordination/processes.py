"""Facts about processes: from /proc, whether one is alive (pid reuse included) and whether this one
is a python_backend stub; from the interpreter, every thread's stack for a log line. No torch here."""

from __future__ import annotations

import os
import sys
import threading
import traceback


def proc_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name: the state first, the start time at [19]."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        line = f.read()
    return line[line.rindex(")") + 2:].split()


def thread_stacks() -> str:
    """Every thread's Python stack, for a log line when something is stuck."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(f"--- thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
                     for ident, frame in sys._current_frames().items())


def process_alive(pid: int, start: str | None = None) -> bool:
    """False once process `pid` has exited (gone, a zombie, or, given its `start` time (/proc's clock
    ticks), its pid reused by a process started at another time). A process whose state cannot be read
    (out of file descriptors, say) counts as alive: taking a live process for dead stops its work."""
    try:
        fields = proc_fields(pid)
        state = fields[0]
    except FileNotFoundError:
        return False
    except (OSError, ValueError, IndexError):
        return True
    if state in ("Z", "X"):
        return False
    return start is None or len(fields) <= 19 or fields[19] == start


STUB_EXECUTABLE = "triton_python_backend_stub"


def in_stub() -> bool:
    """Whether this process is a python_backend stub (a model process of a tritonserver)."""
    try:
        exe = os.readlink("/proc/self/exe").removesuffix(" (deleted)")  # a backend directory replaced since
    except OSError:
        return False
    return os.path.basename(exe) == STUB_EXECUTABLE
