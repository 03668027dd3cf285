"""uvicorn for `kaiyuan serve`, with a stated shutdown and bounded connections.

Shutdown: on SIGTERM (or SIGINT) the server stops accepting connections at once, in-flight requests have
`drain_s` seconds to finish, then the engine fails what is left (a JSON 503, or a stream's last error event)
and the process exits (by the signal: uvicorn re-raises it once shut down, so a supervisor sees SIGTERM);
uvicorn's own grace period, BACKSTOP_S longer, is the backstop, and a request it cuts off still gets the JSON
503 (errors.AnswerWhenCancelled).

Connections: the listening socket is bound before the model loads (a port in use or out of range is a one-line
error, not uvicorn's exit mid-start-up); a connection idle after an answer closes after `idle_s` (uvicorn's
keep-alive timeout), and one that has not sent a whole request head (request line and headers, at most
MAX_HEAD_BYTES) within `head_s` of connecting or of its last answer is closed (HeadTimeoutProtocol): uvicorn
times out only the idle wait, so a client sending part of a head and nothing more would hold its connection
until shutdown."""

from __future__ import annotations

import asyncio
import logging
import socket

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from .engine import GenerationEngine

BACKSTOP_S = 5.0  # after the engine's deadline: the failed requests' answers are written, connections close
MAX_HEAD_BYTES = 64 * 1024  # a request line and headers larger than this are a 400 (h11's limit; its default 16 KiB)
log = logging.getLogger(__name__)


class HeadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request head within `head_s` of
    connecting or of its last answer (while a request is being answered, nothing is timed here)."""

    head_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_s, self._head_timeout, self.cycle)

    def _head_timeout(self, cycle_then: object) -> None:
        answering = self.cycle is not None and not self.cycle.response_complete
        if self.cycle is cycle_then and not answering and not self.transport.is_closing():
            self.transport.close()  # no request began since the timer was armed

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()  # the next request's head is timed from here

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket on host:port, bound now; a ValueError that says why it cannot be."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port}: a port is 0 to 65535")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as err:
        sock.close()
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ValueError(f"--host {host} --port {port}: cannot listen there: {reason}") from None
    return sock


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: GenerationEngine, drain_s: float):
        super().__init__(config)
        self.engine, self.drain_s = engine, drain_s

    def handle_exit(self, sig: int, frame: object) -> None:
        self.engine.drain(self.drain_s)  # before uvicorn's: /health says "draining", new requests a 503
        super().handle_exit(sig, frame)


def run(app: FastAPI, engine: GenerationEngine, sock: socket.socket, drain_s: float, head_s: float = 10.0,
        idle_s: float = 5.0) -> None:
    protocol = type("HeadTimeout", (HeadTimeoutProtocol,), {"head_s": head_s})
    config = uvicorn.Config(app, log_level="info", access_log=False, timeout_graceful_shutdown=drain_s + BACKSTOP_S,
                            timeout_keep_alive=idle_s, http=protocol, h11_max_incomplete_event_size=MAX_HEAD_BYTES)
    host, port = sock.getsockname()[:2]
    log.info("serving on http://%s:%d", f"[{host}]" if ":" in host else host, port)
    DrainingServer(config, engine, drain_s).run(sockets=[sock])
