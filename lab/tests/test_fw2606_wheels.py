"""The fw2606 wheel set for the GPU host (lab/fw2606_wheels.py, `make gpu-wheels-fw2606`): the Bridge set with
each package constraints/fw2606.txt pins differently swapped, the rest kept; and journey.sh's --stack refusals."""

import importlib.util
import os
import shutil
import subprocess

from test_nemo2_wheels import ROOT, load

load("nemo2_wheels")
fw2606 = load("fw2606_wheels")


def test_the_packages_the_fw2606_lock_pins_differently_are_swapped_and_the_rest_kept():
    files = ["megatron_core-0.19.2-cp312-cp312-manylinux_2_28_x86_64.whl", "megatron_bridge-0.6.2-py3-none-any.whl",
             "transformers-5.12.1-py3-none-any.whl", "omegaconf-2.3.0-py3-none-any.whl",
             "datasets-5.2.0-py3-none-any.whl", "openai-2.54.0-py3-none-any.whl",
             "antlr4-python3-runtime-4.9.3.tar.gz"]
    pins = {"megatron-core": "0.18.0", "megatron-bridge": "0.5.0", "transformers": "5.8.1", "omegaconf": "2.3.1",
            "datasets": "5.2.0"}
    keep, fetch = fw2606.plan(files, pins)
    assert fetch == ["megatron-bridge==0.5.0", "megatron-core==0.18.0", "omegaconf==2.3.1", "transformers==5.8.1"]
    # at the lock's version, not in the lock (host-only clients), or not a wheel: kept
    assert keep == ["antlr4-python3-runtime-4.9.3.tar.gz", "datasets-5.2.0-py3-none-any.whl",
                    "openai-2.54.0-py3-none-any.whl"]


def test_the_real_lock_swaps_the_stack_the_matrix_row_names():
    from kaiyuan_recipes.doctor import TESTED_MATRIX

    row = next(s for s in TESTED_MATRIX if s.name == "fw2606-pypi")
    pins = fw2606.read_lock(fw2606.LOCK)
    files = [f"{dist.replace('-', '_')}-0.0.1-py3-none-any.whl" for dist in row.pins()]
    _, fetch = fw2606.plan(files, pins)
    assert sorted(fetch) == sorted(f"{d}=={v}" for d, v in row.pins().items())


def test_journey_refuses_an_unknown_stack_and_a_missing_wheel_set(tmp_path):
    """In a tree without .whl-fw2606 (the scripts copied), run the lab's way (lab/gpu.sh): both
    refusals come before anything is installed or run."""
    (tmp_path / "tests" / "gpu").mkdir(parents=True)
    (tmp_path / "lab").mkdir()
    for name in ("journey.sh", "flags.sh", "env.sh"):
        shutil.copy(ROOT / "tests" / "gpu" / name, tmp_path / "tests" / "gpu" / name)
    for name in ("gpu.sh", "gpu_host_env.sh"):
        shutil.copy(ROOT / "lab" / name, tmp_path / "lab" / name)

    def journey(*args):
        return subprocess.run(["bash", "lab/gpu.sh", "tests/gpu/journey.sh", "--out", str(tmp_path / "out"), *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60,
                              env=os.environ | {"KAIYUAN_LAB_WHEELS": ".whl"})

    bad = journey("--stack", "fw2506")
    assert bad.returncode == 2 and "--stack bridge|fw2606|te, not 'fw2506'" in bad.stderr, bad.stderr
    missing = journey("--stack", "fw2606", "--part", "foreground")
    assert missing.returncode == 2 and "needs .whl-fw2606 carried with the call" in missing.stderr, missing.stderr
    assert not (tmp_path / "out").exists()
    # --stack te where Transformer Engine does not import (the CPU host): refused before any step runs
    if importlib.util.find_spec("transformer_engine") is not None:
        return  # a TE host would run the real journey here
    no_te = journey("--stack", "te", "--part", "foreground")
    assert no_te.returncode == 2 and "transformer_engine.pytorch does not import" in no_te.stderr, no_te.stderr
    assert not (tmp_path / "out" / "journey_foreground.tgz").exists()
