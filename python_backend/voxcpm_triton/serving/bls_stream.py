"""Decoupled BLS responses read without waiting inside Triton's response iterator.

Triton 2.51's Python backend (python_backend r24.10) has two faults on the path where a thread waits in a decoupled BLS response iterator, both
reproduced by `benchmarks/bls_stress.py` (benchmarks/results.md, "Twenty-fifth session"):

- a deadlock: a reader woken in `ResponseIterator::Next` holds the iterator's mutex while it
  takes the GIL back; the stub thread that delivers responses (`ProcessBLSResponseDecoupled`)
  holds the iterator map's mutex while it waits for that iterator's; a thread starting a
  decoupled call (`GetResponseIterator`) holds the GIL while it waits for the map's. The
  process stops, and so does the callee's `send` (the server waits for this process to take
  each response): for the decoder, every stream.
- a crash: a finished iterator whose last reference is the stub's map is freed by the stub
  thread that empties the map, without the GIL.

So here no thread waits in an iterator. The callee says how many responses it has sent:

- callee: `counting_sender` wraps a request's response sender. After each `send` returns, the
  server has handed that response to the caller's iterator (the send waits for it, through
  `SendBLSDecoupledResponse`, as long as the callee has no response delegator: no dynamic
  batching with `preserve_ordering`, no response cache). It then sends the running count to
  the caller's socket (`Notifier`: Unix datagrams, never blocking; retried while it is full).
  Nothing is sent to a caller whose process has died (the pid in its inbox's name): that send
  would wait for good; the call reads as cancelled instead.
- caller: one `Inbox` per process, a datagram socket in the server's private run directory
  read on the event loop. A `ResponseStream` calls `next()` only as far as it was told, so
  `next()` finds its response buffered. (The first response is buffered when the call returns
  its iterator; its count may come before that.) A first response with an error and no count
  is the server's own (a refused request, final) unless its count comes within
  `ERROR_GRACE_S`; the server's errors on a counted response (no memory for an output) follow
  the counts like any response. A finished iterator is kept `GRAVE_S` before it is let go of
  on the event loop, past the stub's removal of its own reference, so that the last
  reference, and the free, is ours.

The inbox also offers each call its process's audio channel (audio_channel.py). A callee that
takes it (the decoder) sends the call's audio there as frames, which the stream queues beside the
responses (`audio_channel.Chunk`, `.Ended`); the call's responses are then only its first and its
final one. Its frames are written before its final response is sent, so the stream reads the
channel before it takes a final response, and a call that said so (`Opened`) is never handed to a
waiting thread for want of counts.

Errors after a call's first response travel as data. The stub loses the call an error response
belongs to when it comes through the server's callback (every response after the first): it
never reaches the call's iterator, and a final one leaves `next()` waiting for ever. So the
callee's sender (`CountingSender`, or `CarryingSender` for a call nobody counts) sends such an
error as a response with the message in its `ERROR` output (the callee declares it, the caller
asks for it), and the caller turns it back into an error response.

A call that gets no count for `GRACE_S` after it returned (its callee does not count), or whose
counts stop for `FALLBACK_S` while it is open, is read by a thread that waits in the iterator
(Triton's own way): logged, and it is what the orchestrator's metric `voxcpm_decoder_calls_read_total`
counts as "waiting".
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import errno
import gc
import json
import logging
import os
import re
import secrets
import socket
import threading
import time

import numpy as np

from ..coordination import processes, run_state
from . import audio_channel
from .triton_io import locked, pb

log = logging.getLogger("voxcpm_triton.bls_stream")

PARAMETER = "voxcpm_bls_notify"  # request parameter: "<socket path> <token>"
GRACE_S = 5.0  # no count at all this long after the call returned: its callee does not count
ERROR_GRACE_S = 1.0  # an uncounted first response with an error: this long for its count
FALLBACK_S = 30.0  # no new count for this long on an open call: read the rest with a waiting thread
GRAVE_S = 2.0  # a finished iterator is kept at least this long (see _bury)
RETRY_S = 0.001  # counts that did not fit in a caller's socket are retried this often...
GIVE_UP_S = 60.0  # ...for this long: a caller that reads nothing for a minute is stuck or gone
DATAGRAM_BYTES = 16384  # counts sent together are cut into datagrams of at most this (the caller reads 64 KiB)
# sendto's errors that say the caller's process is gone (its socket file left behind, or none); any other
# (ENOBUFS, ENOMEM: the kernel short of memory now) is retried like a full socket
CALLER_GONE = frozenset({errno.ECONNREFUSED, errno.ENOENT, errno.ENOTDIR, errno.EPIPE})
SLOW_NEXT_S = 1.0  # a next() this slow held up the event loop: logged

ERROR_OUTPUT = "ERROR"  # the callee's output (TYPE_STRING, dims [1]) that carries an error past the first response
_SOCKET_NAME = re.compile(r"bls-\d+-[0-9a-f]{8}\.sock")
_TOKEN = re.compile(r"[0-9a-f]{16}")


class Notifier:
    """Callee side: running response counts to callers' sockets. Never blocks. Counts that do not
    fit (the kernel queues few datagrams per socket) are kept, the latest per call, and a thread
    of its own sends each caller's, in as few datagrams as they fit in."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.pending: dict[str, dict[str, tuple[int, bool]]] = {}  # path -> token -> (count, final)
        self.since: dict[str, float] = {}  # path -> when its counts first did not fit
        self.why: dict[str, str] = {}  # path -> the latest error other than a full socket, if any
        self.lock = threading.Lock()
        self.wake = threading.Event()
        threading.Thread(target=self._retry, name="bls-notify-retry", daemon=True).start()

    def sent(self, path: str, token: str, count: int, final: bool):
        with self.lock:
            if path not in self.pending and self._send(path, {token: (count, final)}):
                return
            calls = self.pending.setdefault(path, {})
            old = calls.get(token, (0, False))
            calls[token] = (max(old[0], count), old[1] or final)  # the caller keeps the largest count
            self.since.setdefault(path, time.monotonic())
            self.wake.set()

    def _send(self, path: str, calls: dict) -> bool:
        """Send `calls`' counts, in datagrams of at most DATAGRAM_BYTES, taking each sent one out of
        `calls` -> True when done with them (all sent, or the caller is gone); False when some are
        left: its socket is full, or sending failed otherwise (the kernel short of memory, say)."""
        while calls:
            lines, size = [], 0
            for token, (count, final) in calls.items():
                line = f"{token} {count} {int(final)}"
                if lines and size + len(line) + 1 > DATAGRAM_BYTES:
                    break
                lines.append((token, line))
                size += len(line) + 1
            try:
                self.sock.sendto("\n".join(line for _, line in lines).encode(), path)
            except BlockingIOError:
                self.why.pop(path, None)  # full, and nothing else, now
                return False
            except OSError as e:
                if e.errno in CALLER_GONE:  # nobody to tell
                    return True
                self.why[path] = str(e)
                return False
            for token, _ in lines:
                del calls[token]
            if path in self.since:  # it reads: the give-up clock starts again
                self.since[path] = time.monotonic()
        return True

    def _retry(self):
        while True:
            self.wake.wait()
            time.sleep(RETRY_S)
            with self.lock:
                for path in list(self.pending):
                    if self._send(path, self.pending[path]):
                        self.why.pop(path, None)
                        del self.pending[path], self.since[path]
                    elif time.monotonic() - self.since[path] > GIVE_UP_S:
                        log.warning("dropping %d response counts for %s: it has read nothing for %.0f s%s",
                                    len(self.pending[path]), path, GIVE_UP_S,
                                    f" (sending failed: {self.why[path]})" if path in self.why else "")
                        self.why.pop(path, None)
                        del self.pending[path], self.since[path]
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


