"""What is checked before a request reaches its route, as ASGI middleware: the API key, the
body size (413 before the body is read whole: by Content-Length when the client sends one,
else while it arrives), and a body that stops arriving (408 once none of it came for the
stall timeout: such a client would hold its connection, and an upload its memory, for good) or
trickles in (408 once it falls more than the stall timeout behind MIN_BODY_BYTES_PER_S)."""

from __future__ import annotations

import hmac
import time
from typing import Callable

import anyio
from starlette.exceptions import HTTPException

from . import errors


class BodyTooLarge(HTTPException):
    """Raised from `receive` inside the app; FastAPI passes HTTPExceptions on to their handler."""

    def __init__(self, limit: int):
        super().__init__(413, too_large(limit).message)


# A body must also arrive at this rate on average (past --stall-timeout): one that trickles in would
# otherwise hold its connection, and an upload's slot and temporary file, for as long as it likes.
MIN_BODY_BYTES_PER_S = 64 * 1024


class BodyStalled(HTTPException):
    def __init__(self, seconds: float):
        super().__init__(408, f"the request body stopped arriving: nothing came for {seconds:g} s (--stall-timeout)")


class BodySlow(HTTPException):
    def __init__(self, seconds: float):
        super().__init__(408, f"the request body arrived too slowly ({seconds:.0f} s allowed for what came): a body "
                              f"must come at {MIN_BODY_BYTES_PER_S // 1024} KiB/s on average, --stall-timeout aside")


def too_large(limit: int) -> errors.APIError:
    return errors.APIError(413, f"the request body is larger than the limit of {limit} bytes", None,
                           "request_too_large")


class Guards:
    def __init__(self, app, api_key: str | None, limit_for: Callable[[dict], int], send_error, body_timeout_s: float,
                 protected="/v1/"):
        """limit_for(scope) -> the largest body accepted; send_error(send, APIError) answers;
        body_timeout_s: the longest wait for the body's next part; paths under `protected` need
        the API key (when one is set)."""
        self.app, self.limit_for, self.send_error, self.protected = app, limit_for, send_error, protected
        self.body_timeout_s = body_timeout_s
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.key is not None and scope["path"].startswith(self.protected):
            # Exactly one: with two, a proxy that checks the first and this check (the last) would
            # each let a request through on a key the other never saw.
            given = [v for k, v in scope.get("headers") or [] if k == b"authorization"]
            if len(given) != 1 or not self._authorized(given[0]):
                err = errors.APIError(401, "missing or incorrect API key: send one header 'Authorization: Bearer "
                                      "<key>' with the key the server was given (VOXCPM_OPENAI_API_KEY)", None,
                                      "invalid_api_key", {"WWW-Authenticate": "Bearer"})
                return await self.send_error(send, err)
        limit = self.limit_for(scope)
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await self.send_error(send, too_large(limit))
        received, body_done = 0, False
        start = time.monotonic()

        async def limited():
            nonlocal received, body_done
            if body_done:  # after the body, receive waits for the client to hang up: no limit there
                return await receive()
            # by what has arrived, not what is declared: a trickle falls behind within a stall timeout
            allowed = self.body_timeout_s + received / MIN_BODY_BYTES_PER_S
            left = start + allowed - time.monotonic()
            try:
                with anyio.fail_after(max(0.0, min(self.body_timeout_s, left))):
                    message = await receive()
            except TimeoutError:
                raise (BodyStalled(self.body_timeout_s) if left > self.body_timeout_s else BodySlow(allowed)) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
                body_done = not message.get("more_body", False)
            return message

        await self.app(scope, limited, send)

    def _authorized(self, value: bytes) -> bool:
        scheme, _, token = value.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
