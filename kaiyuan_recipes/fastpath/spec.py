"""The fast spec: Megatron's local layer spec (no Transformer Engine) with core attention through PyTorch's
scaled-dot-product attention (flash / cuDNN / memory-efficient kernels: causal, GQA without repeated K/V, no
O(s²) score tensor), megatron-core's TE-free fusions turned back on (FAST_SPEC_SETTINGS: SwiGLU, bias-dropout-add,
the vocab-parallel cross-entropy, each a torch.compile'd function in megatron.core.fusions), RoPE as one compiled
kernel through Megatron's fused-RoPE hook, compiled RMSNorm (compiled_norm.py) and grouped-GEMM MoE experts
(grouped_experts.py). Which pieces run is decided in fastpath/decisions.py; measurements: benchmarks/README.md."""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.jit import jit_fuser
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from kaiyuan_recipes.config.knobs import SDPA_BACKENDS

# kaiyuan.sdpa_backend: which SDPA kernels to try first, the rest kept as fallbacks. cuDNN's attention is
# the faster one on Hopper in NVIDIA's numbers, but below flash in torch's default priority.
_sdpa_priority: list | None = None


def set_sdpa_backend(name: str) -> None:
    """Process-wide, like Megatron's fused-RoPE hook below: set by fastpath.apply from the run's plan."""
    from torch.nn.attention import SDPBackend

    global _sdpa_priority
    if name not in SDPA_BACKENDS:
        raise ValueError(f"kaiyuan.sdpa_backend: expected one of {SDPA_BACKENDS}, got {name!r}")
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
             SDPBackend.MATH]
    first = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}.get(name)
    _sdpa_priority = None if first is None else [first, *(b for b in order if b != first)]


# Fusions megatron-core implements with its jit_fuser (torch.compile); the local spec's settings turn them off.
FAST_SPEC_SETTINGS = dict(bias_activation_fusion=True, bias_dropout_fusion=True, cross_entropy_loss_fusion=True,
                          cross_entropy_fusion_impl="native", apply_rope_fusion=True)


@jit_fuser
def _rope_bshd(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """megatron-core's _apply_rotary_pos_emb_bshd with cos / sin given (already in t's dtype, as it casts them)."""
    rot_dim = cos.shape[-1]
    t, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    t = (t * cos) + (rope_utils._rotate_half(t, interleaved) * sin)
    return torch.cat((t, t_pass), dim=-1)


# cos / sin of the RoPE angles, per angle tensor and dtype. Megatron's RotaryEmbedding.forward is lru_cached, so
# every layer of every step gets the same `freqs` tensor: computed once here instead of in each of the 2 x layers
# RoPE kernels a micro-batch (where the compiled kernel spent more time on sin / cos than on memory).
_trig: dict[tuple[int, torch.dtype], tuple[Any, int, torch.Tensor, torch.Tensor]] = {}


def _cos_sin(freqs: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    key = (id(freqs), dtype)
    hit = _trig.get(key)
    if hit is not None and hit[0]() is freqs and hit[1] == freqs._version:
        return hit[2], hit[3]
    for stale in [k for k, v in _trig.items() if v[0]() is None]:  # angle tensors since freed
        del _trig[stale]
    with torch.no_grad():
        cos, sin = torch.cos(freqs).to(dtype), torch.sin(freqs).to(dtype)
    if not (freqs.is_cuda and torch.cuda.is_current_stream_capturing()):  # captured kernels have not run yet
        _trig[key] = (weakref.ref(freqs), freqs._version, cos, sin)
    return cos, sin


def compiled_rope(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """TE's fused_apply_rotary_pos_emb interface on megatron-core's own unfused RoPE math, compiled, with the
    angles' cos / sin computed once per angle tensor."""
    return _rope_bshd(t, *_cos_sin(freqs, t.dtype), interleaved)


def rope_thd(t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, cp_size: int = 1, cp_rank: int = 0,
             interleaved: bool = False) -> torch.Tensor:
    """TE's packed-sequence interface on megatron-core's unfused implementation (not compiled: ragged)."""
    from megatron.core import parallel_state

    return rope_utils._apply_rotary_pos_emb_thd(t, cu_seqlens, freqs, rotary_interleaved=interleaved,
                                                cp_group=parallel_state.get_context_parallel_group())


def register_compiled_rope() -> None:
    """Without TE, megatron-core's fused-RoPE hooks are empty and apply_rope_fusion=True is refused; fill
    them (only where empty: TE's kernels win) so the fast spec can turn the fusion on."""
    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = compiled_rope
    if rope_utils.fused_apply_rotary_pos_emb_thd is None:
        rope_utils.fused_apply_rotary_pos_emb_thd = rope_thd


class SDPADotProductAttention(DotProductAttention):
    """Megatron's DotProductAttention interface ([s, b, heads, dim] in, [s, b, hidden] out) on
    torch.nn.functional.scaled_dot_product_attention. Only the causal, mask-free case takes the fast path;
    anything else (explicit masks, sliding windows, softmax offsets) falls back to the local implementation."""

    def _fast_path(self, attention_mask: Optional[torch.Tensor], attn_mask_type: Optional[AttnMaskType]) -> bool:
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        return (attention_mask is None and mask_type == AttnMaskType.causal and self.softmax_offset is None
                and self.config.window_size is None)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Optional[torch.Tensor], attn_mask_type: Optional[AttnMaskType] = None,
                attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        if attention_bias is not None or packed_seq_params is not None or not self._fast_path(attention_mask,
                                                                                                attn_mask_type):
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)
        sq, b = query.shape[0], query.shape[1]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, dim]
        dropout = self.attention_dropout.p if self.training else 0.0
        gqa = self.num_attention_heads_per_partition != self.num_query_groups_per_partition

        def attend() -> torch.Tensor:
            if _sdpa_priority is None:
                return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True,
                                                      scale=self.softmax_scale, enable_gqa=gqa)
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel(_sdpa_priority, set_priority=True):
                return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True,
                                                      scale=self.softmax_scale, enable_gqa=gqa)

        if dropout > 0.0 and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                context = attend()
        else:
            context = attend()
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)


def fast_layer_spec(config: Any) -> Any:
    """Megatron's local GPT layer spec with SDPA core attention, compiled RMSNorm (compiled_norm.py)
    and grouped-GEMM experts for MoE."""
    from megatron.bridge.models.gpt_provider import local_layer_spec

    from kaiyuan_recipes.fastpath.compiled_norm import with_fast_norms

    spec = with_fast_norms(local_layer_spec(config))
    spec.submodules.self_attention.submodules.core_attention = SDPADotProductAttention
    if config.num_moe_experts:
        from kaiyuan_recipes.fastpath.grouped_experts import with_grouped_experts

        spec = with_grouped_experts(spec)
    return spec


def use_fast_spec(provider: Any) -> Any:
    """Point a provider (already on the local spec's settings) at the fast spec and its fusions."""
    provider.transformer_layer_spec = fast_layer_spec
    for key, value in FAST_SPEC_SETTINGS.items():
        setattr(provider, key, value)
    return provider
