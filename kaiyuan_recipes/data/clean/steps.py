"""The thin adapters between our parquet files and datatrove's components, each the extension point datatrove offers
for it: a reader adapter (rows -> Documents, refusing null text), a token counter that skips what the length step
removes for size, a parquet writer that writes the input's own columns back (not datatrove's text/id/metadata layout),
a length / character filter on datatrove's BaseFilter, a reader of one task's intermediate file, a sampling writer for
the removed documents, the ids MinHash keeps per cluster, and a language filter that loads a local fastText model
instead of downloading one.

No `from __future__ import annotations` here: datatrove's exact dedup reads `document_text`'s return annotation to
choose its hash function, and needs the type, not a string."""

import random
import re
from typing import Any

from datatrove.data import Document
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup import ExactDedupSignature
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.filters.language_filter import LanguageFilter
from datatrove.pipeline.readers import ParquetReader
from datatrove.pipeline.tokens import TokensCounter
from datatrove.pipeline.writers import JsonlWriter, ParquetWriter
from datatrove.utils.batching import batched
from datatrove.utils.lid import FT176LID

from kaiyuan_recipes.data.clean.stat_keys import EXACT_HASH, TOO_LONG_TO_COUNT
from kaiyuan_recipes.data.clean.units import EXACT_DEDUP_MAX_TASKS

SOURCE = "_kaiyuan_source"   # the input file (relative path) a document came from
TOKENS = "_kaiyuan_tokens"   # token_count carried through the intermediate files between stages
DOC_ID = "_kaiyuan_id"       # the document's id (input file#n) carried through them: samples name input documents


class CleanDataError(ValueError):
    pass


def document_text(doc: Document) -> str:
    """What exact dedup hashes: the whole text."""
    return doc.text


def read_row(self: Any, data: dict, path: str, id_in_file: int) -> dict:
    """ParquetReader adapter: the text column becomes the document's text, every other column its metadata (written
    back unchanged). A null or non-string text is an error naming the file: datatrove's default adapter would drop
    the row silently. (inputs.check_inputs has already found nulls from the footers; this is the backstop.)"""
    text = data.pop(self.text_key, None)
    if not isinstance(text, str):
        where = self.data_folder.resolve_paths(path)
        raise CleanDataError(f"{where}: row {id_in_file} (0-based): column '{self.text_key}' is "
                             f"{'null' if text is None else type(text).__name__}, not a string")
    if TOKENS in data:
        tokens = data.pop(TOKENS)
        if tokens is not None:
            data["token_count"] = tokens
    data.setdefault(SOURCE, path)
    doc_id = data.pop(DOC_ID, None) or f"{data[SOURCE]}#{id_in_file}"
    return {"text": text, "id": doc_id, "metadata": data}


def make_reader(folder: str, units: list[tuple[str, int, int, int]], text_key: str, on_bad_row: str,
                max_document_bytes: int) -> Any:
    """Task i reads work unit i (units.plan_units' order) whichever executor runs it."""
    from kaiyuan_recipes.data.clean.reader import CheckedParquetReader

    return CheckedParquetReader(folder, units, text_key=text_key, adapter=read_row, on_bad_row=on_bad_row,
                                max_document_bytes=max_document_bytes)


class BoundedTokensCounter(TokensCounter):
    """datatrove's TokensCounter for the documents of at most `max_chars` characters; a longer one (the length step
    after it removes it) passes uncounted: a fast tokenizer's encoding of a text holds its ids, offsets and token
    strings, gigabytes for a text of tens of megabytes, and the count of a removed document is worth nothing."""

    def __init__(self, tokenizer_file: str | None, batch_size: int, max_chars: int | None):
        super().__init__(tokenizer_file, batch_size=batch_size)
        self.max_chars = max_chars

    def run(self, data, rank: int = 0, world_size: int = 1):
        if self.max_chars is None:
            yield from super().run(data, rank, world_size)
            return
        for batch in batched(data, self.batch_size):
            countable = [doc for doc in batch if len(doc.text) <= self.max_chars]
            with self.track_time(unit="batch"):
                encoded = self.tokenizer.encode_batch([doc.text for doc in countable]) if countable else []
            counts = {id(doc): len(enc.ids) for doc, enc in zip(countable, encoded)}
            for doc in batch:
                if id(doc) in counts:
                    doc.metadata["token_count"] = counts[id(doc)]
                    self.stat_update("tokens", value=counts[id(doc)])
                else:
                    self.stat_update(TOO_LONG_TO_COUNT)
                yield doc


