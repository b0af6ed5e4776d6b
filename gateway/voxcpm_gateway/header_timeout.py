"""A connection must finish a request's headers in time.

uvicorn times out an idle keep-alive connection, but not one that has sent part of a request's
headers: such a connection (a slow-loris client) is held open for good, and enough of them use up
the gateway's file descriptors. This protocol, uvicorn's own (httptools or h11) otherwise, closes a
connection whose request headers are not complete `seconds` after it opened or after it began
waiting for its next request; a body that stops arriving is `guards`' to time out.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.auto import AutoHTTPProtocol


def with_header_timeout(seconds: float) -> type[asyncio.Protocol]:
    class HeaderTimeoutProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._arm()

        def connection_lost(self, exc):
            self._disarm()
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

    return HeaderTimeoutProtocol
