"""Ordered phases (the curriculum's phases 3-5): training visits each source's documents in a stated order instead
of Megatron's shuffle, and the sources stay interleaved in proportion to their weights.

Built on megatron-core's dataset classes, not beside them:
- `SourceDocuments`: one converter output directory as one low-level dataset, its shards (one per input file,
  numbered in file order) concatenated, so documents come in (file, row) order; each shard is megatron-core's own
  IndexedDataset, and the converter's per-document `rank` sidecars (`<prefix>.rank.npy`) come along.
- `OrderedGPTDataset(GPTDataset)`: the same packing (megatron-core's C++ `build_sample_idx`, samples of
  seq_length + 1 tokens across document boundaries) over a document index in the phase's order instead of a
  shuffled one, and no sample shuffle. Its index files are cached where GPTDataset caches its own.
- `OrderedGPTDatasetConfig`: megatron-core's GPTDatasetConfig plus Megatron-Bridge's DatasetProvider contract,
  so Bridge's `pretrain` builds the phase through `build_datasets` (megatron-core's BlendedMegatronDatasetBuilder
  with OrderedGPTDataset). Sources are blended by megatron-core's BlendedDataset, whose blending index is
  deterministic: each sample goes to the source furthest below its share, which interleaves them in proportion.

Megatron's sequential sampler (dataloader_type "single") then gives each step's global batch the next samples,
split across data-parallel ranks, and starts a resumed run at the checkpoint's consumed samples: exact resume.
A phase resumes the previous phase's run, so its sampler starts at the samples consumed before it (`first_sample`):
PhaseStart shifts the index so that sample is the phase's first, not one deep into its order. A later shuffled phase
(order `shuffled`, first_sample > 0) comes here too, for that alone: megatron-core's own GPTDataset, indexed for the
phase's samples only (Bridge would index train_iters x global batch: every earlier phase's samples as well, which are
never read and, on a 1T-token run, minutes of start-up)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from megatron.core.datasets.gpt_dataset import GPTDataset
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MCoreGPTDatasetConfig
from megatron.core.datasets.utils import Split

from kaiyuan_recipes.compat.bridge_datasets import DatasetBuildContext, DatasetProvider
from kaiyuan_recipes.data.blend import PHASE_ORDERS
from kaiyuan_recipes.data.convert_worker import RANK_SUFFIX, rank_path

ORDERED = PHASE_ORDERS[1:]  # this module's; "shuffled" is Megatron's GPTDataset


class SourceDocuments:
    """A converter output directory's shards as one sequence of documents, in (file, row) order."""

    def __init__(self, source_dir: Path, config: Any):
        from kaiyuan_recipes.data.convert import MANIFEST

        manifest = source_dir / MANIFEST
        if not manifest.is_file():
            raise FileNotFoundError(f"ordered source {source_dir}: no {MANIFEST} (run `kaiyuan data convert` on it)")
        text = manifest.read_bytes()
        names = sorted(json.loads(text)["shards"])  # _part-%05d_: file order
        if not names:
            raise ValueError(f"ordered source {source_dir}: {MANIFEST} lists no shards")
        # What the cached indices were built from: a reconversion in place changes the manifest, so a new cache entry.
        self.fingerprint = hashlib.md5(text, usedforsecurity=False).hexdigest()[:12]
        self.path_prefix = str(source_dir / "ordered")  # where GPTDataset would cache without path_to_cache
        self.source_dir, self.names = source_dir, names
        self.shards = [GPTDataset.build_low_level_dataset(str(source_dir / name), config) for name in names]
        self.lengths = [len(s) for s in self.shards]
        self.starts = numpy.concatenate([[0], numpy.cumsum(self.lengths)]).astype(numpy.int64)
        self.sequence_lengths = numpy.concatenate([s.sequence_lengths for s in self.shards]).astype(numpy.int32)

    @property
    def ranks(self) -> numpy.ndarray | None:
        """The documents' ranks, read when an index is built by rank (not on a cache hit, not for as_stored)."""
        paths = [rank_path(self.source_dir / name) for name in self.names]
        source_dir, lengths = self.source_dir, self.lengths
        if not any(p.is_file() for p in paths):
            return None
        parts = []
        for path, length in zip(paths, lengths):
            if not path.is_file():
                raise FileNotFoundError(f"{path}: missing while other shards of {source_dir} have ranks; "
                                        "reconvert the directory")
            ranks = numpy.load(path, mmap_mode="r")
            if ranks.shape != (length,):
                raise ValueError(f"{path}: {ranks.shape[0]} ranks for {length} documents; reconvert the directory")
            parts.append(ranks)
        return numpy.concatenate(parts)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> numpy.ndarray:
        shard = int(numpy.searchsorted(self.starts, idx, side="right")) - 1
        return self.shards[shard].get(int(idx - self.starts[shard]), offset=offset, length=length)


