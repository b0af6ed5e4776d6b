"""The gateway's Prometheus metrics (`GET /metrics`), in a registry of its own."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Time to first byte: tens of milliseconds on a GPU, seconds under load or on a CPU.
TTFB_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("voxcpm_gateway_requests", "HTTP requests answered, by route, audio format "
                                "(speech only) and status", ["route", "format", "status"], registry=r)
        self.ttfb = Histogram("voxcpm_gateway_time_to_first_byte_seconds", "Speech requests: request received "
                              "-> first audio bytes sent", ["format", "stream_format"], buckets=TTFB_BUCKETS,
                              registry=r)
        self.streams = Gauge("voxcpm_gateway_streams_in_flight", "Synthesis streams open to Triton", registry=r)
        self.uploads = Gauge("voxcpm_gateway_voice_uploads_in_progress", "Voice uploads arriving, decoding or "
                             "being stored by Triton (at most --max-pending-uploads)", registry=r)
        self.ended = Counter("voxcpm_gateway_streams_ended", "Synthesis streams by how they ended: complete, "
                             "client_disconnected (the Triton request was cancelled), client_stalled (the client "
                             "read nothing for --stall-timeout: cut off, the Triton request cancelled), error", ["outcome"],
                             registry=r)
        self.audio_seconds = Counter("voxcpm_gateway_audio_seconds", "Seconds of audio sent", ["format"],
                                     registry=r)
        self.connections_refused = Counter("voxcpm_gateway_connections_refused", "Connections refused (429) "
                                           "past --max-connections-per-client from their address", registry=r)
        for outcome in ("complete", "client_disconnected", "client_stalled", "error"):
            self.ended.labels(outcome)

    content_type = CONTENT_TYPE_LATEST

    def render(self) -> bytes:
        return generate_latest(self.registry)
