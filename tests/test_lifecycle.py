"""start / stop / status / logs with real processes: a 2-process torchrun (gloo) job that
all-reduces every step, reads from a DataLoader worker, writes metrics.jsonl like the training callback,
and on SIGTERM records a checkpoint and exits — the contract Megatron's exit-signal handler keeps. Like a real rank it
joins the run (launch/membership.py: SIGTERM when its torchrun dies) and prints before it saves, as Megatron-Bridge's
save_checkpoint does."""

import os
import sys
import textwrap
import time

import pytest

from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.launch.lifecycle import LocalRun, RunStateError
from kaiyuan_recipes.launch.supervise import is_torchrun, training_ranks
from kaiyuan_recipes.processes import pid_running as _alive


# The local back-end's verbs, as `kaiyuan start / stop / status / logs` call them (through launch/run.py's Run).
def start(run_dir, argv, extra=None):
    return LocalRun(run_dir).start(argv, extra)[0]


def stop(run_dir, grace=300.0):
    return LocalRun(run_dir).stop(grace=grace)


def status(run_dir):
    return LocalRun(run_dir).status()


def follow_log(run_dir, follow, out):
    LocalRun(run_dir).logs(follow=follow, out=out)


def running_pid(run_dir):
    return LocalRun(run_dir).running_pid()


PROGRAM = textwrap.dedent('''
    import json, os, signal, sys, time
    import torch, torch.distributed as dist
    from kaiyuan_recipes.launch.membership import join_run_from_env
    state, steps, ignore_term, save_gate = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
    join_run_from_env()
    stop = []
    signal.signal(signal.SIGTERM, (lambda *_: None) if ignore_term else (lambda *_: stop.append(1)))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    def write(rec):
        if rank == world - 1:
            with open(os.path.join(state, "metrics.jsonl"), "a") as fh:
                fh.write(json.dumps(rec) + "\\n")
    write({"event": "train_start", "iteration": 0})
    # a DataLoader worker, as Megatron's ranks have: a SIGTERM reaching it would fail the rank
    batches = iter(torch.utils.data.DataLoader(list(range(10**6)), num_workers=1, persistent_workers=True))
    for it in range(1, steps + 1):
        next(batches)
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        assert t.item() == world * (world + 1) / 2
        time.sleep(0.05)
        write({"event": "step", "iteration": it, "loss": 10.0 / it, "lr": 1e-3, "step_time_s": 0.05,
               "tokens_per_s_per_gpu": 1000.0})
        flag = torch.tensor([float(bool(stop))])
        dist.all_reduce(flag)  # every rank agrees to stop at the same step, as Megatron's handler does
        if flag.item() > 0:
            print(f"saving checkpoint at iteration {it}", flush=True)
            time.sleep(1.0)  # saving; with a gate, until the test opens it
            deadline = time.monotonic() + 300
            while save_gate and not os.path.exists(save_gate) and time.monotonic() < deadline:
                time.sleep(0.05)
            write({"event": "checkpoint", "iteration": it})
            print(f"saved checkpoint at {it}; exiting", flush=True)
            break
    else:
        print("done", flush=True)
    # gloo aborts at interpreter exit if its process group is left open ("terminate called ...")
    dist.barrier()
    dist.destroy_process_group()
''')


@pytest.fixture
def job(tmp_path):
    prog = tmp_path / "job.py"
    prog.write_text(PROGRAM)

    def argv(state_dir, steps, ignore_term=False, save_gate=""):
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone",
                str(prog), str(state_dir), str(steps), "1" if ignore_term else "0", str(save_gate)]

    return argv


