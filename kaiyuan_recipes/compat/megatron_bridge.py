"""megatron-bridge defects (0.5.0, 0.6.2): a hard Transformer Engine import, a hard nvidia-resiliency-ext import in
`pretrain`, a helpers build that cannot work on the PyPI megatron-core wheel, (0.5.0) a weight-decay schedule sized
by the run's own train_iters, and (0.6.2) a gradient-accumulation fusion default that a TE host without Apex cannot
build."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, Callable

from kaiyuan_recipes.compat.patching import patch_method

# The LoRA modules that megatron-bridge imports from `import megatron.bridge` (peft_bridge, recipes, flop_utils).
# Which of them import Transformer Engine at module level depends on the version: 0.6.2 lora_layers only,
# 0.5.0 lora too. te_importing_modules() reads their source to tell.
_PEFT_MODULES = ("megatron.bridge.peft.lora_layers", "megatron.bridge.peft.lora")


class LoRAUnavailableError(RuntimeError):
    pass


def transformer_engine_available() -> bool:
    try:
        return importlib.util.find_spec("transformer_engine") is not None and bool(
            importlib.util.find_spec("transformer_engine.pytorch")
        )
    except (ImportError, ValueError):
        return False


def _module_tree(module: str) -> ast.Module | None:
    """The source of megatron.bridge's `module` parsed, without importing it: find_spec of a submodule would run
    megatron/bridge/__init__.py, which is the import that fails."""
    try:
        spec = importlib.util.find_spec("megatron.bridge")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0], *module.split(".")[2:]).with_suffix(".py")
    return ast.parse(path.read_text(encoding="utf-8")) if path.is_file() else None


def _imports_transformer_engine(tree: ast.Module) -> bool:
    """A module-level `import transformer_engine...` / `from transformer_engine... import`, outside any try."""
    for node in tree.body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n == "transformer_engine" or n.startswith("transformer_engine.") for n in names):
            return True
    return False


def te_importing_modules() -> dict[str, list[str]]:
    """The megatron-bridge LoRA modules whose import needs Transformer Engine, each with the classes and functions
    it defines (what the placeholder must offer to the modules that import from it)."""
    found = {}
    for module in _PEFT_MODULES:
        tree = _module_tree(module)
        if tree is not None and _imports_transformer_engine(tree):
            found[module] = [n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
    return found


def _lora_unavailable(name: str, version: str) -> Any:
    def _refuse(*_args: Any, **_kwargs: Any) -> None:
        raise LoRAUnavailableError(
            f"{name}: LoRA in megatron-bridge {version} needs Transformer Engine, which is not installed "
            "on this host. Pretraining works without it; for LoRA/PEFT install transformer-engine."
        )

    return type(name, (), {"__init__": _refuse}) if name[:1].isupper() else _refuse


def install_lora_placeholder() -> bool:
    """megatron-bridge imports transformer_engine.pytorch unconditionally in its LoRA modules (0.6.2:
    peft/lora_layers.py; 0.5.0: peft/lora.py as well), so `import megatron.bridge` fails without TE. Register,
    for each such module, a placeholder whose classes and functions refuse to be used with a clear message.
    Returns True if any was installed."""
    if transformer_engine_available():
        return False
    modules = {m: names for m, names in te_importing_modules().items() if m not in sys.modules}
    version = importlib.metadata.version("megatron-bridge") if modules else ""
    for module, names in modules.items():
        placeholder = types.ModuleType(module)
        placeholder.__doc__ = "kaiyuan_recipes.compat placeholder: LoRA needs Transformer Engine."
        for name in names:
            setattr(placeholder, name, _lora_unavailable(name, version))
        sys.modules[module] = placeholder
    return bool(modules)


class ResiliencyUnavailableError(RuntimeError):
    pass


RESILIENCY = "nvidia_resiliency_ext"
_PRETRAIN_MODULE = "megatron.bridge.training.pretrain"


def pretrain_imports_resiliency() -> bool:
    """megatron-bridge's pretrain module imports nvidia_resiliency_ext at module level, outside any try (read from
    its source: importing it is what fails)."""
    tree = _module_tree(_PRETRAIN_MODULE)
    if tree is None:
        return False
    for node in tree.body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n == RESILIENCY or n.startswith(RESILIENCY + ".") for n in names):
            return True
    return False


def _resiliency_unavailable(what: str, version: str) -> RuntimeError:
    return ResiliencyUnavailableError(
        f"{what}: nvidia-resiliency-ext is not installed on this host (its wheels need glibc >= 2.39), and "
        f"megatron-bridge {version} needs it for in-process restart, fault tolerance, straggler detection and "
        "async/local checkpointing. Pretraining works without them; install nvidia-resiliency-ext to use them.")


def resiliency_placeholder_installed() -> bool:
    return getattr(sys.modules.get(RESILIENCY), "_kaiyuan_placeholder", False)


def install_resiliency_placeholder() -> bool:
    """megatron-bridge's `pretrain` imports nvidia_resiliency_ext.inprocess unconditionally (for a type annotation
    and its optional in-process restart), so training cannot start where that package is not installed. Register a
    placeholder package: `pretrain` imports, anything used from it refuses with a clear message, and its
    submodules stay missing, so Bridge's own optional probes (safe_import) see the package as absent. Returns True
    while the placeholder is in place (installed now or before)."""
    if resiliency_placeholder_installed():
        return True
    if RESILIENCY in sys.modules or importlib.util.find_spec(RESILIENCY) is not None:
        return False
    if not pretrain_imports_resiliency():
        return False
    version = importlib.metadata.version("megatron-bridge")
    root = types.ModuleType(RESILIENCY, "kaiyuan_recipes.compat placeholder: nvidia-resiliency-ext is not installed.")
    root.__spec__ = importlib.machinery.ModuleSpec(RESILIENCY, None, is_package=True)
    root.__path__ = []  # a package with no submodules on disk: `import nvidia_resiliency_ext.X` fails as absent
    root._kaiyuan_placeholder = True
    inprocess = types.ModuleType(f"{RESILIENCY}.inprocess", root.__doc__)
    inprocess.__spec__ = importlib.machinery.ModuleSpec(f"{RESILIENCY}.inprocess", None)

    def _refuse(*_args: Any, **_kwargs: Any) -> None:
        raise _resiliency_unavailable("nvidia_resiliency_ext.inprocess.CallWrapper", version)

    def _missing(name: str) -> Any:
        if name.startswith("__"):  # introspection (inspect, hasattr(module, "__file__")) sees a plain module
            raise AttributeError(name)
        raise _resiliency_unavailable(f"nvidia_resiliency_ext.inprocess.{name}", version)

    inprocess.CallWrapper = type("CallWrapper", (), {"__init__": _refuse})
    inprocess.__getattr__ = _missing  # PEP 562: any other name used from it refuses, naming itself
    root.inprocess = inprocess
    sys.modules[RESILIENCY] = root
    sys.modules[f"{RESILIENCY}.inprocess"] = inprocess
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


def _weight_decay_follows_max_steps() -> bool:
    """Upstream's ConfigContainer._calculate_scheduler_steps, run on a two-step scheduler over a one-step run: does
    the weight-decay increment span scheduler.max_steps (0.6.2) or only train.train_iters (0.5.0)?"""
    from megatron.bridge.training.config import ConfigContainer, SchedulerConfig, TrainingConfig

    probe = types.SimpleNamespace(train=TrainingConfig(train_iters=1, global_batch_size=1, micro_batch_size=1),
                                  scheduler=SchedulerConfig(lr_decay_style="constant"))
    probe.scheduler.max_steps = 2  # an attribute where SchedulerConfig has no such field
    ConfigContainer._calculate_scheduler_steps(probe)
    return probe.scheduler.wd_incr_steps == 2


def size_weight_decay_by_max_steps() -> bool:
    """A curriculum's phases each stop at their own train_iters and share one schedule sized by scheduler.max_steps
    (data/phase_module.py); Megatron resumes a scheduler only with unchanged totals. megatron-bridge 0.5.0's
    SchedulerConfig has no max_steps and its _calculate_scheduler_steps sizes the weight-decay increment by
    train_iters, so wd_incr_steps differs from phase to phase and phase 2 cannot resume phase 1. Where upstream's
    own computation shows that, size it as 0.6.2 does: by scheduler.max_steps when one is set (iteration-based
    runs); otherwise upstream's result stands."""
    from megatron.bridge.training.config import ConfigContainer

    if getattr(ConfigContainer._calculate_scheduler_steps, "_kaiyuan_patched", False):
        return True
    if _weight_decay_follows_max_steps():
        return False

    def wrap(original):
        def _calculate_scheduler_steps(self) -> None:
            original(self)
            max_steps = getattr(self.scheduler, "max_steps", None)
            if max_steps is not None and self.train.train_samples is None:
                self.scheduler.wd_incr_steps = max_steps * self.train.global_batch_size
        return _calculate_scheduler_steps

    return patch_method(ConfigContainer, "_calculate_scheduler_steps", wrap)


def wgrad_fusion_without_apex(model: Any, standin: Callable[[], bool] | None = None) -> str | None:
    """megatron-bridge 0.6.2 turns gradient_accumulation_fusion on wherever Transformer Engine imports
    (utils/fusions.py: "TE handles fuse_wgrad_accumulation internally"), but the GPT output layer is megatron-core's
    ColumnParallelLinear on every spec, TE's included, and it refuses the setting without Apex's
    fused_weight_gradient_mlp_cuda: a TE host without Apex cannot build the model. There, install `standin` as that
    extension (the caller passes the fast path's fastpath.apex_standins.torch_wgrad_accumulation, torch's fp32-output
    addmm; TE's own layers keep fusing; it returns whether it could), or turn the setting off where the stand-in
    cannot be installed or there is none (Megatron-FSDP: the stand-in is not made for its gradient buffers). Returns
    what was done, or None where nothing was needed."""
    from megatron.core.tensor_parallel import layers

    if not getattr(model, "gradient_accumulation_fusion", False) or layers._grad_accum_fusion_available:
        return None
    if standin is not None and standin():
        return "torch stand-in for fused_weight_gradient_mlp_cuda"
    model.gradient_accumulation_fusion = False
    return "gradient_accumulation_fusion off"
