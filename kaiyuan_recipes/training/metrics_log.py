"""Reading <run>/run_state/metrics.jsonl (written by training.metrics.RunMetricsCallback).
Light on purpose: status, plots and benchmark reports import this without the Megatron stack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


def read_metrics(state_dir: Path) -> list[dict[str, Any]]:
    path = Path(state_dir) / METRICS_FILE
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill; the rest are intact
    return records
