"""Decoupled BLS responses read without ever waiting inside the response iterator.

Triton 2.51's Python backend (r24.10) can deadlock a process that waits in a decoupled BLS
response iterator while another of its threads starts a decoupled BLS call:

- a reader woken in `ResponseIterator::Next` holds the iterator's mutex while it takes the GIL back;
- the stub thread that delivers responses (`ProcessBLSResponseDecoupled`) holds the iterator map's
  mutex while it waits for that iterator's mutex, to deliver the next response;
- a thread that starts a decoupled call (`exec` / `async_exec`) holds the GIL while it waits for
  the map's mutex (`GetResponseIterator`).

None of the three ever lets go. The process's Python stops, and so does the callee's `send`
(the server waits for this process to take each response), which for the decoder holds up every
stream. `benchmarks/bls_stress.py` reproduces it in seconds on a CPU. The lock inversion is
only on the path where `next()` waits: a `next()` that finds a response already buffered takes
the locks in a consistent order. So here the callee says how many responses it has sent:

- callee: `NotifyingSender` wraps a request's response sender. After each `send` returns (the
  server has then handed the response to the caller's iterator), it sends the running count
  to the caller's socket (`Notifier`: a Unix datagram, never blocking; retried while the
  socket is full).
- caller: one `Inbox` per process, a datagram socket in the server's private run directory read
  on the event loop. A `ResponseStream` calls `next()` only up to the count it was told, so it
  never waits, and no thread is parked in an iterator.

A call that gets no count (a callee that does not count; an error response from the server
itself, the call's only one) is read by a thread that waits in the iterator, as before, after
`GRACE_S`; so is one whose counts stop for `FALLBACK_S` while it is open (logged).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import logging
import os
import re
import secrets
import socket
import threading
import time

from . import runtime

log = logging.getLogger("voxcpm_triton.bls_stream")

PARAMETER = "voxcpm_bls_notify"  # request parameter: "<socket path> <token>"
GRACE_S = 0.2  # no count at all this long after the call returned: the callee does not count
FALLBACK_S = 30.0  # no new count for this long on an open call: read it with a waiting thread
RETRY_S = 0.002  # a full caller socket is retried this often
GRAVE_S = 2.0  # a finished iterator is kept at least this long (see _bury)


class Notifier:
    """Callee side: running response counts to callers' sockets. Never blocks; counts that do not
    fit in a full socket are kept (the latest per call) and retried by a thread of its own."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.pending: dict[tuple[str, str], tuple[int, bool]] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        threading.Thread(target=self._retry, name="bls-notify-retry", daemon=True).start()

    def sent(self, path: str, token: str, count: int, final: bool):
        with self.lock:
            if (path, token) in self.pending:  # keep the order: the retry thread sends the latest
                self.pending[(path, token)] = (count, final)
                return
            if not self._send(path, token, count, final):
                self.pending[(path, token)] = (count, final)
                self.wake.set()

    def _send(self, path: str, token: str, count: int, final: bool) -> bool:
        """True when done with (sent, or the caller is gone); False when its socket is full."""
        try:
            self.sock.sendto(f"{token} {count} {int(final)}".encode(), path)
        except BlockingIOError:
            return False
        except OSError:  # the caller's process is gone (no socket, refused): nobody to tell
            pass
        return True

    def _retry(self):
        while True:
            self.wake.wait()
            time.sleep(RETRY_S)
            with self.lock:
                for key, (count, final) in list(self.pending.items()):
                    if self._send(*key, count, final):
                        del self.pending[key]
                if not self.pending:
                    self.wake.clear()


_notifier: Notifier | None = None
_notifier_lock = threading.Lock()


def _shared_notifier() -> Notifier:
    global _notifier
    with _notifier_lock:
        if _notifier is None:
            _notifier = Notifier()
        return _notifier


class NotifyingSender:
    """A request's response sender that tells the caller how many responses it has sent."""

    def __init__(self, sender, path: str, token: str, final_flag: int, notifier: Notifier | None = None):
        self.sender, self.path, self.token, self.final_flag = sender, path, token, final_flag
        self.notifier = notifier or _shared_notifier()
        self.count = 0

    def send(self, response=None, flags: int = 0):
        if response is None:
            self.sender.send(flags=flags)
        else:
            self.sender.send(response, flags=flags)
        self.count += 1
        self.notifier.sent(self.path, self.token, self.count, bool(flags & self.final_flag))

    def is_cancelled(self) -> bool:
        return self.sender.is_cancelled()