class CarryingSender:
    """A request's response sender that sends an error after the first response as data."""

    def __init__(self, sender):
        self.sender, self.count = sender, 0

    def send(self, response=None, flags: int = 0):
        if response is None:
            self.sender.send(flags=flags)
        else:
            if self.count and response.has_error():
                response = _carried(response)
            self.sender.send(response, flags=flags)
        self.count += 1

    def is_cancelled(self) -> bool:
        return self.sender.is_cancelled()


class CountingSender(CarryingSender):
    """A CarryingSender that also tells the caller how many responses it has sent. With a
    `channel` (the caller offered one, audio_channel) the call's audio can go there instead:
    `chunk` per chunk, then `end`, which also sends the call's final response."""

    def __init__(self, sender, path: str, token: str, final_flag: int, notifier: Notifier | None = None,
                 channel: "audio_channel.Writer | None" = None):
        super().__init__(sender)
        self.path, self.token, self.final_flag = path, token, final_flag
        self.notifier = notifier or _shared_notifier()
        self.channel = channel
        m = re.match(r"bls-(\d+)-", os.path.basename(path))  # the inbox is named after its process
        self.caller_pid = int(m.group(1)) if m else None
        self.gone = False

    def caller_gone(self) -> bool:
        """The caller's process has died: a response sent through the server to a stub that is gone
        waits for good, holding the thread that sends it (and IPC_LOCK with it), so none is sent."""
        if not self.gone and self.caller_pid is not None and not processes.process_alive(self.caller_pid):
            self.gone = True
            log.warning("not answering call %s: its caller's process (pid %s) has died", self.token, self.caller_pid)
        return self.gone

    def send(self, response=None, flags: int = 0):
        if self.caller_gone():
            return
        super().send(response, flags)
        self.notifier.sent(self.path, self.token, self.count, bool(flags & self.final_flag))

    def is_cancelled(self) -> bool:
        return self.caller_gone() or super().is_cancelled()

    def open(self):
        self.channel.open(self.token)

    def chunk(self, patches: int, audio: np.ndarray):
        self.channel.chunk(self.token, patches, audio)

    def end(self, error: str | None):
        """The call's end frame (`error`: None when it ended well), then its final response, with the
        error too, or with audio_channel.LOST if a frame of the call was dropped (the channel broke)."""
        def final(lost: bool):
            message = error if error is not None else audio_channel.LOST if lost else None
            locked(self.send, None if message is None else _error_response(message), flags=self.final_flag)

        self.channel.end(self.token, error, final)


