"""The bundled sample corpus on a long recipe: indexed for a bounded window of steps and cycled.

The sample corpus (data/sample_corpus/) is about 437k tokens: a few hundred samples of 4096. It is there to show
that a recipe runs end to end (data, model, optimizer, checkpoints, logs), not to train a model. Megatron's
GPTDataset indexes every sample a run asks for at start-up: for qwen3_1p7b's 1,049,000 steps x 512 samples that is
millions of epochs of this corpus, tens of GB of index files and minutes of CPU before the first step. Training on
the corpus repeats it either way, so the index here covers `SAMPLE_WINDOW_STEPS` steps (built by megatron-core's own
GPTDataset / BlendedDataset, shuffled and cached as usual) and the run cycles through it: step k and step
k + SAMPLE_WINDOW_STEPS read the same samples. Validation and test are indexed as Megatron would for a run of
SAMPLE_WINDOW_STEPS steps and cycled likewise (with evaluations further apart than that, every evaluation scores
the same samples). A run no longer than the window gets exactly Megatron's datasets.

Real data (`kaiyuan.data` blend / plan / curriculum) never comes here: it keeps Megatron's standard sample order."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MCoreGPTDatasetConfig

from kaiyuan_recipes.compat.bridge_datasets import DatasetBuildContext, DatasetProvider
from kaiyuan_recipes.data.ordered_dataset import finalize_gpt_dataset_config

# Steps of training the sample corpus's index covers before the run starts over at its first sample. 1,000 steps
# of qwen3_1p7b (512 x 4096) are thousands of passes over the corpus yet index in about a second.
SAMPLE_WINDOW_STEPS = 1000


class Cycled(torch.utils.data.Dataset):
    """`dataset` seen as `length` samples: sample i is dataset[i % period] (megatron-core may build a few samples more
    than it was asked for: the period is what was asked, so the run repeats every window exactly)."""

    def __init__(self, dataset: Any, length: int, period: int):
        if not 0 < period <= len(dataset):
            raise ValueError(f"cycle period {period} for a dataset of {len(dataset)} samples")
        self.dataset, self.length, self.period = dataset, length, period

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> Any:
        if not 0 <= idx < self.length:
            raise IndexError(f"sample {idx} outside the run's {self.length} samples")
        return self.dataset[idx % self.period]


@dataclass(kw_only=True)
class SampleWindowDatasetConfig(MCoreGPTDatasetConfig, DatasetProvider):
    """The sample corpus's dataset settings: megatron-core's GPTDatasetConfig plus Megatron-Bridge's DatasetProvider
    contract (so Bridge's `pretrain` builds through `build_datasets`), indexing at most `train_window_samples` train
    samples and `eval_window_samples` validation / test samples. Like Bridge's GPTDatasetConfig, megatron-core's
    checks run at finalize(), after overrides."""

    seq_length: int
    train_window_samples: int
    eval_window_samples: int
    corpus_tokens: int = 0  # for the plan printout: how many passes the window is
    skip_getting_attention_mask_from_dataset: bool = True

    def __post_init__(self) -> None:  # deferred to finalize(), as Bridge's GPTDatasetConfig does
        pass

    @classmethod
    def from_config(cls, base: Any, train_window_samples: int, eval_window_samples: int,
                    corpus_tokens: int = 0) -> "SampleWindowDatasetConfig":
        """The same settings as `base` (a Bridge GPTDatasetConfig) with the windows."""
        own = {"train_window_samples", "eval_window_samples", "corpus_tokens"}
        names = {f.name for f in fields(cls) if f.init} - own
        values = {name: getattr(base, name) for name in names if hasattr(base, name)}
        return cls(train_window_samples=train_window_samples, eval_window_samples=eval_window_samples,
                   corpus_tokens=corpus_tokens, **values)

    def finalize(self) -> None:
        if self.train_window_samples < 1 or self.eval_window_samples < 1:
            raise ValueError(f"sample corpus windows must be positive: train {self.train_window_samples}, "
                             f"validation/test {self.eval_window_samples}")
        finalize_gpt_dataset_config(self)

    def window_sizes(self, context: DatasetBuildContext) -> list[int]:
        asked = [context.train_samples, context.valid_samples, context.test_samples]
        windows = [self.train_window_samples, self.eval_window_samples, self.eval_window_samples]
        return [min(n, w) if n else n for n, w in zip(asked, windows)]

    def build_datasets(self, context: DatasetBuildContext) -> tuple[Any, Any, Any]:
        asked = [context.train_samples, context.valid_samples, context.test_samples]
        windows = self.window_sizes(context)
        built = BlendedMegatronDatasetBuilder(GPTDataset, windows, lambda: True, self).build()
        return tuple(Cycled(d, n, w) if d is not None and n > len(d) else d for d, n, w in zip(built, asked, windows))


def describe_window(cfg: Any) -> str | None:
    """One line for the plan printout: what the sample corpus's window means for this run (None: not windowed)."""
    ds = cfg.dataset
    if not isinstance(ds, SampleWindowDatasetConfig):
        return None
    gbs, steps = cfg.train.global_batch_size, cfg.train.train_iters
    window_steps = ds.train_window_samples // gbs
    if steps <= window_steps:
        return f"bundled sample corpus ({ds.corpus_tokens:,} tokens): the run's {steps:,} steps fit the index"
    passes = ds.train_window_samples * ds.seq_length / ds.corpus_tokens if ds.corpus_tokens else 0
    return (f"bundled sample corpus ({ds.corpus_tokens:,} tokens, a pipeline check, not training data): indexed "
            f"for {window_steps:,} steps ({ds.train_window_samples:,} samples, ~{passes:,.0f} passes) and repeated "
            f"every {window_steps:,} steps over the run's {steps:,}; validation cycles through "
            f"{ds.eval_window_samples:,} samples")
