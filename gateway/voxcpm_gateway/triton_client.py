"""The gateway's one way to Triton: gRPC through tritonclient's asyncio client.

One channel serves every request (HTTP/2 multiplexes the calls on it). Each request to Triton
is one ModelStreamInfer call carrying one inference request: for `tts_stream` its responses
are the audio chunks as the server makes them; for `voices` (not decoupled) the one answer.
Going through the stream for both keeps one rule for errors: Triton's own answers arrive in
the stream as text, transport failures as gRPC errors. Leaving a call early (the HTTP client
hung up, an error) cancels it, and Triton cancels the request: the decoder stops at its next
chunk and frees its state.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, InferInput, KeepAliveOptions
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

HEALTH_TIMEOUT_S = 5.0  # /health's wait for Triton's answer
# gRPC backs off up to 120 s between reconnects by default, so after a long Triton restart the
# gateway would answer 503 for up to two minutes more; on the loopback a retry a second costs nothing.
RECONNECT_BACKOFF_MS = 1000


class TritonError(Exception):
    """Triton answered with an error (`message` as it is), or the call failed on the way
    (`unreachable`), or ran past its deadline (`timed_out`)."""

    def __init__(self, message: str, unreachable: bool = False, timed_out: bool = False):
        super().__init__(message)
        self.message, self.unreachable, self.timed_out = message, unreachable, timed_out


def _tensors(arrays: dict[str, np.ndarray]) -> list:
    out = []
    for name, array in arrays.items():
        t = InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        t.set_data_from_numpy(array)
        out.append(t)
    return out


class Call:
    """One request on its own ModelStreamInfer call. `next()` gives each response
    (tritonclient InferResult) and None after the final one; `cancel()` ends the call."""

    def __init__(self, client: grpcaio.InferenceServerClient, model: str, arrays: dict, request_id: str,
                 timeout_s: float):
        self._done = asyncio.Event()
        request = {"model_name": model, "inputs": _tensors(arrays), "request_id": request_id,
                   "parameters": {"triton_enable_empty_final_response": True}}

        async def requests():
            yield request
            # Half-closing right away could end the call before the last response: the request
            # side stays open until the final response (or a cancel).
            await self._done.wait()

        self._responses = client.stream_infer(requests(), stream_timeout=timeout_s)
        self.finished = False

    async def next(self):
        if self.finished:
            return None
        try:
            result, error = await self._responses.__anext__()
        except StopAsyncIteration:
            self._end()
            raise TritonError("Triton ended the call without a final response", unreachable=True) from None
        except grpc.RpcError as e:
            self._end()
            code = e.code() if hasattr(e, "code") else None
            detail = f"{getattr(code, 'name', 'ERROR')}: {e.details() if hasattr(e, 'details') else e}"
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TritonError(detail, timed_out=True) from None
            raise TritonError(detail, unreachable=True) from None
        if error is not None:
            self._end()
            raise TritonError(error.message() or str(error))
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            self._end()
        return result

    def _end(self):
        self.finished = True
        self._done.set()

    def cancel(self) -> bool:
        """End the call if it is still running; True when it was (Triton then cancels the request)."""
        running = not self.finished
        self._end()
        if running:
            self._responses.cancel()
        return running


class SynthesisStream:
    """A `tts_stream` request: `next_chunk()` gives each non-empty AUDIO chunk (float32), None at
    the end; `sample_rate` is known from the first response on."""

    def __init__(self, call: Call):
        self.call = call
        self.sample_rate = 0

    async def next_chunk(self) -> np.ndarray | None:
        while (result := await self.call.next()) is not None:
            rate = result.as_numpy("SAMPLE_RATE")
            if rate is not None and rate.size and not self.sample_rate:
                self.sample_rate = int(rate.reshape(-1)[0])
            audio = result.as_numpy("AUDIO")
            if audio is not None and audio.size:
                return audio.reshape(-1).astype(np.float32, copy=False)
        return None

    def cancel(self) -> bool:
        return self.call.cancel()


def channel_args() -> list[tuple]:
    """tritonclient's own channel options (passing any replaces them all) and a short reconnect backoff."""
    keepalive = KeepAliveOptions()
    return [("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS)]


class TritonClient:
    def __init__(self, url: str, stream_model: str = "tts_stream", voices_model: str = "voices",
                 timeout_s: float = 3600.0, voice_timeout_s: float = 300.0):
        self.url, self.stream_model, self.voices_model, self.timeout_s = url, stream_model, voices_model, timeout_s
        self.voice_timeout_s = voice_timeout_s
        self._client: grpcaio.InferenceServerClient | None = None

    @property
    def client(self) -> grpcaio.InferenceServerClient:
        if self._client is None:  # made on first use: a grpc.aio channel belongs to the running loop
            self._client = grpcaio.InferenceServerClient(url=self.url, channel_args=channel_args())
        return self._client

    def synthesize(self, arrays: dict[str, np.ndarray], request_id: str) -> SynthesisStream:
        return SynthesisStream(Call(self.client, self.stream_model, arrays, request_id, self.timeout_s))

    async def voices(self, arrays: dict[str, np.ndarray], request_id: str = "") -> list[str]:
        """One request to the `voices` model; the registered names after it."""
        call = Call(self.client, self.voices_model, arrays, request_id, self.voice_timeout_s)
        try:
            names = None
            while (result := await call.next()) is not None:
                out = result.as_numpy("NAMES")
                names = out if out is not None else names
        finally:
            call.cancel()
        return [] if names is None else [n.decode() if isinstance(n, bytes) else str(n) for n in names.reshape(-1)]

    async def ready(self) -> bool:
        """Both models ready; False too for a Triton that does not answer both within HEALTH_TIMEOUT_S
        (a health check that hangs on a stuck server checks nothing)."""
        async def both() -> bool:
            for model in (self.stream_model, self.voices_model):
                if not await self.client.is_model_ready(model, client_timeout=HEALTH_TIMEOUT_S):
                    return False
            return True

        try:
            return await asyncio.wait_for(both(), HEALTH_TIMEOUT_S)
        except (InferenceServerException, grpc.RpcError, asyncio.TimeoutError):
            return False

    async def close(self):
        if self._client is not None:
            await self._client.close()
            self._client = None
