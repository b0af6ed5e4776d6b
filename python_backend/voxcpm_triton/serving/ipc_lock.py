"""The lock a model process's own threads take around calls into the Python backend stub
(`triton_io.IPC_LOCK`): exclusive by default, shared for response sends.

Triton 2.51's stub corrupted its IPC when worker threads issued BLS calls in parallel, so every stub
call from a thread of our own is exclusive. Response sends are the exception python_backend
documents: its decoupled example sends each request's responses from a thread of its own, the stub
lets go of the GIL while it waits for the server, and the server takes them on a pool of threads.
A send is a round trip to the server; the decoder's audio senders (decoder parameter
`audio_senders`) make theirs side by side under `shared()`, never beside an exclusive call.
"""

from __future__ import annotations

import contextlib
import threading


class IPCLock:
    """A re-entrant exclusive lock (`with lock`, `acquire(timeout=)`, `release()`) with shared holders
    (`with lock.shared()`). A thread waiting for it exclusively goes before new shared holders, so
    a stream of sends does not starve a metric update. A shared holder must not take it again, in
    either mode; an exclusive holder may take it shared (a no-op)."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0  # the owner's re-entries
        self._shared = 0  # shared holders now
        self._exclusive_waiting = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            self._exclusive_waiting += 1
            try:
                free = lambda: self._owner is None and self._shared == 0  # noqa: E731
                if not self._cond.wait_for(free, (timeout if timeout >= 0 else None) if blocking else 0):
                    return False
            finally:
                self._exclusive_waiting -= 1
            self._owner, self._depth = me, 1
            return True

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("IPCLock released by a thread that does not hold it")
            self._depth -= 1
            if not self._depth:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    @contextlib.contextmanager
    def shared(self):
        """Held together with other shared holders, never beside an exclusive one."""
        with self._cond:
            if self._owner == threading.get_ident():
                mine = False
            else:
                self._cond.wait_for(lambda: self._owner is None and not self._exclusive_waiting)
                self._shared += 1
                mine = True
        try:
            yield self
        finally:
            if mine:
                with self._cond:
                    self._shared -= 1
                    if not self._shared:
                        self._cond.notify_all()
