"""Recipes resolve to complete ConfigContainers; overrides and bad input give clear errors."""

import pytest

from kaiyuan_recipes.config.overrides import OverrideError
from kaiyuan_recipes.config.recipe_tree import UnknownRecipeError, known_recipes, load_recipe_tree
from kaiyuan_recipes.training.config import build_config
from kaiyuan_recipes.training.validate import ConfigError, resolve_with_upstream, validate


def test_known_recipes():
    assert {"gpt_smoke", "qwen3_1p7b"} <= set(known_recipes())


def test_unknown_recipe_lists_known_ones():
    with pytest.raises(UnknownRecipeError, match="known recipes: gpt_smoke, laoyao_moe_2b, qwen3_1p7b"):
        load_recipe_tree("qwen3_1p8b")


@pytest.mark.parametrize("recipe, world", [("gpt_smoke", 4), ("qwen3_1p7b", 32)])
def test_recipe_resolves_through_megatron_bridge(recipe, world, tmp_path):
    cfg, run = build_config(recipe, [f"kaiyuan.run_root={tmp_path}"])
    resolved = resolve_with_upstream(cfg, world_size=world)
    assert resolved.data_parallel_size == world
    assert cfg.scheduler.lr_decay_style == "WSD"
    assert cfg.checkpoint.most_recent_k == 3
    assert cfg.train.exit_signal_handler is True
    assert cfg.logger.log_throughput is True
    assert cfg.checkpoint.save == str(tmp_path / recipe / "checkpoints") == cfg.checkpoint.load
    assert cfg.logger.tensorboard_dir == str(tmp_path / recipe / "tb_logs")
    assert cfg.dataset.path_to_cache == str(tmp_path / recipe / "dataset_cache")  # not beside shared data
    assert cfg.model.seq_length == cfg.dataset.seq_length == 4096
    assert cfg.model.share_embeddings_and_output_weights is False


def test_shared_defaults_live_in_base_and_recipe_overrides_them():
    smoke = load_recipe_tree("gpt_smoke")
    qwen = load_recipe_tree("qwen3_1p7b")
    assert smoke.optimizer.weight_decay == qwen.optimizer.weight_decay == 0.1  # from _base
    assert smoke.train.train_iters == 200 and qwen.train.global_batch_size == 512


def test_overrides_reach_the_container(tmp_path):
    cfg, run = build_config(
        "gpt_smoke",
        ["train.train_iters=100", "checkpoint.save_interval=50", "model.num_layers=2", f"kaiyuan.run_root={tmp_path}",
         "kaiyuan.run_name=exp1"],
    )
    assert (cfg.train.train_iters, cfg.checkpoint.save_interval, cfg.model.num_layers) == (100, 50, 2)
    assert run.run_dir == tmp_path / "exp1"


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.train_iter=5", "unknown override key 'train.train_iter'; closest valid key: train.train_iters"),
        ("kaiyuan.zero_stag=1", "closest valid key: kaiyuan.zero_stage"),
        ("modle.num_layers=2", "closest valid key: model.num_layers"),
        ("model.num_layers=abc", "model.num_layers='abc': expected an integer"),
        ("optimizer.lr=fast", "optimizer.lr='fast': expected a number"),
        ("train.train_iters", "expected section.field=value"),
    ],
)
def test_bad_override_names_the_key(override, message):
    with pytest.raises(OverrideError, match=message.replace("(", r"\(")):
        build_config("gpt_smoke", [override])


@pytest.mark.parametrize("stage, shard, distopt, fsdp, fmt", [(0, "no_shard", False, False, "torch_dist"),
                                                              (1, "optim", True, False, "torch_dist"),
                                                              (2, "optim_grads", True, True, "fsdp_dtensor")])
def test_zero_stages(stage, shard, distopt, fsdp, fmt):
    cfg, run = build_config("gpt_smoke", [f"kaiyuan.zero_stage={stage}", "kaiyuan.data=mock"])
    assert cfg.ddp.data_parallel_sharding_strategy == shard
    assert cfg.ddp.use_distributed_optimizer is distopt is cfg.optimizer.use_distributed_optimizer
    # the sharding strategy is read only by Megatron-FSDP: stage 2 must turn it on, and upstream accepts it
    resolved = resolve_with_upstream(cfg, world_size=2)
    assert resolved.ddp.use_megatron_fsdp is fsdp and resolved.checkpoint.ckpt_format == fmt
    assert resolved.ddp.data_parallel_sharding_strategy == shard


