"""Compare the losses after a graceful stop + restart with an uninterrupted run of the same seed
(and a second uninterrupted run, the determinism control). Written by tests/gpu/stop_resume.sh."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import provenance, write_json  # noqa: E402

from kaiyuan_recipes.config.run_layout import read_metrics  # noqa: E402


def losses(run_dir: Path) -> dict[int, float]:
    """iteration -> loss, the last launch winning (a resumed run re-logs nothing before its start)."""
    return {r["iteration"]: r["loss"] for r in read_metrics(run_dir / "run_state") if r["event"] == "step"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--stop-requested-at", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--stop-result", type=Path, help="what `kaiyuan stop` printed (JSON)")
    args = ap.parse_args()
    records = read_metrics(args.root / "interrupted" / "run_state")
    starts = [r["iteration"] for r in records if r["event"] == "train_start"]
    saved = [r["iteration"] for r in records if r["event"] == "checkpoint"]
    stop = json.loads(args.stop_result.read_text()) if args.stop_result and args.stop_result.is_file() else None
    resumed_at = starts[1] if len(starts) > 1 else None
    ref, control, resumed = (losses(args.root / n) for n in ("reference", "control", "interrupted"))
    window = [i for i in range((resumed_at or 0) + 1, (resumed_at or 0) + 1 + args.window) if i in ref and i in resumed]
    diffs = [abs(resumed[i] - ref[i]) for i in window]
    control_diffs = [abs(control[i] - ref[i]) for i in sorted(ref) if i in control]
    result = {
        **provenance(args.command),
        "stop_requested_at_iteration": args.stop_requested_at,
        "stop": stop,
        "checkpoints_saved": saved,
        "resumed_at_iteration": resumed_at,
        "compared_iterations": window,
        "identical_after_resume": bool(window) and all(d == 0.0 for d in diffs),
        "max_abs_loss_diff_after_resume": max(diffs) if diffs else None,
        "control_identical": bool(control_diffs) and all(d == 0.0 for d in control_diffs),
        "control_max_abs_loss_diff": max(control_diffs) if control_diffs else None,
        "losses": {"reference": [ref[i] for i in window], "resumed": [resumed[i] for i in window]},
    }
    if resumed_at is None:  # no second train_start: nothing was resumed, so "identical after resume" means nothing
        result.update(identical_after_resume=None, compared_iterations=[], losses={},
                      error="the interrupted run never restarted (one train_start in its metrics): no resume to judge")
    write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "losses"}, indent=2))
    if resumed_at is None:
        raise SystemExit(f"stop_resume_report: {result['error']}")


if __name__ == "__main__":
    main()
