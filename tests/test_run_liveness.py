"""A run is one run (launch/membership.py): its processes die with their supervisor, a second start is refused
while anything of it is alive, status says what is alive (running / running — supervisor lost / lost), stop stops
what is alive, and a copy of a run directory is another run. Real processes: the 2-rank torchrun job of
test_lifecycle (gloo, a DataLoader worker per rank, a checkpoint on SIGTERM) and the foreground `kaiyuan train`
supervisor. Also the run-state lows: damaged records, a stop that must reach its SIGKILL, a failed foreground run."""

import json
import os
import shutil
import signal
import sys

import pytest
from test_lifecycle import _foreground, job, wait_for  # noqa: F401  (job: the torchrun job fixture)

from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.launch.lifecycle import LocalRun, RunStateError
from kaiyuan_recipes.launch.membership import members
from kaiyuan_recipes.processes import pid_running as _alive


def start(run_dir, argv, extra=None):
    return LocalRun(run_dir).start(argv, extra)[0]


def status(run_dir):
    return LocalRun(run_dir).status()


def steps_logged(run_dir):
    metrics = RunLayout(run_dir).metrics
    return metrics.read_text().count('"step"') if metrics.is_file() else 0


def test_a_killed_supervisor_takes_its_run_with_it(tmp_path, job):  # noqa: F811
    """kill -9 of the supervisor: torchrun gets SIGTERM from the kernel and ends its ranks; status never says
    running, then says lost with the iteration and checkpoint reached; stop says so and signals nothing; a new
    start is accepted once nothing of the old run is alive."""
    run = tmp_path / "runs" / "orphan"
    supervisor = start(run, job(run / "run_state", 100000), {"train_iters": 100000})
    assert wait_for(lambda: status(run).get("iteration", 0) >= 3)
    os.kill(supervisor, signal.SIGKILL)
    assert wait_for(lambda: not _alive(supervisor))  # the kill is delivered when the kernel next runs it
    seen = []
    assert wait_for(lambda: seen.append(status(run)["state"]) or seen[-1] == "lost", timeout=90), seen
    assert set(seen) <= {"running — supervisor lost", "lost"}
    assert not members(run / "run_state")
    lost = status(run)
    assert lost["phase"] == "lost" and lost["iteration"] >= 3 and "last_checkpoint" in lost
    with pytest.raises(RunStateError, match=r"is lost: nothing of it runs.*last iteration \d+.*nothing signalled"):
        LocalRun(run).stop(grace=5)
    steps = steps_logged(run)
    start(run, [sys.executable, "-c", "pass"])
    assert wait_for(lambda: status(run)["state"] == "finished")
    assert steps_logged(run) == steps  # nothing of the old run trained on


def test_ranks_that_outlive_their_supervisor_are_reported_refused_and_stopped(tmp_path, job):  # noqa: F811
    """The torchrun agent held stopped (SIGSTOP keeps the kernel's SIGTERM pending), the supervisor killed: the ranks
    train on. Status says `running — supervisor lost` and lists them, a second start is refused, and stop sends
    SIGTERM to the ranks itself (they save a checkpoint), then SIGKILLs the agent after the grace."""
    run = tmp_path / "runs" / "orphaned_ranks"
    supervisor = start(run, job(run / "run_state", 100000), {"train_iters": 100000})
    assert wait_for(lambda: status(run).get("iteration", 0) >= 3)
    agent = int((run / "run_state" / "child.pid").read_text())
    os.kill(agent, signal.SIGSTOP)
    os.kill(supervisor, signal.SIGKILL)
    assert wait_for(lambda: not _alive(supervisor))
    orphaned = status(run)
    assert orphaned["state"] == "running — supervisor lost" and agent in orphaned["alive"]
    assert len(orphaned["alive"]) >= 3  # the agent and its two ranks (and their DataLoader workers)
    before = steps_logged(run)
    assert wait_for(lambda: steps_logged(run) > before)  # still training
    with pytest.raises(RunStateError, match="already running .*are alive"):
        start(run, [sys.executable, "-c", "pass"])
    result = LocalRun(run).stop(grace=5)
    assert result["supervisor_lost"] and result["checkpoint_saved"] and result["sigkill_after_grace"]
    assert any("supervisor was gone" in p for p in LocalRun(run).stop_problems(result))
    assert not members(run / "run_state") and not _alive(agent)
    after = status(run)
    assert after["state"] == "stopped" and after["last_checkpoint"] == result["last_checkpoint"]


