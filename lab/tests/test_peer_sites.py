"""tests/gpu/peer_throughput.sh the lab's way (lab/gpu.sh, which installs the peer sets with lab/gpu_host_env.sh's
lab_peer_sites and hands their folders to the script as --peer-sites), with
train_throughput.py stubbed: an install-only run installs each carried peer set into its own folder and fails
naming a set that is neither carried nor installed; a measuring run then hands the installed folders to the rows
and goes on without the missing one (its rows record their import error; the others are measured)."""

import shutil
import subprocess
from pathlib import Path

from test_nemo2_wheels import ROOT
from test_slim_wheels import make_wheel

STUB = '''import sys
from pathlib import Path
out = Path(sys.argv[sys.argv.index("--out") + 1])
out.with_name("args.txt").write_text("\\n".join(sys.argv[1:]))
'''


def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for rel in ("tests/gpu/peer_throughput.sh", "tests/gpu/flags.sh", "tests/gpu/env.sh", "lab/gpu.sh",
                "lab/gpu_host_env.sh"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "train_throughput.py").write_text(STUB)
    (root / ".whl-titan").mkdir()
    make_wheel(root / ".whl-titan", "titanstub", "1.0", {"titanstub/__init__.py": b""})
    return root


def run(root: Path, peers_root: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "KAIYUAN_LAB_WHEELS": ".whl", "lab_peer_root": str(peers_root)}
    return subprocess.run(["bash", "lab/gpu.sh", "tests/gpu/peer_throughput.sh", "--out", str(out), *flags], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_missing_peer_set_fails_the_install_only_run_and_not_the_rows(tmp_path):
    root, peers = tree(tmp_path), tmp_path / "peers"
    proc = run(root, peers, tmp_path / "install", "--install-only", "--peers", "titan olmo")
    assert proc.returncode == 2 and (tmp_path / "install" / "done").read_text().strip() == "2"
    assert f"no {peers}/site-olmo: carry .whl-olmo (make -C lab olmo-wheels)" in proc.stdout
    assert (peers / "site-titan" / "titanstub" / "__init__.py").exists()

    shutil.rmtree(root / ".whl-titan")  # a later call without the set: the installed folder serves
    proc = run(root, peers, tmp_path / "rows", "--impls", "ours torchtitan olmo_core", "--peers", "titan olmo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "rows" / "done").read_text().strip() == "0"
    args = (tmp_path / "rows" / "args.txt").read_text().splitlines()
    assert args[args.index("--impls") + 1:args.index("--steps")] == ["ours", "torchtitan", "olmo_core"]
    assert args[args.index("--peer-pythonpath") + 1] == f"{peers}/site-titan"
    assert f"{peers}/site-olmo" not in args
