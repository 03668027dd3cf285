"""lab/slim_wheels.py: pulp's wheel rewritten without its CBC binaries installs and imports with pip's --no-index
--no-deps --target (as lab/gpu_host_env.sh installs the set), its RECORD names no file it lacks, other wheels are
untouched, and a second run changes nothing."""

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from test_nemo2_wheels import ROOT


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    dist = f"{name}-{version}.dist-info"
    files = {**files, f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={hashlib.sha256(data).hexdigest()},{len(data)}\n" for path, data in files.items())
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{dist}/RECORD", record + f"{dist}/RECORD,,\n")
    return wheel


def test_pulp_without_its_solver_binaries_installs_and_imports(tmp_path):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    pulp = make_wheel(wheels, "pulp", "3.3.2", {"pulp/__init__.py": b"VALUE = 7\n",
                                                 "pulp/solverdir/__init__.py": b"",
                                                 "pulp/solverdir/cbc/linux/64/cbc": b"\x7fELF" + b"0" * 4096})
    other = make_wheel(wheels, "other", "1.0", {"other/__init__.py": b"", "other/solverdir/cbc/x": b"kept"})
    other_bytes = other.read_bytes()

    def run() -> str:
        return subprocess.run([sys.executable, str(ROOT / "lab" / "slim_wheels.py"), str(wheels)], check=True,
                              capture_output=True, text=True).stdout

    assert "pulp-3.3.2-py3-none-any.whl: 0.0 MB left out" in run()
    names = zipfile.ZipFile(pulp).namelist()
    assert "pulp/solverdir/__init__.py" in names and not any(n.startswith("pulp/solverdir/cbc/") for n in names)
    record = zipfile.ZipFile(pulp).read("pulp-3.3.2.dist-info/RECORD").decode()
    assert "cbc" not in record and "pulp/__init__.py,sha256=" in record
    assert other.read_bytes() == other_bytes
    slimmed = pulp.read_bytes()
    run()
    assert pulp.read_bytes() == slimmed and not list(wheels.glob("*.tmp"))

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), str(pulp)], check=True)
    out = subprocess.run([sys.executable, "-c", "import pulp; print(pulp.VALUE)"], cwd=tmp_path, check=True,
                         capture_output=True, text=True, env={"PYTHONPATH": str(site)}).stdout
    assert out.strip() == "7" and not (site / "pulp" / "solverdir" / "cbc").exists()
