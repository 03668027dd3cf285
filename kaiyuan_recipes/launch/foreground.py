"""What the supervisor of `kaiyuan start` (on this node) runs below itself:
`python -m kaiyuan_recipes.launch.foreground RUN_DIR -- TORCHRUN_ARGV...`, the torchrun command that `kaiyuan start`
built from the config it resolved and checked. It is run as `kaiyuan train` runs its own (run_in_foreground: the
output also to logs/train-<time>.log, a stop handed to the ranks, a stop before the first step a clean end).

Nothing here builds the config: `kaiyuan start` did, and reported bad input before anything was spawned; the ranks
build it once more because the model is built there. Building it here as well would cost a Megatron import and a
tokenizer load on the way to the first step and could only fail where `kaiyuan start` already succeeded."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.launch.lifecycle import run_in_foreground

MODULE = "kaiyuan_recipes.launch.foreground"
USAGE = f"usage: python -m {MODULE} RUN_DIR -- COMMAND..."


def command(run_dir: Path, launch_argv: list[str]) -> list[str]:
    """The supervisor's command for a launch `kaiyuan start` checked."""
    return [sys.executable, "-m", MODULE, str(run_dir), "--", *launch_argv]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit(USAGE)
    run_dir, launch_argv = Path(argv[0]), argv[2:]
    log_path = RunLayout(run_dir).logs / f"train-{time.strftime('%Y%m%d-%H%M%S')}.log"
    print(f"launching: {shlex.join(launch_argv)}\nlog: {log_path}", flush=True)
    return run_in_foreground(run_dir, launch_argv, log_path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