def _carried(response):
    """An error response, as a response with its message in ERROR_OUTPUT."""
    p = pb()
    message = response.error().message()
    return p.InferenceResponse(output_tensors=[p.Tensor(ERROR_OUTPUT, np.array([message.encode()], dtype=object))])


def _error_output(response) -> str | None:
    """The error message a response carries in ERROR_OUTPUT, if any."""
    t = None if response.has_error() else pb().get_output_tensor_by_name(response, ERROR_OUTPUT)
    return None if t is None else bytes(t.as_numpy().reshape(-1)[0]).decode(errors="replace")


def _error_response(message: str):
    p = pb()
    return p.InferenceResponse(error=p.TritonError(message))


def _restored(response):
    """A response read from a call: one carrying an error (`_carried`) as that error response."""
    message = _error_output(response)
    return response if message is None else _error_response(message)


def counting_sender(request, sender, final_flag: int, channel: bool = False):
    """`sender` (`request`'s), counting when the caller asked for counts to an inbox of this
    server: a socket in its private run directory, no other path; else carrying its errors
    (CarryingSender) when the caller asked for ERROR_OUTPUT. Only for requests already known to
    come from the orchestrator (the internal key). channel: take the audio channel the caller
    offers (in the same directory), if any, as the sender's `channel`."""
    carrying = CarryingSender(sender) if ERROR_OUTPUT in request.requested_output_names() else sender
    try:
        params = json.loads(request.parameters() or "{}")
        path, token = params.get(PARAMETER, "").split(" ")
    except (ValueError, AttributeError, TypeError):
        return carrying
    run_dir = run_state.run_dir_realpath()
    if (os.path.realpath(os.path.dirname(path)) != run_dir
            or not _SOCKET_NAME.fullmatch(os.path.basename(path)) or not _TOKEN.fullmatch(token)):
        return carrying
    offered = params.get(audio_channel.PARAMETER)
    # the channel of the process whose inbox counts: "chan-<pid>-<hex>.sock" beside "bls-<pid>-<hex>.sock"
    ours = isinstance(offered, str) and os.path.basename(offered)[len("chan-"):] == os.path.basename(path)[len("bls-"):]
    writer = audio_channel.writer(offered, run_dir) if channel and ours else None
    return CountingSender(sender, path, token, final_flag, channel=writer)


