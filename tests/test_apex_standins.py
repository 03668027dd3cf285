"""fastpath/apex_standins.py: what Apex would give megatron-core, from torch's kernels. Each stand-in: it computes
what upstream's path computes, and a probe that fails once megatron-core no longer needs it."""

import importlib.util
import subprocess
import sys
import textwrap

import pytest

from kaiyuan_recipes import compat
from kaiyuan_recipes.fastpath import apex_standins

needs_no_te = pytest.mark.skipif(compat.transformer_engine_available(), reason="only without TE")


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_upstream_layers_still_need_apex_to_fuse_weight_gradient_accumulation():
    if importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None:
        pytest.skip("Apex's extension is installed here")
    probe = run_python("from megatron.core.tensor_parallel import layers; print(layers._grad_accum_fusion_available)")
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.strip() == "False", (
        "megatron-core fuses weight-gradient accumulation without Apex now: "
        "delete apex_standins.torch_wgrad_accumulation")


def test_torch_wgrad_accumulation_through_megatron_cores_linear_layer():
    """Installed, megatron-core's ColumnParallelLinear with gradient_accumulation_fusion (a real layer, its real
    backward) accumulates two micro-batches' weight gradients into main_grad through the shim and leaves no
    .grad; fp32 on this CPU host. For bf16 inputs the shim asks torch for an fp32-output addmm in place (a CUDA
    kernel: checked here on the meta device for dtype and aliasing; numerics in tests/gpu/test_fast_spec_gpu.py)."""
    probe = run_python(
        """
        import os, torch
        from kaiyuan_recipes import compat
        from kaiyuan_recipes.fastpath import apex_standins
        compat.apply()
        from megatron.core import parallel_state
        from megatron.core.model_parallel_config import ModelParallelConfig
        from megatron.core.tensor_parallel import layers
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
        parallel_state.initialize_model_parallel()
        config = ModelParallelConfig(gradient_accumulation_fusion=True, use_cpu_initialization=True)
        try:
            layers.ColumnParallelLinear(16, 24, config=config, init_method=torch.nn.init.xavier_normal_, bias=False)
            raise SystemExit("upstream built a fused layer without the extension")
        except RuntimeError as err:
            print("refused without:", "fused_weight_gradient_mlp_cuda" in str(err))
        assert apex_standins.torch_wgrad_accumulation()
        torch.manual_seed(0)
        layer = layers.ColumnParallelLinear(16, 24, config=config, init_method=torch.nn.init.xavier_normal_,
                                            bias=False, skip_bias_add=True)
        layer.weight.main_grad = torch.zeros_like(layer.weight, dtype=torch.float32)
        xs = [torch.randn(5, 2, 16, requires_grad=True) for _ in range(2)]
        for x in xs:
            (layer(x)[0] ** 2).sum().backward()
        w = layer.weight.detach().clone().requires_grad_()
        for x in xs:
            ((x.detach() @ w.t()) ** 2).sum().backward()
        print("main_grad:", torch.allclose(layer.weight.main_grad, w.grad, atol=1e-5), "grad:", layer.weight.grad)
        main = torch.zeros(24, 16, device="meta")
        apex_standins._wgrad_accum_fp32(torch.randn(10, 16, dtype=torch.bfloat16, device="meta"),
                                 torch.randn(10, 24, dtype=torch.bfloat16, device="meta"), main)
        out = torch.addmm(main, torch.randn(24, 10, dtype=torch.bfloat16, device="meta"),
                          torch.randn(10, 16, dtype=torch.bfloat16, device="meta"), out_dtype=torch.float32, out=main)
        print("bf16:", out is main and out.dtype == torch.float32)
        """
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.split("\n")[-4:] == ["refused without: True", "main_grad: True grad: None", "bf16: True", ""], (
        probe.stdout)


@needs_no_te
def test_upstream_grad_norm_fallback_still_reads_every_norm_on_the_host():
    """What apex_standins.foreach_grad_clip stands in for: megatron-core's fallback l2 norm (no Apex, no TE) builds a
    host tensor from the per-parameter norms, one device-to-host read each (a CUDA tensor on the GPU host)."""
    probe = run_python(
        """
        import inspect
        from megatron.core import utils
        from megatron.core.optimizer import clip_grads
        print(clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm,
              "torch.tensor(l2)" in inspect.getsource(utils.local_multi_tensor_l2_norm))
        """
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.split()[-2:] == ["True", "True"], (
        "megatron-core's fallback grad norm changed: check whether apex_standins.foreach_grad_clip is still needed")


def test_foreach_grad_clip_computes_what_upstreams_fallback_does():
    """Installed by fastpath.apply when the plan turns it on (the default without Apex/TE): the clip path's norm
    is the norm of all gradients together, left on the device as a 1-element tensor; the scale is bitwise
    upstream's `dst.copy_(src * scale)`, in place and across dtypes (megatron-core's own
    _multi_tensor_copy_this_to_that, fp32 main params to bf16 ones, goes through it)."""
    import torch
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    compat.apply()
    assert apex_standins.foreach_grad_clip()
    assert clip_grads.l2_norm_impl is apex_standins._foreach_l2_norm
    assert clip_grads.multi_tensor_scale_impl is optimizer.multi_tensor_scale_impl is apex_standins._foreach_scale
    torch.manual_seed(0)
    grads = [torch.randn(n) for n in (7, 300, 1)] + [torch.randn(4, 5)]
    norm, per_tensor = clip_grads.multi_tensor_applier(clip_grads.l2_norm_impl, None, [grads], False)
    assert norm.shape == (1,) and per_tensor is None
    torch.testing.assert_close(norm, torch.cat([g.flatten() for g in grads]).norm().reshape(1))
    ours, theirs = [g.clone() for g in grads], [g.clone() for g in grads]
    apex_standins._foreach_scale(0, None, [ours, ours], 0.37)
    utils.local_multi_tensor_scale(0, None, [theirs, theirs], 0.37)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    bf16 = [torch.empty_like(g, dtype=torch.bfloat16) for g in grads]
    optimizer._multi_tensor_copy_this_to_that(grads, bf16, overflow_buf=torch.zeros(1))
    assert all(torch.equal(b, g.to(torch.bfloat16)) for b, g in zip(bf16, grads))
