"""The multi-node back-end of launch/run.py, over SSH — what start_multinode_training.sh /
stop_multinode_training.sh did: one torchrun per node (--nnodes/--node-rank/--master-addr/--master-port filled
per node), optionally inside an existing same-named container through `docker exec`, the NCCL / GLOO interface
variables passed through, one log per node, stop = SIGTERM to every node's supervisor, which hands it to the
ranks (SIGKILL to the group after the grace period), and a node that dies fails the job and stops the others.

Every remote command is built from argument lists and quoted with shlex: a run name or override holding
shell metacharacters reaches the program as one literal argument. State (config/run_layout.py): run_state/multinode.json
on the launching machine; per node, run_state/nodes/<rank>/ (the node supervisor's records) and logs/node<rank>.log
on that node."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, TextIO

from kaiyuan_recipes.atomic import redacted_env, write_text_atomic
from kaiyuan_recipes.config.run_layout import EXIT_FILE, IDENTITY_FILE, RunLayout
from kaiyuan_recipes.launch.failure import TAIL_BYTES, last_exception
from kaiyuan_recipes.launch.membership import StopUnderWay, sole_stop
from kaiyuan_recipes.launch.run import Run, RunError
from kaiyuan_recipes.launch.torchrun import TorchrunSpec
from kaiyuan_recipes.run_states import ALIVE, RunState

# Passed from the launching environment to every node (never secrets).
PASS_THROUGH_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG", "NCCL_IB_HCA", "NCCL_IB_DISABLE",
                    "CUDA_VISIBLE_DEVICES", "KAIYUAN_CACHE", "HF_HUB_OFFLINE")


class MultiNodeError(RunError):
    pass


class NothingAlive(MultiNodeError):
    """A stop found nothing of the run alive on any node; nothing was signalled."""


# Strict shapes for what reaches ssh and docker as words: an ssh config's `Match exec %h` shell-evaluates the
# host string, and a container name starting with '-' would be read by docker as an option.
HOST_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # docker's own rule for names


@dataclass
class Node:
    host: str
    port: int = 22
    user: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Node":
        """[user@]host[:port]"""
        user, _, rest = text.rpartition("@")
        host, _, port = rest.partition(":")
        if (not HOST_PART.fullmatch(host) or ("@" in text and not HOST_PART.fullmatch(user))
                or (port and not (port.isdigit() and 0 < int(port) < 65536))):
            raise ValueError(f"host {text!r}: expected [user@]host[:port] (letters, digits, '.', '_', '-')")
        return cls(host, int(port) if port else 22, user or None)


@dataclass
class MultiNodeSpec:
    nodes: list[Node]
    nproc_per_node: int = 8
    master_addr: str | None = None  # default: the first node's host
    master_port: int = 29500
    container: str | None = None  # run inside this same-named container on every node (docker exec)
    workdir: str = field(default_factory=os.getcwd)
    python: str = "python"
    env: dict[str, str] = field(default_factory=dict)
    identity_file: str | None = None
    known_hosts: str | None = None  # extra known_hosts file; ~/.ssh/known_hosts is always read
    accept_unknown_hosts: bool = False  # like StrictHostKeyChecking=no; off: unknown host keys are refused
    connect_timeout: float = 15.0
    command_timeout: float = 120.0  # one remote command (status, signal, log tail); a start waits as long

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("multi-node launch: no hosts given")
        if self.container is not None and not CONTAINER_NAME.fullmatch(self.container):
            raise ValueError(f"--container-name {self.container!r}: expected a docker container name "
                             "([A-Za-z0-9][A-Za-z0-9_.-]*)")
        if self.python.startswith("-"):
            raise ValueError(f"--python {self.python!r}: expected a path or command name")
        self.nodes = [Node.parse(n) if isinstance(n, str) else Node(**n) if isinstance(n, dict) else n
                      for n in self.nodes]
        for key in PASS_THROUGH_ENV:
            if key in os.environ:
                self.env.setdefault(key, os.environ[key])

    def torchrun(self, rank: int) -> TorchrunSpec:
        return TorchrunSpec(nproc_per_node=self.nproc_per_node, nnodes=len(self.nodes), node_rank=rank,
                            master_addr=self.master_addr or self.nodes[0].host, master_port=self.master_port,
                            python=self.python)


def run_on(spec: MultiNodeSpec, node: Node, line: str, warn: bool = False) -> Any:
    """Run one (already quoted) shell line on `node` over SSH; unknown host keys are refused unless allowed."""
    from fabric import Connection

    kwargs: dict[str, Any] = {"timeout": spec.connect_timeout}
    if spec.identity_file:
        kwargs["key_filename"] = spec.identity_file
    from paramiko import RejectPolicy, WarningPolicy

    conn = Connection(node.host, user=node.user, port=node.port, connect_kwargs=kwargs)
    # Known keys are always loaded, so a changed key is refused (paramiko's BadHostKeyException) whatever the
    # policy; --accept-unknown-hosts admits only hosts with no key on record, with a warning, for this command.
    conn.client.load_system_host_keys()
    if spec.known_hosts:
        conn.client.load_host_keys(spec.known_hosts)
    conn.client.set_missing_host_key_policy(WarningPolicy() if spec.accept_unknown_hosts else RejectPolicy())
    if spec.accept_unknown_hosts:
        print(f"kaiyuan: warning: {node.host}:{node.port}: --accept-unknown-hosts: an unknown host key is accepted "
              "unverified (a changed one is still refused)", file=sys.stderr)
    try:
        with conn:
            return conn.run(line, hide=True, warn=warn, in_stream=False, timeout=spec.command_timeout)
    except Exception as err:  # noqa: BLE001  (paramiko / invoke / socket errors: one line naming the host)
        if type(err).__name__ in ("UnexpectedExit",):
            raise
        cause = type(err).__name__ if type(err).__name__ == "CommandTimedOut" else f"{type(err).__name__}: {err}"
        raise MultiNodeError(f"{node.host}:{node.port}: unreachable ({str(cause).splitlines()[0][:200]})") from None


def node_paths(run_dir: Path, rank: int) -> tuple[str, str]:
    """Node `rank`'s state folder and log, as the strings its shell lines name."""
    layout = RunLayout(Path(run_dir))
    return str(layout.node_state(rank)), str(layout.node_log(rank))


