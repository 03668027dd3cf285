"""megatron-bridge defects (0.6.2): a hard Transformer Engine import, a helpers build that cannot work on the
PyPI megatron-core wheel."""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

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
