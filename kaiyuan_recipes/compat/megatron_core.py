"""megatron-core defects: the distributed optimizer's state on resume without Apex/TE (0.19), fusions the local
spec cannot run, a torch_dist save that needs CUDA, a graph pool reused after release, and (0.15, the NeMo 2
environment) a CUDA build that fails uncaught on a host without a GPU."""

from __future__ import annotations

import importlib
import types
from typing import Any

from kaiyuan_recipes.compat.megatron_bridge import install_lora_placeholder
from kaiyuan_recipes.compat.patching import patch_method


def ensure_optimizer_state_for_load(dist_optimizer: Any, is_loading: bool) -> bool:
    """Give the inner optimizer its (dummy) state before a load, with upstream's own initialiser."""
    if not is_loading or dist_optimizer.optimizer.state:
        return False
    dist_optimizer._init_optimizer_states_with_dummy_values()
    return True


def init_optimizer_state_before_load() -> bool:
    """megatron-core 0.19's DistributedOptimizer.state_dict() asserts that the inner optimizer holds
    exactly one 'step' value when neither Apex nor TE is installed; a fresh torch.optim.AdamW has no
    state until its first step, so resuming from a checkpoint fails (`assert len(steps) == 1`).
    Upstream already fills the state with dummy values before loading, but only on the Megatron-FSDP
    path; do the same for the plain distributed optimizer. The loaded checkpoint then overwrites it."""
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        return False

    def wrap(original):
        def sharded_state_dict(self, model_sharded_state_dict={}, is_loading=False, *args, **kwargs):  # noqa: B006
            ensure_optimizer_state_for_load(self, is_loading)
            return original(self, model_sharded_state_dict, is_loading, *args, **kwargs)
        return sharded_state_dict

    return patch_method(distrib_optimizer.DistributedOptimizer, "sharded_state_dict", wrap)


def refuse_an_empty_split() -> bool:
    """megatron-core's GPTDataset._get_num_epochs adds a split's tokens epoch by epoch until the samples asked of it
    are covered: a split without documents (a small source's validation split at dataset.split 99,1,0) adds 0 and
    loops forever, silently, in 'building dataset indices' (a run never starts, `kaiyuan data index` never ends).
    Refused instead, naming the source and the split."""
    from megatron.core.datasets import gpt_dataset

    def wrap(original):
        def _get_num_epochs(self, num_tokens_per_epoch: int) -> int:
            if num_tokens_per_epoch <= 0 and self.num_samples is not None:
                asked = self.num_samples * self.config.sequence_length + self.config.add_extra_token_to_sequence
                if asked > 0:
                    where = (f"{len(self.indices)} documents at dataset.split {self.config.split}; give the source "
                             "more documents, or name each split's sources (dataset.blend_per_split, kaiyuan.heldout)"
                             if self.config.split else f"{len(self.indices)} documents; give it documents")
                    raise ValueError(f"{self.dataset_path}: its {self.index_split.name} split holds no tokens "
                                     f"({where}) and {self.num_samples:,} samples are asked of it")
            return original(self, num_tokens_per_epoch)
        return _get_num_epochs

    return patch_method(gpt_dataset.GPTDataset, "_get_num_epochs", wrap)


def restore_adam_step_per_parameter() -> bool:
    """megatron-core 0.19, distributed optimizer without Apex/TE (torch AdamW keeps a 'step' tensor per
    parameter), two defects in DistributedOptimizer.load_state_dict, both showing as a resumed run whose
    first step matches the uninterrupted run and whose second does not:
    - it gives every parameter the *same* step tensor; torch's foreach/fused AdamW then adds 1 to that
      one tensor once per parameter per step, so after one step Adam's bias correction is far off;
    - the dp_reshardable parameter-state load then copies the template's stale step (a non-persistent
      entry: the value before loading) over the restored one.
    After upstream's load, give each parameter its own tensor holding the checkpoint's step (kept in
    the param_groups, where upstream's state_dict() put it)."""
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        return False

    def wrap(original):
        def load_state_dict(self, state_dict):
            groups = (state_dict.get("optimizer") or {}).get("param_groups") or []
            steps = {g["step"] for g in groups if g.get("step") is not None}
            original(self, state_dict)
            if self.ddp_config.use_megatron_fsdp or len(steps) != 1:
                return
            step = float(steps.pop())
            for param_state in self.optimizer.state.values():
                if "step" in param_state:
                    param_state["step"] = param_state["step"].new_full((), step)
        return load_state_dict

    return patch_method(distrib_optimizer.DistributedOptimizer, "load_state_dict", wrap)


