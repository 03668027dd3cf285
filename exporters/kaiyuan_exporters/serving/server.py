"""uvicorn for `kaiyuan serve`, with a stated shutdown: on SIGTERM (or SIGINT) the server stops accepting
connections at once, in-flight requests have `drain_s` seconds to finish, then the engine fails what is
left (a 503, or a stream's last error event) and the process exits (by the signal: uvicorn re-raises it
once shut down, so a supervisor sees SIGTERM); uvicorn's own grace period, a little longer, is the
backstop."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from .engine import GenerationEngine

BACKSTOP_S = 5.0  # after the engine's deadline: the failed requests' answers are written, connections close


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: GenerationEngine, drain_s: float):
        super().__init__(config)
        self.engine, self.drain_s = engine, drain_s

    def handle_exit(self, sig: int, frame: object) -> None:
        self.engine.drain(self.drain_s)  # before uvicorn's: /health says "draining", new requests a 503
        super().handle_exit(sig, frame)


def run(app: FastAPI, engine: GenerationEngine, host: str, port: int, drain_s: float) -> None:
    config = uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False,
                            timeout_graceful_shutdown=drain_s + BACKSTOP_S)
    DrainingServer(config, engine, drain_s).run()
