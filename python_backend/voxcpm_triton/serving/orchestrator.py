"""The BLS pipeline behind `tts` and `tts_stream`:

    TEXT ─ tokenizer ─┐
    audio ─ vae_encoder ─┴─ decoder (stream of latent chunks) ─ vae_decoder (per-stream state) ─> AUDIO

One `Orchestrator.synthesize` call serves one request and hands audio chunks to
`emit` as they are made. `tts` collects them into one response; `tts_stream`
sends each as a response. Calls are blocking BLS, so each request runs on its
own thread (`tts_stream`) or model instance (`tts`); torch is never imported here.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from ..inputs import CONTEXT_PATCHES
from . import contract
from .metrics import metric
from .settings import model_parameters, read_config, resolve_checkpoint
from .triton_io import IPC_LOCK, BLSError, InputError, bls, error_response, get, locked, outputs, pb, tensor

log = logging.getLogger("voxcpm_triton.orchestrator")


class Orchestrator:
    def __init__(self, args):
        cfg = read_config(resolve_checkpoint(model_parameters(args)))
        self.sample_rate = int(cfg.get("audio_vae_config", {}).get("out_sample_rate", 48000))
        self.patch_size, self.feat_dim = int(cfg.get("patch_size", 4)), int(cfg.get("feat_dim", 64))
        self.max_positions = int(cfg.get("max_length", 8192))
        labels = {"model": args["model_name"]}
        self.m_ttfa_sum = metric("voxcpm_time_to_first_audio_seconds_sum",
                                 "Sum of times from request to first audio", labels, "COUNTER")
        self.m_ttfa_count = metric("voxcpm_time_to_first_audio_seconds_count",
                                   "Requests that produced audio", labels, "COUNTER")
        self.m_ttfa_last = metric("voxcpm_time_to_first_audio_seconds_last",
                                  "Time to first audio of the latest request", labels)

    # ------------------------------------------------------------------ pipeline
    def _encode(self, audio, rate, pad_left: bool) -> np.ndarray:
        req = bls("vae_encoder", {"AUDIO": audio[None], "SAMPLE_RATE": np.array([[rate]], np.int32),
                                  "PAD_LEFT": np.array([[pad_left]], bool)}, ["LATENTS"])
        resp = locked(req.exec)
        return outputs(resp, ["LATENTS"])[0][0]

    def _vae_decode(self, corrid: int, latents: np.ndarray, flags: int, context=None) -> np.ndarray:
        inputs = {"LATENTS": latents[None]}
        if context is not None:
            inputs["CONTEXT"] = context[None]
        resp = locked(bls("vae_decoder", inputs, ["AUDIO"], correlation_id=corrid, flags=flags).exec)
        return outputs(resp, ["AUDIO"])[0][0]

    def synthesize(self, req: contract.SynthesisRequest, emit: Callable[[np.ndarray], None],
                   cancelled: Callable[[], bool]) -> None:
        p = pb()
        t0 = time.monotonic()
        if req.max_length is not None and req.max_length >= self.max_positions:
            raise InputError(f"MAX_LENGTH {req.max_length} exceeds the model's context of {self.max_positions}")
        tok_in = {"TEXT": np.array([req.text.encode()], dtype=object)}
        if req.prompt_text is not None:
            tok_in["PROMPT_TEXT"] = np.array([req.prompt_text.encode()], dtype=object)
        ids, n_target = outputs(locked(bls("tokenizer", tok_in, ["TOKEN_IDS", "TARGET_TOKENS"]).exec),
                                ["TOKEN_IDS", "TARGET_TOKENS"])
        dec_in = {"TOKEN_IDS": ids, "TARGET_TOKENS": n_target,
                  "MIN_LENGTH": np.array([req.min_length], np.int32),
                  "CFG_VALUE": np.array([req.cfg_value], np.float32),
                  "INFERENCE_TIMESTEPS": np.array([req.inference_timesteps], np.int32),
                  "SEED": np.array([req.seed if req.seed is not None else secrets.randbits(63)], np.int64)}
        if req.max_length is not None:
            dec_in["MAX_LENGTH"] = np.array([req.max_length], np.int32)
        audio_latents = []
        if req.reference_audio is not None:
            dec_in["REF_LATENTS"] = self._encode(req.reference_audio, req.reference_sample_rate, False)
            audio_latents.append(dec_in["REF_LATENTS"])
        context = None
        if req.prompt_audio is not None:
            dec_in["PROMPT_LATENTS"] = self._encode(req.prompt_audio, req.prompt_sample_rate, True)
            audio_latents.append(dec_in["PROMPT_LATENTS"])
            # Continuation: prime the VAE with the last audio patches, as the reference does.
            context = np.concatenate(audio_latents)[-CONTEXT_PATCHES:]

        request_id = uuid.uuid4().hex
        corrid = secrets.randbits(63) or 1
        stream = locked(bls("decoder", dec_in, ["LATENTS"], request_id=request_id).exec, decoupled=True)
        started = stopping = False
        error = None
        try:
            for resp in stream:
                if resp.has_error():
                    error = error or BLSError(resp.error().message())
                    continue  # drain to the final response
                if stopping or not resp.output_tensors():
                    continue
                lat = p.get_output_tensor_by_name(resp, "LATENTS").as_numpy()
                flags = 0 if started else p.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
                audio = self._vae_decode(corrid, lat, flags, context if not started else None)
                if not started:
                    self._record_ttfa(time.monotonic() - t0)
                started = True
                emit(audio)
                if locked(cancelled):
                    stopping = True
                    self._cancel_decoder(request_id)
        except Exception as e:
            # Our side broke mid-stream (e.g. the VAE call failed): stop the decoder too.
            self._cancel_decoder(request_id)
            error = e
        finally:
            if started:  # release the VAE stream state
                try:
                    empty = np.zeros((0, self.patch_size, self.feat_dim), np.float32)
                    self._vae_decode(corrid, empty, p.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
                except Exception:
                    log.exception("closing VAE stream %s failed", corrid)
        if error is not None and not stopping:
            raise error

    def _record_ttfa(self, seconds: float):
        with IPC_LOCK:  # metric updates are stub calls too
            self.m_ttfa_sum.increment(seconds)
            self.m_ttfa_count.increment(1.0)
            self.m_ttfa_last.set(seconds)

    def _cancel_decoder(self, request_id: str):
        try:
            req = bls("decoder", {"CANCEL_ID": np.array([request_id.encode()], dtype=object)}, ["LATENTS"])
            for _ in locked(req.exec, decoupled=True):  # drain: its only response is the final flag
                pass
        except Exception:
            log.exception("cancelling decoder request %s failed", request_id)


def _inputs(request) -> dict:
    """The request's inputs as owned numpy arrays (request memory is released after execute)."""
    return {name: np.array(a) for name in contract.INPUT_NAMES if (a := get(request, name)) is not None}


