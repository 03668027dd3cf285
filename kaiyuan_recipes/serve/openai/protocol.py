"""OpenAI's completions contract (`POST /v1/completions`, `GET /v1/models`) as pydantic models: what the
server accepts and what it answers. Every field of OpenAI's completions request is known here; the ones
this server cannot honour (best_of > 1, suffix, logit_bias, presence / frequency penalties) are a 400 that
names the field when set to anything but their neutral value, and so is any field OpenAI does not define
(top_k is this server's one extension). A null is the field's default, as in OpenAI's API."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from ..envelope import MAX_NEW_TOKENS, MAX_PROMPTS, MAX_SEED, check_temperature, encodable

MAX_LOGPROBS = 20  # OpenAI allows 5; vLLM's default limit is 20
MAX_STOPS = 16  # OpenAI allows 4; lm-evaluation-harness may send more (its `until` plus end-of-text)
TokenId = Annotated[StrictInt, Field(ge=0)]
Text = Annotated[str, Field(min_length=1)]
Prompt = Text | list[Text] | list[TokenId] | list[list[TokenId]]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # JSON's types: "5" is not a number, false not 0
    model: str | None = Field(None, description="the served model's name (GET /v1/models); null: that one")
    prompt: Prompt = Field(description="a string, a list of strings, a token-id list or a list of token-id lists")
    max_tokens: int | None = Field(16, ge=0, le=MAX_NEW_TOKENS, description="0 with echo: score the prompt only")
    temperature: float | None = Field(1.0, ge=0.0, le=100.0, description="0: greedy")
    top_p: float | None = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(0, ge=0, le=1000, description="extension: 0 means no top-k filtering")
    n: int | None = Field(1, ge=1, le=MAX_PROMPTS)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Text | Annotated[list[Text], Field(max_length=MAX_STOPS)] | None = Field(
        None, description="up to 16 strings; the text ends before the first")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="top alternatives per token")
    echo: bool | None = False
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    best_of: int | None = Field(None, ge=1, le=1, description="only 1 (no server-side best-of ranking)")
    suffix: str | None = Field(None, max_length=0, description="not supported: null or empty only")
    logit_bias: dict[str, float] | None = Field(None, max_length=0, description="not supported: null or {}")
    presence_penalty: float | None = Field(0.0, ge=0.0, le=0.0, description="not supported: 0 only")
    frequency_penalty: float | None = Field(0.0, ge=0.0, le=0.0, description="not supported: 0 only")
    user: str | None = Field(None, description="an end-user id (accepted; not used)")

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, v: object) -> object:
        """The prompt's shape and token ids, each fault named where it is (pydantic's own error for a union lists
        every member's complaint)."""
        def token(x: object) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        if isinstance(v, str) or not isinstance(v, list):
            return v  # a string, or not a prompt at all (the union's error)
        if all(token(t) for t in v):
            rows = [("prompt", v)]
        elif all(isinstance(p, list) and all(token(t) for t in p) for p in v):
            rows = [(f"prompt[{i}]", p) for i, p in enumerate(v)]
        elif all(isinstance(p, str) for p in v):
            return v
        else:
            raise ValueError("prompt: a string, a list of strings, a list of token ids or a list of token-id lists")
        for where, ids in rows:
            for j, t in enumerate(ids):
                if t < 0:
                    raise ValueError(f"{where}[{j}]: token id {t}: token ids are 0 or more")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Prompt) -> Prompt:
        if isinstance(v, str):
            return encodable(v, "prompt")
        if v and isinstance(v[0], int):
            return v  # one prompt of token ids (its length is checked against the model's positions)
        if not 1 <= len(v) <= MAX_PROMPTS:
            raise ValueError(f"1 to {MAX_PROMPTS} prompts")
        for i, p in enumerate(v):
            if isinstance(p, str):
                encodable(p, f"prompt[{i}]")
            elif isinstance(p, list) and not p:
                raise ValueError(f"prompt[{i}]: an empty token list")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        for i, s in enumerate([v] if isinstance(v, str) else v or []):
            encodable(s, f"stop[{i}]")
        return v

    _temperature = field_validator("temperature")(classmethod(lambda cls, v: check_temperature(v)))

    @model_validator(mode="after")
    def _defaults(self) -> CompletionRequest:
        """null is the default (stream_options without stream has nothing to apply to)."""
        for name in ("max_tokens", "temperature", "top_p", "top_k", "n", "stream", "echo"):
            if getattr(self, name) is None:
                setattr(self, name, type(self).model_fields[name].default)
        if self.stream and self.logprobs is not None:
            raise ValueError("logprobs: not supported with stream: true (ask without streaming)")
        return self

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def prompts(self) -> list[str | list[int]]:
        if isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int)):
            return [self.prompt]  # type: ignore[list-item]
        return list(self.prompt)  # type: ignore[arg-type]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None] = Field(description="natural log; with echo the prompt's first is null")
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = Field(
        description="stop: end of text or a stop string; length: max_tokens; null in a stream until the end")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    """The answer, and (with stream: true) each server-sent event's data, until `data: [DONE]`."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kaiyuan"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
