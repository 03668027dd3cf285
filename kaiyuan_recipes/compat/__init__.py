"""Workarounds for upstream defects, and nothing else: one module per upstream, one function per defect, each
applied only where the defect shows. Performance patches (kernels Apex or TE would give) are the fast path's
(kaiyuan_recipes/fastpath/). NeMo-Run's executor registration is launch/nemo_run_executors.py: an extension, not
a defect.

WORKAROUNDS is the table: the defect, the versions it was seen in, and the test that fails once upstream fixes it
(tests/test_compat.py checks that every row names a test that exists)."""

from __future__ import annotations

import types
from typing import NamedTuple

from kaiyuan_recipes.compat.datatrove import word_tokenizer_language
from kaiyuan_recipes.compat.megatron_bridge import (
    LoRAUnavailableError,
    ResiliencyUnavailableError,
    dataset_helpers_prebuilt,
    install_lora_placeholder,
    install_resiliency_placeholder,
    pretrain_imports_resiliency,
    resiliency_placeholder_installed,
    size_weight_decay_by_max_steps,
    skip_prebuilt_helpers_build,
    te_importing_modules,
    transformer_engine_available,
    wgrad_fusion_without_apex,
)
from kaiyuan_recipes.compat.megatron_core import (
    LOCAL_SPEC_SETTINGS,
    apply_local_spec_settings,
    cpu_checkpoint_save,
    cpu_cuda_arch_list,
    ensure_optimizer_state_for_load,
    init_optimizer_state_before_load,
    nemo2_distributed_optimizer_saves,
    refuse_an_empty_split,
    restore_adam_step_per_parameter,
    separate_full_graph_pools,
)
from kaiyuan_recipes.compat.nemo_run import quote_srun_arguments
from kaiyuan_recipes.compat.patching import patch_method
from kaiyuan_recipes.compat.torch_cuda import graph_capture
from kaiyuan_recipes.compat.torch_dcp import RefusedPickle, restricted_dcp_metadata


class Workaround(NamedTuple):
    function: str
    upstream: str
    versions: str
    defect: str
    test: str  # tests/<file>.py::<test function> that fails once upstream is fixed


