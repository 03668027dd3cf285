"""The server's attention: transformers' SDPA attention, except in a decode step of a grouped-query model.

transformers' SDPA path hands grouped-query attention to torch (`enable_gqa`) only without a mask; with one, as in
every decode step of the batch decoder (each row attends to its own columns), it first copies the keys and values
of the whole window from the KV heads to every query head (`repeat_kv`), in every layer, every step. In a decode
step each row has one query position, so the query heads that share a KV head can instead be that head's query
rows: [batch, kv heads, heads per kv head, head dim] against the keys and values as they are, the row's mask
broadcast over them. Registered with transformers' AttentionInterface (and its SDPA mask, so the prefill and
every full forward stay exactly transformers' SDPA) under ATTENTION."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

# "sdpa" in the name: transformers checks a model's SDPA support for names holding it, so a model without (e.g.
# one with attention sinks) is still refused at load rather than served without what SDPA cannot do
ATTENTION = "kaiyuan_grouped_sdpa"


def grouped_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           **kwargs: Any) -> tuple[torch.Tensor, None]:
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, positions, dim = query.shape
    if (positions != 1 or groups == 1 or attention_mask is None or dropout or key.shape[1] * groups != heads
            or attention_mask.shape[1] != 1):  # one position, one mask for all heads: else SDPA as transformers
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    # query head h reads KV head h // groups (repeat_kv's order): a KV head's query heads are consecutive
    rows = query.view(batch, heads // groups, groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def register() -> str:
    """ATTENTION, registered (again: idempotent); pass it as from_pretrained's attn_implementation."""
    AttentionInterface.register(ATTENTION, grouped_sdpa_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION
