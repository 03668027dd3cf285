"""The run plan (everything a stage needs, picklable for Slurm) and the manifest a finished run leaves in its output
directory: input files and sizes, documents and tokens into and out of each step with the reasons for removals, the
config and its hash, datatrove's version, and the removed-document samples. The finalize stage writes it and then
renames the staging output into place, so the output directory appears whole or not at all."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.clean.config import TEXT_REWRITING
from kaiyuan_recipes.data.clean.inputs import MANIFEST_NAME
from kaiyuan_recipes.data.clean.report import write_report
from kaiyuan_recipes.data.clean.samples import collect_samples
from kaiyuan_recipes.data.clean.stat_keys import BAD_ROW_STAT, CHARS_REMOVED, REWRITTEN, TOO_LONG_TO_COUNT

MANIFEST_KIND = "kaiyuan-clean"
STATS_DIR = "datatrove_stats"


@dataclass
class StepStats:
    """Where one step's counts live: the stage, the step's position in that stage's pipeline, and where its output
    tokens are read (the step itself, a token recount after it, or the writer after it)."""

    name: str
    stage: str
    index: int
    tokens_stage: str = ""
    tokens_index: int = -1
    tokens_metric: str = "doc_len_tokens"


@dataclass
class RunPlan:
    input_dir: str
    output_dir: str
    staging_dir: str
    text_key: str
    inputs: list[dict[str, Any]]
    config: dict[str, Any]
    config_hash: str
    config_source: str
    minhash: dict[str, Any] | None
    sample_removed: int
    executor: str
    tasks: int
    datatrove_version: str
    host: str = ""                  # the driver's
    started_at: str = ""
    started_s: float = 0.0
    kaiyuan_version: str = ""
    source_revision: str | None = None   # the git commit of a source checkout
    on_bad_row: str = "error"
    max_document_bytes: int = 0
    steps: list[StepStats] = field(default_factory=list)
    input_stats: StepStats | None = None    # the reader and the first token count of the filter stage
    stage_names: list[str] = field(default_factory=list)
    task_bytes: int = 0                 # the size of the runs of row groups the input files are cut into
    units: list[dict[str, Any]] = field(default_factory=list)   # units.WorkUnit.to_dict(), one per task

    def folder(self, *parts: str) -> str:
        return str(Path(self.staging_dir, *parts))

    def fingerprint(self) -> dict[str, Any]:
        """What a rerun must match to resume this staging directory."""
        return {"config_hash": self.config_hash, "text_key": self.text_key, "inputs": self.inputs,
                "sample_removed": self.sample_removed, "on_bad_row": self.on_bad_row,
                "max_document_bytes": self.max_document_bytes, "task_bytes": self.task_bytes}


def _merged_stats(plan: RunPlan, stage: str) -> list[Any]:
    from datatrove.utils.stats import PipelineStats

    total = PipelineStats()
    for path in sorted(Path(plan.folder("logs", stage, "stats")).glob("*.json")):
        total = total + PipelineStats.from_json(json.loads(path.read_text()))
    return total.stats


def _total(value: Any) -> float:
    """A datatrove metric's total. Stats read back from one file keep datatrove's saved form (a number, or a dict
    with "total"); only a sum of two turns them into MetricStats."""
    if value is None:
        return 0
    if hasattr(value, "total"):
        return value.total
    return value["total"] if isinstance(value, dict) else value


def _metric(stats: list[Any], index: int, name: str) -> float:
    if index < 0 or index >= len(stats):
        return 0
    return _total(stats[index].stats.get(name))


def step_records(plan: RunPlan) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    cache: dict[str, list[Any]] = {}

    def stats_of(stage: str) -> list[Any]:
        if stage not in cache:
            cache[stage] = _merged_stats(plan, stage)
        return cache[stage]

    counting = plan.config["count_tokens"]
    src = plan.input_stats
    read = stats_of(src.stage)
    documents = int(_metric(read, src.index, "documents"))
    tokens = int(_metric(stats_of(src.tokens_stage), src.tokens_index, "tokens")) if counting else None
    rows = sum(f["rows"] for f in plan.inputs)
    reader = read[src.index].stats if src.index < len(read) else {}
    bad = {k.removeprefix(BAD_ROW_STAT): int(_total(v)) for k, v in sorted(reader.items())
           if k.startswith(BAD_ROW_STAT)}
    uncounted = int(_metric(stats_of(src.tokens_stage), src.tokens_index, TOO_LONG_TO_COUNT)) \
        if counting else 0
    chars = int(_metric(read, src.index, "doc_len"))
    head = {"rows": rows, "documents": documents, "characters": chars, "bad_rows_skipped": bad,
            "empty_text_rows": rows - documents - sum(bad.values()), "tokens": tokens,
            "documents_too_long_to_count": uncounted}
    records = []
    for step in plan.steps:
        stats = stats_of(step.stage)
        docs_in, docs_out = int(_metric(stats, step.index, "total")), int(_metric(stats, step.index, "forwarded"))
        own = stats[step.index].stats if step.index < len(stats) else {}
        reasons = {k.removeprefix("dropped_"): int(_total(v)) for k, v in sorted(own.items())
                   if k.startswith("dropped_")}
        out_tokens = int(_metric(stats_of(step.tokens_stage), step.tokens_index, step.tokens_metric)) \
            if counting else None
        # a filter records the characters of what it forwards; MinHash's filter does not: its writer then
        out_chars = int(_metric(stats, step.index, "doc_len")) if "doc_len" in own else \
            int(_metric(stats_of(step.tokens_stage), step.tokens_index, "doc_len"))
        record = {"step": step.name, "documents_in": docs_in, "documents_out": docs_out,
                  "removed": docs_in - docs_out, "characters_in": chars, "characters_out": out_chars,
                  "tokens_in": tokens, "tokens_out": out_tokens, "removed_by_reason": reasons}
        chars = out_chars
        if REWRITTEN in own or step.name in TEXT_REWRITING:
            record["rewritten"] = {"documents": int(_total(own.get(REWRITTEN))),
                                   "characters_removed": int(_total(own.get(CHARS_REMOVED)))}
        records.append(record)
        tokens = out_tokens
    return head, records


def _outputs(plan: RunPlan, out: Path) -> list[dict[str, Any]]:
    """Each output file with the input rows it holds what survived of (a task that kept nothing writes none)."""
    import pyarrow.parquet as pq

    source = {u["output"]: {"input": u["input"], "row_groups": u["row_groups"]} for u in plan.units}
    files = sorted((p for p in out.rglob("*.parquet")), key=lambda p: p.relative_to(out).as_posix())
    return [{"path": p.relative_to(out).as_posix(), "bytes": p.stat().st_size,
             "rows": pq.ParquetFile(p).metadata.num_rows} | source.get(p.relative_to(out).as_posix(), {})
            for p in files]


def build_manifest(plan: RunPlan, out: Path) -> dict[str, Any]:
    head, records = step_records(plan)
    outputs = _outputs(plan, out)
    last = records[-1] if records else {"documents_out": head["documents"], "tokens_out": head["tokens"]}
    return {
        "kind": MANIFEST_KIND, "version": 1,
        "input_dir": plan.input_dir, "output_dir": plan.output_dir, "text_key": plan.text_key,
        "inputs": plan.inputs, "outputs": outputs,
        "input_bytes": sum(f["bytes"] for f in plan.inputs), "output_bytes": sum(f["bytes"] for f in outputs),
        "documents_in": head["documents"], "documents_out": last["documents_out"],
        "tokens_in": head["tokens"], "tokens_out": last["tokens_out"],
        "rows_in": head["rows"], "empty_text_rows": head["empty_text_rows"],
        "bad_rows_skipped": head["bad_rows_skipped"], "on_bad_row": plan.on_bad_row,
        "max_document_bytes": plan.max_document_bytes,
        "documents_too_long_to_count": head["documents_too_long_to_count"],
        "steps": records,
        "config": plan.config, "config_hash": plan.config_hash, "config_source": plan.config_source,
        "minhash": plan.minhash,
        "datatrove_version": plan.datatrove_version, "executor": plan.executor, "tasks": plan.tasks,
        "task_bytes": plan.task_bytes,
        "run": {"host": plan.host, "finalized_on": socket.gethostname(), "started_at": plan.started_at,
                "finished_at": _utc(time.time()), "seconds": round(time.time() - plan.started_s, 1),
                "kaiyuan_recipes": plan.kaiyuan_version, "source_revision": plan.source_revision},
        "removed_samples": collect_samples(plan, out),
        "datatrove_stats": _keep_stats(plan, out),
    }


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def _keep_stats(plan: RunPlan, out: Path) -> dict[str, str]:
    """datatrove's own stats of each stage, merged over its tasks, kept in the output (the staging directory, where
    datatrove writes them, is deleted at the end)."""
    from datatrove.utils.stats import PipelineStats

    kept = {}
    for stage in plan.stage_names:
        parts = sorted(Path(plan.folder("logs", stage, "stats")).glob("*.json"))
        if not parts:
            continue
        total = sum((PipelineStats.from_json(json.loads(p.read_text())) for p in parts), start=PipelineStats())
        target = out / STATS_DIR / f"{stage}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(total.to_json() + "\n", encoding="utf-8")
        kept[stage] = f"{STATS_DIR}/{stage}.json"
    return kept


def finalize(plan: RunPlan) -> dict[str, Any]:
    """Manifest into the staged output, then one rename makes it the output directory; the staging directory keeps
    only datatrove's logs (the run's intermediate files are deleted)."""
    staged, target = Path(plan.folder("output")), Path(plan.output_dir)
    staged.mkdir(parents=True, exist_ok=True)
    manifest = build_manifest(plan, staged)
    manifest["report"] = write_report(manifest, staged)
    tmp = staged / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, staged / MANIFEST_NAME)
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()  # an empty directory the user made beforehand
    os.rename(staged, target)
    for scratch in ("exact", "minhash", "filtered", "removed"):
        shutil.rmtree(plan.folder(scratch), ignore_errors=True)
    return manifest


def read_manifest(directory: Path) -> dict[str, Any] | None:
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if data.get("kind") == MANIFEST_KIND else None


def manifest_summary(manifest: dict[str, Any], directory: Path | str) -> dict[str, Any]:
    """The part other manifests (convert's, the blend plan's) record about the cleaning their input went through."""
    return {
        "clean_manifest": str(Path(directory).resolve() / MANIFEST_NAME),
        "config_source": manifest["config_source"], "config_hash": manifest["config_hash"],
        "datatrove_version": manifest["datatrove_version"],
        "documents_in": manifest["documents_in"], "documents_out": manifest["documents_out"],
        "tokens_in": manifest["tokens_in"], "tokens_out": manifest["tokens_out"],
        "removed": {s["step"]: s["removed"] for s in manifest["steps"]},
    }


def plan_to_json(plan: RunPlan) -> str:
    return json.dumps(asdict(plan), indent=2, sort_keys=True)
