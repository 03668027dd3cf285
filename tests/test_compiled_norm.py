"""The fast spec's RMSNorm (models/compiled_norm.py): torch.compile'd, the same function, module class family,
parameters and state dict as torch.nn.RMSNorm, which the local spec builds; in every norm slot of a fast-spec
layer (input, pre-MLP, q / k); kaiyuan.compiled_norm=false and LayerNorm models keep torch's."""

import pytest
import torch
from conftest import tiny_gpt_shape

from kaiyuan_recipes.fastpath import compiled_norm
from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16, 2, 64), (16, 2, 4, 32)])  # a hidden-state norm; a per-head q/k norm
def test_compiled_rms_norm_computes_torch_rms_norm(dtype, shape):
    torch.manual_seed(0)
    dim = shape[-1]
    theirs = torch.nn.RMSNorm(dim, eps=1e-6).to(dtype)
    ours = compiled_norm.CompiledRMSNorm(dim, eps=1e-6).to(dtype)
    with torch.no_grad():
        theirs.weight.copy_(torch.rand(dim) + 0.5)
    ours.load_state_dict(theirs.state_dict())
    x = (torch.randn(shape) * 3).to(dtype)
    grad = torch.randn(shape).to(dtype)
    results = []
    for norm in (ours, theirs):
        xi = x.clone().requires_grad_(True)
        out = norm(xi)
        out.backward(grad)
        results.append((out, xi.grad, norm.weight.grad))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for a, b, what in zip(results[0], results[1], ("output", "input grad", "weight grad"), strict=True):
        assert a.dtype == b.dtype == dtype, what
        torch.testing.assert_close(a, b, **tol, msg=what)


def _norms(model):
    layer = model.decoder.layers[0]
    attention = layer.self_attention
    return [layer.input_layernorm, layer.pre_mlp_layernorm, attention.q_layernorm, attention.k_layernorm]


def test_fast_spec_builds_compiled_norms_with_the_local_specs_state_dict(megatron_parallel):
    shape = tiny_gpt_shape(qk_layernorm=True)
    fast, local = provide_on_cpu(build_provider(shape, "fast")), provide_on_cpu(build_provider(shape, "local"))
    assert {type(n) for n in _norms(fast)} == {compiled_norm.CompiledRMSNorm}
    assert {type(n) for n in _norms(local)} == {torch.nn.RMSNorm}
    assert all(isinstance(n, torch.nn.RMSNorm) and n.eps == shape["layernorm_epsilon"] for n in _norms(fast))
    assert fast.state_dict().keys() == local.state_dict().keys()
    try:
        compiled_norm.set_compiled_norm(False)
        plain = provide_on_cpu(build_provider(shape, "fast"))
    finally:
        compiled_norm.set_compiled_norm(True)
    assert {type(n) for n in _norms(plain)} == {torch.nn.RMSNorm}
    layer_norm = provide_on_cpu(build_provider(tiny_gpt_shape(normalization="LayerNorm"), "fast"))
    assert type(layer_norm.decoder.layers[0].input_layernorm) is torch.nn.LayerNorm


def test_compiled_norm_knob_reaches_the_spec(tmp_path):
    from kaiyuan_recipes.training.config import build_config

    try:
        _, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.layer_spec=fast",
                                            "kaiyuan.compiled_norm=false"])
        assert run.compiled_norm is False and compiled_norm._enabled is False
        _, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.layer_spec=fast"])
        assert run.compiled_norm is True and compiled_norm._enabled is True
    finally:
        compiled_norm.set_compiled_norm(True)
