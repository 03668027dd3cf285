"""What is checked before a cleaning run starts, from each parquet file's footer (cheap at any corpus size): every
file readable, not empty, the same schema as the first, the text column a string column without nulls; and an output
directory that is free for this run. Each error names the file (and the row, for a null), and nothing is written."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.clean.config import CleanConfigError
from kaiyuan_recipes.data.parquet_inputs import parquet_files

MANIFEST_NAME = "clean_manifest.json"
SAMPLES_DIR = "removed_samples"


# 64 MiB: far over any document a shipped config keeps (max_chars at most 2,000,000 characters) and far under what
# a worker holds comfortably; over it a "document" is a dump or a binary blob stored as text.
DEFAULT_MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


class CleanInputError(ValueError):
    pass


class BadRowError(CleanInputError):
    """A bad row met by the reader under `--on-bad-row error`: the message names the file and row."""


@dataclass
class InputFile:
    path: Path          # absolute
    relative: str       # to the input directory: the output file of the same name holds what it kept
    bytes: int
    rows: int
    sha256: str         # the content: "already cleaned" and resuming compare it, not the size and row count
    row_groups: list[tuple[int, int]]   # (rows, uncompressed bytes) of each parquet row group: how it is split


def _first_null_row(pf: Any, column: str) -> int | None:
    import pyarrow.compute as pc

    offset = 0
    for group in range(pf.metadata.num_row_groups):
        col = pf.read_row_group(group, columns=[column]).column(0)
        if col.null_count:
            return offset + int(pc.index(pc.is_null(col), True).as_py())
        offset += len(col)
    return None


def _text_nulls_from_footer(pf: Any, index: int) -> int | None:
    total = 0
    for group in range(pf.metadata.num_row_groups):
        stats = pf.metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_null_count:
            return None
        total += stats.null_count
    return total


def check_inputs(input_dir: Path, text_key: str, nulls_refused: bool = True) -> tuple[list[InputFile], Any]:
    """The parquet files under input_dir (recursive, sorted) and their common arrow schema. A null text is refused
    here, from the footers, unless bad rows are skipped (the reader then counts them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    input_dir = Path(input_dir)
    paths = sorted(parquet_files(input_dir, CleanInputError), key=lambda p: p.relative_to(input_dir).as_posix())
    files: list[InputFile] = []
    schema = None
    for path in paths:
        size = path.stat().st_size
        if size == 0:
            raise CleanInputError(f"{path}: empty file (0 bytes)")
        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as err:
            raise CleanInputError(f"{path}: not a readable parquet file ({err})") from None
        here = pf.schema_arrow
        if text_key not in here.names:
            raise CleanInputError(f"{path}: no column '{text_key}' (columns: {', '.join(here.names)}); "
                                  "--text-key names the text column")
        text_type = here.field(text_key).type
        if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
            raise CleanInputError(f"{path}: column '{text_key}' has type {text_type}; expected string")
        if schema is None:
            schema, first = here.remove_metadata(), path
        elif not here.remove_metadata().equals(schema):
            theirs = {f.name: str(f.type) for f in schema}
            ours = {f.name: str(f.type) for f in here}
            diff = sorted(set(theirs.items()) ^ set(ours.items()))
            raise CleanInputError(f"{path}: schema differs from {first} ({', '.join(f'{k}: {v}' for k, v in diff)}); "
                                  "clean files of one schema together")
        rows = pf.metadata.num_rows
        if rows == 0:
            raise CleanInputError(f"{path}: no rows")
        nulls = _text_nulls_from_footer(pf, here.get_field_index(text_key)) if nulls_refused else 0
        if nulls is None or nulls:  # footer without statistics: read the column once to be sure
            row = _first_null_row(pf, text_key)
            if row is not None:
                raise CleanInputError(f"{path}: row {row} (0-based): column '{text_key}' is null")
        with open(path, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        groups = [(pf.metadata.row_group(g).num_rows, pf.metadata.row_group(g).total_byte_size)
                  for g in range(pf.metadata.num_row_groups)]
        files.append(InputFile(path.resolve(), path.relative_to(input_dir).as_posix(), size, rows, digest, groups))
    return files, schema


def staging_dir_for(output_dir: Path) -> Path:
    """Beside the output (same filesystem, so the final rename is atomic); a rerun finds it and resumes."""
    output_dir = Path(output_dir).resolve()
    return output_dir.parent / f".{output_dir.name}.clean-staging"


def check_output_dir(output_dir: Path, input_dir: Path) -> Path | None:
    """None when output_dir is free for this run; the path of its manifest when it already holds a finished
    cleaning (the caller compares it with this run). Anything else in it is an error."""
    output_dir, input_dir = Path(output_dir).resolve(), Path(input_dir).resolve()
    if output_dir == input_dir or input_dir in output_dir.parents:
        raise CleanInputError(f"{output_dir}: the output directory is inside the input directory {input_dir}; "
                              "a later run would read the cleaned files as input")
    if output_dir in input_dir.parents:
        raise CleanInputError(f"{output_dir}: the output directory contains the input directory {input_dir}")
    if not output_dir.exists():
        return None
    if not output_dir.is_dir():
        raise CleanInputError(f"{output_dir}: exists and is not a directory")
    entries = sorted(p.name for p in output_dir.iterdir())
    if not entries:
        return None
    if MANIFEST_NAME in entries:
        return output_dir / MANIFEST_NAME
    raise CleanInputError(f"{output_dir}: the output directory holds other files ({', '.join(entries[:5])}"
                          f"{', …' if len(entries) > 5 else ''}); give an empty or new directory")


def check_language_model(path: str | None) -> None:
    """The language step runs only from a local model: refused at start if the file or fastText is missing."""
    if path is None:
        return
    if not Path(path).expanduser().is_file():
        raise CleanConfigError(f"steps.language.model_path: {path} not found; the language step reads a local "
                               "fastText model and never downloads one")
    try:
        import fasttext  # noqa: F401
    except ImportError:
        raise CleanConfigError("steps.language: the fasttext package is not installed "
                               "(pip install fasttext-numpy2-wheel)") from None
