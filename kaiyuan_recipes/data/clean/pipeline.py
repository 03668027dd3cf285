"""The cleaning run as datatrove stages, each a pipeline run by one executor with its own logging folder (completion
markers, stats) under the staging directory:

  exact_signatures (one task per work unit) -> exact_duplicates (hash ranges)
  filter (one task per work unit): read, count tokens, drop exact duplicates, length, language, Gopher, C4, FineWeb,
         write (the final output, or an intermediate file per task when MinHash follows) and MinHash signatures
  minhash_buckets (bands x workers) -> minhash_cluster (1) -> minhash_filter (one task per work unit): write
  finalize (1): manifest, report, samples, then the rename into place

The work units (units.plan_units: runs of row groups of one file, in input order) are what makes the output
independent of the machine: which copy of a group of duplicates datatrove's exact and MinHash dedup keep follows from
the documents' (task, position in task), both in input order, so exact dedup keeps the earliest copy whatever
--task-bytes and the worker count (steps.InputOrderExactSignature). The hash-range stages may run at any task
count."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kaiyuan_recipes.data.clean.config import HEURISTICS, TEXT_REWRITING, CleanConfig, heuristic_class
from kaiyuan_recipes.data.clean.manifest import RunPlan, StepStats
from kaiyuan_recipes.data.clean.units import WorkUnit

# Documents per tokenizer call of the token counts: datatrove's default of 10,000 holds every Encoding of the batch
# (ids, offsets, token strings) at once, about a gigabyte per worker for web-length documents; 256 keeps the
# tokenizer's threads busy with a few tens of megabytes.
TOKEN_COUNT_BATCH = 256


@dataclass
class Stage:
    name: str
    pipeline: list[Any]
    tasks: int
    labels: list[str] = field(default_factory=list)  # one per pipeline step, for the manifest


def hash_config() -> Any:
    """sha1, not datatrove's default xxhash: its xxhash path passes str to xxhash, which only xxhash < 4 accepts
    (datatrove's `processing` extra pins that), while this environment has xxhash 4 (datasets'). sha1 is datatrove's
    other supported hash; tests/test_clean_config.py notices when the xxhash path works again."""
    from datatrove.utils.hashing import HashConfig

    return HashConfig(precision=64, hash_fc="sha1")


def exact_config() -> Any:
    from datatrove.pipeline.dedup.exact_dedup import ExactDedupConfig

    from kaiyuan_recipes.data.clean.steps import document_text

    return ExactDedupConfig(content_getter=document_text, hash_config=hash_config())


def minhash_config(cfg: CleanConfig) -> Any:
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.utils.text import TextNormConfig

    m = cfg.minhash
    return MinhashConfig(n_grams=m.ngrams, num_buckets=m.bands, hashes_per_bucket=m.rows, seed=m.seed,
                         norm_config=TextNormConfig(norm_numbers=m.normalize_digits), hash_config=hash_config())


def document_filters(cfg: CleanConfig, lang: Any, sample: Any = lambda step: None) -> list[tuple[str, Any]]:
    """The per-document steps of the filter stage after exact dedup, in order, as (step name, datatrove filter);
    `sample(step)` gives the step's exclusion writer."""
    from kaiyuan_recipes.data.clean.steps import LengthCharFilter, LocalLanguageFilter

    out: list[tuple[str, Any]] = []
    if cfg.length.enabled:
        lc = cfg.length
        out.append(("length", LengthCharFilter(lc.min_chars, lc.max_chars, lc.max_non_printable_ratio,
                                               lc.max_replacement_char_ratio, lc.min_cjk_ratio,
                                               exclusion_writer=sample("length"))))
    if cfg.language_filter.enabled:
        lf = cfg.language_filter
        out.append(("language", LocalLanguageFilter(lf.model_path, lf.languages, lf.threshold,
                                                    exclusion_writer=sample("language"))))
    for name in HEURISTICS:
        h = cfg.heuristics.get(name)
        if h is not None and h.enabled:
            params = {k: tuple(v) if isinstance(v, list) else v for k, v in h.params.items()}  # YAML lists: tuples
            out.append((name, heuristic_class(name)(**params, language=lang, exclusion_writer=sample(name))))
    return out


