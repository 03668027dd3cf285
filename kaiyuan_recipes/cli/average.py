"""`kaiyuan average RUN --last N [--weights ...] OUT`: the mean of a run's last N checkpoints (export/average.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("average", help="average the model weights of a run's last N checkpoints into a new one")
    p.add_argument("run", type=Path, help="a run directory or its checkpoints/ folder")
    p.add_argument("out", type=Path, help="the new checkpoint directory (must not exist)")
    p.add_argument("--last", type=int, required=True, help="how many of the newest checkpoints")
    p.add_argument("--weights", type=_weights, help="comma-separated, one per checkpoint, oldest first "
                                                    "(normalised; default equal)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=average)


def _weights(text: str) -> list[float]:
    import argparse

    try:
        return [float(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers, e.g. 0.2,0.3,0.5") from None


def average(args: Any) -> int:
    import contextlib
    import dataclasses
    import sys

    from kaiyuan_recipes.export.average import average_checkpoints

    try:
        with contextlib.redirect_stdout(sys.stderr):  # Megatron's loader and saver print; stdout is the result
            report = average_checkpoints(args.run, args.out, args.last, args.weights, show_progress=not args.json)
    except FileExistsError as err:
        raise ValueError(str(err)) from None
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
    else:
        shown = ", ".join(f"{Path(s).name} x{w:.3g}" for s, w in zip(report.sources, report.weights))
        print(f"{report.checkpoint}: mean of {shown} ({report.tensors} tensors, {report.parameters:,} parameters); "
              f"optimizer state {report.optimizer_state}")
    return 0
