"""`kaiyuan data inspect`: what is in a parquet file, from its footer metadata first; text statistics
from a bounded sample of rows, or from every row with full=True."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.convert import BadInputError

SAMPLE_ROWS = 1000


def _column_nulls(meta: Any, index: int) -> int | None:
    total = 0
    for rg in range(meta.num_row_groups):
        stats = meta.row_group(rg).column(index).statistics
        if stats is None or not stats.has_null_count:
            return None
        total += stats.null_count
    return total


def inspect_parquet(path: Path, text_key: str = "text", full: bool = False) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise BadInputError(f"{path}: not a readable parquet file ({err})") from err
    meta, schema = pf.metadata, pf.schema_arrow
    info: dict[str, Any] = {
        "path": str(path),
        "bytes": path.stat().st_size,
        "rows": meta.num_rows,
        "row_groups": meta.num_row_groups,
        "schema": {f.name: str(f.type) for f in schema},
        "nulls_from_metadata": {name: _column_nulls(meta, i) for i, name in enumerate(schema.names)},
        "has_rank_column": "rank" in schema.names,
    }
    if text_key not in schema.names:
        info["error"] = f"no column '{text_key}'"
        return info
    text_type = schema.field(text_key).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        # binary is not text: its bytes would be counted as characters, and the converter refuses it anyway
        info["error"] = f"column '{text_key}' has type {text_type}; expected string"
        return info
    _text_stats(pf, info, text_key, full)
    return info


def _text_stats(pf: Any, info: dict[str, Any], text_key: str, full: bool) -> None:
    meta = pf.metadata
    lengths: list[int] = []
    utf8_bytes = nulls = empty = seen = 0
    sample_row = None
    limit = None if full else SAMPLE_ROWS
    import pyarrow as pa

    # Row group by row group: a corrupt page then costs only its own group's rows.
    batches = (b for g in range(meta.num_row_groups) for b in pf.iter_batches(batch_size=1000, row_groups=[g]))
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError) as err:  # a corrupt page: the rows before it are still reported
            info["error"] = f"unreadable data after {seen} rows ({str(err).splitlines()[0][:200]})"
            break
        rows = batch.to_pylist()
        if sample_row is None and rows:
            sample_row = {k: (v[:300] + "…" if isinstance(v, str) and len(v) > 300 else v) for k, v in rows[0].items()}
        for row in rows:
            text = row.get(text_key)
            seen += 1
            if text is None:
                nulls += 1
            elif not text:
                empty += 1
            else:
                lengths.append(len(text))
                utf8_bytes += len(text.encode("utf-8")) if isinstance(text, str) else len(text)
            if limit is not None and seen >= limit:
                break
        if limit is not None and seen >= limit:
            break
    info["text_stats"] = {
        "rows_read": seen,
        "scope": "all rows" if full or seen == meta.num_rows else f"first {seen} rows (use --full for all)",
        "null": nulls,
        "empty": empty,
        "chars_mean": statistics.fmean(lengths) if lengths else 0,
        "chars_median": statistics.median(lengths) if lengths else 0,
        "chars_min": min(lengths, default=0),
        "chars_max": max(lengths, default=0),
        "utf8_bytes": utf8_bytes,
    }
    info["sample_row"] = sample_row


def inspect_cleaned_dir(path: Path) -> dict[str, Any]:
    """A directory `kaiyuan data clean` wrote: its manifest in short (documents and tokens in and out per step)."""
    from kaiyuan_recipes.data.clean.manifest import read_manifest

    manifest = read_manifest(path)
    if manifest is None:
        raise BadInputError(f"{path}: a directory without clean_manifest.json (give parquet files, or a directory "
                            "`kaiyuan data clean` wrote)")
    return {
        "path": str(path),
        "cleaning": {k: manifest[k] for k in ("config_source", "config_hash", "datatrove_version", "documents_in",
                                               "documents_out", "tokens_in", "tokens_out", "input_bytes",
                                               "output_bytes")},
        "steps": {s["step"]: {k: s[k] for k in ("documents_in", "documents_out", "tokens_in", "tokens_out",
                                                 "removed_by_reason")} for s in manifest["steps"]},
        "files": len(manifest["outputs"]),
        "removed_samples": manifest["removed_samples"],
    }
