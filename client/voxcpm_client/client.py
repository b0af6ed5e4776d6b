"""Triton client for the VoxCPM2 `tts` / `tts_stream` models.

The request contract (names, dtypes, shapes) is the public one in the
repository's README ("Contract"); only TEXT is required.
"""
from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import queue
import re
import time
from typing import Callable, List, Optional

import numpy as np
import soundfile as sf

# Contract: optional parameter -> (input name, numpy dtype). Audio inputs are
# FP32 [-1]; the rest are one-element tensors of shape [1].
SCALAR_INPUTS = {
    "reference_sample_rate": ("REFERENCE_SAMPLE_RATE", np.int32),
    "prompt_sample_rate": ("PROMPT_SAMPLE_RATE", np.int32),
    "prompt_text": ("PROMPT_TEXT", np.object_),
    "cfg_value": ("CFG_VALUE", np.float32),
    "inference_timesteps": ("INFERENCE_TIMESTEPS", np.int32),
    "min_length": ("MIN_LENGTH", np.int32),
    "max_length": ("MAX_LENGTH", np.int32),
    "seed": ("SEED", np.int64),
    "voice": ("VOICE", np.object_),
    "voice_mode": ("VOICE_MODE", np.object_),
    "normalize": ("NORMALIZE", np.bool_),
    "lora": ("LORA", np.object_),
    "retry_badcase": ("RETRY_BADCASE", np.bool_),  # `tts` only
}
VOICE_MODES = ("reference", "continuation", "both")
AUDIO_INPUTS = {
    "reference_audio": "REFERENCE_AUDIO",
    "prompt_audio": "PROMPT_AUDIO",
}
PARAMS = frozenset(SCALAR_INPUTS) | frozenset(AUDIO_INPUTS)
TRITON_DTYPES = {np.object_: "BYTES", np.float32: "FP32", np.int32: "INT32", np.int64: "INT64", np.bool_: "BOOL"}


class VoxCPMClientError(Exception):
    """Base class of this client's errors."""


class ServerUnavailable(VoxCPMClientError):
    """Triton could not be reached."""


class SynthesisError(VoxCPMClientError):
    """The server answered with an error (the message is the server's)."""


class ServerBusy(ServerUnavailable, SynthesisError):
    """The server cannot take the request now: full (`server busy`), shutting down, or a model
    process being restarted. The request was fine: retry it later."""


# The contract's messages for "not now" (README, "Contract"), anchored: an error that quotes a client's
# input (a voice name, a parameter) must not pass for one. A shutdown's may end another's text.
_BUSY = re.compile(r"^server busy|^VoxCPM server unhealthy: |^the server is shutting down|the server is shutting down$|"
                   r"^Server is stopping|Stub process '[^']*' is not healthy\.?$")


def _answered(msg: str) -> SynthesisError:
    return ServerBusy(msg) if _BUSY.search(msg) else SynthesisError(msg)


class SynthesisTimeout(SynthesisError, TimeoutError):
    """No (complete) answer within the timeout."""


@dataclasses.dataclass
class Result:
    audio: np.ndarray                      # float32 mono
    sample_rate: int
    chunks: List[np.ndarray] = dataclasses.field(default_factory=list)  # streaming only
    ttfa_s: Optional[float] = None         # send -> first non-empty AUDIO chunk (streaming)
    total_s: float = 0.0                   # send -> last response
    cancelled: bool = False                # stopped early (max_chunks)

    @property
    def audio_s(self) -> float:
        return len(self.audio) / self.sample_rate if self.sample_rate else 0.0

    @property
    def rtf(self) -> float:
        """Real-time factor: total_s / audio_s (inf when there is no audio)."""
        return self.total_s / self.audio_s if self.audio_s > 0 else float("inf")

    def save(self, path: str, subtype: str = "PCM_16") -> None:
        """Write a wav file (whatever the name's extension); subtype "PCM_16" or "FLOAT"."""
        sf.write(path, self.audio, self.sample_rate, subtype=subtype, format="WAV")