@pytest.mark.parametrize("how", ["foreground", "detached"])
def test_stop_of_a_copied_run_directory_never_touches_the_original(tmp_path, job, how):  # noqa: F811
    """`cp -r` of a live run's directory copies its records, its supervisor's identity and its token; the copy is
    still another run (another folder, another lock file): `kaiyuan stop COPY` signals nothing."""
    if how == "foreground":
        run, proc = _foreground(tmp_path, job, 100000)
    else:
        run, proc = tmp_path / "runs" / "orig", None
        start(run, job(run / "run_state", 100000), {"train_iters": 100000})
    assert wait_for(lambda: steps_logged(run) >= 2)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    with pytest.raises(RunStateError, match="is lost"):
        LocalRun(copy).stop(grace=5)
    assert status(copy)["state"] == "lost" and not members(copy / "run_state")
    before = steps_logged(run)
    assert wait_for(lambda: steps_logged(run) > before)
    assert status(run)["state"] == "running"
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    else:
        LocalRun(run).stop(grace=60)
    assert status(run)["state"] == "stopped"


def test_a_failed_foreground_run_shows_its_error(tmp_path, job):  # noqa: F811
    """`kaiyuan train` logs to logs/train-*.log, not the detached console log: status reads the log it recorded."""
    import subprocess

    run = tmp_path / "fg"
    script = tmp_path / "kaiyuan"
    script.write_text("import sys; from pathlib import Path; from kaiyuan_recipes.launch.lifecycle import "
                      "run_in_foreground\n"
                      "sys.exit(run_in_foreground(Path(sys.argv[2]), sys.argv[4:], Path(sys.argv[3])))\n")
    (run / "logs").mkdir(parents=True)
    failing = [sys.executable, "-c", "raise ValueError('lm loss is nan at iteration 7')"]
    env = {k: v for k, v in os.environ.items() if k != "KAIYUAN_SUPERVISED"}
    subprocess.run([sys.executable, str(script), "train", str(run), str(run / "logs" / "train-1.log"), *failing],
                   capture_output=True, text=True, env=env, timeout=120)
    shown = status(run)
    assert shown["state"] == "failed" and shown["error"] == "ValueError: lm loss is nan at iteration 7"
    assert shown["phase"] == "failed: ValueError: lm loss is nan at iteration 7"


DAMAGED = {"command.json": "{", "exit.json": '{"exit_code": "0"}', "supervisor.json": "[1]",
           "stop.json": '"stopped"', "phase.json": '{"phase": 3}', "token": "\xff\xfe"}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_damaged_record_names_its_file_and_hides_no_other_run(tmp_path, name, capsys):
    """`kaiyuan status`: the damaged run's line names the file (exit 1, no traceback), the good runs are listed."""
    from kaiyuan_recipes.cli.main import main

    root = tmp_path / "runs"
    for run_name in ("a_good", "b_bad", "c_good"):
        state = root / run_name / "run_state"
        state.mkdir(parents=True)
        (state / "exit.json").write_text(json.dumps({"exit_code": 0, "signal": None, "ended_at": 1.0}))
    (root / "b_bad" / "run_state" / name).write_bytes(DAMAGED[name].encode("utf-8", "surrogateescape")
                                                      if name != "token" else b"\xff\xfe")
    code = main(["status", "--run-root", str(root)])
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["run"] for line in lines] == ["a_good", "b_bad", "c_good"]
    assert lines[0]["state"] == lines[2]["state"] == "finished"
    if name == "token":  # an unreadable token makes the run's processes unknowable, never another run's
        assert code == 0 and lines[1]["state"] == "finished"
        return
    assert code == 1 and lines[1]["state"] == "unreadable" and name in lines[1]["error"]
    assert str(root / "b_bad" / "run_state" / name) in lines[1]["error"] and "Traceback" not in err
    assert main(["status", "--run-root", str(root), "b_bad"]) == 2
    assert name in capsys.readouterr().err