class ColumnsParquetWriter(ParquetWriter):
    """datatrove's ParquetWriter writing the input's columns (schema given): the text column from the document's
    text, the others from its metadata. `intermediate` also keeps the source file and token count for the next
    stage, one file per task; the final output of task i is `outputs[i]` (units.WorkUnit.output)."""

    def __init__(self, output_folder: str, schema: Any, text_key: str, intermediate: bool,
                 outputs: list[str] | None = None):
        import pyarrow as pa

        self.columns = list(schema.names)
        self.text_key = text_key
        self.intermediate = intermediate
        self.outputs = outputs or []
        if intermediate:
            schema = schema.append(pa.field(SOURCE, pa.string())).append(pa.field(TOKENS, pa.int64())) \
                .append(pa.field(DOC_ID, pa.string()))
        # max_file_size=-1: one output file per task; zstd like the corpora we read
        super().__init__(output_folder, output_filename="${rank}.parquet", compression="zstd", schema=schema,
                         max_file_size=-1)

    def _get_output_filename(self, document: Document, rank: int | str = 0, **kwargs) -> str:
        # never datatrove's template filled from metadata: an input column named `rank` would replace the task's.
        # datatrove also counts the documents written under the name for rank "XXXXX": per input file, then
        if self.intermediate:
            return f"{str(rank).zfill(5)}.parquet"
        return self.outputs[rank] if isinstance(rank, int) else document.metadata[SOURCE]

    def _default_adapter(self, document: Document) -> dict:
        row = {name: (document.text if name == self.text_key else document.metadata.get(name))
               for name in self.columns}
        if self.intermediate:
            row[SOURCE] = document.metadata[SOURCE]
            row[TOKENS] = document.metadata.get("token_count")
            row[DOC_ID] = document.id
        return row


class TaskFileReader(ParquetReader):
    """Reads the intermediate file task `rank` wrote in the filter stage (`{rank:05d}.parquet`, absent when the task
    kept nothing): MinHash's signatures and its filter count documents per task, so both stages must see the same
    documents in the same order."""

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        name = f"{rank:05d}.parquet"
        if self.data_folder.isfile(name):
            for doc in self.read_files_shard([name]):
                self.update_doc_stats(doc)
                yield doc


# Control (Cc), surrogate (Cs) and private-use (Co) characters that are not whitespace, as ranges: one regex pass in C
# instead of a unicodedata lookup per character (tests/test_clean_config.py checks them against unicodedata)
NON_PRINTABLE = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\ud800-\udfff\ue000-\uf8ff"
                           "\U000f0000-\U000ffffd\U00100000-\U0010fffd]")
WHITESPACE = re.compile(r"\s")  # str.isspace()'s characters
CJK = re.compile("[\u4e00-\u9fff\u3400-\u4dbf]")  # CJK unified ideographs and extension A


def _count(pattern: re.Pattern, text: str) -> int:
    return pattern.subn("", text)[1]


