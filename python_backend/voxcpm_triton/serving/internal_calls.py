"""BLS calls to the internal models (text_normalizer, vae_encoder, the decoder's LoRA actions),
each awaited while the model processes' health is watched: a dead model would otherwise leave its
caller waiting forever. The `tts`/`tts_stream` pipeline (`orchestrator`) and the `voices` and
`loras` models make them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Callable

import numpy as np

from ..coordination import liveness
from .bls import caller, protocol
from .triton_io import BLSError, Busy, InputError, Unhealthy, bls, downstream_error, outputs

HEALTH_CHECK_S = 1.0  # how often a waiting call looks at the model processes' beacons
TRITON_QUEUE_FULL = "Exceeds maximum queue size"  # Triton's error past a model's max_queue_size
NORMALIZE_CALLS = 2  # text_normalizer calls in flight per process (InternalCalls.normalize)


class _Health:
    """The beacons of the internal models, read at most once a second."""

    def __init__(self):
        self.reason, self.checked = None, 0.0

    def check(self):
        now = time.monotonic()
        if now - self.checked >= HEALTH_CHECK_S:
            self.reason, self.checked = liveness.unhealthy(), now
        if self.reason:
            raise Unhealthy(self.reason)


class InternalCalls:
    """BLS calls to the internal models, each awaited while the model processes' health is
    watched (the orchestrator's pipeline and the `voices` and `loras` models make them)."""

    def __init__(self, max_normalize_waiting: int | None = None):
        self.health = _Health()
        # A BLS call holds a thread of the event loop's default executor until it is answered: calls
        # queued for text_normalizer take at most these, leaving the rest to every other call.
        self.normalize_slots = asyncio.Semaphore(NORMALIZE_CALLS)
        # NORMALIZE requests in flight or waiting for a slot, and how many may wait (tts_stream's
        # max_normalize_waiting; None: no bound, as in tts, whose instances hold one request each)
        self.normalizing, self.max_normalize_waiting = 0, max_normalize_waiting
        # `tts` only (instance_sync.SharedSlots): a request there holds its instance while it waits, so
        # only some of them may wait for text_normalizer, the others being left to plain requests.
        self.normalize_gate = None

    async def guard(self, awaitable, cancelled: Callable[[], bool] | None = None):
        """Await `awaitable`, looking at the model processes' health (and the client) every
        second: a dead model would otherwise leave the request waiting forever."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=HEALTH_CHECK_S)
                if done:
                    return task.result()
                self.health.check()
                if cancelled is not None and cancelled():
                    return None
        finally:
            task.cancel()  # left waiting (cancelled, unhealthy), a queue's get would take its next item

    @staticmethod
    def call_decoupled(model: str, inputs: dict, names: list[str], **kw) -> caller.ResponseStream:
        """A decoupled BLS call to an internal model, its responses read as its callee counts them."""
        names = [*names, protocol.ERROR_OUTPUT]  # how its errors after the first response come
        return caller.call(lambda params: bls(model, inputs, names, params, **kw).async_exec(decoupled=True))

    async def infer(self, model: str, inputs: dict, names: list[str], **kw) -> list:
        resp = await self.guard(bls(model, inputs, names, **kw).async_exec())
        return outputs(resp, names)

    async def infer_decoupled(self, model: str, inputs: dict, names: list[str]) -> list:
        """A decoupled model's one answer (the decoder's LoRA actions): its data response's outputs."""
        stream = self.call_decoupled(model, inputs, names)
        result = None
        while (resp := await self.guard(stream.queue.get())) is not stream.END:
            if isinstance(resp, BaseException):
                raise resp
            if resp.has_error():
                raise downstream_error(resp.error())  # sent with the final flag: nothing follows
            if resp.output_tensors():
                result = outputs(resp, names)
        if result is None:
            raise RuntimeError(f"model {model!r} ended without an answer")
        return result

    async def lora_action(self, action: str, name: str | None = None) -> list[str]:
        """The decoder's LoRA action (add, remove or list; `name` the adapter) -> the adapters
        loaded after it, sorted."""
        dec_in = {"LORA_ACTION": np.array([action.encode()], dtype=object)}
        if name is not None:
            dec_in["LORA"] = np.array([name.encode()], dtype=object)
        (names,) = await self.infer_decoupled("decoder", dec_in, ["LORAS"])
        return sorted(bytes(n).decode() for n in names.reshape(-1))

    async def normalize(self, text: str, cancelled: Callable[[], bool]) -> str | None:
        """`text` written out as words by text_normalizer (NORMALIZE); None when the client left while
        it waited. Busy when that model's queue is full."""
        with self.normalize_gate.hold() if self.normalize_gate else contextlib.nullcontext(True) as gated:
            if not gated:
                raise Busy("server busy: too many NORMALIZE requests wait for text normalisation (half of tts's "
                           "instances may); retry later, use tts_stream, or send this TEXT with NORMALIZE off")
            return await self._normalize(text, cancelled)

    async def _normalize(self, text: str, cancelled: Callable[[], bool]) -> str | None:
        # Counted here, not from the semaphore: requests arriving in one turn of the event loop all
        # find it free before any of them has taken a slot.
        bound = self.max_normalize_waiting
        if bound is not None and self.normalizing >= NORMALIZE_CALLS + bound:
            raise Busy("server busy: too many NORMALIZE requests wait for text normalisation (parameter "
                       "max_normalize_waiting); retry later, or send this TEXT with NORMALIZE off")
        self.normalizing += 1
        try:
            return await self._normalize_in_turn(text, cancelled)
        finally:
            self.normalizing -= 1

    async def _normalize_in_turn(self, text: str, cancelled: Callable[[], bool]) -> str | None:
        if await self.guard(self.normalize_slots.acquire(), cancelled) is None:
            return None
        try:
            # Not given up when the client leaves: its executor thread stays held until the answer comes,
            # and so does its slot.
            resp = await self.guard(bls("text_normalizer", {"TEXT": np.array([[text.encode()]], dtype=object)},
                                        ["NORMALIZED_TEXT"]).async_exec())
            (out,) = outputs(resp, ["NORMALIZED_TEXT"])
        except BLSError as e:
            if TRITON_QUEUE_FULL not in str(e):
                raise
            raise Busy("server busy: too many NORMALIZE requests wait for text normalisation (text_normalizer's "
                       "max_queue_size); retry later, or send this TEXT with NORMALIZE off") from None
        finally:
            self.normalize_slots.release()
        return None if cancelled() else bytes(out.reshape(-1)[0]).decode()

    async def encode(self, audio, rate, pad_left: bool, name: str) -> np.ndarray:
        """Audio -> latent patches through vae_encoder (PAD_LEFT: the prompt role, else the reference's);
        `name`: the client's input it came in, for the error when its encoding overflows."""
        latents = (await self.infer("vae_encoder", {"AUDIO": audio[None], "SAMPLE_RATE": np.array([[rate]], np.int32),
                                                    "PAD_LEFT": np.array([[pad_left]], bool)}, ["LATENTS"]))[0][0]
        if not np.isfinite(latents).all():
            raise InputError(f"{name}: its encoding overflows (not finite): its samples are far outside [-1, 1]; "
                             "scale it to [-1, 1]")
        return latents