def test_zero2_accumulates_gradients_in_fp32_as_the_recipe_declares():
    """Megatron-FSDP ignores ddp.grad_reduce_in_fp32 and would keep main gradients in bf16 (its default is the
    compute dtype); the recipe's fp32 holds at ZeRO 2 too, and explicit settings win."""
    import torch

    cfg, _ = build_config("qwen3_1p7b", ["kaiyuan.zero_stage=2"])
    assert cfg.ddp.grad_reduce_in_fp32 and cfg.ddp.megatron_fsdp_main_grads_dtype is torch.float32
    resolve_with_upstream(cfg, world_size=2)
    cfg, _ = build_config("qwen3_1p7b", ["kaiyuan.zero_stage=2", "ddp.grad_reduce_in_fp32=false"])
    assert cfg.ddp.megatron_fsdp_main_grads_dtype is None
    cfg, _ = build_config("qwen3_1p7b", ["kaiyuan.zero_stage=2", "ddp.megatron_fsdp_main_grads_dtype=bf16",
                                         "ddp.megatron_fsdp_grad_comm_dtype=torch.bfloat16"])
    assert cfg.ddp.megatron_fsdp_main_grads_dtype is torch.bfloat16 is cfg.ddp.megatron_fsdp_grad_comm_dtype
    cfg, _ = build_config("qwen3_1p7b", ["kaiyuan.zero_stage=1"])
    assert cfg.ddp.megatron_fsdp_main_grads_dtype is None  # not Megatron-FSDP: untouched
    with pytest.raises(OverrideError, match=r"ddp.megatron_fsdp_grad_comm_dtype='fp8x': expected a dtype, one of"):
        build_config("qwen3_1p7b", ["kaiyuan.zero_stage=2", "ddp.megatron_fsdp_grad_comm_dtype=fp8x"])


def test_the_param_gather_overlap_is_stated_once_and_upstream_keeps_it_without_a_warning(tmp_path):
    """The recipe's ddp.overlap_param_gather is the setting; Bridge, finding the optimizer's twin different, turned
    both on with a warning at every start (and so overrode ddp.overlap_param_gather=false)."""
    import warnings

    for override, want in (([], True), (["ddp.overlap_param_gather=false"], False)):
        cfg, _ = build_config("qwen3_1p7b", [f"kaiyuan.run_root={tmp_path}", *override])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resolved = resolve_with_upstream(cfg, world_size=8)
        assert resolved.ddp.overlap_param_gather is resolved.optimizer.overlap_param_gather is want, override
        assert not [w for w in caught if "not in sync" in str(w.message)], override


def test_overlap_and_recompute_knobs(tmp_path):
    cfg, _ = build_config("qwen3_1p7b", ["kaiyuan.zero_stage=0"])
    assert cfg.ddp.overlap_grad_reduce and not cfg.ddp.overlap_param_gather
    resolve_with_upstream(cfg, world_size=8)
    cfg, _ = build_config("qwen3_1p7b", ["model.recompute_granularity=full", "model.recompute_method=uniform",
                                         "model.recompute_num_layers=1"])
    assert cfg.ddp.overlap_param_gather and cfg.model.recompute_granularity == "full"
    assert resolve_with_upstream(cfg, world_size=8).model.recompute_num_layers == 1


def test_invalid_zero_stage_and_sdpa_backend():
    with pytest.raises(ValueError, match="kaiyuan.zero_stage: expected one of 0, 1, 2; got 3"):
        build_config("gpt_smoke", ["kaiyuan.zero_stage=3"])
    with pytest.raises(ValueError, match=r"kaiyuan.sdpa_backend: expected one of auto, cudnn, .*; got 'triton'"):
        build_config("gpt_smoke", ["kaiyuan.sdpa_backend=triton"])