def load_audio(source):
    """Read wav/flac/... from a path or anything soundfile reads (a binary file object) -> (mono float32
    waveform, sample rate); channels are averaged."""
    if isinstance(source, (str, bytes, os.PathLike)):
        with open(source, "rb") as f:  # a missing or unreadable file said as such (libsndfile: "System error.")
            return load_audio(f)
    data, rate = sf.read(source, dtype="float32", always_2d=True, closefd=False)  # a caller's descriptor stays open
    return np.ascontiguousarray(data.mean(axis=1, dtype=np.float32)), int(rate)


def input_arrays(text: str, **params) -> dict:
    """Request tensors by input name, as numpy arrays with the contract dtypes/shapes."""
    unknown = set(params) - PARAMS
    if unknown:
        raise TypeError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
    params = {k: v for k, v in params.items() if v is not None}
    for audio, rate in (("reference_audio", "reference_sample_rate"), ("prompt_audio", "prompt_sample_rate")):
        if audio in params and rate not in params:
            raise ValueError(f"{audio} needs {rate}")
    if ("prompt_audio" in params) != ("prompt_text" in params):
        raise ValueError("prompt_audio and prompt_text go together")
    if "voice_mode" in params and "voice" not in params:
        raise ValueError("voice_mode needs voice")
    for flag in ("normalize", "retry_badcase"):
        if flag in params and not isinstance(params[flag], (bool, np.bool_)):
            raise TypeError(f"{flag} must be True or False, got {params[flag]!r}")

    arrays = {"TEXT": _bytes_tensor(text, "text")}
    for key, name in AUDIO_INPUTS.items():
        if key in params:
            arrays[name] = _waveform(params[key], key)
    for key, (name, dtype) in SCALAR_INPUTS.items():
        if key in params:
            if dtype is not np.object_ and np.issubdtype(dtype, np.integer):
                bounds = np.iinfo(dtype)
                if not isinstance(params[key], (int, np.integer)):
                    raise TypeError(f"{key} must be an integer, got {params[key]!r}")
                if not bounds.min <= params[key] <= bounds.max:
                    raise ValueError(f"{key} must fit {name}, an {np.dtype(dtype).name} input ({bounds.min} to "
                                     f"{bounds.max}; the server checks its own range), got {params[key]!r}")
            arrays[name] = (_bytes_tensor(params[key], key) if dtype is np.object_
                            else np.array([params[key]], dtype=dtype))
    return arrays