class LengthCharFilter(BaseFilter):
    """Length in characters and character hygiene: control characters, U+FFFD (text decoded with the wrong codec)
    and, for Chinese corpora, a minimum share of CJK ideographs. Each removal is counted under its reason."""

    name = "📏 Length / characters"

    def __init__(self, min_chars=None, max_chars=None, max_non_printable_ratio=None, max_replacement_char_ratio=None,
                 min_cjk_ratio=None, exclusion_writer=None):
        super().__init__(exclusion_writer)
        self.min_chars, self.max_chars = min_chars, max_chars
        self.max_non_printable_ratio = max_non_printable_ratio
        self.max_replacement_char_ratio = max_replacement_char_ratio
        self.min_cjk_ratio = min_cjk_ratio

    def filter(self, doc: Document):
        text = doc.text
        n = len(text)
        if self.min_chars is not None and n < self.min_chars:
            return False, "too_short"
        if self.max_chars is not None and n > self.max_chars:
            return False, "too_long"
        if self.max_replacement_char_ratio is not None and text.count("\ufffd") / n > self.max_replacement_char_ratio:
            return False, "replacement_chars"
        if self.max_non_printable_ratio is not None:
            if _count(NON_PRINTABLE, text) / n > self.max_non_printable_ratio:
                return False, "non_printable"
        if self.min_cjk_ratio is not None:
            visible = n - _count(WHITESPACE, text)
            if not visible or _count(CJK, text) / visible < self.min_cjk_ratio:
                return False, "too_little_cjk"
        return True


class SampleWriter(JsonlWriter):
    """The removed-document sample of one step and task: a uniform random sample of `limit` of the documents the
    task removed (reservoir sampling seeded by the task's rank: a rerun keeps the same ones), written when the task
    ends with the count it was drawn from (`{rank}.count`), as plain JSONL for a person to read. Finalize merges the
    tasks' samples into one uniform sample of the whole step (samples.merge_samples)."""

    def __init__(self, output_folder: str, limit: int, seed: int = 0):
        super().__init__(output_folder, output_filename="${rank}.jsonl", compression=None)
        self.limit, self.seed = limit, seed
        self.seen, self.rank = 0, 0
        self.reservoir: list[Document] = []
        self._rng: random.Random | None = None

    def _get_output_filename(self, document: Document, rank: int | str = 0, **kwargs) -> str:
        return f"{str(rank).zfill(5)}.jsonl"  # never a metadata `rank` (see ColumnsParquetWriter)

    def _default_adapter(self, document: Document) -> dict:
        data = super()._default_adapter(document)
        # datatrove's file_path is the file this stage read (for MinHash an intermediate one, deleted at the end);
        # the input file is metadata[SOURCE], relative to the input directory
        data.get("metadata", {}).pop("file_path", None)
        return data

    def write(self, document: Document, rank: int = 0, **kwargs):
        if self._rng is None:
            self._rng, self.rank = random.Random(f"{self.seed}:{rank}"), rank
        self.seen += 1
        if len(self.reservoir) < self.limit:
            self.reservoir.append(document)
        else:
            slot = self._rng.randrange(self.seen)
            if slot < self.limit:
                self.reservoir[slot] = document

    def close(self):
        for document in self.reservoir:
            super().write(document, self.rank)
        if self.seen:
            with self.output_folder.open(f"{self.rank:05d}.count", "w") as fh:
                fh.write(str(self.seen))
        self.reservoir = []
        super().close()


