"""The Slurm back-end against a real Slurm (tests/slurm_cluster.py: slurm-wlm 22.05 from Debian 12, one CPU node
on loopback; make test-services installs it): jobs go through NeMo-Run's SlurmExecutor exactly as
`kaiyuan start --slurm` submits them, torchrun with gloo, two ranks. What CI cannot run (Pyxis containers, GPUs,
several nodes, the ssh:// tunnel) is checked in the sbatch script NeMo-Run generates for it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import PARTITION, SlurmCluster, devnull_stdin, missing_programs  # noqa: F401 (fixture)

from kaiyuan_recipes.launch.backends import open_run
from kaiyuan_recipes.launch.slurm import SlurmError, SlurmRun, SlurmSpec

JOB = str(Path(__file__).parent / "fixtures" / "slurm_job.py")
CHECK = ["-m", "kaiyuan_recipes.launch.allreduce_check"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = missing_programs()
    if missing:
        pytest.fail(f"the Slurm tests need {', '.join(missing)}: install slurm-wlm slurmdbd munge mariadb-server "
                    "(make test-services does, as root on Debian)")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    # The jobs inherit this environment (sbatch --export=ALL): Slurm's config, and torchrun and this checkout's
    # code on PATH / PYTHONPATH.
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "PATH", "PYTHONPATH")}
    repo = str(Path(__file__).resolve().parents[1])
    os.environ.update(cluster.env, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                      PYTHONPATH=os.pathsep.join(p for p in (repo, saved["PYTHONPATH"]) if p))
    yield cluster
    for key, value in saved.items():
        os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    cluster.stop()


def cpu_spec(**kw) -> SlurmSpec:
    """Two ranks on the CPU node (gloo over loopback); the time-limit signal ~9 minutes away, past every test."""
    return SlurmSpec(**{"partition": PARTITION, "gpus_per_node": None, "nproc_per_node": 2, "time": "00:10:00",
                        "signal_grace_s": 60, "env": {"GLOO_SOCKET_IFNAME": "lo"}, **kw})


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what}: not within {timeout:g}s")


def cli(*args: str, run_root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", *args, "--run-root", str(run_root)],
                          capture_output=True, text=True, timeout=120)


def markers(folder: Path, event: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob(f"{event}-*.json"))]


@pytest.fixture(scope="module")
def time_limit_job(slurm, tmp_path_factory):
    """A job whose ranks wait for the time-limit SIGTERM: --time 2 minutes, --signal=TERM@60. Slurm checks time
    limits every 30 s and may signal up to a minute early, so it comes 30-90 s after the start. Submitted by the
    first test, so that wait overlaps the others; test_the_time_limit_signal_reaches_the_ranks reads it."""
    marks = tmp_path_factory.mktemp("time-limit")
    job = SlurmRun(marks / "runs" / "tl", cpu_spec(time="00:02:00", signal_grace_s=60))
    job.start([JOB, "--mode", "signal", "--marker-dir", str(marks / "m"), "--wait", "150"])
    return job, marks / "m"


def test_two_ranks_all_reduce_and_the_status_goes_to_completed(slurm, time_limit_job, tmp_path):
    """In a run root whose path holds a space, quotes and $(...): sbatch's log, the node logs and the job's
    working directory all land in it, and nothing of the path runs."""
    runs = tmp_path / f"runs 'q\" $(touch {tmp_path}/ran)"
    job = SlurmRun(runs / "ar", cpu_spec(workdir=str(runs)))
    runs.mkdir(parents=True)
    job.start([*CHECK, "--tag", "a b;$(x)"])
    seen = set()

    def ended():
        status = open_run(job.run_dir).status()  # found from the run directory, as the CLI verbs do
        seen.add(status["slurm_state"])
        return status if status["state"] not in ("pending", "running") else None

    final = wait_for(ended, 90, "the all-reduce job to end")
    assert seen & {"SUBMITTED", "PENDING", "RUNNING"}, seen
    assert (final["state"], final["slurm_state"], final["exit_code"]) == ("finished", "COMPLETED", "0:0")
    log = job.node_log(0)
    for rank in (0, 1):  # the tag arrives as one literal argument, metacharacters and all
        assert f"allreduce ok rank={rank} world=2 sum=3 expected=3 host={slurm.node} tag=a b;$(x)" in log
    assert not (tmp_path / "ran").exists() and list((runs / "ar" / "logs").glob("sbatch_kaiyuan-ar_*.out"))
    out = cli("status", "ar", run_root=runs)
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "finished", out.stderr
    for follow in ([], ["-f"]):  # -f returns once the job has ended
        logs = cli("logs", "ar", *follow, run_root=runs)
        assert "allreduce ok rank=1" in logs.stdout and "==> node 0" in logs.stdout, logs.stderr
    stacks = cli("stacks", "ar", run_root=runs)
    assert stacks.returncode == 2 and "not offered for Slurm jobs" in stacks.stderr and "Traceback" not in stacks.stderr
    stop = cli("stop", "ar", run_root=runs)  # a finished job: said so, nothing cancelled or recorded
    assert stop.returncode == 2 and "is not running: Slurm job" in stop.stderr and "COMPLETED" in stop.stderr, stop
    assert not job.layout.stop_request.exists() and json.loads(cli("status", "ar", run_root=runs).stdout)[
        "state"] == "finished"


def test_the_same_executor_through_run_experiment_and_nemo_runs_own_status(slurm, tmp_path):
    """docs/slurm.md's Python form: NeMo-Run's Experiment with slurm_executor, its status from NeMo-Run (sacct)."""
    import nemo_run as run

    from kaiyuan_recipes.launch.slurm_executor import slurm_executor, torchrun_task

    executor = slurm_executor(cpu_spec(), str(tmp_path / "runs" / "py"))
    with run.Experiment("kaiyuan-py", log_level="WARN") as exp:
        exp.add(torchrun_task([*CHECK, "--tag", "py"]), executor=executor, name="py")
        exp.run(detach=True)
        exp_id = exp._id

    def succeeded():
        status = run.Experiment.from_id(exp_id).status(return_dict=True)
        return status if status["py"]["status"].name in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    status = wait_for(succeeded, 90, "NeMo-Run's status of the job", poll=1)
    assert status["py"]["status"].name == "SUCCEEDED", status
    log = (tmp_path / "runs" / "py" / "logs" / "node0.log").read_text()
    assert "allreduce ok rank=1 world=2 sum=3 expected=3" in log and "tag=py" in log


def test_a_failing_job_reports_its_error_through_kaiyuan_status(slurm, tmp_path):
    job = SlurmRun(tmp_path / "runs" / "bad", cpu_spec())
    job.start([JOB, "--mode", "fail", "--marker-dir", str(tmp_path / "m")])
    wait_for(lambda: job.status()["state"] not in ("pending", "running"), 90, "the failing job to end")
    out = cli("status", "bad", run_root=tmp_path / "runs")
    status = json.loads(out.stdout)
    assert (status["state"], status["slurm_state"]) == ("failed", "FAILED"), status
    # the last rank's exception, with torchrun's --tee prefix (role "default", local rank)
    assert re.fullmatch(r"\[default[01]\]:RuntimeError: the planned failure of the Slurm test job", status["error"])


def test_kaiyuan_stop_signals_the_ranks_and_ends_the_job(slurm, tmp_path):
    marks = tmp_path / "m"
    job = SlurmRun(tmp_path / "runs" / "st", cpu_spec())
    job.start([JOB, "--mode", "signal", "--marker-dir", str(marks)])
    wait_for(lambda: len(markers(marks, "ready")) == 2, 90, "both ranks ready")
    with pytest.raises(Exception, match="already Slurm job"):  # one job per run directory at a time
        SlurmRun(tmp_path / "runs" / "st", cpu_spec()).start(CHECK)
    out = cli("stop", "st", "--grace", "60", run_root=tmp_path / "runs")
    result = json.loads(out.stdout)
    assert out.returncode == 0, out.stderr
    assert result["state"] == "stopped" and not result["sigkill_after_grace"], result
    assert [m["rank"] for m in markers(marks, "sigterm")] == ["0", "1"]  # each rank got its SIGTERM to save


def test_kaiyuan_stop_cancels_a_pending_job(slurm, tmp_path):
    job = SlurmRun(tmp_path / "runs" / "pend", cpu_spec())
    partition = ["scontrol", "update", f"PartitionName={PARTITION}"]
    subprocess.run([*partition, "State=DOWN"], check=True, timeout=30)  # queued jobs wait while it is down
    try:
        job.start(CHECK)
        wait_for(lambda: job.status()["slurm_state"] == "PENDING", 30, "the job pending in sacct")
        with pytest.raises(SlurmError, match=r"already Slurm job \d+ \(PENDING\)"):  # pending is alive too
            SlurmRun(tmp_path / "runs" / "pend", cpu_spec()).start(CHECK)
        result = job.stop(grace=30)
    finally:
        subprocess.run([*partition, "State=UP"], check=True, timeout=30)
    assert (result["state"], result["slurm_state"]) == ("stopped", "CANCELLED"), result
    assert job.stop_problems(result) == []


def test_a_job_ended_outside_kaiyuan_is_lost_with_its_progress(slurm, tmp_path):
    """scancel by an operator (as a node failure, the time limit or an OOM kill would end it): not `stopped`
    and not `running` but `lost`, with the last iteration and checkpoint; `kaiyuan stop` then cancels nothing."""
    marks, run_dir = tmp_path / "m", tmp_path / "runs" / "gone"
    job = SlurmRun(run_dir, cpu_spec())
    job.start([JOB, "--mode", "signal", "--marker-dir", str(marks), "--run-dir", str(run_dir)])
    wait_for(lambda: len(markers(marks, "ready")) == 2, 90, "both ranks ready")
    # the accounting database can lag the job: until it records it, status says pending (SUBMITTED)
    # and the first reads of the job's files may come before they show: wait for both, then check the values
    running = wait_for(lambda: (st := job.status())["state"] == "running" and "iteration" in st and st, 60,
                       "sacct to show it running with its progress")
    assert (running["state"], running["iteration"], running["last_checkpoint"]) == ("running", 3, 2), running
    subprocess.run(["scancel", job.job_id], check=True, timeout=30)  # not `kaiyuan stop`
    wait_for(lambda: job.status()["state"] not in ("pending", "running"), 60, "the cancelled job to end")
    status = json.loads(cli("status", "gone", run_root=tmp_path / "runs").stdout)
    assert (status["state"], status["slurm_state"]) == ("lost", "CANCELLED"), status
    assert (status["iteration"], status["loss"], status["last_checkpoint"]) == (3, 6.0, 2), status
    assert "without a `kaiyuan stop`" in status["error"]
    stop = cli("stop", "gone", run_root=tmp_path / "runs")
    assert stop.returncode == 2 and f"is not running: Slurm job {job.job_id} is CANCELLED (lost)" in stop.stderr, stop
    assert json.loads(cli("status", "gone", run_root=tmp_path / "runs").stdout)["state"] == "lost"


def test_a_slurm_start_is_refused_while_the_run_trains_on_this_node(tmp_path):
    """Two trainings in one run directory: a Slurm job is not submitted while the run's local supervisor lives."""
    from kaiyuan_recipes.launch.lifecycle import LocalRun

    local = LocalRun(tmp_path / "runs" / "busy")
    pid = local.start([sys.executable, "-c", "import time; time.sleep(120)"])[0]
    try:
        with pytest.raises(SlurmError, match=f"run 'busy' is running on this node \\(supervisor pid {pid}\\)"):
            SlurmRun(tmp_path / "runs" / "busy", cpu_spec()).start(CHECK)
    finally:
        local.stop(grace=10)
    assert not local.layout.slurm_state.exists()