def test_global_batch_not_divisible():
    cfg, run = build_config("gpt_smoke", ["train.global_batch_size=10", "train.micro_batch_size=4"])
    with pytest.raises(ConfigError, match=r"global_batch_size=10 is not divisible by .* = 4 × 1 = 4"):
        validate(cfg, run, 1)
    cfg, run = build_config("gpt_smoke", ["train.global_batch_size=16", "train.micro_batch_size=4"])
    with pytest.raises(ConfigError, match=r"4 × 8 = 32"):
        validate(cfg, run, 8)
    assert validate(cfg, run, 4)["grad_accumulation"] == 1


def test_seq_longer_than_max_positions():
    cfg, run = build_config("gpt_smoke", ["dataset.seq_length=8192", "model.seq_length=8192"])
    with pytest.raises(ConfigError, match="seq_length=8192 is longer than the model's max_position_embeddings=4096"):
        validate(cfg, run, 1)
    cfg, run = build_config("gpt_smoke", ["dataset.seq_length=2048", "model.seq_length=4096"])
    with pytest.raises(ConfigError, match="model.seq_length=4096 differs from dataset.seq_length=2048"):
        validate(cfg, run, 1)


def test_vocab_smaller_than_tokenizer():
    cfg, run = build_config("gpt_smoke", ["model.vocab_size=151552"])
    with pytest.raises(ConfigError, match="vocab_size=151552 is smaller than the tokenizer's vocabulary"):
        validate(cfg, run, 1)


def test_exit_signal_must_be_the_one_kaiyuan_stop_sends():
    import signal

    cfg, run = build_config("gpt_smoke", [])
    cfg.train.exit_signal = signal.SIGUSR1
    with pytest.raises(ConfigError, match="train.exit_signal=SIGUSR1: `kaiyuan stop` and torchrun send SIGTERM"):
        validate(cfg, run, 1)
    cfg.train.exit_signal_handler = False  # no graceful stop asked for: any signal is the user's business
    validate(cfg, run, 1)


def test_world_not_divisible_by_model_parallel():
    cfg, run = build_config("gpt_smoke", ["model.tensor_model_parallel_size=2"])
    with pytest.raises(ConfigError, match="world size 3 is not divisible by TP×PP×CP"):
        validate(cfg, run, 3)


@pytest.mark.parametrize("spec", ["local", "fast"])
def test_sequence_parallel_refused_with_torch_norms(spec):
    """Without TE / Apex the local and fast specs' norms are torch's, which megatron-core refuses under sequence
    parallelism only when the model is built (on the GPUs); validate() says so before any launch. The last
    assertion fails once megatron-core supports it, and the check can go."""
    cfg, run = build_config("gpt_smoke", [f"kaiyuan.layer_spec={spec}", "model.tensor_model_parallel_size=2",
                                          "model.sequence_parallel=true"])
    with pytest.raises(ConfigError, match="model.sequence_parallel=true needs Transformer Engine or Apex norms"):
        validate(cfg, run, 2)
    cfg.model.sequence_parallel = False
    assert validate(cfg, run, 2)["tensor"] == 2
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    cfg.model.sequence_parallel = True
    with pytest.raises(AssertionError, match="sequence parallel not supported by torch"):
        WrappedTorchNorm(cfg.model, 64)


def test_cuda_graphs_need_a_graph_safe_rng_tracker():
    """A CUDA-graphed step (model.cuda_graph_impl) needs model.use_te_rng_tracker: Megatron-Bridge asserts so only
    when the ranks build the model, a minute into the run (seen on the GPU host); validate() says so before any
    launch. With the flag and no TE, megatron-core's own tracker is graph-safe, the kind its CUDA-graph code
    accepts. The upstream assertion below fails once upstream lifts the requirement, and the check can go."""
    from megatron.core.tensor_parallel import random as mcore_random

    from kaiyuan_recipes import compat

    overrides = ["kaiyuan.layer_spec=fast", "kaiyuan.cuda_graph=false", "model.cuda_graph_impl=full_iteration",
                 "rerun_state_machine.check_for_nan_in_loss=false"]  # the graph by hand, without the knob
    cfg, run = build_config("gpt_smoke", overrides)
    with pytest.raises(ConfigError, match="model.cuda_graph_impl=full_iteration needs model.use_te_rng_tracker=true"):
        validate(cfg, run, 1)
    with pytest.raises(AssertionError, match="RNG tracker is required for cudagraphs"):
        cfg.model.provide()
    cfg, run = build_config("gpt_smoke", [*overrides, "model.use_te_rng_tracker=true"])
    assert validate(cfg, run, 1)["data"] == 1
    assert resolve_with_upstream(cfg, world_size=1).rng.te_rng_tracker  # upstream keeps the two flags equal
    assert not compat.transformer_engine_available()
    saved = mcore_random._CUDA_RNG_STATE_TRACKER, mcore_random._CUDA_RNG_STATE_TRACKER_INITIALIZED
    try:  # what Megatron-Bridge's initialisation then builds (use_cudagraphable_rng: cuda_graph_impl != none)
        mcore_random.initialize_rng_tracker(use_te_rng_tracker=True, use_cudagraphable_rng=True, force_reset=True)
        tracker = mcore_random.get_cuda_rng_tracker()
        assert type(tracker) is mcore_random.CudaRNGStatesTracker and tracker.use_cudagraphable_rng
    finally:  # the process-wide tracker other tests' model-parallel setup made
        mcore_random._CUDA_RNG_STATE_TRACKER, mcore_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = saved


