"""`decoder`: the engine behind a decoupled Triton model.

`execute` only validates and enqueues; the engine thread makes each request's LATENTS chunks.
Without `decode_audio` it streams them back through the request's response sender and closes the
stream with the final flag. With `decode_audio` (the default) it hands them to this process's
audio thread (`audio.stream_audio`), which decodes each chunk's AUDIO, so the orchestrators skip
`vae_decoder`: with `audio_channel` (the default) the chunks and the end go over a Unix socket of
the orchestrator's process (`serving.bls.audio_channel`), whose writer thread then sends the final
response, and the call carries only an empty first response and that final one; without it each
chunk is a response carrying its AUDIO, sent by the audio thread. A request
carrying CANCEL_ID cancels that earlier request (the orchestrators use it when their client goes
away). LORA names a request's adapter; a request carrying LORA_ACTION (from the `loras` model)
adds, removes or lists adapters.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time

import numpy as np
import torch

from .. import checks, timeline
from ..engine import Engine, EngineBusy, EngineConfig, EngineRequest, LoraFull, RequestError
from ..audio.stream_audio import StreamAudio
from ..model import split_k
from ..model.prompt import build_prompt
from ..loading import decoding_vae
from ..voxcpm2 import VoxCPM2
from ..coordination import liveness, processes, run_state, runtime
from . import contract, decoder_sinks, gc_pauses, placement
from .bls import audio_channel, callee
from .contract import value, wire_names
from .instance_sync import Peers
from .metrics import EngineMetrics, release_all as release_metrics
from .parameters import read, resolve_checkpoint
from .triton_io import (SHUTTING_DOWN, Busy, InputError, arrays, error_message, error_response,
                        internal_error_response, locked, pb, require_internal, tensor)

log = logging.getLogger("voxcpm_triton.decoder")


# An engine loop that has not come round for this long is stuck (it wakes every 50 ms when idle), and
# so is an audio round (a round decodes and sends at most a few chunks per request).
ENGINE_STUCK_S = 60.0
STOPPING_POLL_S = 0.5  # how often the decoder looks whether the server is stopping (runtime.stopping)
# What its requests end with then: a Busy error once past the orchestrator (triton_io's kind tags).
SHUTDOWN_ERROR = error_message(Busy(SHUTTING_DOWN))


def _scalar(inputs: dict, name, kind, default=None):
    v = value(inputs.get(name), name, kind)
    return default if v is None else v


def _in_lora_dir(message: str, lora_dir: str | None) -> str:
    """A LoRA error as its client reads it: paths in the LoRA folder written from `<lora_dir>/`, so that
    the server's own paths stay in its log, and said once what that folder is."""
    for root in {lora_dir, os.path.realpath(lora_dir)} if lora_dir else ():
        message = message.replace(os.path.join(root, ""), "<lora_dir>/")
    if "<lora_dir>/" in message:
        message += " (<lora_dir>: the server's LoRA folder, the decoder's lora_dir or VOXCPM_LORA_DIR)"
    return message


def _engine_config(params: dict) -> EngineConfig:
    """The engine's settings from the decoder's parameters."""
    kv_mb = params["kv_cache_mb"]
    return EngineConfig(
        block_size=params["block_size"],
        num_blocks=params["num_blocks"],
        kv_memory_bytes=int(kv_mb * 2**20) if kv_mb else None,
        max_num_seqs=params["max_num_seqs"],
        max_waiting=params["max_waiting_requests"],
        chunk_schedule=params["chunk_schedule"],
        playback_margin_s=params["playback_margin_ms"] / 1000,
        cuda_graphs=params["cuda_graphs"],
        batch_buckets=params["batch_buckets"],
        timestep_buckets=params["timestep_buckets"],
        enable_prefix_caching=params["enable_prefix_caching"],
        lora_merge=params["lora_merge"],
        prefill_pack_graphs=params["prefill_pack_graphs"],
    )


