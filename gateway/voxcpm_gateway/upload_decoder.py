"""Uploaded voice samples are decoded in a child process, one per upload.

FFmpeg and libsndfile parse whatever a client sends. In the gateway's own process a file that
crashes them (PyAV 18 segfaulted on 8-channel audio) would end every stream the gateway serves;
in a child it fails its upload: a 400 naming `audio_sample`, as does a decode past the time
limit (the child is killed, or ends itself by its alarm if the gateway is gone) or past the
memory limit. Children fork from a forkserver that has the decoders imported, so an upload
costs tens of milliseconds more, not an interpreter's start.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.util
import resource
import shutil
import signal

from . import audio_decoding, errors

MEMORY_LIMIT_BYTES = 2 << 30  # a child's data: 60 s at 384 kHz is 92 MB mono, read in blocks
_PRELOAD = ["voxcpm_gateway.audio_decoding", "numpy", "soundfile", "av"]  # missing ones are skipped
_context = None


def _forkserver():
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        _context = ctx
    return _context


def remove_temp_dir():
    """Remove multiprocessing's temporary directory (the forkserver's socket), where the forkserver was
    used. Python's exit handlers would, but the gateway ends by the signal that stopped it (uvicorn
    raises it again once it has shut down), and then they do not run."""
    if _context is not None:
        shutil.rmtree(multiprocessing.util.get_temp_dir(), ignore_errors=True)


def _child(conn, data: bytes, max_seconds: float, param: str, memory_limit: int, timeout_s: float):
    resource.setrlimit(resource.RLIMIT_DATA, (memory_limit, memory_limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file holding the user's audio
    signal.alarm(math.ceil(timeout_s) + 1)  # ends a hung decode even where the gateway died without killing it
    try:
        audio, rate = audio_decoding.decode(data, max_seconds, param)
        conn.send(("ok", audio, rate))
    except errors.APIError as e:  # sent as text: the exception's fields do not survive pickling
        conn.send(("error", e.message))
    except MemoryError:
        conn.send(("error", f"{param} needs more than {memory_limit >> 20} MiB to decode"))
    finally:
        conn.close()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            pass
    return f"exit code {exitcode}"


class UploadDecoder:
    def __init__(self, timeout_s: float, memory_limit: int = MEMORY_LIMIT_BYTES):
        self.timeout_s, self.memory_limit = timeout_s, memory_limit

    def decode(self, data: bytes, max_seconds: float, param: str = "audio_sample"):
        """audio_decoding.decode in a child process (blocking: call it from a thread)."""
        ctx = _forkserver()
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(sender, data, max_seconds, param, self.memory_limit, self.timeout_s),
                           name="voxcpm-gateway-decode", daemon=True)
        try:
            try:
                proc.start()
            except OSError as e:  # no process (a process limit), or it died before it read its work
                raise errors.APIError(503, f"{param} could not be decoded now: no decoder process started ({e})",
                                      param, "server_unavailable", {"Retry-After": errors.RETRY_AFTER_S}) from None
            finally:
                sender.close()
            if not receiver.poll(self.timeout_s):
                raise errors.bad_request(f"{param} took longer than {self.timeout_s:g} s to decode "
                                         "(--decode-timeout)", param)
            try:
                result = receiver.recv()
            except EOFError:  # it died without an answer
                proc.join(5)
                raise errors.bad_request(f"{param} could not be decoded: the decoder crashed "
                                         f"({_death(proc.exitcode)})", param) from None
        finally:
            receiver.close()
            if proc.pid is not None:  # it started
                if proc.is_alive():
                    proc.kill()
                proc.join(5)
        if result[0] == "error":
            raise errors.bad_request(result[1], param)
        return result[1], result[2]
