"""A run name the file system cannot hold (past 255 bytes a directory name is ENAMETOOLONG) is refused as one line
naming it by every verb that takes one, not an OSError traceback."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("verb", ["status", "stop", "logs", "stacks"])
def test_a_run_name_too_long_for_a_directory_is_one_line(tmp_path, verb):
    name = "r" * 300
    out = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", verb, name, "--run-root", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr == f"kaiyuan: error: run name {'r' * 32!r}... is 300 characters long: at most 128\n"
    assert not list(tmp_path.iterdir())
