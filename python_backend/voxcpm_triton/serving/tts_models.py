"""The Triton models `tts` (one response with the whole utterance, the reference's bad-case
retries) and `tts_stream` (decoupled: audio chunks as they are made), each a thin layer over the
BLS pipeline (`orchestrator.Orchestrator`) that owns its requests' lifecycle: parsing, retries,
streaming, cancellation and the server's stop."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import numpy as np

from .. import timeline
from ..checks import RETRY_MAX_TIMES, can_retry, draw_seed, is_badcase, retry_seed
from ..coordination import liveness, runtime
from . import contract, gc_pauses
from .bls import caller
from .instance_sync import SharedSlots
from .metrics import metric, release_all as release_metrics
from .orchestrator import Orchestrator
from .parameters import read
from .triton_io import SHUTTING_DOWN, Busy, InputError, error_response, instance_count, pb, tensor

log = logging.getLogger("voxcpm_triton.tts_models")

MIN_EXECUTE_S = 0.1  # tts_stream's execute lasts at least this: time for the stub to register it (TTSStreamModel)


async def _outlast(started: float):
    """Sleep until MIN_EXECUTE_S after `started` (a cancelled sleep ends it: the loop is stopping)."""
    try:
        await asyncio.sleep(max(0.0, MIN_EXECUTE_S - (time.monotonic() - started)))
    except asyncio.CancelledError:
        pass


def _failure(e: Exception):
    """The error response a request fails with: while the server stops, one that says so (the
    internal models take no new request then, and say it in their own words). A client's
    mistake stays one: retrying would not help."""
    if runtime.stop_deadline() is not None and not isinstance(e, InputError) and \
            not (isinstance(e, Busy) and str(e) == SHUTTING_DOWN):
        e = Busy(f"{SHUTTING_DOWN}: {e}")
    return error_response(e)


STREAM_INPUT_NAMES = tuple(n for n in contract.INPUT_NAMES if n != "RETRY_BADCASE")  # audio sent stays sent


def _orchestrator(args: dict, params: dict) -> Orchestrator:
    """The model process's start beside Triton (runtime.model_process) and its pipeline, after which
    start-up's objects are frozen out of the garbage collector's work (by the instance's name from
    `args`: placement's helper would import torch into this process)."""
    runtime.model_process()
    orch = Orchestrator(args, params)
    gc_pauses.freeze(args.get("model_instance_name") or args["model_name"])
    return orch


class TTSModel:
    """`tts`: one response with the whole utterance. Not decoupled, so Triton runs each execute to
    completion on its instance: concurrency comes from the instance count, and a client that
    cancels (gRPC) stops the work at the next chunk."""

    def initialize(self, args):
        self.orch = _orchestrator(args, read(args, "tts"))
        # Half of its instances may wait for text_normalizer (InternalCalls.normalize_gate).
        self.orch.calls.normalize_gate = SharedSlots(f"normalize_waits_{args['model_name']}",
                                                     max(1, instance_count(args) // 2))
        labels = {"model": args["model_name"]}
        self.m_badcases = metric("voxcpm_badcases_total", "Whole-utterance tries judged bad cases "
                                 "(>= 6 patches per target token)", labels, "COUNTER")
        self.m_retries = metric("voxcpm_retries_total", "Whole utterances synthesized again after a bad case",
                                labels, "COUNTER")
        self.beacon = liveness.Beacon("tts")

    @liveness.counted
    async def execute(self, requests):
        return [await self._one(r) for r in requests]

    def finalize(self):
        self.beacon.stop()
        try:
            caller.close()
        finally:
            release_metrics()

    async def _one(self, request):
        p = pb()
        try:
            if runtime.stop_deadline() is not None:
                raise Busy(SHUTTING_DOWN)
            req = self.orch.parse(request, contract.INPUT_NAMES)
            chunks = await self._synthesize(req, request.is_cancelled)
            if request.is_cancelled():
                return p.InferenceResponse(error=p.TritonError("request cancelled by its client",
                                                               p.TritonError.CANCELLED))
            audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
            return p.InferenceResponse(output_tensors=[
                tensor("AUDIO", audio.astype(np.float32)),
                tensor("SAMPLE_RATE", np.array([self.orch.sample_rate], np.int32))])
        except Exception as e:
            return _failure(e)

    async def _synthesize(self, req: contract.SynthesisRequest, cancelled) -> list:
        """The reference's retry_badcase: an utterance of >= 6 patches per target token (the stop
        head did not fire in time) is made again, RETRY_MAX_TIMES tries in all, the last kept. Try
        a runs with seed SEED + a (`checks.retry_seed`), so results stay reproducible; without a
        SEED each try draws its own."""
        tries = RETRY_MAX_TIMES if req.retry_badcase else 1
        # Once for every try: the same words, voice (removed meanwhile or not), adapter name and latents.
        prepared = await self.orch.prepare(req, False, cancelled)  # one response at the end: nobody plays along
        if prepared is None:
            return []
        kept: list = []
        for attempt in range(tries):
            chunks: list = []
            if attempt:
                prepared = prepared.reseeded(retry_seed(req.seed, attempt) if req.seed is not None else draw_seed())
            try:
                result = await self.orch.synthesize(req, chunks.append, cancelled, playback=False, prepared=prepared)
            except Exception as e:
                if not attempt:
                    raise
                # A retry that cannot run (its adapter removed meanwhile, the server stopping) leaves the
                # request the utterance it has: a whole one, if a bad case.
                log.warning("try %d of %d failed, the one before is kept: %s", attempt + 1, tries, e)
                break
            if result is None or cancelled():
                return chunks
            kept = chunks
            patches, target_tokens = result
            if not is_badcase(patches, target_tokens):
                break
            self.m_badcases.increment(1.0)
            if attempt + 1 == tries or not can_retry(req.min_length, target_tokens):
                break
            self.m_retries.increment(1.0)
            log.info("bad case (%d patches for %d target tokens): try %d of %d", patches, target_tokens,
                     attempt + 2, tries)
        return kept


class TTSStreamModel:
    """`tts_stream` (decoupled): audio chunks as they are made. Each request is one coroutine on
    the instance's event loop; at most `max_concurrent_streams` run per instance, more are
    refused as busy."""

    def initialize(self, args):
        params = read(args, "tts_stream")
        self.orch = _orchestrator(args, params)
        self.max_streams = params["max_concurrent_streams"]
        self.streams: dict = {}  # task -> its response sender, until the stream's final response is sent
        self.streams_lock = threading.Lock()  # finalize() ends streams from the stub's main thread
        self.closing = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.beacon = liveness.Beacon("tts_stream")

    @liveness.counted
    async def execute(self, requests):
        """Each stream runs as a task of its own; execute returns once they have all ended, and
        not sooner than MIN_EXECUTE_S. The stub registers an execute's coroutine only after it has
        started it, and one that has already finished by then makes it log an error and keep the
        finished future for ever (triton-inference-server/server#8537): refused streams, and streams
        that fail before their first await (an unknown voice), end at once."""
        p = pb()
        self.loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            tasks = []
            for request in requests:
                sender = request.get_response_sender()
                try:
                    if self.closing or runtime.stop_deadline() is not None:
                        raise Busy(SHUTTING_DOWN)
                    if len(self.streams) >= self.max_streams:
                        raise Busy(f"server busy: this tts_stream instance already runs {self.max_streams} streams "
                                   "(parameter max_concurrent_streams); retry later")
                    req = self.orch.parse(request, STREAM_INPUT_NAMES)
                except Exception as e:
                    sender.send(error_response(e), flags=p.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                task = asyncio.ensure_future(self._run(req, sender, request.request_id()))
                with self.streams_lock:
                    self.streams[task] = sender
                tasks.append(task)
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:  # the loop is stopping: finalize() ends the streams
            pass
        finally:  # however it ends (a refusal that could not be sent, too)
            await _outlast(started)
        return None

    async def _run(self, req, sender, client_id: str = ""):
        p = pb()
        rate = np.array([self.orch.sample_rate], np.int32)
        timeline.event("stream", client_id)

        def emit(audio):
            timeline.event("emit", client_id)
            sender.send(p.InferenceResponse(output_tensors=[tensor("AUDIO", audio.astype(np.float32)),
                                                            tensor("SAMPLE_RATE", rate)]))

        try:
            await self.orch.synthesize(req, emit, sender.is_cancelled)
            final = None
        except asyncio.CancelledError:
            final = error_response(Busy(SHUTTING_DOWN))
        except Exception as e:
            final = _failure(e)
        self._end(asyncio.current_task(), final)

    def _end(self, task, final):
        """Send a stream's final response (`final`: None for a plain end, else an error response),
        once: a stream that finalize() has already ended is left alone."""
        with self.streams_lock:
            sender = self.streams.pop(task, None)
        if sender is None:
            return
        p = pb()
        try:
            if final is None:
                sender.send(flags=p.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(final, flags=p.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            log.exception("could not end the response stream")

    def finalize(self):
        """End each stream still open with an error response. Triton calls finalize once its
        in-flight requests have ended or its exit timeout has passed, and the stub stops the event
        loop first, so the streams are ended from here."""
        self.closing = True
        self.beacon.stop()
        try:
            for task in list(self.streams):
                if self.loop is not None and self.loop.is_running():
                    self.loop.call_soon_threadsafe(task.cancel)
                self._end(task, error_response(Busy(SHUTTING_DOWN)))
            caller.close()
        finally:
            release_metrics()
