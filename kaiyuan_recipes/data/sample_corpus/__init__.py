"""The bundled sample corpus: public-domain English (The Jargon File 4.4.7) and classical Chinese
poems (Tang 300, Song 100) as parquet — the default data of `kaiyuan train` and of the tests.
Tokenized on first use into the cache by the converter (see rebuild.py for provenance)."""

from __future__ import annotations

from pathlib import Path

from kaiyuan_recipes.cache import cache_lock, cache_root
from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir, tokenizer_fingerprint

CORPUS_DIR = Path(__file__).resolve().parent


SOURCES = ("en_jargon", "zh_poems")


def sample_texts(name: str) -> list[str]:
    """The documents of one bundled source (prompts for benchmarks and parity checks)."""
    import pyarrow.parquet as pq

    if name not in SOURCES:
        raise ValueError(f"sample corpus: no source {name!r}; known: {', '.join(SOURCES)}")
    return pq.read_table(CORPUS_DIR / f"{name}.parquet", columns=["text"]).column("text").to_pylist()


def sample_corpus_dir(tokenizer_dir: Path) -> Path:
    """Where the corpus tokenized with `tokenizer_dir` is cached (named by the tokenizer's fingerprint)."""
    return cache_root() / "sample_corpus" / tokenizer_fingerprint(tokenizer_dir)[:16]


def prepare_sample_corpus(tokenizer_dir: Path | None = None) -> tuple[list[str], list[float]]:
    """Convert the bundled parquet files with `tokenizer_dir` (default: the bundled tokenizer) and
    return the indexed-dataset prefixes with their token counts as blend weights.

    Explicit weights matter: with weights None Megatron weights each split by its sample count, and
    the 1% validation split of a small source can hold no full sequence (weight 0, rejected)."""
    from kaiyuan_recipes.data.convert import ConvertOptions, convert_directory

    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else default_tokenizer_dir()
    out = sample_corpus_dir(tokenizer_dir)
    with cache_lock("sample_corpus"):
        manifest = convert_directory(
            ConvertOptions(input_dir=CORPUS_DIR, output_dir=out, tokenizer_dir=tokenizer_dir, output_prefix="sample",
                           in_process=True),
            show_progress=False,
        )
    names = sorted(manifest["shards"])
    return [str(out / n) for n in names], [float(manifest["shards"][n]["tokens"]) for n in names]