def in_node(spec: MultiNodeSpec, shell_line: str) -> str:
    """The line ssh runs: `shell_line` on the node itself, or inside its container via docker exec."""
    if spec.container:
        return shlex.join(["docker", "exec", "-w", spec.workdir, spec.container, "sh", "-c", shell_line])
    return shell_line


def launch_line(spec: MultiNodeSpec, run_dir: Path, rank: int, target: list[str]) -> str:
    """Start node `rank` detached under the supervisor (its own process group); prints the group id."""
    state, log = node_paths(run_dir, rank)
    command = ["env", *(f"{k}={v}" for k, v in sorted(spec.env.items())), spec.python, "-m",
               "kaiyuan_recipes.launch.supervise", "--new-session", state, "--", *spec.torchrun(rank).command(target)]
    identity = shlex.quote(f"{state}/{IDENTITY_FILE}")
    # The node's supervisor records its identity first thing (launch/identity.py); wait for it (bounded), so a
    # status right after the start finds it. A supervisor that refused (its node still runs something of the run:
    # launch/membership.py) records none: the log's end comes back instead of a process id.
    line = (f"cd {shlex.quote(spec.workdir)} && mkdir -p {shlex.quote(state)} {shlex.quote(str(Path(log).parent))} && "
            f"rm -f {shlex.quote(f'{state}/{EXIT_FILE}')} {identity} && "
            f"{{ nohup {shlex.join(command)} > {shlex.quote(log)} 2>&1 < /dev/null & pid=$!; "
            f"for i in $(seq 200); do [ -f {identity} ] && break; sleep 0.05; done; "
            f"if [ -f {identity} ]; then echo $pid; else tail -n 3 {shlex.quote(log)}; fi; }}")
    return in_node(spec, line)


