"""The response of `POST /v1/audio/speech`: Triton's audio chunks, encoded, as they arrive.

Nothing is sent until the first encoded bytes (or an error) are ready, so a refused request
still gets its proper status (400, 404, 429, 503, 504) and an OpenAI error body; flac, whose
bytes come only at the end, gets one for an error at any point. From then on every
chunk is encoded and sent at once, as raw bytes (`stream_format` "audio") or as OpenAI's
server-sent events (`speech.audio.delta` with the base64 bytes, then `speech.audio.done`).

A task watches the connection while the response runs: the moment the client hangs up, the
response is cancelled and so is its Triton call, and the decoder frees the request's state.
A client that stays but reads nothing for the stall timeout is cut off the same way.
An error after the first bytes ends an SSE stream with an `error` event, and a raw stream by
closing the connection before its end (so no client mistakes the part for the whole). A response
still running past the shutdown's drain (`shutdown.Drain`) ends the same way, with a 503.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from concurrent.futures import Executor

import anyio

from . import errors
from .audio_encoding import FORMATS, Encoder
from .metrics import Metrics
from .shutdown import Drain
from .speech_request import PARAMS, SpeechRequest
from .triton_client import SynthesisStream, TritonClient, TritonError

log = logging.getLogger("voxcpm_gateway")


def error_for(exc: TritonError, backend: TritonClient, params: dict = PARAMS) -> errors.APIError:
    if exc.timed_out:
        return errors.timed_out(backend.timeout_s)
    if exc.unreachable:
        return errors.unreachable(backend.url, exc.message)
    return errors.from_triton(exc.message, params)


async def send_error(send, err: errors.APIError):
    body = json.dumps(err.body(), separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def sse_event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SEND_SLICE = 64 << 10  # uvicorn's write buffer's high-water mark


class ClientStalled(Exception):
    """A send waited past the stall timeout: the client reads nothing."""


class SpeechResponse:
    def __init__(self, backend: TritonClient, req: SpeechRequest, arrays: dict, metrics: Metrics,
                 executor: Executor, request_id: str, t0: float, stall_timeout_s: float, drain: Drain):
        self.backend, self.req, self.arrays, self.metrics = backend, req, arrays, metrics
        self.executor, self.request_id, self.t0 = executor, request_id, t0
        self.stall_timeout_s, self.drain = stall_timeout_s, drain
        self.format = FORMATS[req.response_format]
        self.sse = req.stream_format == "sse"
        self.stream: SynthesisStream | None = None
        self.encoder: Encoder | None = None
        self._encoding = None  # the encoder's job in the executor, if one runs
        self.status = 500
        self.started = False  # the response's status and headers are sent
        self.outcome = "error"
        self.samples = 0
        self.sample_rate = 0

    async def __call__(self, scope, receive, asgi_send):
        disconnected = cancelled = stalled = shut_down = False

        async def send(message):
            # the server's send waits while the client's socket is full: a client that reads nothing
            # would hold its synthesis open (and its audio in Triton) until the request timeout. It
            # waits before it writes a message whole, so a body goes in slices: a client cut off
            # leaves at most one slice beyond the server's buffer with its connection.
            body = message.get("body", b"")
            if message["type"] == "http.response.body" and len(body) > SEND_SLICE:
                last = (len(body) - 1) // SEND_SLICE * SEND_SLICE
                for i in range(0, last, SEND_SLICE):
                    await send({"type": "http.response.body", "body": body[i:i + SEND_SLICE], "more_body": True})
                message = {**message, "body": body[last:]}
            try:
                with anyio.fail_after(self.stall_timeout_s):
                    await asgi_send(message)
            except TimeoutError:
                raise ClientStalled from None

        try:
            async with anyio.create_task_group() as tg:
                async def watch():
                    nonlocal disconnected
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    disconnected = True
                    tg.cancel_scope.cancel()

                async def drained():
                    nonlocal shut_down
                    await self.drain.over()
                    shut_down = True
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                tg.start_soon(drained)
                try:
                    await self._run(send)
                except ClientStalled:
                    stalled = True
                except OSError:  # a server whose send fails once the client is gone
                    disconnected = True
                finally:
                    tg.cancel_scope.cancel()
                    cancelled = self._close()
        except asyncio.CancelledError:
            # gRPC's call, cancelled while it waits for Triton's first answer, raises a CancelledError of
            # its own, which anyio does not take for its scope's cancel: a hang-up, or the drain's end,
            # all the same, unless the task was cancelled from outside too (anyio has taken back its own
            # requests by now; Python 3.10 cannot tell)
            task = asyncio.current_task()
            if not (disconnected or shut_down) or (hasattr(task, "cancelling") and task.cancelling()):
                raise
        if shut_down and not (disconnected or stalled) and self.outcome != "complete":
            log.warning("request %s: ended by the gateway's shutdown (--shutdown-timeout)", self.request_id)
            try:
                with anyio.fail_after(1):
                    await self._fail(send, errors.shutting_down())
            except (Exception, ClientStalled):  # noqa: BLE001 - best effort: the connection goes next
                pass
        if stalled:
            self.outcome = "client_stalled"
            log.warning("request %s: the client read nothing for %g s (--stall-timeout); the response was cut off%s",
                        self.request_id, self.stall_timeout_s,
                        " and its Triton request cancelled" if cancelled else " (its synthesis had ended)")
        elif disconnected and cancelled:
            self.outcome = "client_disconnected"
            log.info("request %s: the client hung up; its Triton request was cancelled", self.request_id)
        if disconnected and self.status == 500 and self.outcome == "client_disconnected":
            self.status = 499  # gone before an answer (nginx's "client closed request")
        m = self.metrics
        m.requests.labels("speech", self.req.response_format, str(self.status)).inc()
        m.ended.labels(self.outcome).inc()
        if self.samples and self.sample_rate:
            m.audio_seconds.labels(self.req.response_format).inc(self.samples / self.sample_rate)

    async def _run(self, send):
        self.stream = self.backend.synthesize(self.arrays, self.request_id)
        self.metrics.streams.inc()
        pieces = self._encoded()
        try:
            while True:
                try:
                    data = await pieces.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as e:  # noqa: BLE001 - Triton's error, or the gateway's own: the client must know
                    return await self._fail(send, e)
                await self._send(send, data)  # outside the try: a send that fails is the client gone
        finally:
            await pieces.aclose()
        if self.sse:
            await self._send(send, sse_event({"type": "speech.audio.done"}), raw=True)
        await self._start(send)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.outcome = "complete"

    async def _encoded(self):
        """The encoded audio, piece by piece (a piece may be empty), as Triton's chunks arrive."""
        chunk = await self.stream.next_chunk()
        if chunk is None:
            raise errors.APIError(500, "Triton's stream ended without audio", None, "triton_error")
        self.sample_rate = self.stream.sample_rate
        self.encoder = await self._encode(self.format.make, self.sample_rate)
        while chunk is not None:
            self.samples += chunk.size
            yield await self._encode(self.encoder.encode, chunk)
            chunk = await self.stream.next_chunk()
        yield await self._encode(self.encoder.finish)

    async def _fail(self, send, e: Exception):
        if isinstance(e, TritonError):
            err = error_for(e, self.backend)
        elif isinstance(e, errors.APIError):
            err = e
        else:
            log.exception("request %s failed", self.request_id)
            err = errors.APIError(500, f"internal error of the gateway: {e}", None, "gateway_error")
        if not self.started:  # nothing sent yet (flac sends only at the end): a proper status
            return await self._refuse(send, err)
        log.warning("request %s failed after its first audio: %s", self.request_id, err.message)
        if self.sse:
            await send({"type": "http.response.body", "body": sse_event({"type": "error", **err.body()}),
                        "more_body": False})
        # raw audio: no end of the chunked body; the server closes the connection

    async def _refuse(self, send, err: errors.APIError):
        if err.param == "input" and (self.req.instructions or "").strip():
            err.message += " (TEXT: the input after its instructions, sent as their \"(description)\" prefix)"
        self.status = err.status
        await send_error(send, err)

    def _headers(self) -> list:
        media = "text/event-stream" if self.sse else self.format.media_type
        headers = {"content-type": media, "x-request-id": self.request_id, "cache-control": "no-cache",
                   "x-accel-buffering": "no", "x-sample-rate": str(self.encoder.out_rate or self.sample_rate)}
        return [(k.encode(), v.encode()) for k, v in headers.items()]

    async def _start(self, send):
        if not self.started:
            self.started, self.status = True, 200
            await send({"type": "http.response.start", "status": 200, "headers": self._headers()})

    async def _send(self, send, data: bytes, raw: bool = False):
        """Send `data`, the response's start before the first bytes."""
        if not data:
            return
        await self._start(send)
        if not raw and self.sse:
            data = sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
        if self.t0 is not None:
            self.metrics.ttfb.labels(self.req.response_format, self.req.stream_format).observe(
                time.perf_counter() - self.t0)
            self.t0 = None
        await send({"type": "http.response.body", "body": data, "more_body": True})

    async def _encode(self, fn, *args):
        """fn(*args), in the executor for formats whose encoding takes real CPU time."""
        if not self.format.cpu_heavy:
            return fn(*args)
        self._encoding = self.executor.submit(fn, *args)
        try:
            return await asyncio.wrap_future(self._encoding)
        finally:
            if self._encoding.done():
                self._encoding = None

    def _close(self) -> bool:
        """Cancel the Triton call if it is still running (-> True) and free the encoder."""
        cancelled = False
        if self.stream is not None:
            cancelled = self.stream.cancel()
            self.metrics.streams.dec()
            self.stream = None
        encoder, self.encoder = self.encoder, None
        if encoder is not None:
            if self._encoding is not None and not self._encoding.done():
                # an encode still runs in a worker thread: close after it, never beside it
                self._encoding.add_done_callback(lambda _f: encoder.close())
            else:
                encoder.close()
        return cancelled
