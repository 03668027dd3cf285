"""HTTP API of `kaiyuan serve`: Megatron's text-generation contract (`PUT /api`, same request fields and
response shape as Megatron's server, so existing curl commands work) and OpenAI-compatible
`POST /v1/completions` with streaming. Bad input is a 400 with a message; bodies over the size limit a 413."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from typing import Any

from fastapi import Depends, FastAPI, HTTPException
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kaiyuan_exporters.serving.engine import GenerationEngine, Request, Sampling

MAX_PROMPTS = 128  # Megatron's limit
MAX_NEW_TOKENS = 4096
MAX_SEED = 2**64 - 1  # torch.manual_seed's range
# Below this a sampled temperature overflows the logits (x / t is inf in fp32 near 1e-38): 0 means greedy.
MIN_TEMPERATURE = 1e-4


def _encodable(text: str, field: str) -> str:
    """A JSON string may hold a lone surrogate (\\ud800), which no tokenizer can encode: a 400, not a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{field}: not valid Unicode (a lone surrogate at character {err.start})") from None
    return text


def _temperature(value: float) -> float:
    if 0.0 < value < MIN_TEMPERATURE:
        raise ValueError(f"temperature: 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {value!r}")
    return value


class MegatronGenerate(BaseModel):
    """Megatron's `PUT /api` request."""

    model_config = ConfigDict(extra="ignore")
    prompts: list[str] = Field(min_length=1, max_length=MAX_PROMPTS)
    tokens_to_generate: int = Field(64, ge=0, le=MAX_NEW_TOKENS)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_k: int = Field(0, ge=0, le=1000)
    top_p: float = Field(0.0, ge=0.0, le=1.0)  # Megatron: 0 means "off"
    logprobs: bool = False
    random_seed: int | None = Field(None, ge=0, le=MAX_SEED)

    @field_validator("prompts")
    @classmethod
    def _unicode(cls, v: list[str]) -> list[str]:
        return [_encodable(p, f"prompts[{i}]") for i, p in enumerate(v)]

    _temperature = field_validator("temperature")(classmethod(lambda cls, v: _temperature(v)))


