"""Megatron's route: `PUT /api` (serving.py), so existing Megatron curl commands work."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi import Request as HttpRequest

from ..engine import GenerationEngine
from ..errors import error_responses
from .protocol import MegatronGenerate, MegatronResponse
from .serving import generate


def router(engine: GenerationEngine, limit: int, auth_errors: dict) -> APIRouter:
    """limit: the most new tokens one request may ask for (envelope.new_token_limit)."""
    routes = APIRouter()

    @routes.put("/api", response_model=MegatronResponse, response_model_exclude_none=True,
                responses=auth_errors | error_responses(400, 429))
    async def megatron_api(body: MegatronGenerate, http: HttpRequest) -> dict[str, Any]:
        return await generate(engine, body, limit, http.receive)

    return routes
