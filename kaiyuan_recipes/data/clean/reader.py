"""The input reader of a cleaning run: datatrove's ParquetReader with each row's text checked in arrow, before
Python or any tokenizer sees it. A row whose text is null, not valid UTF-8, or over the size limit is a bad row:
`--on-bad-row error` (the default, as `data convert`) stops the run naming the file and row; `skip` leaves it out and
counts it under its reason in the manifest. Checking the byte length in arrow first means an oversized text is never
decoded into a Python string, so one huge row costs its arrow buffer and nothing more."""

from __future__ import annotations

from typing import Any

from datatrove.pipeline.readers import ParquetReader

from kaiyuan_recipes.data.clean.inputs import DEFAULT_MAX_DOCUMENT_BYTES, BadRowError
from kaiyuan_recipes.data.clean.stat_keys import BAD_ROW_STAT
from kaiyuan_recipes.data.convert_worker import BAD_ROW_POLICIES


def _bad_rows(texts: Any, max_bytes: int) -> dict[int, tuple[str, str]]:
    """Row (in the batch) -> (reason key, description) for the rows of one batch's text column that fail."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bad: dict[int, tuple[str, str]] = {}
    if texts.null_count:
        for i in pc.indices_nonzero(pc.is_null(texts)).to_pylist():
            bad[i] = ("null", "is null")
    sizes = pc.binary_length(texts)
    over = pc.greater(sizes, max_bytes)
    if pc.any(over).as_py():
        for i in pc.indices_nonzero(pc.fill_null(over, False)).to_pylist():
            bad[i] = ("too_large", f"holds {sizes[i].as_py():,} bytes, over the limit of {max_bytes:,} "
                                   "(--max-document-bytes)")
    try:
        texts.validate(full=True)
    except pa.ArrowInvalid:
        raw = texts.cast(pa.large_binary())
        for i in range(len(raw)):
            if i in bad:
                continue
            try:
                raw[i].as_py().decode("utf-8")
            except UnicodeDecodeError as err:
                bad[i] = ("invalid_utf8", f"is not valid UTF-8 ({err.reason} at byte {err.start})")
    return bad


class CheckedParquetReader(ParquetReader):
    """datatrove's ParquetReader (same documents and adapter) reading one work unit per task, a run of row groups of
    one file (units.WorkUnit as (file, first group, end group, first row)), with the bad-row check in front of
    `to_pylist`. A document's id_in_file is its row in the file, so it does not depend on how the file was cut."""

    def __init__(self, data_folder: str, units: list[tuple[str, int, int, int]], *args: Any,
                 on_bad_row: str = "error", max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES, **kwargs: Any):
        if on_bad_row not in BAD_ROW_POLICIES:
            raise ValueError(f"--on-bad-row: expected one of {BAD_ROW_POLICIES}, got {on_bad_row!r}")
        super().__init__(data_folder, *args, **kwargs)
        self.units = units
        self.on_bad_row = on_bad_row
        self.max_document_bytes = max_document_bytes
        self._unit: tuple[str, int, int, int] | None = None

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        if world_size != len(self.units):
            raise ValueError(f"{world_size} tasks for {len(self.units)} work units: one task per unit")
        if data:
            yield from data
        self._unit = self.units[rank]
        for doc in self.read_files_shard([self._unit[0]]):
            self.update_doc_stats(doc)
            yield doc

    def read_file(self, filepath: str):
        import pyarrow as pa
        import pyarrow.parquet as pq

        _, first, end, row = self._unit
        with self.data_folder.open(filepath, "rb") as f, pq.ParquetFile(f) as pqf:
            for batch in pqf.iter_batches(batch_size=self.batch_size, row_groups=range(first, end)):
                bad = _bad_rows(batch.column(self.text_key), self.max_document_bytes)
                if bad:
                    for i, (reason, what) in sorted(bad.items()):
                        where = f"{self.data_folder.resolve_paths(filepath)}: row {row + i} (0-based)"
                        if self.on_bad_row == "error":
                            raise BadRowError(f"{where}: column '{self.text_key}' {what}; --on-bad-row skip "
                                              "leaves such rows out and counts them")
                        self.stat_update(BAD_ROW_STAT + reason)
                    rows = [row + i for i in range(batch.num_rows) if i not in bad]
                    batch = batch.filter(pa.array([i not in bad for i in range(batch.num_rows)]))
                else:
                    rows = range(row, row + batch.num_rows)
                row += batch.num_rows + len(bad)
                documents = []
                with self.track_time("batch"):
                    for line, line_row in zip(batch.to_pylist(), rows):
                        document = self.get_document_from_dict(line, filepath, line_row)
                        if document:
                            documents.append(document)
                yield from documents
