"""A `kaiyuan data clean` driver killed outright (SIGKILL, as the OOM killer does) leaves no process behind:
datatrove's LocalPipelineExecutor forks a multiprocess Manager server that nobody shuts down then."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found.update(kids)
            todo += kids
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_no_process_outlives_a_killed_driver(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    text = "The council measured the old bridge in the spring, and the engineers said that it would last. " * 8
    for name in ("a", "b"):
        pq.write_table(pa.table({"text": [f"{name} {i} {text}" for i in range(300)]}), raw / f"{name}.parquet")
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "clean", "--input-dir",
                             str(raw), "--output-dir", str(tmp_path / "out"), "--config",
                             str(ROOT / "recipes" / "cleaning" / "web.yaml"), "--workers", "2"],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            kids |= descendants(proc.pid)
            if len(kids) >= 3:  # the Manager and two pool workers
                break
            time.sleep(0.2)
        assert len(kids) >= 3, f"the driver forked {sorted(kids)} before it ended ({proc.returncode})"
        kids |= descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(alive(k) for k in kids):
            time.sleep(0.2)
        left = [k for k in kids if alive(k)]
        assert not left, f"processes left behind by the killed driver: {left}"
    finally:
        for k in kids:
            if alive(k):
                os.kill(k, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