class OrderedGPTDataset(GPTDataset):
    """GPTDataset whose document index follows `config.order` and whose samples are not shuffled."""

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: Any) -> Any:
        if Path(dataset_path).is_dir():
            return SourceDocuments(Path(dataset_path), config)
        return GPTDataset.build_low_level_dataset(dataset_path, config)  # a plain prefix (the held-out set)

    @staticmethod
    def _key_config_attributes() -> list[str]:
        return GPTDataset._key_config_attributes() + ["order"]  # a new order is a new cache entry

    def document_order(self) -> numpy.ndarray:
        """The train split's documents in the phase's order (ascending rank for by_rank, ties in stored order)."""
        documents = numpy.asarray(self.indices, dtype=numpy.int32)
        if self.config.order != "by_rank":
            return documents
        ranks = getattr(self.dataset, "ranks", None)
        if ranks is None:
            raise ValueError(f"{self.dataset_path}: order by_rank needs the documents' ranks ({RANK_SUFFIX} beside "
                             "each shard, written by `kaiyuan data convert` when the parquet has a 'rank' column)")
        return documents[numpy.argsort(ranks[documents], kind="stable")]

    def _build_document_sample_shuffle_indices(self) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
        if self.index_split != Split.train:  # validation and test stay upstream's: shuffled, comparable across phases
            return super()._build_document_sample_shuffle_indices()
        cached = self._cache_paths()
        if cached and all(p.is_file() for p in cached.values()):
            indices = tuple(numpy.load(cached[k], mmap_mode="r") for k in ("document", "sample", "shuffle"))
            self._report("loaded", indices[1].shape[0] - 1, cached["document"])
            return indices
        from megatron.core.datasets import helpers

        tokens_per_epoch = self._get_num_tokens_per_epoch()
        epochs = self._get_num_epochs(tokens_per_epoch)
        document_index = numpy.tile(self.document_order(), epochs).astype(numpy.int32)  # epoch 2 repeats the order
        sample_index = helpers.build_sample_idx(self.dataset.sequence_lengths, document_index,
                                                self.config.sequence_length, epochs, tokens_per_epoch, True,
                                                self.config.add_extra_token_to_sequence)
        shuffle_index = numpy.arange(sample_index.shape[0] - 1, dtype=numpy.int64)  # identity: samples in order
        if cached and _builds_cache():
            _save_atomic(cached, {"document": document_index, "sample": sample_index, "shuffle": shuffle_index},
                         self.unique_description)
        self._report(f"built ({epochs} epoch(s))", sample_index.shape[0] - 1, cached and cached["document"])
        return document_index, sample_index, shuffle_index

    def _report(self, what: str, samples: int, where: Any) -> None:
        """One line per source in the training log: which order, how many samples, where the indices live."""
        if _builds_cache():
            print(f"kaiyuan: ordered dataset {self.dataset_path} ({self.index_split.name}, order {self.config.order}):"
                  f" {what} {samples} samples over {len(self.indices)} documents; indices {where or 'in memory'}",
                  file=sys.stderr, flush=True)

    def _cache_paths(self) -> dict[str, Path] | None:
        if not self.config.path_to_cache:
            return None
        data = getattr(self.dataset, "fingerprint", "prefix")
        base = Path(self.config.path_to_cache) / f"{self.unique_description_hash}-{data}-{type(self).__name__}-" \
                                                  f"{self.index_split.name}"
        return {k: Path(f"{base}-{k}_index.npy") for k in ("document", "sample", "shuffle")} | \
            {"description": Path(f"{base}-description.txt")}


def finalize_gpt_dataset_config(config: Any) -> None:
    """Bridge's GPTDatasetConfig.finalize for a config of our own that derives from megatron-core's: its checks run
    in megatron-core's __post_init__, deferred until the tokenizer is known (as Bridge defers them)."""
    config.sequence_length = config.seq_length
    BlendedMegatronDatasetConfig.__post_init__(config)
    for name in ("reset_position_ids", "reset_attention_mask", "eod_mask_loss"):
        if getattr(config, name) is None:
            raise ValueError(f"dataset.{name} must be set (true or false)")
    DatasetProvider.finalize(config)


