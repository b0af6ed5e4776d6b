"""`vae_encoder` (dynamic batching) and `vae_decoder` (sequence batching, per-stream causal state).

Both take Triton's batch dimension of 1 per request; a batch is the list of
requests an `execute` call receives, and requests of equal length are run as
one tensor batch.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch

from ..audio.patches import encode_patches
from ..audio.vae_streams import VAEStreams
from ..checks import check_waveform, resample
from ..coordination import liveness, runtime
from ..loading import decoding_vae, load_audio_vae
from ..model.audio_vae import patch_frames
from . import gc_pauses, placement
from .contract import MAX_AUDIO_SECONDS
from .metrics import metric, release_all as release_metrics
from .parameters import read, resolve_checkpoint
from .triton_io import InputError, error_response, get, internal_error_response, pb, require_internal, tensor

log = logging.getLogger("voxcpm_triton.vae")


def _load(args, model: str, decoder_backends: bool = False):
    """decoder_backends (vae_decoder): the decoder built with the Triton kernels and compiled snakes
    its parameters ask for (GPU only; the kernels where they can run)."""
    runtime.model_process()
    params = read(args, model)
    device = placement.instance_device(args, params["device"])
    path = resolve_checkpoint(params["checkpoint"])
    if decoder_backends:
        cfg, vae = decoding_vae(path, device, params["triton_kernels"], params["compile"])
    else:
        cfg, vae = load_audio_vae(path, device)
    log.warning("%s instance %s loaded: device=%s", model, placement.instance_name(args), device)
    return params, cfg, vae


def _one(request, name: str) -> np.ndarray:
    """Input `name` of a request whose batch dimension must be 1 (the orchestrator sends one item
    per request; Triton would otherwise hand over a client's batch of several)."""
    x = get(request, name)
    if x is None:
        raise InputError(f"{name} is required")
    if x.ndim < 1 or x.shape[0] != 1:
        raise InputError(f"{name} must have a batch dimension of 1, got shape {list(x.shape)}")
    return x[0]


class VAEEncoderModel:
    """AUDIO [1, n] at SAMPLE_RATE, PAD_LEFT -> LATENTS [1, patches, P, D]."""

    def initialize(self, args):
        _, self.cfg, self.vae = _load(args, "vae_encoder")
        self.beacon = liveness.Beacon("vae_encoder")

    def finalize(self):
        self.beacon.stop()

    @liveness.counted
    def execute(self, requests):
        responses: list = [None] * len(requests)
        waves, pads, idx = [], [], []
        for i, r in enumerate(requests):
            try:
                require_internal(r, "vae_encoder")
                rate = int(_one(r, "SAMPLE_RATE").reshape(-1)[0])
                wav = check_waveform(_one(r, "AUDIO").reshape(-1), rate, "AUDIO", "SAMPLE_RATE", MAX_AUDIO_SECONDS)
                waves.append(resample(wav, rate, self.vae.sample_rate))
                pads.append("left" if bool(_one(r, "PAD_LEFT").reshape(-1)[0]) else "right")
                idx.append(i)
            except Exception as e:
                responses[i] = internal_error_response(InputError(str(e)) if isinstance(e, ValueError) else e)
        try:
            patches = encode_patches(self.vae, self.cfg.patch_size, waves, pads) if waves else []
            for i, p in zip(idx, patches):
                responses[i] = pb().InferenceResponse(output_tensors=[tensor("LATENTS", p.numpy()[None])])
        except Exception as e:
            for i in idx:
                responses[i] = internal_error_response(e)
        return responses


class VAEDecoderModel:
    """One stream per sequence (CORRID): LATENTS [1, n, P, D] chunks -> AUDIO [1, n*P*hop].

    START opens the stream's causal-conv state (primed with CONTEXT latents in
    continuation mode); END drops it. States idle longer than the timeout (a
    client that vanished mid-stream) are dropped too. The states and the
    batched decode (CUDA graphs on a GPU) live in `VAEStreams`.
    """

    def initialize(self, args):
        params, self.cfg, self.vae = _load(args, "vae_decoder", decoder_backends=True)
        on_gpu = self.vae.device.type == "cuda"
        self.streams = VAEStreams(self.vae, self.cfg.patch_size, params["max_streams"],
                                  cuda_graphs=on_gpu and params["cuda_graphs"],
                                  graph_patches=params["graph_patches"])
        # One chunk's activations grow with its length (the last level holds 32 x 7680 floats per
        # patch and stream): a bound keeps one caller's request from exhausting GPU memory.
        self.max_chunk = params["max_chunk_patches"]
        # At most the sequence batcher's idle timeout (parameters.INVARIANTS).
        self.idle_timeout = params["stream_idle_timeout_s"]
        self.last_used: dict[int, float] = {}
        self.lock = threading.Lock()
        labels = placement.labels(args, "vae_decoder", self.vae.device)
        self._stop = threading.Event()
        threading.Thread(target=self._sweeper, name="vae-stream-sweeper", daemon=True).start()
        self.beacon = liveness.Beacon("vae_decoder")
        gc_pauses.freeze(f"vae_decoder instance {placement.instance_name(args)}")
        # Last: after a failed initialize Triton calls no finalize to let go of them (metrics.release_all).
        self.m_streams = metric("voxcpm_vae_streams", "Open VAE decode streams (state held)", labels)
        self.m_batches = metric("voxcpm_vae_decode_batch_streams", "Streams decoded together in the last batch", labels)
        self.m_started = metric("voxcpm_vae_streams_started_total", "VAE decode streams opened (START)", labels,
                                "COUNTER")

    def _sweeper(self):
        # Plain Python only: no call into the stub from this thread (see triton_io.IPC_LOCK).
        while not self._stop.wait(max(0.1, min(5.0, self.idle_timeout / 2))):
            with self.lock:
                self._drop_idle(time.monotonic())

    def _close(self, corrid: int):
        self.streams.close(corrid)
        self.last_used.pop(corrid, None)

    def _drop_idle(self, now: float):
        for c in [c for c, t in self.last_used.items() if now - t > self.idle_timeout]:
            self._close(c)

    def finalize(self):
        self._stop.set()
        try:
            self.beacon.stop()
        finally:
            release_metrics()

    def _patches(self, request, name: str):
        """Input `name` as [n, P, D] patches (None if absent), checked."""
        if get(request, name) is None:
            return None
        x = _one(request, name)
        P, D = self.cfg.patch_size, self.cfg.feat_dim
        if x.ndim != 3 or x.shape[1:] != (P, D):
            raise InputError(f"{name} must be [n, {P}, {D}]")
        if not np.isfinite(x).all():
            raise InputError(f"{name} contains NaN or Inf")
        if x.shape[0] > self.max_chunk:
            raise InputError(f"{name} has {x.shape[0]} patches; vae_decoder takes at most {self.max_chunk} per "
                             "chunk (parameter max_chunk_patches)")
        return x

    def _z(self, lat: np.ndarray) -> torch.Tensor:
        """[n, P, D] patches -> [1, D, n*P] frames."""
        return patch_frames(torch.from_numpy(np.ascontiguousarray(lat, dtype=np.float32)))

    @torch.inference_mode()
    @liveness.counted
    def execute(self, requests):
        responses: list = [None] * len(requests)
        work = []  # (index, corrid, z, end)
        started = 0
        now = time.monotonic()
        with self.lock:
            for i, r in enumerate(requests):
                try:
                    require_internal(r, "vae_decoder")
                    corrid = int(get(r, "CORRID").reshape(-1)[0])
                    start = bool(get(r, "START").reshape(-1)[0])
                    end = bool(get(r, "END").reshape(-1)[0])
                    lat = self._patches(r, "LATENTS")
                    ctx = self._patches(r, "CONTEXT")
                    if any(c == corrid for _, c, _, _ in work):  # the sequence batcher never does this
                        raise ValueError(f"two chunks of sequence {corrid} in one batch")
                    if start:
                        self.streams.open(corrid, self._z(ctx) if ctx is not None and ctx.size else None)
                        started += 1
                    elif corrid not in self.streams:
                        if end and lat.shape[0] == 0:  # closing a stream whose START failed: nothing to free
                            responses[i] = pb().InferenceResponse(output_tensors=[
                                tensor("AUDIO", np.zeros((1, 0), np.float32))])
                            continue
                        raise InputError(f"sequence {corrid} has no open VAE stream (never started, ended, or "
                                         f"idle for more than {self.idle_timeout:g} s); send START first")
                    self.last_used[corrid] = now
                    work.append((i, corrid, self._z(lat), end))
                except Exception as e:
                    responses[i] = error_response(e)
            # Streams whose chunks have the same length decode as one batch; every batch is queued
            # on the GPU before the first wait for one (`VAEStreams.decode_async`).
            queued = []
            for n in sorted({w[2].size(-1) for w in work}):
                group = [w for w in work if w[2].size(-1) == n]
                try:
                    queued.append((group, self.streams.decode_async([c for _, c, _, _ in group],
                                                                    torch.cat([z for *_, z, _ in group]))))
                except Exception as e:
                    for i, *_ in group:
                        responses[i] = error_response(e)
            for group, pending in queued:
                try:
                    for (i, *_), a in zip(group, pending.result().numpy()):
                        responses[i] = pb().InferenceResponse(output_tensors=[tensor("AUDIO", a[None])])
                    self.m_batches.set(float(len(group)))
                except Exception as e:
                    for i, *_ in group:
                        responses[i] = error_response(e)
            # A stream is idle from the end of its last chunk: a decode slower than the timeout
            # must not make its own stream look abandoned.
            done = time.monotonic()
            for _, c, _, end in work:
                if end:
                    self._close(c)
                elif c in self.streams:
                    self.last_used[c] = done
            self._drop_idle(done)
            self.m_streams.set(float(len(self.streams)))
            self.m_started.increment(float(started))
        return responses
