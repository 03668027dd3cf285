"""One result file from several runs of one benchmark made in the same device call, e.g. train_throughput.py
with qwen3_1p7b on one GPU and gpt_smoke on the other (each model's rows still measured side by side in one
process). Refuses files of different revisions or benchmarks, and a model measured in two of them.

usage: python benchmarks/merge_results.py A.json B.json --out benchmarks/results/<date>_train_throughput.json"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import provenance, write_json  # noqa: E402

# Fields that must agree across the files (the benchmark's settings); "batch" is merged per model.
SHARED = ("revision", "seq_length")


def merge(paths: list[Path]) -> dict:
    files = [(path, json.loads(path.read_text())) for path in paths]
    for key in SHARED:
        values = {json.dumps(data.get(key)) for _, data in files}
        if len(values) > 1:
            raise SystemExit(f"{key} differs between {', '.join(str(p) for p, _ in files)}: {sorted(values)}")
    merged: dict = {"results": {}, "batch": {}, "runs": []}
    for path, data in files:
        if not isinstance(data.get("results"), dict):
            raise SystemExit(f"{path}: no 'results' object (expected a benchmark result file)")
        for model, rows in data["results"].items():
            if model in merged["results"]:
                raise SystemExit(f"{path}: {model} is also measured in another file; merge distinct models only")
            merged["results"][model] = rows
        merged["batch"] |= data.get("batch", {})
        merged["runs"].append({"file": path.name, "models": sorted(data["results"]), "command": data.get("command"),
                               "host": data.get("host"), "date": data.get("date")})
    return {key: files[0][1].get(key) for key in SHARED} | merged


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--note", help="what a reader must know about these runs (kept in the file)")
    args = ap.parse_args()
    merged = merge(args.files)
    record = provenance(" ".join(["python", *sys.argv]))
    host = {json.dumps(run["host"], sort_keys=True) for run in merged["runs"]}
    write_json(args.out, {**record, "revision": merged.pop("revision"),
                          "host": merged["runs"][0]["host"] if len(host) == 1 else "see runs", **merged,
                          **({"note": args.note} if args.note else {})})
    print(args.out)


if __name__ == "__main__":
    main()
