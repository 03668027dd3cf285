"""Megatron's `PUT /api` request and response, as pydantic models (the fields and shape of Megatron's server)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..envelope import MAX_NEW_TOKENS, MAX_PROMPTS, MAX_SEED, check_temperature, encodable


class MegatronGenerate(BaseModel):
    """Megatron's `PUT /api` request (fields Megatron's server does not know are ignored, as there)."""

    model_config = ConfigDict(extra="ignore", strict=True)  # as Megatron's server: ints are ints, floats numbers
    prompts: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1, max_length=MAX_PROMPTS)
    tokens_to_generate: int = Field(64, ge=0, le=MAX_NEW_TOKENS)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_k: int = Field(0, ge=0, le=1000)
    top_p: float = Field(0.0, ge=0.0, le=1.0)  # Megatron: 0 means "off"
    logprobs: bool = False
    random_seed: int | None = Field(None, ge=0, le=MAX_SEED)

    @field_validator("prompts")
    @classmethod
    def _unicode(cls, v: list[str]) -> list[str]:
        return [encodable(p, f"prompts[{i}]") for i, p in enumerate(v)]

    _temperature = field_validator("temperature")(classmethod(lambda cls, v: check_temperature(v)))


class MegatronResponse(BaseModel):
    text: list[str]
    segments: list[list[str]]
    tokens: list[list[int]]
    logprobs: list[list[float]] | None = Field(None, description="only when the request asked for logprobs")
