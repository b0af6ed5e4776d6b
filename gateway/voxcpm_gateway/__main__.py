"""python -m voxcpm_gateway [--triton-url 127.0.0.1:8001] [--host 127.0.0.1] [--port 9000] ..."""

from __future__ import annotations

import importlib.util
import logging
import sys

import uvicorn
import uvicorn.config

from .app import create_app
from .config import parse_args
from .connections import H11_MAX_INCOMPLETE_EVENT_SIZE, with_connection_limits
from .shutdown import UVICORN_GRACE_S, Server


def main(argv=None) -> int:
    settings = parse_args(argv)
    # Run as the console script, __main__ is that script, and every upload decoder (a child of a
    # forkserver, upload_decoder.py) would run it again, importing the whole gateway; as this
    # module, multiprocessing skips it.
    sys.modules["__main__"].__spec__ = importlib.util.find_spec("voxcpm_gateway.__main__")
    # uvicorn's names, trace included (a level of its own that Python's logging does not know)
    logging.basicConfig(level=uvicorn.config.LOG_LEVELS[settings.log_level], format="[gateway %(asctime)s] %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("voxcpm_gateway").info(
        "OpenAI speech API on http://%s:%d/v1 -> Triton gRPC %s (model name%s %s; API key %s)", settings.host,
        settings.port, settings.triton_url, "s" if len(settings.model_names) > 1 else "",
        ", ".join(settings.model_names), "required" if settings.api_key else "not required")
    # one process, one event loop: every request is a coroutine, the heavy encoders run in threads
    app = create_app(settings)
    protocol = with_connection_limits(settings.stall_timeout_s, settings.max_connections_per_client,
                                      app.state.metrics.connections_refused.inc)
    # ws="none": no route is a WebSocket, and an upgraded connection would leave the protocol that counts it
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            timeout_graceful_shutdown=settings.shutdown_timeout_s + UVICORN_GRACE_S, http=protocol,
                            ws="none", h11_max_incomplete_event_size=H11_MAX_INCOMPLETE_EVENT_SIZE)
    server = Server(config, app.state.drain)
    server.run()
    return 0 if server.started else 3  # as uvicorn.run: 3, it never started (a port in use)


if __name__ == "__main__":
    sys.exit(main())
