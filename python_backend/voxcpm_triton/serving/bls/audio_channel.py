"""A decoder call's audio sent straight to its caller's process, past the server.

Each response a decoupled BLS callee sends is a round trip: its stub waits while the server hands
the response to the caller's stub and that stub takes it in (the package's docstring). The decoder's one audio
thread makes every stream's deliveries one after another, so under load a round of them can take
longer than a first chunk's audio lasts (benchmarks/results.md, fifty-seventh and sixty-fifth
sessions).

A caller that offers a channel (`caller.Inbox`: a Unix stream socket in the server's private
run directory, named in the call's parameters) gets the call's audio chunks and its end as frames
on it. The decoder answers the call at once with an empty first response, then queues an `Opened`
frame, each chunk and the end for a `Writer` (one per caller process, a thread of its own), which
writes them in order and, after a call's end frame, sends the call's final response: the audio
thread never waits on the server. The caller reads its channel before it takes a call's final
response (`Listener.read_all`), so every frame of a call is in its stream before the call's end.
A channel that breaks ends its calls with `LOST`, never well without their audio (a caller whose
process has died is sent nothing: `callee.CountingSender`).

A frame: a header (`_HEADER`: magic, kind, the call's token, patches, audio bytes, message bytes),
the chunk's audio (float32), an end's error message (UTF-8; none for an end without error).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import protocol


log = logging.getLogger("voxcpm_triton.bls.audio_channel")

PARAMETER = "voxcpm_audio_channel"  # request parameter: the caller's channel path
GIVE_UP_S = 60.0  # a caller that takes nothing of a frame for this long is stuck or gone
MAX_QUEUED_BYTES = 256 << 20  # a caller this far behind is stuck too
MAX_FRAME_BYTES = 256 << 20  # a header that gives more: not a frame
IDLE_CHECK_S = 5.0  # an idle writer looks this often whether its caller closed the channel
LOST = "the call's audio was lost: its caller's audio channel broke"

_HEADER = struct.Struct("<4sB16sIII")
_MAGIC = b"VXA1"
_CHUNK, _END, _OPEN = 1, 2, 3
_READ_BYTES = 1 << 20


@dataclass
class Chunk:
    """A call's audio chunk: `patches` latent patches' worth of `audio` (float32)."""

    patches: int
    audio: np.ndarray


@dataclass
class Ended:
    """A call's end: `error` is None when it ended well (after its last chunk)."""

    error: str | None


class Opened:
    """A call's audio comes over the channel (written at its admission)."""


def _frame(kind: int, token: str, patches: int = 0, audio: np.ndarray | None = None,
           message: str | None = None) -> list[bytes]:
    # A copy: the decoded batch's (pinned) buffer is let go of at once, not when the frame is written.
    data = b"" if audio is None else np.ascontiguousarray(audio, np.float32).tobytes()
    text = b"" if message is None else message.encode(errors="replace")
    return [_HEADER.pack(_MAGIC, kind, token.encode(), patches, len(data), len(text)), data, text]