class TTSModel:
    """`tts`: one response with the whole utterance. Concurrency comes from several instances."""

    def initialize(self, args):
        self.orch = Orchestrator(args)

    def execute(self, requests):
        p = pb()
        responses = []
        for request in requests:
            try:
                req = contract.parse(_inputs(request))
                chunks: list = []
                self.orch.synthesize(req, chunks.append, request.is_cancelled)
                audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
                responses.append(p.InferenceResponse(output_tensors=[
                    tensor("AUDIO", audio.astype(np.float32)),
                    tensor("SAMPLE_RATE", np.array([self.orch.sample_rate], np.int32))]))
            except Exception as e:
                responses.append(error_response(e))
        return responses


class TTSStreamModel:
    """`tts_stream` (decoupled): audio chunks as they are made; each request runs on a worker thread.

    Calls into the stub are serialised per instance (triton_io.IPC_LOCK), so several instances
    let the short BLS calls of different streams overlap."""

    def initialize(self, args):
        self.orch = Orchestrator(args)
        params = model_parameters(args)
        self.pool = ThreadPoolExecutor(max_workers=int(params.get("max_concurrent_streams") or 256),
                                       thread_name_prefix="tts-stream")

    def execute(self, requests):
        p = pb()
        for request in requests:
            sender = request.get_response_sender()
            try:
                req = contract.parse(_inputs(request))
            except Exception as e:
                locked(sender.send, error_response(e), flags=p.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            self.pool.submit(self._run, req, sender)
        return None

    def _run(self, req, sender):
        p = pb()
        rate = np.array([self.orch.sample_rate], np.int32)

        def emit(audio):
            with IPC_LOCK:  # building pb_utils tensors is a stub call as well
                sender.send(p.InferenceResponse(output_tensors=[tensor("AUDIO", audio.astype(np.float32)),
                                                                tensor("SAMPLE_RATE", rate)]))

        try:
            self.orch.synthesize(req, emit, sender.is_cancelled)
            locked(sender.send, flags=p.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:
            try:
                locked(sender.send, error_response(e), flags=p.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception:
                log.exception("could not deliver the error to the client")

    def finalize(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
