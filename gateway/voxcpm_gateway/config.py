"""The gateway's settings: command-line flags, with defaults from the environment."""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass

API_KEY_ENV = "VOXCPM_OPENAI_API_KEY"


@dataclass
class Settings:
    triton_url: str = "127.0.0.1:8001"
    host: str = "127.0.0.1"
    port: int = 9000
    model_names: tuple[str, ...] = ("voxcpm2",)  # the first is the one GET /v1/models lists first
    api_key: str | None = None  # from the environment only: never on a command line (ps shows those)
    max_upload_bytes: int = 32 << 20
    max_json_bytes: int = 1 << 20
    max_voice_seconds: float = 60.0  # the voices model's limit; uploads are decoded no further
    request_timeout_s: float = 3600.0  # a bound for runaway requests, past the longest utterance
    voice_timeout_s: float = 300.0  # a voice call to Triton (list, add with its encoding, remove)
    max_pending_uploads: int = 4  # voice uploads at once, until stored (they decode one at a time); more: 429
    decode_timeout_s: float = 30.0  # an uploaded voice sample's decoding (a child process, killed past it)
    stall_timeout_s: float = 60.0  # a client that sends or reads nothing this long is cut off
    # SIGTERM: responses in flight get this long, past Triton's drain (half its 30 s exit timeout),
    # so that both stopping at once, they end with Triton's "shutting down"
    shutdown_timeout_s: float = 20.0
    max_connections_per_client: int = 256  # open at once from one address; more: 429 and closed (0: no bound)
    encode_threads: int = max(2, os.cpu_count() or 2)
    stream_model: str = "tts_stream"
    voices_model: str = "voices"
    log_level: str = "info"


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn.config.LOG_LEVELS' names


MAX_SETTING = 10_000_000  # past any sensible timeout (s), size (MiB) or count; an event loop's timer overflows far above


def _number(env_name: str, integer: bool = False, zero: bool = False):
    """An argparse type: a number above 0 (or 0 and above with `zero`) up to MAX_SETTING, whole with
    `integer`; its error names the environment variable the value may have come from (nan, inf and
    1e300 are refused: a timeout of nan failed every connection later, not the start)."""
    def parse(text: str):
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            value = None
        if value is None or not 0 <= value <= MAX_SETTING or (value == 0 and not zero):  # nan fails both
            what = "a whole number" if integer else "a number"
            raise argparse.ArgumentTypeError(f"must be {what} {'from 0' if zero else 'above 0'} up to {MAX_SETTING}, "
                                             f"got {text!r} (the flag, or {env_name})")
        return value
    parse.__name__ = "number"
    return parse


