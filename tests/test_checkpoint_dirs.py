"""Which save of a run each command reads is decided in one place (config/run_layout.py): `kaiyuan ckpt` and
average (resolve_checkpoint), export and serve (newest_iteration_dir) and status (last_checkpoint) pick the same
iter_* directory: the one the tracker file names, else the highest-numbered by iteration (not by name), never a
symbolic link."""

from pathlib import Path

import pytest

from kaiyuan_recipes.ckpt.store import CheckpointError, resolve_checkpoint
from kaiyuan_recipes.config.run_layout import LATEST_ITERATION_FILE, RunLayout
from kaiyuan_recipes.export.megatron_to_hf import newest_iteration_dir
from kaiyuan_recipes.launch.run_records import last_checkpoint


def run_with_saves(tmp_path: Path, *names: str, tracker: str | None = None) -> Path:
    run = tmp_path / "run"
    for name in names:
        (RunLayout(run).checkpoints / name).mkdir(parents=True)
        (RunLayout(run).checkpoints / name / ".metadata").write_bytes(b"")
    if tracker is not None:
        (RunLayout(run).checkpoints / LATEST_ITERATION_FILE).write_text(tracker)
    return run


def chosen(run: Path) -> tuple[str, str, int | None]:
    return (resolve_checkpoint(run).name, newest_iteration_dir(run).name,
            last_checkpoint(RunLayout(run), [{"event": "checkpoint", "iteration": 1}]))


def test_the_tracker_names_the_save_every_command_reads(tmp_path):
    run = run_with_saves(tmp_path, "iter_0000009", "iter_0000010", tracker="9")
    assert chosen(run) == ("iter_0000009", "iter_0000009", 9)


def test_without_a_tracker_the_highest_iteration_wins_past_seven_digits(tmp_path):
    run = run_with_saves(tmp_path, "iter_9999999", "iter_10000000")
    assert chosen(run)[:2] == ("iter_10000000", "iter_10000000")


def test_a_linked_save_is_not_the_runs(tmp_path):
    run = run_with_saves(tmp_path, "iter_0000002")
    elsewhere = run_with_saves(tmp_path / "other", "iter_0000009")
    (RunLayout(run).checkpoints / "iter_0000009").symlink_to(RunLayout(elsewhere).checkpoints / "iter_0000009")
    assert chosen(run)[:2] == ("iter_0000002", "iter_0000002")


def test_a_damaged_tracker_is_named_by_every_command(tmp_path):
    run = run_with_saves(tmp_path, "iter_0000002", tracker="9" * 40)
    for pick in (resolve_checkpoint, newest_iteration_dir, lambda r: last_checkpoint(RunLayout(r), [])):
        with pytest.raises(CheckpointError, match="a number of 40 digits, not an iteration"):
            pick(run)


def test_a_run_without_saves_is_refused_naming_its_checkpoints_folder(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="checkpoints: no iter_"):
        resolve_checkpoint(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="checkpoints: no iter_"):
        newest_iteration_dir(tmp_path / "run")