def test_a_local_start_is_refused_while_the_runs_slurm_job_is_alive(slurm, tmp_path):
    """The other way round: while the run's Slurm job runs, `kaiyuan start` of the same run on this node is
    refused and starts nothing."""
    from kaiyuan_recipes.launch.lifecycle import LocalRun, RunStateError

    marks, run_dir = tmp_path / "m", tmp_path / "runs" / "both"
    job = SlurmRun(run_dir, cpu_spec())
    job.start([JOB, "--mode", "signal", "--marker-dir", str(marks)])
    try:
        wait_for(lambda: len(markers(marks, "ready")) == 2, 90, "both ranks ready")
        local = LocalRun(run_dir)
        with pytest.raises(RunStateError, match=f"run 'both' is (pending|running) on Slurm \\(job {job.job_id}\\)"):
            local.start([sys.executable, "-c", "import time; time.sleep(120)"])
        assert local.running_pid() is None
    finally:
        job.stop(grace=60)


def test_a_requeued_job_finds_its_previous_state(slurm, tmp_path):
    marks = tmp_path / "m"
    job = SlurmRun(tmp_path / "runs" / "rq", cpu_spec())
    job.start([JOB, "--mode", "requeue", "--marker-dir", str(marks)])
    wait_for(lambda: len(markers(marks, "ready")) == 2, 90, "the first run's ranks saving their state")
    subprocess.run(["scontrol", "requeue", job.job_id], check=True, timeout=30)  # what a preemption does
    wait_for(lambda: job.status()["slurm_state"] == "PENDING", 60, "the requeued job pending again")
    # Slurm holds a requeued job back ~2 minutes; an operator's `StartTime=now` lets it start at once.
    subprocess.run(["scontrol", "update", f"JobId={job.job_id}", "StartTime=now"], check=True, timeout=30)
    final = wait_for(lambda: (s := job.status())["state"] not in ("pending", "running") and s, 120,
                     "the requeued job to end")
    resumed = markers(marks, "resumed")
    assert final["state"] == "finished" and [m["rank"] for m in resumed] == ["0", "1"], (final, resumed)
    assert all(m["restart"] == "1" and m["state"] == {"iteration": 7, "job_id": job.job_id} for m in resumed)


