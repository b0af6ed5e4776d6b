"""The OpenAI speech API in front of Triton: the app, its error handling and its routes (the voice
routes in voice_routes.py, the voice form in voice_form.py).

    POST   /v1/audio/speech          text -> audio (tts_stream), streamed
    GET    /v1/audio/voices          registered voices (the `voices` model)
    POST   /v1/audio/voices          register one (multipart: name, audio_sample, ref_text, lora)
    DELETE /v1/audio/voices/{name}   remove one
    GET    /v1/models[/{model}]      the served model name(s)
    GET    /health                   200 when Triton's tts_stream and voices are ready, else 503
    GET    /metrics                  Prometheus text

No model code runs here: every request becomes gRPC calls to Triton.
"""

from __future__ import annotations

import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from . import audio_encoding, errors, upload_decoder
from .config import Settings
from .guards import Guards
from .metrics import Metrics
from .speech_request import SpeechRequest
from .shutdown import Drain
from .speech_stream import SpeechResponse, send_error
from .triton_client import TritonClient
from .upload_decoder import UploadDecoder
from .voice_routes import voice_router

log = logging.getLogger("voxcpm_gateway")

UNION_FORMS = {"str", "int", "float", "bool", "VoiceRef"}  # the tags pydantic puts in a union field's error location
BODY_PARSE_FAILED = "There was an error parsing the body"  # FastAPI's HTTPException detail


class SpeechHTTPResponse(Response):
    """A FastAPI Response (so the route may return it) that runs a SpeechResponse."""

    def __init__(self, speech: SpeechResponse):
        super().__init__()
        self.speech = speech

    async def __call__(self, scope, receive, send):
        await self.speech(scope, receive, send)


def create_app(settings: Settings) -> FastAPI:
    metrics = Metrics()
    backend = TritonClient(settings.triton_url, settings.stream_model, settings.voices_model,
                            settings.request_timeout_s, settings.voice_timeout_s)
    executor = ThreadPoolExecutor(settings.encode_threads, thread_name_prefix="voxcpm-gateway")
    # uploads decode one at a time, in a child process waited for on a thread of their own: a slow
    # one never delays a stream's encoding, and one that crashes its decoder fails alone
    upload_executor = ThreadPoolExecutor(1, thread_name_prefix="voxcpm-gateway-upload")
    uploads = UploadDecoder(settings.decode_timeout_s)
    started = int(time.time())
    drain = Drain(settings.shutdown_timeout_s)

    unavailable = audio_encoding.unavailable_formats()
    for fmt, why in unavailable.items():
        log.warning("response_format %s is unavailable: %s", fmt, why)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await backend.close()
        executor.shutdown(wait=False, cancel_futures=True)
        upload_executor.shutdown(wait=False, cancel_futures=True)
        upload_decoder.remove_temp_dir()

    # no schema or docs pages (they would be open past the API key), no redirects for a trailing slash
    app = FastAPI(title="VoxCPM2 OpenAI speech API", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, redirect_slashes=False)
    app.state.settings, app.state.metrics, app.state.backend = settings, metrics, backend
    app.state.drain = drain

    def limit_for(scope) -> int:
        upload = scope["method"] == "POST" and scope["path"].rstrip("/") == "/v1/audio/voices"
        return settings.max_upload_bytes if upload else settings.max_json_bytes

    app.add_middleware(Guards, api_key=settings.api_key, limit_for=limit_for, send_error=send_error,
                       body_timeout_s=settings.stall_timeout_s)

    # ------------------------------------------------------------------ errors
    def error_response(err: errors.APIError, route: str | None = None) -> JSONResponse:
        if route:
            metrics.requests.labels(route, "", str(err.status)).inc()
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(errors.APIError)
    async def _api_error(request: Request, err: errors.APIError):
        return error_response(err, _route(request))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return error_response(_validation_error(exc), _route(request))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        if exc.status_code == 400 and exc.detail == BODY_PARSE_FAILED and exc.__cause__ is not None:
            # FastAPI's words for what its json.loads raises besides a syntax error: bytes that are not
            # UTF-8, nesting past the recursion limit, an integer past the digit limit
            return error_response(errors.bad_request(f"the request body is not valid JSON: {exc.__cause__}", None,
                                                     "invalid_json"), _route(request))
        code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 408: "body_timeout",
                413: "request_too_large"}.get(exc.status_code)
        return error_response(errors.APIError(exc.status_code, str(exc.detail), None, code, dict(exc.headers or {})),
                              _route(request))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect):  # mid-body: nobody to answer, nothing went wrong
        log.info("%s %s: the client hung up before its request body was in", request.method, request.url.path)
        return error_response(errors.APIError(499, "the client closed the request", None, "client_disconnected"),
                              _route(request))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(errors.APIError(500, f"internal error of the gateway: {type(exc).__name__}: {exc}",
                                              None, "gateway_error"), _route(request))

    # ------------------------------------------------------------------ speech
    @app.post("/v1/audio/speech")
    async def speech(body: SpeechRequest):
        t0 = time.perf_counter()
        body.check(settings.model_names)
        if body.response_format in unavailable:
            raise errors.APIError(500, f"response_format {body.response_format!r} is unavailable on this server: "
                                  f"{unavailable[body.response_format]}", "response_format", "format_unavailable")
        arrays = body.triton_inputs()
        request_id = "oai-" + secrets.token_hex(8)
        return SpeechHTTPResponse(SpeechResponse(backend, body, arrays, metrics, executor, request_id, t0,
                                                 settings.stall_timeout_s, drain))

    app.include_router(voice_router(settings, backend, metrics, drain, upload_executor, uploads))

    # ------------------------------------------------------------------ models, health, metrics
    def model_object(name: str) -> dict:
        return {"id": name, "object": "model", "created": started, "owned_by": "voxcpm"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_object(n) for n in settings.model_names]}

    @app.get("/v1/models/{model}")
    async def model(model: str):
        if model not in settings.model_names:
            raise errors.APIError(404, f"The model {errors.quoted(model)} does not exist", "model", "model_not_found")
        return model_object(model)

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: what some load balancers send
    async def health():
        if await backend.ready():
            return {"status": "ok", "triton": settings.triton_url}
        return error_response(errors.APIError(503, f"Triton at {settings.triton_url} is not ready (models "
                                              f"{settings.stream_model}, {settings.voices_model})", None,
                                              "server_unavailable", {"Retry-After": errors.RETRY_AFTER_S}))

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    return app


