"""The one run handle (kaiyuan_recipes.launch.run): open_run finds the back-end from what a real start left in the
run directory, and `kaiyuan status / stop / logs / stacks` go through the Run interface only, on a real detached
run (the 2-process torchrun job of test_lifecycle) and a real two-node run over conftest's sshd."""

import io
import json
import sys

import pytest
from test_lifecycle import job, wait_for  # noqa: F401  (job: the torchrun job fixture)
from test_multinode import CHECK, spec_for

from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.launch.backends import open_run
from kaiyuan_recipes.launch.lifecycle import LocalRun, RunStateError
from kaiyuan_recipes.launch.run import Run, RunError
from kaiyuan_recipes.launch.ssh import MultiNodeRun


def test_open_run_picks_the_back_end_from_the_run_dir(tmp_path, sshd):
    """multinode.json (written by a multi-node start) means the SSH back-end; anything else is this node's."""
    nothing = open_run(tmp_path / "never-started")
    assert type(nothing) is LocalRun
    with pytest.raises(RunStateError, match="no run state"):
        nothing.status()

    local_dir = tmp_path / "local"
    LocalRun(local_dir).start([sys.executable, "-c", "print('local done')"])
    assert type(open_run(local_dir)) is LocalRun
    assert wait_for(lambda: open_run(local_dir).status()["state"] == "finished")

    multi_dir = tmp_path / "multi"
    pids = MultiNodeRun(multi_dir, spec_for(sshd)).start(CHECK)
    assert sorted(pids) == [0, 1] and RunLayout(multi_dir).multinode_state.is_file()
    run = open_run(multi_dir)
    assert type(run) is MultiNodeRun and [n.host for n in run.spec.nodes] == ["127.0.0.1", "127.0.0.2"]
    assert isinstance(run, Run) and run.name == "multi"
    assert run.watch(poll=0.5)["state"] == "finished"
    status = open_run(multi_dir).status()
    assert status["state"] == "finished" and [n["rank"] for n in status["nodes"]] == [0, 1]
    out = io.StringIO()
    open_run(multi_dir).logs(out=out)
    text = out.getvalue()
    for rank, host in enumerate(("127.0.0.1", "127.0.0.2")):
        assert f"==> node {rank} ({host}) <==" in text and f"allreduce ok rank={rank} world=2" in text, text
    # the same directory started again on this node is this node's from then on
    LocalRun(multi_dir).start([sys.executable, "-c", "print('local again')"])
    assert not RunLayout(multi_dir).multinode_state.is_file() and type(open_run(multi_dir)) is LocalRun
    assert wait_for(lambda: open_run(multi_dir).status()["state"] == "finished")


def test_the_cli_verbs_drive_a_local_detached_run_through_the_handle(tmp_path, job, capsys):  # noqa: F811
    from kaiyuan_recipes.cli.main import main

    root = tmp_path / "runs"
    run = open_run(root / "exp")
    assert isinstance(run, LocalRun)
    (pid,) = run.start(job(run.layout.state, 100000), {"train_iters": 100000}).values()
    assert wait_for(lambda: run.status().get("iteration", 0) >= 3)
    with pytest.raises(RunError, match="already running"):
        open_run(root / "exp").start(job(run.layout.state, 10))
    with pytest.raises(RunError, match="handles SIGUSR1"):  # this job registers no stack dump
        open_run(root / "exp").stacks()

    capsys.readouterr()
    assert main(["status", "--run-root", str(root), "exp"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["run"] == "exp" and shown["state"] == "running" and shown["train_iters"] == 100000

    assert main(["stop", "--run-root", str(root), "exp", "--grace", "60"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"run", "sigkill_after_grace", "grace_s", "checkpoint_saved", "last_checkpoint"}
    assert result["checkpoint_saved"] and not result["sigkill_after_grace"] and run.stop_problems(result) == []
    assert run.stop_problems(result | {"sigkill_after_grace": True}) == [
        "did not exit within 60s of SIGTERM; sent SIGKILL"]

    assert main(["status", "--run-root", str(root)]) == 0  # every run under the root
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(s["run"], s["state"]) for s in listed] == [("exp", "stopped")]
    assert listed[0]["iteration"] == result["last_checkpoint"]
    assert main(["logs", "--run-root", str(root), "exp"]) == 0
    assert "saved checkpoint at" in capsys.readouterr().out
    with pytest.raises(RunError, match="not running"):
        run.stop(grace=1)
    assert not RunLayout(root / "exp").multinode_state.exists() and pid > 0
