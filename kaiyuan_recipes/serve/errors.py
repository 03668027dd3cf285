"""One error body everywhere (ErrorResponse, OpenAI's: {"error": {"message", "type", "param", "code"}}) through
FastAPI's exception handlers, and the request-body limits as ASGI middleware: a body is read (Content-Length or
chunked) up to --max-body-bytes (then a 413) within --body-timeout-s (then a 408) before any route sees it."""

from __future__ import annotations

import asyncio
import logging
import sys

from fastapi import FastAPI, HTTPException
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, ... server_error")
    param: str | None = Field(None, description="the request field at fault, where one is")
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 408: "timeout_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "server_error", 503: "server_error"}


def error_responses(*statuses: int) -> dict[int | str, dict]:
    """OpenAPI `responses` for these error statuses, all with the error body."""
    words = {400: "Bad request: the message names the field", 401: "Missing or wrong bearer token",
             404: "Unknown model or path", 408: "The request body did not arrive in time",
             413: "Request body over --max-body-bytes",
             429: "The server holds as much work as it may (--max-queue): retry later", 500: "Server error",
             503: "Warming up, or shutting down"}
    return {s: {"model": ErrorResponse, "description": words.get(s, "Error")} for s in statuses}


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


# How pydantic names a union's member in an error's location (str, list[int], constrained-str, function-after[..]):
# not a field of the request
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _is_tag(part: str) -> bool:
    return part in _TYPE_TAGS or any(c in part for c in "[-(")


def _path(err: dict) -> list[str | int]:
    """The error's location in the request as the client wrote it: field names and list indices (FastAPI's
    leading "body" and a union's member tags left out; an unknown key is named whatever its characters)."""
    loc = list(err.get("loc", ()))
    if loc[:1] == ["body"]:
        loc = loc[1:]
    unknown = err.get("type") == "extra_forbidden"
    return [p for i, p in enumerate(loc)
            if isinstance(p, int) or (unknown and i == len(loc) - 1) or not _is_tag(str(p))]


def _spelled(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def validation_message(errors: list[dict]) -> tuple[str, str]:
    """(message, param) for pydantic's errors of one request: each names its field (`prompt[1]`,
    `stream_options.x-y`, `body` for one that is not JSON or not an object); of a union's complaints about one
    field, the most specific (deepest) ones; a validator's own message as it wrote it."""
    unicode = [e for e in errors if e.get("type") == "string_unicode"]  # JSON's lone surrogates (strict)
    chosen = unicode[:1] or errors
    if any(e.get("type") == "json_invalid" for e in chosen):
        err = next(e for e in chosen if e.get("type") == "json_invalid")
        reason = (err.get("ctx") or {}).get("error", "JSON decode error")
        at = err["loc"][-1] if isinstance(err.get("loc", [None])[-1], int) else None
        return f"body: not valid JSON ({reason}{f' at character {at}' if at is not None else ''})", "body"
    deepest: dict[str, int] = {}
    for err in chosen:
        path = _path(err)
        top = str(path[0]) if path else "body"
        deepest[top] = max(deepest.get(top, 0), len(path))
    parts, params = [], []
    for err in chosen:
        path = _path(err)
        top = str(path[0]) if path else "body"
        if len(path) < deepest[top]:
            continue
        where = _spelled(path)
        if err in unicode:
            text = "not valid Unicode (a lone surrogate?)"
        elif err.get("type") == "value_error":
            text = str((err.get("ctx") or {}).get("error", err.get("msg")))
        elif err.get("type") == "extra_forbidden":
            text = "unknown field"
        elif where == "body" and err.get("type") in ("missing", "model_attributes_type", "dict_type"):
            text = "a JSON object is required" + (" (the body is empty)" if err.get("type") == "missing" else "")
        else:
            text = str(err.get("msg"))
        named = text.split(":", 1)[0].split("[", 1)[0] if ":" in text else ""
        if top == "body" and named.isidentifier():
            top = named  # a rule over several fields names the one at fault in its message
        message = text if named and named == top else f"{where}: {text}"
        if message not in parts:
            parts.append(message)
            params.append(top)
    return "; ".join(parts), params[0] if params else "body"


def unparsable(cause: Exception) -> str:
    """Why a body that FastAPI read failed to decode as JSON, where json says no position (FastAPI answers all of
    these with one bare message)."""
    if isinstance(cause, UnicodeDecodeError):
        return f"not UTF-8 at byte {cause.start}"
    if isinstance(cause, RecursionError):
        return "nested too deeply"
    if isinstance(cause, ValueError) and "digits" in str(cause):  # Python's limit on an integer's digits
        return f"an integer of more than {sys.get_int_max_str_digits()} digits"
    return type(cause).__name__


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: HttpRequest, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)  # FastAPI's HTTPException (APIError) and routing's 404 / 405
    async def http_error(_request: HttpRequest, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and not isinstance(exc, APIError) and isinstance(exc.__cause__, Exception):
            # FastAPI's own "error parsing the body": JSON it could not decode but for a JSONDecodeError
            return error_response(400, f"body: not valid JSON ({unparsable(exc.__cause__)})", "body")
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


class AnswerWhenCancelled:
    """A request whose handler is cancelled before it answered (uvicorn cancels what is still running when its
    graceful shutdown runs out) gets the JSON 503 of a shutdown rather than uvicorn's plain-text 500. The
    cancellation has done its work, the handler is gone: it is not raised again, so the connection closes
    after the answer without an error in the log."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if started:  # a stream under way: its connection closes
                raise
            await error_response(503, "the server shut down before the request finished",
                                 code="shutting_down")(scope, receive, send)