class CompletionRequest(BaseModel):
    """OpenAI `POST /v1/completions` (the fields this server honours)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | list[str]
    max_tokens: int = Field(16, ge=0, le=MAX_NEW_TOKENS)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=1000)
    stream: bool = False
    seed: int | None = Field(None, ge=0, le=MAX_SEED)

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and not 1 <= len(v) <= MAX_PROMPTS:
            raise ValueError(f"prompt: 1 to {MAX_PROMPTS} strings")
        if isinstance(v, str):
            return _encodable(v, "prompt")
        return [_encodable(p, f"prompt[{i}]") for i, p in enumerate(v)]

    _temperature = field_validator("temperature")(classmethod(lambda cls, v: _temperature(v)))


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "code": status}})


def create_app(engine: GenerationEngine, api_token: str | None = None, max_body_bytes: int = 1 << 20,
               model_name: str = "kaiyuan") -> FastAPI:
    app = FastAPI(title="kaiyuan serve", version="1", description=__doc__)
    bearer = HTTPBearer(auto_error=False)

    def authorize(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if api_token is None:
            return
        if creds is None or not secrets.compare_digest(creds.credentials.encode(), api_token.encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    @app.middleware("http")
    async def limit_body(request: HttpRequest, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body_bytes):
            return _error(413, f"request body over {max_body_bytes} bytes")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: HttpRequest, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
            parts.append(f"{where}: {err.get('msg')}")
        return _error(400, "; ".join(parts))

    @app.exception_handler(HTTPException)
    async def http_error(_request: HttpRequest, exc: HTTPException) -> JSONResponse:
        response = _error(exc.status_code, str(exc.detail))
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response

    def requests_for(prompts: list[str], max_new: int, sampling: Sampling, logprobs: bool = False) -> list[Request]:
        out = []
        for prompt in prompts:
            ids = engine.encode(prompt)
            if not ids:
                raise HTTPException(status_code=400, detail="prompts: an empty prompt has no token to continue")
            if len(ids) + max_new > engine.max_length:
                raise HTTPException(status_code=400, detail=f"prompt of {len(ids)} tokens + {max_new} new tokens "
                                                            f"exceeds the model's {engine.max_length} positions")
            out.append(Request(ids, max_new, sampling, logprobs))
        return out

    async def run(requests: list[Request]) -> list[Any]:
        futures = [asyncio.wrap_future(engine.submit(r)) for r in requests]
        return await asyncio.gather(*futures)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "device": engine.device, **engine.stats}

    @app.put("/api", dependencies=[Depends(authorize)])
    async def megatron_api(body: MegatronGenerate) -> dict[str, Any]:
        if body.tokens_to_generate == 0 and not body.logprobs:
            raise HTTPException(status_code=400, detail="tokens_to_generate=0 implies logprobs should be True")
        if body.top_k > 0 and body.top_p > 0:
            raise HTTPException(status_code=400, detail="cannot set both top-k and top-p samplings.")
        sampling = Sampling(body.temperature, body.top_k, body.top_p or 1.0, body.random_seed)
        results = await run(requests_for(body.prompts, body.tokens_to_generate, sampling, body.logprobs))
        response: dict[str, Any] = {
            "text": [p + engine.decode(r.token_ids) for p, r in zip(body.prompts, results)],
            "segments": [[engine.decode([t]) for t in r.prompt_ids + r.token_ids] for r in results],
            "tokens": [r.prompt_ids + r.token_ids for r in results],
        }
        if body.logprobs:
            response["logprobs"] = [r.logprobs for r in results]
        return response

    @app.post("/v1/completions", dependencies=[Depends(authorize)], response_model=None)
    async def completions(body: CompletionRequest) -> dict[str, Any] | StreamingResponse:
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        sampling = Sampling(body.temperature, body.top_k, body.top_p, body.seed)
        requests = requests_for(prompts, body.max_tokens, sampling)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            return StreamingResponse(stream(requests, cid, created), media_type="text/event-stream")
        results = await run(requests)
        choices = [{"index": i, "text": engine.decode(r.token_ids), "logprobs": None, "finish_reason": r.finish_reason}
                   for i, r in enumerate(results)]
        used = sum(len(r.prompt_ids) for r in results), sum(len(r.token_ids) for r in results)
        return {"id": cid, "object": "text_completion", "created": created, "model": model_name, "choices": choices,
                "usage": {"prompt_tokens": used[0], "completion_tokens": used[1], "total_tokens": sum(used)}}

    async def stream(requests: list[Request], cid: str, created: int):
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue = asyncio.Queue()
        for index, req in enumerate(requests):
            req.on_token = lambda t, i=index: loop.call_soon_threadsafe(tokens.put_nowait, (i, t))
        done = asyncio.ensure_future(run(requests))
        emitted = [[] for _ in requests]  # decode incrementally: a multi-byte character may span tokens
        texts = ["" for _ in requests]

        def chunk(index: int, text: str, finish: str | None) -> str:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
            return "data: " + json.dumps({"id": cid, "object": "text_completion", "created": created,
                                          "model": model_name, "choices": [choice]}) + "\n\n"

        while not (done.done() and tokens.empty()):
            try:
                index, token = await asyncio.wait_for(tokens.get(), timeout=0.05)
            except asyncio.TimeoutError:
                continue
            emitted[index].append(token)
            text = engine.decode(emitted[index])
            if text.endswith("\ufffd"):
                continue
            yield chunk(index, text[len(texts[index]):], None)
            texts[index] = text
        try:
            results = await done
        except Exception as err:  # noqa: BLE001  (headers are sent: the stream ends with an error event)
            import logging

            logging.getLogger(__name__).exception("generation failed inside a stream: %s", err)
            error = {"message": "generation failed (see the server log)", "code": 500}
            yield "data: " + json.dumps({"error": error}) + "\n\n"
            return
        for index, result in enumerate(results):
            yield chunk(index, engine.decode(result.token_ids)[len(texts[index]):], result.finish_reason)
        yield "data: [DONE]\n\n"

    return app
