"""The token stream every row of train_throughput.py trains on, written once per model so that a peer framework
reads exactly what `ours` reads: Megatron's mock dataset (`kaiyuan.data=mock`), built by Megatron-Bridge's own
dataset provider from the recipe's config with the row's overrides, in the order Megatron's pretraining sampler
serves it (sample `s * global_batch + m * micro_batch + b` is row b of micro-batch m of step s).

Its documents are runs of consecutive token ids (t, t+1, ...) ending in an end-of-document token, with lengths
and order fixed by the dataset config's seed, not by any framework's RNG: a correct trainer drives the loss from
~ln(vocab) towards zero within a few steps, so a peer that runs fast but does not learn shows it in its losses.

usage: python benchmarks/token_stream.py --model qwen3_1p7b --seq 4096 --steps 15 --out stream.npy"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from megatron_rows import BATCH, megatron_overrides  # noqa: E402


def mock_stream(model: str, seq: int, steps: int, overrides: list[str]) -> np.ndarray:
    """int32 array [steps * global_batch, seq + 1]: each row's inputs are [:, :-1], its labels [:, 1:]."""
    from kaiyuan_recipes.training.config import build_config

    cfg, _run = build_config(model, overrides)  # first: it makes Megatron-Bridge importable (kaiyuan_recipes.compat)
    from megatron.bridge.data.loaders import get_train_valid_test_num_samples
    from megatron.bridge.data.utils import pretrain_train_valid_test_datasets_provider
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    cfg.dataset.finalize()
    cfg.dataset.tokenizer = build_tokenizer(cfg.tokenizer)
    if not cfg.dataset.mock:
        raise ValueError(f"{model}: the dataset config is not Megatron's mock dataset (kaiyuan.data=mock)")
    sizes = get_train_valid_test_num_samples(cfg)  # the sizes ours asks for: they fix the shuffle
    train, _valid, _test = pretrain_train_valid_test_datasets_provider(list(sizes), cfg.dataset)
    samples = steps * cfg.train.global_batch_size
    out = np.empty((samples, seq + 1), dtype=np.int32)
    for i in range(samples):
        item = train[i]
        tokens, labels = np.asarray(item["tokens"]), np.asarray(item["labels"])
        if tokens.shape != (seq,) or not np.array_equal(tokens[1:], labels[:-1]):
            raise ValueError(f"{model}: mock sample {i} is not a shifted window of {seq} tokens")
        out[i, :seq], out[i, seq] = tokens, labels[-1]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_1p7b", choices=list(BATCH))
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    mbs, micro = BATCH[args.model]
    overrides = megatron_overrides("fast", mbs, micro, args.seq, args.steps, Path("/tmp/token-stream"))
    np.save(args.out, mock_stream(args.model, args.seq, args.steps, overrides))


if __name__ == "__main__":
    main()
