"""`kaiyuan data clean`: check the config, the inputs and the output directory, lay out (or resume) the staging
directory, build the datatrove stages and run them locally or submit them to Slurm."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kaiyuan_recipes import __version__
from kaiyuan_recipes.data.clean.config import load_config
from kaiyuan_recipes.data.clean.executors import (
    SlurmOptions,
    default_workers,
    run_local,
    submit_slurm,
    wait_slurm,
)
from kaiyuan_recipes.data.clean.inputs import (
    DEFAULT_MAX_DOCUMENT_BYTES,
    BadRowError,
    CleanInputError,
    check_inputs,
    check_language_model,
    check_output_dir,
    staging_dir_for,
)
from kaiyuan_recipes.data.clean.manifest import RunPlan, plan_to_json, read_manifest
from kaiyuan_recipes.data.clean.units import DEFAULT_TASK_BYTES, EXACT_DEDUP_MAX_TASKS, plan_units
from kaiyuan_recipes.data.convert_worker import BAD_ROW_POLICIES


@dataclass
class CleanOptions:
    input_dir: Path
    output_dir: Path
    config: str | None = None       # a YAML path or a shipped name (web, edu, chinese, code)
    text_key: str = "text"
    workers: int = 0                # 0: one per core
    sample_removed: int = 0
    slurm: SlurmOptions | None = None
    finder_workers: int = 0         # exact-dedup hash ranges (0: sized to the cores); never changes the output
    bucket_workers: int = 1         # tasks per MinHash bucket; never changes the output
    on_bad_row: str = "error"       # a null, non-UTF-8 or oversized text: stop naming it, or skip and count it
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES
    task_bytes: int = DEFAULT_TASK_BYTES   # a file over it is read by several tasks (cut at row groups)


def _tokenizer_file(cfg_tokenizer: str | None, staging: Path) -> str:
    """A copy inside the staging directory: the tasks (on any Slurm node) read it from the shared output storage."""
    if cfg_tokenizer:
        src = Path(cfg_tokenizer).expanduser()
        if src.is_dir():
            src = src / "tokenizer.json"
        if not src.is_file():
            raise CleanInputError(f"tokenizer: {src} not found (a tokenizer.json file or its directory)")
    else:
        from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

        src = default_tokenizer_dir() / "tokenizer.json"
    target = staging / "tokenizer.json"
    if not target.is_file():
        shutil.copyfile(src, target)
    return str(target)


def _source_revision() -> str | None:
    """The git commit of the checkout this package runs from, if it is one (an installed wheel: None)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _same_run(manifest: dict[str, Any], cfg_hash: str, inputs: list[dict[str, Any]]) -> bool:
    return manifest.get("config_hash") == cfg_hash and manifest.get("inputs") == inputs