def test_dry_run_prints_the_sbatch_script_for_gpus_containers_and_many_nodes(tmp_path, monkeypatch, capsys):
    """What CI cannot run (4 GPU nodes, a Pyxis container), checked in the script NeMo-Run would submit."""
    from kaiyuan_recipes.cli.main import main

    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0 ; x")
    monkeypatch.chdir(tmp_path)
    rc = main(["start", "gpt_smoke", "exp", "--slurm", "batch", "--nodes", "4", "--gpus-per-node", "8",
               "--account", "A", "--time", "4:00:00", "--container-image", "nvcr.io/nvidia/nemo:25.09", "--dry-run",
               "train.global_batch_size=128"])  # 4 nodes x 8 ranks x micro-batch 4
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    script, run_dir = out.out, tmp_path.resolve() / "runs" / "exp"
    for line in ("#SBATCH --signal=TERM@300", "#SBATCH --nodes=4", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --account=A", "#SBATCH --time=4:00:00", "#SBATCH --partition=batch",
                 "export NCCL_SOCKET_IFNAME=ib0", "export GLOO_SOCKET_IFNAME='ib0 ; x'"):
        assert line in script.splitlines(), line
    srun = next(line for line in script.splitlines() if line.startswith("srun --output"))
    assert srun.startswith(f"srun --output {run_dir}/logs/node%n.log --container-image nvcr.io/nvidia/nemo:25.09")
    assert f"{run_dir}:{run_dir}" in srun  # checkpoints land in the run directory, not inside the container
    assert "torchrun --rdzv-backend c10d --rdzv-endpoint $head_node_ip:29500" in srun
    assert "--nnodes 4 --nproc-per-node 8 --node-rank $SLURM_NODEID" in srun
    assert srun.endswith(f"-m kaiyuan_recipes.training.entry gpt_smoke train.global_batch_size=128 "
                         "kaiyuan.run_name=exp "
                         f"kaiyuan.run_root={run_dir.parent}")
    assert not run_dir.exists()  # nothing submitted, recorded or made (not even logs/)


