"""A model process's life beside Triton: how it starts, when it stops taking work, how it exits.

- Start (`model_process`, each model's first act): every thread's stack goes to the server's log
  on a crash or SIGUSR2; a model process whose tritonserver is gone exits at once, so nothing of a
  server outlives it; a plain tritonserver's model processes hold its run directory and sweep those
  of servers that have exited (run_state).
- Stopping: the supervisor writes `stopping` (a time, epoch seconds) before it sends
  SIGTERM. Triton 2.51 tells a model nothing until its finalize, which waits for its requests:
  from then on the orchestrators take no new request, and at that time the decoder ends the
  ones it still runs with an error, so that every model unloads before the server's exit
  timeout cuts them all off.
- Exit: a model process ends with os._exit once its interpreter starts to shut down, after
  its finalize and the exit handlers registered after `skip_teardown_at_exit` (each model.py
  calls it first): the interpreter's teardown aborts a process whose daemon thread is inside a
  torch op.
No torch here: the orchestrator processes import this too.
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import logging
import os
import signal
import sys
import threading
import time

from . import processes, run_state

log = logging.getLogger("voxcpm_triton.runtime")

STOPPING_FILE = "stopping"  # the supervisor writes it (supervisor/tritonserver.py)
STOPPING_READ_S = 0.25  # how stale a read of it may be: requests ask once per chunk
_stop_read = (float("-inf"), None)  # (monotonic time of the read, deadline)


def stop_deadline() -> float | None:
    """The time (epoch seconds) by which running requests must end, once the server is stopping;
    None while it serves. A server whose supervisor has died is stopping now: its tritonserver got
    SIGTERM (the supervisor's death signal), and nobody wrote the deadline."""
    global _stop_read
    now = time.monotonic()
    if now - _stop_read[0] >= STOPPING_READ_S:
        try:
            with open(os.path.join(run_state.run_dir(), STOPPING_FILE), encoding="ascii") as f:
                deadline = float(f.read())
        except (OSError, ValueError):
            deadline = None
        supervisor = os.environ.get("VOXCPM_SUPERVISOR_PID", "")
        if deadline is None and supervisor.isdigit() and not processes.process_alive(int(supervisor)):
            deadline = time.time()
        _stop_read = (now, deadline)
    return _stop_read[1]


def stopping(now: float | None = None) -> bool:
    """True once the server's stop deadline has come: requests still running end."""
    deadline = stop_deadline()
    return deadline is not None and (time.time() if now is None else now) >= deadline


def model_process():
    """What every model process does first: leave every thread's Python stack in the server's log
    if it crashes (Triton 2.51 reports a dead stub only as "not healthy") or on SIGUSR2, and exit with
    its server. In a server run without VOXCPM_RUN_DIR (a plain tritonserver): hold its default run
    directory, note its shared-memory region there, and remove those directories (and the regions
    noted in them) that servers which have exited left behind."""
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # `kill -USR2 <pid>`: every thread's stack, now
    watch_parent()
    if os.environ.get("VOXCPM_RUN_DIR"):  # a server under the supervisor (or a test's): it removes its own
        return
    try:  # best effort: a server serves without it
        run_state.hold_run_dir()
        run_state.note_region()
        for path in run_state.remove_stale_run_dirs():
            log.warning("removed %s, the run directory of a server that has exited", path)
    except Exception:  # noqa: BLE001
        log.exception("holding this server's run directory, or removing those of servers that exited, failed")


def skip_teardown_at_exit():
    """In a stub process (elsewhere: nothing): end it with os._exit(0) once its interpreter starts
    to shut down, instead of tearing the interpreter down.

    By then the stub has finalized the model and let go of its shared memory, and the exit
    handlers registered after this one have run (call it before importing torch, whose handlers
    then run first). CPython's teardown (up to 3.13) ends every daemon thread that next takes the
    GIL with pthread_exit; one inside a C++ call that had released the GIL (any torch op) aborts
    the whole process ("terminate called without an active exception") and leaves a fatal error
    in the server's log. Skipped: the handlers registered before this one (logging's, whose work
    is done here), C-level atexit handlers and static destructors."""
    if processes.in_stub():
        atexit.register(_exit_now, os.getpid())


def _exit_now(pid: int):
    if os.getpid() != pid:  # a forked child inherited the handler: it exits as it would have
        return
    try:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        ctypes.CDLL(None).fflush(None)  # the stub's own C stdio buffers
    finally:
        os._exit(0)


def watch_parent(period_s: float = 1.0):
    """Exit this process as soon as its tritonserver is gone (reparented): tritonserver's exit
    timeout or a crash would otherwise leave it running, holding its memory."""
    parent = os.getppid()

    def run():
        while True:
            time.sleep(period_s)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=run, name="parent-watch", daemon=True).start()
