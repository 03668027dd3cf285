"""Workarounds for upstream defects, one function per defect, each applied only when needed.

Every workaround here has a test in tests/test_compat.py that fails once upstream fixes the defect,
so the workaround can be deleted. Nothing outside this module patches upstream code.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from typing import Any, Callable

_LORA_MODULE = "megatron.bridge.peft.lora_layers"
_LORA_NAMES = (
    "LinearAdapter",
    "LoRALinear",
    "LoRATopKRouter",
    "TELinearAdapter",
    "TEFusedLoRALinear",
)


class LoRAUnavailableError(RuntimeError):
    pass


def transformer_engine_available() -> bool:
    try:
        return importlib.util.find_spec("transformer_engine") is not None and bool(
            importlib.util.find_spec("transformer_engine.pytorch")
        )
    except (ImportError, ValueError):
        return False


def _lora_unavailable(name: str) -> type:
    def _refuse(*_args: Any, **_kwargs: Any) -> None:
        raise LoRAUnavailableError(
            f"{name}: LoRA in megatron-bridge 0.6.2 needs Transformer Engine, which is not installed "
            "on this host. Pretraining works without it; for LoRA/PEFT install transformer-engine."
        )

    return type(name, (), {"__init__": _refuse})


def install_lora_placeholder() -> bool:
    """megatron-bridge 0.6.2 imports transformer_engine.pytorch unconditionally in
    peft/lora_layers.py, so `import megatron.bridge` fails without TE. Register a placeholder
    module whose classes refuse to be built with a clear message. Returns True if installed."""
    if transformer_engine_available() or _LORA_MODULE in sys.modules:
        return False
    placeholder = types.ModuleType(_LORA_MODULE)
    placeholder.__doc__ = "kaiyuan_recipes.compat placeholder: LoRA needs Transformer Engine."
    for name in _LORA_NAMES:
        setattr(placeholder, name, _lora_unavailable(name))

    def patch_linear_module(*_a: Any, **_k: Any) -> None:
        _lora_unavailable("patch_linear_module")()  # raises LoRAUnavailableError

    placeholder.patch_linear_module = patch_linear_module
    sys.modules[_LORA_MODULE] = placeholder
    return True


def dataset_helpers_prebuilt() -> bool:
    try:
        from megatron.core.datasets import helpers_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def skip_prebuilt_helpers_build() -> bool:
    """megatron-bridge calls megatron.core.datasets.utils.compile_helpers() (runs `make` in the
    package dir) on every start; the PyPI megatron-core wheel ships helpers_cpp compiled but no
    Makefile, so `make` fails and training exits. Skip the build when helpers_cpp already imports."""
    if not dataset_helpers_prebuilt():
        return False
    import megatron.core.datasets.utils as mcore_dataset_utils

    original = mcore_dataset_utils.compile_helpers
    if getattr(original, "_kaiyuan_skip", False):
        return True

    def compile_helpers() -> None:
        if not dataset_helpers_prebuilt():
            original()

    compile_helpers._kaiyuan_skip = True  # type: ignore[attr-defined]
    mcore_dataset_utils.compile_helpers = compile_helpers
    # initialize.py bound the name at import time.
    init_mod = sys.modules.get("megatron.bridge.training.initialize")
    if init_mod is not None:
        init_mod.compile_helpers = compile_helpers
    return True


def patch_method(cls: type, name: str, wrap: Callable[[Any], Any]) -> bool:
    """Replace cls.name by wrap(original) once (marked, so applying twice is a no-op); returns True."""
    original = getattr(cls, name)
    if getattr(original, "_kaiyuan_patched", False):
        return True
    patched = functools.wraps(original)(wrap(original))
    patched._kaiyuan_patched = True
    setattr(cls, name, patched)
    return True


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


def restore_adam_step_per_parameter() -> bool:
    """megatron-core 0.19, distributed optimizer without Apex/TE (torch AdamW keeps a 'step' tensor per
    parameter), two defects in DistributedOptimizer.load_state_dict, both seen on the H200 as a resumed
    run whose first step matches the uninterrupted run and whose second does not:
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
# without Transformer Engine / Apex. Measured on an H200 (tests/gpu/test_local_spec_compat.py):
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


def _wgrad_accum_fp32(total_input: Any, grad_output: Any, main_grad: Any) -> None:
    """main_grad (fp32) += grad_outputᵀ · total_input: for bf16/fp16 inputs one cuBLAS call accumulating in fp32."""
    import torch

    if total_input.dtype == torch.float32:
        _wgrad_accum_same_dtype(total_input, grad_output, main_grad)
    else:
        torch.addmm(main_grad, grad_output.t(), total_input, out_dtype=torch.float32, out=main_grad)


def _wgrad_accum_same_dtype(total_input: Any, grad_output: Any, main_grad: Any) -> None:
    main_grad.addmm_(grad_output.t(), total_input)