class Writer:
    """Callee side: the frames for one caller's channel, written in order by a thread of its own,
    and the calls' final responses (`end`'s `then`), each after its call's end frame.

    A channel that fails (its process gone or its end closed, also seen while idle; taking nothing
    for GIVE_UP_S, or MAX_QUEUED_BYTES behind) is broken: its frames are dropped from then on, and
    its calls' `then` is told that their audio was lost. A broken writer leaves the registry (the caller's next calls get a new one) and
    its thread ends once its queue is empty; what its calls still queue after that is done by the
    thread that queues it."""

    def __init__(self, path: str):
        self.path = path
        self.broken = False
        self.written = 0  # frames written (by this writer's thread only)
        self.lost: set[str] = set()  # calls a frame of which was dropped
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self.queued = self.queued_bytes = 0  # items (and their frames' bytes) put and not yet done with
        self.exited = False
        self.sock: socket.socket | None = None  # the thread's connection
        self.idle = threading.Condition()
        with _writers_lock:
            _running.add(self)
        threading.Thread(target=self._run, name="audio-channel", daemon=True).start()

    def open(self, token: str):
        self._put((token, _frame(_OPEN, token)))

    def chunk(self, token: str, patches: int, audio: np.ndarray):
        self._put((token, _frame(_CHUNK, token, patches, audio)))

    def end(self, token: str, error: str | None, then: Callable[[bool], None]):
        """The call's end frame, then `then(lost)`: lost when a frame of the call was dropped."""
        try:
            self._put((token, _frame(_END, token, message=error)))
        finally:
            self._put((token, then))

    def drain(self, deadline: float) -> bool:
        """Wait (until the monotonic `deadline`) for everything queued to be done; True if it is."""
        with self.idle:
            return self.idle.wait_for(lambda: self.queued == 0, max(0.0, deadline - time.monotonic()))

    def _put(self, item):
        token, what = item
        size = 0 if callable(what) else sum(map(len, what))
        item = (token, what, size)
        with self.idle:  # (re-entrant)
            if size and not self.broken and self.queued_bytes + size > MAX_QUEUED_BYTES:
                self._break(f"{(self.queued_bytes + size) >> 20} MiB queued for it")
            if size and self.broken:  # dropped at once
                self.lost.add(token)
                return
            inline = self.exited
            if not inline:
                self.queued += 1
                self.queued_bytes += size
        if inline:  # the thread has ended (broken): the call's end is done here, outside the lock
            self._do(item)
        else:
            self.items.put(item)

    def _run(self):
        while not self.exited:
            try:
                item = self.items.get(timeout=IDLE_CHECK_S)
            except queue.Empty:
                try:
                    self._check_caller()
                except Exception:  # noqa: BLE001 - the check's, not the channel's: the thread goes on
                    log.exception("audio channel %s: checking its caller failed", self.path)
                continue
            try:
                self._do(item)
            except Exception:  # noqa: BLE001 - this item's, not the channel's
                log.exception("audio channel %s: an item failed", self.path)
            with self.idle:
                self.queued -= 1
                self.queued_bytes -= item[2]
                if self.queued == 0:
                    self.idle.notify_all()
                    self.exited = self.broken
        if self.sock is not None:
            self.sock.close()
        with _writers_lock:
            _running.discard(self)

    def _check_caller(self):
        """Idle: a caller that closed its end (its process gone, its model unloaded) breaks the writer,
        whose thread and socket then end, where else they would wait for a write that never comes.
        The caller sends nothing on the connection, so its end readable means it was closed."""
        if self.sock is None or self.broken:
            return
        try:
            readable = select.poll()  # (not select.select: it takes no descriptor past 1023)
            readable.register(self.sock, select.POLLIN)
            if not readable.poll(0):
                return
            closed = self.sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            closed = True
        if closed:
            with self.idle:
                self._break("its caller closed it", logging.INFO)
                self.exited = self.queued == 0  # else the thread ends after what was queued meanwhile

    def _do(self, item):
        token, what, _ = item
        if callable(what):
            with self.idle:
                lost = token in self.lost
                self.lost.discard(token)
            what(lost)
            return
        if self.broken:
            with self.idle:
                self.lost.add(token)
            return
        try:
            if self.sock is None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(GIVE_UP_S)
                self.sock.connect(self.path)
            for part in what:
                if part:
                    self.sock.sendall(part, socket.MSG_NOSIGNAL)  # a caller gone is an error here, not a signal
            self.written += 1
        except OSError as e:
            with self.idle:
                self.lost.add(token)
                self._break(str(e))

    def _break(self, reason: str, level: int = logging.WARNING):
        global _retired
        if self.broken:
            return
        self.broken = True
        log.log(level, "audio channel %s broken (%s): its calls' audio is dropped", self.path, reason)
        if self.sock is not None:  # a send it is stuck in fails now, not after GIVE_UP_S
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with _writers_lock:
            if _writers.get(self.path) is self:
                del _writers[self.path]
                _retired += self.written


