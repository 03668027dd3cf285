"""kaiyuan.layer_spec=fast: SDPA core attention gives the same context as an explicit causal
softmax(QKᵀ·scale)V with GQA (computed here independently), falls back to Megatron's local attention
for masks it does not handle, and a GPT model built with the spec uses it in every layer."""

import math

import pytest
import torch

from kaiyuan_recipes.models.providers import build_provider
from kaiyuan_recipes.recipe_tree import load_model_file


def reference(q, k, v, scale):
    """q [s, b, h, d], k/v [s, b, g, d] -> [s, b, h*d], causal, GQA by repetition."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) * scale
    s = q.shape[0]
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    out = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), v)
    return out.reshape(s, q.shape[1], -1)


def test_sdpa_core_attention_matches_explicit_attention(megatron_parallel):
    from megatron.core.transformer.enums import AttnMaskType

    from kaiyuan_recipes.models.fast_spec import SDPADotProductAttention

    provider = build_provider(load_model_file("gpt_smoke") | {"num_layers": 1}, "fast")
    provider.finalize()
    attn = SDPADotProductAttention(provider, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                   attention_type="self").eval()
    torch.manual_seed(0)
    s, b, h, g, d = 64, 2, provider.num_attention_heads, provider.num_query_groups, provider.kv_channels
    q, k, v = torch.randn(s, b, h, d), torch.randn(s, b, g, d), torch.randn(s, b, g, d)
    out = attn(q, k, v, attention_mask=None)
    assert out.shape == (s, b, h * d)
    torch.testing.assert_close(out, reference(q, k, v, 1 / math.sqrt(d)), atol=1e-5, rtol=1e-5)
    assert attn._fast_path(None, None) and not attn._fast_path(torch.ones(1, 1, s, s, dtype=torch.bool), None)


def test_fast_spec_model_uses_sdpa_in_every_layer(megatron_parallel):
    from kaiyuan_recipes.models.fast_spec import SDPADotProductAttention
    from kaiyuan_recipes.models.providers import provide_on_cpu

    provider = build_provider(load_model_file("gpt_smoke") | {"num_layers": 2}, "fast")
    model = provide_on_cpu(provider)
    kinds = {type(layer.self_attention.core_attention) for layer in model.decoder.layers}
    assert kinds == {SDPADotProductAttention} and provider.transformer_impl == "local"
    with pytest.raises(ValueError, match="kaiyuan.layer_spec"):
        build_provider(load_model_file("gpt_smoke"), "fastest")
