"""kaiyuan.layer_spec=fast: SDPA core attention gives the same context as an explicit causal
softmax(QKᵀ·scale)V with GQA (computed here independently), falls back to Megatron's local attention
for masks it does not handle, and a GPT model built with the spec uses it in every layer."""

import math

import pytest
import torch
from conftest import megatron_forward_on_cpu, tiny_gpt_shape

from kaiyuan_recipes.config.recipe_tree import load_model_file
from kaiyuan_recipes.models.providers import build_provider


def reference(q, k, v, scale):
    """q [s, b, h, d], k/v [s, b, g, d] -> [s, b, h*d], causal, GQA by repetition."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) * scale
    s = q.shape[0]
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    out = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), v)
    return out.reshape(s, q.shape[1], -1)


def _attention_case():
    """The fast spec's core attention at gpt_smoke's head layout, and random q, k, v (64 tokens, batch 2)."""
    from megatron.core.transformer.enums import AttnMaskType

    from kaiyuan_recipes.fastpath.spec import SDPADotProductAttention

    provider = build_provider(load_model_file("gpt_smoke") | {"num_layers": 1}, "fast")
    provider.finalize()
    attn = SDPADotProductAttention(provider, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                   attention_type="self").eval()
    torch.manual_seed(0)
    s, b, h, g, d = 64, 2, provider.num_attention_heads, provider.num_query_groups, provider.kv_channels
    return attn, torch.randn(s, b, h, d), torch.randn(s, b, g, d), torch.randn(s, b, g, d)


def test_sdpa_core_attention_matches_explicit_attention(megatron_parallel):
    attn, q, k, v = _attention_case()
    s, b, h, d = q.shape
    out = attn(q, k, v, attention_mask=None)
    assert out.shape == (s, b, h * d)
    torch.testing.assert_close(out, reference(q, k, v, 1 / math.sqrt(d)), atol=1e-5, rtol=1e-5)
    assert attn._fast_path(None, None) and not attn._fast_path(torch.ones(1, 1, s, s, dtype=torch.bool), None)


def test_sdpa_attention_in_bf16_is_closer_to_fp32_than_the_local_specs(megatron_parallel, monkeypatch):
    """Why the two specs' bf16 training curves part systematically (benchmarks/results/
    2026-11-30_fast_vs_local_onepass.json): the local spec's core attention rounds the scores q·k to bf16 before
    its fp32 softmax; SDPA keeps them in fp32. Both in bf16 against an fp32 reference of the same (bf16-rounded)
    inputs, at score scales a trained model reaches: the fast spec's error is a fraction of the local spec's."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from kaiyuan_recipes.fastpath.spec import SDPADotProductAttention

    megatron_forward_on_cpu(monkeypatch.setattr)
    errors = {}
    for spec, cls in (("local", DotProductAttention), ("fast", SDPADotProductAttention)):
        provider = build_provider(load_model_file("gpt_smoke") | {"num_layers": 1}, spec)
        provider.bf16, provider.params_dtype = True, torch.bfloat16
        provider.finalize()
        attn = cls(provider, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self").eval()
        torch.manual_seed(0)
        s, b, h, g, d = 256, 2, provider.num_attention_heads, provider.num_query_groups, provider.kv_channels
        q, k, v = (torch.randn(s, b, n, d).bfloat16() for n in (h, g, g))
        q, k = q * 3, k * 3  # scores with a standard deviation of ~9 logits
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)[None, None] if spec == "local" else None
        exact = reference(q.float(), k.float(), v.float(), 1 / math.sqrt(d))
        errors[spec] = (attn(q, k, v, attention_mask=mask).float() - exact).abs().mean().item()
    assert errors["fast"] < 0.3 * errors["local"], errors  # measured: 0.0009 vs 0.0050


def test_fast_spec_model_uses_sdpa_in_every_layer(megatron_parallel):
    from kaiyuan_recipes.fastpath.spec import SDPADotProductAttention
    from kaiyuan_recipes.models.providers import provide_on_cpu

    provider = build_provider(load_model_file("gpt_smoke") | {"num_layers": 2}, "fast")
    model = provide_on_cpu(provider)
    kinds = {type(layer.self_attention.core_attention) for layer in model.decoder.layers}
    assert kinds == {SDPADotProductAttention} and provider.transformer_impl == "local"
    with pytest.raises(ValueError, match="kaiyuan.layer_spec"):
        build_provider(load_model_file("gpt_smoke"), "fastest")


