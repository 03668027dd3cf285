"""The request envelope, checked here for both contracts: the limits of one request's fields (the pydantic
models of openai/protocol.py and megatron/protocol.py state them) and, once its prompts are tokens, that they fit
the positions the engine serves with the new tokens asked for. Every fault is a 400 naming the field."""

from __future__ import annotations

from .errors import APIError

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


def new_token_limit(max_length: int, max_tokens: int | None = None) -> int:
    """The most new tokens one request may ask for: the served positions less one (a prompt has a token), at most
    MAX_NEW_TOKENS and `max_tokens` (kaiyuan serve --max-tokens)."""
    return max(0, min(MAX_NEW_TOKENS, max_length - 1, max_tokens if max_tokens is not None else 1 << 30))


def check_new_tokens(asked: int, limit: int, field: str) -> None:
    """`field` (max_tokens, tokens_to_generate) within the limit new_token_limit gave."""
    if asked > limit:
        raise APIError(400, f"{field}: at most {limit} here, got {asked}", field)


def check_prompt(ids: list[int], new_tokens: int, max_length: int, where: str, field: str, prompt_field: str) -> None:
    """One prompt's tokens: at least one (the first new token continues it), and with `new_tokens` (the request's
    `field`) within the `max_length` positions served. `where` names the prompt in the message."""
    if not ids:
        raise APIError(400, f"{where}: an empty prompt has no token to continue", prompt_field)
    if len(ids) + new_tokens > max_length:
        raise APIError(400, f"{where}: {len(ids)} tokens + {field} {new_tokens} exceeds the {max_length} positions "
                            "served", field)