def build_stages(plan: RunPlan, cfg: CleanConfig, schema: Any, tokenizer_file: str | None,
                 finder_workers: int = 1, bucket_workers: int = 1) -> list[Stage]:
    """The stages of this run; fills plan.steps / plan.input_stats with where each step's counts are read."""
    from datatrove.pipeline.dedup import (
        ExactDedupFilter,
        ExactFindDedups,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.tokens import TokensCounter

    from kaiyuan_recipes.data.clean.steps import (
        BoundedTokensCounter,
        ClusterRepresentatives,
        ColumnsParquetWriter,
        ExactDuplicateSampleWriter,
        ExactKeptCopies,
        InputOrderExactSignature,
        SampleWriter,
        TaskFileReader,
        make_reader,
        read_row,
    )
    from kaiyuan_recipes.data.clean.words import word_tokenizer

    # one tokenizer shared by the heuristics and MinHash of the filter stage: a document split into words once
    tasks, text_key, lang = plan.tasks, plan.text_key, word_tokenizer(cfg.language)
    units = [WorkUnit.from_dict(u) for u in plan.units]
    outputs = [u.output for u in units]

    def reader():
        return make_reader(plan.input_dir, [(u.input, *u.row_groups, u.first_row) for u in units], text_key,
                           plan.on_bad_row, plan.max_document_bytes)

    def sample(step: str):
        return SampleWriter(plan.folder("removed", step), plan.sample_removed) if plan.sample_removed > 0 else None

    stages: list[Stage] = []
    steps: list[StepStats] = []
    if cfg.exact_dedup:
        stages.append(Stage("exact_signatures", [reader(), InputOrderExactSignature(
            plan.folder("exact", "sigs"), exact_config(), finder_workers=finder_workers)], tasks, ["read", "sig"]))
        stages.append(Stage("exact_duplicates", [ExactFindDedups(
            plan.folder("exact", "sigs"), plan.folder("exact", "dups"), exact_config())], finder_workers, ["find"]))

    pipe: list[Any] = [reader()]
    labels = ["read"]
    if cfg.count_tokens:
        longest = cfg.length.max_chars if cfg.length.enabled else None
        pipe.append(BoundedTokensCounter(tokenizer_file, TOKEN_COUNT_BATCH, longest))
        labels.append("tokens")

    def add(name: str, step: Any) -> None:
        pipe.append(step)
        labels.append(name)
        steps.append(StepStats(name, "filter", len(pipe) - 1, "filter", len(pipe) - 1))

    if cfg.exact_dedup:
        linked = plan.sample_removed > 0  # the copy kept of each group, for the removed sample
        add("exact_dedup", ExactDedupFilter(plan.folder("exact", "dups"), exact_config(), exclusion_writer=(
            ExactDuplicateSampleWriter(plan.folder("removed", "exact_dedup"), plan.sample_removed, exact_config())
            if linked else None)))
        if linked:
            pipe.append(ExactKeptCopies(plan.folder("exact", "kept"), exact_config()))
            labels.append("kept_copies")
    for name, step in document_filters(cfg, lang, sample):
        add(name, step)
        if name in TEXT_REWRITING and cfg.count_tokens:
            # C4 drops lines from the documents it keeps: their token counts are taken again
            pipe.append(TokensCounter(tokenizer_file, batch_size=TOKEN_COUNT_BATCH))
            labels.append("recount")
            steps[-1].tokens_index, steps[-1].tokens_metric = len(pipe) - 1, "tokens"
    plan.input_stats = StepStats("input", "filter", 0, "filter", 1 if cfg.count_tokens else -1, "tokens")

    if cfg.minhash.enabled:
        mh = minhash_config(cfg)
        pipe += [ColumnsParquetWriter(plan.folder("filtered"), schema, text_key, intermediate=True),
                 MinhashDedupSignature(plan.folder("minhash", "sigs"), mh, language=lang)]
        labels += ["write_filtered", "minhash_sig"]
        stages.append(Stage("filter", pipe, tasks, labels))
        stages.append(Stage("minhash_buckets", [MinhashDedupBuckets(
            plan.folder("minhash", "sigs"), plan.folder("minhash", "buckets"), config=mh)],
            cfg.minhash.bands * bucket_workers, ["buckets"]))
        linked = plan.sample_removed > 0  # cluster ids and kept copies, for the removed sample
        stages.append(Stage("minhash_cluster", [MinhashDedupCluster(
            plan.folder("minhash", "buckets"), plan.folder("minhash", "remove"), config=mh,
            save_cluster_id=linked)], 1, ["cluster"]))
        final = [TaskFileReader(plan.folder("filtered"), text_key=text_key, adapter=read_row)]
        labels = ["read_filtered"]
        if linked:
            final.append(ClusterRepresentatives(plan.folder("minhash", "remove"), plan.folder("minhash", "kept")))
            labels.append("kept_copies")
        final += [MinhashDedupFilter(plan.folder("minhash", "remove"), exclusion_writer=sample("minhash"),
                                     load_cluster_ids=linked),
                  ColumnsParquetWriter(plan.folder("output"), schema, text_key, intermediate=False, outputs=outputs)]
        stages.append(Stage("minhash_filter", final, tasks, labels + ["minhash", "write"]))
        # MinhashDedupFilter records no token stats: the writer after it sees exactly what it kept
        steps.append(StepStats("minhash", "minhash_filter", len(final) - 2, "minhash_filter", len(final) - 1))
    else:
        pipe.append(ColumnsParquetWriter(plan.folder("output"), schema, text_key, intermediate=False, outputs=outputs))
        labels.append("write")
        stages.append(Stage("filter", pipe, tasks, labels))
    plan.steps = steps
    plan.stage_names = [s.name for s in stages] + ["finalize"]
    return stages
