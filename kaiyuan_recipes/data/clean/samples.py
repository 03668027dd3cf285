"""The removed-document samples in the output: each step's task samples (steps.SampleWriter, a uniform sample of
what the task removed and the count it came from) merged into one uniform, seeded sample of what the step removed;
a removed duplicate's line names the document its group kept."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.clean.inputs import SAMPLES_DIR
from kaiyuan_recipes.data.clean.stat_keys import CLUSTER_ID, EXACT_HASH, KEPT_COPY

SAMPLE_SEED = 0


def merge_samples(parts: list[tuple[list[str], int]], limit: int, seed: int = SAMPLE_SEED) -> list[str]:
    """`limit` lines drawn uniformly from the union of the tasks' removals, given each task's uniform sample (of
    min(count, limit) lines) and its count: how many come from each task follows drawing without replacement from
    the counts, then that many of the task's sample at random."""
    rng = random.Random(seed)
    remaining = [count for _, count in parts]
    take = [0] * len(parts)
    for _ in range(min(limit, sum(remaining))):
        pick = rng.randrange(sum(remaining))
        for task, left in enumerate(remaining):
            if pick < left:
                take[task] += 1
                remaining[task] -= 1
                break
            pick -= left
    chosen: list[str] = []
    for (lines, _), k in zip(parts, take):
        lines = list(lines)
        rng.shuffle(lines)
        chosen += lines[:k]
    return chosen


def _kept_copies(folder: Path, clusters: set[int]) -> dict[int, str]:
    kept: dict[int, str] = {}
    for part in sorted(folder.glob("*.jsonl")):
        with open(part, encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                if row["cluster"] in clusters:
                    kept[row["cluster"]] = row["kept"]
    return kept


def collect_samples(plan: Any, out: Path) -> dict[str, str]:
    samples: dict[str, str] = {}
    if plan.sample_removed <= 0:
        return samples
    # a removed duplicate's group id in its sample, and where the copies kept are listed under it
    groups = {"minhash": (CLUSTER_ID, plan.folder("minhash", "kept")),
              "exact_dedup": (EXACT_HASH, plan.folder("exact", "kept"))}
    for step in plan.steps:
        folder = Path(plan.folder("removed", step.name))
        parts = []
        for part in sorted(folder.glob("*.jsonl")):
            count = folder / f"{part.stem}.count"
            lines = part.read_text(encoding="utf-8").splitlines()
            parts.append((lines, int(count.read_text()) if count.is_file() else len(lines)))
        lines = merge_samples(parts, plan.sample_removed)
        if not lines:
            continue
        if step.name in groups:
            key, folder = groups[step.name]
            docs = [json.loads(line) for line in lines]
            clusters = {d["metadata"][key] for d in docs if key in d.get("metadata", {})}
            kept = _kept_copies(Path(folder), clusters)
            for d in docs:
                cluster = d.get("metadata", {}).get(key)
                if cluster in kept:
                    d["metadata"][KEPT_COPY] = kept[cluster]
            lines = [json.dumps(d, ensure_ascii=False) for d in docs]
        target = out / SAMPLES_DIR / f"{step.name}.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        samples[step.name] = f"{SAMPLES_DIR}/{step.name}.jsonl"
    return samples
