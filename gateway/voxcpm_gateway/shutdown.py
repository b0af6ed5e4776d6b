"""The gateway's shutdown as its speech responses see it.

At SIGTERM uvicorn stops taking connections and waits for the responses in flight, up to its
graceful timeout; then it cancels them and raises the signal again at once, so a cancelled response
never gets to say why: an SSE stream lost the `error` event the API promises. Instead each speech
response ends itself `timeout_s` after the signal (`Drain.over`), and the voice routes' waits for
Triton and for an upload's decoding end then too (`Drain.run`), each with a 503; uvicorn's own
timeout is set a little later (`UVICORN_GRACE_S`).
"""

from __future__ import annotations

import asyncio
import time

import uvicorn

from . import errors

UVICORN_GRACE_S = 5.0  # uvicorn's cancel comes this long after the responses' own end


class Drain:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._begun: float | None = None
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def begin(self):
        """The shutdown has begun (a signal handler's call: it may come between any two statements)."""
        if self._begun is None:
            self._begun = time.monotonic()
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._event.set)

    async def over(self):
        """Return once the shutdown's drain time is up (never, without a shutdown)."""
        self._loop = asyncio.get_running_loop()
        if self._begun is None:
            await self._event.wait()
        await asyncio.sleep(max(0.0, self._begun + self.timeout_s - time.monotonic()))

    async def run(self, awaitable):
        """What `awaitable` gives; if the drain time is up first, it is cancelled and the caller gets
        a 503 (an APIError) instead of uvicorn's cancel."""
        work, end = asyncio.ensure_future(awaitable), asyncio.ensure_future(self.over())
        try:
            await asyncio.wait({work, end}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            end.cancel()
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
        if work.cancelled():
            raise errors.shutting_down()
        return work.result()


class Server(uvicorn.Server):
    """uvicorn's server, which tells `drain` when a signal asks it to stop."""

    def __init__(self, config: uvicorn.Config, drain: Drain):
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig, frame):
        self.drain.begin()
        super().handle_exit(sig, frame)
