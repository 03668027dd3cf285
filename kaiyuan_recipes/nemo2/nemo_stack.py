"""The NeMo 2 and megatron-core symbols the factories use, imported once, here, after compat.cpu_cuda_arch_list:
megatron-core 0.15's import JIT-builds a CUDA allocator that fails uncaught on a host without a GPU. A module
importing them from here needs no call of its own before its imports (the interpreter-start .pth that `make
env-nemo2` writes does the same; an environment installed otherwise has only this)."""

from typing import Any

from kaiyuan_recipes import compat


def _stack() -> tuple[Any, ...]:
    compat.cpu_cuda_arch_list()
    from megatron.core.optimizer import OptimizerConfig
    from nemo.collections import llm
    from nemo.collections.common.tokenizers.huggingface.auto_tokenizer import AutoTokenizer
    from nemo.collections.llm.api import pretrain
    from nemo.collections.llm.recipes.log.default import default_log, default_resume, tensorboard_logger
    from nemo.collections.llm.recipes.qwen3 import qwen3_trainer
    from nemo.lightning.pytorch.optim import MegatronOptimizerModule, WarmupHoldAnnealScheduler

    return (OptimizerConfig, llm, AutoTokenizer, pretrain, default_log, default_resume, tensorboard_logger,
            qwen3_trainer, MegatronOptimizerModule, WarmupHoldAnnealScheduler)


(OptimizerConfig, llm, AutoTokenizer, pretrain, default_log, default_resume, tensorboard_logger, qwen3_trainer,
 MegatronOptimizerModule, WarmupHoldAnnealScheduler) = _stack()

__all__ = ["OptimizerConfig", "llm", "AutoTokenizer", "pretrain", "default_log", "default_resume",
           "tensorboard_logger", "qwen3_trainer", "MegatronOptimizerModule", "WarmupHoldAnnealScheduler"]
