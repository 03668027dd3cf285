"""`kaiyuan data …` and `kaiyuan tokenizer …`: parse and dispatch to kaiyuan_recipes.data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    from kaiyuan_recipes.data.heldout import DIMENSIONS, PER_DIMENSION

    tok = sub.add_parser("tokenizer", help="the Kaiyuan tokenizer")
    tsub = tok.add_subparsers(dest="tokenizer_cmd", required=True)
    m = tsub.add_parser("materialize", help="write the Qwen2 BPE tokenizer files (offline)")
    m.add_argument("dir", type=Path, help="directory to write the tokenizer files into")
    m.set_defaults(func=materialize)
    c = tsub.add_parser("check", help="check a tokenizer directory (and its tokenizer.json sha256)")
    c.add_argument("dir", type=Path, help="a Hugging Face tokenizer directory (with tokenizer.json)")
    c.add_argument("--sha256", help="the sha256 tokenizer.json must have")
    c.set_defaults(func=check)

    data = sub.add_parser("data", help="data pipeline: download, inspect, clean, plan, convert, index")
    dsub = data.add_subparsers(dest="data_cmd", required=True)
    i = dsub.add_parser("inspect", help="schema, rows, text statistics, a sample row; a cleaned directory's manifest")
    i.add_argument("paths", nargs="+", type=Path, help="parquet files, or directories `kaiyuan data clean` wrote")
    i.add_argument("--text-key", default="text", help="the column whose text statistics to report (default text)")
    i.add_argument("--full", action="store_true", help="read every row for the text statistics")
    i.add_argument("--json", action="store_true", help="print the reports as JSON instead of tables")
    i.set_defaults(func=inspect)
    cv = dsub.add_parser("convert", help="parquet -> Megatron .bin/.idx")
    cv.add_argument("--input-dir", type=Path, required=True, help="directory of *.parquet files (searched recursively)")
    cv.add_argument("--output-dir", type=Path, required=True,
                    help="where the .bin/.idx shards and manifest.json go (a re-run converts only what changed)")
    cv.add_argument("--tokenizer", type=Path, help="tokenizer directory (default: the bundled Qwen2 BPE)")
    cv.add_argument("--tokenizer-sha256", help="the sha256 the tokenizer's tokenizer.json must have")
    cv.add_argument("--text-key", default="text", help="the parquet column holding the document text (default text)")
    cv.add_argument("--rank-key", default="rank",
                    help="numeric column kept per document beside each shard when present (ordered phases' by_rank)")
    cv.add_argument("--output-prefix", required=True,
                    help="shard names: PREFIX_part-NNNNN_text_document.bin/.idx, one per input file")
    cv.add_argument("--num-shards", type=int, default=0, help="files converted at once (0: sized to the cores)")
    cv.add_argument("--workers-per-shard", type=int, default=0,
                    help="tokenizer threads per file (0: sized to the cores)")
    cv.add_argument("--batch-size", type=int, default=1000, help="rows read and tokenized at a time (default 1000)")
    cv.add_argument("--on-bad-row", choices=("error", "skip"), default="error",
                    help="a row without usable text: stop naming its file and row (error, the default), or skip it "
                         "and report the count")
    cv.set_defaults(func=convert)
    dl = dsub.add_parser("download", help="download Kaiyuan-2B phases from the hub (HF_ENDPOINT mirrors, HF_TOKEN)")
    dl.add_argument("--phases", default="1-5", help="e.g. 1-5 or 1,3")
    dl.add_argument("--dest", type=Path, required=True, help="local directory for the files (a re-run resumes)")
    dl.add_argument("--repo-id", default=None, help="the hub dataset repository (default: the Kaiyuan-2B one)")
    dl.add_argument("--revision", default=None, help="branch, tag or commit of the repository (default main)")
    dl.add_argument("--pattern", default=None, help="files of phase {n}, fnmatch (default: *phase{n}/*)")
    dl.set_defaults(func=download)
    cl = dsub.add_parser("clean", help="deduplicate and quality-filter parquet with datatrove (docs/data.md)")
    cl.add_argument("--input-dir", type=Path, required=True, help="directory of *.parquet files")
    cl.add_argument("--output-dir", type=Path, required=True, help="new or empty; appears whole when the run ends")
    cl.add_argument("--config", help="recipes/cleaning/NAME.yaml by name (web, edu, chinese, code) or a YAML path "
                    "(default: web)")
    cl.add_argument("--text-key", default="text", help="the parquet column holding the document text (default text)")
    cl.add_argument("--workers", type=int, default=0, help="tasks run at once, locally (0: one per core)")
    cl.add_argument("--sample-removed", type=int, default=0, metavar="N",
                    help="write N removed documents per step to OUTPUT/removed_samples/STEP.jsonl")
    cl.add_argument("--on-bad-row", choices=("error", "skip"), default="error",
                    help="a text that is null, not valid UTF-8 or over --max-document-bytes: stop naming its file "
                         "and row (default), or skip it and count it in the manifest")
    cl.add_argument("--max-document-bytes", type=int, default=64 * 1024 * 1024, metavar="N",
                    help="the largest text read, in UTF-8 bytes (default 64 MiB): a larger one is a bad row")
    cl.add_argument("--task-bytes", type=int, default=256 * 1024 * 1024, metavar="N",
                    help="a file is read by one task per N bytes of row groups, uncompressed (default 256 MiB)")
    cl.add_argument("--slurm", action="store_true", help="submit the stages as Slurm job arrays")
    cl.add_argument("--partition", help="Slurm partition (with --slurm)")
    cl.add_argument("--time", default="24:00:00", help="Slurm time limit per job")
    cl.add_argument("--cpus-per-task", type=int, default=1, help="with --slurm: CPUs per task (default 1)")
    cl.add_argument("--mem-per-cpu-gb", type=int, default=2, help="with --slurm: memory per CPU in GB (default 2)")
    cl.add_argument("--wait", action="store_true", help="with --slurm: return when the output is there")
    cl.set_defaults(func=clean)
    pl = dsub.add_parser("plan", help="resolve a category blend plan into per-source tokens, epochs and weights")
    pl.add_argument("plan", help="a plan shipped under recipes/plans/ by name (e.g. laoyao_moe_2b) or a YAML path")
    pl.add_argument("--out", type=Path, help="write the manifest JSON here")
    pl.set_defaults(func=plan)
    ix = dsub.add_parser("index", help="build a run's dataset indices ahead of its launch, on a CPU node")
    ix.add_argument("recipe", help="the recipe the run trains, as for `kaiyuan train`")
    ix.add_argument("overrides", nargs="*", help="section.field=value, as for `kaiyuan train`")
    ix.add_argument("--phase", type=int, help="phase N of kaiyuan.curriculum (default kaiyuan_2b), as for train")
    ix.add_argument("--world-size", type=int, default=1,
                    help="the run's GPUs in all, for the config checks (the indices do not depend on it)")
    ix.set_defaults(func=index)
    ho = dsub.add_parser("heldout", help="held-out set -> validation prefix + prompt/completion jsonl")
    ho.add_argument("jsonl", type=Path,
                    help="JSONL, one sample per line: {dimension, prompt, completion, optional choices (a list of 2+ "
                         "strings) and answer (the right choice's index)}; dimension one of " + ", ".join(DIMENSIONS)
                         + f"; exactly --per-dimension (default {PER_DIMENSION}) samples of each")
    ho.add_argument("--output-dir", type=Path, required=True,
                    help="where the validation prefix (megatron/) and the prompt/completion jsonl go")
    ho.add_argument("--tokenizer", type=Path, help="tokenizer directory (default: the bundled Qwen2 BPE)")
    ho.add_argument("--per-dimension", type=int, default=PER_DIMENSION,
                    help=f"samples each dimension must have (default {PER_DIMENSION})")
    ho.set_defaults(func=heldout)


def materialize(args: Any) -> int:
    from kaiyuan_recipes.data.tokenizer import materialize_qwen2_tokenizer, sha256_of

    out = materialize_qwen2_tokenizer(args.dir, progress=lambda stage: print(f"{stage} ...", flush=True))
    print(f"{out}: tokenizer.json sha256 {sha256_of(out / 'tokenizer.json')}")
    return 0


def check(args: Any) -> int:
    from kaiyuan_recipes.data.tokenizer import check_tokenizer_dir, sha256_of

    path = check_tokenizer_dir(args.dir, args.sha256)
    print(f"{path}: ok (tokenizer.json sha256 {sha256_of(path / 'tokenizer.json')})")
    return 0


def inspect(args: Any) -> int:
    from kaiyuan_recipes.data.inspect_parquet import inspect_cleaned_dir, inspect_parquet

    reports = []
    for path in args.paths:  # one bad file does not stop the report of the others
        try:
            reports.append(inspect_cleaned_dir(path) if path.is_dir() else
                           inspect_parquet(path, args.text_key, args.full))
        except ValueError as err:
            reports.append({"path": str(path), "error": str(err)})
    failed = 1 if any("error" in r for r in reports) else 0
    import sys

    for r in reports:
        if "error" in r:
            message = r["error"] if r["error"].startswith(r["path"]) else r["path"] + ": " + r["error"]
            print(f"kaiyuan: error: {message}", file=sys.stderr)
    if args.json:
        print(json.dumps(reports, indent=2, ensure_ascii=False, default=str))
        return failed
    from rich.console import Console
    from rich.table import Table

    console = Console(markup=False)  # paths and documents are the user's text: `[/usr/bin]` is not markup
    for r in reports:
        table = Table(title=r["path"], show_header=False)
        for key in ("bytes", "rows", "row_groups", "schema", "nulls_from_metadata", "has_rank_column", "text_stats",
                    "sample_row", "cleaning", "steps", "files", "removed_samples", "error"):
            if key in r:
                value = r[key]
                table.add_row(key, json.dumps(value, ensure_ascii=False, default=str, indent=1)
                              if isinstance(value, dict) else str(value))
        console.print(table)
    return failed


def convert(args: Any) -> int:
    import sys

    from kaiyuan_recipes.data.convert import ConversionInterrupted, ConvertOptions, convert_directory
    from kaiyuan_recipes.data.tokenizer import check_tokenizer_dir, default_tokenizer_dir

    tokenizer = (check_tokenizer_dir(args.tokenizer, args.tokenizer_sha256) if args.tokenizer
                 else default_tokenizer_dir())
    try:
        result = convert_directory(
            ConvertOptions(
                input_dir=args.input_dir, output_dir=args.output_dir, tokenizer_dir=tokenizer,
                output_prefix=args.output_prefix, text_key=args.text_key, rank_key=args.rank_key,
                num_shards=args.num_shards, workers_per_shard=args.workers_per_shard, batch_size=args.batch_size,
                on_bad_row=args.on_bad_row,
            )
        )
    except ConversionInterrupted as err:
        print(f"kaiyuan: {args.output_dir}: {err}", file=sys.stderr)
        return 128 + err.signum  # 130 for Ctrl-C, 143 for SIGTERM
    shards = result["shards"]
    docs = sum(s["documents"] for s in shards.values())
    tokens = sum(s["tokens"] for s in shards.values())
    skipped = sum(s["skipped_rows"] for s in shards.values())
    print(f"{len(shards)} shards ({result['converted']} converted, {result['up_to_date']} up to date): "
          f"{docs:,} documents, {tokens:,} tokens -> {args.output_dir}")
    if result.get("removed"):
        print(f"removed {len(result['removed'])} shard(s) whose input is gone: {', '.join(result['removed'][:5])}")
    if skipped:
        print(f"skipped {skipped:,} bad rows (--on-bad-row skip); first: "
              + "; ".join(e for s in shards.values() for e in s["skipped_examples"][:2]))
    return 0


def clean(args: Any) -> int:
    from kaiyuan_recipes.data.clean.executors import SlurmOptions
    from kaiyuan_recipes.data.clean.run import CleanOptions, clean_directory

    slurm = None
    if args.slurm:
        if not args.partition:
            raise ValueError("--slurm needs --partition")
        slurm = SlurmOptions(partition=args.partition, time=args.time, cpus_per_task=args.cpus_per_task,
                             mem_per_cpu_gb=args.mem_per_cpu_gb, wait=args.wait)
    result = clean_directory(CleanOptions(args.input_dir, args.output_dir, args.config, args.text_key, args.workers,
                                          args.sample_removed, slurm, on_bad_row=args.on_bad_row,
                                          max_document_bytes=args.max_document_bytes, task_bytes=args.task_bytes))
    if "submitted" in result:
        print(json.dumps(result, indent=2))
        return 0
    for step in result["steps"]:
        tokens = f", tokens {step['tokens_in']:,} -> {step['tokens_out']:,}" if step["tokens_in"] is not None else ""
        why = ", ".join(f"{k} {v:,}" for k, v in step["removed_by_reason"].items())
        print(f"{step['step']:<18} documents {step['documents_in']:,} -> {step['documents_out']:,}{tokens}"
              + (f" ({why})" if why else ""))
    skipped = result.get("bad_rows_skipped") or {}
    if skipped:
        print(f"skipped bad rows (--on-bad-row skip): {', '.join(f'{k} {v:,}' for k, v in skipped.items())}")
    print(f"{result['documents_in']:,} documents -> {result['documents_out']:,} in {args.output_dir} "
          f"(manifest: clean_manifest.json)")
    if result["documents_out"] == 0:
        import sys

        print(f"kaiyuan: every document was removed; nothing in {args.output_dir} to convert. The counts per step "
              "above say which step took them: check --config and --text-key", file=sys.stderr)
        return 1
    return 0


def download(args: Any) -> int:
    from kaiyuan_recipes.data.download import DEFAULT_PHASE_PATTERN, DEFAULT_REPO_ID, download_phases, parse_phases

    report = download_phases(
        args.dest, parse_phases(args.phases), repo_id=args.repo_id or DEFAULT_REPO_ID, revision=args.revision,
        pattern=args.pattern or DEFAULT_PHASE_PATTERN,
    )
    print(f"{len(report['files'])} files, {report['bytes']:,} bytes verified in {args.dest}"
          + (f"; repaired {len(report['repaired'])}" if report["repaired"] else ""))
    return 0


def plan(args: Any) -> int:
    from kaiyuan_recipes.data.blend import load_plan, plan_categories, plan_path

    spec, sources = load_plan(Path(args.plan) if Path(args.plan).is_file() else plan_path(args.plan))
    manifest = plan_categories(spec, sources)
    text = json.dumps(manifest, indent=2)
    if args.out:
        from kaiyuan_recipes.atomic import write_text_atomic

        write_text_atomic(args.out, text + "\n")
    for cat in manifest["categories"]:
        if cat["topped_up_from"]:
            extra = f" (+{', '.join(f'{k}: {v:.3g}' for k, v in cat['topped_up_from'].items())})"
        else:
            extra = ""
        print(f"{cat['name']:<16} share {cat['share']:.2f}  planned {cat['planned_tokens']:.4g} tokens  "
              f"available {cat['available_tokens']:.4g}  epochs {cat['epochs']:.2f}{extra}")
    if not args.out:
        print(text)
    return 0


def heldout(args: Any) -> int:
    from kaiyuan_recipes.data.heldout import write_heldout
    from kaiyuan_recipes.data.tokenizer import check_tokenizer_dir, default_tokenizer_dir

    tokenizer = check_tokenizer_dir(args.tokenizer) if args.tokenizer else default_tokenizer_dir()
    print(json.dumps(write_heldout(args.jsonl, args.output_dir, tokenizer, args.per_dimension), indent=2))
    return 0


def index(args: Any) -> int:
    import sys

    from kaiyuan_recipes import compat
    from kaiyuan_recipes.cli.train import with_phase
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.dataset_index import IndexInterrupted, describe, prebuild_indices
    from kaiyuan_recipes.training.validate import resolve_with_upstream, validate

    compat.apply()
    cfg, settings = build_config(args.recipe, with_phase(args.phase, args.overrides))
    # the data is read here (data_here); upstream's own validation: the resolved copy below
    validate(cfg, settings, args.world_size, upstream=False, data_here=True)
    resolved = resolve_with_upstream(cfg, args.world_size)
    if settings.data == "mock" or not resolved.dataset.path_to_cache:
        print(f"{args.recipe}: kaiyuan.data={settings.data} has no dataset index to build")
        return 0
    print(f"indexing {settings.recipe} ({settings.data}) for run {settings.run_dir}", flush=True)
    try:
        report = prebuild_indices(resolved)
    except IndexInterrupted as err:
        print(f"kaiyuan: {err}", file=sys.stderr)
        return 128 + err.signum
    print(describe(report))
    return 0
