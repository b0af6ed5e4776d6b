"""Custom metrics on Triton's /metrics endpoint (Python backend MetricFamily)."""

from __future__ import annotations

import logging
import threading

from .bls import audio_channel
from .triton_io import IPC_LOCK, pb

log = logging.getLogger("voxcpm_triton.metrics")

_live: list = []  # this process's metrics, until `release_all`
RELEASE_WAIT_S = 5.0  # at finalize, how long to wait for a thread still in a stub call


class metric:
    """One labelled metric and its MetricFamily (python_backend invalidates a metric whose family
    is gone). Updates and `release_all` take IPC_LOCK, so none runs while they are let go of;
    after that, updates are dropped."""

    def __init__(self, name: str, description: str, labels: dict, kind: str = "GAUGE"):
        p = pb()
        family = p.MetricFamily(name=name, description=description, kind=getattr(p.MetricFamily, kind))
        self.pair = (family, family.Metric(labels=labels))
        _live.append(self)

    def set(self, v: float):
        with IPC_LOCK:
            if self.pair is not None:
                self.pair[1].set(float(v))

    def increment(self, v: float):
        with IPC_LOCK:
            if self.pair is not None:
                self.pair[1].increment(float(v))


def release_all():
    """Last in a model's finalize: let go of this process's metrics (each metric before its
    family) while the stub can still tell the server. Left to the stub's own teardown,
    python_backend r24.10 destroys them after its shared memory is gone, and every model process
    with metrics crashed on its way out (a segfault in `Metric::Clear`). A thread stuck in a stub
    call (a send the server no longer takes) holds IPC_LOCK: then they are left, rather than
    finalize never ending."""
    if not IPC_LOCK.acquire(timeout=RELEASE_WAIT_S):
        log.warning("metrics not released: a stub call has not returned for %.0f s; this process may crash "
                    "on its way out", RELEASE_WAIT_S)
        return
    try:
        while _live:
            m = _live.pop()
            family, metric_ = m.pair
            m.pair = None
            del metric_
            del family
    finally:
        IPC_LOCK.release()


class EngineMetrics:
    """Publishes the decoder engine's state a few times a second from a background thread, labelled
    with the instance and its device (each decoder instance is an engine of its own)."""

    def __init__(self, engine, labels: dict, audio=None, gc=None, period_s: float = 0.2):
        """audio: the instance's `StreamAudio` (decoder parameter decode_audio), if any; gc: its
        process's `gc_pauses.Pauses`, if any."""
        self.engine, self.audio, self.gc, self.period = engine, audio, gc, period_s
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
            "rows": metric("voxcpm_engine_decode_rows_total",
                           "Request rows in the decode steps run (over the steps: the mean batch)", labels,
                           "COUNTER"),
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
            "late_launches": metric("voxcpm_engine_late_launches_total",
                                    "Decode steps launched while another was in flight whose first work found "
                                    "the engine's GPU stream idle: it waited for the engine's thread", labels,
                                    "COUNTER"),
        }
        if audio is not None:
            self.counters["audio_rushes"] = metric(
                "voxcpm_decoder_audio_rushes_total", "Times the decoder's audio thread decoded and sent chunks "
                "between a round's deliveries, for clients about to run out of audio or still waiting for their "
                "first (parameter audio_rush)", labels, "COUNTER")
            self.counters["audio_sends"] = metric(
                "voxcpm_decoder_audio_sends_total", "Deliveries the decoder's audio thread made in its rounds: "
                "audio chunks (a request's last with its end) and ends that went alone; failures' ends not "
                "counted", labels, "COUNTER")
            self.counters["audio_send_seconds"] = metric(
                "voxcpm_decoder_audio_send_seconds_total", "Time the decoder's audio thread spent in the deliveries "
                "voxcpm_decoder_audio_sends_total counts (response sends, each a round trip to the server; with "
                "audio_channel, queueing frames for the channel's thread): "
                "over those, a delivery's mean time; over the wall time, how busy they keep the thread", labels,
                "COUNTER")
            self.counters["audio_channel_frames"] = metric(
                "voxcpm_decoder_audio_channel_frames_total", "Frames the decoder wrote to its callers' audio channels "
                "(parameter audio_channel): each call's opening, its audio chunks and its end, which went as "
                "responses without the channel",
                labels, "COUNTER")
            self.counters["audio_ends_alone"] = metric(
                "voxcpm_decoder_audio_ends_alone_total", "Request ends sent as a response of their own, their "
                "audio having gone in an earlier round (else an end goes with its request's last chunk)", labels,
                "COUNTER")
        if gc is not None:
            for g in range(3):
                gen = {**labels, "generation": str(g)}
                self.counters[f"gc_collections_{g}"] = metric(
                    "voxcpm_gc_collections_total", "Garbage collections of this process, by generation (2: every "
                    "object not frozen at start-up walked)", gen, "COUNTER")
                self.counters[f"gc_seconds_{g}"] = metric(
                    "voxcpm_gc_pause_seconds_total", "Time in garbage collections, by generation: every thread of "
                    "the process waits for them", gen, "COUNTER")
            self.gauges["gc_longest"] = metric("voxcpm_gc_pause_seconds_max",
                                               "The longest garbage collection of this process so far", labels)
        self._last = dict.fromkeys(self.counters, 0)
        self._set: dict = {}  # gauge -> the value last set
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="voxcpm-metrics", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.period):
            self.update()

    def update(self):
        s = self.engine.stats()
        s["rows"] = sum(rows * n for rows, n in s["batch_sizes"].items())
        s["up"] = float(self.engine.status() is None)
        if not s["up"]:  # a dead engine runs nothing: don't leave it looking busy
            s.update(running=0, waiting=0, steps_per_s=0.0)
        if self.audio is not None:
            a = self.audio
            s.update(audio_streams=len(a), audio_batch=a.last_batch, audio_rushes=a.rushed, audio_sends=a.sends,
                     audio_send_seconds=a.send_seconds, audio_ends_alone=a.ends_alone,
                     audio_channel_frames=audio_channel.written())
        if self.gc is not None:
            for g in range(3):
                s[f"gc_collections_{g}"], s[f"gc_seconds_{g}"] = self.gc.count[g], self.gc.seconds[g]
            s["gc_longest"] = self.gc.longest_s
        with IPC_LOCK:  # each update is a round trip to the server: only what changed
            for k, m in self.gauges.items():
                if self._set.get(k) != s[k]:
                    m.set(s[k])
            for k, m in self.counters.items():
                if s[k] != self._last[k]:
                    m.increment(s[k] - self._last[k])
        self._set = {k: s[k] for k in self.gauges}
        self._last = {k: s[k] for k in self.counters}

    def close(self):
        self._stop.set()
        self._thread.join(2)
