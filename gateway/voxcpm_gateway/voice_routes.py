"""The voice routes of the OpenAI speech API: GET, POST /v1/audio/voices, DELETE /v1/audio/voices/{name},
each a call to Triton's `voices` model. An upload is decoded here (upload_decoder) and stored there."""

from __future__ import annotations

import asyncio
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from fastapi import APIRouter, Request

from . import errors, voice_form
from .config import Settings
from .metrics import Metrics
from .shutdown import Drain
from .speech_request import DEFAULT_VOICE
from .speech_stream import error_for
from .triton_client import TritonClient, TritonError
from .upload_decoder import UploadDecoder

# Triton input of `voices` -> form field of POST /v1/audio/voices, for naming it in errors.
VOICE_PARAMS = {"NAME": "name", "AUDIO": "audio_sample", "SAMPLE_RATE": "audio_sample", "TEXT": "ref_text",
                "LORA": "lora"}


def voice_router(settings: Settings, backend: TritonClient, metrics: Metrics, drain: Drain,
                 upload_executor: ThreadPoolExecutor, uploads: UploadDecoder) -> APIRouter:
    router = APIRouter()

    async def call_voices(arrays: dict) -> list[str]:
        try:
            return await drain.run(backend.voices(arrays, "oai-" + secrets.token_hex(8)))
        except TritonError as e:
            if e.timed_out:
                raise errors.timed_out(backend.voice_timeout_s, "--voice-timeout", "call",
                                       " (an add may still be stored: list the voices to see)") from None
            raise error_for(e, backend, VOICE_PARAMS) from None

    @router.get("/v1/audio/voices")
    async def list_voices():
        names = await call_voices({"ACTION": _bytes("list")})
        metrics.requests.labels("voices", "", "200").inc()
        # (a voice stored as "default" through Triton cannot be used here: the name means zero-shot)
        names = [n for n in names if n != DEFAULT_VOICE]
        return {"object": "list", "data": [voice_object(n) for n in names], "voices": [DEFAULT_VOICE, *names]}

    uploads_open = 0  # voice uploads arriving, decoding, or being stored by Triton

    @router.post("/v1/audio/voices")
    async def add_voice(request: Request):
        nonlocal uploads_open
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != "multipart/form-data":
            raise errors.bad_request("POST /v1/audio/voices takes a multipart/form-data body (name, audio_sample, "
                                     "ref_text, lora, consent), not "
                                     f"{(request.headers.get('content-type') or 'a body without a Content-Type')[:100]}",
                                     None, "invalid_content_type")
        # An upload holds its slot from its first byte until Triton has stored it, or --voice-timeout has
        # passed: its body is spooled to a temporary file as it arrives, its decoded sample (up to 92 MB)
        # waits in this process and in Triton's until the voices model is done, so the slots bound all of
        # it, not its decoding only (but for what a voices model past the timeout still holds).
        if uploads_open >= settings.max_pending_uploads:
            raise errors.APIError(429, f"server busy: {uploads_open} voice uploads are in progress, the limit "
                                  "(--max-pending-uploads); retry later", None, "server_busy",
                                  {"Retry-After": errors.RETRY_AFTER_S})
        uploads_open += 1
        metrics.uploads.set(uploads_open)
        try:
            form = await voice_form.read(request)
            try:
                name, upload, ref_text, lora = voice_form.fields(form)
                data = await upload.read()
                audio, rate = await drain.run(asyncio.get_running_loop().run_in_executor(
                    upload_executor, uploads.decode, data, settings.max_voice_seconds))
            finally:
                await form.close()
            del data
            arrays = {"ACTION": _bytes("add"), "NAME": _bytes(name), "AUDIO": audio.astype(np.float32, copy=False),
                      "SAMPLE_RATE": np.array([rate], np.int32)}
            del audio
            if ref_text:
                arrays["TEXT"] = _bytes(ref_text)
            if lora:
                arrays["LORA"] = _bytes(lora)
            await call_voices(arrays)
        finally:
            uploads_open -= 1
            metrics.uploads.set(uploads_open)
        metrics.requests.labels("voices", "", "200").inc()
        return voice_object(name, int(time.time()), lora)

    @router.delete("/v1/audio/voices/{name}")
    async def delete_voice(name: str):
        if name == DEFAULT_VOICE:  # zero-shot here: a stored voice of that name is not the gateway's
            raise errors.bad_request(f"the name {DEFAULT_VOICE!r} is reserved for zero-shot synthesis", "name")
        await call_voices({"ACTION": _bytes("remove"), "NAME": _bytes(name)})
        metrics.requests.labels("voices", "", "200").inc()
        return {"id": name, "object": "audio.voice.deleted", "deleted": True}

    return router


def voice_object(name: str, created: int | None = None, lora: str | None = None) -> dict:
    """OpenAI's `audio.voice` object."""
    obj = {"id": name, "object": "audio.voice", "name": name, "type": "audio_sample"}
    if created is not None:
        obj["created_at"] = created
    if lora:
        obj["lora"] = lora  # VoxCPM2 extension: the voice's default LoRA adapter
    return obj


def _bytes(text: str) -> np.ndarray:
    return np.array([text.encode("utf-8")], dtype=np.object_)
