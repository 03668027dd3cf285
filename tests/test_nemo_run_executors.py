"""The NeMo-Run executors through NeMo-Run's own API (run.Experiment: launch, status, logs, cancel):
SSHMultiNodeExecutor over the real sshd of conftest (two loopback nodes, gloo all-reduce), and the
local torchrun executor with two processes."""

import sys
import time
from pathlib import Path

from conftest import NODES, free_port

REPO = Path(__file__).resolve().parents[1]


def check_task(*extra):
    import nemo_run as run

    return run.Script(path="kaiyuan_recipes.launch.allreduce_check", args=["--backend", "gloo", *extra], m=True,
                      entrypoint="python")


def ssh_executor(sshd):
    from kaiyuan_recipes.launch.nemo_run_executors import SSHMultiNodeExecutor

    return SSHMultiNodeExecutor(hosts=[f"root@{a}:{sshd['port']}" for a in NODES], gpus_per_node=1,
                                master_port=free_port(), workdir=str(REPO), python=sys.executable,
                                identity_file=sshd["key"], known_hosts=sshd["known_hosts"],
                                env_vars={"GLOO_SOCKET_IFNAME": "lo"})


def test_ssh_executor_in_an_experiment(sshd):
    import nemo_run as run

    with run.Experiment("kaiyuan-ssh", executor=ssh_executor(sshd), log_level="WARN") as exp:
        exp.add(check_task("--tag", "via-nemo-run"), name="allreduce")
        exp.run(sequential=True, detach=False, tail_logs=False)
    state = exp.status(return_dict=True)["allreduce"]  # leaving the block waited for the job
    assert str(state["status"]) in ("SUCCEEDED", "AppState.SUCCEEDED"), state
    from kaiyuan_recipes.launch.ssh import MultiNodeRun

    job = MultiNodeRun(Path(exp.jobs[0].executor.job_dir))
    assert all("allreduce ok" in job.node_log(r) and "tag=via-nemo-run" in job.node_log(r) for r in (0, 1))


def test_ssh_executor_cancel_stops_every_node(sshd):
    import nemo_run as run

    from kaiyuan_recipes.launch.ssh import MultiNodeRun

    with run.Experiment("kaiyuan-ssh-cancel", executor=ssh_executor(sshd), log_level="WARN") as exp:
        exp.add(check_task("--hold", "300"), name="held")
        exp.run(sequential=True, detach=True, tail_logs=False)
        run_dir = Path(exp.jobs[0].executor.job_dir)
        job = MultiNodeRun(run_dir)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all("allreduce ok" in job.node_log(r) for r in (0, 1)):
            time.sleep(0.5)
        exp.cancel("held")
    status = MultiNodeRun(run_dir).status()
    assert status["state"] == "stopped" and all(n["state"] != "running" for n in status["nodes"])


def test_local_torchrun_executor(monkeypatch):
    import os

    import nemo_run as run

    # NeMo-Run's launcher runs `torchrun` from PATH: the one of this environment.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    from kaiyuan_recipes.launch.nemo_run_executors import local_executor, training_script

    assert training_script("gpt_smoke", ["train.train_iters=5"]).to_command(with_entrypoint=True)[:3] == \
        ["python", "-m", "kaiyuan_recipes.training.entry"]
    executor = local_executor(2, env_vars={"GLOO_SOCKET_IFNAME": "lo"})
    with run.Experiment("kaiyuan-local", executor=executor, log_level="WARN") as exp:
        exp.add(check_task(), name="local")
        exp.run(sequential=True, detach=False, tail_logs=False)
    state = exp.status(return_dict=True)["local"]
    assert "SUCCEEDED" in str(state["status"]), state
    job_dir = Path(exp.jobs[0].executor.job_dir)
    logs = "".join(p.read_text(errors="replace") for p in job_dir.rglob("*") if p.is_file() and "log" in p.name)
    assert "allreduce ok rank=0 world=2 sum=3" in logs and "allreduce ok rank=1 world=2 sum=3" in logs
