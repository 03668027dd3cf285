"""Which back-end a run directory belongs to: open_run, the one place that decides it (the interface, Run, is
launch/run.py; the back-ends import only that)."""

from __future__ import annotations

from pathlib import Path

from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.launch.lifecycle import LocalRun
from kaiyuan_recipes.launch.run import Run
from kaiyuan_recipes.launch.run_records import check_own_folders
from kaiyuan_recipes.launch.slurm import SlurmRun
from kaiyuan_recipes.launch.ssh import MultiNodeRun


def open_run(run_dir: Path) -> Run:
    """The run in `run_dir`, with the back-end that started it: a Slurm job or multi-node when its state file is
    there (written at start), else a run on this node (also the answer for a directory nothing started in). A run
    whose state folder is not its own (a symlink to another run's) is refused: its verbs would act on the other."""
    layout = RunLayout(Path(run_dir))
    check_own_folders(layout)
    if layout.slurm_state.is_file():
        return SlurmRun(run_dir)
    if layout.multinode_state.is_file():
        return MultiNodeRun(run_dir)
    return LocalRun(run_dir)