def _builds_cache() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def _save_atomic(paths: dict[str, Path], arrays: dict[str, numpy.ndarray], description: str) -> None:
    """Each file under a temporary name, renamed when whole; the description last (it marks the set complete)."""
    paths["description"].parent.mkdir(parents=True, exist_ok=True)
    for key, array in arrays.items():
        tmp = paths[key].with_name(f".{paths[key].name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            numpy.save(f, array)
        os.replace(tmp, paths[key])
    tmp = paths["description"].with_name(f".{paths['description'].name}.{os.getpid()}.tmp")
    tmp.write_text(description)
    os.replace(tmp, paths["description"])


class PhaseStart(torch.utils.data.Dataset):
    """`dataset` seen from global sample `first`: index first + j is the phase's sample j (indices below `first`
    belong to earlier phases and are never asked for)."""

    def __init__(self, dataset: Any, first: int):
        self.dataset, self.first = dataset, first

    def __len__(self) -> int:
        return self.first + len(self.dataset)

    def __getitem__(self, idx: int) -> Any:
        if idx < self.first:
            raise IndexError(f"sample {idx} precedes this phase's first sample {self.first} (where the curriculum's "
                             "iterations put it): the resumed checkpoint has not finished the previous phase")
        return self.dataset[idx - self.first]


@dataclass(kw_only=True)
class OrderedGPTDatasetConfig(MCoreGPTDatasetConfig, DatasetProvider):
    """An ordered phase's (or a later shuffled phase's) dataset settings. Not a subclass of Bridge's GPTDatasetConfig
    (Bridge maps that class to its own provider, which indexes from the run's first sample); like it, megatron-core's
    checks run at finalize(), after overrides."""

    seq_length: int
    order: str = "as_stored"
    first_sample: int = 0  # the global sample the phase starts at: (first iteration - 1) x global batch
    skip_getting_attention_mask_from_dataset: bool = True

    def __post_init__(self) -> None:  # deferred to finalize(), as Bridge's GPTDatasetConfig does
        pass

    @classmethod
    def from_config(cls, base: Any, order: str, first_sample: int = 0) -> "OrderedGPTDatasetConfig":
        """The same settings as `base` (a Bridge GPTDatasetConfig) with `order`, starting at `first_sample`."""
        names = {f.name for f in fields(cls) if f.init} - {"order", "first_sample"}
        values = {name: getattr(base, name) for name in names if hasattr(base, name)}
        return cls(order=order, first_sample=first_sample, **values)

    def finalize(self) -> None:
        if self.order not in PHASE_ORDERS:
            raise ValueError(f"dataset order {self.order!r}: expected one of {', '.join(PHASE_ORDERS)}")
        if self.dataloader_type not in (None, "single"):
            raise ValueError(f"a curriculum phase after the first reads its samples from the phase's first on: "
                             f"dataset.dataloader_type must be 'single' (Megatron's sequential sampler), got "
                             f"{self.dataloader_type!r}")
        self.dataloader_type = "single"
        unsupported = {"defer_npy_index_mmap": self.defer_npy_index_mmap, "fast_cache_load": self.fast_cache_load,
                       "sequences_per_dataset": self.sequences_per_dataset}
        given = [k for k, v in unsupported.items() if v]
        if given and self.order in ORDERED:
            raise ValueError(f"an ordered phase builds its own indices: dataset.{', dataset.'.join(given)} is not "
                             "supported there; unset it")
        finalize_gpt_dataset_config(self)

    def build_datasets(self, context: DatasetBuildContext) -> tuple[Any, Any, Any]:
        phase_samples = context.train_samples - self.first_sample  # train_samples counts from the run's start
        if phase_samples < 1:
            raise ValueError(f"an ordered phase starting at sample {self.first_sample} has no samples to train: the "
                             f"run trains {context.train_samples} in all (train.train_iters x global batch)")
        sizes = [phase_samples, context.valid_samples, context.test_samples]
        cls = OrderedGPTDataset if self.order in ORDERED else GPTDataset
        train, valid, test = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, self).build()
        return (PhaseStart(train, self.first_sample) if train is not None and self.first_sample else train), valid, test
