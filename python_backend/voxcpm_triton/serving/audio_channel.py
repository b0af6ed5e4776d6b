"""A decoder call's audio sent straight to its caller's process, past the server.

Each response a decoupled BLS callee sends is a round trip: its stub waits while the server hands
the response to the caller's stub and that stub takes it in (bls_stream). The decoder's one audio
thread makes every stream's deliveries one after another, so under load a round of them takes
longer than the audio it carries lasts (benchmarks/results.md, fifty-seventh session: 95-146 ms
for 128 streams, against a first chunk's 160 ms).

A caller that offers a channel (`bls_stream.Inbox`: a Unix stream socket in the server's private
run directory, named in the call's parameters) gets the call's audio chunks and its end as frames
on it. The callee (`Writer`, one per caller process, a thread of its own) writes them in order,
never making its audio thread wait, and after a call's end frame sends the call's final response.
The call itself carries only an empty first response (its admission) and that final one. The
caller reads its channels before it takes any response (`Listener.read_all`), so every frame of a
call is in its stream before the call's end.

A frame: a header (`_HEADER`: magic, kind, the call's token, patches, audio bytes, message bytes),
the chunk's audio (float32), an end's error message (UTF-8; none for an end without error).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

log = logging.getLogger("voxcpm_triton.audio_channel")

PARAMETER = "voxcpm_audio_channel"  # request parameter: the caller's channel path
GIVE_UP_S = 60.0  # a caller that takes nothing of a frame for this long is stuck or gone
NAME = re.compile(r"chan-\d+-[0-9a-f]{8}\.sock")

_HEADER = struct.Struct("<4sB16sIII")
_MAGIC = b"VXA1"
_CHUNK, _END = 1, 2
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


def _frame(kind: int, token: str, patches: int = 0, audio: np.ndarray | None = None,
           message: str | None = None) -> list:
    data = b"" if audio is None else np.ascontiguousarray(audio, np.float32).reshape(-1)
    text = b"" if message is None else message.encode()
    return [_HEADER.pack(_MAGIC, kind, token.encode(), patches, len(data) * 4 if len(data) else 0, len(text)),
            memoryview(data).cast("B") if len(data) else b"", text]


class Writer:
    """Callee side: the frames for one caller's channel, written in order by a thread of its own.
    `then` callables queued between them run in that order too (a call's final response, after
    its end frame). A channel that fails (its process gone, or taking nothing for GIVE_UP_S) is
    broken: its frames are dropped from then on, its callables still run."""

    def __init__(self, path: str):
        self.path = path
        self.broken = False
        self.written = 0  # frames written (by this writer's thread only)
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self.queued = 0  # items put and not yet done with
        self.idle = threading.Condition()
        threading.Thread(target=self._run, name="audio-channel", daemon=True).start()

    def chunk(self, token: str, patches: int, audio: np.ndarray):
        self._put(_frame(_CHUNK, token, patches, audio))

    def end(self, token: str, error: str | None, then: Callable[[], None]):
        self._put(_frame(_END, token, message=error))
        self._put(then)

    def drain(self, deadline: float) -> bool:
        """Wait (until the monotonic `deadline`) for everything queued to be done; True if it is."""
        with self.idle:
            return self.idle.wait_for(lambda: self.queued == 0, max(0.0, deadline - time.monotonic()))

    def _put(self, item):
        with self.idle:
            self.queued += 1
        self.items.put(item)

    def _run(self):
        sock = None
        while True:
            item = self.items.get()
            try:
                sock = self._do(item, sock)
            finally:
                with self.idle:
                    self.queued -= 1
                    if self.queued == 0:
                        self.idle.notify_all()

    def _do(self, item, sock: socket.socket | None) -> socket.socket | None:
        if callable(item):
            try:
                item()
            except Exception:  # noqa: BLE001 - one call's final response, not the channel's
                log.exception("ending a call after its audio channel's end frame failed")
            return sock
        if self.broken:
            return None
        try:
            if sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(GIVE_UP_S)
                sock.connect(self.path)
            for part in item:
                if len(part):
                    sock.sendall(part, socket.MSG_NOSIGNAL)  # a caller gone is an error here, not a signal
            self.written += 1
            return sock
        except OSError as e:
            self.broken = True
            log.warning("audio channel %s broken (%s): its calls' audio is dropped", self.path, e)
            if sock is not None:
                sock.close()
            return None


_writers: dict[str, Writer] = {}
_writers_lock = threading.Lock()


def written() -> int:
    """Frames written so far by this process's writers (the decoder's metrics read it)."""
    with _writers_lock:
        return sum(w.written for w in _writers.values())


def drain(timeout: float) -> bool:
    """At finalize: wait for every writer's queue (its calls' final responses) to be done."""
    deadline = time.monotonic() + timeout
    with _writers_lock:
        writers = list(_writers.values())
    return all([w.drain(deadline) for w in writers])


def writer(path: str, run_dir_realpath: str) -> Writer | None:
    """The writer for a caller's channel `path`: one in this server's run directory, by its name
    (`NAME`), else None (no channel)."""
    if os.path.realpath(os.path.dirname(path)) != run_dir_realpath or not NAME.fullmatch(os.path.basename(path)):
        return None
    with _writers_lock:
        w = _writers.get(path)
        if w is None:
            w = _writers[path] = Writer(path)
        return w


class Listener:
    """Caller side, one per process: the channel's socket at `path` and the connections the
    callees open on it, read on the event loop; each frame to `on_frame(token, Chunk | Ended)`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, path: str, on_frame: Callable[[str, object], None]):
        self.loop, self.path, self.on_frame = loop, path, on_frame
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.conns: dict[int, tuple[socket.socket, bytearray]] = {}
        loop.add_reader(self.sock.fileno(), self._accept)

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
        self._frames(buf)

    def _frames(self, buf: bytearray):
        at = 0
        while len(buf) - at >= _HEADER.size:
            magic, kind, token, patches, n_audio, n_text = _HEADER.unpack_from(buf, at)
            end = at + _HEADER.size + n_audio + n_text
            if magic != _MAGIC or kind not in (_CHUNK, _END):
                log.error("dropping an audio channel's data: not a frame")
                buf.clear()
                return
            if len(buf) < end:
                break
            body = at + _HEADER.size
            if kind == _CHUNK:
                item = Chunk(patches, np.frombuffer(buf, np.float32, n_audio // 4, body).copy())
            else:
                item = Ended(bytes(buf[body + n_audio:end]).decode(errors="replace") if n_text else None)
            self.on_frame(token.decode(errors="replace"), item)
            at = end
        del buf[:at]

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