_SOCKET_NAME = re.compile(r"bls-\d+-[0-9a-f]{8}\.sock")
_TOKEN = re.compile(r"[0-9a-f]{16}")


def sender_for(request, final_flag: int):
    """`request`'s response sender; one that counts when the caller asked for counts, to an inbox
    of this server (a socket in its private run directory: no other path is ever written to)."""
    sender = request.get_response_sender()
    try:
        path, token = json.loads(request.parameters() or "{}").get(PARAMETER, "").split(" ")
    except (ValueError, AttributeError, TypeError):
        return sender
    if (os.path.realpath(os.path.dirname(path)) != os.path.realpath(runtime.run_dir())
            or not _SOCKET_NAME.fullmatch(os.path.basename(path))
            or not _TOKEN.fullmatch(token)):
        return sender
    return NotifyingSender(sender, path, token, final_flag)


class ResponseStream:
    """One decoupled call's responses on `queue` (an exception the iterator raised is put there
    too), then `END`. Register before the call (`Inbox.expect`: its parameter goes with the
    request), `attach` the call's iterator after."""

    END = object()

    def __init__(self, inbox: "Inbox | None", token: str):
        self.inbox, self.token = inbox, token
        self.queue: asyncio.Queue = asyncio.Queue()
        self.started = asyncio.Event()  # the call has returned (its first response, or its failure)
        self.iterator = None
        self.counted, self.final_at, self.taken = 0, None, 0
        self.done = self.threaded = False
        self.progress = time.monotonic()

    def start(self, call):
        """Run `call` (an `async_exec(decoupled=True)`): its responses come to `queue`, the first
        once it returns (an exception it raises instead). The call is read to its end even when
        nobody waits for it any more, so its iterator is never dropped open (its destructor
        would wait in it)."""
        asyncio.ensure_future(call).add_done_callback(self._started)

    def _started(self, task):
        self.started.set()
        if task.cancelled() or task.exception() is not None:
            self.queue.put_nowait(RuntimeError("the BLS call was cancelled") if task.cancelled() else task.exception())
            self._finish()
        else:
            self.attach(task.result())

    def attach(self, iterator):
        """The call returned `iterator`, its first response buffered."""
        self.iterator = iterator
        if self.inbox is None:
            self._thread()
            return
        self._take(max(self.counted, 1))
        if not self.done:
            asyncio.get_running_loop().call_later(GRACE_S, self._check)

    def count(self, count: int, final: bool):
        """The callee has sent `count` responses (the last of them if `final`)."""
        self.counted = max(self.counted, count)
        if final:
            self.final_at = count
        self.progress = time.monotonic()
        if self.iterator is not None:
            self._take(self.counted)

    def _take(self, upto: int):
        """The responses up to `upto`: each is buffered, so `next` does not wait."""
        while not self.done and not self.threaded and self.taken < upto:
            try:
                response = next(self.iterator)
            except StopIteration:
                self._finish()
                return
            except Exception as e:  # noqa: BLE001 - handed to the reader
                self.queue.put_nowait(e)
                self._finish()
                return
            self.taken += 1
            self.queue.put_nowait(response)
        if not self.done and not self.threaded and self.taken == self.final_at:
            self._finish()

    def _check(self):
        if self.inbox is not None:
            self.inbox.read()  # counts waiting in the socket first: a busy loop may run this timer before them
        if self.done or self.threaded:
            return
        if not self.counted:  # a callee that does not count, or the server's own error response
            self._thread()
            return
        idle = time.monotonic() - self.progress
        if idle >= FALLBACK_S:
            log.warning("no response count for %.0f s on an open decoupled call (%d responses read): "
                        "reading the rest with a waiting thread", idle, self.taken)
            self._thread()
        else:
            asyncio.get_running_loop().call_later(FALLBACK_S - idle, self._check)

    def _finish(self):
        self.done = True
        self.queue.put_nowait(self.END)
        self._forget()

    def _forget(self):
        if self.inbox is not None:
            self.inbox.streams.pop(self.token, None)
        if self.iterator is not None:
            _bury(self.iterator)
        self.iterator = None

    def _thread(self):
        """Fallback: the rest of the call read by a thread that waits in the iterator (a daemon: a
        dead callee may never answer, and must not keep the process from exiting)."""
        self.threaded = True
        loop, iterator = asyncio.get_running_loop(), [self.iterator]
        self.iterator = None
        self._forget()
        put = lambda item: loop.call_soon_threadsafe(self.queue.put_nowait, item)  # noqa: E731

        def pump():
            try:
                for response in iterator[0]:
                    put(response)
            except Exception as e:  # noqa: BLE001 - handed to the reader
                put(e)
            finally:
                loop.call_soon_threadsafe(_bury, iterator.pop())
                put(self.END)

        threading.Thread(target=pump, name="bls-responses", daemon=True).start()


