"""How long a run spends building its dataset indices before the first step, on the CPU (the work is CPU work:
megatron-core's GPTDataset / BlendedDataset index building, numpy and its C++ helpers).

Two modes:
- `recipe NAME [overrides]`: the recipe's resolved dataset config built as Megatron-Bridge's `pretrain` builds it
  (the config as runtime_config_update leaves it, the tokenizer set, the provider Bridge picks for the config, the
  train / validation / test sizes Bridge asks for), cold (an empty index cache) and then warm (the same cache:
  what a restart does).
- `synthetic --tokens T --documents D --samples S`: an indexed dataset of D documents and T tokens written through
  megatron-core's IndexedDatasetBuilder (the .bin is sparse: the index build never reads tokens), then one
  GPTDataset of S samples over it: what a real single-epoch phase of that size costs to index.

usage: python benchmarks/dataset_setup.py recipe qwen3_1p7b [section.field=value ...] [--out result.json]
       python benchmarks/dataset_setup.py synthetic --tokens 1e11 --documents 25e6 --samples 25e6 --seq 4096"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def build_as_pretrain(cfg: Any) -> tuple[tuple[Any, Any, Any], list[int]]:
    """The datasets Bridge's pretrain builds for `cfg` (a resolved ConfigContainer), and the sizes it asks for:
    what `kaiyuan data index` builds."""
    from megatron.bridge.data.loaders import get_train_valid_test_num_samples

    from kaiyuan_recipes.training.dataset_index import build_as_pretrain as build

    return build(cfg), list(get_train_valid_test_num_samples(cfg))


def measure_recipe(recipe: str, overrides: list[str]) -> dict[str, Any]:
    from kaiyuan_recipes import compat
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.validate import resolve_with_upstream

    compat.apply()
    with tempfile.TemporaryDirectory() as root:
        cfg, run = build_config(recipe, [*overrides, f"kaiyuan.run_root={root}"])
        result: dict[str, Any] = {"recipe": recipe, "overrides": overrides, "data": run.data,
                                  "train_iters": cfg.train.train_iters,
                                  "global_batch_size": cfg.train.global_batch_size,
                                  "seq_length": cfg.dataset.seq_length}
        for attempt in ("cold", "warm"):
            resolved = resolve_with_upstream(cfg, world_size=1)
            t0 = time.perf_counter()
            (train, valid, test), sizes = build_as_pretrain(resolved)
            result[f"{attempt}_s"] = round(time.perf_counter() - t0, 2)
            result["requested_samples"] = sizes
            result["dataset_lengths"] = [len(d) if d is not None else None for d in (train, valid, test)]
        result["index_cache_mb"] = round(_dir_bytes(run.layout.dataset_cache) / 1e6, 1)
    result["peak_rss_gb"] = round(_peak_rss_gb(), 2)
    return result


def write_synthetic(prefix: Path, tokens: int, documents: int, seed: int = 0) -> None:
    """`documents` documents of `tokens` tokens in all (lengths drawn around the mean), as an indexed dataset whose
    .bin is a sparse file of the right size."""
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder, get_bin_path, get_idx_path

    rng = numpy.random.default_rng(seed)
    lengths = rng.exponential(tokens / documents, documents).astype(numpy.int64) + 1
    lengths = numpy.minimum(lengths * (tokens / lengths.sum()), numpy.iinfo(numpy.int32).max).astype(numpy.int32)
    lengths = numpy.maximum(lengths, 1)
    builder = IndexedDatasetBuilder(get_bin_path(str(prefix)), dtype=numpy.int32)
    builder.sequence_lengths = lengths
    builder.document_indices = numpy.arange(documents + 1, dtype=numpy.int64)
    builder.finalize(get_idx_path(str(prefix)))
    with open(get_bin_path(str(prefix)), "r+b") as f:
        f.truncate(int(lengths.astype(numpy.int64).sum()) * 4)


def measure_synthetic(tokens: int, documents: int, samples: int, seq: int, workdir: Path) -> dict[str, Any]:
    from kaiyuan_recipes import compat

    compat.apply()
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    prefix = workdir / "synthetic"
    t0 = time.perf_counter()
    write_synthetic(prefix, tokens, documents)
    written = time.perf_counter() - t0
    result: dict[str, Any] = {"tokens": tokens, "documents": documents, "samples": samples, "seq_length": seq,
                              "write_index_s": round(written, 1)}
    for attempt in ("cold", "warm"):
        config = GPTDatasetConfig(random_seed=1234, sequence_length=seq, blend=([str(prefix)], None),
                                  split="100,0,0", path_to_cache=str(workdir / "cache"), reset_position_ids=False,
                                  reset_attention_mask=False, eod_mask_loss=False, tokenizer=_NoTokenizer())
        t0 = time.perf_counter()
        train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [samples, None, None], lambda: True, config).build()
        result[f"{attempt}_s"] = round(time.perf_counter() - t0, 2)
        result["dataset_length"] = len(train)
    result["index_cache_mb"] = round(_dir_bytes(workdir / "cache") / 1e6, 1)
    result["peak_rss_gb"] = round(_peak_rss_gb(), 2)
    return result


class _NoTokenizer:
    """GPTDatasetConfig asks the tokenizer for its EOD and pad ids; the index build reads no tokens."""

    eod = 0
    pad = 1
    unique_identifiers: dict[str, Any] = {"class": "none"}
    vocab_size = 2**31 - 1


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    sub = ap.add_subparsers(dest="mode", required=True)
    rec = sub.add_parser("recipe")
    rec.add_argument("recipe")
    rec.add_argument("overrides", nargs="*")
    syn = sub.add_parser("synthetic")
    syn.add_argument("--tokens", type=float, required=True)
    syn.add_argument("--documents", type=float, required=True)
    syn.add_argument("--samples", type=float, required=True)
    syn.add_argument("--seq", type=int, default=4096)
    syn.add_argument("--workdir", type=Path)
    args = ap.parse_args(argv)
    if args.mode == "recipe":
        result = measure_recipe(args.recipe, args.overrides)
    else:
        with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
            result = measure_synthetic(int(args.tokens), int(args.documents), int(args.samples), args.seq, Path(tmp))
    result["host"] = {"machine": platform.machine(), "python": platform.python_version()}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
