"""Make the source tree's entry points visible without installing the package (the GPU host is offline and runs
the package from the source tree): a minimal kaiyuan_recipes dist-info, written from pyproject.toml into DEST,
which goes on PYTHONPATH beside the tree. NeMo-Run finds `--factory kaiyuan_gpt_smoke` through its `nemo_run.cli`
group; importlib.metadata needs only METADATA and entry_points.txt. Standard library only.

usage: python3 lab/entry_points.py DEST"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_dist_info(dest: Path, pyproject: Path = ROOT / "pyproject.toml") -> Path:
    project = tomllib.loads(pyproject.read_text())["project"]
    dist = project["name"].replace("-", "_")
    for old in dest.glob(f"{dist}-*.dist-info"):  # an older version's, which would be found as well
        shutil.rmtree(old)
    info = dest / f"{dist}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = dict(project.get("entry-points", {}))
    if project.get("scripts"):
        groups["console_scripts"] = project["scripts"]
    text = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                   for group, eps in groups.items())
    (info / "entry_points.txt").write_text(text)
    return info


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(write_dist_info(Path(sys.argv[1])))
