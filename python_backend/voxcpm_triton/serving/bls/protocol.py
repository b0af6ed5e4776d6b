"""What the two sides of a counted BLS call agree on: the request parameter that asks for counts,
the inbox's socket names (a process's counts socket and audio channel, named after its pid), the
count lines, and errors carried as data after a call's first response (ERROR_OUTPUT)."""

from __future__ import annotations

import os
import re
import secrets

import numpy as np

from ..triton_io import pb

PARAMETER = "voxcpm_bls_notify"  # request parameter: "<socket path> <token>"
ERROR_OUTPUT = "ERROR"  # the callee's output (TYPE_STRING, dims [1]) that carries an error past the first response
INBOX_NAME = re.compile(r"bls-(\d+)-[0-9a-f]{8}\.sock")
CHANNEL_NAME = re.compile(r"chan-(\d+)-[0-9a-f]{8}\.sock")
TOKEN = re.compile(r"[0-9a-f]{16}")


def inbox_paths(run_dir: str) -> tuple[str, str]:
    """A new inbox's counts socket and audio channel in `run_dir`: "bls-<pid>-<hex>.sock" and
    "chan-<pid>-<hex>.sock", alike but for their prefix."""
    name = f"{os.getpid()}-{secrets.token_hex(4)}.sock"
    return os.path.join(run_dir, f"bls-{name}"), os.path.join(run_dir, f"chan-{name}")


def caller_pid(counts_path: str) -> int | None:
    """The process an inbox belongs to, from its counts socket's name."""
    m = INBOX_NAME.fullmatch(os.path.basename(counts_path))
    return int(m.group(1)) if m else None


def same_inbox(counts_path: str, channel_path) -> bool:
    """Whether `channel_path` is the audio channel of the inbox whose counts socket is `counts_path`."""
    return isinstance(channel_path, str) and \
        os.path.basename(channel_path)[len("chan-"):] == os.path.basename(counts_path)[len("bls-"):]


def count_line(token: str, count: int, final: bool) -> str:
    return f"{token} {count} {int(final)}"


def parse_count(line: bytes) -> tuple[str, int, bool]:
    """(token, count, final) of a count line; ValueError if it is none."""
    token, count, final = line.decode().split(" ")
    return token, int(count), final == "1"


def carried(response):
    """An error response, as a response with its message in ERROR_OUTPUT."""
    p = pb()
    message = response.error().message()
    return p.InferenceResponse(output_tensors=[p.Tensor(ERROR_OUTPUT, np.array([message.encode()], dtype=object))])


def error_output(response) -> str | None:
    """The error message a response carries in ERROR_OUTPUT, if any."""
    t = None if response.has_error() else pb().get_output_tensor_by_name(response, ERROR_OUTPUT)
    return None if t is None else bytes(t.as_numpy().reshape(-1)[0]).decode(errors="replace")


def error_response(message: str):
    p = pb()
    return p.InferenceResponse(error=p.TritonError(message))


def restored(response):
    """A response read from a call: one carrying an error (`carried`) as that error response."""
    message = error_output(response)
    return response if message is None else error_response(message)