def test_fast_spec_fusions_compute_what_the_local_spec_computes(megatron_parallel):
    """The fused SwiGLU (megatron-core's torch.compile'd function) against the local spec's unfused MLP with
    the same weights, and the fused vocab-parallel cross-entropy against torch's, on the CPU."""
    from kaiyuan_recipes.models.providers import provide_on_cpu

    shape = tiny_gpt_shape()
    fast_provider, local_provider = build_provider(shape, "fast"), build_provider(shape, "local")
    assert fast_provider.bias_activation_fusion and fast_provider.cross_entropy_loss_fusion
    assert not local_provider.bias_activation_fusion
    fast, local = provide_on_cpu(fast_provider), provide_on_cpu(local_provider)
    fast.load_state_dict(local.state_dict())
    torch.manual_seed(0)
    x = torch.randn(16, 2, 64)
    mlp_fast, _ = fast.decoder.layers[0].mlp(x)
    mlp_local, _ = local.decoder.layers[0].mlp(x)
    torch.testing.assert_close(mlp_fast, mlp_local, atol=1e-5, rtol=1e-5)
    logits, labels = torch.randn(16, 2, 512), torch.randint(0, 512, (2, 16))
    expected = torch.nn.functional.cross_entropy(logits.permute(1, 2, 0), labels, reduction="none")  # [b, s]
    torch.testing.assert_close(fast.compute_language_model_loss(labels, logits), expected, atol=1e-5, rtol=1e-5)


def test_fast_spec_rope_goes_through_megatrons_fused_hook_compiled(megatron_parallel):
    """Without TE megatron-core refuses apply_rope_fusion; the fast spec fills its fused-RoPE hooks with a
    compiled version of megatron-core's own RoPE math, so the fusion validates, and Megatron's
    apply_rotary_pos_emb (what attention calls) computes what the unfused path computes."""
    from megatron.core.models.common.embeddings import rope_utils

    from kaiyuan_recipes.fastpath.spec import compiled_rope, rope_thd

    shape = tiny_gpt_shape()
    provider = build_provider(shape, "fast")
    assert provider.apply_rope_fusion
    assert rope_utils.fused_apply_rotary_pos_emb is compiled_rope
    assert rope_utils.fused_apply_rotary_pos_emb_thd is rope_thd
    provider.finalize()  # upstream's validation of apply_rope_fusion passes
    torch.manual_seed(0)
    t, freqs = torch.randn(32, 2, 4, 16), torch.randn(32, 1, 1, 16)
    fused = rope_utils.apply_rotary_pos_emb(t, freqs, provider)
    unfused = rope_utils._apply_rotary_pos_emb_bshd(t, freqs)
    torch.testing.assert_close(fused, unfused, atol=1e-5, rtol=1e-5)
    assert not torch.equal(fused, t)
    # cos / sin are computed once per angle tensor (Megatron hands every layer the same one), and again when
    # those angles change in place or another tensor comes
    from kaiyuan_recipes.fastpath import spec as fast_spec

    assert fast_spec._cos_sin(freqs, t.dtype)[0] is fast_spec._cos_sin(freqs, t.dtype)[0]
    freqs.mul_(0.5)
    torch.testing.assert_close(rope_utils.apply_rotary_pos_emb(t, freqs, provider),
                               rope_utils._apply_rotary_pos_emb_bshd(t, freqs), atol=1e-5, rtol=1e-5)
    other = torch.randn(32, 1, 1, 8)  # a partial rotary dimension: the rest of t passes through
    torch.testing.assert_close(rope_utils.apply_rotary_pos_emb(t, other, provider),
                               rope_utils._apply_rotary_pos_emb_bshd(t, other), atol=1e-5, rtol=1e-5)
    local = build_provider(shape, "local")
    assert not local.apply_rope_fusion  # the local spec stays on the unfused path


