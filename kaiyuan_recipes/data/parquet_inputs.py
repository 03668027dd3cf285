"""Which files a directory of parquet inputs holds: the one rule `kaiyuan data convert` and `kaiyuan data clean`
both read their inputs by (recursive, regular files named *.parquet)."""

from __future__ import annotations

from pathlib import Path


def parquet_files(input_dir: Path, error: type[Exception]) -> list[Path]:
    """Every *.parquet file under `input_dir`, sorted by path. A missing directory, or one without any, is refused
    with the caller's bad-input error (`error`), naming the directory."""
    input_dir = Path(input_dir)
    if not input_dir.is_dir():
        raise error(f"{input_dir}: input directory not found")
    files = sorted(p for p in input_dir.rglob("*.parquet") if p.is_file())
    if not files:
        raise error(f"{input_dir}: no *.parquet files")
    return files