def _bytes_tensor(text, what: str = "text") -> np.ndarray:
    """A BYTES tensor of one string (str, or bytes already encoded); TypeError for anything else,
    which would otherwise be sent as its repr ("None")."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    elif not isinstance(text, bytes):
        raise TypeError(f"{what} must be a string, got {type(text).__name__}")
    return np.array([text], dtype=np.object_)


def _waveform(audio, what: str) -> np.ndarray:
    """A 1-D float32 waveform in [-1, 1]; integer samples are refused, not sent unscaled."""
    audio = np.asarray(audio)
    if not np.issubdtype(audio.dtype, np.floating):
        raise TypeError(f"{what} must be float samples in [-1, 1], got {audio.dtype} (int16 samples: divide by "
                        "32768)")
    if audio.ndim != 1:
        raise ValueError(f"{what} must be a 1-D mono waveform, got shape {audio.shape}")
    return np.ascontiguousarray(audio, dtype=np.float32)


def make_inputs(module, text: str, **params) -> list:
    """tritonclient InferInput list; `module` is tritonclient.grpc or tritonclient.http."""
    return _tensors(module, input_arrays(text, **params))


def _tensors(module, arrays: dict) -> list:
    """name -> numpy array as tritonclient InferInputs of `module` (grpc or http)."""
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), TRITON_DTYPES[array.dtype.type])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


_ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):([0-9]{1,5})")


def server_address(url: str) -> str:
    """Triton's host:port from `url` (an http:// or grpc:// in front is dropped); ValueError if it is
    not one, or asks for TLS, which this client does not speak."""
    if not isinstance(url, str):
        raise ValueError(f"url must be a string host:port, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if sep:
        if scheme.lower() not in ("http", "grpc"):
            raise ValueError(f"url {url!r}: {scheme}:// is not supported (this client speaks plain HTTP and gRPC, "
                             "no TLS): give host:port")
        url = rest
    m = _ADDRESS.fullmatch(url.rstrip("/"))
    if not m or not 0 < int(m[2]) <= 65535:
        raise ValueError(f"url {url!r} is not host:port (a port from 1 to 65535)")
    return m[0]


@contextlib.contextmanager
def _client_errors(model: str, url: str, timeout, grpc: bool = False):
    """tritonclient's exceptions as this library's (one blocking infer call inside)."""
    from tritonclient.utils import InferenceServerException

    try:
        yield
    except InferenceServerException as exc:
        raise (_grpc_error(exc, url) if grpc else _http_error(exc, url)) from None
    except _TIMEOUTS:
        raise SynthesisTimeout(f"no answer from {model} at {url} within {timeout} s") from None
    except OSError as exc:  # refused, reset, unresolvable host
        raise ServerUnavailable(f"cannot reach Triton at {url}: {exc}") from None
    except http.client.HTTPException as exc:  # an answer that is not HTTP/1.1 (Triton's gRPC port, say)
        raise ServerUnavailable(f"no valid HTTP answer from {url} ({type(exc).__name__}: {exc}): if that is "
                                "Triton's gRPC port, use its HTTP port (default 8000) or the gRPC protocol") from None


# what tritonclient says when an error's body is not Triton's {"error": "<text>"}
_NOT_TRITONS = "an exception occurred in the client while decoding the response"


def _http_error(exc, url: str) -> VoxCPMClientError:
    msg = exc.message()
    if isinstance(msg, str) and not msg.startswith(_NOT_TRITONS):
        return _answered(msg or str(exc))
    # Another server's error (the OpenAI gateway's {"error": {...}}, a web server's page): not Triton
    body = " ".join((json.dumps(msg) if not isinstance(msg, str) else str(exc.debug_details() or msg)).split())
    body = body if len(body) <= 200 else body[:200] + "..."
    return ServerUnavailable(f"{url} did not answer as Triton does (HTTP {exc.status()}: {body}): if that is the "
                             "OpenAI gateway's port, use Triton's HTTP port (default 8000) or the gateway's own API")


def _grpc_error(exc, url: str) -> VoxCPMClientError:
    status = exc.status() or ""
    msg = exc.message() or str(exc)
    answered = _answered(msg)
    if isinstance(answered, ServerBusy):  # Triton's answer (UNAVAILABLE over a unary call, no status in a stream)
        return answered
    if status == "StatusCode.UNAVAILABLE":
        hint = ""
        # an HTTP/1.1 server's answer to gRPC's preface, or Triton's HTTP port closing the socket on it
        if any(s in msg for s in ("Failed parsing HTTP/2", "http1.x server", "Socket closed")):
            hint = ": if that is Triton's HTTP port, use its gRPC port (default 8001) or the HTTP protocol"
        return ServerUnavailable(f"cannot reach Triton at {url}: {msg}{hint}")
    if status == "StatusCode.DEADLINE_EXCEEDED":
        return SynthesisTimeout(msg)
    return answered


def synthesize_stream(text: str, url: str = "localhost:8001", model: str = "tts_stream",
                      on_chunk: Optional[Callable[[np.ndarray], None]] = None,
                      timeout: Optional[float] = 300.0, max_chunks: Optional[int] = None,
                      request_id: str = "", **params) -> Result:
    """Synthesize over a gRPC stream, collecting AUDIO chunks as they arrive.

    `on_chunk(chunk)` is called for each non-empty chunk. `max_chunks=N` stops
    after N chunks and cancels the request on the server (Result.cancelled).
    `timeout` bounds the whole request (seconds, None = no limit).
    """
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    url = server_address(url)
    if model == "tts_stream" and params.get("retry_badcase") is not None:
        raise TypeError("retry_badcase is for tts: tts_stream's audio, once sent, cannot be taken back")
    inputs = make_inputs(grpcclient, text, **params)
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url=url)
    chunks: List[np.ndarray] = []
    sample_rate = 0
    ttfa = None
    finished = cancelled = False
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        t0 = time.perf_counter()
        client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)
        while True:
            remaining = None if timeout is None else timeout - (time.perf_counter() - t0)
            try:
                if remaining is not None and remaining <= 0:
                    raise queue.Empty
                result, error = responses.get(timeout=remaining)
            except queue.Empty:
                raise SynthesisTimeout(f"no complete answer from {model} at {url} within {timeout} s") from None
            if error is not None:
                raise _grpc_error(error, url)
            audio = result.as_numpy("AUDIO")
            rate = result.as_numpy("SAMPLE_RATE")
            if rate is not None and rate.size and not sample_rate:
                sample_rate = int(rate.reshape(-1)[0])
            if audio is not None and audio.size:
                audio = audio.reshape(-1).astype(np.float32, copy=False)
                if ttfa is None:
                    ttfa = time.perf_counter() - t0
                chunks.append(audio)
                if on_chunk is not None:
                    on_chunk(audio)
            params_ = result.get_response().parameters
            if "triton_final_response" in params_ and params_["triton_final_response"].bool_param:
                finished = True
                break
            if max_chunks is not None and len(chunks) >= max_chunks:
                cancelled = True
                break
        total = time.perf_counter() - t0
    except InferenceServerException as exc:  # start_stream / async_stream_infer
        # When the connection fails at once, the stream goes inactive before the
        # request is queued and async_stream_infer only says "the error detail
        # is reported through provided callback": report that error instead.
        try:
            _, error = responses.get(timeout=1.0)
        except queue.Empty:
            error = None
        raise _grpc_error(error or exc, url) from None
    finally:
        # Finished: half-close and let the stream end. Otherwise (cancel, error,
        # timeout) cancel the RPC so the server drops the request.
        try:
            client.stop_stream(cancel_requests=not finished)
        finally:
            client.close()
    audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    return Result(audio=audio, sample_rate=sample_rate, chunks=chunks, ttfa_s=ttfa, total_s=total,
                  cancelled=cancelled)


def synthesize(text: str, url: str = "localhost:8000", model: str = "tts",
               timeout: Optional[float] = 300.0, request_id: str = "", **params) -> Result:
    """Synthesize a whole utterance with one HTTP inference request."""
    import tritonclient.http as httpclient

    url = server_address(url)
    inputs = make_inputs(httpclient, text, **params)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("AUDIO", "SAMPLE_RATE")]
    net_timeout = 1e9 if timeout is None else timeout
    client = httpclient.InferenceServerClient(url=url, connection_timeout=min(net_timeout, 30.0),
                                              network_timeout=net_timeout)
    try:
        with _client_errors(model, url, timeout):
            t0 = time.perf_counter()
            result = client.infer(model, inputs, outputs=outputs, request_id=request_id)
            total = time.perf_counter() - t0
    finally:
        client.close()
    audio = result.as_numpy("AUDIO")
    audio = np.zeros(0, np.float32) if audio is None else audio.reshape(-1).astype(np.float32, copy=False)
    rate = result.as_numpy("SAMPLE_RATE")
    return Result(audio=audio, sample_rate=int(rate.reshape(-1)[0]) if rate is not None else 0, total_s=total)


# ---------------------------------------------------------------- stored voices (model `voices`)
def add_voice(name: str, audio, sample_rate: int, text: Optional[str] = None, url: Optional[str] = None,
              protocol: str = "http", timeout: Optional[float] = 120.0, lora: Optional[str] = None) -> List[str]:
    """Store `audio` (mono float waveform at `sample_rate`) as voice `name`, replacing one of that
    name; `text`, its transcript, lets the voice serve voice_mode continuation/both too; `lora`, a
    LoRA adapter the server has loaded, is used by requests with the voice and no lora of their
    own. Returns the registered names."""
    if isinstance(sample_rate, (bool, np.bool_)) or not isinstance(sample_rate, (int, np.integer)):
        raise TypeError(f"sample_rate must be an integer, got {sample_rate!r}")
    if not 0 < sample_rate < 2**31:
        raise ValueError(f"sample_rate must be a positive number of Hz, got {sample_rate}")
    arrays = {**_action("add", name), "AUDIO": _waveform(audio, "audio"),
              "SAMPLE_RATE": np.array([sample_rate], np.int32)}
    if text is not None:
        arrays["TEXT"] = _bytes_tensor(text, "text")
    if lora:
        arrays["LORA"] = _bytes_tensor(lora, "lora")
    return _names("voices", arrays, url, protocol, timeout)


def remove_voice(name: str, url: Optional[str] = None, protocol: str = "http",
                 timeout: Optional[float] = 60.0) -> List[str]:
    """Remove voice `name` (an error if there is none); returns the names left."""
    return _names("voices", _action("remove", name), url, protocol, timeout)


def list_voices(url: Optional[str] = None, protocol: str = "http", timeout: Optional[float] = 60.0) -> List[str]:
    """The registered voice names, sorted."""
    return _names("voices", _action("list"), url, protocol, timeout)


# ---------------------------------------------------------------- LoRA adapters (model `loras`)
def add_lora(name: str, url: Optional[str] = None, protocol: str = "http",
             timeout: Optional[float] = 120.0) -> List[str]:
    """Load the adapter in the server's LoRA folder's subfolder `name` (replacing a loaded one of
    that name); returns the loaded adapters' names."""
    return _names("loras", _action("add", name), url, protocol, timeout)