class Inbox:
    """Caller side, one per process: the socket the callees' counts arrive on, read on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.path = os.path.join(runtime.run_dir(), f"bls-{os.getpid()}-{secrets.token_hex(4)}.sock")
        if len(self.path.encode()) > 107:
            raise OSError(f"socket path too long for AF_UNIX: {self.path}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.streams: dict[str, ResponseStream] = {}
        loop.add_reader(self.sock.fileno(), self.read)
        atexit.register(self._unlink)  # the stub exits after finalize: its socket file goes with it

    def expect(self) -> tuple[ResponseStream, dict]:
        """A stream for the next call, and the request parameter that makes its callee count."""
        stream = ResponseStream(self, secrets.token_hex(8))
        self.streams[stream.token] = stream
        return stream, {PARAMETER: f"{self.path} {stream.token}"}

    def read(self):
        """Every count waiting in the socket, to its stream."""
        while True:
            try:
                data = self.sock.recv(256)
            except (BlockingIOError, InterruptedError):
                return
            try:
                token, count, final = data.decode().split(" ")
                stream = self.streams.get(token)
                if stream is not None:
                    stream.count(int(count), final == "1")
            except ValueError:
                log.warning("ignoring a malformed response count %r", data[:64])

    def close(self, loop: asyncio.AbstractEventLoop):
        try:
            loop.remove_reader(self.sock.fileno())
        except (RuntimeError, ValueError):  # the stub stops and closes its loop before finalize
            pass
        self.sock.close()
        self._unlink()

    def _unlink(self):
        try:
            os.unlink(self.path)
        except OSError:
            pass


_graves: collections.deque = collections.deque()  # (when, finished iterator), oldest first


def _bury(iterator):
    """Keep a finished iterator a while (on the event loop). Its end queued the removal of the
    stub's own reference (`ResponseIterator::Clear`), done by a stub thread without the GIL: were
    that reference the last, the iterator and the responses it keeps would be freed there, without
    the GIL, and the process would crash. Held here past that, ours is the last; `close` lets go
    of the rest while the stub is still whole."""
    now = time.monotonic()
    _graves.append((now, iterator))
    while now - _graves[0][0] > GRAVE_S:
        _graves.popleft()


_inbox: tuple[asyncio.AbstractEventLoop, Inbox | None] | None = None


def expect() -> tuple[ResponseStream, dict]:
    """A stream for the decoupled call about to be made on this event loop, and the request
    parameters that make its callee count (none when this process could not open its socket)."""
    global _inbox
    loop = asyncio.get_running_loop()
    if _inbox is None or _inbox[0] is not loop:
        close()
        try:
            _inbox = (loop, Inbox(loop))
        except OSError as e:
            log.warning("no socket for response counts (%s): decoupled calls are read by waiting threads", e)
            _inbox = (loop, None)
    inbox = _inbox[1]
    return inbox.expect() if inbox is not None else (ResponseStream(None, ""), {})


def close():
    """At finalize: close this process's inbox (its socket file goes with it) and let go of the
    finished iterators, while the stub can still free them. The next `expect` opens another."""
    global _inbox
    if _inbox is not None and _inbox[1] is not None:
        _inbox[1].close(_inbox[0])
    _inbox = None
    _graves.clear()