def load_state(path: Path) -> tuple[MultiNodeSpec, dict[int, int]]:
    """multinode.json as `start` writes it, checked like the CLI's arguments (hosts, container, python): a state
    file is input, and whatever it names runs on every node. Anything else is a MultiNodeError naming the file."""
    try:
        saved = json.loads(Path(path).read_text())
        fields = {f.name for f in dataclass_fields(MultiNodeSpec)}
        if not (isinstance(saved, dict) and set(saved) == {"spec", "pids"} and isinstance(saved["spec"], dict)
                and set(saved["spec"]) <= fields and isinstance(saved["pids"], dict)):
            raise ValueError("expected {'spec': {...MultiNodeSpec fields}, 'pids': {rank: pid}}")
        spec = MultiNodeSpec(**saved["spec"] | {"accept_unknown_hosts": False})
        if not (isinstance(spec.python, str) and isinstance(spec.workdir, str) and isinstance(spec.env, dict)):
            raise ValueError("python, workdir and env must be strings / a mapping")
        pids = {int(k): v for k, v in saved["pids"].items()}
        if not all(type(v) is int and v > 0 and 0 <= k < len(spec.nodes) for k, v in pids.items()):
            raise ValueError("pids: node rank -> a positive process id")
    except (OSError, ValueError, TypeError) as err:
        raise MultiNodeError(f"{path}: not a multi-node state written by `kaiyuan start` ({err})") from None
    return spec, pids


