"""Limits on connections, below HTTP: each must finish a request's headers in time and within
MAX_HEAD_BYTES, and one client (an address) may hold only so many at once.

uvicorn times out an idle keep-alive connection, but not one that has sent part of a request's
headers: such a connection (a slow-loris client) is held open for good, and enough of them use up
the gateway's file descriptors. This protocol, uvicorn's h11 one otherwise, closes a
connection whose request headers are not complete `seconds` after it opened or after it began
waiting for its next request; a body that stops arriving is `guards`' to time out.

Nor does httptools bound a request's headers: one connection that sent a 120 MiB header held the
event loop for seconds, stalling every stream (a review). The protocol is uvicorn's h11 one, and a
request line and headers past MAX_HEAD_BYTES get a 431, whether they are still arriving (counted as
they come) or came whole in one read or behind another request (measured once h11 has parsed them,
within its own bound); the connection then closes after LINGER_S, its input read and dropped
meanwhile, so that the client reads the 431 rather than a reset. (h11 also ends an HTTP/1.0
response by closing the connection, where httptools sent such clients chunks.)

Nor does uvicorn bound connections per client: one host that opens as many idle connections as
the gateway may hold files keeps everybody else out. A connection past `per_client` from its
address (an IPv6 one's /64) gets a 429 (the OpenAI SDKs retry it, later) and is closed at once. Behind a reverse
proxy every client has the proxy's address: there the proxy limits clients, and this limit is 0
(off) or the proxy's own connection count.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import json
import logging
import time
from typing import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from . import errors

log = logging.getLogger("voxcpm_gateway")
REFUSAL_LOG_S = 60.0  # a refused client is logged at most this often
MAX_HEAD_BYTES = 64 * 1024  # a request line and its headers; nginx's default allows 32 KiB
# h11's own bound on what it buffers, past MAX_HEAD_BYTES and one read (asyncio's: 256 KiB), so that
# the 431 below answers first
H11_MAX_INCOMPLETE_EVENT_SIZE = MAX_HEAD_BYTES + (512 << 10)
LINGER_S = 1.0  # a refused head's connection stays this long, its input dropped, before it closes


def _closing_answer(status: str, err: errors.APIError) -> bytes:
    """A whole response that ends its connection, written below HTTP."""
    body = json.dumps(err.body()).encode()
    extra = b"".join(f"{k.lower()}: {v}\r\n".encode() for k, v in err.headers.items())
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n".encode() + extra +
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _refusal(per_client: int) -> bytes:
    return _closing_answer("429 Too Many Requests", errors.APIError(
        429, f"too many connections from this address: at most {per_client} at once "
             f"(--max-connections-per-client)", None, "too_many_connections", {"Retry-After": errors.RETRY_AFTER_S}))


HEAD_TOO_LARGE = _closing_answer("431 Request Header Fields Too Large", errors.APIError(
    431, f"the request line and headers are larger than the limit of {MAX_HEAD_BYTES} bytes", None,
    "request_header_fields_too_large"))


def client_of(peer) -> str:
    """Whom a connection counts against: its IPv4 address (an IPv4-mapped IPv6 one as IPv4), or its
    IPv6 address's /64, which one host usually holds whole."""
    if not (isinstance(peer, tuple) and peer):
        return "local"  # a Unix socket
    try:
        ip = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return str(peer[0])
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def head_bytes(event: h11.Request) -> int:
    """About what a request's line and headers took on the wire."""
    return len(event.method) + len(event.target) + 12 + sum(len(k) + len(v) + 4 for k, v in event.headers.raw_items())


def with_connection_limits(seconds: float, per_client: int = 0,
                           on_refused: Callable[[], None] = lambda: None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with the header timeout `seconds` and at most `per_client`
    connections per address (0: no bound); `on_refused` is called for each connection refused."""
    held: collections.Counter = collections.Counter()  # open connections by address
    logged: dict[str, float] = {}
    logged_heads: dict[str, float] = {}
    refusal = _refusal(per_client)

    class LimitedProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _client: str | None = None
        _head_bytes = 0  # of the request whose line and headers are arriving
        _refused = False  # its head was too large: answered 431, closing

        def connection_made(self, transport):
            super().connection_made(transport)
            client = client_of(transport.get_extra_info("peername"))
            if per_client and held[client] >= per_client:
                transport.write(refusal)
                transport.close()
                on_refused()
                now = time.monotonic()
                if now - logged.get(client, -REFUSAL_LOG_S) >= REFUSAL_LOG_S:
                    logged[client] = now
                    log.warning("refusing connections from %s: it holds %d already (--max-connections-per-client)",
                                client, held[client])
                return
            self._client = client
            held[client] += 1
            parse = self.conn.next_event

            def next_event():  # uvicorn's only reader of h11's events
                event = parse()
                if isinstance(event, h11.Request) and head_bytes(event) > MAX_HEAD_BYTES:
                    self._refuse_head()
                    return h11.PAUSED  # uvicorn takes no more of this connection
                return event

            self.conn.next_event = next_event
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._client is None or self.transport.is_closing() or self._refused:
                return  # refused: closing
            in_head = self.conn.their_state is h11.IDLE
            super().data_received(data)
            if self._refused:
                return
            if in_head and self.conn.their_state is h11.IDLE:  # still no whole head
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    self._refuse_head()
                    return
            else:
                self._head_bytes = 0
            self._arm()

        def _refuse_head(self):
            self._refused = True
            self._disarm()
            self.transport.write(HEAD_TOO_LARGE)
            # its input read and dropped until the close, so that the client reads the 431, not a reset
            # (after uvicorn's pause for the PAUSED that follows a refusal in next_event)
            self.loop.call_soon(lambda: self.transport.is_closing() or self.transport.resume_reading())
            self.loop.call_later(LINGER_S, self.transport.close)
            now = time.monotonic()
            if now - logged_heads.get(self._client, -REFUSAL_LOG_S) >= REFUSAL_LOG_S:
                if len(logged_heads) > 10_000:
                    logged_heads.clear()
                logged_heads[self._client] = now
                log.warning("refusing a request from %s: its line and headers are over %d bytes (431)",
                            self._client, MAX_HEAD_BYTES)

        def connection_lost(self, exc):
            self._disarm()
            if self._client is not None:
                held[self._client] -= 1
                if not held[self._client]:
                    del held[self._client]
                    logged.pop(self._client, None)
            super().connection_lost(exc)

        def _waiting_for_headers(self) -> bool:
            # uvicorn makes a request's cycle once its headers are in; it is done once answered
            return self.cycle is None or self.cycle.response_complete

        def _arm(self):
            if not self._waiting_for_headers():
                self._disarm()
            elif self._header_timer is None:
                self._header_timer = self.loop.call_later(seconds, self._late)

        def _disarm(self):
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _late(self):
            self._header_timer = None
            if self._waiting_for_headers() and not self.transport.is_closing():
                self.transport.close()

    return LimitedProtocol
