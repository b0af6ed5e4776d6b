"""The callee's side of a counted BLS call (the decoder): its response sender, which counts each
response to the caller's inbox once the server has handed it over, carries errors after the first
response as data, and may send the call's audio over the caller's audio channel (the package's
docstring tells the whole protocol)."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time

import numpy as np

from ...coordination import processes, run_state
from ..triton_io import locked
from . import audio_channel, protocol

log = logging.getLogger("voxcpm_triton.bls.callee")

RETRY_S = 0.001  # counts that did not fit in a caller's socket are retried this often...
GIVE_UP_S = 60.0  # ...for this long: a caller that reads nothing for a minute is stuck or gone
DATAGRAM_BYTES = 16384  # counts sent together are cut into datagrams of at most this (the caller reads 64 KiB)
# sendto's errors that say the caller's process is gone (its socket file left behind, or none); any other
# (ENOBUFS, ENOMEM: the kernel short of memory now) is retried like a full socket
CALLER_GONE = frozenset({errno.ECONNREFUSED, errno.ENOENT, errno.ENOTDIR, errno.EPIPE})


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
                line = protocol.count_line(token, count, final)
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
                response = protocol.carried(response)
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
        self.caller_pid = protocol.caller_pid(path)  # the inbox is named after its process
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
            locked(self.send, None if message is None else protocol.error_response(message), flags=self.final_flag)

        self.channel.end(self.token, error, final)


def counting_sender(request, sender, final_flag: int, channel: bool = False):
    """`sender` (`request`'s), counting when the caller asked for counts to an inbox of this
    server: a socket in its private run directory, no other path; else carrying its errors
    (CarryingSender) when the caller asked for ERROR_OUTPUT. Only for requests already known to
    come from the orchestrator (the internal key). channel: take the audio channel the caller
    offers (in the same directory), if any, as the sender's `channel`."""
    carrying = CarryingSender(sender) if protocol.ERROR_OUTPUT in request.requested_output_names() else sender
    try:
        params = json.loads(request.parameters() or "{}")
        path, token = params.get(protocol.PARAMETER, "").split(" ")
    except (ValueError, AttributeError, TypeError):
        return carrying
    run_dir = run_state.run_dir_realpath()
    if (os.path.realpath(os.path.dirname(path)) != run_dir
            or not protocol.INBOX_NAME.fullmatch(os.path.basename(path)) or not protocol.TOKEN.fullmatch(token)):
        return carrying
    offered = params.get(audio_channel.PARAMETER)
    writer = audio_channel.writer(offered, run_dir) if channel and protocol.same_inbox(path, offered) else None
    return CountingSender(sender, path, token, final_flag, channel=writer)


def check_callee_config(model_config: dict, model: str):
    """Refuse a callee configuration under which a `send` can return before its response reached
    the caller (the server then delivers it from a response delegator, later), or with no
    ERROR_OUTPUT to carry its errors in."""
    if model_config.get("response_cache", {}).get("enable") or \
            model_config.get("dynamic_batching", {}).get("preserve_ordering"):
        raise ValueError(f"model {model!r}: no response_cache and no dynamic_batching.preserve_ordering: its "
                         "callers read its responses as far as it has counted them sent (serving/bls/)")
    if not any(o.get("name") == protocol.ERROR_OUTPUT and o.get("data_type") == "TYPE_STRING"
               for o in model_config.get("output", [])):
        raise ValueError(f"model {model!r}: needs the output {protocol.ERROR_OUTPUT!r} (TYPE_STRING, dims [1]): its errors "
                         "after a call's first response travel in it (serving/bls/)")
