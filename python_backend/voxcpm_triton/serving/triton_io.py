"""Small helpers over triton_python_backend_utils (imported lazily: only the stub has it)."""

from __future__ import annotations

import threading

import numpy as np

# The Python backend stub (Triton 2.51) corrupts its IPC when several threads of one model
# instance call into it at once: a segfault in libtriton_python.so under 6+ concurrent streams
# when tts_stream's worker threads issued BLS calls in parallel. Every call into the stub from
# a thread other than the one running execute() (BLS exec, response send, cancellation check,
# metric update) therefore goes through this per-process lock. Waiting for the next response
# of a decoupled BLS stream does not hold it.
IPC_LOCK = threading.RLock()


def locked(fn, *args, **kwargs):
    with IPC_LOCK:
        return fn(*args, **kwargs)


def pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


class InputError(ValueError):
    """A client mistake: answered with INVALID_ARG and a message naming the input."""


def get(request, name: str):
    t = pb().get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def tensor(name: str, array) -> object:
    return pb().Tensor(name, np.ascontiguousarray(array))


def error_response(exc: BaseException):
    p = pb()
    code = p.TritonError.INVALID_ARG if isinstance(exc, (InputError, ValueError)) else p.TritonError.INTERNAL
    return p.InferenceResponse(error=p.TritonError(str(exc) or type(exc).__name__, code))


def bls(model: str, inputs: dict, outputs: list[str], **kw):
    """Build a BLS request; numpy inputs by name."""
    p = pb()
    return p.InferenceRequest(model_name=model, requested_output_names=outputs,
                              inputs=[tensor(k, v) for k, v in inputs.items()], **kw)


def outputs(response, names: list[str]) -> list:
    p = pb()
    if response.has_error():
        raise BLSError(response.error().message())
    return [p.get_output_tensor_by_name(response, n).as_numpy() for n in names]


class BLSError(RuntimeError):
    """A downstream model answered with an error; its message is passed on as is."""