# Settings a model needs on Megatron's local (non-TE) layer spec where upstream's default fails
# without Transformer Engine / Apex. On a GPU (tests/gpu/test_local_spec_compat.py checks each):
# only the masked-softmax fusion; rope, bias-activation, bias-dropout and gradient-accumulation
# fusions already default to off or switch themselves off, and cross-entropy fusion and
# transformer_impl="transformer_engine" train fine on the local spec.
LOCAL_SPEC_SETTINGS: dict[str, Any] = {
    "masked_softmax_fusion": False,
}


def apply_local_spec_settings(provider: Any) -> Any:
    """Point a GPTModelProvider at the local spec and turn off the fusions that need TE/Apex."""
    from megatron.bridge.models.gpt_provider import local_layer_spec

    provider.transformer_layer_spec = local_layer_spec
    provider.transformer_impl = "local"  # says what the spec is; not a workaround
    for key, value in LOCAL_SPEC_SETTINGS.items():
        setattr(provider, key, value)
    return provider


class _CpuOnlyCuda:
    """torch.cuda as seen by code that only needs a device for small flag tensors and a sync point."""

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def synchronize(*_args: Any, **_kwargs: Any) -> None:
        return None

    @staticmethod
    def get_rng_state(*_args: Any, **_kwargs: Any) -> Any:
        import torch

        return torch.empty(0, dtype=torch.uint8)  # no CUDA generator exists on this host


class _CpuOnlyTorch(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _CpuOnlyCuda()

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)


def separate_full_graph_pools(model_cfg: Any) -> None:
    """Megatron-Bridge deletes the training step's full-iteration CUDA graph when training ends
    (train._delete_cuda_graphs), but megatron-core keeps the process-wide pool handle that graph owned
    (full_cuda_graph._shared_graph_pool). The final evaluation then captures its graph into that released pool
    and PyTorch asserts (`use_count > 0 INTERNAL ASSERT FAILED`, CUDACachingAllocator.cpp): every run with
    model.cuda_graph_impl=full_iteration that reaches train_iters fails there. With one pool per
    capture the validation graph gets a pool of its own; the cost is that pool's memory beside training's."""
    model_cfg.cuda_graph_use_single_mempool = False


# The megatron-core modules on the torch_dist save path that call torch.cuda unconditionally.
_CHECKPOINT_SAVE_MODULES = (
    "megatron.core.dist_checkpointing.strategies.filesystem_async",  # preload_tensors: cuda.synchronize()
    "megatron.core.dist_checkpointing.strategies.state_dict_saver",  # finalize: flag on cuda.current_device()
    "megatron.bridge.training.checkpointing",  # get_rng_state: cuda.get_rng_state()
)


def cpu_checkpoint_save() -> bool:
    """megatron-core 0.19 writes a torch_dist checkpoint with two unconditional CUDA calls (a
    torch.cuda.synchronize() after the device-to-host copies, and the write-failure flag tensor
    on torch.cuda.current_device()), and megatron-bridge's saver reads the CUDA RNG state, so saving
    on a host without CUDA fails ("Found no NVIDIA driver"). On such a host, give those three modules a
    view of torch whose cuda.synchronize is a no-op, whose current device is the CPU (the flag is
    broadcast over gloo) and whose CUDA RNG state is empty (no CUDA generator exists)."""
    import torch

    if torch.cuda.is_available():
        return False
    install_lora_placeholder()  # the bridge module below imports megatron.bridge
    for name in _CHECKPOINT_SAVE_MODULES:
        module = importlib.import_module(name)
        if not isinstance(module.torch, _CpuOnlyTorch):
            module.torch = _CpuOnlyTorch()
    return True


def cpu_cuda_arch_list() -> bool:
    """NeMo 2 environment (megatron-core 0.15): `import megatron.core` JIT-builds a CUDA allocator in
    inference/unified_memory.py; on a host without a GPU, torch's cpp_extension raises IndexError (no CUDA
    arch known), which upstream does not catch (it catches RuntimeError/ImportError/OSError), so every
    `nemo llm …` fails. Naming an arch makes the build fail the way upstream expects (caught, feature off).
    Runs at interpreter start in that environment (a .pth file written by `make env-nemo2`), so it must be
    cheap: no torch import; a host without the NVIDIA driver is a host without a GPU."""
    import os

    if os.environ.get("TORCH_CUDA_ARCH_LIST") or os.path.exists("/proc/driver/nvidia/version"):
        return False
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
    return True


def nemo2_distributed_optimizer_saves() -> bool:
    """megatron-core 0.15 (NeMo 2.7's) without Transformer Engine or Apex falls back to torch's AdamW, whose scalar
    'step' state its distributed optimizer cannot save: the first checkpoint fails with
    `(torch.Size([]), 0, <parameter size>)`. The NeMo 2 factories then use the plain optimizer (the same Adam on
    one data-parallel rank; optimizer memory not sharded over more)."""
    import importlib.util

    return any(importlib.util.find_spec(m) is not None for m in ("transformer_engine", "apex"))
