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
    """KAIYUAN_REVISION if set; else HEAD, or for a tree that differs from HEAD's, `HEAD+tree T`: T is the tree id
    the working tree (untracked, not ignored files too) would be committed as, which names the commit once it is
    made (`resolve_tree`). The GPU host's copy of the working tree carries a .git at the last landed commit, so
    HEAD alone would name code that did not run."""
    if os.environ.get("KAIYUAN_REVISION"):
        return os.environ["KAIYUAN_REVISION"]
    try:
        head = _git("rev-parse", "--short", "HEAD")
        if not _git("status", "--porcelain"):
            return head
        tree = _working_tree_id()
        return head if tree == _git("rev-parse", "HEAD^{tree}") else f"{head}+tree {tree[:12]}"
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return "unknown"


def _working_tree_id() -> str:
    """The tree id of the working tree, from a scratch index and a scratch object store: the repository's own index
    and objects are left as they are."""
    objects, index = _git("rev-parse", "--path-format=absolute", "--git-path", "objects", "--git-path",
                          "index").splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index"),
               "GIT_OBJECT_DIRECTORY": str(Path(tmp) / "objects"), "GIT_ALTERNATE_OBJECT_DIRECTORIES": objects}
        (Path(tmp) / "objects").mkdir()  # git takes a repository without its object store for none
        if Path(index).exists():
            shutil.copyfile(index, env["GIT_INDEX_FILE"])
        _git("add", "-A", env=env)
        return _git("write-tree", env=env)


def resolve_tree(tree: str) -> str | None:
    """The commit (short) whose tree is `tree` (a prefix of 7 or more), of all commits here; None if none is."""
    if len(tree) < 7:
        raise ValueError(f"tree id {tree!r}: give 7 or more of its hex digits")
    try:
        lines = _git("log", "--all", "--format=%h %T").splitlines()
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    return next((commit for commit, commit_tree in (line.split() for line in lines) if commit_tree.startswith(tree)),
                None)


def _git(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, env=env,
                          timeout=60).stdout.strip()


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
