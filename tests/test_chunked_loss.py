"""The fast spec's chunked cross-entropy (kaiyuan_recipes/models/chunked_loss.py): same loss and gradients
as logits + cross-entropy, on its own and inside a real megatron-core GPTModel's output layer and loss."""

import pytest
import torch
from conftest import tiny_gpt_shape
from torch.utils._python_dispatch import TorchDispatchMode

from kaiyuan_recipes.fastpath.chunked_loss import ChunkedLinearCrossEntropy, DeferredLogits, install_chunked_loss


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


class HostReads(TorchDispatchMode):
    """Records every aten op that hands a tensor's value to Python (.item(), bool(), torch.equal): on a GPU each
    is a host sync, and inside a CUDA graph capture an error (found on the H200)."""

    READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.equal.default,
             torch.ops.aten.is_nonzero.default}

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.reads.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("upstream_kind", ["per-token", "uniform"])
def test_forward_gradients_are_weighed_in_the_backward_without_host_reads(monkeypatch, upstream_kind):
    """With gradients from the forward the backward recomputes no logits (no fourth lm-head GEMM) and reads no
    tensor on the host, for uniform and per-token upstream gradients alike; a second backward through the same
    graph recomputes (the kept gradient is freed by the first) and agrees."""
    from kaiyuan_recipes.fastpath import chunked_loss

    torch.manual_seed(0)
    hidden = torch.randn(20, 8, requires_grad=True)
    weight = torch.randn(50, 8, requires_grad=True)
    upstream = torch.rand(20) if upstream_kind == "per-token" else torch.full((20,), 3 / 20)
    loss = ChunkedLinearCrossEntropy.apply(hidden, weight, torch.randint(0, 50, (20,)), 8, True)
    recomputed = []
    real = chunked_loss._grad_logits
    monkeypatch.setattr(chunked_loss, "_grad_logits", lambda *a: recomputed.append(1) or real(*a))
    with HostReads() as mode:
        (loss * upstream).sum().backward(retain_graph=True)
    assert not recomputed and not mode.reads
    first = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    (loss * upstream).sum().backward()
    assert recomputed
    for a, b in zip(first, (hidden.grad, weight.grad)):
        torch.testing.assert_close(a, b)


