"""`kaiyuan doctor` as a user runs it (real subprocesses): in .venv (a tested Bridge stack, exit 0, versions and the
`auto` plan as importlib.metadata and build_config give them), in .venv-nemo2 (no megatron-bridge: the tested NeMo 2
stack, exit 0, no traceback), in an interpreter without Megatron (exit 1, what to install); and an untested stack,
simulated by a matrix that excludes the installed versions (exit 1, the tested versions named)."""

import importlib.metadata
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kaiyuan_recipes import doctor
from kaiyuan_recipes.compat import WORKAROUNDS

REPO = Path(__file__).resolve().parents[1]
NEMO2_PYTHON = REPO / ".venv-nemo2" / "bin" / "python"


def run_doctor(python, *args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args, "-m", "kaiyuan_recipes.cli.main", "doctor", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=kwargs.pop("cwd", REPO), **kwargs)


def metadata_version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_doctor_in_the_bridge_env_reports_the_tested_stack_and_what_auto_picks():
    out = run_doctor(sys.executable)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert set(report) == {"python", "executable", "packages", "torch_cuda", "transformer_engine_importable",
                           "apex_importable", "gpus", "verdict", "tested_matrix", "compat", "auto", "features",
                           "exit_code"}
    assert report["packages"] == {d: metadata_version(d) for d in doctor.DISTRIBUTIONS}
    # make test runs this in .venv (bridge-pypi) and in .venv-fw2606 (fw2606-pypi): the row whose pins are installed
    rows = [s for s in doctor.TESTED_MATRIX if s.megatron_bridge
            and all(metadata_version(d) == v for d, v in s.pins().items())]
    assert len(rows) == 1, f"installed: {report['packages']}; no single Bridge row of TESTED_MATRIX has exactly these"
    assert report["verdict"] == {"kind": "megatron-bridge", "tested": True, "stack": rows[0].name, "mismatches": [],
                                 "message": f"in the tested matrix: {rows[0].name} ({rows[0].lock})"}
    assert report["exit_code"] == 0
    assert [m["name"] for m in report["tested_matrix"]] == [m.name for m in doctor.TESTED_MATRIX]
    assert [c["function"] for c in report["compat"]] == [w.function for w in WORKAROUNDS]

    from kaiyuan_recipes.training.config import build_config

    _cfg, run = build_config("gpt_smoke", ["kaiyuan.data=mock"])
    auto = report["auto"]
    assert auto["error"] is None
    assert auto["layer_spec"] == run.layer_spec
    assert auto["fastpath"] == run.fastpath.summary() and auto["sdpa_backend"] == run.fastpath.sdpa_backend
    assert auto["layer_spec_reason"].startswith("auto: ")
    compat = {c["function"]: c for c in report["compat"]}
    assert compat["apply_local_spec_settings"]["applies"] is (run.layer_spec != "transformer_engine")
    assert compat["separate_full_graph_pools"]["applies"] is run.fastpath.on("cuda_graph")
    assert compat["cpu_cuda_arch_list"]["applies"] is None  # the NeMo 2 environment's
    import torch

    assert compat["cpu_checkpoint_save"]["applies"] is (not torch.cuda.is_available())
    assert len(report["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    features = {f["name"]: f for f in report["features"]}
    assert set(features) == {"training", "serving", "nemo2", "multi-node"}
    assert features["training"]["ready"] is bool(report["gpus"])
    assert features["training"]["missing"] == ([] if report["gpus"] else ["a CUDA GPU visible to torch"])
    assert features["serving"]["ready"] is True  # the serve extra is in .venv
    assert features["nemo2"]["ready"] is False and "make env-nemo2" in features["nemo2"]["how"]


def test_an_untested_stack_exits_1_and_names_the_tested_versions():
    other = doctor.MatrixStack("nemo-fw-26.04", "constraints/x.txt", megatron_bridge="0.4.0", megatron_core="0.17.0",
                               transformers="5.3.0", torch=">=2.11.0a0,<2.12")
    report = doctor.diagnose(matrix=(other,), dry_build=False)
    assert report.exit_code == 1 and report.verdict.tested is False and report.verdict.stack == "nemo-fw-26.04"
    installed = report.packages
    assert f"megatron-bridge {installed['megatron-bridge']} (tested: 0.4.0)" in report.verdict.mismatches
    assert f"megatron-core {installed['megatron-core']} (tested: 0.17.0)" in report.verdict.mismatches
    assert f"torch {installed['torch']} (tested: >=2.11.0a0,<2.12)" in report.verdict.mismatches
    assert ("Tested: nemo-fw-26.04: megatron-bridge 0.4.0, megatron-core 0.17.0, transformers 5.3.0, "
            "torch >=2.11.0a0,<2.12 (constraints/x.txt).") in report.verdict.message

    from rich.console import Console

    from kaiyuan_recipes.cli.doctor import render

    console = Console(file=io.StringIO(), width=200)
    render(report, console)
    text = console.file.getvalue()
    assert "NOT TESTED" in text and "megatron-bridge 0.4.0, megatron-core 0.17.0" in text
    # A matching entry among others is enough; a local label (+cu130) does not count as a difference.
    here = doctor.MatrixStack("here", "x", megatron_bridge=installed["megatron-bridge"],
                              megatron_core=installed["megatron-core"], transformers=installed["transformers"],
                              torch=f"=={installed['torch']}")
    assert doctor.judge({**installed, "megatron-bridge": installed["megatron-bridge"] + "+nv"}, (other, here)).tested


@pytest.mark.parametrize("torch_version, tested", [("2.11.0+cu130", True), ("2.14.1", True),
                                                   ("2.12.0a0+nv26.06", False), ("2.13.0", False)])
def test_the_fw2606_row_holds_the_torch_versions_it_ran_on_and_no_others(torch_version, tested):
    """fw2606-pypi ran on the H200's torch 2.11 (the journey) and the CPU host's 2.14: the NeMo FW container's
    own 2.12.0a0, between them, was never run and is not taken for tested."""
    row = next(s for s in doctor.TESTED_MATRIX if s.name == "fw2606-pypi")
    versions = {"megatron-bridge": row.megatron_bridge, "megatron-core": row.megatron_core,
                "transformers": row.transformers, "nvidia-modelopt": row.nvidia_modelopt, "torch": torch_version}
    verdict = doctor.judge(versions)
    assert verdict.stack == "fw2606-pypi" and verdict.tested is tested
    assert verdict.mismatches == ([] if tested else [f"torch {torch_version} (tested: ==2.11.* or ==2.14.*)"])


def test_no_megatron_at_all_exits_1_and_says_what_to_install(tmp_path):
    """The base package alone (its own dependencies, no Megatron, no packaging): an interpreter without
    site-packages, given only those on its path."""
    for module in ("rich", "markdown_it", "mdurl", "pygments", "yaml", "omegaconf", "antlr4"):
        (tmp_path / module).symlink_to(Path(importlib.util.find_spec(module).origin).parent)
    (tmp_path / "kaiyuan_recipes").symlink_to(REPO / "kaiyuan_recipes")
    out = run_doctor(sys.executable, "-S", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    report = json.loads(out.stdout)
    assert report["verdict"]["kind"] is None and report["verdict"]["tested"] is False
    assert "megatron-bridge and megatron-core not installed" in report["verdict"]["message"]
    assert "make env" in report["verdict"]["message"] and "0.6.2" in report["verdict"]["message"]
    assert report["auto"] is None and set(report["packages"].values()) == {None}


def test_doctor_in_the_nemo2_env_without_megatron_bridge():
    if not NEMO2_PYTHON.exists():
        pytest.fail("the NeMo 2 environment is missing: `make env-nemo2` (make test creates it)")
    out = run_doctor(NEMO2_PYTHON)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    report = json.loads(out.stdout)
    probe = subprocess.run([str(NEMO2_PYTHON), "-c", "import importlib.metadata as m, json; print(json.dumps("
                            "{d.metadata['Name'].lower(): d.version for d in m.distributions()}))"],
                           capture_output=True, text=True, check=True)
    dists = {k.replace("_", "-"): v for k, v in json.loads(probe.stdout).items()}
    assert report["packages"] == {d: dists.get(d) for d in doctor.DISTRIBUTIONS}
    assert report["packages"]["megatron-bridge"] is None and report["packages"]["nemo-toolkit"] == "2.7.3"
    verdict = report["verdict"]
    assert verdict["kind"] == "nemo2" and verdict["tested"] and verdict["stack"] == "nemo2"
    assert "make env" in verdict["message"]  # where `kaiyuan train` lives
    assert report["auto"] is None  # no dry build without megatron-bridge
    compat = {c["function"]: c for c in report["compat"]}
    assert compat["install_lora_placeholder"]["applies"] is None
    assert compat["cpu_cuda_arch_list"]["applies"] is (not Path("/proc/driver/nvidia/version").exists())
    assert {f["name"]: f["ready"] for f in report["features"]}["nemo2"] is True
