"""One error body everywhere (schema.ErrorResponse, OpenAI's shape) through FastAPI's exception handlers,
and the request-body limits as ASGI middleware: a body is read (Content-Length or chunked) up to
--max-body-bytes (then a 413) within --body-timeout-s (then a 408) before any route sees it."""

from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI, HTTPException
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .schema import ERROR_TYPES

log = logging.getLogger(__name__)


class APIError(HTTPException):
    """An answer with the error body: status, message, and the request field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(status_code=status, detail=message, headers=headers)
        self.param, self.code = param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(status, message, param, code), headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: HttpRequest, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        unicode = [e for e in errors if e.get("type") == "string_unicode"]  # JSON's lone surrogates (strict)
        parts, params = [], []
        for err in unicode[:1] or errors:
            # a union's members show in `loc` as type tags (constrained-str, list[int]): not field names
            loc = [str(p) for p in err.get("loc", ()) if p != "body" and not ("-" in str(p) or "[" in str(p))]
            where = ".".join(loc) or "body"
            msg = "not valid Unicode (a lone surrogate?)" if err in unicode else err.get("msg")
            params.append(where)
            parts.append(f"{where}: {msg}")
        return error_response(400, "; ".join(parts), params[0].split(".")[0] if params else None)

    @app.exception_handler(StarletteHTTPException)  # FastAPI's HTTPException (APIError) and routing's 404 / 405
    async def http_error(_request: HttpRequest, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "param", None),
                              getattr(exc, "code", None), exc.headers)

    @app.exception_handler(Exception)
    async def server_error(_request: HttpRequest, exc: Exception) -> JSONResponse:
        log.exception("request failed: %s", exc)
        return error_response(500, "internal error (see the server log)")


class BodyLimit:
    """Reads the whole request body before the app: at most `max_bytes` (declared or chunked) and within
    `timeout_s` from the first byte asked for; the app then receives it as one message."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float):
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        too_big = error_response(413, f"request body over {self.max_bytes} bytes")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await too_big(scope, receive, send)
            return
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                await error_response(408, f"request body not received within {self.timeout_s:g} s")(
                    scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await too_big(scope, receive, send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect a streaming response listens for
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)