def torch_wgrad_accumulation() -> bool:
    """megatron-core fuses a linear layer's weight-gradient GEMM with the accumulation into the fp32 main grad
    (gradient_accumulation_fusion) only through Apex's fused_weight_gradient_mlp_cuda extension or TE. Without
    them every weight gradient is materialised in bf16 and added to main_grad by a separate kernel (34 ms of
    qwen3_1p7b's step on the H200). torch's addmm with out_dtype (CUDA: bf16 inputs, fp32 output, torch 2.8+)
    is that accumulate in one call: installed as the extension megatron-core's layers call. For
    kaiyuan.wgrad_fusion; returns whether the layers can fuse now."""
    import torch
    from megatron.core.tensor_parallel import layers

    if layers._grad_accum_fusion_available:
        return True  # Apex's extension, or already installed
    if not hasattr(torch.ops.aten.addmm, "dtype_out"):
        return False
    layers.fused_weight_gradient_mlp_cuda = types.SimpleNamespace(
        wgrad_gemm_accum_fp32=_wgrad_accum_fp32, wgrad_gemm_accum_fp16=_wgrad_accum_same_dtype)
    layers._grad_accum_fusion_available = True
    return True


def _foreach_l2_norm(chunk_size: int, noop_flag: Any, tensor_lists: list, per_tensor: bool, *args: Any) -> Any:
    """amp_C.multi_tensor_l2norm's interface: the norm over every tensor, left on the device."""
    import torch

    if not tensor_lists[0]:
        return torch.zeros(1, dtype=torch.float32, device="cuda"), None  # upstream's fallback: a CUDA zero
    norms = torch.stack(torch._foreach_norm(tensor_lists[0], dtype=torch.float32))
    return torch.linalg.vector_norm(norms).reshape(1), norms if per_tensor else None


def _foreach_scale(chunk_size: int, noop_flag: Any, tensor_lists: list, scale: float) -> None:
    """amp_C.multi_tensor_scale's interface (dst = src * scale) in a few foreach kernels."""
    import torch

    src, dst = tensor_lists
    if all(a is b for a, b in zip(src, dst)):
        torch._foreach_mul_(dst, scale)
    else:
        torch._foreach_copy_(dst, src if scale == 1.0 else torch._foreach_mul(src, scale))


def foreach_grad_clip() -> bool:
    """Without Apex or TE, megatron-core's gradient clipping falls back to megatron.core.utils'
    local_multi_tensor_l2_norm, which turns each parameter's norm into a Python float (one device-to-host sync
    per parameter, 227 a step for qwen3_1p7b), and local_multi_tensor_scale, two kernels per parameter.
    Route both through torch's foreach kernels; megatron-core still reads the total norm once, as with Apex."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    replacements = {"l2_norm_impl": (utils.local_multi_tensor_l2_norm, _foreach_l2_norm),
                    "multi_tensor_scale_impl": (utils.local_multi_tensor_scale, _foreach_scale)}
    patched = False
    for module in (clip_grads, optimizer):  # each binds the fallbacks it imported under these names
        for name, (local, ours) in replacements.items():
            if getattr(module, name, None) is local:
                setattr(module, name, ours)
                patched = True
    return patched


def separate_full_graph_pools(model_cfg: Any) -> None:
    """Megatron-Bridge deletes the training step's full-iteration CUDA graph when training ends
    (train._delete_cuda_graphs), but megatron-core keeps the process-wide pool handle that graph owned
    (full_cuda_graph._shared_graph_pool). The final evaluation then captures its graph into that released pool
    and PyTorch asserts (`use_count > 0 INTERNAL ASSERT FAILED`, CUDACachingAllocator.cpp): every run with
    model.cuda_graph_impl=full_iteration that reaches train_iters failed there on the H200. With one pool per
    capture the validation graph gets a pool of its own; the cost is that pool's memory beside training's."""
    model_cfg.cuda_graph_use_single_mempool = False


def apply() -> None:
    """Apply every workaround that this host needs. Call before importing megatron.bridge."""
    install_lora_placeholder()
    skip_prebuilt_helpers_build()
    init_optimizer_state_before_load()
    restore_adam_step_per_parameter()
    foreach_grad_clip()
    cpu_checkpoint_save()


CONFIG_TARGET_PREFIX = "kaiyuan_recipes.models."


def import_megatron_bridge() -> types.ModuleType:
    """Import megatron.bridge with the workarounds in place; the single entry point for it."""
    apply()
    import megatron.bridge as bridge
    import megatron.bridge.training.initialize  # noqa: F401  (so the helpers patch reaches it)

    skip_prebuilt_helpers_build()
    # Not workarounds: a fast-spec checkpoint's run_config.yaml names our layer-spec function (Megatron-Bridge
    # instantiates only allowlisted modules) and apply_rope_fusion=True (refused while RoPE's hooks are empty);
    # the fast spec's SwiGLU backward kernel (models/swiglu_backward.py).
    from megatron.bridge.utils.instantiate_utils import register_allowed_target_prefix

    from kaiyuan_recipes.models.fast_spec import register_compiled_rope

    register_allowed_target_prefix(CONFIG_TARGET_PREFIX)
    register_compiled_rope()
    if importlib.util.find_spec("triton") is not None:  # absent with a CPU-only torch: upstream's backward stays
        from kaiyuan_recipes.models.swiglu_backward import register_swiglu_backward

        register_swiglu_backward()
    return bridge