def test_the_time_limit_signal_reaches_the_ranks(time_limit_job):
    """Bounded at 150 s from here (the job was submitted at the first test)."""
    job, marks = time_limit_job
    got = wait_for(lambda: len(markers(marks, "sigterm")) == 2 and markers(marks, "sigterm"), 150,
                   "SIGTERM at both ranks before the time limit")
    ready = {m["rank"]: m["at"] for m in markers(marks, "ready")}
    assert sorted(ready) == ["0", "1"] and all(m["at"] > ready[m["rank"]] for m in got)
    assert all(m["job_id"] == job.job_id for m in got)


def test_over_an_ssh_tunnel_the_script_names_the_clusters_paths(tmp_path):
    """NeMo-Run's SSHTunnel from a laptop (not run in CI: it would submit on a real login node): the dry run
    needs no connection, and every path in the script is the cluster's."""
    spec = SlurmSpec(partition="batch", nodes=2, tunnel="ssh://me@login.example:2222",
                     cluster_run_dir="/lustre/me/runs/exp")
    assert spec.ssh_node().port == 2222
    script = SlurmRun(tmp_path / "exp", spec).sbatch_script(CHECK)
    assert "#SBATCH --output=/lustre/me/runs/exp/logs/sbatch_kaiyuan-exp_%j.out" in script.splitlines()
    srun = next(line for line in script.splitlines() if line.startswith("srun --output"))
    assert srun.startswith("srun --output /lustre/me/runs/exp/logs/node%n.log ")
    assert " --chdir /lustre/me/runs/exp torchrun " in srun and "--nnodes 2 --nproc-per-node 8" in srun
    assert not (tmp_path / "exp").exists()  # nothing recorded, nothing made here