def check_callee_config(model_config: dict, model: str):
    """Refuse a callee configuration under which a `send` can return before its response reached
    the caller (the server then delivers it from a response delegator, later), or with no
    ERROR_OUTPUT to carry its errors in."""
    if model_config.get("response_cache", {}).get("enable") or \
            model_config.get("dynamic_batching", {}).get("preserve_ordering"):
        raise ValueError(f"model {model!r}: no response_cache and no dynamic_batching.preserve_ordering: its "
                         "callers read its responses as far as it has counted them sent (serving/bls_stream.py)")
    if not any(o.get("name") == ERROR_OUTPUT and o.get("data_type") == "TYPE_STRING"
               for o in model_config.get("output", [])):
        raise ValueError(f"model {model!r}: needs the output {ERROR_OUTPUT!r} (TYPE_STRING, dims [1]): its errors "
                         "after a call's first response travel in it (serving/bls_stream.py)")


class ResponseStream:
    """One decoupled call's responses on `queue` (an exception the call or the iterator raised is
    put there too, and the frames of its audio channel: audio_channel.Chunk, .Ended), then `END`.
    Made by `call`."""

    END = object()

    def __init__(self, inbox: "Inbox | None", token: str):
        self.inbox, self.token = inbox, token
        self.queue: asyncio.Queue = asyncio.Queue()
        self.started = asyncio.Event()  # the call has returned (its first response), or failed
        self.returned = False  # it returned an iterator: the callee has the request
        self.iterator = None
        self.counted, self.final_at, self.taken = 0, None, 0
        self.done = self.threaded = False
        self.ended_at_once = False  # the waiting thread found the iterator finished: it never waited
        self.channeled = False  # its audio comes over the audio channel (its callee said so)
        self.abandoned = False  # its reader has stopped reading (`abandon`)
        self.timer = None  # the pending `_check`
        self.progress = time.monotonic()

    @property
    def waited(self) -> bool:
        """Read (in part) by a thread that waited in the iterator."""
        return self.threaded and not self.ended_at_once

    def _started(self, task):
        self.started.set()
        if task.cancelled() or task.exception() is not None:
            self.queue.put_nowait(RuntimeError("the BLS call was cancelled") if task.cancelled() else task.exception())
            self._finish()
        else:
            self._attach(task.result())

    def _attach(self, iterator):
        """The call returned `iterator`, its first response buffered."""
        self.returned, self.iterator = True, iterator
        if self.inbox is None:
            self._read_with_waiting_thread()
            return
        self.progress = time.monotonic()
        self._take(max(self.counted, 1))
        if not self.done:
            self.timer = asyncio.get_running_loop().call_later(min(GRACE_S, FALLBACK_S), self._check)

    def on_frame(self, item):
        """A frame of the call's audio channel: Opened, a Chunk, or its Ended (the last two queued)."""
        self.progress = time.monotonic()
        if isinstance(item, audio_channel.Opened):
            self.channeled = True
        else:
            self._put(item)

    def abandon(self):
        """Its reader reads no more: what is queued is let go of now, and what comes later as it
        comes (the call is still read to its end). A response left queued would be freed with the
        stream, which a pending timer can keep until after finalize: a crash (see `close`)."""
        self.abandoned = True
        while not self.queue.empty():
            self.queue.get_nowait()

    def _put(self, item):
        if not self.abandoned or item is self.END:
            self.queue.put_nowait(item)

    def on_count(self, count: int, final: bool):
        """The callee has sent `count` responses (the last of them if `final`)."""
        self.counted = max(self.counted, count)
        if final:
            self.final_at = count
        self.progress = time.monotonic()
        if self.iterator is not None:
            self._take(self.counted)

    def _take(self, upto: int):
        """The responses up to `upto`: each is buffered, so `next` does not wait."""
        if self.final_at is not None and upto >= self.final_at:
            self._read_channel()
        while not self.done and not self.threaded and self.taken < upto:
            t0 = time.monotonic()
            try:
                response = next(self.iterator)
            except StopIteration:
                self._finish()
                return
            except Exception as e:  # noqa: BLE001 - handed to the reader
                self._put(e)
                self._finish()
                return
            response = _restored(response)
            if time.monotonic() - t0 > SLOW_NEXT_S:  # not buffered after all, or the stub's cleanup queue is slow
                log.warning("next() on a counted response took %.0f ms", 1e3 * (time.monotonic() - t0))
            self.taken += 1
            self._put(response)
            if response.has_error() and self.taken > self.counted:
                asyncio.get_running_loop().call_later(ERROR_GRACE_S, self._check_error)
                return
        if not self.done and not self.threaded and self.taken == self.final_at:
            self._finish()

    def _check(self):
        if self.inbox is not None:
            self.inbox.read()  # counts waiting in the socket first: a busy loop may run this timer before them
        if self.done or self.threaded or self.channeled and self.counted:
            # (A call whose audio comes over the channel sends no response between its first and its
            # last: its counts stop by design, for as long as it waits for a slot in the decoder.)
            return
        idle, limit = time.monotonic() - self.progress, GRACE_S if not self.counted else FALLBACK_S
        if idle >= limit:
            log.warning("no response count for %.0f s on an open decoupled call (%d responses read): reading "
                        "the rest with a thread waiting in the iterator", idle, self.taken)
            self._read_with_waiting_thread()
        else:
            self.timer = asyncio.get_running_loop().call_later(limit - idle, self._check)

    def _check_error(self):
        """An uncounted error response: counted since, it was the callee's and the counts go on;
        else the server's own, the call's last, and the iterator is finished: a thread's `next`
        ends it at once, where ours would wait for ever were that not so."""
        if self.inbox is not None:
            self.inbox.read()
        if not self.done and not self.threaded and self.counted < self.taken:
            self._read_with_waiting_thread()

    def _finish(self):
        """The call has ended (its final response taken, or its waiting thread's iterator ended):
        its channel's frames, written before its final response, are read first."""
        self.done = True
        self._read_channel()
        self.queue.put_nowait(self.END)
        self._forget()

    def _read_channel(self):
        """Before the call's final response, or its end: its frames, all written before that response
        was sent, are in the socket now (the inbox may have read the socket before they came, and the
        final count after, in one `read`)."""
        if self.inbox is not None:
            self.inbox.read_channel()

    def _forget(self):
        if self.inbox is not None:
            self.inbox.streams.pop(self.token, None)
        if self.iterator is not None:
            _bury(self.iterator)
        self.iterator = None
        if self.timer is not None:  # nothing left to check: the timer keeps the stream no longer
            self.timer.cancel()
            self.timer = None

    def _read_with_waiting_thread(self):
        """Fallback: the rest of the call read by a thread that waits in the iterator (a daemon: a
        dead callee may never answer, and must not keep the process from exiting). It calls
        `next` itself: a `for` loop would restart a finished iterator from its first response."""
        self.threaded = True
        loop, held = asyncio.get_running_loop(), [self.iterator]
        self.iterator = None
        put = lambda item: loop.call_soon_threadsafe(self._put, item)  # noqa: E731

        def pump():
            first = True
            try:
                while True:
                    response = next(held[0])
                    first = False
                    put(_restored(response))
            except StopIteration:
                self.ended_at_once = first
            except Exception as e:  # noqa: BLE001 - handed to the reader
                put(e)
            finally:
                loop.call_soon_threadsafe(_bury, held.pop())
                loop.call_soon_threadsafe(self._finish)

        threading.Thread(target=pump, name="bls-responses", daemon=True).start()