WORKAROUNDS = (
    Workaround("install_lora_placeholder", "megatron-bridge",
               "0.5.0 (peft/lora.py, lora_layers.py), 0.6.2 (lora_layers.py)",
               "`import megatron.bridge` imports Transformer Engine (found by te_importing_modules)",
               "test_compat.py::test_upstream_megatron_bridge_import_still_needs_transformer_engine"),
    Workaround("install_resiliency_placeholder", "megatron-bridge", "0.5.0, 0.6.2 (training/pretrain.py)",
               "`pretrain` imports nvidia-resiliency-ext unconditionally; its wheels need glibc >= 2.39",
               "test_compat.py::test_upstream_pretrain_still_imports_resiliency_ext_unconditionally"),
    Workaround("skip_prebuilt_helpers_build", "megatron-bridge", "0.5.0, 0.6.2 (megatron-core 0.18.0, 0.19.2 wheels)",
               "every start runs `make` for dataset helpers the wheel ships prebuilt, without a Makefile",
               "test_compat.py::test_upstream_compile_helpers_still_fails_on_the_wheel"),
    Workaround("size_weight_decay_by_max_steps", "megatron-bridge", "0.5.0",
               "wd_incr_steps sized by train.train_iters (no scheduler.max_steps): a curriculum's phases differ",
               "test_compat.py::test_upstream_weight_decay_schedule_still_ignores_max_steps"),
    Workaround("init_optimizer_state_before_load", "megatron-core", "0.18.0, 0.19.2, no Apex/TE",
               "DistributedOptimizer.state_dict asserts one Adam step on a fresh optimizer: resume fails",
               "test_compat.py::test_upstream_distributed_optimizer_still_needs_state_before_load"),
    Workaround("restore_adam_step_per_parameter", "megatron-core", "0.18.0, 0.19.2, no Apex/TE",
               "load_state_dict shares one step tensor across parameters and restores a stale step",
               "test_compat_adam_step.py::test_upstream_resume_still_resets_adam_step"),
    Workaround("refuse_an_empty_split", "megatron-core", "0.18.0, 0.19.2 (datasets/gpt_dataset.py)",
               "a split without documents asked for samples: _get_num_epochs adds 0 tokens per epoch forever",
               "test_compat.py::test_upstream_num_epochs_still_loops_forever_on_an_empty_split"),
    Workaround("apply_local_spec_settings", "megatron-core", "0.18.0, 0.19.2, no TE/Apex",
               "masked-softmax fusion on by default, fails on the local spec without TE/Apex",
               "test_compat.py::test_upstream_defaults_still_enable_te_only_fusions"),
    Workaround("cpu_checkpoint_save", "megatron-core + megatron-bridge", "0.18.0, 0.19.2 / 0.5.0, 0.6.2, no CUDA",
               "a torch_dist save calls torch.cuda unconditionally (sync, flag tensor, RNG state)",
               "test_compat.py::test_upstream_torch_dist_save_still_needs_cuda"),
    Workaround("separate_full_graph_pools", "megatron-core + megatron-bridge", "0.18.0, 0.19.2 / 0.5.0, 0.6.2",
               "the final evaluation captures into the released training graph's pool (allocator assert)",
               "gpu/test_compat_gpu.py::test_upstream_final_evaluation_capture_still_fails_in_the_deleted_training_graphs_pool"),
    Workaround("graph_capture", "torch", "2.11.0, 2.14.1 (read in their torch/cuda/graphs.py)",
               "an invalidated CUDA-graph capture leaves torch.cuda.graph's capture stream current",
               "gpu/test_compat_gpu.py::test_upstream_failed_capture_still_leaves_its_capture_stream_current"),
    Workaround("wgrad_fusion_without_apex", "megatron-bridge + megatron-core", "0.6.2 / 0.19.2, TE without Apex",
               "gradient_accumulation_fusion on where TE imports; the GPT output layer then refuses to build",
               "test_compat.py::test_upstream_te_default_still_breaks_the_output_layer_without_apex"),
    Workaround("cpu_cuda_arch_list", "megatron-core", "0.15.3 (NeMo 2 environment), no GPU",
               "`import megatron.core` JIT-builds a CUDA allocator; IndexError uncaught without a GPU",
               "test_nemo2.py::test_upstream_megatron_core_0_15_import_still_breaks_without_a_gpu_arch"),
    Workaround("nemo2_distributed_optimizer_saves", "megatron-core", "0.15.3 (NeMo 2 environment), no TE/Apex",
               "the distributed optimizer cannot save torch AdamW's scalar step: the first checkpoint fails",
               "test_nemo2.py::test_upstream_megatron_core_0_15_still_falls_back_to_torch_adamw_without_te_or_apex"),
    Workaround("quote_srun_arguments", "nemo-run", "0.11.1 (core/execution/slurm.py)",
               "`noquote` is an alias of str, so no argument of the sbatch script's srun line is shell-quoted",
               "test_slurm_script.py::test_upstream_nemo_run_still_leaves_srun_arguments_unquoted"),
    Workaround("word_tokenizer_language", "datatrove", "0.10.1 (utils/word_tokenizers.py)",
               "`zh` gets spaCy's multilingual tokenizer (a Chinese sentence is one word), not the Chinese one",
               "test_clean_words.py::test_upstream_datatrove_still_splits_chinese_into_sentences_for_zh"),
    Workaround("restricted_dcp_metadata", "torch", "2.14.1 (torch/distributed/checkpoint/filesystem.py)",
               "FileSystemReader.read_metadata unpickles .metadata with plain pickle: a crafted one runs code",
               "test_ckpt_safety.py::test_upstream_dcp_metadata_reader_still_runs_a_crafted_pickle"),
)


def apply() -> None:
    """Apply every workaround that this host needs. Call before importing megatron.bridge."""
    install_lora_placeholder()
    install_resiliency_placeholder()
    skip_prebuilt_helpers_build()
    size_weight_decay_by_max_steps()
    init_optimizer_state_before_load()
    restore_adam_step_per_parameter()
    cpu_checkpoint_save()
    refuse_an_empty_split()


def import_megatron_bridge() -> types.ModuleType:
    """Import megatron.bridge with the workarounds in place. A process that builds or reads back one of our models
    calls fastpath.prepare_megatron_bridge, which adds what reading our configs needs."""
    apply()
    import megatron.bridge as bridge
    import megatron.bridge.training.initialize  # noqa: F401  (so the helpers patch reaches it)

    skip_prebuilt_helpers_build()
    return bridge


__all__ = ["WORKAROUNDS", "LOCAL_SPEC_SETTINGS", "LoRAUnavailableError", "RefusedPickle", "ResiliencyUnavailableError",
           "Workaround", "apply",
           "graph_capture", "restricted_dcp_metadata",
           "apply_local_spec_settings", "cpu_checkpoint_save", "cpu_cuda_arch_list", "dataset_helpers_prebuilt",
           "ensure_optimizer_state_for_load", "import_megatron_bridge", "init_optimizer_state_before_load",
           "install_lora_placeholder", "install_resiliency_placeholder", "nemo2_distributed_optimizer_saves",
           "pretrain_imports_resiliency", "refuse_an_empty_split", "resiliency_placeholder_installed",
           "patch_method", "quote_srun_arguments", "restore_adam_step_per_parameter",
           "separate_full_graph_pools", "size_weight_decay_by_max_steps", "skip_prebuilt_helpers_build",
           "te_importing_modules", "transformer_engine_available", "wgrad_fusion_without_apex",
           "word_tokenizer_language"]