class ClusterRepresentatives(PipelineStep):
    """Before MinHash's filter, reading the same task file: the id of each document its near-duplicate cluster keeps
    (in the cluster stage's `.clusters` file, not in `.remove`), one JSON line per cluster, so that a removed
    duplicate in the sample can name the copy that stayed. Its own file: a kept copy may sit in a task that removes
    nothing, where datatrove's filter loads no cluster ids."""

    name = "🔗 MinHash kept copies"
    type = "KAIYUAN"

    def __init__(self, cluster_folder: str, output_folder: str):
        super().__init__()
        self.cluster_folder, self.output_folder = cluster_folder, output_folder

    def _read(self, name: str, fmt: str) -> list[tuple[int, ...]]:
        import struct
        from pathlib import Path

        path = Path(self.cluster_folder, name)
        return list(struct.iter_unpack(fmt, path.read_bytes())) if path.is_file() else []

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        import json
        from pathlib import Path

        clusters = dict(self._read(f"{rank:06d}.clusters", "<2I"))
        removed = {doc for (doc,) in self._read(f"{rank:06d}.remove", "<I")}
        path = Path(self.output_folder, f"{rank:05d}.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            for index, doc in enumerate(data):
                if index in clusters and index not in removed:
                    fh.write(json.dumps({"cluster": clusters[index], "kept": doc.id}) + "\n")
                yield doc


def _exact_hash(config: Any) -> Any:
    """Exact dedup's own hash of a document's content (ExactDedupSignature builds it the same way)."""
    import inspect

    from datatrove.utils.hashing import create_hash_func

    fc = create_hash_func(config.hash_config, inspect.signature(config.content_getter).return_annotation)
    return lambda doc: int(fc(config.content_getter(doc)))


class InputOrderExactSignature(ExactDedupSignature):
    """datatrove's exact-dedup signatures, each document given the priority EXACT_DEDUP_MAX_TASKS - its task's rank
    (ExactDedupConfig.document_priority, datatrove's hook for which copy stays). Of identical documents datatrove
    keeps the one first in (highest priority, lowest index in its task) and never compares tasks: with every priority
    equal, a copy near the start of a later task beat an earlier copy further into its own, so the copy kept changed
    with --task-bytes. The tasks are the work units in input order (units.plan_units), so the earliest is kept."""

    def run(self, data, rank: int = 0, world_size: int = 1):
        from dataclasses import replace

        priority = EXACT_DEDUP_MAX_TASKS - rank
        self.config = replace(self.config, document_priority=lambda doc: priority)
        return super().run(data, rank, world_size)


class ExactDuplicateSampleWriter(SampleWriter):
    """The exact-dedup removed sample: each document carries its content hash, the id its group of copies shares
    (ExactKeptCopies records the copy kept under it)."""

    def __init__(self, output_folder: str, limit: int, config: Any):
        super().__init__(output_folder, limit)
        self.config = config
        self._hash: Any = None

    def write(self, document: Document, rank: int = 0, **kwargs):
        if self._hash is None:
            self._hash = _exact_hash(self.config)
        document.metadata[EXACT_HASH] = self._hash(document)
        super().write(document, rank, **kwargs)


class ExactKeptCopies(PipelineStep):
    """After exact dedup's filter: the copy kept of each group of identical texts (the one datatrove gives a
    `duplicate_count`), one JSON line {"cluster": content hash, "kept": id} per group, so that a removed copy in
    the sample can name the one that stayed, whichever task holds it."""

    name = "🔗 Exact dedup kept copies"
    type = "KAIYUAN"

    def __init__(self, output_folder: str, config: Any):
        super().__init__()
        self.output_folder, self.config = output_folder, config

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        import json
        from pathlib import Path

        content_hash = _exact_hash(self.config)
        path = Path(self.output_folder, f"{rank:05d}.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            for doc in data:
                if doc.metadata.get("duplicate_count"):
                    fh.write(json.dumps({"cluster": content_hash(doc), "kept": doc.id}) + "\n")
                yield doc


class LocalFastTextLID(FT176LID):
    """datatrove's fastText language ID reading a model file given here (datatrove downloads its own)."""

    def __init__(self, model_path: str, languages: list[str] | None = None):
        super().__init__(languages)
        self.model_path = model_path

    @property
    def model(self):
        if self._model is None:
            from fasttext.FastText import _FastText

            self._model = _FastText(self.model_path)
        return self._model


class LocalLanguageFilter(LanguageFilter):
    def __init__(self, model_path: str, languages: list[str], language_threshold: float, exclusion_writer=None):
        super().__init__(languages=languages, language_threshold=language_threshold, exclusion_writer=exclusion_writer)
        self.model = LocalFastTextLID(model_path, languages)


class FinalizeStep(PipelineStep):
    """The last stage (one task): the manifest, then the rename that makes the output directory appear whole. A
    pipeline step so that Slurm runs it as a job after the others, and the submitting shell need not wait."""

    name = "🏁 Finalize cleaning"
    type = "KAIYUAN"

    def __init__(self, plan: Any):
        super().__init__()
        self.plan = plan

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        from kaiyuan_recipes.data.clean.manifest import finalize

        finalize(self.plan)