def test_an_ssh_tunnel_to_a_login_node_with_an_unknown_host_key_is_refused(tmp_path, monkeypatch):
    """NeMo-Run's SSHTunnel (Fabric) would accept it unverified; refused before anything is submitted."""
    from kaiyuan_recipes.launch.slurm import SlurmError

    monkeypatch.setenv("HOME", str(tmp_path))  # ~/.ssh/known_hosts is this test's
    spec = SlurmSpec(partition="batch", tunnel="ssh://me@127.0.0.1:2", cluster_run_dir="/lustre/me/runs/exp")
    with pytest.raises(SlurmError, match=r"ssh://\[127.0.0.1\]:2: its host key is not in .*known_hosts"):
        SlurmRun(tmp_path / "exp", spec).start(CHECK)
    assert not (tmp_path / "exp").exists()
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "known_hosts").write_text(
        "[127.0.0.1]:2 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE3k6jGtjjmkL8yhAquhbIyvKg5Ym2LHwyHMWFnSsq6S\n")
    assert SlurmRun(tmp_path / "exp", spec).tunnel().host == "127.0.0.1"  # on record: NeMo-Run's SSHTunnel


@pytest.mark.parametrize("kw, message", [
    ({"partition": ""}, "expected a partition name"),
    ({"partition": "p", "gpus_per_node": None}, "ranks per node 0"),
    ({"partition": "p", "tunnel": "login"}, "expected 'local' or ssh://"),
    ({"partition": "p", "tunnel": "ssh://u@h;rm"}, "expected \\[user@\\]host"),
    ({"partition": "p", "tunnel": "ssh://u@login"}, "give --cluster-run-root"),
    ({"partition": "p", "time": "5:00", "signal_grace_s": 300}, "fewer seconds than the time limit"),
    ({"partition": "p", "time": "4h"}, "expected MM, MM:SS"),
])
def test_a_bad_slurm_spec_says_what_was_expected(kw, message):
    with pytest.raises(ValueError, match=message):
        SlurmSpec(**kw)


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("5:30", 330), ("04:00:00", 14400), ("1-12", 129600),
                                           ("2-00:30", 174600), ("1-00:00:10", 86410)])
def test_time_limits_read_as_sbatch_reads_them(text, seconds):
    from kaiyuan_recipes.launch.slurm import time_limit_seconds

    assert time_limit_seconds(text) == seconds




def test_a_damaged_job_record_names_the_file(tmp_path):
    run_dir = tmp_path / "r"
    (run_dir / "run_state").mkdir(parents=True)
    (run_dir / "run_state" / "slurm.json").write_text('{"spec": {"partition": "p"}, "job_id": "1; rm -rf /"}')
    with pytest.raises(Exception, match="slurm.json: not a Slurm job record"):
        open_run(run_dir)