def test_stop_reaches_its_sigkill_whatever_the_metrics_hold(tmp_path, job):  # noqa: F811
    """Damaged metrics lines (a cut-short record, a non-object, bytes that are not UTF-8) must not end the stop
    between its SIGTERM and its SIGKILL."""
    run = tmp_path / "runs" / "stubborn"
    start(run, job(run / "run_state", 100000, ignore_term=True))
    assert wait_for(lambda: status(run).get("iteration", 0) >= 2)
    with open(RunLayout(run).metrics, "ab") as fh:
        fh.write(b'{"event": "checkpoint"}\n[1]\n{"event": "step", "iteration": "x"}\n\xff\xfe\n{"event": "ch')
    result = LocalRun(run).stop(grace=1)
    assert result["sigkill_after_grace"] and not members(run / "run_state")
    assert status(run)["state"] == "stopped"


def test_status_and_metrics_write_a_nan_loss_as_valid_json(tmp_path, capsys):
    """JSON has no NaN: a NaN loss is the string "nan" in metrics.jsonl and in `kaiyuan status` (strict parsers
    such as jq read both)."""
    from kaiyuan_recipes.cli.main import main

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))

    state = tmp_path / "runs" / "nan" / "run_state"
    state.mkdir(parents=True)
    (state / "exit.json").write_text(json.dumps({"exit_code": 1, "signal": None, "ended_at": 1.0}))
    (state / "metrics.jsonl").write_text(json.dumps({"event": "step", "iteration": 3, "loss": float("nan"),
                                                     "lr": 1e-4, "step_time_s": 1.0,
                                                     "tokens_per_s_per_gpu": float("inf")}) + "\n")
    main(["status", "--run-root", str(tmp_path / "runs"), "nan"])
    shown = strict(capsys.readouterr().out)
    assert shown["loss"] == "nan" and shown["tokens_per_s_per_gpu"] is None and shown["iteration"] == 3


def checkpoints_logged(run_dir):
    metrics = RunLayout(run_dir).metrics.read_text()
    return [json.loads(line)["iteration"] for line in metrics.splitlines() if '"checkpoint"' in line]


def test_a_rank_saves_when_its_supervisors_whole_process_group_is_killed(tmp_path, job):  # noqa: F811
    """`kill -9 -- -<pgid>` of a detached run as `kaiyuan start` makes it (the supervisor, launch.foreground and
    torchrun share one group; torchrun gives each rank a session of its own): each rank gets SIGTERM as its torchrun
    dies, prints "saving checkpoint" on its way to the save as Megatron-Bridge does, and saves. Its output goes to
    the run's log file, never to a pipe whose reader died with the group (EPIPE killed the rank at that print)."""
    from kaiyuan_recipes.launch import foreground

    run = tmp_path / "runs" / "group"
    supervisor = start(run, foreground.command(run, job(run / "run_state", 100000)), {"train_iters": 100000})
    assert wait_for(lambda: status(run).get("iteration", 0) >= 3, timeout=120)
    assert os.getpgid(supervisor) == supervisor
    os.killpg(supervisor, signal.SIGKILL)
    assert wait_for(lambda: not members(run / "run_state"), timeout=120)
    saved = checkpoints_logged(run)
    (log,) = RunLayout(run).logs.glob("train-*.log")
    assert saved and saved[-1] >= 3, log.read_text()[-3000:]
    assert f"saving checkpoint at iteration {saved[-1]}" in log.read_text()
    assert "BrokenPipeError" not in log.read_text()
    after = status(run)
    assert after["state"] == "lost" and after["last_checkpoint"] == saved[-1]


