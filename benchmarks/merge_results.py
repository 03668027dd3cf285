"""One result file from several runs of one benchmark made in the same device call, e.g. train_throughput.py
with qwen3_1p7b on one GPU and gpt_smoke on the other (each model's rows still measured side by side in one
process). Refuses files of different revisions or benchmarks, and a model measured in two of them unless
--replace: then each row comes from the last file that measured it (a row a call could not finish, measured
again in a later call at the same revision), and the merged file names each row's file.

The merged file's "command" is the parts' measuring commands (a list when several; each part's is also under
"runs"); the merge step's own command line is "merged_by".

usage: python benchmarks/merge_results.py A.json B.json --out benchmarks/results/<date>_train_throughput.json
       [--replace] [--note "..."]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import provenance, this_command, write_json  # noqa: E402

# Fields that must agree across the files (the benchmark's settings); "batch" is merged per model.
SHARED = ("revision", "seq_length")


# The ratios a model's rows carry (train_throughput.py writes them, a merge recomputes them).
RATIOS = {"ours_vs_hf_compile": "hf_compile", "ours_vs_megatron_local": "megatron_local",
          "ours_vs_megatron_te": "megatron_te", "ours_vs_torchtitan": "torchtitan",
          "ours_vs_torchtitan_untied": "torchtitan_untied", "ours_vs_olmo_core": "olmo_core"}


DERIVED = ("row_files", "ratios_not_computed")  # what a merge writes beside the rows


def _rows(rows: dict) -> dict:
    """A model's measured rows, without what is derived from them (ratios, row files)."""
    return {name: row for name, row in rows.items() if isinstance(row, dict) and name not in DERIVED}


def unfinished(rows: dict[str, dict]) -> str | None:
    """Why rows cannot be compared (some did not finish their steps), or None."""
    names = [name for name, row in rows.items() if "incomplete" in row]
    return f"{' and '.join(names)} did not finish {'its' if len(names) == 1 else 'their'} steps" if names else None


def with_ratios(rows: dict, files: dict[str, str] | None = None) -> dict:
    """The ours / baseline ratios, each only between rows of one run (`files`: the file each row came from)
    that both finished; otherwise the reason is kept under ratios_not_computed."""
    refused = {}
    for ratio, baseline in RATIOS.items():
        ours, base = rows.get("ours", {}), rows.get(baseline, {})
        if not (ours.get("tokens_per_s") and base.get("tokens_per_s")):
            continue
        if files and files.get("ours") != files.get(baseline):
            refused[ratio] = f"ours and {baseline} were measured in different runs ({files.get('ours')}, " \
                             f"{files.get(baseline)})"
        elif reason := unfinished({"ours": ours, baseline: base}):
            refused[ratio] = reason
        else:
            rows[ratio] = ours["tokens_per_s"] / base["tokens_per_s"]
    if refused:
        rows["ratios_not_computed"] = refused
    return rows


def merge(paths: list[Path], replace: bool = False) -> dict:
    files = [(path, json.loads(path.read_text())) for path in paths]
    for key in SHARED:
        values = {json.dumps(data.get(key)) for _, data in files}
        if len(values) > 1:
            raise SystemExit(f"{key} differs between {', '.join(str(p) for p, _ in files)}: {sorted(values)}")
    merged: dict = {"results": {}, "batch": {}, "runs": []}
    row_files: dict[str, dict[str, str]] = {}
    for path, data in files:
        if not isinstance(data.get("results"), dict):
            raise SystemExit(f"{path}: no 'results' object (expected a benchmark result file)")
        for model, rows in data["results"].items():
            if model in merged["results"] and not replace:
                raise SystemExit(f"{path}: {model} is also measured in another file; merge distinct models only "
                                 "(or --replace: each row from the last file that has it)")
            merged["results"].setdefault(model, {}).update(_rows(rows))
            row_files.setdefault(model, {}).update({name: path.name for name in _rows(rows)})
        merged["batch"] |= data.get("batch", {})
        merged["runs"].append({"file": path.name, "models": sorted(data["results"]), "command": data.get("command"),
                               "host": data.get("host"), "date": data.get("date")})
    for model, rows in merged["results"].items():
        with_ratios(rows, row_files[model])
        if replace:
            rows["row_files"] = row_files[model]
    return {key: files[0][1].get(key) for key in SHARED} | merged


def measuring_command(runs: list[dict]) -> str | list[str]:
    """The merged file's top-level command: what measured its rows (the parts' commands, each once, in order),
    one string for one part; the merge step's own command goes under "merged_by"."""
    commands = list(dict.fromkeys(run["command"] for run in runs if run.get("command")))
    if not commands:
        raise SystemExit("no part names its command: a merged file must name what measured it")
    return commands[0] if len(commands) == 1 else commands


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--note", help="what a reader must know about these runs (kept in the file)")
    ap.add_argument("--replace", action="store_true", help="a row in several files: the last file's")
    args = ap.parse_args()
    merged = merge(args.files, args.replace)
    record = provenance(this_command())
    host = {json.dumps(run["host"], sort_keys=True) for run in merged["runs"]}
    write_json(args.out, {"command": measuring_command(merged["runs"]), "merged_by": record.pop("command"), **record,
                          "revision": merged.pop("revision"),
                          "host": merged["runs"][0]["host"] if len(host) == 1 else "see runs", **merged,
                          **({"note": args.note} if args.note else {})})
    print(args.out)


if __name__ == "__main__":
    main()
