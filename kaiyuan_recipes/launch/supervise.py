"""The detached supervisor of a run: `python -m kaiyuan_recipes.launch.supervise STATE_DIR -- ARGV…`.
It leads the run's process group, runs ARGV, and records the exit code (and signal) in
STATE_DIR/exit.json when it ends, so `kaiyuan status` can tell finished from failed from stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kaiyuan_recipes.atomic import write_text_atomic


def main(argv: list[str]) -> int:
    new_session = bool(argv) and argv[0] == "--new-session"  # remote nodes: lead our own process group
    argv = argv[1:] if new_session else argv
    if "--" not in argv or argv.index("--") != 1:
        raise SystemExit("usage: python -m kaiyuan_recipes.launch.supervise [--new-session] STATE_DIR -- ARGV...")
    if new_session:
        os.setsid()
    state_dir, command = Path(argv[0]), argv[2:]
    state_dir.mkdir(parents=True, exist_ok=True)
    # SIGTERM to the group must reach the training processes and leave us alive to record the end.
    # A Python handler (not SIG_IGN) is reset to the default in the child at exec.
    signal.signal(signal.SIGTERM, lambda *_: None)
    child = subprocess.Popen(command)
    (state_dir / "child.pid").write_text(str(child.pid))
    code = child.wait()
    record = {"exit_code": code, "signal": -code if code < 0 else None, "ended_at": time.time()}
    write_text_atomic(state_dir / "exit.json", json.dumps(record))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
