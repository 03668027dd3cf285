"""lab/te_env.sh's walk over the device calls, on this CPU host: --dry-run stages for real (stage.py) and prints
the installs and the build; the build's states are the markers the detached job leaves in --build-dir."""

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "lab/te_env.sh"


@pytest.fixture
def te(tmp_path):
    """A stand-in TE set (random bytes under the real file names) packed in 3 parts, and a runner for one call."""
    rng = random.Random(7)
    src = tmp_path / "whl-te"
    src.mkdir()
    for name, size in {"transformer_engine_cu13-2.19.0-py3-none-manylinux_2_28_x86_64.whl": 700_000,
                       "transformer_engine-2.19.0-py3-none-any.whl": 20_000,
                       "transformer_engine_torch-2.19.0.tar.gz": 50_000}.items():
        (src / name).write_bytes(rng.randbytes(size))
    host = tmp_path / "host"
    host.mkdir()
    r = subprocess.run([sys.executable, str(REPO / "lab/stage.py"), "pack", "te", str(src), "--part-bytes",
                        "300000"], cwd=host, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    dirs = {k: tmp_path / k for k in ("call", "stage", "site", "build", "out")}

    def call(*parts, dry_run=True, extra=()):
        shutil.rmtree(dirs["call"], ignore_errors=True)
        (dirs["call"] / "te").mkdir(parents=True)
        for name in (["manifest.json", *parts] if parts else []):
            shutil.copy(host / ".stage" / "te" / name, dirs["call"] / "te" / name)
        args = ["bash", SCRIPT, "--stage-src", dirs["call"], "--stage-root", dirs["stage"], "--site", dirs["site"],
                "--build-dir", dirs["build"], "--out", dirs["out"], "--python", sys.executable, *extra]
        r = subprocess.run([str(a) for a in args] + (["--dry-run"] if dry_run else []), cwd=REPO,
                           capture_output=True, text=True)
        r.report = json.loads((dirs["out"] / "te_env.json").read_text())
        return r

    call.dirs = dirs
    return call


def test_cold_machine_says_staging_starts_again(te):
    r = te()
    assert r.returncode == 4, r.stdout + r.stderr
    assert "COLD MACHINE" in r.stdout and "nothing built" in r.stdout and "from call 1" in r.stdout
    assert r.report["state"] == "cold"


def test_partial_then_complete_then_build_states(te):
    r = te("part-00")
    assert r.returncode == 3 and "more parts needed" in r.stdout and "COLD" not in r.stdout
    assert r.report["state"] == "staging" and r.report["stage"]["missing"] == ["part-01", "part-02"]
    assert te("part-01").returncode == 3
    r = te("part-02")  # the last part: install, then the build starts (printed only, in a dry run)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "complete" in r.stdout
    assert f"pip install -q --no-index --no-deps --no-compile --no-cache-dir --target {te.dirs['site']}" in r.stdout
    assert "would start detached: setsid bash" in r.stdout and r.report["state"] == "building"
    script = (te.dirs["build"] / "build.sh").read_text()
    for piece in ("NVTE_PYTORCH_FORCE_BUILD=TRUE", "MAX_JOBS=16", "NVTE_NO_LOCAL_VERSION=1",
                  "pip wheel -v --no-build-isolation --no-deps --no-index", "transformer_engine_torch-2.19.0.tar.gz",
                  'done.tmp"; mv', "import torch, transformer_engine as te, transformer_engine.pytorch"):
        assert piece in script, piece
    # A later call carrying nothing: the build's progress, from its log.
    (te.dirs["build"] / "build.log").write_text("+ pip wheel\n  [7/42] c++ -c extensions/gemm.cpp\n")
    r = te()
    assert r.returncode == 5 and "build running for" in r.stdout and "ninja step [7/42]" in r.stdout
    assert "would start detached" not in r.stdout  # started once only
    # The detached job exits 1: the failure and the log's tail; --rebuild starts again.
    (te.dirs["build"] / "done").write_text("1\n")
    r = te()
    assert r.returncode == 1 and "the build exited 1" in r.stdout and "[7/42]" in r.stdout
    assert r.report == r.report | {"state": "failed", "build_exit": 1}
    r = te(extra=["--rebuild"])
    assert r.returncode == 5 and "would start detached" in r.stdout
    # It exits 0: ready (the import is not tried in a dry run).
    (te.dirs["build"] / "done").write_text("0\n")
    r = te()
    assert r.returncode == 0 and "build finished" in r.stdout and r.report["state"] == "ready"


def test_fresh_machine_mid_staging(te):
    r = te("part-01")
    assert r.returncode == 3 and "FRESH MACHINE" in r.stdout and "Send part-00 again" in r.stdout


def test_a_build_gone_without_exit_code_is_a_failure(te):
    for part in ("part-00", "part-01", "part-02"):
        te(part)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (te.dirs["build"] / "pid").write_text(f"{gone.pid}\n")
    r = te()
    assert r.returncode == 1 and "gone without an exit code" in r.stdout


def test_machine_released_after_the_build(te):
    for part in ("part-00", "part-01", "part-02"):
        te(part)
    (te.dirs["build"] / "done").write_text("0\n")
    assert te().returncode == 0
    for d in ("stage", "build", "site"):  # a fresh machine: /tmp is empty
        shutil.rmtree(te.dirs[d], ignore_errors=True)
    r = te()
    assert r.returncode == 4 and "COLD MACHINE" in r.stdout


def test_a_finished_build_is_reused_in_the_same_lease(te):
    """Not a dry run: the marker of an earlier build and an importable package are all a later call needs."""
    for part in ("part-00", "part-01", "part-02"):
        te(part)
    state = json.loads((te.dirs["stage"] / "te" / "state.json").read_text())
    pkg = te.dirs["site"] / "transformer_engine"
    (pkg / "pytorch").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '2.19.0'\n")
    (pkg / "pytorch" / "__init__.py").write_text("")
    (te.dirs["site"] / ".te-ready").write_text(f"{state['manifest_sha256']} 2.19.0\n")
    started = time.time()
    r = te(dry_run=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "built earlier in this lease" in r.stdout and "transformer_engine 2.19.0 imports" in r.stdout
    assert r.report["te_version"] == "2.19.0" and "build started" not in r.stdout
    assert time.time() - started < 30
    # A broken install is reported, not taken for a ready one.
    (pkg / "pytorch" / "__init__.py").write_text("raise ImportError('libtransformer_engine.so: cannot open')\n")
    r = te(dry_run=False)
    assert r.returncode == 1 and "FAILED: import transformer_engine.pytorch" in r.stdout
    assert "cannot open" in r.stdout and r.report["state"] == "failed"


@pytest.mark.skipif(os.name != "posix", reason="bash script")
def test_help_lists_the_flags():
    r = subprocess.run(["bash", SCRIPT, "--help"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0
    for flag in ("--stage-src", "--stage-root", "--site", "--build-dir", "--jobs", "--wait", "--rebuild", "--dry-run"):
        assert flag in r.stdout


def test_te_proof_reports_each_part_and_is_not_ok_when_one_is_missing(tmp_path):
    """tests/gpu/te_proof.sh on this CPU host (a TE site that only says ready): the dry run and doctor run for real,
    an unknown part stops the script, and te_proof.json records what ran, the layer spec and the compat rows, and
    all_ok false because a part asked for did not end with 0."""
    site, out = tmp_path / "site-te", tmp_path / "out"
    site.mkdir()
    (site / ".te-ready").write_text("set 2.19.0\n")
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", "tests/gpu/te_proof.sh", "--te-site", str(site), "--parts", "dry-run bogus",
                        "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads((out / "te_proof.json").read_text())
    assert report["parts_asked"] == ["dry-run", "bogus"] and not report["all_ok"]
    assert [(p["part"], p["exit"]) for p in report["parts"]] == [("dry-run", 0)]
    assert report["te_version"] == "2.19.0" and report["command"].startswith("bash tests/gpu/te_proof.sh --te-site")
    assert report["dry_run"]["layer_spec"].startswith("local")  # no TE here
    assert "wgrad_fusion_without_apex" in report["dry_run"] and "apply_local_spec_settings" in report["dry_run"]