class Inbox:
    """Caller side, one per process: the socket the callees' counts arrive on, read on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        name = f"{os.getpid()}-{secrets.token_hex(4)}.sock"
        self.path = os.path.join(run_state.run_dir(), f"bls-{name}")
        channel_path = os.path.join(run_state.run_dir(), f"chan-{name}")
        if len(channel_path.encode()) > 107:
            raise OSError(f"socket path too long for AF_UNIX: {channel_path}")
        self.streams: dict[str, ResponseStream] = {}
        self.channel = audio_channel.Listener(loop, channel_path, self._on_frame)
        try:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.sock.bind(self.path)
        except OSError:
            self.channel.close()
            raise
        self.sock.setblocking(False)
        loop.add_reader(self.sock.fileno(), self.read)
        atexit.register(self._unlink)  # the stub exits after finalize: its socket files go with it

    def stream(self) -> tuple[ResponseStream, dict]:
        """A stream for the next call, and the request parameters that make its callee count (and
        offer it this process's audio channel)."""
        stream = ResponseStream(self, secrets.token_hex(8))
        self.streams[stream.token] = stream
        return stream, {PARAMETER: f"{self.path} {stream.token}", audio_channel.PARAMETER: self.channel.path}

    def _on_frame(self, token: str, item):
        stream = self.streams.get(token)
        if stream is not None:
            stream.on_frame(item)

    def read_channel(self):
        """Every frame the callees have written to this process's audio channel so far."""
        self.channel.read_all()

    def read(self):
        """Every count waiting in the socket, to its stream; the audio channel's frames first (a
        callee writes a call's frames before it sends the call's final response)."""
        self.read_channel()
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # closed at finalize while the loop was still running
                return
            for line in data.split(b"\n"):
                try:
                    token, count, final = line.decode().split(" ")
                    stream = self.streams.get(token)
                    if stream is not None:
                        stream.on_count(int(count), final == "1")
                except ValueError:
                    log.warning("ignoring a malformed response count %r", line[:64])

    def close(self, loop: asyncio.AbstractEventLoop):
        for stream in list(self.streams.values()):  # calls still open: let go of what they hold, now
            stream.abandon()
            stream._forget()
        try:
            loop.remove_reader(self.sock.fileno())
        except (RuntimeError, ValueError):  # the loop is already closed
            pass
        self.sock.close()
        self.channel.close()
        self._unlink()

    def _unlink(self):
        for path in (self.path, self.channel.path):
            try:
                os.unlink(path)
            except OSError:
                pass


_graves: collections.deque = collections.deque()  # (when, finished iterator), oldest first


def _bury(iterator):
    """Keep a finished iterator a while (on the event loop). Its end queued the removal of the
    stub's own reference (`ResponseIterator::Clear`), done by a stub thread without the GIL: were
    that reference the last, the iterator and the responses it keeps would be freed there, and
    the process would crash. Held here past that, ours is the last. (At finalize the stub has
    emptied its map before `close` lets go of the rest.)"""
    now = time.monotonic()
    _graves.append((now, iterator))
    while _graves and now - _graves[0][0] > GRAVE_S:
        _graves.popleft()


_inbox: tuple[asyncio.AbstractEventLoop, Inbox | None] | None = None


def call(make_call) -> ResponseStream:
    """Start a decoupled call on this event loop: `make_call(parameters)` -> the awaitable
    `async_exec(decoupled=True)` of a request carrying `parameters` (those that make its callee
    count; none when this process could not open its socket). Its responses come to the stream's
    queue. The call is read to its end even when nobody waits for it any more, so that its
    iterator is never dropped open (its destructor would wait in it)."""
    global _inbox
    loop = asyncio.get_running_loop()
    if _inbox is None or _inbox[0] is not loop:
        close()
        try:
            _inbox = (loop, Inbox(loop))
        except OSError as e:
            log.warning("no socket for response counts (%s): decoupled calls are read by waiting threads", e)
            _inbox = (loop, None)
    stream, params = _inbox[1].stream() if _inbox[1] is not None else (ResponseStream(None, ""), {})
    try:
        asyncio.ensure_future(make_call(params)).add_done_callback(stream._started)
    except BaseException:
        stream._forget()
        raise
    return stream


def close():
    """At finalize: close this process's inbox (its socket file goes with it) and let go of the
    finished iterators, and of any response or iterator that only a reference cycle still holds
    (a failed call's traceback keeps its coroutine's frame): freed after finalize, in the stub's
    teardown, they crashed the process. The next `call` opens another inbox."""
    global _inbox
    if _inbox is not None and _inbox[1] is not None:
        _inbox[1].close(_inbox[0])
    _inbox = None
    _graves.clear()
    gc.collect()