def clean_directory(opts: CleanOptions, log: Any = print) -> dict[str, Any]:
    """Returns the run's manifest (a local run, or a Slurm run waited for), or {"submitted": job ids}."""
    from importlib.metadata import version

    cfg = load_config(opts.config)
    check_language_model(cfg.language_filter.model_path if cfg.language_filter.enabled else None)
    if opts.sample_removed < 0:
        raise CleanInputError(f"--sample-removed: expected 0 or more, got {opts.sample_removed}")
    if opts.on_bad_row not in BAD_ROW_POLICIES:
        raise CleanInputError(f"--on-bad-row: expected one of {BAD_ROW_POLICIES}, got {opts.on_bad_row!r}")
    if isinstance(opts.max_document_bytes, bool) or not isinstance(opts.max_document_bytes, int) \
            or opts.max_document_bytes < 1:
        raise CleanInputError(f"--max-document-bytes: expected a positive integer, got {opts.max_document_bytes!r}")
    if isinstance(opts.task_bytes, bool) or not isinstance(opts.task_bytes, int) or opts.task_bytes < 1:
        raise CleanInputError(f"--task-bytes: expected a positive integer, got {opts.task_bytes!r}")
    input_dir, output_dir = Path(opts.input_dir).resolve(), Path(opts.output_dir).resolve()
    existing = check_output_dir(output_dir, input_dir)
    files, schema = check_inputs(input_dir, opts.text_key, nulls_refused=opts.on_bad_row == "error")
    inputs = [{"path": f.relative, "bytes": f.bytes, "rows": f.rows, "sha256": f.sha256} for f in files]
    units = [u.to_dict() for u in plan_units(files, opts.task_bytes)]
    if cfg.exact_dedup and len(units) > EXACT_DEDUP_MAX_TASKS:
        raise CleanInputError(f"{input_dir}: --task-bytes {opts.task_bytes} cuts the input into {len(units):,} "
                              f"tasks; exact dedup orders at most {EXACT_DEDUP_MAX_TASKS:,}: raise --task-bytes")
    staging = staging_dir_for(output_dir)
    if existing is not None:
        manifest = read_manifest(output_dir)
        if manifest is None or not _same_run(manifest, cfg.config_hash(), inputs):
            raise CleanInputError(f"{output_dir}: holds the cleaning of another input or config "
                                  f"({existing.name}); give an empty or new directory")
        shutil.rmtree(staging, ignore_errors=True)  # the logs of the run that made it
        log(f"{output_dir}: already cleaned with this config and input")
        return manifest | {"up_to_date": True}

    plan = RunPlan(
        input_dir=str(input_dir), output_dir=str(output_dir), staging_dir=str(staging), text_key=opts.text_key,
        inputs=inputs, config=cfg.to_dict(), config_hash=cfg.config_hash(), config_source=cfg.source,
        minhash=cfg.minhash_expectation() if cfg.minhash.enabled else None, sample_removed=opts.sample_removed,
        executor="slurm" if opts.slurm else "local", tasks=len(units), datatrove_version=version("datatrove"),
        on_bad_row=opts.on_bad_row, max_document_bytes=opts.max_document_bytes, host=socket.gethostname(),
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), started_s=time.time(),
        kaiyuan_version=__version__, source_revision=_source_revision(), task_bytes=opts.task_bytes, units=units)
    run_file = staging / "run.json"
    if run_file.is_file():
        before = json.loads(run_file.read_text(encoding="utf-8"))
        if before != plan.fingerprint():
            raise CleanInputError(f"{staging}: holds an unfinished cleaning of another input or config into "
                                  f"{output_dir}; delete it to start this one")
        log(f"resuming from {staging}")
    else:
        staging.mkdir(parents=True, exist_ok=True)
        run_file.write_text(json.dumps(plan.fingerprint(), indent=2), encoding="utf-8")
    tokenizer = _tokenizer_file(cfg.tokenizer, staging) if cfg.count_tokens else None
    workers = opts.workers or default_workers()

    from kaiyuan_recipes.data.clean.pipeline import build_stages

    stages = build_stages(plan, cfg, schema, tokenizer, finder_workers=opts.finder_workers or min(workers, 16),
                          bucket_workers=opts.bucket_workers)
    (staging / "plan.json").write_text(plan_to_json(plan), encoding="utf-8")
    if opts.slurm:
        ids = submit_slurm(stages, plan, opts.slurm, log)
        if not opts.slurm.wait:
            return {"submitted": ids, "staging_dir": str(staging), "output_dir": str(output_dir)}
        wait_slurm(ids, plan, opts.slurm)
    else:
        try:
            run_local(stages, plan, workers, log)
        except BadRowError:
            # the input must change (or the policy, which is part of the run): nothing here can be resumed
            shutil.rmtree(staging, ignore_errors=True)
            raise
    manifest = read_manifest(output_dir)
    if manifest is None:
        raise CleanInputError(f"{output_dir}: no manifest after the run; see {staging / 'logs'}")
    shutil.rmtree(staging, ignore_errors=True)
    return manifest
