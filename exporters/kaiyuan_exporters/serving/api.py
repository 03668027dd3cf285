"""HTTP API of `kaiyuan serve`: Megatron's text-generation contract (`PUT /api`, same request fields and
response shape as Megatron's server, so existing curl commands work) and OpenAI's completions contract
(`POST /v1/completions` with streaming, `GET /v1/models`; completions.py). Every error, on every path, is
OpenAI's body {"error": {"message", "type", "param", "code"}}: a client's mistake a 4xx that says what is
wrong (400, or 401 / 404 / 408 / 413), never a 5xx. A 429 says the server holds as much work as it may (retry
later); a 503 that it is not serving: still warming up (GET /health says when it is ready) or shutting down."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from .completions import complete, submitted
from .engine import GenerationEngine, Request, Sampling
from .errors import AnswerWhenCancelled, APIError, BodyLimit, install_error_handlers
from .openai_schema import CompletionRequest, CompletionResponse, ModelCard, ModelList
from .schema import MAX_NEW_TOKENS, MegatronGenerate, MegatronResponse, error_responses

STREAM_DOC = {"description": "With stream: true, server-sent events: `data: <a CompletionResponse>` per piece "
                             "of text, then `data: [DONE]`; an error after the start is a last `data: "
                             "<an ErrorResponse>`", "schema": {"type": "string"}}


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
    started = int(time.time())
    limit = max(0, min(MAX_NEW_TOKENS, engine.max_length - 1, max_tokens if max_tokens is not None else 1 << 30))

    def authorize(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if api_token is None:
            return
        import secrets

        if creds is None or not secrets.compare_digest(creds.credentials.encode(), api_token.encode()):
            raise APIError(401, "missing or wrong bearer token", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    auth = [Depends(authorize)] if api_token is not None else []
    auth_errors = error_responses(401) if api_token is not None else {}

    def megatron_requests(body: MegatronGenerate, sampling: Sampling) -> list[Request]:
        if body.tokens_to_generate > limit:
            raise APIError(400, f"tokens_to_generate: at most {limit} here, got {body.tokens_to_generate}",
                           "tokens_to_generate")
        out = []
        for prompt in body.prompts:
            ids = engine.encode(prompt)
            if not ids:
                raise APIError(400, "prompts: an empty prompt has no token to continue", "prompts")
            if len(ids) + body.tokens_to_generate > engine.max_length:
                raise APIError(400, f"prompt of {len(ids)} tokens + {body.tokens_to_generate} new tokens "
                                    f"exceeds the {engine.max_length} positions served", "tokens_to_generate")
            if sampling.seed is not None:  # prompt i draws with seed + i: equal prompts still differ, as in one batch
                sampling = dataclasses.replace(sampling, seed=(body.random_seed + len(out)) % 2**64)
            out.append(Request(ids, body.tokens_to_generate, sampling, body.logprobs))
        return out

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

    @app.get("/v1/models", dependencies=auth, response_model=ModelList, responses=auth_errors)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model_name, created=started)])

    @app.get("/v1/models/{model}", dependencies=auth, response_model=ModelCard,
             responses=auth_errors | error_responses(404))
    async def model_card(model: str) -> ModelCard:
        if model != model_name:
            raise APIError(404, f"model {model!r} is not served here", "model", "model_not_found")
        return ModelCard(id=model_name, created=started)

    @app.put("/api", dependencies=auth, response_model=MegatronResponse, response_model_exclude_none=True,
             responses=auth_errors | error_responses(400, 429))
    async def megatron_api(body: MegatronGenerate, http: HttpRequest) -> dict[str, Any]:
        if body.tokens_to_generate == 0 and not body.logprobs:
            raise APIError(400, "tokens_to_generate=0 implies logprobs should be True", "logprobs")
        if body.top_k > 0 and body.top_p > 0:
            raise APIError(400, "cannot set both top-k and top-p samplings.", "top_p")
        sampling = Sampling(body.temperature, body.top_k, body.top_p or 1.0, body.random_seed)
        requests = await run_in_threadpool(megatron_requests, body, sampling)
        results = await submitted(engine, requests, http.receive)

        def response() -> dict[str, Any]:
            out: dict[str, Any] = {
                "text": [p + engine.decode(r.token_ids) for p, r in zip(body.prompts, results)],
                "segments": [[engine.decode([t]) for t in r.prompt_ids + r.token_ids] for r in results],
                "tokens": [r.prompt_ids + r.token_ids for r in results],
            }
            if body.logprobs:
                out["logprobs"] = [r.logprobs for r in results]
            return out

        return await run_in_threadpool(response)

    @app.post("/v1/completions", dependencies=auth, response_model=CompletionResponse,
              responses={200: {"content": {"text/event-stream": STREAM_DOC}}} | auth_errors
              | error_responses(400, 404, 429))
    async def completions(body: CompletionRequest, http: HttpRequest) -> Any:
        return await complete(engine, body, model_name, limit, http.receive)

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

