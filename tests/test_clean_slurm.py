"""`kaiyuan data clean --slurm` against a real Slurm (tests/slurm_cluster.py: one CPU node on loopback; make
test-services installs it): datatrove's SlurmPipelineExecutor submits each stage as a job array depending on the one
before, finalize last; the output is the local executor's, byte for byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from slurm_cluster import PARTITION, SlurmCluster, missing_programs

from kaiyuan_recipes.data.clean.executors import SlurmOptions
from kaiyuan_recipes.data.clean.inputs import staging_dir_for
from kaiyuan_recipes.data.clean.run import CleanOptions, clean_directory
from kaiyuan_recipes.data.clean.synthetic import write_corpus

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "recipes" / "cleaning" / "web.yaml")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = missing_programs()
    if missing:
        pytest.fail(f"the Slurm tests need {', '.join(missing)}: install slurm-wlm slurmdbd munge mariadb-server "
                    "(make test-services does, as root on Debian)")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    # sbatch --export=ALL: the jobs find this cluster and this checkout's code through the environment
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "PYTHONPATH")}
    os.environ.update(cluster.env, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), saved["PYTHONPATH"]) if p))
    yield cluster
    for key, value in saved.items():
        os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    cluster.stop()


def test_slurm_run_matches_the_local_run_byte_for_byte(slurm, tmp_path):
    write_corpus(tmp_path / "raw", files=2, clean_per_file=10, exact_groups=3, near={0.95: 3, 0.85: 3},
                 low_per_step=1, seed=5)
    local = clean_directory(CleanOptions(tmp_path / "raw", tmp_path / "local", CONFIG, workers=1, sample_removed=5),
                            log=lambda *_: None)
    opts = SlurmOptions(partition=PARTITION, time="00:15:00", mem_per_cpu_gb=1, wait=True, wait_timeout_s=900)
    remote = clean_directory(CleanOptions(tmp_path / "raw", tmp_path / "slurm", CONFIG, sample_removed=5, slurm=opts),
                             log=lambda *_: None)
    assert remote["executor"] == "slurm" and local["executor"] == "local"
    assert remote["steps"] == local["steps"]
    files = sorted(p.name for p in (tmp_path / "local").glob("*.parquet"))
    assert files and files == sorted(p.name for p in (tmp_path / "slurm").glob("*.parquet"))
    for name in files:
        assert (tmp_path / "slurm" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    assert not staging_dir_for(tmp_path / "slurm").exists()
