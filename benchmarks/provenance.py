"""Provenance for every committed result: the command, the git revision, the host, the date; and an
atomic JSON writer (temp name, then rename)."""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kaiyuan_recipes.atomic import write_text_atomic


def revision() -> str:
    """KAIYUAN_REVISION if set; else HEAD, or for a tree that differs from HEAD, `HEAD+tree T`: T is the tree id
    the working tree (untracked, not ignored files too) would be committed as, which names the commit once it is
    made (`resolve_tree`). The GPU host's copy of the working tree carries a .git at the last landed commit, so
    HEAD alone would name code that did not run."""
    if os.environ.get("KAIYUAN_REVISION"):
        return os.environ["KAIYUAN_REVISION"]
    try:
        head = _git("rev-parse", "--short", "HEAD")
        if not _git("status", "--porcelain"):
            return head
        with tempfile.TemporaryDirectory() as tmp:  # a scratch index: the repo's own index is left as it is
            env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
            index = Path(_git("rev-parse", "--git-path", "index"))
            if index.exists():
                shutil.copyfile(index, env["GIT_INDEX_FILE"])
            _git("add", "-A", env=env)
            return f"{head}+tree {_git('write-tree', env=env)[:12]}"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def resolve_tree(tree: str) -> str | None:
    """The commit (short) whose tree is `tree` (a prefix), of all commits here; None if none is."""
    for line in _git("log", "--all", "--format=%h %T").splitlines():
        commit, commit_tree = line.split()
        if commit_tree.startswith(tree):
            return commit
    return None


def _git(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, env=env).stdout.strip()


def host() -> dict[str, Any]:
    info: dict[str, Any] = {"hostname": socket.gethostname(), "platform": platform.platform(),
                            "cpus": os.cpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info |= {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count()}
        else:
            info["gpu"] = None
    except ImportError:
        info["gpu"] = None
    return info


def this_command(script: str | None = None) -> str:
    """How this script was invoked (as `script`, when given: the path to name instead of argv[0]), as a shell
    would take it back (an argument with spaces stays one)."""
    return shlex.join(["python", script or sys.argv[0], *sys.argv[1:]])


def provenance(command: str) -> dict[str, Any]:
    return {"command": command, "revision": revision(), "host": host(), "date": time.strftime("%Y-%m-%d")}


def write_json(path: Path, data: Any) -> Path:
    return write_text_atomic(Path(path), json.dumps(data, indent=2) + "\n")
