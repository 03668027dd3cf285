"""HTTP API of `kaiyuan serve`: one engine under Megatron's text-generation contract (`PUT /api`, same request
fields and response shape as Megatron's server, so existing curl commands work; megatron/) and OpenAI's completions
contract (`POST /v1/completions` with streaming, `GET /v1/models`; openai/), plus `GET /health`. Every error, on
every path, is OpenAI's body {"error": {"message", "type", "param", "code"}}: a client's mistake a 4xx that says
what is wrong (400, or 401 / 404 / 408 / 413), never a 5xx. A 429 says the server holds as much work as it may
(retry later); a 503 that it is not serving: still warming up (GET /health says when it is ready) or shutting
down."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from .engine import GenerationEngine
from .envelope import new_token_limit
from .errors import AnswerWhenCancelled, APIError, BodyLimit, error_responses, install_error_handlers
from .megatron import api_router as megatron_router
from .openai import api_router as openai_router


def create_app(engine: GenerationEngine, api_token: str | None = None, max_body_bytes: int = 1 << 20,
               model_name: str = "kaiyuan", body_timeout_s: float = 30.0, max_tokens: int | None = None) -> FastAPI:
    """max_tokens: the most new tokens one request may ask for (default: the model's positions less one, at
    most 4096); the OpenAPI document states it."""
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(engine.close)  # after uvicorn's drain: whatever is left fails, the worker ends

    app = FastAPI(title="kaiyuan serve", version="1", description=__doc__, lifespan=lifespan,
                  responses=error_responses(408, 413, 500, 503))
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, timeout_s=body_timeout_s)
    app.add_middleware(AnswerWhenCancelled)  # outermost: a request cut off by the shutdown still gets its 503
    install_error_handlers(app)
    bearer = HTTPBearer(auto_error=False)
    limit = new_token_limit(engine.max_length, max_tokens)

    def authorize(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if api_token is None:
            return
        import secrets

        if creds is None or not secrets.compare_digest(creds.credentials.encode(), api_token.encode()):
            raise APIError(401, "missing or wrong bearer token", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    auth = [Depends(authorize)] if api_token is not None else []
    auth_errors = error_responses(401) if api_token is not None else {}

    @app.get("/health", responses={503: {"description": "Warming up, failed to start, or shutting down"}})
    async def health() -> Any:
        """200 once warm-up is done (the envelope, what warm-up took, the engine's counters, `unfinished`: the
        requests it holds, of at most `max_unfinished`); 503 before, and while shutting down."""
        status = ("failed" if engine.failure is not None else "draining" if engine.draining
                  else "ok" if engine.ready.is_set() else "warming_up")
        body = {"status": status, "model": model_name, "device": engine.device,
                "envelope": {"max_batch": engine.envelope.max_batch, "max_seq_len": engine.envelope.max_seq_len,
                             "decode_mode": engine.decoder.mode},
                "warmup": vars(engine.warmup) if engine.warmup is not None else None,
                "graphs_captured": engine.decoder.captures, "unfinished": engine.pending.held,
                "max_unfinished": engine.pending.limit, **engine.stats}
        return body if status == "ok" else JSONResponse(status_code=503, content=body)

    app.include_router(megatron_router.router(engine, limit, auth_errors), dependencies=auth)
    app.include_router(openai_router.router(engine, model_name, limit, auth_errors), dependencies=auth)

    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's document, less the 422 this server never answers (its validation errors are 400s), with
        the new-token limit (at most the positions less one prompt token; a longer prompt leaves fewer)."""
        if app.openapi_schema is None:
            schema = default_openapi()
            for path in schema["paths"].values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            models = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                models.pop(name, None)
            for model, field in (("CompletionRequest", "max_tokens"), ("MegatronGenerate", "tokens_to_generate")):
                prop = models[model]["properties"][field]
                for option in prop.get("anyOf", [prop]):
                    if option.get("type") == "integer":
                        option["maximum"] = limit
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app

