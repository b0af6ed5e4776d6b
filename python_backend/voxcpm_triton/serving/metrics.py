"""Custom metrics on Triton's /metrics endpoint (Python backend MetricFamily)."""

from __future__ import annotations

import threading

from .triton_io import IPC_LOCK, pb


_live: list = []  # this process's metrics, until `release_all`


class metric:
    """One labelled metric; it keeps its MetricFamily alive (Triton requires the family to outlive
    it). After `release_all` it records nothing."""

    def __init__(self, name: str, description: str, labels: dict, kind: str = "GAUGE"):
        p = pb()
        family = p.MetricFamily(name=name, description=description, kind=getattr(p.MetricFamily, kind))
        self.pair = (family, family.Metric(labels=labels))
        _live.append(self)

    def set(self, v: float):
        if (pair := self.pair) is not None:  # both held while in use, whatever another thread releases
            pair[1].set(float(v))

    def increment(self, v: float):
        if (pair := self.pair) is not None:
            pair[1].increment(float(v))


def release_all():
    """In a model's finalize: let go of this process's metrics (each before its family) while the
    stub can still tell the server. Left to the stub's own teardown, python_backend r24.10 destroys
    them after its shared memory is gone, and every model process with metrics crashed on its way
    out (a segfault in `Metric::Clear`)."""
    with IPC_LOCK:
        while _live:
            m = _live.pop()
            family, metric_ = m.pair
            m.pair = None
            del metric_  # the metric first: Triton requires its family to outlive it
            del family


class EngineMetrics:
    """Publishes the decoder engine's state a few times a second from a background thread, labelled
    with the instance and its device (each decoder instance is an engine of its own)."""

    def __init__(self, engine, labels: dict, audio=None, period_s: float = 0.2):
        """audio: the instance's `StreamAudio` (decoder parameter decode_audio), if any."""
        self.engine, self.audio, self.period = engine, audio, period_s
        self.gauges = {
            "running": metric("voxcpm_engine_running_requests", "Requests decoding now", labels),
            "waiting": metric("voxcpm_engine_waiting_requests", "Requests queued for admission", labels),
            "free_blocks": metric("voxcpm_kv_blocks_free", "Free KV cache blocks", labels),
            "total_blocks": metric("voxcpm_kv_blocks_total", "KV cache blocks in the pool", labels),
            "cached_blocks": metric("voxcpm_prefix_cache_blocks", "KV blocks holding a prefix cache entry (in use "
                                    "or idle; idle ones count as free)", labels),
            "steps_per_s": metric("voxcpm_engine_steps_per_second", "Decode steps per second (last second)", labels),
            "up": metric("voxcpm_engine_up", "1 while the engine can serve, 0 once its thread has died", labels),
        }
        if audio is not None:
            self.gauges["audio_streams"] = metric("voxcpm_decoder_audio_streams",
                                                  "Requests whose audio the decoder makes (decode_audio), "
                                                  "from submit to their last response", labels)
            self.gauges["audio_batch"] = metric("voxcpm_decoder_audio_batch_requests",
                                                "Requests decoded together in the decoder's latest VAE batch",
                                                labels)
        # Counters: engine stats key -> metric, each incremented by the stat's growth since the last update.
        self.counters = {
            "steps": metric("voxcpm_engine_decode_steps_total", "Decode steps run", labels, "COUNTER"),
            "finished": metric("voxcpm_engine_requests_finished_total",
                               "Requests ended (done, failed or cancelled)", labels, "COUNTER"),
            "prefix_cache_hits": metric("voxcpm_prefix_cache_hits_total",
                                        "Requests that started from at least one cached prompt block", labels,
                                        "COUNTER"),
            "prefix_cache_hit_blocks": metric("voxcpm_prefix_cache_hit_blocks_total",
                                              "Prompt blocks taken from the prefix cache instead of prefilled",
                                              labels, "COUNTER"),
            "early_chunks": metric("voxcpm_early_chunks_total",
                                   "Chunks sent before they filled: the client was low on audio "
                                   "(parameter playback_margin_ms)", labels, "COUNTER"),
            "lora_merges": metric("voxcpm_lora_merges_total",
                                  "LoRA adapters merged into the weights, for steps whose requests all use "
                                  "one (parameter lora_merge)", labels, "COUNTER"),
            "first_audio_fences": metric("voxcpm_engine_first_audio_fences_total",
                                         "Steps whose first chunks' audio decode was launched before the next "
                                         "step (parameter first_audio_priority)", labels, "COUNTER"),
            "first_audio_fence_misses": metric("voxcpm_engine_first_audio_fence_misses_total",
                                               "Steps read early for their first chunks' audio whose decode was "
                                               "not launched in time (the audio thread busy with older chunks, "
                                               "or 20 ms passed): the next step went ahead", labels, "COUNTER"),
        }
        self._last = dict.fromkeys(self.counters, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="voxcpm-metrics", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.period):
            self.update()

    def update(self):
        s = self.engine.stats()
        s["up"] = float(self.engine.status() is None)
        if not s["up"]:  # a dead engine runs nothing: don't leave it looking busy
            s.update(running=0, waiting=0, steps_per_s=0.0)
        if self.audio is not None:
            s.update(audio_streams=len(self.audio), audio_batch=self.audio.last_batch)
        with IPC_LOCK:
            for k, m in self.gauges.items():
                m.set(s[k])
            for k, m in self.counters.items():
                m.increment(s[k] - self._last[k])
        self._last = {k: s[k] for k in self.counters}

    def close(self):
        self._stop.set()
        self._thread.join(2)
