"""Request validation shared by both contracts, Megatron's `PUT /api` request, and the one error body every
answer other than a 200 carries (OpenAI's: {"error": {"message", "type", "param", "code"}})."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_PROMPTS = 128  # Megatron's limit; also prompts x n of one OpenAI request
MAX_NEW_TOKENS = 4096
# Within torch.manual_seed's range (2**64 - 1) and exact in the OpenAPI document: JSON numbers are doubles,
# and 2**64 - 1 written as one reads 2**64, so the document would promise a seed the server refuses.
MAX_SEED = 2**53 - 1
# Below this a sampled temperature overflows the logits (x / t is inf in fp32 near 1e-38): 0 means greedy.
MIN_TEMPERATURE = 1e-4


def encodable(text: str, field: str) -> str:
    """A JSON string may hold a lone surrogate (\\ud800), which no tokenizer can encode: a 400, not a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{field}: not valid Unicode (a lone surrogate at character {err.start})") from None
    return text


def check_temperature(value: float | None) -> float | None:
    if value is not None and 0.0 < value < MIN_TEMPERATURE:
        raise ValueError(f"temperature: 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {value!r}")
    return value


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