def _route(request: Request) -> str | None:
    path = request.url.path
    if path.startswith("/v1/audio/speech"):
        return "speech"
    if path.startswith("/v1/audio/voices"):
        return "voices"
    return "other" if path.startswith("/v1/") else None


def _validation_error(exc: RequestValidationError) -> errors.APIError:
    """The first problem pydantic found, as OpenAI words it: message and the field (`param`)."""
    errs = exc.errors()
    # our own checks' messages before the rest (a union field lists its other forms' type errors first)
    first = next((e for e in errs if e.get("type") == "value_error"), errs[0] if errs else {})
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    field = loc[0] if loc else None
    kind, msg = first.get("type", ""), first.get("msg", "invalid request")
    # a union: pydantic's messages name its forms ("voice.str: ...", "voice.VoiceRef.id: ...")
    if field == "voice" and kind != "value_error":
        inner = next((e for e in errs if "VoiceRef" in e.get("loc", ())), None)
        if isinstance(first.get("input"), dict) and inner is not None:  # the object form's own complaint
            sub = [str(p) for p in inner["loc"][inner["loc"].index("VoiceRef") + 1:]]
            why = f"{'.'.join(['voice', *sub])}: {inner['msg']}"
        else:
            why = f"got {_json_type(first.get('input'))}"
        return errors.bad_request(f"voice must be a voice name or an object {{\"id\": \"<voice name>\"}}: {why}",
                                  field)
    if kind == "extra_forbidden":
        return errors.bad_request(f"unknown field {errors.quoted(field)}", field[:80], "unknown_parameter")
    if kind.startswith("json"):
        return errors.bad_request(f"the request body is not valid JSON: {msg}", None, "invalid_json")
    if field is None and kind == "missing":
        return errors.bad_request("the request body is missing: a JSON object is required", None,
                                  "missing_required_parameter")
    if field is None:
        return errors.bad_request(f"the request body must be a JSON object, sent as Content-Type "
                                  f"application/json: {msg}", None, "invalid_json")
    if kind == "missing":
        return errors.bad_request(f"{field} is required", field, "missing_required_parameter")
    # a number field's union forms (speed.float, speed.int) are not part of its name
    return errors.bad_request(f"{'.'.join(p for p in loc if p not in UNION_FORMS)}: {msg}", field)


def _json_type(value) -> str:
    kinds = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", list: "an array"}
    return kinds.get(type(value), type(value).__name__)