_writers: dict[str, Writer] = {}
_running: set[Writer] = set()  # writers whose thread has not ended (a broken one finishes its queue)
_writers_lock = threading.RLock()  # (a writer made under it registers itself as running)
_retired = 0  # frames written by writers that have left the registry


def written() -> int:
    """Frames written so far by this process's writers (the decoder's metrics read it)."""
    with _writers_lock:
        return _retired + sum(w.written for w in _writers.values())


def drain(timeout: float) -> bool:
    """At finalize: wait for every writer's queue (its calls' final responses) to be done."""
    deadline = time.monotonic() + timeout
    with _writers_lock:
        writers = list(_running)
    return all([w.drain(deadline) for w in writers])


def writer(path: str, run_dir_realpath: str) -> Writer | None:
    """The writer for a caller's channel `path`: one in this server's run directory, by its name
    (`protocol.CHANNEL_NAME`), else None (no channel)."""
    if os.path.realpath(os.path.dirname(path)) != run_dir_realpath or not protocol.CHANNEL_NAME.fullmatch(os.path.basename(path)):
        return None
    with _writers_lock:
        w = _writers.get(path)
        if w is None:
            w = _writers[path] = Writer(path)
        return w


class Listener:
    """Caller side, one per process: the channel's socket at `path` and the connections the
    callees open on it, read on the event loop; each frame to `on_frame(token, Opened | Chunk | Ended)`.
    A connection that sends something else is closed (its writer then breaks)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, path: str, on_frame: Callable[[str, object], None]):
        self.loop, self.path, self.on_frame = loop, path, on_frame
        self.conns: dict[int, tuple[socket.socket, bytearray]] = {}
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind(path)
            self.sock.listen(64)
            self.sock.setblocking(False)
            loop.add_reader(self.sock.fileno(), self._accept)
        except BaseException:
            self.close()
            raise

    def read_all(self):
        """Every frame the callees have written so far, connections not yet accepted included."""
        self._accept()
        for fd in list(self.conns):
            self._read(fd)

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # closed at finalize while the loop was still running
                return
            conn.setblocking(False)
            self.conns[conn.fileno()] = (conn, bytearray())
            self.loop.add_reader(conn.fileno(), self._read, conn.fileno())

    def _read(self, fd: int):
        entry = self.conns.get(fd)
        if entry is None:
            return
        conn, buf = entry
        while True:
            try:
                data = conn.recv(_READ_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:  # the callee's process closed it (or died)
                self._drop(fd)
                break
            buf += data
        if not self._frames(buf):
            log.error("audio channel %s: a connection sent what is not a frame; closed", self.path)
            if fd in self.conns:
                self._drop(fd)

    def _frames(self, buf: bytearray) -> bool:
        """The whole frames at the start of `buf`, handed on and cut off; False at one that is none."""
        at = 0
        while len(buf) - at >= _HEADER.size:
            magic, kind, token, patches, n_audio, n_text = _HEADER.unpack_from(buf, at)
            if (magic != _MAGIC or kind not in (_CHUNK, _END, _OPEN) or n_audio % 4
                    or n_audio + n_text > MAX_FRAME_BYTES):
                buf.clear()
                return False
            end = at + _HEADER.size + n_audio + n_text
            if len(buf) < end:
                break
            body = at + _HEADER.size
            if kind == _CHUNK:
                item = Chunk(patches, np.frombuffer(buf, np.float32, n_audio // 4, body).copy())
            elif kind == _END:
                item = Ended(bytes(buf[body + n_audio:end]).decode(errors="replace") if n_text else None)
            else:
                item = Opened()
            self.on_frame(token.decode(errors="replace"), item)
            at = end
        del buf[:at]
        return True

    def _drop(self, fd: int):
        conn, _ = self.conns.pop(fd)
        try:
            self.loop.remove_reader(fd)
        except (RuntimeError, ValueError):
            pass
        conn.close()

    def close(self):
        for fd in list(self.conns):
            self._drop(fd)
        try:
            self.loop.remove_reader(self.sock.fileno())
        except (RuntimeError, ValueError):  # the loop is already closed
            pass
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