class DecoderModel:
    def initialize(self, args):
        runtime.model_process()
        params = read(args, "decoder")
        callee.check_callee_config(json.loads(args["model_config"]), "decoder")
        cfg = _engine_config(params)  # checks its values: before anything is loaded or started
        t0 = time.monotonic()
        device = placement.instance_device(args, params["device"])
        # torch.compile only where the engine captures CUDA graphs (GPU): compiled eager steps gain nothing.
        on_gpu = device.type == "cuda"
        self.lora_dir = params["lora_dir"]
        self._loras_saving = threading.Lock()  # the kept LoRA set (run_state.save_loras), written by one change at a time
        if params["lora_dir"] and not os.path.isdir(params["lora_dir"]):
            raise ValueError(f"decoder parameter 'lora_dir' (or VOXCPM_LORA_DIR): directory not found: "
                             f"{params['lora_dir']}")
        path = resolve_checkpoint(params["checkpoint"])
        # decode_audio: the model's one VAE is built for decoding chunks, as vae_decoder builds its own.
        vae = (decoding_vae(path, device, triton_kernels=True, compile=params["compile"] and params["cuda_graphs"])[1]
               if params["decode_audio"] else None)
        self.vox = VoxCPM2.from_pretrained(path, device=str(device), vae=vae,
                                           dtype=params["dtype"], attention=params["attention"],
                                           precision=params["precision"],
                                           compile=params["compile"] and params["cuda_graphs"] and on_gpu,
                                           # Adapters added later must fit the tables: they reserve lora_targets.
                                           lora_dir=params["lora_dir"], max_loras=params["max_loras"],
                                           max_lora_rank=params["max_lora_rank"],
                                           reserve_lora_targets=params["lora_targets"],
                                           lora_names=run_state.saved_loras() if params["lora_dir"] else None)
        t1 = time.monotonic()
        # Before the engine's thread runs: capturing the VAE's graphs wants the GPU to itself.
        self.audio = self._stream_audio(params, device) if params["decode_audio"] else None
        self.use_channel = self.audio is not None and params["audio_channel"]
        t_audio = time.monotonic() - t1
        self.keys = itertools.count()
        first_audio = self.audio if params["first_audio_priority"] else None
        self.engine = Engine(self.vox, cfg, first_audio=first_audio)
        if self.engine.loras is not None:
            run_state.save_loras(self.engine.lora_names())  # what a restart by the supervisor loads again
        self._stuck_logged = None  # the heartbeat of the stall whose threads were logged
        self.beacon = liveness.Beacon("decoder", self._status, work=self.engine.in_flight)
        # Several instances: cancels and LoRA changes reach one of them; they pass them on.
        self.peers = (Peers(self.engine, loras=self.engine.loras is not None, cancel=self._cancel)
                      if placement.instance_count(args) > 1 else None)
        self._closing = threading.Event()
        threading.Thread(target=self._end_requests_when_stopping, name="stopping-watch", daemon=True).start()
        gc_pauses.freeze(f"decoder instance {placement.instance_name(args)}")  # start-up's objects, done
        self.gc_pauses = gc_pauses.Pauses()
        # Last: after a failed initialize Triton calls no finalize to let go of them (metrics.release_all).
        self.metrics = EngineMetrics(self.engine, placement.labels(args, "decoder", self.vox.device), self.audio,
                                     self.gc_pauses)
        self._log_ready(placement.instance_name(args), time.monotonic() - t0, t1 - t0, t_audio)

    def _log_ready(self, name: str, total_s: float, load_s: float, audio_s: float):
        """One line of what start-up took and made."""
        phases = "".join(f", {k} {v:.1f} s" for k, v in self.engine.startup_s.items())
        if self.audio is not None:  # the audio thread's VAE graphs
            phases += f", audio {audio_s:.1f} s"
        memory = ""
        if self.vox.device.type == "cuda":
            memory = f", GPU memory {torch.cuda.max_memory_allocated(self.vox.device) / 2**30:.1f} GiB peak"
        graphs = self.engine.capture_summary
        log.warning("decoder instance %s ready in %.1f s (load %.1f s%s)%s: device=%s dtype=%s kv_blocks=%d "
                    "decode_graphs=%d (captured in %.1f s) split_k=%s", name, total_s, load_s, phases, memory,
                    self.vox.device, self.vox.dtype, self.engine.kv.allocator.total, graphs["graphs"],
                    graphs["seconds"], "on" if split_k.ENABLED else "off")  # the VOXCPM_SPLIT_K flag

    def _end_requests_when_stopping(self):
        """Triton 2.51 unloads the models only once every request has ended: at the server's stop
        deadline (runtime.stopping) the requests still here end with an error, so that it can."""
        while not self._closing.wait(STOPPING_POLL_S):
            if runtime.stopping() and (n := self.engine.cancel_all(SHUTDOWN_ERROR)):
                log.warning("the server is stopping: %d running request(s) ended", n)

    def _stream_audio(self, params: dict, device) -> StreamAudio:
        """The model's VAE decoding this instance's chunks, with a CUDA graph per chunk_schedule
        length and a stream slot for every request that can run, and as many again for those
        ending while new ones start."""
        return StreamAudio(self.vox.vae, self.vox.patch_size, 2 * params["max_num_seqs"],
                           cuda_graphs=params["cuda_graphs"] and device.type == "cuda",
                           graph_patches=sorted(set(params["chunk_schedule"])),
                           on_failure=lambda key, error: self.engine.cancel(key[0]), rush=params["audio_rush"])

    def _status(self) -> str | None:
        heartbeat = self.engine.heartbeat
        stuck = time.monotonic() - heartbeat
        if stuck > ENGINE_STUCK_S:
            if self._stuck_logged != heartbeat:  # once per stall: where every thread is
                self._stuck_logged = heartbeat
                log.error("the engine loop has not come round for %.0f s%s; threads:\n%s", stuck, self._gpu_state(),
                          processes.thread_stacks())
            return f"the engine loop has not come round for {stuck:.0f} s"
        if self.audio is not None and not self.audio.thread.is_alive():
            return "the decoder's audio thread has stopped"
        since = self.audio.round_since if self.audio is not None else None
        if since is not None and (stuck := time.monotonic() - since) > ENGINE_STUCK_S:
            if self._stuck_logged != since:
                self._stuck_logged = since
                log.error("the decoder's audio thread has been in one round for %.0f s; threads:\n%s", stuck,
                          processes.thread_stacks())
            return f"the decoder's audio thread has been in one round for {stuck:.0f} s"
        return self.engine.status()

    def _gpu_state(self) -> str:
        """Whether the GPU has finished what the engine's and the audio thread's streams were given:
        a stuck loop waiting on unfinished GPU work is a hang on the device, not on the host."""
        try:
            if self.vox.device.type != "cuda":
                return ""
            done = {"engine": torch.cuda.default_stream(self.vox.device).query()}
            if self.audio is not None and self.audio.cuda_stream is not None:
                done["audio"] = self.audio.cuda_stream.query()
        except Exception as e:  # noqa: BLE001 - a diagnostic only
            return f" (GPU state unknown: {e})"
        return " (GPU work finished: " + ", ".join(f"{k} stream {'yes' if v else 'NO'}" for k, v in done.items()) + ")"

    def _prompt(self, inputs: dict):
        ids, n_target = inputs.get("TOKEN_IDS"), _scalar(inputs, "TARGET_TOKENS", int)
        if ids is None or n_target is None:
            raise InputError("TOKEN_IDS and TARGET_TOKENS are required")
        ids = ids.reshape(-1).astype(np.int64)
        vocab = self.vox.cfg.lm_config.vocab_size
        if ids.size == 0 or ids.min() < 0 or ids.max() >= vocab:
            raise InputError(f"TOKEN_IDS must be non-empty ids in [0, {vocab})")
        ids = ids.tolist()
        P, D = self.vox.patch_size, self.vox.feat_dim
        feats = []
        for name in ("REF_LATENTS", "PROMPT_LATENTS"):
            a = inputs.get(name)
            if a is not None and (a.ndim != 3 or a.shape[1:] != (P, D) or a.shape[0] == 0):
                raise InputError(f"{name} must be [n > 0, {P}, {D}], got {list(a.shape)}")
            if a is not None and not np.isfinite(a).all():
                raise InputError(f"{name} contains NaN or Inf")
            feats.append(None if a is None else torch.from_numpy(np.array(a, dtype=np.float32)))
        prompt = build_prompt(ids, n_target, feats[0], feats[1], P, D)
        if len(prompt) >= self.vox.cfg.max_length:
            ref, cont = (0 if f is None else f.size(0) for f in feats)
            raise InputError(f"the prompt is {len(prompt)} positions: TEXT's {n_target} tokens, PROMPT_TEXT's or the "
                             f"voice's transcript's {len(ids) - n_target}, {ref} patches of reference audio, {cont} of "
                             f"prompt audio and {len(prompt) - len(ids) - ref - cont} markers; the model's limit is "
                             f"{self.vox.cfg.max_length}: send shorter text or audio")
        # Continuation (a prompt's audio): the VAE starts from the last audio patches (Prompt.context).
        return prompt, (prompt.context if len(prompt.context) else None)

    @liveness.counted
    def execute(self, requests):
        timeline.event("execute", len(requests))
        for request in requests:
            sender = request.get_response_sender()
            try:
                require_internal(request, "decoder")
                # Counts its sends for the orchestrator, which reads them without waiting (bls.caller).
                sender = callee.counting_sender(request, sender, pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                                                    channel=self.use_channel)
                inputs = arrays(request)
                cancel_id = inputs.get("CANCEL_ID")
                if cancel_id is not None:
                    rid = bytes(cancel_id.reshape(-1)[0]).decode()
                    if self.peers is None:
                        self._cancel(rid)
                    else:
                        self.peers.cancel(rid)
                    locked(sender.send, flags=pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                action = _scalar(inputs, "LORA_ACTION", str)
                if action is not None:
                    self._lora_action(action, _scalar(inputs, "LORA", str), sender)
                    continue
                lora = _scalar(inputs, "LORA", str) or None
                if lora is not None and self.peers is not None:
                    self.peers.sync_loras()  # a change made through another instance applies here too
                prompt, context = self._prompt(inputs)
                req = EngineRequest(
                    request_id=request.request_id() or f"decoder-{id(request)}",
                    prompt=prompt,
                    min_len=_scalar(inputs, "MIN_LENGTH", int, checks.DEFAULT_MIN_LENGTH),
                    max_len=_scalar(inputs, "MAX_LENGTH", int),
                    cfg_value=_scalar(inputs, "CFG_VALUE", float, checks.DEFAULT_CFG_VALUE),
                    inference_timesteps=_scalar(inputs, "INFERENCE_TIMESTEPS", int, checks.DEFAULT_TIMESTEPS),
                    seed=_scalar(inputs, "SEED", int),
                    lora=lora,
                    playback=_scalar(inputs, "PLAYBACK", bool, True))
                self._submit(req, sender, context)
            except EngineBusy as e:
                locked(sender.send, internal_error_response(Busy(str(e))),
                       flags=pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except (InputError, RequestError) as e:
                locked(sender.send, internal_error_response(InputError(wire_names(str(e)))),
                       flags=pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as e:  # not the request's fault (a ValueError from inside the engine neither)
                locked(sender.send, internal_error_response(e), flags=pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        timeline.event("executed", len(requests))
        return None

    def _lora_action(self, action: str, name: str | None, sender):
        """`loras`'s add / remove / list: one response with LORAS, the names loaded after. An add
        reads the adapter's files and waits for the engine thread to write it: in a thread of its
        own, so other requests are not held up."""
        p = pb()

        def run():
            try:
                if self.peers is not None and self.engine.loras is not None:
                    # Several instances: converge first, and publish a change for the others.
                    if action == "list":
                        self.peers.sync_loras()
                        names = self.engine.lora_names()
                    else:
                        names = self.peers.change_lora(action, name)
                elif action == "list":
                    names = self.engine.lora_names()
                elif action == "remove":
                    names = self.engine.remove_lora(name)
                else:
                    names = self.engine.add_lora(name)
                if action != "list":
                    with self._loras_saving:  # the set now: a change that overlapped this one may have come after
                        run_state.save_loras(self.engine.lora_names())
                response = p.InferenceResponse(output_tensors=[
                    tensor("LORAS", np.array([n.encode() for n in names], dtype=object))])
            except LoraFull as e:
                response = internal_error_response(Busy(str(e)))
            except ValueError as e:
                log.info("LoRA action %s %r refused: %s", action, name, e)  # with the server's paths
                response = internal_error_response(InputError(_in_lora_dir(str(e), self.lora_dir)))
            except Exception as e:
                log.exception("LoRA action %s %r failed", action, name)
                response = error_response(e)
            locked(sender.send, response, flags=p.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        if action not in contract.ACTIONS:
            raise InputError(f"LORA_ACTION must be one of {', '.join(contract.ACTIONS)}, got {action!r}")
        if (action == "list") != (name is None):
            raise InputError("LORA_ACTION list takes no LORA" if name is not None
                             else f"LORA_ACTION {action} needs LORA (the adapter's name)")
        if action == "add":
            threading.Thread(target=run, name="lora-add", daemon=True).start()
        else:
            run()

    def _submit(self, req: EngineRequest, sender, context):
        if self.audio is None:
            self.engine.submit(req, sink=decoder_sinks.latents_sink(sender))
            return
        key = (req.request_id, next(self.keys))  # an id may come back while its audio is still queued
        if decoder_sinks.channel_of(sender) is not None:
            # The call's first response, empty, before any of its audio: everything after it (its
            # audio, its end, a refusal below) follows it, and the final response comes last. Then
            # the channel's first frame, which tells the caller that the audio comes that way.
            locked(sender.send, pb().InferenceResponse(output_tensors=[]))
            sender.open()
        self.audio.open(key, decoder_sinks.audio_sink(sender), context)
        try:
            self.engine.submit(req, sink=decoder_sinks.to_audio(sender, self.audio, key))
        except BaseException:
            self.audio.forget(key)
            raise

    def _cancel(self, request_id: str) -> bool:
        """Cancel a request of this instance's -> whether it held one: in the engine, or, once the
        engine has ended it, with audio not yet decoded, which is then dropped (nobody wants it)."""
        if self.engine.cancel(request_id):
            return True
        return self.audio is not None and self.audio.drop_pending(lambda key: key[0] == request_id) > 0

    def finalize(self):
        """In-flight requests end with an error response (the engine fails them on shutdown)."""
        try:
            self._closing.set()
            self.beacon.stop()
            if self.peers is not None:
                self.peers.stop()
            self.metrics.close()
            self.gc_pauses.close()
            self.engine.shutdown(timeout=10.0)
            if self.audio is not None:  # after the engine: the ends of its last requests are queued
                self.audio.stop()
                if not audio_channel.drain(timeout=10.0):  # their final responses, after their audio
                    log.warning("audio channels still busy at finalize")
        finally:
            release_metrics()
