"""Multi-node launch over a real OpenSSH sshd on this machine (make test installs openssh-server): two
"nodes" are two loopback addresses (127.0.0.1, 127.0.0.2) served by one sshd; each gets its own torchrun
over SSH, and the two rendezvous (gloo) to all-reduce and check the sum. Status / logs / stop round
trips, a node killed mid-run, shell metacharacters passed as data, and the docker-exec command line."""

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import NODES, free_port

from kaiyuan_recipes.launch.ssh import MultiNodeError, MultiNodeRun, MultiNodeSpec, Node, launch_line

REPO = Path(__file__).resolve().parents[1]


def spec_for(sshd, **kw) -> MultiNodeSpec:
    return MultiNodeSpec(nodes=[Node(a, sshd["port"], "root") for a in NODES], nproc_per_node=1,
                         master_addr=NODES[0], master_port=free_port(), workdir=str(REPO), python=sys.executable,
                         env={"GLOO_SOCKET_IFNAME": "lo"}, identity_file=sshd["key"],
                         known_hosts=sshd["known_hosts"], **kw)


CHECK = ["-m", "kaiyuan_recipes.launch.allreduce_check", "--backend", "gloo"]


def wait_for(predicate, timeout=90, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise TimeoutError(what)


def test_two_nodes_rendezvous_and_all_reduce(sshd, tmp_path):
    tag = "$(touch /tmp/kaiyuan_pwned); `id` 'q\" && echo INJECTED"
    job = MultiNodeRun(tmp_path / "run", spec_for(sshd))
    pids = job.start(CHECK + ["--tag", tag])
    assert sorted(pids) == [0, 1]
    status = job.watch(poll=0.5)
    assert status["state"] == "finished", str(status)
    reloaded = MultiNodeRun(tmp_path / "run")  # from run_state/multinode.json, as `kaiyuan status` does
    assert reloaded.status()["state"] == "finished"
    for rank in (0, 1):
        log = reloaded.node_log(rank)
        assert f"allreduce ok rank={rank} world=2 sum=3 expected=3" in log, log
        assert f"tag={tag}" in log  # arrived as one literal argument
    assert not os.path.exists("/tmp/kaiyuan_pwned")


def test_stop_reaches_every_node_and_a_second_start_is_refused(sshd, tmp_path):
    job = MultiNodeRun(tmp_path / "run", spec_for(sshd))
    job.start(CHECK + ["--hold", "300"])
    wait_for(lambda: all("allreduce ok" in job.node_log(r) for r in (0, 1)), what="both nodes up")
    with pytest.raises(MultiNodeError, match="already running"):
        MultiNodeRun(tmp_path / "run", spec_for(sshd)).start(CHECK)
    result = job.stop(grace=60, poll=0.5)
    assert result["sigkill_after_grace"] is False and result["state"] == "stopped"
    assert all(n["state"] in ("failed", "finished") and n["exit"]["signal"] in (None, 15) for n in result["nodes"])


def test_a_dead_node_fails_the_job_and_stops_the_others(sshd, tmp_path):
    job = MultiNodeRun(tmp_path / "run", spec_for(sshd))
    pids = job.start(CHECK + ["--hold", "300"])
    wait_for(lambda: all("allreduce ok" in job.node_log(r) for r in (0, 1)), what="both nodes up")
    job._run(1, f"kill -KILL -- -{pids[1]}")  # node 1 dies: supervisor and all
    result = job.watch(poll=0.5, grace=60)
    assert result["state"] == "failed" and result["failed_nodes"] == [1]
    assert result["nodes"][0]["state"] != "running" and result["sigkill_after_grace"] is False


def test_a_failed_nodes_status_names_its_error(sshd, tmp_path):
    """Each node that failed by itself carries the exception its ranks raised, read from the node's log over SSH.
    Both nodes fail on their own; if the watch sees one fail while the other still runs, it stops the other (that
    one is not in failed_nodes, and may have been stopped before its ranks raised)."""
    job = MultiNodeRun(tmp_path / "run", spec_for(sshd))
    job.start(["-m", "kaiyuan_recipes.launch.allreduce_check", "--backend", "no_such_backend"])
    result = job.watch(poll=0.5, grace=60)
    assert result["state"] == "failed", result
    failed_alone = result.get("failed_nodes", [n["rank"] for n in result["nodes"]])
    assert failed_alone and all(n["state"] != "running" for n in result["nodes"]), result
    for node in result["nodes"]:
        if node["rank"] in failed_alone:
            assert node["state"] == "failed" and "no_such_backend" in node["error"], node


def test_unknown_host_keys_are_refused(sshd, tmp_path):
    spec = spec_for(sshd)
    spec.known_hosts = None
    with pytest.raises(Exception, match="not found in known_hosts"):
        MultiNodeRun(tmp_path / "run", spec).start(CHECK)


def test_docker_exec_command_line(tmp_path):
    spec = MultiNodeSpec(nodes=["alice@gpu1:2222", "gpu2"], nproc_per_node=8, container="kaiyuan_2.b",
                         workdir="/workspace/kaiyuan", env={"NCCL_SOCKET_IFNAME": "eth0"})
    assert spec.nodes[0] == Node("gpu1", 2222, "alice") and spec.nodes[1] == Node("gpu2", 22, None)
    line = launch_line(spec, Path("/runs/r 1"), 1, ["-m", "kaiyuan_recipes.training.entry", "gpt_smoke", "x=$(id)"])
    argv = shlex.split(line)
    assert argv[:7] == ["docker", "exec", "-w", "/workspace/kaiyuan", "kaiyuan_2.b", "sh", "-c"]
    inner = shlex.split(argv[7].split("nohup ", 1)[1].split(" > ", 1)[0])
    assert inner[0] == "env" and "NCCL_SOCKET_IFNAME=eth0" in inner[: inner.index("--")]
    at = inner.index("--nnodes=2")
    assert inner[at: at + 4] == ["--nnodes=2", "--node-rank=1", "--master-addr=gpu1", "--master-port=29500"]
    assert inner[-1] == "x=$(id)" and "/runs/r 1/run_state/nodes/1" in inner
    for bad in ("host:notaport", "host:0", "-oProxyCommand=x", "a b", "h$(id)", "user;x@host", "@host", ""):
        with pytest.raises(ValueError, match="expected"):
            Node.parse(bad)
    for bad in ("kaiyuan; rm -rf /", "--privileged", "-x", ""):  # a shell line, or an option docker would read
        with pytest.raises(ValueError, match="--container-name"):
            MultiNodeSpec(nodes=["gpu1"], container=bad)
    with pytest.raises(ValueError, match="--python"):
        MultiNodeSpec(nodes=["gpu1"], python="--version")


def test_cluster_check_cli_over_ssh(sshd):
    hosts = ",".join(f"root@{a}:{sshd['port']}" for a in NODES)
    probe = subprocess.run(
        [sys.executable, "-m", "kaiyuan_recipes.cli.main", "cluster", "check", "--hosts", hosts, "--identity-file",
         sshd["key"], "--known-hosts", sshd["known_hosts"], "--nproc-per-node", "1", "--backend", "gloo",
         "--python", sys.executable, "--workdir", str(REPO), "--master-port", str(free_port())],
        capture_output=True, text=True, timeout=180, env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"))
    assert probe.returncode == 0, probe.stdout + probe.stderr[-3000:]
    assert '"state": "finished"' in probe.stdout and probe.stderr.count("allreduce ok") == 2


def test_cluster_up_and_down_command_lines():
    from kaiyuan_recipes.launch.cluster import down_argv, up_argv

    argv = up_argv("kaiyuan", "example/pytorch:25.01", ["/data:/data", "/ckpt:/ckpt"])
    assert argv[:5] == ["docker", "run", "-d", "--name", "kaiyuan"]
    for flag in ("--gpus", "--network=host", "--ipc=host", "--shm-size=64g"):
        assert flag in argv
    assert argv[argv.index("/data:/data") - 1] == "-v" and argv[-3:] == ["example/pytorch:25.01", "sleep", "infinity"]
    assert down_argv("kaiyuan") == ["docker", "rm", "-f", "--", "kaiyuan"]
    for bad in (dict(container="--privileged", image="img"), dict(container="k", image="--privileged"),
                dict(container="k", image="img", mounts=["-v/:/host"])):
        with pytest.raises(ValueError, match="container-name|image|option"):
            up_argv(**bad)
    with pytest.raises(ValueError, match="container-name"):
        down_argv("-f")
    with pytest.raises(ValueError, match="HOST_PATH:CONTAINER_PATH"):
        up_argv("k", "img", ["/data"])


def _processes_with(marker: str) -> list[int]:
    from kaiyuan_recipes.processes import processes

    return [pid for pid, p in processes().items() if p.state != "Z" and any(marker in a for a in p.argv)]


def test_sigkill_reaches_the_ranks_in_their_own_sessions(sshd, tmp_path):
    """torchrun starts each rank with a new session; killing the supervisor's group alone would leave them."""
    tag = f"kill-check-{os.getpid()}-{time.monotonic_ns()}"
    job = MultiNodeRun(tmp_path / "run", spec_for(sshd))
    job.start(CHECK + ["--hold", "300", "--tag", tag])
    wait_for(lambda: all("allreduce ok" in job.node_log(r) for r in (0, 1)), what="both nodes up")
    assert len(_processes_with(tag)) >= 4  # two torchrun agents and their two ranks (loopback nodes)
    job.signal_all("KILL")
    wait_for(lambda: not _processes_with(tag), what="every process of the job gone")


def test_stacks_from_every_node(sshd, tmp_path):
    """kaiyuan stacks on a multi-node job: each node's ranks dump their stacks (SIGUSR1, over SSH), the job keeps
    running and then stops cleanly."""
    job = MultiNodeRun(tmp_path / "run", spec_for(sshd))
    job.start(CHECK + ["--hold", "300"])
    wait_for(lambda: all("allreduce ok" in job.node_log(r) for r in (0, 1)), what="both nodes up")
    for rank in (0, 1):
        out = job.node_stacks(rank)
        assert "SIGUSR1 to rank process(es)" in out and "in hold_after_the_check" in out, out
    assert job.status()["state"] == "running"
    result = job.stop(grace=60, poll=0.5)
    assert result["sigkill_after_grace"] is False and result["state"] == "stopped"


def test_state_file_is_checked_private_and_holds_no_secret(sshd, tmp_path):
    """multinode.json is input: only what `start` writes is accepted (its python / container / hosts checked as
    the CLI's); it is 0600, environment secrets are redacted, and host-key leniency is not remembered."""
    import json
    import stat

    from kaiyuan_recipes.launch.ssh import load_state

    spec = spec_for(sshd, accept_unknown_hosts=True)
    spec.env |= {"HF_TOKEN": "hf_secret", "HF_ENDPOINT": "https://user:pw@hub.internal/x"}
    job = MultiNodeRun(tmp_path / "run", spec)
    job.pids = {0: 1234}
    job._save()
    text = job.state_file.read_text()
    assert "hf_secret" not in text and "user:pw" not in text and "<redacted>" in text
    assert stat.S_IMODE(job.state_file.stat().st_mode) == 0o600
    loaded, pids = load_state(job.state_file)
    assert loaded.accept_unknown_hosts is False and pids == {0: 1234}
    saved = json.loads(text)
    for bad in ({"spec": saved["spec"] | {"python": "--version"}, "pids": {}},
                {"spec": saved["spec"] | {"container": "x; rm -rf /"}, "pids": {}},
                {"spec": saved["spec"] | {"nodes": ["h$(id)"]}, "pids": {}},
                {"spec": saved["spec"] | {"evil": 1}, "pids": {}},
                {"spec": saved["spec"], "pids": {"0": -1}},
                {"spec": saved["spec"], "pids": {"0": 5}, "extra": 1}, [1, 2]):
        job.state_file.write_text(json.dumps(bad))
        with pytest.raises(MultiNodeError, match="not a multi-node state written by"):
            MultiNodeRun(tmp_path / "run")


def test_one_unreachable_node_does_not_keep_the_others_from_stopping(sshd, tmp_path):
    """Node 2 cannot be reached: start records nodes 0 and 1; stop signals both, reports node 2, and says so."""
    spec = spec_for(sshd, command_timeout=30)
    spec.nodes.append(Node("127.0.0.3", sshd["port"], "root"))  # nothing listens there
    spec.connect_timeout = 3
    job = MultiNodeRun(tmp_path / "run", spec)
    with pytest.raises(MultiNodeError, match=r"127\.0\.0\.3.*unreachable"):
        job.start(CHECK)  # nodes 0 and 1 wait for a third rank that never comes
    assert sorted(job.pids) == [0, 1]
    wait_for(lambda: [n["state"] for n in job.status()["nodes"][:2]] == ["running", "running"], what="running")
    result = job.stop(grace=60, poll=0.5)
    assert [u["rank"] for u in result["unreachable"]] == [2] and "unreachable" in result["unreachable"][0]["error"]
    assert [n["state"] for n in result["nodes"][:2]] != ["running", "running"]
    assert result["nodes"][2]["state"] == "unreachable"


def test_a_node_with_no_supervisor_on_record_is_lost_not_running(sshd, tmp_path):
    job = MultiNodeRun(tmp_path / "run", spec_for(sshd))
    job.pids = {}  # a partial start: nothing on record for either node
    assert [n["state"] for n in job.status()["nodes"]] == ["lost", "lost"]


def test_a_nodes_supervisor_killed_takes_that_nodes_ranks_with_it(sshd, tmp_path):
    """kill -9 of one node's supervisor: that node's torchrun gets SIGTERM from the kernel and ends its rank; the
    node is lost (not running), the watch stops the other node, and a stop afterwards signals nothing."""
    tag = f"orphan-check-{os.getpid()}-{time.monotonic_ns()}"
    job = MultiNodeRun(tmp_path / "run", spec_for(sshd))
    pids = job.start(CHECK + ["--hold", "300", "--tag", tag])
    wait_for(lambda: all("allreduce ok" in job.node_log(r) for r in (0, 1)), what="both nodes up")
    node0 = set(_processes_with(tag))
    os.kill(pids[1], 9)
    wait_for(lambda: job.status()["nodes"][1]["state"] == "lost", what="node 1 lost")
    wait_for(lambda: set(_processes_with(tag)) <= node0, what="node 1's processes gone")
    result = job.watch(poll=0.5, grace=60)
    assert result["state"] == "failed" and result["failed_nodes"] == [1]
    wait_for(lambda: not _processes_with(tag), what="every process of the job gone")
    with pytest.raises(MultiNodeError, match="not running on any node.*nothing signalled"):
        job.stop(grace=1)


def test_ranks_that_outlive_their_nodes_supervisor_are_reported_refused_and_stopped(sshd, tmp_path):
    """Node 1's torchrun agent held stopped (the kernel's SIGTERM stays pending), its supervisor killed: the rank
    lives on. Status says `running — supervisor lost`, a second start is refused, and stop ends what is alive
    on that node through the node's run token (there is no supervisor to hand it on)."""
    tag = f"lost-check-{os.getpid()}-{time.monotonic_ns()}"
    job = MultiNodeRun(tmp_path / "run", spec_for(sshd))
    pids = job.start(CHECK + ["--hold", "300", "--tag", tag])
    wait_for(lambda: all("allreduce ok" in job.node_log(r) for r in (0, 1)), what="both nodes up")
    agent = int((tmp_path / "run" / "run_state" / "nodes" / "1" / "child.pid").read_text())
    os.kill(agent, 19)  # SIGSTOP
    os.kill(pids[1], 9)
    wait_for(lambda: job.status()["nodes"][1]["state"] == "running — supervisor lost", what="supervisor lost")
    node = job.status()["nodes"][1]
    assert agent in node["alive"] and len(node["alive"]) >= 2  # the agent and its rank
    with pytest.raises(MultiNodeError, match="already running"):
        MultiNodeRun(tmp_path / "run", spec_for(sshd)).start(CHECK)
    result = job.stop(grace=5, poll=0.5)
    assert result["state"] == "stopped" and all(n["state"] != "running — supervisor lost" for n in result["nodes"])
    wait_for(lambda: not _processes_with(tag), what="every process of the job gone")
