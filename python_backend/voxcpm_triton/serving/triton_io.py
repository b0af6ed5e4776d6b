"""Small helpers over triton_python_backend_utils (imported lazily: only the stub has it)."""

from __future__ import annotations

import functools
import json
import threading

import numpy as np

from ..coordination import run_state

# The Python backend stub (Triton 2.51) corrupts its IPC when several threads of one model
# instance call into it at once (a segfault in libtriton_python.so when worker threads issued
# BLS calls in parallel). Models that call into the stub from threads of their own (the
# decoder's engine thread, metric publishers) take this per-process lock around each call.
# The orchestrators make their stub calls from their instance's event loop, and take it where a
# thread of theirs calls in (every metric update does, see metrics.release_all; bls.caller's
# fallback reader, which waits in a call's iterator, is the one thread that does not).
IPC_LOCK = threading.RLock()


def locked(fn, *args, **kwargs):
    with IPC_LOCK:
        return fn(*args, **kwargs)


def pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


class InputError(ValueError):
    """A client mistake: answered with INVALID_ARG and a message naming the input."""


class Busy(RuntimeError):
    """A bound on queued or concurrent work was reached: answered with UNAVAILABLE, so clients
    know to retry later."""


SHUTTING_DOWN = "the server is shutting down"  # a Busy error's message while the server stops


class Refused(PermissionError):
    """A request to an internal model that does not come from the orchestrator."""


class Unhealthy(RuntimeError):
    """A model process the pipeline needs has died or stopped: answered with UNAVAILABLE.
    scripts/probe.py looks for this prefix to tell a broken server from a busy one."""

    PREFIX = "VoxCPM server unhealthy: "

    def __init__(self, reason: str):
        super().__init__(self.PREFIX + reason)


def instance_count(args: dict, visible_gpus=lambda: 1) -> int:
    """How many instances of this model the server runs, from its (normalized) instance_group in
    `args`: a KIND_GPU group's count is per GPU it lists (a KIND_AUTO one, if left unresolved, per
    `visible_gpus()`, at least 1)."""
    groups = json.loads(args.get("model_config") or "{}").get("instance_group") or [{}]
    n = 0
    for g in groups:
        count = int(g.get("count", 1))
        if g.get("kind", "KIND_AUTO") in ("KIND_GPU", "KIND_AUTO"):
            count *= len(g.get("gpus") or ()) or max(visible_gpus(), 1)
        n += count
    return n


def get(request, name: str):
    t = pb().get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def arrays(request) -> dict:
    """Every input of `request` by name, as numpy: read once (each `get` lists them all again)."""
    return {t.name(): t.as_numpy() for t in request.inputs()}


def tensor(name: str, array) -> object:
    return pb().Tensor(name, np.ascontiguousarray(array))


def error_code(exc: BaseException):
    E = pb().TritonError
    if isinstance(exc, (Busy, Unhealthy)):
        return E.UNAVAILABLE
    if isinstance(exc, Refused):
        return E.UNSUPPORTED
    if isinstance(exc, (InputError, ValueError)):
        return E.INVALID_ARG
    return E.INTERNAL


def error_response(exc: BaseException):
    p = pb()
    return p.InferenceResponse(error=p.TritonError(str(exc) or type(exc).__name__, error_code(exc)))


@functools.lru_cache(maxsize=1)
def _internal_key() -> str:
    return run_state.internal_key()


def bls(model: str, inputs: dict, outputs: list[str], parameters: dict | None = None, **kw):
    """Build a BLS request to an internal model, stamped with this server's internal key; numpy
    inputs by name, `parameters` besides the key."""
    p = pb()
    return p.InferenceRequest(model_name=model, requested_output_names=outputs,
                              inputs=[tensor(k, v) for k, v in inputs.items()],
                              parameters={**(parameters or {}), run_state.KEY_PARAMETER: _internal_key()}, **kw)


def require_internal(request, model: str):
    """Raise Refused unless `request` carries the internal key (it came from the orchestrator)."""
    if not run_state.key_matches(request.parameters(), _internal_key()):
        raise Refused(f"model {model!r} is internal to the VoxCPM pipeline; send requests to 'tts' or "
                      "'tts_stream'")


def outputs(response, names: list[str]) -> list:
    p = pb()
    if response.has_error():
        raise downstream_error(response.error())
    return [p.get_output_tensor_by_name(response, n).as_numpy() for n in names]


class BLSError(RuntimeError):
    """A downstream model answered with an error; its message is passed on as is."""


# Triton 2.51 passes a BLS response's error message on but not its code. An internal model whose
# errors the orchestrator passes on (the tokenizer, vae_encoder, the decoder) marks the kind in the
# message (`internal_error_response`); `downstream_error` reads it back and strips it.
_KIND_TAGS = {"[invalid input] ": InputError, "[busy] ": Busy}


def error_message(exc: BaseException) -> str:
    """The message of an error a model answers a BLS call with: its kind survives the hop."""
    tag = next((t for t, kind in _KIND_TAGS.items() if isinstance(exc, kind)), "")
    return tag + (str(exc) or type(exc).__name__)


def internal_error_response(exc: BaseException):
    """`error_response` for a model that answers BLS calls (`error_message`)."""
    p = pb()
    return p.InferenceResponse(error=p.TritonError(error_message(exc), error_code(exc)))


def answer_each(requests, model: str, answer) -> list:
    """An internal model's responses, one a request in order: `answer(request)` -> its output tensors,
    for requests from the orchestrator only; an error answers its own request alone, its kind kept
    past the BLS hop (`internal_error_response`)."""
    responses = []
    for request in requests:
        try:
            require_internal(request, model)
            responses.append(pb().InferenceResponse(output_tensors=answer(request)))
        except Exception as e:
            responses.append(internal_error_response(e))
    return responses


def downstream_error(error) -> Exception:
    """An internal model's error response (a TritonError) as the exception to pass on: a client
    mistake it found (e.g. an unknown LoRA adapter) stays one, and so does a bound it reached, with
    its message."""
    message = error.message()
    for tag, kind in _KIND_TAGS.items():
        if message.startswith(tag):
            return kind(message[len(tag):])
    return BLSError(message)
