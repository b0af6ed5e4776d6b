"""The caller's side of a counted BLS call (the orchestrators): one inbox per process, on which the
callees' response counts and audio frames arrive, read on the event loop, and a `ResponseStream`
per call that takes its responses only as far as they were counted, so that no thread waits in
Triton's response iterator (the package's docstring tells the whole protocol)."""

from __future__ import annotations

import asyncio
import atexit
import collections
import gc
import logging
import os
import secrets
import socket
import threading
import time

from ...coordination import run_state
from . import audio_channel, protocol

log = logging.getLogger("voxcpm_triton.bls.caller")

GRACE_S = 5.0  # no count at all this long after the call returned: its callee does not count
ERROR_GRACE_S = 1.0  # an uncounted first response with an error: this long for its count
FALLBACK_S = 30.0  # no new count for this long on an open call: read the rest with a waiting thread
GRAVE_S = 2.0  # a finished iterator is kept at least this long (see _bury)
SLOW_NEXT_S = 1.0  # a next() this slow held up the event loop: logged


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
            response = protocol.restored(response)
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
                    put(protocol.restored(response))
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
        self.path, channel_path = protocol.inbox_paths(run_state.run_dir())
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
        return stream, {protocol.PARAMETER: f"{self.path} {stream.token}", audio_channel.PARAMETER: self.channel.path}

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
                    token, count, final = protocol.parse_count(line)
                    stream = self.streams.get(token)
                    if stream is not None:
                        stream.on_count(count, final)
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
