"""GPU: the fast spec's pieces on CUDA at laoyao_moe_2b's shape, before any long run uses them —
GroupedGemmSequentialMLP against SequentialMLP (64 experts of 320, hidden 1024, 8192 tokens routed top-8,
bf16: outputs, input and weight gradients) and SDPA core attention against Megatron's local attention
(causal, GQA 16/4, head 128, seq 4096); at qwen3_1p7b's shape the chunked linear + cross-entropy against
full logits (and its peak memory), the compiled RoPE against the unfused one, the compiled RMSNorm
against torch's, the SwiGLU backward kernel against megatron-core's, and the fused weight-gradient
accumulate (kaiyuan.wgrad_fusion) against fp32. Prints the times of both sides (information only).

usage (a CUDA GPU): python -m pytest -q -s tests/gpu/test_fast_spec_gpu.py"""

from __future__ import annotations

import time

import pytest
import torch

from kaiyuan_recipes.config.recipe_tree import load_model_file

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA")]


@pytest.fixture(scope="module", autouse=True)
def _parallel(megatron_parallel):  # tests/conftest.py: NCCL process group + CUDA RNG tracker
    yield


def _timed(fn, reps: int = 5) -> float:
    fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps


def test_grouped_experts_match_sequential_mlp_on_cuda():
    from test_moe import experts_step  # tests/test_moe.py: one fwd+bwd either way

    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    provider = build_provider(load_model_file("laoyao_moe_2b") | {"num_layers": 1}, "fast")
    provider.params_dtype = torch.bfloat16
    provider.moe_token_dispatcher_type = "allgather"
    experts = provide_on_cpu(provider).decoder.layers[0].mlp.experts.to(DEVICE)
    assert type(experts).__name__ == "GroupedGemmSequentialMLP" and experts._grouped()
    torch.manual_seed(0)
    routed = 8192 * 8
    counts = torch.distributions.Multinomial(routed, torch.ones(64)).sample().long()
    counts[5] += counts[3]
    counts[3] = 0  # an expert without tokens
    x = torch.randn(routed, 1024, dtype=torch.bfloat16, device=DEVICE)
    probs = torch.rand(routed, device=DEVICE)
    outputs, times = [], {}
    for name, grouped in (("grouped", True), ("sequential", False)):
        times[name] = _timed(lambda: experts_step(experts, grouped, x, counts, probs))
        outputs.append(experts_step(experts, grouped, x, counts, probs))
    (a, ax, ag, _), (b, bx, bg, _) = outputs
    print(f"\nexperts fwd+bwd, {routed} routed tokens: grouped {times['grouped'] * 1e3:.1f} ms, "
          f"sequential {times['sequential'] * 1e3:.1f} ms ({times['sequential'] / times['grouped']:.1f}x)")
    torch.testing.assert_close(a, b, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(ax, bx, atol=3e-2, rtol=3e-2)
    for ga, gb in zip(ag, bg):
        torch.testing.assert_close(ga, gb, atol=0.25, rtol=5e-2)  # sums over ~1k tokens in bf16
    assert ag[6].abs().sum() == 0 and ag[7].abs().sum() == 0  # expert 3's fc1 and fc2 got no tokens


def test_sdpa_attention_matches_local_attention_on_cuda():
    """SDPA attention (each kaiyuan.sdpa_backend order) against the local spec's, at seq 4096; forward and
    forward + backward times per order."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from kaiyuan_recipes.fastpath import spec as fast_spec
    from kaiyuan_recipes.models.providers import build_provider

    provider = build_provider(load_model_file("laoyao_moe_2b") | {"num_layers": 1}, "fast")
    provider.finalize()
    kw = dict(layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    fast, local = fast_spec.SDPADotProductAttention(provider, **kw).eval(), DotProductAttention(provider, **kw).eval()
    s, b, h, g, d = 4096, 2, 16, 4, 128
    torch.manual_seed(0)
    q = torch.randn(s, b, h, d, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(s, b, g, d, dtype=torch.bfloat16, device=DEVICE, requires_grad=True) for _ in range(2))
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool, device=DEVICE), 1)
    with torch.no_grad():
        theirs = local(q, k, v, attention_mask=mask)
        t_theirs = _timed(lambda: local(q, k, v, attention_mask=mask))
    times = {}
    try:
        for backend in ("auto", "cudnn", "flash"):
            fast_spec.set_sdpa_backend(backend)
            with torch.no_grad():
                ours = fast(q, k, v, attention_mask=None)
                forward = _timed(lambda: fast(q, k, v, attention_mask=None))
            both = _timed(lambda: fast(q, k, v, attention_mask=None).sum().backward())
            times[backend] = (forward, both)
            torch.testing.assert_close(ours.float(), theirs.float(), atol=2e-2, rtol=2e-2)
    finally:
        fast_spec.set_sdpa_backend("auto")
    print(f"\nattention seq {s}, 16/4 heads: local fwd {t_theirs * 1e3:.2f} ms; SDPA fwd / fwd+bwd: "
          + ", ".join(f"{name} {f * 1e3:.2f} / {fb * 1e3:.2f} ms" for name, (f, fb) in times.items()))


def test_chunked_cross_entropy_matches_full_logits_on_cuda():
    """qwen3_1p7b's lm head (vocab 151,936, hidden 2048), 8192 tokens in bf16: the chunked loss against
    full logits + cross-entropy — loss, both gradients — and the time and peak memory of each. Uniform
    upstream gradients (Megatron's training loss) and per-token ones (a loss mask): both weigh the logits'
    gradient kept from the forward."""
    from kaiyuan_recipes.fastpath.chunked_loss import ChunkedLinearCrossEntropy, chunk_tokens

    torch.manual_seed(0)
    vocab, hidden_size, tokens = 151936, 2048, 8192
    weight = (torch.randn(vocab, hidden_size, device=DEVICE) * 0.02).bfloat16().requires_grad_()
    hidden = torch.randn(tokens, hidden_size, device=DEVICE).bfloat16().requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), device=DEVICE)
    uniform = torch.full((tokens,), 1 / tokens, device=DEVICE)
    masked = (torch.rand(tokens, device=DEVICE) > 0.1).float() / tokens

    def chunked():
        return ChunkedLinearCrossEntropy.apply(hidden, weight, labels, chunk_tokens(vocab), True)

    def full():
        return torch.nn.functional.cross_entropy((hidden @ weight.t()).float(), labels, reduction="none")

    results, peaks, times = {}, {}, {}
    for name, fn, upstream in (("chunked", chunked, uniform), ("chunked_masked", chunked, masked),
                               ("full", full, uniform), ("full_masked", full, masked)):
        hidden.grad = weight.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = fn()
        (loss * upstream).sum().backward()
        torch.cuda.synchronize()
        peaks[name] = (torch.cuda.max_memory_allocated() - base) / 2**30
        results[name] = (loss.detach(), hidden.grad.clone(), weight.grad.clone())
        times[name] = _timed(lambda: (fn() * upstream).sum().backward(), reps=3)
    print(f"\nlm head + CE fwd+bwd, {tokens} tokens: " + ", ".join(
        f"{name} {times[name] * 1e3:.1f} ms {peaks[name]:.2f} GiB" for name in times))
    for ours, ref in (("chunked", "full"), ("chunked_masked", "full_masked")):
        (a, ah, aw), (b, bh, bw) = results[ours], results[ref]
        torch.testing.assert_close(a, b, atol=2e-2, rtol=1e-3)
        for got, want in ((ah, bh), (aw, bw)):  # tolerance relative to the gradient's scale (~1e-6 here)
            torch.testing.assert_close(got.float(), want.float(), atol=1e-2 * want.abs().max().item(), rtol=5e-2)
        assert peaks[ours] < peaks[ref] / 2


def test_compiled_rope_matches_unfused_on_cuda():
    from megatron.core.models.common.embeddings import rope_utils

    from kaiyuan_recipes.models.providers import build_provider

    provider = build_provider(load_model_file("qwen3_1p7b") | {"num_layers": 1}, "fast")
    assert provider.apply_rope_fusion
    torch.manual_seed(0)
    t = torch.randn(4096, 2, 16, 128, dtype=torch.bfloat16, device=DEVICE)
    freqs = torch.randn(4096, 1, 1, 128, device=DEVICE)
    fused = rope_utils.apply_rotary_pos_emb(t, freqs, provider)
    unfused = rope_utils._apply_rotary_pos_emb_bshd(t, freqs)
    torch.testing.assert_close(fused.float(), unfused.float(), atol=2e-2, rtol=2e-2)
    t_fused = _timed(lambda: rope_utils.apply_rotary_pos_emb(t, freqs, provider))
    t_unfused = _timed(lambda: rope_utils._apply_rotary_pos_emb_bshd(t, freqs))
    print(f"\nRoPE, [4096, 2, 16, 128] bf16: compiled {t_fused * 1e3:.3f} ms, unfused {t_unfused * 1e3:.3f} ms")


def test_swiglu_backward_kernel_matches_upstream_on_cuda():
    """The SwiGLU backward kernel (models/swiglu_backward.py) against megatron-core's compiled swiglu_back at
    qwen3_1p7b's fc1 output (8192 tokens x 2 x 6144, bf16); both sides compute in fp32 and round once."""
    from megatron.core.fusions import fused_bias_swiglu

    from kaiyuan_recipes.fastpath.swiglu_backward import swiglu_back

    torch.manual_seed(0)
    y = torch.randn(8192, 12288, dtype=torch.bfloat16, device=DEVICE)
    g = torch.randn(8192, 6144, dtype=torch.bfloat16, device=DEVICE)
    ours, theirs = swiglu_back(g, y), fused_bias_swiglu.swiglu_back(g, y)
    torch.testing.assert_close(ours.float(), theirs.float(), atol=1e-2, rtol=1e-2)
    assert (ours != theirs).float().mean() < 0.01  # at most a last-bit difference, and rarely
    t_ours = _timed(lambda: swiglu_back(g, y), reps=20)
    t_theirs = _timed(lambda: fused_bias_swiglu.swiglu_back(g, y), reps=20)
    print(f"\nSwiGLU backward, [8192, 12288] bf16: kernel {t_ours * 1e3:.3f} ms, upstream {t_theirs * 1e3:.3f} ms")


@pytest.mark.parametrize("shape", [(4096, 2, 2048), (4096, 2, 16, 128)])  # qwen3's hidden norms; its q norm
def test_compiled_rms_norm_matches_torch_on_cuda(shape):
    """The compiled RMSNorm against torch's, forward and backward in bf16 at qwen3_1p7b's shapes; times both
    (the profile had torch's at 80 ms of the 863 ms step)."""
    from kaiyuan_recipes.fastpath.compiled_norm import CompiledRMSNorm

    torch.manual_seed(0)
    dim = shape[-1]
    theirs = torch.nn.RMSNorm(dim, eps=1e-6, device=DEVICE, dtype=torch.bfloat16)
    ours = CompiledRMSNorm(dim, eps=1e-6, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        theirs.weight.copy_(torch.rand(dim, device=DEVICE) + 0.5)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16).requires_grad_(True)
    grad = torch.randn_like(x)

    def step(norm, inputs=x):
        inputs.grad, norm.weight.grad = None, None
        out = norm(inputs)
        out.backward(grad.to(inputs.dtype))
        return out.detach().clone(), inputs.grad.clone(), norm.weight.grad.clone()

    # Both sides against fp32: the weight gradient sums 131,072 bf16 products for the q norm, so the two
    # kernels' orders of summation part by a few bf16 ulps; ours must be as close to fp32 as torch's is.
    exact = torch.nn.RMSNorm(dim, eps=1e-6, device=DEVICE, dtype=torch.float32)
    exact.load_state_dict(theirs.state_dict())
    reference = step(exact, x.detach().float().requires_grad_(True))
    for name, a, b, r in zip(("output", "input grad", "weight grad"), step(ours), step(theirs), reference,
                             strict=True):
        ours_err, torch_err = ((t.float() - r).abs().max().item() for t in (a, b))
        print(f"\n{name}: max |error| vs fp32 compiled {ours_err:.4g}, torch {torch_err:.4g}")
        assert ours_err <= 1.5 * torch_err + 1e-3 * r.abs().max().item(), name
    t_ours, t_theirs = _timed(lambda: step(ours), reps=20), _timed(lambda: step(theirs), reps=20)
    print(f"\nRMSNorm fwd+bwd {list(shape)} bf16: compiled {t_ours * 1e3:.3f} ms, torch {t_theirs * 1e3:.3f} ms")


def test_wgrad_accumulation_into_fp32_main_grad_on_cuda():
    """kaiyuan.wgrad_fusion's accumulate (apex_standins._wgrad_accum_fp32: torch's addmm, bf16 inputs, fp32 output in
    place) at qwen3_1p7b's largest linear (fc1: 2048 -> 2 x 6144, 8192 tokens), two micro-batches: against the
    fp32 product of the same bf16 values, and no further from it than what runs without the fusion (a bf16
    weight gradient added to the fp32 main grad). Times both (the unfused add was 34 ms of the 815 ms step)."""
    from kaiyuan_recipes.fastpath import apex_standins

    torch.manual_seed(0)
    tokens, d_in, d_out = 8192, 2048, 12288
    xs = [torch.randn(tokens, d_in, device=DEVICE).bfloat16() for _ in range(2)]
    gs = [(torch.randn(tokens, d_out, device=DEVICE) * 1e-3).bfloat16() for _ in range(2)]
    exact = sum(g.float().t() @ x.float() for x, g in zip(xs, gs))
    fused = torch.zeros(d_out, d_in, device=DEVICE)
    unfused = torch.zeros_like(fused)

    def fused_step():
        for x, g in zip(xs, gs):
            apex_standins._wgrad_accum_fp32(x, g, fused)

    def unfused_step():
        for x, g in zip(xs, gs):
            unfused.add_(g.t() @ x)

    fused_step()
    unfused_step()
    err_fused, err_unfused = ((m - exact).abs().max().item() for m in (fused, unfused))
    scale = exact.abs().max().item()
    print(f"\nwgrad accumulate, 2 x [{tokens}x{d_out}]^T [{tokens}x{d_in}]: max error vs fp32 fused {err_fused:.3g}, "
          f"unfused {err_unfused:.3g} (of {scale:.3g}); fused {_timed(fused_step) * 1e3:.2f} ms, "
          f"unfused {_timed(unfused_step) * 1e3:.2f} ms")
    assert err_fused <= err_unfused and err_fused < 1e-3 * scale


def test_foreach_l2_norm_of_no_tensors_is_a_cuda_zero():
    """apex_standins._foreach_l2_norm with an empty list (a rank whose shard holds no gradients) returns what
    upstream's fallback returns there: a one-element fp32 zero on the GPU, so the all-reduce that follows runs on
    the device like every other rank's."""
    from kaiyuan_recipes.fastpath import apex_standins

    norm, per_tensor = apex_standins._foreach_l2_norm(0, None, [[]], False)
    assert norm.is_cuda and norm.dtype == torch.float32 and norm.shape == (1,) and float(norm) == 0.0
    assert per_tensor is None


def test_rope_cos_sin_are_not_cached_while_a_graph_is_captured():
    """fastpath.spec._cos_sin computes cos / sin once per angle tensor, but not while a CUDA graph is being
    captured: a captured kernel has not run yet, so a cached result would be memory the graph fills only at replay."""
    from kaiyuan_recipes.fastpath import spec

    freqs = torch.randn(64, 1, 1, 32, device=DEVICE)
    spec._trig.clear()
    spec._cos_sin(freqs, torch.bfloat16)
    assert len(spec._trig) == 1  # eager: cached
    spec._trig.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cos, _ = spec._cos_sin(freqs, torch.bfloat16)
    assert spec._trig == {}  # captured: not cached
    graph.replay()
    torch.testing.assert_close(cos, torch.cos(freqs).to(torch.bfloat16))

