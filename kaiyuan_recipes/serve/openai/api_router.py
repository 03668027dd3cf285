"""OpenAI's routes: `POST /v1/completions` (serving.py), `GET /v1/models` (the one model served), and a 404 for
`POST /v1/chat/completions` that points at the completions route."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi import Request as HttpRequest

from ..engine import GenerationEngine
from ..errors import APIError, error_responses
from .protocol import CompletionRequest, CompletionResponse, ModelCard, ModelList
from .serving import complete

STREAM_DOC = {"description": "With stream: true, server-sent events: `data: <a CompletionResponse>` per piece "
                             "of text, then `data: [DONE]`; an error after the start is a last `data: "
                             "<an ErrorResponse>`", "schema": {"type": "string"}}


def router(engine: GenerationEngine, model_name: str, limit: int, auth_errors: dict) -> APIRouter:
    """limit: the most new tokens one request may ask for (envelope.new_token_limit)."""
    routes = APIRouter()
    started = int(time.time())

    @routes.get("/v1/models", response_model=ModelList, responses=auth_errors)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model_name, created=started)])

    @routes.get("/v1/models/{model}", response_model=ModelCard, responses=auth_errors | error_responses(404))
    async def model_card(model: str) -> ModelCard:
        if model != model_name:
            raise APIError(404, f"model {model!r} is not served here", "model", "model_not_found")
        return ModelCard(id=model_name, created=started)

    @routes.post("/v1/completions", response_model=CompletionResponse,
                 responses={200: {"content": {"text/event-stream": STREAM_DOC}}} | auth_errors
                 | error_responses(400, 404, 429))
    async def completions(body: CompletionRequest, http: HttpRequest) -> Any:
        return await complete(engine, body, model_name, limit, http.receive)

    @routes.post("/v1/chat/completions", include_in_schema=False)
    async def chat_completions() -> Any:
        """OpenAI's chat contract is not served (a base model, no chat template): a 404 that says what is."""
        raise APIError(404, "/v1/chat/completions is not served: this server serves a base model (no chat "
                            "template); send a prompt to POST /v1/completions", code="unknown_url")

    return routes