def parse_args(argv=None) -> Settings:
    env = os.environ.get
    d = Settings()
    prog = "python -m voxcpm_gateway" if sys.argv[0].endswith("__main__.py") else os.path.basename(sys.argv[0])
    ap = argparse.ArgumentParser(prog=prog,
                                 description="OpenAI speech API (POST /v1/audio/speech, /v1/audio/voices, "
                                             "/v1/models) in front of Triton's tts_stream and voices models.")

    def number(flag: str, env_name: str, integer: bool = False, zero: bool = False, default: str = "", help: str = ""):
        ap.add_argument(flag, type=_number(env_name, integer, zero), default=env(env_name, default), help=help)

    ap.add_argument("--triton-url", default=env("VOXCPM_TRITON_GRPC_URL", d.triton_url),
                    help="Triton's gRPC endpoint host:port (env VOXCPM_TRITON_GRPC_URL; default %(default)s)")
    ap.add_argument("--host", default=env("OPENAI_API_HOST", d.host),
                    help="address to bind (env OPENAI_API_HOST; default %(default)s)")
    ap.add_argument("--port", type=int, default=env("OPENAI_API_PORT", str(d.port)),
                    help="env OPENAI_API_PORT; default %(default)s")
    ap.add_argument("--model-name", action="append", default=None,
                    help="the model name clients send (repeat for aliases; env VOXCPM_OPENAI_MODEL_NAME, "
                         f"comma-separated; default {','.join(d.model_names)})")
    number("--max-upload-mb", "VOXCPM_OPENAI_MAX_UPLOAD_MB", default=f"{d.max_upload_bytes / (1 << 20):g}",
           help="largest voice upload (multipart body), MiB; larger ones get 413 (default %(default)s)")
    number("--request-timeout", "VOXCPM_OPENAI_REQUEST_TIMEOUT", default=f"{d.request_timeout_s:g}",
           help="seconds a request to Triton may take in all (default %(default)s)")
    number("--voice-timeout", "VOXCPM_OPENAI_VOICE_TIMEOUT", default=f"{d.voice_timeout_s:g}",
           help="seconds a voice call to Triton may take (an upload's encoding included); past it: 504, "
                "and the upload's slot is free again (default %(default)s)")
    number("--stall-timeout", "VOXCPM_OPENAI_STALL_TIMEOUT", default=f"{d.stall_timeout_s:g}",
           help="seconds a connection may take to send a request's headers (past it: closed), a client "
                "may send nothing of its request's body (past it: 408; nor may a body fall more than this "
                "behind 64 KiB/s), or read nothing "
                "of a speech response while its audio waits (past it: the response is cut off and its "
                "synthesis cancelled; the audio it has not read waits in Triton's memory; "
                "default %(default)s)")
    number("--max-pending-uploads", "VOXCPM_OPENAI_MAX_PENDING_UPLOADS", integer=True, default=str(d.max_pending_uploads),
           help="voice uploads in progress at once, from their first byte until Triton has stored them (each "
                "holds its file, on disk as it arrives, then its decoded sample in memory; they decode one "
                "at a time); past it: 429 (default %(default)s)")
    number("--decode-timeout", "VOXCPM_OPENAI_DECODE_TIMEOUT", default=f"{d.decode_timeout_s:g}",
           help="seconds an uploaded voice sample may take to decode; past it the upload is a 400 "
                "(default %(default)s)")
    number("--shutdown-timeout", "VOXCPM_OPENAI_SHUTDOWN_TIMEOUT", default=f"{d.shutdown_timeout_s:g}",
           help="seconds responses in flight get after SIGTERM (no new connections are taken meanwhile); "
                "then each speech response and voice call ends with a 503 'the gateway is shutting down' "
                "(a stream: its SSE error event, or its raw bytes cut off); longer than Triton's own "
                "drain, half its exit timeout; what stops the gateway must wait 5 s more before SIGKILL "
                "(default %(default)s)")
    number("--max-connections-per-client", "VOXCPM_OPENAI_MAX_CONNECTIONS_PER_CLIENT", integer=True, zero=True,
           default=str(d.max_connections_per_client),
           help="connections one address (an IPv6 one's /64) may hold open at once; past it a connection gets 429 and is "
                "closed (0: no bound; behind a reverse proxy every client has the proxy's address; "
                "default %(default)s)")
    ap.add_argument("--log-level", default=env("VOXCPM_OPENAI_LOG_LEVEL", d.log_level),
                    type=str.lower, choices=LOG_LEVELS,
                    help="uvicorn's log level (env VOXCPM_OPENAI_LOG_LEVEL; default %(default)s)")
    a = ap.parse_args(argv)
    if a.log_level not in LOG_LEVELS:  # argparse does not check a default (here the environment's)
        ap.error(f"VOXCPM_OPENAI_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {a.log_level!r}")
    names = a.model_name or [n.strip() for n in env("VOXCPM_OPENAI_MODEL_NAME", ",".join(d.model_names)).split(",") if n.strip()]
    if not names:
        ap.error("no model name")
    if not 0 < a.port < 65536:
        ap.error(f"--port must be 1..65535, got {a.port}" + (
            " (OPENAI_API_PORT=0 tells scripts/serve.sh to run no gateway)" if a.port == 0 else ""))
    return Settings(triton_url=a.triton_url, host=a.host, port=a.port, model_names=tuple(names),
                    api_key=env(API_KEY_ENV) or None, max_upload_bytes=math.ceil(a.max_upload_mb * (1 << 20)),
                    request_timeout_s=a.request_timeout, voice_timeout_s=a.voice_timeout,
                    stall_timeout_s=a.stall_timeout,
                    decode_timeout_s=a.decode_timeout, max_pending_uploads=a.max_pending_uploads,
                    shutdown_timeout_s=a.shutdown_timeout,
                    max_connections_per_client=a.max_connections_per_client, log_level=a.log_level)
