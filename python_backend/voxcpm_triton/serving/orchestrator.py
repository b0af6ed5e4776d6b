"""The BLS pipeline behind `tts` and `tts_stream`:

    TEXT ─ [text_normalizer] ─ tokenizer ─┐
                   audio ─ vae_encoder ─┴─ decoder (stream of latent chunks)
                                             ─ vae_decoder (per-stream state) ─> AUDIO

([text_normalizer]: only with NORMALIZE. The decoder's `decode_audio`, the default, decodes each
chunk's AUDIO itself, and vae_decoder is skipped; with its `audio_channel`, the default too, the
chunks come over a Unix socket of this process (`audio_channel`), not as the call's responses.)

One `Orchestrator.synthesize` coroutine serves one request and hands audio chunks to
`emit` as they are made. `tts` collects them into one response; `tts_stream` sends
each as a response (both models: `tts_models`). Both run on Triton's `async def execute`: every BLS call is
awaited on the instance's event loop, so many requests are in flight per instance and
none waits on another (a request queued for a full decoder does not hold up the audio
of the streams already running). torch is never imported here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import time
import uuid
from typing import Callable

import numpy as np

from ..checks import CONTEXT_PATCHES, draw_seed
from ..model.config import VoxCPM2Config
from ..coordination import runtime
from . import contract
from .bls import audio_channel, caller
from .metrics import metric
from .parameters import resolve_checkpoint
from .internal_calls import InternalCalls
from .triton_io import BLSError, InputError, bls, downstream_error, get, pb
from .voices import Voice, VoiceStore

log = logging.getLogger("voxcpm_triton.orchestrator")

DECODER_READS_DOC = ("Decoder calls by how their responses were read: counted (as far as the decoder said it "
                     "sent) or waiting (a thread waiting in the response iterator)")
END_TIMEOUT_S = 30.0  # closing a VAE stream: long enough for a loaded vae_decoder


def _adapter(req: contract.SynthesisRequest, voice) -> str | None:
    """The request's LoRA adapter: its own LORA wins (empty: none), else its voice's default, else none."""
    if req.lora is not None:
        return req.lora or None
    return voice.lora if voice is not None else None


def _voice_adapter_error(error: BaseException, voice, lora: str) -> BaseException:
    """The decoder refusing the adapter a voice chose (removed since the voice was added), said in the
    voice's terms: the client sent no LORA. (No input name but VOICE in it: clients map the message
    to the field it names first.)"""
    message = str(error)
    if not isinstance(error, InputError) or not message.startswith("LORA: "):
        return error
    return InputError(f"VOICE {voice.name!r} has the default LoRA adapter {lora!r}, which cannot be used: "
                      f"{message[len('LORA: '):]}; load the adapter again (model loras), name another one "
                      "in the request, or add the voice again")


@dataclasses.dataclass
class _Prepared:
    """A request made ready for the decoder (`Orchestrator.prepare`)."""
    dec_in: dict  # the decoder's inputs
    context: np.ndarray | None  # the audio patches that prime vae_decoder (continuation)
    voice: Voice | None  # the stored voice it names
    lora: str | None  # the adapter it runs on (its own, or its voice's)
    target_tokens: int  # the target text's token count: the bad-case rule's measure
    started: float  # monotonic time its preparation began: where time to first audio counts from

    def reseeded(self, seed: int) -> "_Prepared":
        """The same request with another SEED (a retry), its time counted from now."""
        return dataclasses.replace(self, dec_in={**self.dec_in, "SEED": np.array([seed], np.int64)},
                                   started=time.monotonic())


FIRST_AUDIO_PHASES = ("prepare", "decoder", "vae")
FIRST_AUDIO_PHASES_DOC = ("Sum of the phases of time to first audio: prepare (text normalisation, tokenizer, "
                          "stored voice, reference encoding), decoder (request to first latents: admission, prefill, "
                          "first steps; with the decoder's decode_audio, its audio too), vae "
                          "(first latents to first audio)")


@dataclasses.dataclass
class _DecoderCall:
    """One decoder call as `Orchestrator.synthesize` reads it."""
    request_id: str
    corrid: int  # its vae_decoder sequence (decode_audio off)
    context: np.ndarray | None  # what primes that sequence
    opened: bool = False  # that sequence was started: it must be ended
    generated: int = 0  # patches received
    error: BaseException | None = None  # the first error it reported: raised once it is read to its end


class Orchestrator:
    def __init__(self, args, params: dict):
        # the BLS calls to the internal models, health watched
        self.calls = InternalCalls(params.get("max_normalize_waiting"))
        cfg = VoxCPM2Config.from_file(os.path.join(resolve_checkpoint(params["checkpoint"]), "config.json"))
        self.sample_rate = cfg.audio_vae_config.out_sample_rate
        self.patch_size, self.feat_dim, self.max_positions = cfg.patch_size, cfg.feat_dim, cfg.max_length
        self.voices = VoiceStore(params["voices_dir"])
        labels = {"model": args["model_name"]}
        self.m_ttfa_sum = metric("voxcpm_time_to_first_audio_seconds_sum",
                                 "Sum of times from request to first audio", labels, "COUNTER")
        self.m_ttfa_count = metric("voxcpm_time_to_first_audio_seconds_count",
                                   "Requests that produced audio", labels, "COUNTER")
        self.m_ttfa_last = metric("voxcpm_time_to_first_audio_seconds_last",
                                  "Time to first audio of the latest request", labels)
        # Where first audio's time goes: their sum over requests adds up to the one above.
        self.m_ttfa_phases = {ph: metric("voxcpm_time_to_first_audio_phase_seconds_sum", FIRST_AUDIO_PHASES_DOC,
                                         {**labels, "phase": ph}, "COUNTER") for ph in FIRST_AUDIO_PHASES}
        # How each decoder call's responses were read (bls.caller): "waiting" (a thread in Triton's
        # iterator, which can deadlock the process) should stay 0.
        self.m_decoder_reads = {waited: metric("voxcpm_decoder_calls_read_total", DECODER_READS_DOC,
                                               {**labels, "read": "waiting" if waited else "counted"}, "COUNTER")
                                for waited in (False, True)}

    def parse(self, request, inputs: tuple[str, ...]) -> contract.SynthesisRequest:
        contract.check_parameters(request.parameters(), inputs)
        return contract.parse(_inputs(request), max_positions=self.max_positions)

    async def _voice(self, req: contract.SynthesisRequest):
        """The stored voice the request names (None without VOICE), checked against its mode."""
        if req.voice is None:
            return None
        voice = await self.voices.load_async(req.voice)
        if req.voice_mode != "reference" and voice.prompt is None:
            raise InputError(f"voice {req.voice!r} has no transcript, so it cannot serve VOICE_MODE "
                             f"{req.voice_mode}; add it again with its transcript (the voices model's TEXT, the OpenAI "
                             "gateway's ref_text), or use VOICE_MODE reference")
        if list(voice.reference.shape[1:]) != [self.patch_size, self.feat_dim]:
            raise InputError(f"voice {req.voice!r} was encoded for another checkpoint (latent patches "
                             f"{list(voice.reference.shape[1:])}, this one makes "
                             f"{[self.patch_size, self.feat_dim]}); add it again")
        return voice

    async def _vae_decode(self, corrid: int, latents: np.ndarray, flags: int, context=None) -> np.ndarray:
        inputs = {"LATENTS": latents[None]}
        if context is not None:
            inputs["CONTEXT"] = context[None]
        return (await self.calls.infer("vae_decoder", inputs, ["AUDIO"], correlation_id=corrid, flags=flags))[0][0]

    # ------------------------------------------------------------------ pipeline
    async def prepare(self, req: contract.SynthesisRequest, playback: bool,
                      cancelled: Callable[[], bool]) -> _Prepared | None:
        """The decoder's inputs for `req`: its text normalised (NORMALIZE) and tokenized, its voice's or
        audio's latents (encoded by vae_encoder), its adapter. None when the client left meanwhile."""
        started = time.monotonic()
        voice = await self._voice(req)
        tok_in = {"TEXT": np.array([req.text.encode()], dtype=object)}
        if req.normalize:
            normalized = await self.calls.normalize(req.text, cancelled)
            if normalized is None:  # the client left while it waited
                return None
            tok_in = {"TEXT": np.array([normalized.encode()], dtype=object), "NORMALIZED": np.array([True])}
        prompt_text = voice.transcript if voice is not None and req.voice_mode != "reference" else req.prompt_text
        if prompt_text is not None:
            tok_in["PROMPT_TEXT"] = np.array([prompt_text.encode()], dtype=object)
        ids, n_target = await self.calls.infer("tokenizer", tok_in, ["TOKEN_IDS", "TARGET_TOKENS"])
        target_tokens = int(np.asarray(n_target).reshape(-1)[0])
        if req.normalize and target_tokens >= self.max_positions:  # else the decoder's message would not say why
            raise InputError(f"NORMALIZE wrote TEXT ({len(req.text.encode())} bytes) out as "
                             f"{len(normalized.encode())} bytes of words, {target_tokens} tokens: they leave no room "
                             f"in the model's {self.max_positions} positions; send a shorter TEXT")
        dec_in = {"TOKEN_IDS": ids, "TARGET_TOKENS": n_target,
                  "MIN_LENGTH": np.array([req.min_length], np.int32),
                  "CFG_VALUE": np.array([req.cfg_value], np.float32),
                  "INFERENCE_TIMESTEPS": np.array([req.inference_timesteps], np.int32),
                  "PLAYBACK": np.array([playback]),
                  "SEED": np.array([req.seed if req.seed is not None else draw_seed()], np.int64)}
        if req.max_length is not None:
            dec_in["MAX_LENGTH"] = np.array([req.max_length], np.int32)
        lora = _adapter(req, voice)
        if lora is not None:
            dec_in["LORA"] = np.array([lora.encode()], dtype=object)
        audio_latents = []
        # A stored voice's latents are what vae_encoder made of its audio: the same as sending it inline.
        if voice is not None and req.voice_mode in ("reference", "both"):
            dec_in["REF_LATENTS"] = voice.reference
            audio_latents.append(dec_in["REF_LATENTS"])
        elif req.reference_audio is not None:
            dec_in["REF_LATENTS"] = await self.calls.encode(req.reference_audio, req.reference_sample_rate, False,
                                                            "REFERENCE_AUDIO")
            audio_latents.append(dec_in["REF_LATENTS"])
        context = None
        if req.prompt_audio is not None or (voice is not None and req.voice_mode != "reference"):
            dec_in["PROMPT_LATENTS"] = (await self.calls.encode(req.prompt_audio, req.prompt_sample_rate, True,
                                                                "PROMPT_AUDIO")
                                        if req.prompt_audio is not None else voice.prompt)
            audio_latents.append(dec_in["PROMPT_LATENTS"])
            # Continuation: prime the VAE with the last audio patches, as the reference does.
            context = np.concatenate(audio_latents)[-CONTEXT_PATCHES:]
        return _Prepared(dec_in, context, voice, lora, target_tokens, started)

    async def synthesize(self, req: contract.SynthesisRequest, emit: Callable[[np.ndarray], None],
                         cancelled: Callable[[], bool], playback: bool = True,
                         prepared: _Prepared | None = None) -> tuple[int, int] | None:
        """Run one request; `emit(audio)` per chunk. Returns early (no error, None) when `cancelled()`;
        else (patches generated, target text tokens), what `tts`'s bad-case rule looks at.
        playback: a client plays the chunks as they come (the decoder may then send them early).
        prepared: `prepare`'s result for `req`, made once for all of a request's tries (else made here).
        The decoder's audio comes in one of three ways: frames of the audio channel (the default),
        responses carrying AUDIO (decode_audio without the channel), or LATENTS that go through
        vae_decoder here (decode_audio off)."""
        self.calls.health.check()
        if prepared is None:
            prepared = await self.prepare(req, playback, cancelled)
        if prepared is None or cancelled():
            return
        t0 = prepared.started
        dec_in, context, voice, lora = prepared.dec_in, prepared.context, prepared.voice, prepared.lora

        call = _DecoderCall(uuid.uuid4().hex, secrets.randbits(63) or 1, context)
        t_decoder = time.monotonic()
        responses = self.calls.call_decoupled("decoder", dec_in, ["LATENTS", "AUDIO"], request_id=call.request_id)
        # The decoder's first response (its admission; without the audio channel, its first chunk too),
        # awaited without blocking the loop.
        if await self.calls.guard(responses.started.wait(), cancelled) is None:  # the client left while it was queued
            await self._stop_decoder(call.request_id, responses)
            responses.abandon()
            return
        stopping = emitted = ended = False
        try:
            while True:
                # Until its first audio the client may leave while the decoder still queues the request
                # (with the audio channel, the call's first response, empty, comes at its admission).
                try:
                    resp = await (asyncio.wait_for(self.calls.guard(responses.queue.get()), END_TIMEOUT_S) if ended
                                  else self.calls.guard(responses.queue.get(), None if emitted or stopping else cancelled))
                except asyncio.TimeoutError:  # stopping, its audio all out: the final response did not come
                    log.warning("decoder request %s: no final response %.0f s after its end", call.request_id,
                                END_TIMEOUT_S)
                    break
                if resp is None:  # the client left
                    await self._stop_decoder(call.request_id, responses)
                    return
                if resp is responses.END:
                    if responses.channeled and not ended and call.error is None:
                        call.error = BLSError("the decoder's call ended without the end of its audio")
                    break
                if isinstance(resp, BaseException):
                    raise resp
                if isinstance(resp, audio_channel.Ended):  # the audio channel's: nothing but the final response follows
                    ended = True
                    if resp.error is not None:
                        call.error = call.error or downstream_error(pb().TritonError(resp.error))
                    if runtime.stop_deadline() is None:
                        break
                    continue  # stopping: this process is unloaded once its requests end, the call's must first
                got = await self._audio(resp, call, skip=stopping)
                if got is None:
                    continue
                audio, t_latents, t_audio = got
                if not np.isfinite(audio).all():  # never sent: the model overflowed (an adapter's weights, say)
                    raise RuntimeError("the model's audio is not finite (NaN or Inf)"
                                       + (f": LoRA adapter {lora!r} makes it overflow" if lora else ""))
                emit(audio)
                if not emitted:  # after the audio is on its way: the metrics are IPC round trips
                    self._record_ttfa(t0, t_decoder, t_latents, t_audio)
                emitted = True
                if cancelled():
                    stopping = True
                    await self._cancel_decoder(call.request_id)
        except BaseException as e:
            # Our side broke mid-stream (a VAE call failed, a model died, shutdown): stop the decoder too.
            if responses.returned and not responses.done:  # else it has nothing to stop
                await self._stop_decoder(call.request_id, responses)
            call.error = e
        finally:
            responses.abandon()  # what comes after we stopped reading (a channel call's final response) goes
            self.m_decoder_reads[responses.waited].increment(1.0)
            if call.opened:
                await self._close_vae(call.corrid)
        if call.error is not None and not stopping:
            raise call.error if lora == req.lora else _voice_adapter_error(call.error, voice, lora)
        return call.generated, prepared.target_tokens

    async def _audio(self, resp, call: _DecoderCall, skip: bool) -> tuple[np.ndarray, float, float] | None:
        """The audio a decoder message carries, with when its latents and its audio were ready; None where
        it carries none to send: an error (noted in `call`), an empty response, or `skip` (the client
        stopped listening). An audio channel's chunk or a response's AUDIO (decode_audio) is the audio;
        a response's LATENTS go through vae_decoder first, in `call`'s sequence."""
        if isinstance(resp, audio_channel.Chunk):
            if skip:
                return None
            call.generated += resp.patches
            now = time.monotonic()
            return resp.audio, now, now
        if resp.has_error():
            call.error = call.error or downstream_error(resp.error())
            return None  # read on to the final response
        if skip or not resp.output_tensors():
            return None
        p = pb()
        lat = p.get_output_tensor_by_name(resp, "LATENTS").as_numpy()
        call.generated += lat.shape[0]
        t_latents = time.monotonic()
        decoded = p.get_output_tensor_by_name(resp, "AUDIO")
        if decoded is not None:  # the decoder's own (decode_audio)
            return decoded.as_numpy(), t_latents, t_latents
        flags = 0 if call.opened else p.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        # Set before the call: whatever its outcome, a START sent is followed by an END.
        first, call.opened = not call.opened, True
        audio = await self._vae_decode(call.corrid, lat, flags, call.context if first else None)
        return audio, t_latents, time.monotonic()

    async def _close_vae(self, corrid: int):
        """END the stream's VAE sequence: frees its state in vae_decoder and Triton's sequence slot."""
        empty = np.zeros((1, 0, self.patch_size, self.feat_dim), np.float32)
        try:
            req = bls("vae_decoder", {"LATENTS": empty}, ["AUDIO"], correlation_id=corrid,
                      flags=pb().TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
            await asyncio.wait_for(self.calls.guard(req.async_exec()), END_TIMEOUT_S)
        except BaseException:  # noqa: BLE001 - the stream is over either way; its state times out
            log.exception("closing VAE stream %s failed", corrid)

    def _record_ttfa(self, t0: float, t_decoder: float, t_latents: float, t_audio: float):
        """First audio at t_audio of a request received at t0, sent to the decoder at t_decoder, its
        first latents back at t_latents."""
        self.m_ttfa_sum.increment(t_audio - t0)
        self.m_ttfa_count.increment(1.0)
        self.m_ttfa_last.set(t_audio - t0)
        for phase, (a, b) in zip(FIRST_AUDIO_PHASES, ((t0, t_decoder), (t_decoder, t_latents), (t_latents, t_audio))):
            self.m_ttfa_phases[phase].increment(b - a)

    async def _stop_decoder(self, request_id: str, responses: caller.ResponseStream):
        """Stop a decoder call whose responses nobody wants. While the server stops, the decoder
        takes no new request (no cancel) and ends its calls itself by the deadline; the call is
        read to its end then, so that this process, which the server unloads once its requests
        have ended, is still there to take its responses."""
        if runtime.stop_deadline() is None:
            await self._cancel_decoder(request_id)
            return
        try:
            while await self.calls.guard(responses.queue.get()) is not responses.END:
                pass
        except BaseException:  # noqa: BLE001 - a model died: nothing more will come
            log.exception("reading decoder request %s to its end failed", request_id)

    async def _cancel_decoder(self, request_id: str):
        if runtime.stop_deadline() is not None:
            # Stopping: Triton takes no new request, the decoder ends its own at the deadline.
            return
        try:
            # its only response is the final flag
            stream = self.calls.call_decoupled("decoder", {"CANCEL_ID": np.array([request_id.encode()], dtype=object)},
                                               ["LATENTS"])
            try:
                while (resp := await asyncio.wait_for(self.calls.guard(stream.queue.get()), END_TIMEOUT_S)) is not stream.END:
                    if isinstance(resp, BaseException):
                        raise resp
            finally:
                stream.abandon()  # given up on (timeout): what it still holds or gets goes; after END a no-op
        except BaseException:  # noqa: BLE001 - best effort: the decoder drops the request when it ends
            log.exception("cancelling decoder request %s failed", request_id)


def _inputs(request) -> dict:
    """The request's inputs as owned numpy arrays (request memory is released after execute)."""
    return {name: np.array(a) for name in contract.INPUT_NAMES if (a := get(request, name)) is not None}
