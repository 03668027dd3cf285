"""laoyao_moe_2b: the provider from recipes/laoyao_moe_2b (real megatron-core MoE construction, counts),
the recipe as the original (batch, DP, overlap, recompute, retention, validation cadence, plan data,
tokenizer sha256), and Megatron → Qwen3MoeForCausalLM → Megatron bit for bit through torch_dist files,
with the exported model's KV cache giving the same greedy tokens as no cache; the GPU parity script's routing-flip
accounting on a small exported MoE."""

import json
from pathlib import Path

import pytest
import torch

from kaiyuan_recipes.config.recipe_tree import load_model_file
from kaiyuan_recipes.data.tokenizer import TokenizerError, default_tokenizer_dir
from kaiyuan_recipes.models.param_count import count_parameters
from kaiyuan_recipes.training.config import build_config

SMALL_MOE = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
                 kv_channels=16, seq_length=128, max_position_embeddings=128, position_embedding_type="rope",
                 rotary_base=1000000, normalization="RMSNorm", layernorm_epsilon=1e-6, gated_linear_unit=True,
                 add_bias_linear=False, add_qkv_bias=False, share_embeddings_and_output_weights=False,
                 qk_layernorm=True, vocab_size=151936, make_vocab_size_divisible_by=128, num_moe_experts=8,
                 moe_ffn_hidden_size=32, moe_router_topk=2, moe_router_pre_softmax=False,
                 moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3,
                 moe_token_dispatcher_type="alltoall")


def test_shape_is_2b_total_half_b_active():
    count = count_parameters(load_model_file("laoyao_moe_2b"))
    assert 1.9e9 < count.total < 2.1e9 and 0.4e9 < count.active < 0.6e9


def test_full_size_provider_builds_with_megatron_core(megatron_parallel):
    from megatron.core.transformer.moe.experts import SequentialMLP

    from kaiyuan_recipes.models.providers import provide_on_cpu
    from kaiyuan_recipes.models.shape import laoyao_moe_2b

    provider = laoyao_moe_2b()
    provider.params_dtype = torch.bfloat16
    provider.moe_token_dispatcher_type = "allgather"  # all-to-all creates a CUDA stream when built
    model = provide_on_cpu(provider)
    built = sum(p.numel() for p in model.parameters())
    assert built == count_parameters(load_model_file("laoyao_moe_2b")).total
    layer = model.decoder.layers[0]
    assert isinstance(layer.mlp.experts, SequentialMLP) and len(layer.mlp.experts.local_experts) == 64
    assert layer.mlp.router.topk == 8 and provider.moe_grouped_gemm is False  # no TE here


def test_recipe_matches_the_original(tmp_path, monkeypatch):
    monkeypatch.delenv("LAOYAO_TOKENIZER", raising=False)
    cfg, run = build_config("laoyao_moe_2b", ["kaiyuan.data=mock", f"kaiyuan.run_root={tmp_path}"])
    assert (cfg.dataset.seq_length, cfg.train.micro_batch_size, cfg.train.global_batch_size) == (8192, 14, 112)
    assert cfg.ddp.overlap_grad_reduce and cfg.ddp.overlap_param_gather and cfg.optimizer.use_distributed_optimizer
    assert (cfg.model.recompute_granularity, cfg.model.recompute_method, cfg.model.recompute_num_layers) == \
        ("full", "uniform", 1)
    assert (cfg.checkpoint.save_interval, cfg.checkpoint.most_recent_k) == (2500, 10)
    assert (cfg.validation.eval_interval, cfg.validation.eval_iters) == (15000, 10)
    assert cfg.model.moe_expert_capacity_factor is None and cfg.model.num_moe_experts == 64
    with pytest.raises(Exception, match="english_web"):  # the plan's data is not on this machine
        build_config("laoyao_moe_2b", [f"kaiyuan.run_root={tmp_path}"])


def test_tokenizer_sha256_checked_when_given(tmp_path):
    common = ["kaiyuan.data=mock", f"kaiyuan.run_root={tmp_path}", f"kaiyuan.tokenizer={default_tokenizer_dir()}"]
    with pytest.raises(TokenizerError, match="sha256"):
        build_config("laoyao_moe_2b", common)  # the bundled tokenizer is not GLM-5.2's
    cfg, _ = build_config("laoyao_moe_2b", common + ["kaiyuan.tokenizer_sha256=null"])
    assert cfg.tokenizer.tokenizer_type == "HuggingFaceTokenizer"


