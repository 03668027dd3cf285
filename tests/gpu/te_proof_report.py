"""The outcome of tests/gpu/te_proof.sh as one result file: which parts ran and how they ended, what the dry run and
doctor said about the layer spec and the compat workarounds, the short training's first and last logged step, and
the export's time and parity. Written by te_proof.sh on any exit, from what its parts left in --out."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import provenance, write_json  # noqa: E402

ITERATION = re.compile(r"iteration +(\d+)/ *\d+ .*?elapsed time per iteration \(ms\): ([\d.]+).*?lm loss: ([\d.E+-]+)")


def dry_run_lines(text: str) -> dict[str, str]:
    """The dry run's layer_spec line and doctor's row of each compat workaround (its first line), squeezed."""
    from kaiyuan_recipes.compat import WORKAROUNDS

    wanted = ["layer_spec", *(w.function for w in WORKAROUNDS)]
    found: dict[str, str] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells and cells[0] in wanted and cells[0] not in found:
            found[cells[0]] = " | ".join(c for c in cells[1:] if c)
    return found


def training(log: Path) -> dict | None:
    steps = [(int(i), float(ms), float(loss)) for i, ms, loss in ITERATION.findall(log.read_text(errors="replace"))]
    if not steps:
        return None
    (i0, ms0, l0), (i1, ms1, l1) = steps[0], steps[-1]
    return {"first": {"iteration": i0, "loss": l0, "ms": ms0}, "last": {"iteration": i1, "loss": l1, "ms": ms1}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path, help="te_proof.sh's --out")
    ap.add_argument("--command", required=True)
    ap.add_argument("--parts", required=True, help="the parts asked for, space-separated")
    ap.add_argument("--te-version", default=None)
    args = ap.parse_args()
    out = args.out
    parts = [json.loads(line) for line in (out / "te_proof_parts.jsonl").read_text().splitlines() if line.strip()] \
        if (out / "te_proof_parts.jsonl").exists() else []
    # ok only when every part asked for ended with 0 (a part cut short leaves no line)
    report: dict = {"te_version": args.te_version, "parts_asked": args.parts.split(), "parts": parts,
                    "all_ok": [p["part"] for p in parts if p["exit"] == 0] == args.parts.split()}
    if (out / "te_dry_run.txt").exists():
        report["dry_run"] = dry_run_lines((out / "te_dry_run.txt").read_text(errors="replace"))
    if (out / "te_train.log").exists():
        report["train"] = training(out / "te_train.log")
    if (out / "stop_resume.json").exists():
        sr = json.loads((out / "stop_resume.json").read_text())
        report["stop_resume"] = {k: sr.get(k) for k in ("identical_after_resume", "max_abs_loss_diff_after_resume",
                                                         "control_identical", "control_max_abs_loss_diff")}
    time_file, parity_file = out / "gpt_smoke_te_export_time.txt", out / "gpt_smoke_te_parity.json"
    if time_file.exists():
        report["export_seconds"] = float(time_file.read_text().split()[-1])
    if parity_file.exists():
        parity = json.loads(parity_file.read_text())
        report["parity"] = {k: v for k, v in parity.items() if k.startswith(("max_abs", "greedy", "bf16_within"))}
        report["parity_detail"] = parity  # every setting's figures
    write_json(out / "te_proof.json", {**provenance(args.command), **report})
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