class MultiNodeRun(Run):
    """A run on several nodes; without `spec`, the one started in `run_dir` (its multinode.json)."""

    def __init__(self, run_dir: Path, spec: MultiNodeSpec | None = None):
        super().__init__(run_dir)
        if spec is None:
            if not self.state_file.is_file():
                raise MultiNodeError(f"{self.state_file}: no multi-node job was started here")
            spec, self.pids = load_state(self.state_file)
        else:
            self.pids: dict[int, int] = {}
        self.spec = spec

    @property
    def state_file(self) -> Path:
        return self.layout.multinode_state

    def _run(self, rank: int, line: str, warn: bool = False) -> Any:
        return run_on(self.spec, self.spec.nodes[rank], line, warn)

    def _run_in_workdir(self, rank: int, line: str) -> Any:
        """`line` in the job's working directory on node `rank` (in its container where one is used)."""
        return self._run(rank, in_node(self.spec, f"cd {shlex.quote(self.spec.workdir)} && {line}"), warn=True)

    def _save(self) -> None:
        # Host-key leniency is not remembered (each command asks for it again); environment values are redacted,
        # and the file is private: it may still name hosts and paths.
        spec = asdict(self.spec) | {"accept_unknown_hosts": False, "env": redacted_env(self.spec.env)}
        write_text_atomic(self.state_file, json.dumps({"spec": spec, "pids": self.pids}, indent=2), mode=0o600)

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self, target: list[str], extra: dict[str, Any] | None = None) -> dict[int, int]:
        """torchrun `target` on every node. Refused while a previous job in this run directory runs. (`extra` is
        not recorded: multinode.json holds exactly what the nodes run, and status asks the nodes.)"""
        if self.state_file.is_file():
            previous = MultiNodeRun(self.run_dir)
            if previous.status()["state"] in ALIVE:
                raise MultiNodeError(f"run {self.run_dir.name!r} is already running on "
                                     f"{', '.join(n.host for n in previous.spec.nodes)}; stop it first")
        self.pids = {}
        self.layout.stop_request.unlink(missing_ok=True)
        try:
            for rank in range(len(self.spec.nodes)):
                out = self._run(rank, launch_line(self.spec, self.run_dir, rank, target)).stdout.strip().splitlines()
                if not out or not out[-1].isdigit():
                    raise MultiNodeError(f"node {rank} ({self.spec.nodes[rank].host}): no process id back: {out}")
                self.pids[rank] = int(out[-1])
        finally:
            self._save()  # whatever started is on record, so it can be stopped
        return self.pids

    def node_status(self, rank: int) -> dict[str, Any]:
        state, log = node_paths(self.run_dir, rank)
        pid = self.pids.get(rank)
        # Running means: the supervisor that recorded its identity on the node is that live process (a PID alone
        # could be any process by now; a node with none on record is lost, not running).
        probe = (f"cd {shlex.quote(self.spec.workdir)} && "
                 + shlex.join([self.spec.python, "-m", "kaiyuan_recipes.launch.supervise", "--status", state]))
        try:
            out = self._run(rank, in_node(self.spec, probe)).stdout.strip()
        except Exception as err:  # noqa: BLE001  (an unreachable node is a state, reported)
            return {"rank": rank, "host": self.spec.nodes[rank].host, "state": RunState.UNREACHABLE,
                    "error": str(err)[:200]}
        info: dict[str, Any] = {"rank": rank, "host": self.spec.nodes[rank].host, "pid": pid}
        try:
            seen = json.loads(out.splitlines()[-1])
            alive, supervisor, exit_info = seen["alive"], seen["supervisor"], seen["exit"]
        except (ValueError, KeyError, IndexError, TypeError):
            return info | {"state": RunState.UNREADABLE, "error": f"node answered {out[-200:]!r}"}
        if supervisor:
            return info | {"state": RunState.RUNNING, **({"phase": seen["phase"]} if seen.get("phase") else {})}
        if alive:  # the node's supervisor is gone, processes of its run are not
            return info | {"state": RunState.SUPERVISOR_LOST, "alive": alive}
        if exit_info is None:
            return info | {"state": RunState.LOST}
        if exit_info["exit_code"] == 0:
            return info | {"state": RunState.FINISHED, "exit": exit_info}
        tail = self._run(rank, in_node(self.spec, f"tail -c {TAIL_BYTES} {shlex.quote(log)} 2>/dev/null || true"),
                         warn=True).stdout
        return info | {"state": RunState.FAILED, "exit": exit_info, "error": last_exception(tail)}

    def status(self) -> dict[str, Any]:
        nodes = [self.node_status(r) for r in range(len(self.spec.nodes))]
        states = {n["state"] for n in nodes}
        stopped = self.layout.stop_request.is_file()
        if RunState.RUNNING in states:
            overall = RunState.RUNNING
        elif RunState.SUPERVISOR_LOST in states:
            overall = RunState.SUPERVISOR_LOST
        elif states == {RunState.FINISHED}:
            overall = RunState.FINISHED
        elif stopped:
            overall = RunState.STOPPED
        elif states == {RunState.LOST}:
            overall = RunState.LOST  # nothing of it runs anywhere, and it neither finished nor was stopped
        else:
            overall = RunState.FAILED
        return {"run": self.name, "state": overall, "nodes": nodes}

    def signal_all(self, sig: str) -> list[dict[str, Any]]:
        """TERM to each node's supervisor (it hands it to the ranks: launch/supervise.py); KILL to its group
        and to the ranks' own sessions. On the node, and only to the supervisor whose identity it recorded.
        Every reachable node is signalled; the unreachable ones are returned."""
        verb = "--kill" if sig == "KILL" else "--term"
        unreachable = []
        for rank in range(len(self.spec.nodes)):
            state, _ = node_paths(self.run_dir, rank)
            line = shlex.join([self.spec.python, "-m", "kaiyuan_recipes.launch.supervise", verb, state])
            try:
                self._run_in_workdir(rank, f"{line} 2>/dev/null || true")
            except MultiNodeError as err:
                unreachable.append({"rank": rank, "host": self.spec.nodes[rank].host, "error": str(err)})
        return unreachable

    def stop(self, grace: float = 300.0, poll: float = 1.0, reason: str = "requested") -> dict[str, Any]:
        """SIGTERM every node's supervisor (it stops the ranks); wait for all to exit; SIGKILL the rest after `grace`.
        A node that cannot be reached does not keep the others from being stopped; it is reported. Refused while
        another stop is under way (membership.sole_stop)."""
        with sole_stop(self.layout, self.name):
            return self._stop(grace, poll, reason)

    def _stop(self, grace: float, poll: float, reason: str) -> dict[str, Any]:
        before = self.status()
        if before["state"] not in ALIVE and RunState.UNREACHABLE not in {n["state"] for n in before["nodes"]}:
            raise NothingAlive(f"run {self.name!r} is not running on any node (state {before['state']}: "
                                 + ", ".join(f"node {n['rank']} {n['state']}" for n in before["nodes"])
                                 + "); nothing signalled")
        self.layout.state.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.layout.stop_request, json.dumps({"reason": reason, "at": time.time(), "grace_s": grace,
                                                                "by_pid": os.getpid()}))
        unreachable = self.signal_all("TERM")
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.status()["state"] in ALIVE:
            time.sleep(poll)
        killed = self.status()["state"] in ALIVE
        if killed:
            unreachable += [u for u in self.signal_all("KILL") if u["rank"] not in {v["rank"] for v in unreachable}]
        return {"run": self.name, "sigkill_after_grace": killed, "grace_s": grace,
                "unreachable": unreachable, **self.status()}

    def stop_problems(self, result: dict[str, Any]) -> list[str]:
        problems = [f"node {node['rank']} not stopped: {node['error']}" for node in result["unreachable"]]
        if result["sigkill_after_grace"]:
            problems.append(f"did not exit within {result['grace_s']:g}s of SIGTERM; sent SIGKILL")
        return problems

    def watch(self, poll: float = 2.0, grace: float = 300.0) -> dict[str, Any]:
        """Wait for the job; when one node fails or disappears while others run, stop the others."""
        while True:
            status = self.status()
            bad = [n for n in status["nodes"]
                   if n["state"] in (RunState.FAILED, RunState.LOST, RunState.SUPERVISOR_LOST)]
            if bad and status["state"] in ALIVE:
                hosts = ", ".join(f"{n['host']} (rank {n['rank']}: {n['state']})" for n in bad)
                try:
                    result = self.stop(grace, reason=f"node failure: {hosts}")
                except StopUnderWay:  # a `kaiyuan stop` is ending the run already: it is left to finish
                    time.sleep(poll)
                    continue
                except NothingAlive:  # the others ended by themselves meanwhile
                    result = {"run": self.name, "sigkill_after_grace": False, "grace_s": grace, "unreachable": [],
                              **self.status()}
                return result | {"state": RunState.FAILED, "failed_nodes": [n["rank"] for n in bad]}
            if status["state"] not in ALIVE:
                return status
            time.sleep(poll)

    def node_stacks(self, rank: int) -> str:
        """Node `rank`'s ranks' Python stacks now (launch/stacks.py on the node), or why there are none."""
        state, log = node_paths(self.run_dir, rank)
        line = shlex.join([self.spec.python, "-m", "kaiyuan_recipes.launch.stacks", state, log])
        return self._run_in_workdir(rank, f"{line} 2>&1").stdout

    def node_log(self, rank: int, lines: int = 200) -> str:
        """The last `lines` lines of node `rank`'s log."""
        _, log = node_paths(self.run_dir, rank)
        return self._run(rank, in_node(self.spec, f"tail -n {int(lines)} {shlex.quote(log)}"), warn=True).stdout

    def stacks(self) -> str:
        return "".join(f"==> node {rank} ({node.host}) <==\n{self.node_stacks(rank)}"
                       for rank, node in enumerate(self.spec.nodes))

    def logs(self, follow: bool = False, out: TextIO | None = None) -> None:
        """The last 200 lines of each node's log (`follow` is not offered over SSH: each call is one round trip)."""
        out = sys.stdout if out is None else out
        for rank, node in enumerate(self.spec.nodes):
            out.write(f"==> node {rank} ({node.host}) <==\n")
            out.write(self.node_log(rank, 200))
        out.flush()