def remove_lora(name: str, url: Optional[str] = None, protocol: str = "http",
                timeout: Optional[float] = 60.0) -> List[str]:
    """Unload adapter `name` (an error if no adapter of that name is loaded): new requests cannot
    use it, those running on it finish. Returns the names left."""
    return _names("loras", _action("remove", name), url, protocol, timeout)


def list_loras(url: Optional[str] = None, protocol: str = "http", timeout: Optional[float] = 60.0) -> List[str]:
    """The loaded LoRA adapters' names, sorted."""
    return _names("loras", _action("list"), url, protocol, timeout)


def _action(action: str, name=None) -> dict:
    """A registry model's ACTION and, but for list, NAME."""
    return {"ACTION": _bytes_tensor(action), **({} if action == "list" else {"NAME": _bytes_tensor(name, "name")})}


def _names(model: str, arrays: dict, url: Optional[str], protocol: str, timeout: Optional[float]) -> List[str]:
    """A registry model's (`voices`, `loras`) NAMES output as strings."""
    names = _infer_once(protocol, url, model, arrays, "NAMES", timeout)
    return [] if names is None else [n.decode() if isinstance(n, bytes) else str(n) for n in names.reshape(-1)]


def _infer_once(protocol: str, url: Optional[str], model: str, arrays: dict, output: str,
                timeout: Optional[float]):
    """One request/response inference over HTTP or gRPC; the output `output` as numpy."""
    if protocol not in ("http", "grpc"):
        raise ValueError(f"protocol must be http or grpc, got {protocol!r}")
    url = server_address(url or ("localhost:8000" if protocol == "http" else "localhost:8001"))
    if protocol == "grpc":
        import tritonclient.grpc as module
        client = module.InferenceServerClient(url=url)
    else:
        import tritonclient.http as module
        net_timeout = 1e9 if timeout is None else timeout
        client = module.InferenceServerClient(url=url, connection_timeout=min(net_timeout, 30.0),
                                              network_timeout=net_timeout)
    inputs = _tensors(module, arrays)
    try:
        with _client_errors(model, url, timeout, grpc=protocol == "grpc"):
            if protocol == "grpc":
                result = client.infer(model, inputs, client_timeout=timeout)
            else:
                result = client.infer(model, inputs)
    finally:
        client.close()
    return result.as_numpy(output)


try:  # tritonclient.http runs on gevent; its network timeout is gevent.Timeout
    from gevent import Timeout as _GeventTimeout
    _TIMEOUTS = (TimeoutError, _GeventTimeout)
except ImportError:  # pragma: no cover
    _TIMEOUTS = (TimeoutError,)