def test_moe_roundtrip_through_torch_dist_and_kv_cache(tmp_path, megatron_parallel):
    from transformers import AutoModelForCausalLM

    from kaiyuan_recipes import compat
    from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model, import_hf
    from kaiyuan_recipes.export.megatron_to_hf import bridge_for, export_hf

    compat.import_megatron_bridge()
    from megatron.bridge.training.model_load_save import load_megatron_model

    original = build_cpu_model(SMALL_MOE, torch.bfloat16)
    with torch.no_grad():
        for p in original.parameters():
            p.normal_(0, 0.05)
    bridge_for(SMALL_MOE, 151646).save_megatron_model([original], tmp_path / "megatron")
    out = export_hf(tmp_path / "megatron", tmp_path / "hf", None, default_tokenizer_dir(), show_progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["num_local_experts"] == 8
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    experts = hf.model.layers[1].mlp.experts
    mine = original.decoder.layers[1].mlp.experts.local_experts[3].linear_fc2.weight
    down = experts[3].down_proj.weight if isinstance(experts, torch.nn.ModuleList) else experts.down_proj[3]
    assert torch.equal(down.to(torch.bfloat16), mine)
    ids = torch.tensor([[9707, 11, 1879, 0, 358, 1079]])
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=151643)
    cached = hf.generate(ids, use_cache=True, **kw)
    uncached = hf.generate(ids, use_cache=False, **kw)
    assert torch.equal(cached, uncached)
    from kaiyuan_recipes.serve.engine import GenerationEngine, Request  # what `kaiyuan serve` runs

    engine = GenerationEngine(out, "cpu")
    served = engine.generate([Request(ids[0].tolist(), 12, ignore_eos=True)])[0].token_ids
    assert served == cached[0, ids.shape[1]:].tolist() and engine.stats["steps"] == 11

    back = import_hf(out, tmp_path / "megatron_back", SMALL_MOE)
    loaded = load_megatron_model(str(next(back.glob("iter_*"))), use_cpu_init=True)
    loaded = loaded[0] if isinstance(loaded, list) else loaded
    theirs = {k: v for k, v in loaded.state_dict().items() if not k.endswith("_extra_state")}
    ours = {k: v for k, v in original.state_dict().items() if not k.endswith("_extra_state")}
    assert set(ours) == set(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def experts_step(experts, grouped: bool, x, tokens_per_expert, probs):
    """One forward + backward of `experts` (GroupedGemmSequentialMLP) through its grouped path or through
    SequentialMLP's own loop: output, input gradient, weight gradients, output bias (also tests/gpu)."""
    from megatron.core.transformer.moe.experts import SequentialMLP

    experts.zero_grad(set_to_none=True)
    xi = x.clone().requires_grad_(True)
    out, bias = (experts.forward if grouped else lambda *a: SequentialMLP.forward(experts, *a))(
        xi, tokens_per_expert, probs)
    (out.float() * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()
    return out.float(), xi.grad.float(), [p.grad.float().clone() for p in experts.parameters()], bias


def test_fast_spec_grouped_experts_compute_what_sequential_mlp_computes(megatron_parallel):
    """The fast spec's experts: SequentialMLP's parameters and layout, one grouped GEMM per projection.
    Same outputs and weight gradients as SequentialMLP's own loop, with an expert that gets no tokens."""
    from kaiyuan_recipes.fastpath.grouped_experts import GroupedGemmSequentialMLP
    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    provider = build_provider(dict(SMALL_MOE, activation_func="silu"), "fast")
    provider.params_dtype = torch.bfloat16
    provider.moe_token_dispatcher_type = "allgather"
    experts = provide_on_cpu(provider).decoder.layers[0].mlp.experts
    assert isinstance(experts, GroupedGemmSequentialMLP) and experts._grouped()
    assert "local_experts.7.linear_fc1.weight" in experts.state_dict()  # SequentialMLP's checkpoint layout
    torch.manual_seed(0)
    tokens_per_expert = torch.tensor([5, 0, 7, 3, 9, 1, 4, 11])
    x = torch.randn(int(tokens_per_expert.sum()), 64, dtype=torch.bfloat16)
    probs = torch.rand(x.shape[0])
    (a, ax, ag, abias), (b, bx, bg, _) = (experts_step(experts, grouped, x, tokens_per_expert, probs)
                                          for grouped in (True, False))
    assert abias is None and a.shape == (x.shape[0], 64)
    torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ax, bx, atol=2e-2, rtol=2e-2)
    for ga, gb in zip(ag, bg):
        torch.testing.assert_close(ga, gb, atol=5e-2, rtol=5e-2)
    assert ag[2].abs().sum() == 0  # expert 1 received no tokens: no gradient


def test_grouped_experts_leave_dense_layers_alone():
    from kaiyuan_recipes.models.providers import build_provider

    dense = build_provider(load_model_file("gpt_smoke"), "local")  # imports Megatron-Bridge through compat
    from megatron.bridge.models.gpt_provider import local_layer_spec

    from kaiyuan_recipes.fastpath.grouped_experts import with_grouped_experts

    spec = local_layer_spec(dense)
    before = spec.submodules.mlp
    assert with_grouped_experts(spec).submodules.mlp is before


def test_grouped_experts_finish_megatron_ddp_overlapped_param_gather(megatron_parallel, monkeypatch):
    """Megatron DDP with the distributed optimizer's overlapped all-gather waits for each bucket in a forward
    pre-hook of the module owning its parameters. The grouped path never calls the experts' modules, so it
    runs their hooks itself: every bucket finished after a forward, and the next step's all-gather can start
    (without that: `assert self.param_gather_handle is None` on the third step, H200 run of moe_proof.sh)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    provider = build_provider(dict(SMALL_MOE, activation_func="silu"), "fast")
    provider.moe_token_dispatcher_type = "allgather"
    experts = provide_on_cpu(provider).decoder.layers[0].mlp.experts
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # DDP's buffers name CUDA's device
    ddp = DistributedDataParallel(
        provider, DistributedDataParallelConfig(use_distributed_optimizer=True, overlap_param_gather=True,
                                                overlap_grad_reduce=True, bucket_size=4096), experts)
    groups = ddp.bucket_groups
    assert len(groups) > 2  # several buckets, chained by the hooks
    tokens_per_expert = torch.tensor([5, 0, 7, 3, 9, 1, 4, 11])
    x = torch.randn(int(tokens_per_expert.sum()), 64)
    for _ in range(3):
        ddp.start_param_sync()  # what the optimizer step does with overlap_param_gather
        assert groups[0].param_gather_handle is not None or groups[0].param_gather_dispatched
        experts(x, tokens_per_expert, torch.rand(x.shape[0]))
        assert all(g.param_gather_handle is None for g in groups)


def test_export_parity_counts_routing_flips(tmp_path, megatron_parallel, monkeypatch):
    """tests/gpu/export_parity.py's comparison on the CPU, for a small MoE exported to HF in fp32: no routing
    decision differs and the logits agree; after a nudge to one HF router the recorder finds the flipped
    decisions and the logits before each prompt's first flip are compared apart from those after."""
    import sys

    from transformers import AutoModelForCausalLM

    from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model
    from kaiyuan_recipes.export.megatron_to_hf import bridge_for, export_hf

    sys.path.insert(0, str(Path(__file__).parent / "gpu"))
    from conftest import megatron_forward_on_cpu
    from export_parity import compare

    megatron = build_cpu_model(SMALL_MOE, torch.float32, "fast")
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in megatron.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if "router" in name else 0.05) + ("norm" in name))
    bridge_for(SMALL_MOE, 151646).save_megatron_model([megatron], tmp_path / "megatron")
    out = export_hf(tmp_path / "megatron", tmp_path / "hf", None, default_tokenizer_dir(), show_progress=False)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager").eval()
    megatron_forward_on_cpu(monkeypatch.setattr)
    batch = [torch.randint(0, 150000, (48,)).tolist() for _ in range(4)]
    same = compare(megatron.eval(), hf, batch, 151646)
    assert same["routing"] == {"token_layer_decisions": 4 * 48 * 2, "decisions_differing": 0, "prompts_with_a_flip": 0,
                               "max_abs_logit_diff_before_first_flip": same["max_abs_logit_diff"]}
    assert same["max_abs_logit_diff"] < 1e-4
    gate = hf.model.layers[1].mlp.gate.weight
    with torch.no_grad():
        gate.add_(torch.randn_like(gate) * 0.05)
    nudged = compare(megatron, hf, batch, 151646)
    assert nudged["routing"]["decisions_differing"] > 0 and nudged["routing"]["prompts_with_a_flip"] > 0
    assert nudged["max_abs_logit_diff"] > 1e-2
    routers = [m for m in megatron.modules() if type(m).__name__ == "TopKRouter"]
    assert routers and not any(r._forward_hooks for r in routers)  # its hooks removed
