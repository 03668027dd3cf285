"""lab/queue.sh on this CPU host: jobs run detached one after the other in a copy of the tree, each with its own
OUT; a failing job does not stop the next; wait returns when the queue is done or its time is up, and packs what
the jobs wrote into $OUT/queue.tgz."""

import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def queue(tree, qdir, out, *args):
    env = {**os.environ, "QUEUE_DIR": str(qdir), "OUT": str(out)}
    return subprocess.run(["bash", str(REPO / "lab/queue.sh"), *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120)


def test_jobs_run_in_order_in_a_copy_of_the_tree_and_come_back_packed(tmp_path):
    tree, qdir, out = tmp_path / "tree", tmp_path / "q", tmp_path / "out"
    tree.mkdir()
    (tree / "script.sh").write_text('echo "from the tree copy: $PWD" > "$OUT/a.txt"\n')
    r = queue(tree, qdir, out, "start", "--", "bash script.sh", "echo failing; exit 3",
              'sleep 1; cat "$OUT/../00/a.txt" > "$OUT/b.txt"')
    assert r.returncode == 0, r.stderr
    (tree / "script.sh").write_text("exit 9\n")  # the next call's tree: the queue runs its own copy
    r = queue(tree, qdir, out, "wait", "--max-s", "60")
    assert r.returncode == 0 and "queue: done" in r.stdout, r.stdout + r.stderr
    states = [line.split()[:3] for line in r.stdout.splitlines() if line[:2].isdigit()]
    assert states == [["00", "done", "rc=0"], ["01", "done", "rc=3"], ["02", "done", "rc=0"]]
    with tarfile.open(out / "queue.tgz") as tgz:
        names = set(tgz.getnames())
        assert {"out/00/a.txt", "out/01/job.log", "out/02/b.txt", "jobs.jsonl"} <= names
        assert tgz.extractfile("out/01/job.log").read() == b"failing\n"
        assert tgz.extractfile("out/02/b.txt").read().decode().startswith(f"from the tree copy: {qdir}/tree")
    ends = [json.loads(line) for line in (out / "queue_jobs.jsonl").read_text().splitlines()]
    assert [e["rc"] for e in ends if "rc" in e] == [0, 3, 0]


def test_wait_returns_at_its_limit_with_the_running_jobs_log_and_a_second_start_is_refused(tmp_path):
    tree, qdir, out = tmp_path / "tree", tmp_path / "q", tmp_path / "out"
    tree.mkdir()
    r = queue(tree, qdir, out, "start", "--", "echo step one; sleep 30")
    assert r.returncode == 0, r.stderr
    try:
        t0 = time.monotonic()
        r = queue(tree, qdir, out, "wait", "--max-s", "2")
        assert time.monotonic() - t0 < 20
        assert "queue: still running" in r.stdout and "step one" in r.stdout, r.stdout
        assert " running " in r.stdout.splitlines()[0]
        r = queue(tree, qdir, out, "start", "--", "true")
        assert r.returncode == 2 and "a queue runs already" in r.stderr
    finally:
        assert "queue: stopped" in queue(tree, qdir, out, "stop").stdout
    r = queue(tree, qdir, out, "wait", "--max-s", "5")
    assert "the runner is gone before the end" in r.stdout and r.returncode == 1