def wait_for(predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


# `kaiyuan train` runs torchrun below itself with its output piped: the stop must find the ranks there too.
PIPING_LAUNCHER = ("import subprocess, sys\n"
                   "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)\n"
                   "for line in p.stdout: print(line, end='', flush=True)\n"
                   "sys.exit(p.wait())")


@pytest.mark.parametrize("launcher", ["torchrun", "launcher_then_torchrun"])
def test_start_status_stop_with_checkpoint(tmp_path, job, launcher):
    run = tmp_path / "runs" / "exp1"
    argv = job(run / "run_state", 100000)
    if launcher == "launcher_then_torchrun":
        argv = [sys.executable, "-c", PIPING_LAUNCHER, *argv]
    start(run, argv, {"train_iters": 100000})
    assert wait_for(lambda: status(run).get("iteration", 0) >= 5)
    s = status(run)
    assert s["state"] == "running" and s["loss"] < 10 and s["eta_s"] > 0
    with pytest.raises(RunStateError, match="already running"):
        start(run, job(run / "run_state", 10))
    result = stop(run, grace=60)
    assert result["checkpoint_saved"] and not result["sigkill_after_grace"]
    after = status(run)
    assert after["state"] == "stopped" and after["iteration"] == result["last_checkpoint"]
    lines = []

    class Out:
        write = lines.append

        def flush(self):
            pass

    follow_log(run, follow=False, out=Out())
    log = "".join(lines)
    assert "saved checkpoint at" in log
    # The stop reached the ranks only: torchrun itself would kill them 30 s after its own SIGTERM.
    assert "death signal" not in log and "got signal" not in log


def test_finished_and_failed(tmp_path, job):
    ok = tmp_path / "runs" / "ok"
    start(ok, job(ok / "run_state", 5), {"train_iters": 5})
    assert wait_for(lambda: running_pid(ok) is None)
    assert status(ok)["state"] == "finished" and status(ok)["iteration"] == 5
    bad = tmp_path / "runs" / "bad"
    # a caught start-up error first (as Bridge logs optional imports without TE), then the cause
    failing = ("print('AttributeError: module x has no attribute FP8GlobalStateManager'); "
               "raise ValueError('lm loss is nan at iteration 42')")
    start(bad, [sys.executable, "-c", failing])
    assert wait_for(lambda: (bad / "run_state" / "exit.json").is_file())
    s = status(bad)
    assert s["state"] == "failed" and s["exit"]["exit_code"] == 1
    assert s["error"] == "ValueError: lm loss is nan at iteration 42"
    assert "error" not in status(ok)


def test_sigkill_only_after_grace(tmp_path, job):
    run = tmp_path / "runs" / "stubborn"
    start(run, job(run / "run_state", 100000, ignore_term=True))
    assert wait_for(lambda: status(run).get("iteration", 0) >= 2)
    ranks = training_ranks(int((run / "run_state" / "child.pid").read_text()))
    assert len(ranks) == 2  # the torchrun agent's two workers, not the agent
    t0 = time.monotonic()
    result = stop(run, grace=2)
    assert result["sigkill_after_grace"] and time.monotonic() - t0 >= 2
    assert wait_for(lambda: running_pid(run) is None, timeout=10)
    # torchrun puts each rank in its own session; the SIGKILL must reach them there too
    assert wait_for(lambda: not any(_alive(pid) for pid in ranks), timeout=10)


def test_process_table_sees_this_process_and_its_parent():
    from kaiyuan_recipes.processes import processes

    table = processes()
    assert table[os.getpid()].ppid == os.getppid() and table[os.getpid()].state in "RS"
    assert training_ranks(os.getpid()) == [os.getpid()]  # no torchrun below a test process


def test_torchrun_is_recognised_by_its_argv_only():
    assert is_torchrun(["/usr/bin/python3", "-m", "torch.distributed.run", "--nproc-per-node=8", "train.py"])
    assert is_torchrun(["/venv/bin/torchrun", "--standalone", "train.py"])
    assert is_torchrun(["/usr/bin/python3", "/venv/bin/torchrun", "train.py"])
    # a launcher that passes torchrun's argv on is not torchrun
    assert not is_torchrun(["python", "-c", "…", "python", "-m", "torch.distributed.run", "train.py"])
    assert not is_torchrun(["python", "-m", "kaiyuan_recipes.cli.main", "train", "gpt_smoke"])


def test_stop_and_status_of_unknown_runs(tmp_path):
    with pytest.raises(RunStateError, match="is not running"):
        stop(tmp_path / "nope")
    with pytest.raises(RunStateError, match="no run state"):
        status(tmp_path / "nope")
    with pytest.raises(RunStateError, match=f"^{tmp_path / 'nope'}: no such run$"):
        follow_log(tmp_path / "nope", False, None)
    (tmp_path / "started").mkdir()
    with pytest.raises(RunStateError, match="console.log: no log yet"):
        follow_log(tmp_path / "started", False, None)


def test_status_of_a_run_root_that_does_not_exist(tmp_path, capsys):
    from kaiyuan_recipes.cli.main import main

    assert main(["status", "--run-root", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err == f"kaiyuan: error: {tmp_path / 'nowhere'}: the run root does not exist (--run-root)\n"
    assert main(["status", "--run-root", str(tmp_path)]) == 0  # there, with no runs: nothing to list


def test_cli_start_refuses_bad_config_before_launch(tmp_path):
    import subprocess

    out = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "start", "gpt_smoke", "r1",
                          f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock", "--nproc-per-node", "3"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "global_batch_size=16 is not divisible" in out.stderr
    assert not (tmp_path / "r1" / "run_state").exists()
    out = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "start", "gpt_smoke", "r1;rm -rf x",
                          f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "use letters, digits" in out.stderr and "Traceback" not in out.stderr
    assert not list(tmp_path.iterdir())


def _foreground(tmp_path, job, steps):
    """`kaiyuan train` in the foreground (lifecycle.run_in_foreground): this process is the supervisor."""
    import subprocess

    run = tmp_path / "fg"
    script = tmp_path / "kaiyuan"  # named as the console script, whose process is the foreground supervisor
    script.write_text("import sys; from pathlib import Path; from kaiyuan_recipes.launch.lifecycle import "
                      "run_in_foreground\n"  # argv: train RUN LOG COMMAND..., as `kaiyuan train` has it
                      "sys.exit(run_in_foreground(Path(sys.argv[2]), sys.argv[4:], Path(sys.argv[3]), "
                      "{'train_iters': 5}))\n")
    (run / "run_state").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "KAIYUAN_SUPERVISED"}
    proc = subprocess.Popen([sys.executable, str(script), "train", str(run), str(tmp_path / "train.log"),
                             *job(run / "run_state", steps)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    return run, proc


def test_foreground_train_hands_sigterm_to_the_ranks_and_status_says_stopped(tmp_path, job):
    """Under `timeout` or a scheduler: the SIGTERM reaches the ranks, which save and exit; torchrun and the
    launcher end cleanly; `kaiyuan status` says stopped; while it ran, a second start was refused."""
    import signal

    run, proc = _foreground(tmp_path, job, 100000)
    metrics = run / "run_state" / "metrics.jsonl"
    assert wait_for(lambda: metrics.is_file() and metrics.read_text().count('"step"') >= 3)
    assert status(run)["state"] == "running"
    with pytest.raises(RunStateError, match="already running"):
        start(run, [sys.executable, "-c", "pass"])
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-2000:]
    assert "saved checkpoint at" in out and "death signal" not in out
    assert '"checkpoint"' in metrics.read_text()
    assert "saved checkpoint at" in (tmp_path / "train.log").read_text()
    assert status(run)["state"] == "stopped"


def test_foreground_train_that_finishes_or_fails_says_so(tmp_path, job):
    run, proc = _foreground(tmp_path, job, 5)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-2000:]
    result = status(run)
    assert result["state"] == "finished" and result["iteration"] == 5 and result["exit"]["exit_code"] == 0


def test_stop_signals_only_the_recorded_supervisor(tmp_path):
    """A stale or forged record (an unrelated process's PID, a reused PID, a non-positive PID) is never signalled."""
    import json
    import signal
    import subprocess

    from kaiyuan_recipes.launch.identity import ProcessIdentity

    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run = tmp_path / "r"
        (run / "run_state").mkdir(parents=True)
        record = run / "run_state" / "supervisor.json"
        real = ProcessIdentity.of(bystander.pid)
        cases = {"unrelated live process": real,  # matches a live process, but not a supervisor's argv
                 "reused pid": ProcessIdentity(bystander.pid, real.start_ticks + 1, real.boot_id,
                                               ("python", "-m", "kaiyuan_recipes.launch.supervise")),
                 "other boot": ProcessIdentity(bystander.pid, real.start_ticks, "another-boot",
                                               ("python", "-m", "kaiyuan_recipes.launch.supervise"))}
        for what, identity in cases.items():
            identity.save(record)
            with pytest.raises(RunStateError, match="is lost: nothing of it runs.*nothing signalled"):
                stop(run, grace=1)
            assert bystander.poll() is None, what
            assert status(run)["state"] == "lost", what
        for forged in ({"pid": -1, "start_ticks": 1, "boot_id": "", "argv": []}, {"pid": 0}, "12345"):
            record.write_text(json.dumps(forged))
            with pytest.raises(RunStateError, match="not a process record"):
                stop(run, grace=1)
        (run / "run_state" / "supervisor.json").unlink()
        (run / "run_state" / "supervisor.pid").write_text(str(bystander.pid))  # an old-style record: not trusted
        with pytest.raises(RunStateError, match="is lost"):
            stop(run, grace=1)
        assert bystander.poll() is None
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


@pytest.mark.parametrize("verb", ["stop", "status", "logs", "stacks"])
@pytest.mark.parametrize("name", ["../x", "/etc", "", "-rf", ".hidden"])
def test_every_verb_checks_the_run_name(tmp_path, verb, name):
    from kaiyuan_recipes.cli.main import main

    assert main([verb, "--run-root", str(tmp_path), "--", name]) == 2


STALLING = textwrap.dedent('''
    import os, sys, time
    import torch.distributed as dist
    from kaiyuan_recipes.launch.stacks import enable_stack_dumps
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:  # rank 1 keeps SIGUSR1's default action: kaiyuan stacks must leave it alone
        enable_stack_dumps()
    print("ready", dist.get_rank(), flush=True)
    def waiting_for_the_release(path):
        while not os.path.exists(path):
            time.sleep(0.05)
    waiting_for_the_release(sys.argv[1])
    dist.barrier()
    dist.destroy_process_group()
''')


def test_stacks_of_a_stalled_run(tmp_path):
    """kaiyuan stacks: SIGUSR1 reaches the ranks that registered the dump (and no other process), the stack
    names the function the rank waits in, and the run carries on and finishes."""
    from kaiyuan_recipes.launch.stacks import STACK_SIGNAL, catches

    prog, release = tmp_path / "stall.py", tmp_path / "release"
    prog.write_text(STALLING)
    run = tmp_path / "runs" / "stalled"
    with pytest.raises(RunStateError, match="not running"):
        LocalRun(run).stacks()
    start(run, [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone", str(prog),
                str(release)])
    log = RunLayout(run).console_log
    assert wait_for(lambda: log.read_text().count("ready") == 2)
    ranks = training_ranks(int((run / "run_state" / "child.pid").read_text()))
    assert len(ranks) == 2 and sum(catches(pid, STACK_SIGNAL) for pid in ranks) == 1
    text = LocalRun(run).stacks()
    (dumped,) = [pid for pid in ranks if catches(pid, STACK_SIGNAL)]
    assert text.startswith(f"==> SIGUSR1 to rank process(es) [{dumped}] <==\n")  # that one rank, no other
    assert "most recent call first" in text and "in waiting_for_the_release" in text
    assert all(_alive(pid) for pid in ranks) and status(run)["state"] == "running"
    release.touch()
    assert wait_for(lambda: running_pid(run) is None)
    assert status(run)["state"] == "finished"


def test_training_workers_enable_stack_dumps_first(monkeypatch):
    from kaiyuan_recipes.training import entry

    calls = []
    monkeypatch.setattr(entry, "enable_stack_dumps", lambda: calls.append("stacks"))
    with pytest.raises(SystemExit, match="usage"):
        entry.main([])
    assert calls == ["stacks"]


def test_run_state_is_private_redacted_and_never_written_through_a_symlink(tmp_path, monkeypatch):
    import json
    import stat

    monkeypatch.setenv("HF_ENDPOINT", "https://user:pw@hub.internal/x")
    run = tmp_path / "r"
    start(run, [sys.executable, "-c", "pass"])
    command = run / "run_state" / "command.json"
    assert "user:pw" not in command.read_text() and json.loads(command.read_text())["env"]["HF_ENDPOINT"] == \
        "https://<redacted>@hub.internal/x"
    assert stat.S_IMODE(command.stat().st_mode) == 0o600
    assert wait_for(lambda: status(run)["state"] == "finished")
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = tmp_path / "p"
    planted.mkdir()
    (planted / "run_state").symlink_to(outside)
    with pytest.raises(RunStateError, match="symlink"):
        start(planted, [sys.executable, "-c", "pass"])
    assert not list(outside.iterdir())
    (run / "run_state" / "exit.json").unlink()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (run / "run_state" / "exit.json").symlink_to(victim)  # a planted link at a state file's name
    from kaiyuan_recipes.launch.supervise import record_exit

    record_exit(run / "run_state", 0)
    assert victim.read_text() == "keep" and not (run / "run_state" / "exit.json").is_symlink()


def test_a_stop_right_after_start_reaches_the_run_and_leaves_nothing_running(tmp_path, job):
    """`kaiyuan start` returns once the supervisor's identity is on record; a stop at that moment must still go
    through the supervisor (it hands it on), not kill it and orphan the training processes."""
    from kaiyuan_recipes.processes import processes

    run = tmp_path / "early"
    pid = start(run, job(run / "run_state", 100000))
    result = stop(run, grace=60)
    assert not result["sigkill_after_grace"]
    assert status(run)["state"] == "stopped" and (run / "run_state" / "exit.json").is_file()
    time.sleep(1)
    assert not [p for p, proc in processes().items() if str(run / "run_state") in " ".join(proc.argv)], pid


def test_a_refused_foreground_train_says_only_why(tmp_path):
    """`kaiyuan train` of a run that is running: the refusal, with no `launching:` / `log:` of a log never made."""
    import subprocess

    claim = LocalRun(tmp_path / "gpt_smoke").prepare_state([sys.executable, "-c", "pass"], {})  # this test holds it
    try:
        out = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "train", "gpt_smoke",
                              f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock"],
                             capture_output=True, text=True, timeout=300)
    finally:
        os.close(claim.fd)
    assert out.returncode == 2 and "run 'gpt_smoke' is already running" in out.stderr, out.stderr[-2000:]
    assert "launching:" not in out.stdout and "log:" not in out.stdout, out.stdout
    assert not list((tmp_path / "gpt_smoke" / "logs").glob("train-*.log"))
