"""The fast spec's chunked cross-entropy (kaiyuan_recipes/models/chunked_loss.py): same loss and gradients
as logits + cross-entropy, on its own and inside a real megatron-core GPTModel's output layer and loss."""

import pytest
import torch
from conftest import tiny_gpt_shape

from kaiyuan_recipes.models.chunked_loss import ChunkedLinearCrossEntropy, DeferredLogits, install_chunked_loss


@pytest.mark.parametrize("grads_in_forward", [False, True])
@pytest.mark.parametrize("upstream_kind", ["per-token", "uniform"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_loss_and_gradients_match_full_logits(dtype, tol, upstream_kind, grads_in_forward):
    """Per-token upstream weights (a loss mask dropping tokens) and uniform ones (Megatron's 1 / tokens),
    with the gradients computed in the backward or in the forward (scaled, or recomputed when not uniform)."""
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, dtype=dtype, requires_grad=True)  # 37 tokens: the last chunk is partial
    weight = (torch.randn(300, 16) * 0.3).to(dtype).requires_grad_()
    labels = torch.randint(0, 300, (37,))
    upstream = torch.rand(37) if upstream_kind == "per-token" else torch.full((37,), 1 / 37)
    loss = ChunkedLinearCrossEntropy.apply(hidden, weight, labels, 8, grads_in_forward)
    (loss * upstream).sum().backward()
    got = (loss.detach(), hidden.grad, weight.grad)
    hidden.grad = weight.grad = None
    ref = torch.nn.functional.cross_entropy((hidden @ weight.t()).float(), labels, reduction="none")
    (ref * upstream).sum().backward()
    assert loss.dtype == torch.float32 and got[1].dtype == got[2].dtype == dtype
    for a, b in zip(got, (ref.detach(), hidden.grad, weight.grad)):
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


def test_uniform_upstream_gradient_uses_the_forwards_gradients(monkeypatch):
    """With gradients from the forward and a uniform upstream gradient the backward recomputes nothing (no
    fourth lm-head GEMM); a second backward through the same graph recomputes."""
    from kaiyuan_recipes.models import chunked_loss

    hidden = torch.randn(20, 8, requires_grad=True)
    weight = torch.randn(50, 8, requires_grad=True)
    loss = ChunkedLinearCrossEntropy.apply(hidden, weight, torch.randint(0, 50, (20,)), 8, True)
    recomputed = []
    real = chunked_loss._grad_logits
    monkeypatch.setattr(chunked_loss, "_grad_logits", lambda *a: recomputed.append(1) or real(*a))
    (loss.mean() * 3).backward(retain_graph=True)
    assert not recomputed
    first = weight.grad.clone()
    weight.grad = None
    (loss.mean() * 3).backward()
    assert recomputed
    torch.testing.assert_close(weight.grad, first)


@pytest.mark.parametrize("cuda_graph_impl", ["none", "full_iteration"])
def test_graphed_runs_take_the_backward_that_needs_no_host_read(megatron_parallel, monkeypatch, cuda_graph_impl):
    """A run recorded into a CUDA graph (model.cuda_graph_impl) must not read the upstream gradient on the host
    (the H200 capture failed on that sync) and must compile every kernel it replays in the eager warm-up steps
    (a kernel first compiled mid-capture failed it too): through a real GPTModel's output layer and loss, such a
    model never takes the forward-gradient path, from its first step on; others do. Both stay exact."""
    from kaiyuan_recipes.models import chunked_loss
    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    model = provide_on_cpu(build_provider(tiny_gpt_shape(share_embeddings_and_output_weights=False), "fast"))
    model.config.cuda_graph_impl = cuda_graph_impl
    install_chunked_loss([model])
    host_reads, forward_grads = [], []
    real_uniform, real_forward_grads = chunked_loss._uniform, chunked_loss._loss_and_softmax_grad
    monkeypatch.setattr(chunked_loss, "_uniform", lambda g: host_reads.append(1) or real_uniform(g))
    monkeypatch.setattr(chunked_loss, "_loss_and_softmax_grad",
                        lambda *a: forward_grads.append(1) or real_forward_grads(*a))
    torch.manual_seed(0)
    hidden = torch.randn(16, 2, 64, requires_grad=True)  # [s, b, h]
    labels = torch.randint(0, 512, (2, 16))
    mask = (torch.rand(2, 16) > 0.3).float()  # a loss mask: per-token upstream gradients
    logits, _ = model.output_layer(hidden)
    (model.compute_language_model_loss(labels, logits) * mask).sum().backward()
    graphed = cuda_graph_impl != "none"
    assert (not host_reads and not forward_grads) if graphed else (host_reads and forward_grads)
    got = hidden.grad, model.output_layer.weight.grad
    hidden.grad = model.output_layer.weight.grad = None
    full = (hidden @ model.output_layer.weight.t()).float()  # [s, b, v]
    ref = torch.nn.functional.cross_entropy(full.permute(1, 2, 0), labels, reduction="none")  # [b, s]
    (ref * mask).sum().backward()
    for a, b in zip(got, (hidden.grad, model.output_layer.weight.grad)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_gpt_model_output_layer_and_loss(megatron_parallel):
    """A tiny gpt_smoke-shaped GPTModel (fast spec) with the pre-wrap hook against an identical one on
    Megatron's exact (unfused) vocab-parallel cross-entropy: same [b, s] loss and gradients from the output
    layer + loss that GPTModel._postprocess runs, the state dict unchanged, and logits still materialised
    when asked for. (Megatron's compiled fused cross-entropy differs from exact by ~1e-4 in the gradient.)"""
    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    shape = tiny_gpt_shape(share_embeddings_and_output_weights=False)
    plain, chunked = (provide_on_cpu(build_provider(shape, "fast")) for _ in range(2))
    chunked.load_state_dict(plain.state_dict())
    plain.config.cross_entropy_loss_fusion = False
    keys = sorted(chunked.state_dict())
    assert install_chunked_loss([chunked]) == [chunked]
    assert sorted(chunked.state_dict()) == keys
    torch.manual_seed(0)
    hidden = torch.randn(16, 2, 64)  # [s, b, h]
    labels = torch.randint(0, 512, (2, 16))  # [b, s]
    results = []
    for model in (plain, chunked):
        h = hidden.clone().requires_grad_()
        logits, _ = model.output_layer(h)
        loss = model.compute_language_model_loss(labels, logits)
        loss.sum().backward()
        results.append((loss.detach(), h.grad, model.output_layer.weight.grad))
    assert isinstance(chunked.output_layer(hidden)[0], DeferredLogits)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert results[1][0].shape == (2, 16)
    full, _ = plain.output_layer(hidden)
    torch.testing.assert_close(chunked.output_layer(hidden)[0].transpose(0, 1), full.transpose(0, 1))


@pytest.mark.parametrize("masked", [False, True])
def test_through_megatron_bridges_loss_function(megatron_parallel, monkeypatch, masked):
    """The upstream gradient the chunked loss sees in training: Megatron-Bridge's masked_next_token_loss, then
    the schedule's division by the token count. An all-ones loss mask gives every token the same gradient
    (the forward's gradients are scaled, nothing recomputed); a mask that drops tokens does not (recomputed).
    Both equal the plain model's gradients."""
    from megatron.bridge.training.losses import masked_next_token_loss

    from kaiyuan_recipes.models import chunked_loss
    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    shape = tiny_gpt_shape(share_embeddings_and_output_weights=False)
    plain, chunked = (provide_on_cpu(build_provider(shape, "fast")) for _ in range(2))
    chunked.load_state_dict(plain.state_dict())
    plain.config.cross_entropy_loss_fusion = False
    install_chunked_loss([chunked])
    recomputed = []
    real = chunked_loss._grad_logits
    monkeypatch.setattr(chunked_loss, "_grad_logits", lambda *a: recomputed.append(1) or real(*a))
    torch.manual_seed(1)
    hidden = torch.randn(16, 2, 64)
    labels = torch.randint(0, 512, (2, 16))
    loss_mask = torch.ones(2, 16)
    if masked:
        loss_mask[:, -3:] = 0  # e.g. padding at the end of a packed sequence
    grads = []
    for model in (plain, chunked):
        h = hidden.clone().requires_grad_()
        per_token = model.compute_language_model_loss(labels, model.output_layer(h)[0])
        loss, num_tokens, _ = masked_next_token_loss(loss_mask, per_token)
        (loss / num_tokens).backward()  # what forward_step_calc_loss does without per-token loss
        grads.append((h.grad, model.output_layer.weight.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert bool(recomputed) == masked


def test_not_installed_where_the_output_layer_is_vocab_parallel(megatron_parallel):
    from kaiyuan_recipes.models.chunked_loss import unsupported_reason
    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    shape = tiny_gpt_shape()
    model = provide_on_cpu(build_provider(shape, "fast"))
    assert unsupported_reason(model) is None
    model.config.tensor_model_parallel_size = 2
    assert "tensor parallel" in unsupported_reason(model)
    install_chunked_loss([model])
    assert "forward" not in vars(model.output_layer)


def test_fast_spec_runs_register_the_hook(tmp_path):
    from kaiyuan_recipes.models.chunked_loss import install_chunked_loss as hook
    from kaiyuan_recipes.training.config import build_config

    def hooks(*knobs):
        cfg = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", *knobs])[0]
        return getattr(cfg.model, "_pre_wrap_hooks", [])

    assert hook in hooks("kaiyuan.layer_spec=fast")
    assert hook not in hooks("kaiyuan.layer_spec=fast", "kaiyuan.chunked_loss=false")
    assert hook not in hooks("kaiyuan.layer_spec=fast", "kaiyuan.zero_stage=2")
    assert hook not in hooks("kaiyuan.layer_spec=local")

    def summary_says(*args):  # the dry run reports what will run: the hook stands aside under TP
        import json
        import subprocess
        import sys

        done = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "train", "gpt_smoke", "--dry-run", "--json",
                               f"kaiyuan.run_root={tmp_path}", *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout[done.stdout.index("{"):])["model"]["chunked_loss"]

    assert summary_says("kaiyuan.layer_spec=fast") is True
    assert summary_says("kaiyuan.layer_spec=fast", "model.tensor_model_parallel_size=2", "--nproc-per-node=2") is False
    from kaiyuan_recipes.models import fast_spec

    try:  # the SDPA kernel order is set with the rest of the fast spec's run settings
        hooks("kaiyuan.layer_spec=fast", "kaiyuan.sdpa_backend=cudnn")
        assert fast_spec._sdpa_priority[0].name == "CUDNN_ATTENTION"
    finally:
        fast_spec.set_sdpa_backend("auto")
