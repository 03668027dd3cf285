"""Provenance for every committed result: the command, the git revision, the host, the date; and an
atomic JSON writer (temp name, then rename)."""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kaiyuan_recipes.atomic import write_text_atomic


def revision() -> str:
    if os.environ.get("KAIYUAN_REVISION"):
        return os.environ["KAIYUAN_REVISION"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                 text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    # A tree that differs from HEAD is not HEAD: the GPU host's copy of the working tree has a .git at the last
    # landed commit, whatever was committed since (set KAIYUAN_REVISION there).
    return f"{head}+changes" if changed else head


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