@pytest.mark.parametrize("backend", ["cudnn", "flash", "efficient"])
def test_sdpa_backend_priority_keeps_the_result(megatron_parallel, backend):
    """kaiyuan.sdpa_backend only reorders SDPA's kernels (the others stay as fallbacks: on this CPU host
    every order ends at the same kernel), so attention's output is unchanged; unknown names are refused."""
    from kaiyuan_recipes.fastpath import spec as fast_spec

    attention, q, k, v = _attention_case()
    try:
        fast_spec.set_sdpa_backend(backend)
        assert fast_spec._sdpa_priority[0].name.startswith(backend.upper()) and len(fast_spec._sdpa_priority) == 4
        torch.testing.assert_close(attention(q, k, v, attention_mask=None),
                                   reference(q, k, v, 1 / math.sqrt(q.shape[-1])), atol=1e-5, rtol=1e-5)
    finally:
        fast_spec.set_sdpa_backend("auto")
    assert fast_spec._sdpa_priority is None
    with pytest.raises(ValueError, match="kaiyuan.sdpa_backend"):
        fast_spec.set_sdpa_backend("triton")


def test_whole_fast_spec_model_computes_what_the_local_spec_computes(megatron_parallel, monkeypatch):
    """Two layers, same weights, fp32 on the CPU: the fast spec (SDPA, compiled RoPE / SwiGLU / bias-dropout-add /
    RMSNorm incl. q / k norms, chunked cross-entropy) and the local spec give the same per-token loss and the
    same gradient for every parameter. Where their training curves part in bf16 it is rounding, not a different
    function. The local side uses Megatron's exact cross-entropy: its fused one (on in both specs by default)
    rounds the logits' gradient to bf16 (megatron/core/fusions/fused_cross_entropy.py), 2e-3 apart from exact
    in fp32."""
    from kaiyuan_recipes.fastpath.chunked_loss import install_chunked_loss
    from kaiyuan_recipes.models.providers import provide_on_cpu

    shape = tiny_gpt_shape(num_layers=2, seq_length=64, max_position_embeddings=64, qk_layernorm=True)
    fast, local = provide_on_cpu(build_provider(shape, "fast")), provide_on_cpu(build_provider(shape, "local"))
    fast.load_state_dict(local.state_dict())
    install_chunked_loss([fast])
    local.config.cross_entropy_loss_fusion = False
    megatron_forward_on_cpu(monkeypatch.setattr)
    torch.manual_seed(0)
    tokens, labels = torch.randint(0, 512, (2, 64)), torch.randint(0, 512, (2, 64))
    positions = torch.arange(64).expand(2, 64)
    losses = {}
    for name, model in (("fast", fast), ("local", local)):
        losses[name] = model(tokens, positions, None, labels=labels)
        losses[name].mean().backward()
    torch.testing.assert_close(losses["fast"], losses["local"], atol=1e-5, rtol=1e-5)
    local_params = dict(local.named_parameters())
    for name, p in fast.named_parameters():
        torch.testing.assert_close(p.grad, local_params[name].grad, atol=1e-5, rtol=1e-4, msg=name)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in fast.parameters())


def test_swiglu_backward_is_installed_and_keeps_upstreams_gradient(megatron_parallel):
    """The SwiGLU backward kernel installed into megatron-core's SwiGLUFunction (what fastpath.install does when
    the plan turns it on; that the plan does so is tests/test_fastpath.py's fresh-process check): the gradient
    through megatron-core's bias_swiglu_impl (the fast spec's MLP activation) equals autograd's through
    silu(a) · b. On this CPU host the tensors take upstream's path; the kernel itself is compared with upstream on
    CUDA in tests/gpu/test_fast_spec_gpu.py."""
    from megatron.core.fusions import fused_bias_swiglu

    from kaiyuan_recipes.fastpath import swiglu_backward

    build_provider(tiny_gpt_shape(), "fast")
    swiglu_backward.register_swiglu_backward()  # process-wide, idempotent: any earlier test may have installed it
    assert fused_bias_swiglu.SwiGLUFunction.backward is swiglu_backward._backward
    torch.manual_seed(0)
    y = torch.randn(6, 2, 32, requires_grad=True)
    out = fused_bias_swiglu.bias_swiglu_impl(y, None)
    grad = torch.randn_like(out)
    out.backward(grad)
    y_ref = y.detach().clone().requires_grad_()
    a, b = y_ref.chunk(2, -1)
    (torch.nn.functional.silu(a) * b).backward(grad)
    torch.testing.assert_close(y.grad, y_ref.grad, atol=1e-6, rtol=1e-6)