def test_output_layer_and_masked_loss_read_nothing_on_the_host(megatron_parallel):
    """Through a real GPTModel's patched output layer and loss, with a loss mask (per-token upstream gradients),
    forward and backward read no tensor on the host, so a run can be captured as one CUDA graph
    (model.cuda_graph_impl=full_iteration; the first H200 capture failed on such a read), and the gradients
    equal whole-logits cross-entropy's."""
    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    model = provide_on_cpu(build_provider(tiny_gpt_shape(share_embeddings_and_output_weights=False), "fast"))
    install_chunked_loss([model])
    torch.manual_seed(0)
    hidden = torch.randn(16, 2, 64, requires_grad=True)  # [s, b, h]
    labels = torch.randint(0, 512, (2, 16))
    mask = (torch.rand(2, 16) > 0.3).float()
    with HostReads() as mode:
        logits, _ = model.output_layer(hidden)
        (model.compute_language_model_loss(labels, logits) * mask).sum().backward()
    assert not mode.reads
    got = hidden.grad, model.output_layer.weight.grad
    hidden.grad = model.output_layer.weight.grad = None
    full = (hidden @ model.output_layer.weight.t()).float()  # [s, b, v]
    ref = torch.nn.functional.cross_entropy(full.permute(1, 2, 0), labels, reduction="none")  # [b, s]
    (ref * mask).sum().backward()
    for a, b in zip(got, (hidden.grad, model.output_layer.weight.grad)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", ["fast", "local"])  # kaiyuan.chunked_loss=true puts it on any spec
def test_gpt_model_output_layer_and_loss(megatron_parallel, spec):
    """A tiny gpt_smoke-shaped GPTModel (fast and local spec) with the pre-wrap hook against an identical one on
    Megatron's exact (unfused) vocab-parallel cross-entropy: same [b, s] loss and gradients from the output
    layer + loss that GPTModel._postprocess runs, the state dict unchanged, and logits still materialised
    when asked for. (Megatron's compiled fused cross-entropy differs from exact by ~1e-4 in the gradient.)"""
    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    shape = tiny_gpt_shape(share_embeddings_and_output_weights=False)
    plain, chunked = (provide_on_cpu(build_provider(shape, spec)) for _ in range(2))
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
    the schedule's division by the token count. An all-ones loss mask gives every token the same gradient, a
    mask that drops tokens does not; either way the forward's gradients are weighed, nothing recomputed, and
    both equal the plain model's gradients."""
    from megatron.bridge.training.losses import masked_next_token_loss

    from kaiyuan_recipes.fastpath import chunked_loss
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
    assert not recomputed


def test_not_installed_where_the_output_layer_is_vocab_parallel(megatron_parallel):
    from kaiyuan_recipes.fastpath.chunked_loss import unsupported_reason
    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    shape = tiny_gpt_shape()
    model = provide_on_cpu(build_provider(shape, "fast"))
    assert unsupported_reason(model) is None
    model.config.tensor_model_parallel_size = 2
    assert "tensor parallel" in unsupported_reason(model)
    install_chunked_loss([model])
    assert "forward" not in vars(model.output_layer)


def test_fast_spec_runs_register_the_hook(tmp_path):
    from kaiyuan_recipes.fastpath.chunked_loss import install_chunked_loss as hook
    from kaiyuan_recipes.training.config import build_config

    def hooks(*knobs):
        cfg = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", *knobs])[0]
        return getattr(cfg.model, "_pre_wrap_hooks", [])

    assert hook in hooks("kaiyuan.layer_spec=fast")
    assert hook not in hooks("kaiyuan.layer_spec=fast", "kaiyuan.chunked_loss=false")
    assert hook in hooks("kaiyuan.layer_spec=fast", "kaiyuan.zero_stage=2")  # Megatron-FSDP too (GPU-proven)
    assert hook not in hooks("kaiyuan.layer_spec=local")  # auto: the fast spec only
    assert hook in hooks("kaiyuan.layer_spec=local", "kaiyuan.chunked_loss=true")  # asked for: any spec

    def summary_says(*args):  # the dry run reports what will run: the hook stands aside under TP
        import json
        import subprocess
        import sys

        done = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "train", "gpt_smoke", "--dry-run",
                               "--json", f"kaiyuan.run_root={tmp_path}", *args],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout[done.stdout.index("{"):])["fast_path"]["chunked_loss"]

    assert summary_says("kaiyuan.layer_spec=fast") == "on (auto: logits never whole)"
    assert summary_says("kaiyuan.layer_spec=local") == "off (auto: layer_spec=local)"
    assert summary_says("kaiyuan.layer_spec=fast", "model.tensor_model_parallel_size=2",
                        "--nproc-per-node=2").startswith("off (auto: tensor parallel")
    assert summary_says("kaiyuan.layer_spec=local", "kaiyuan.chunked_loss=true",
                        "model.tensor_model_parallel_size=2", "--nproc-per-node=2").startswith("off (tensor parallel")
    from kaiyuan_recipes.fastpath import spec as fast_spec

    try:  # the SDPA kernel order is set with the rest of the fast spec's run settings
        hooks("kaiyuan.layer_spec=fast", "kaiyuan.sdpa_backend=cudnn")
        assert fast_spec._sdpa_priority[0].name == "CUDNN_ATTENTION"
    finally:
        fast_spec.set_sdpa_backend("auto")


def test_weight_gradient_accumulates_into_the_main_grad_with_wgrad_fusion():
    """kaiyuan.wgrad_fusion: over two micro-batches the output layer's weight gradient lands in the fp32 main grad
    (megatron-core's accumulate, installed by apex_standins.torch_wgrad_accumulation) equal to the sum of the
    ordinary gradients, and the weight gets megatron-core's dummy grad with grad_added_to_main_grad set, so DDP's
    hook adds nothing; a weight without a main grad (no DDP) gets its ordinary gradient."""
    from kaiyuan_recipes.fastpath import apex_standins

    assert apex_standins.torch_wgrad_accumulation()
    torch.manual_seed(0)
    hidden = [torch.randn(21, 16, requires_grad=True) for _ in range(2)]
    labels = [torch.randint(0, 300, (21,)) for _ in range(2)]
    upstream = torch.rand(21)
    weight = torch.randn(300, 16, requires_grad=True)
    for h, y in zip(hidden, labels):
        (ChunkedLinearCrossEntropy.apply(h, weight, y, 8, True, False) * upstream).sum().backward()
    expected, weight.grad = weight.grad.clone(), None
    weight.main_grad = torch.zeros_like(weight)
    weight.grad_added_to_main_grad = False
    for h, y in zip(hidden, labels):
        h = h.detach().requires_grad_()
        (ChunkedLinearCrossEntropy.apply(h, weight, y, 8, True, True) * upstream).sum().backward()
    torch.testing.assert_close(weight.main_grad, expected, atol=1e-5, rtol=1e-5)
    assert weight.grad_added_to_main_grad and weight.grad.shape == weight.shape
    weight.zero_out_wgrad, weight.grad = True, None  # tied to the embedding: megatron-core's zero dummy
    (ChunkedLinearCrossEntropy.apply(hidden[0], weight, labels[0], 8, True, True) * upstream).sum().backward()
    assert torch.count_nonzero(weight.grad) == 0
    plain = torch.randn(300, 16, requires_grad=True)
    (ChunkedLinearCrossEntropy.apply(hidden[0], plain, labels[0], 8, True, True) * upstream).sum().backward()
    assert plain.grad is not None and not hasattr(plain, "main_grad")
