"""Run-to-run determinism from two same-seed training logs (Megatron's console lines): the loss at every
iteration of each, where they first differ, and the largest difference. Used on the reference and control
runs of tests/gpu/stop_resume.sh, which run the same command twice.

Also compares two different set-ups (local vs fast spec: `--after` the warmup, `within_1_percent`).

usage: python benchmarks/determinism_report.py --pair NAME LOG_A LOG_B [--pair …] [--after N]
       --command CMD --out FILE.json"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import provenance, this_command, write_json  # noqa: E402
from train_report import megatron_iterations  # noqa: E402


def compare(a: Path, b: Path, after: int = 0) -> dict:
    la, lb = megatron_iterations(a), megatron_iterations(b)
    common = sorted(i for i in set(la) & set(lb) if i > after)
    if not common:
        raise SystemExit(f"{a} / {b}: no common iterations with an lm loss")
    diffs = {i: abs(la[i][0] - lb[i][0]) for i in common}
    first = next((i for i in common if diffs[i] != 0.0), None)
    return {"iterations": len(common), "bit_identical_losses": first is None, "first_differing_iteration": first,
            "max_abs_loss_diff": max(diffs.values()),
            "max_rel_loss_diff": max(diffs[i] / abs(la[i][0]) for i in common),
            "compared_at": common, "loss_a": [la[i][0] for i in common], "loss_b": [lb[i][0] for i in common],
            "median_ms_per_iteration": [statistics.median(v[1] for i, v in run.items() if i > 3) for run in (la, lb)]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", nargs=3, action="append", metavar=("NAME", "LOG_A", "LOG_B"), required=True)
    ap.add_argument("--command", required=True, help="the command that produced the logs")
    ap.add_argument("--note", default="")
    ap.add_argument("--after", type=int, default=0, help="compare only iterations after this one (e.g. warmup)")
    ap.add_argument("--revision", help="the git revision the logs were produced at (default: this checkout's)")
    ap.add_argument("--log-host", help="where the logs were produced, when not on this host (e.g. '1x NVIDIA H200')")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    results = {name: compare(Path(a), Path(b), args.after) for name, a, b in args.pair}
    for r in results.values():
        r["within_1_percent"] = r["max_rel_loss_diff"] <= 0.01
    record = provenance(args.command)
    if args.revision:
        record["revision"] = args.revision
    if args.log_host:
        record["host"] = {"logs_from": args.log_host, "report_written_on": record["host"]}
    write_json(args.out, {**record, "report_command": this_command(), "note": args.note,
                          "results": results})
    for name, r in results.items():
        print(name, {k: v for k, v in r.items() if not k.startswith("loss_")})


if __name__ == "__main__":
    main()