def test_a_second_stop_during_a_save_is_refused_and_never_shortens_the_grace(tmp_path, job):  # noqa: F811
    """The first stop's ranks are saving (held there until the test lets the save end): a second stop with a shorter
    grace says a stop is under way and signals nothing; the first then ends with its checkpoint, no SIGKILL."""
    import threading

    run = tmp_path / "runs" / "twice"
    gate = tmp_path / "save_may_end"
    start(run, job(run / "run_state", 100000, save_gate=gate), {"train_iters": 100000})
    assert wait_for(lambda: status(run).get("iteration", 0) >= 2, timeout=120)
    first = {}
    stopping = threading.Thread(target=lambda: first.update(LocalRun(run).stop(grace=300)))
    stopping.start()
    try:
        log = RunLayout(run).console_log
        assert wait_for(lambda: "saving checkpoint at iteration" in log.read_text(), timeout=120)
        with pytest.raises(RunStateError, match=r"a stop is already under way \(by pid \d+; it sends SIGKILL only "
                                                r"if the run is still alive at .*nothing signalled"):
            LocalRun(run).stop(grace=2)
        assert LocalRun(run).alive().supervisor  # nothing of the run was killed
    finally:
        gate.touch()
        stopping.join(timeout=300)
    assert first["checkpoint_saved"] and not first["sigkill_after_grace"], first
    assert status(run)["state"] == "stopped" and checkpoints_logged(run) == [first["last_checkpoint"]]


def test_status_and_stop_refuse_a_run_state_that_is_another_runs(tmp_path, capsys):
    """run_state a symlink to another run's: status and stop would act on that other run (start already refused)."""
    from kaiyuan_recipes.cli.main import main

    root = tmp_path / "runs"
    other = root / "other"
    start(other, [sys.executable, "-c", "import time; time.sleep(600)"])
    alias = root / "alias"
    alias.mkdir()
    (alias / "run_state").symlink_to(other / "run_state")
    try:
        for verb in (status, lambda run: LocalRun(run).stop(grace=1), lambda run: LocalRun(run).alive()):
            with pytest.raises(RunStateError, match=r"run_state: a symlink or outside .*not this run's own folder"):
                verb(alias)
        assert main(["stop", "--run-root", str(root), "alias", "--grace", "1"]) == 2
        assert "not this run's own folder" in capsys.readouterr().err
        assert main(["status", "--run-root", str(root)]) == 1
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(line["run"], line["state"]) for line in lines] == [("alias", "unreadable"), ("other", "running")]
    finally:
        result = LocalRun(other).stop(grace=60)
    assert not result["sigkill_after_grace"] and status(other)["state"] == "stopped"


def test_every_back_end_refuses_a_stop_while_another_is_under_way(tmp_path):
    """The one stop lock (membership.sole_stop) guards each back-end's stop before it asks or signals anything:
    refused with the stop under way's words (its pid, when it would SIGKILL); nothing of the run is touched."""
    from kaiyuan_recipes.launch.membership import StopUnderWay, sole_stop
    from kaiyuan_recipes.launch.slurm import SlurmRun
    from kaiyuan_recipes.launch.slurm_spec import SlurmSpec
    from kaiyuan_recipes.launch.ssh import MultiNodeRun, MultiNodeSpec, Node

    runs = {"local": LocalRun(tmp_path / "local"),
            "nodes": MultiNodeRun(tmp_path / "nodes", MultiNodeSpec(nodes=[Node("127.0.0.1", 2, "me")])),
            "slurm": SlurmRun(tmp_path / "slurm", SlurmSpec(partition="batch", tunnel="ssh://me@127.0.0.1:2",
                                                                cluster_run_dir="/lustre/me/runs/slurm"))}
    for name, run in runs.items():
        run.layout.state.mkdir(parents=True)
        run.layout.stop_request.write_text(json.dumps({"requested_at": 0.0, "grace_s": 300, "by_pid": 4242}))
        with sole_stop(run.layout, name):  # a stop under way (this process: flock is per open file)
            with pytest.raises(StopUnderWay, match=rf"run '{name}': a stop is already under way \(by pid 4242; it "
                                                   r"sends SIGKILL only if the run is still alive at \d\d:\d\d:\d\d"):
                run.stop(grace=1)
        assert json.loads(run.layout.stop_request.read_text())["by_pid"] == 4242  # nothing recorded over it
