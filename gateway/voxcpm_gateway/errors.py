"""OpenAI-shaped errors, and how Triton's answers map onto HTTP statuses.

Every error the gateway returns is `{"error": {"message", "type", "param", "code"}}`, as the
OpenAI API's are, so SDKs raise their usual exception classes (BadRequestError, NotFoundError,
RateLimitError, ...). Triton's message is passed through as it is; `param` names the request
field it is about.

Triton's gRPC stream reports an error as text only (no status code), so the mapping reads the
message: the pipeline's documented prefixes (`server busy: `, `VoxCPM server unhealthy: `), the
voice registry's answers, and the contract's input names (every input check names its input).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# status -> OpenAI error `type`
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
    504: "server_error",
}
RETRY_AFTER_S = "1"
# Limits a retry cannot pass (a store that is full stays full): OpenAI's SDKs otherwise retry a 429.
NO_RETRY = {"x-should-retry": "false"}
_LASTING = {"voice_limit_reached"}


@dataclass
class APIError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict = field(default_factory=dict)

    def __post_init__(self):
        super().__init__(self.message)

    def body(self) -> dict:
        kind = ERROR_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind,
                          "param": self.param, "code": self.code}}


def quoted(value: str, limit: int = 80) -> str:
    """A client's value as an error quotes it: repr, cut at `limit` characters (a 500 KB field name
    is not sent back whole)."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param, code)


def unreachable(url: str, detail: str) -> APIError:
    return APIError(503, f"Triton at {url} cannot be reached: {detail}", None, "server_unavailable",
                    {"Retry-After": RETRY_AFTER_S})


def shutting_down() -> APIError:
    return APIError(503, "the gateway is shutting down (--shutdown-timeout passed); retry the request", None,
                    "server_unavailable", {"Retry-After": RETRY_AFTER_S})


def timed_out(seconds: float, flag: str = "--request-timeout", what: str = "synthesis", after: str = "") -> APIError:
    return APIError(504, f"the request ran past the gateway's {flag[2:].replace('-', ' ')} of {seconds:g} s "
                    f"({flag}); its {what} was cancelled{after}", None, "request_timeout")


# (pattern, status, code) for messages that are not plain input errors; first match wins.
_RULES = [
    (re.compile(r"^server busy"), 429, "server_busy"),                      # tts_stream / decoder admission
    (re.compile(r"voices are stored already"), 429, "voice_limit_reached"),  # voices: max_voices
    (re.compile(r"^VoxCPM server unhealthy: "), 503, "server_unavailable"),  # a model process died
    (re.compile(r"Stub process '[^']*' is not healthy"), 503, "server_unavailable"),  # Triton: that process died
    (re.compile(r"^the server is shutting down|the server is shutting down$"), 503, "server_unavailable"),
    (re.compile(r"Server not ready"), 503, "server_unavailable"),            # Triton itself, stopping
    (re.compile(r"has no available versions"), 503, "server_unavailable"),  # Triton, unloading its models
    (re.compile(r"^unknown voice "), 404, "voice_not_found"),
]
# Triton's own checks before a model sees the request ("unexpected inference input 'X' for
# model ...", "inference input 'X' data-type is 'INT32', but model ... expects 'INT64'", "unexpected
# shape for input 'X' ...", "expected N inputs but got M ...").
_TRITON_REQUEST_CHECK = re.compile(r"inference input '|for input '|expected \d+ inputs")


def from_triton(message: str, params: dict[str, str]) -> APIError:
    """The APIError for Triton's error `message`. `params`: Triton input name -> request field,
    for the route that made the call (what `param` names)."""
    message = message.strip() or "Triton answered with an empty error"
    param = _positions_part(message, params) or _named_input(message, params)
    for pattern, status, code in _RULES:
        if pattern.search(message):
            headers = dict(NO_RETRY) if code in _LASTING else {"Retry-After": RETRY_AFTER_S} if status in (429, 503) else {}
            if status == 404:
                param = params.get("VOICE") or params.get("NAME")
            return APIError(status, message, param if status == 404 else None, code, headers)
    if param is not None or _TRITON_REQUEST_CHECK.search(message) or message.startswith("voice '"):
        return bad_request(message, param or params.get("VOICE"))
    # Anything else is the server's own failure, not the request's.
    return APIError(500, message, None, "triton_error")


# The decoder's prompt past the model's positions, part by part (serving/decoder_model.py's words)
_POSITIONS = re.compile(r"^the prompt is \d+ positions: TEXT's (\d+) tokens, PROMPT_TEXT's or the voice's "
                        r"transcript's (\d+), (\d+) patches of reference audio, (\d+) of prompt audio")


def _positions_part(message: str, params: dict[str, str]) -> str | None:
    """For a prompt past the model's positions, the field holding most of them: the text, or the
    voice (its transcript and audio) where the route has one and it holds more."""
    m = _POSITIONS.match(message)
    if m is None or "VOICE" not in params:
        return None
    text, *voice = (int(g) for g in m.groups())
    return params["VOICE"] if sum(voice) > text else params.get("TEXT")


# A quoted name in a message: a client's own voice or adapter name ("voice 'SEED' has no transcript"),
# or, in Triton's checks only, an input ("unexpected inference input 'SEED'").
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def _named_input(message: str, params: dict[str, str]) -> str | None:
    """The request field of the input `message` names first (whole words: VOICE is not VOICE_MODE).
    Quoted text is a client's name, not an input, except in Triton's own checks."""
    text = message if _TRITON_REQUEST_CHECK.search(message) else _QUOTED.sub(lambda m: " " * len(m[0]), message)
    best = None
    for name, field_name in params.items():
        m = re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), field_name)
    return None if best is None else best[1]