def test_cuda_graph_knob_and_the_loss_guard_that_replaces_megatrons_check(tmp_path):
    """kaiyuan.cuda_graph=true: the full-iteration graph with what it needs (a graph-safe RNG tracker, Megatron's
    host-side NaN check off, the parameter all-gather not overlapped with a forward that a replay runs without its
    hooks), accepted by validate() and upstream's validation; the dry-run summary names it; refused for MoE models
    whose expert shapes vary per batch.
    With Megatron's check off the worker registers NonFiniteLossCallback, which raises on a NaN or Inf step loss
    (naming the loss and the iteration) and passes finite ones and stages without a loss."""
    import torch

    from kaiyuan_recipes import compat

    compat.apply()  # before Megatron-Bridge's training modules, which import TE-only code without it
    from megatron.bridge.training.callbacks import CallbackContext

    from kaiyuan_recipes.training import entry
    from kaiyuan_recipes.training.loss_guard import NonFiniteLossCallback, NonFiniteLossError
    from kaiyuan_recipes.training.summary import summarize

    common = [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock"]
    cfg, run = build_config("gpt_smoke", [*common, "kaiyuan.cuda_graph=true"])
    assert run.fastpath.on("cuda_graph") and cfg.model.cuda_graph_impl == "full_iteration"
    assert cfg.model.use_te_rng_tracker
    assert cfg.model.cuda_graph_use_single_mempool is False  # compat.separate_full_graph_pools
    assert not cfg.rerun_state_machine.check_for_nan_in_loss
    layout = validate(cfg, run, 1)
    resolved = resolve_with_upstream(cfg, world_size=2)  # upstream turns both on if either is
    assert not resolved.ddp.overlap_param_gather and not resolved.optimizer.overlap_param_gather
    summary = summarize(cfg, run, layout, [])
    assert summary["model"]["cuda_graph_impl"] == "full_iteration"
    assert summary["fast_path"]["cuda_graph"] == "on (kaiyuan.cuda_graph=true)"
    # the default (auto) leaves the local spec (this CPU host's) eager
    default, _ = build_config("gpt_smoke", common)
    assert default.model.cuda_graph_impl == "none" and default.rerun_state_machine.check_for_nan_in_loss

    for overrides, guarded in (([], False), (["kaiyuan.cuda_graph=true"], True)):
        cfg, run = build_config("gpt_smoke", [*common, *overrides])
        assert any(isinstance(c, NonFiniteLossCallback) for c in entry.worker_callbacks(cfg, run)) == guarded

    # MoE: the token dispatchers read per-expert counts on the host unless experts are padded to a capacity
    moe = ["kaiyuan.data=mock", f"kaiyuan.run_root={tmp_path}", "kaiyuan.layer_spec=fast", "kaiyuan.cuda_graph=true"]
    cfg, run = build_config("laoyao_moe_2b", moe)
    with pytest.raises(ConfigError, match="model.moe_pad_expert_input_to_capacity=true"):
        validate(cfg, run, 1)
    cfg, run = build_config("laoyao_moe_2b", [*moe, "model.moe_expert_capacity_factor=1.0",
                                              "model.moe_pad_expert_input_to_capacity=true"])
    validate(cfg, run, 1)

    guard = NonFiniteLossCallback()
    state = type("State", (), {"train_state": type("TrainState", (), {"step": 41})()})()
    guard.on_train_step_end(CallbackContext(state=state, model=[], loss_dict={"lm loss": torch.tensor(2.5)}))
    guard.on_train_step_end(CallbackContext(state=state, model=[], loss_dict={}))  # a stage without the loss
    for bad in (float("nan"), float("inf")):
        with pytest.raises(NonFiniteLossError, match=f"lm loss is {bad} at iteration 42"):
            guard.on_train_step_end(CallbackContext(state=state, model=[], loss_dict={"lm loss": torch.tensor(bad)}))


def test_wgrad_fusion_knob(tmp_path):
    """kaiyuan.wgrad_fusion=true: megatron-core's gradient_accumulation_fusion on the fast spec (through the
    compat shim without Apex), accepted by validate() and upstream; refused, naming the knob, where it cannot
    run: the local spec (CPU hosts) and ZeRO 2 (Megatron-FSDP's fused path needs TE)."""
    from kaiyuan_recipes.training.summary import summarize

    common = [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock"]
    cfg, run = build_config("gpt_smoke", [*common, "kaiyuan.layer_spec=fast", "kaiyuan.wgrad_fusion=true"])
    assert cfg.model.gradient_accumulation_fusion
    layout = validate(cfg, run, 1)
    resolve_with_upstream(cfg, world_size=1)
    assert summarize(cfg, run, layout, [])["model"]["gradient_accumulation_fusion"] is True
    eager = build_config("gpt_smoke", [*common, "kaiyuan.layer_spec=fast", "kaiyuan.cuda_graph=false"])[0]
    assert not eager.model.gradient_accumulation_fusion  # auto: only with the graph
    for refused in (["kaiyuan.layer_spec=local"], ["kaiyuan.layer_spec=fast", "kaiyuan.zero_stage=2"]):
        with pytest.raises(ValueError, match="kaiyuan.wgrad_fusion needs kaiyuan.layer_spec=fast"):
            build_config("gpt_smoke", [*common, *refused, "kaiyuan.wgrad_fusion=true"])


def test_step_fusion_auto_turns_on_only_where_measured(tmp_path):
    """kaiyuan.cuda_graph / wgrad_fusion = auto (the defaults): the whole-step graph and the fused weight-gradient
    accumulation together for the fast spec at ZeRO 0/1 with a dense model and TP = PP = 1; eager and unfused
    everywhere else, with the reason; an explicit true / false wins; anything else is refused, naming the knob."""
    from kaiyuan_recipes.fastpath.decisions import graph_ineligible_reason
    from kaiyuan_recipes.training.summary import summarize

    common = [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock"]
    cfg, run = build_config("qwen3_1p7b", [*common, "kaiyuan.layer_spec=fast"])
    assert run.fastpath.on("cuda_graph") and run.fastpath.on("wgrad_fusion")
    assert cfg.model.cuda_graph_impl == "full_iteration" and cfg.model.gradient_accumulation_fusion
    validate(cfg, run, 1)
    resolve_with_upstream(cfg, world_size=1)
    for overrides, reason in (
        (["kaiyuan.layer_spec=local"], "layer_spec=local"),
        (["kaiyuan.layer_spec=fast", "kaiyuan.zero_stage=2"], "ZeRO 2"),
        (["kaiyuan.layer_spec=fast", "model.tensor_model_parallel_size=2"], "tensor or pipeline"),
    ):
        cfg, run = build_config("qwen3_1p7b", [*common, *overrides])
        assert not run.fastpath.on("cuda_graph") and not run.fastpath.on("wgrad_fusion"), overrides
        assert cfg.model.cuda_graph_impl == "none" and not cfg.model.gradient_accumulation_fusion
        assert reason in graph_ineligible_reason(cfg, run)
        summary = summarize(cfg, run, validate(cfg, run, 2), [])["fast_path"]
        assert summary["cuda_graph"].startswith("off (auto: ") and reason in summary["cuda_graph"]
    cfg, run = build_config("laoyao_moe_2b", [*common, "kaiyuan.layer_spec=fast"])
    assert not run.fastpath.on("cuda_graph") and "MoE" in graph_ineligible_reason(cfg, run)
    validate(cfg, run, 1)  # auto never produces the graph validate() refuses for MoE
    cfg, run = build_config("qwen3_1p7b", [*common, "kaiyuan.layer_spec=fast", "kaiyuan.wgrad_fusion=false"])
    assert run.fastpath.on("cuda_graph") and not cfg.model.gradient_accumulation_fusion
    with pytest.raises(ValueError, match="kaiyuan.cuda_graph: expected one of true, false, auto; got 'yes'"):
        build_config("qwen3_1p7b", [*common, "kaiyuan.cuda_graph=yes"])


def test_deterministic_knob(tmp_path, monkeypatch):
    """kaiyuan.deterministic=true: Megatron's deterministic_mode with what upstream requires of it (unfused
    cross-entropy, NCCL_ALGO, a fixed cuBLAS workspace, TE's deterministic kernels), accepted by upstream's
    validation; the knob leaves
    this process's torch determinism setting as it was."""
    import torch

    from kaiyuan_recipes.training.config import deterministic_env

    for key in ("NCCL_ALGO", "CUBLAS_WORKSPACE_CONFIG", "NVTE_ALLOW_NONDETERMINISTIC_ALGO"):
        monkeypatch.delenv(key, raising=False)
    cfg, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.layer_spec=fast",
                                          "kaiyuan.deterministic=true", "kaiyuan.data=mock"])
    assert run.deterministic and cfg.model.deterministic_mode and not cfg.model.cross_entropy_loss_fusion
    assert deterministic_env(cfg) == {"NCCL_ALGO": "Ring", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                                      "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
    before = torch.are_deterministic_algorithms_enabled()
    resolve_with_upstream(cfg, world_size=2)
    assert torch.are_deterministic_algorithms_enabled() == before
    plain, _ = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock"])
    assert not plain.model.deterministic_mode and deterministic_env(plain) == {}


@pytest.mark.parametrize("override", ["logger.log_interval=0", "model.hidden_size=-768", "model.num_layers=0",
                                      "model.num_attention_heads=0", "train.micro_batch_size=0",
                                      "train.train_iters=1.5", "train.train_iters=10.0"])
def test_a_count_that_is_not_a_positive_integer_is_refused_naming_it(override, tmp_path):
    """Megatron divides by these: 0 reached a ZeroDivisionError deep in set-up (or at the first logged step), a
    negative size printed a negative parameter count, 1.5 iterations passed as a number."""
    with pytest.raises(OverrideError, match=rf"^override {override.replace('.', '[.]')}: expected a positive integer$"):
        build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock", override])


def test_counts_from_a_recipe_and_the_rank_count_are_checked_too(tmp_path):
    cfg, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock"])
    with pytest.raises(ConfigError, match="^0 ranks: a run needs at least one"):
        validate(cfg, run, 0, upstream=False)
    cfg.logger.log_interval = 0  # as a recipe file could state it
    with pytest.raises(ConfigError, match=r"^logger.log_interval=0: expected a positive integer$"):
        validate(cfg, run, 1, upstream=False)
    cfg.logger.log_interval = 1
    cfg.optimizer.lr = -1.0
    with pytest.raises(ConfigError, match=r"^optimizer.lr=-1.0: expected a finite number, 0 or more$"):
        validate(cfg, run, 1, upstream=False)


def test_intervals_take_0_for_never_and_float_fields_take_a_whole_float(tmp_path):
    """Upstream reads checkpoint.save_interval=0 / validation.eval_interval=0 as "never"; a negative is refused. A float
    field whose default is an int (optimizer.initial_loss_scale) takes 65536.0."""
    common = [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock"]
    cfg, run = build_config("gpt_smoke", [*common, "checkpoint.save_interval=0", "validation.eval_interval=0",
                                          "optimizer.initial_loss_scale=65536.0"])
    validate(cfg, run, 1, upstream=False)
    assert cfg.checkpoint.save_interval == 0 and cfg.optimizer.initial_loss_scale == 65536.0
    with pytest.raises(OverrideError, match=r"^override checkpoint.save_interval=-1: expected an integer, 0 or more$"):
        build_config("gpt_smoke", [*common, "checkpoint.save_interval=-1"])
