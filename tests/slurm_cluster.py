"""A real one-node Slurm for the tests: munge, MariaDB, slurmdbd, slurmctld and slurmd from Debian 12's packages
(slurm-wlm 22.05), each started here in a private folder on loopback with its own ports, torn down after.

CPU only: no cgroup plugins (proctrack/linuxproc, task/none), so it runs inside a container without systemd;
the node declares more CPUs than the host has (config_overrides), so a few one-CPU test jobs run side by side.
sacct needs the accounting database, hence MariaDB + slurmdbd. Every wait is bounded and names what it waited for.
The daemons run as root (SlurmUser=root): the tests need root to install the packages anyway (make test-services).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd", "sbatch", "sacct")
PARTITION = "ci"
NODE_CPUS = 8


class SlurmClusterError(RuntimeError):
    pass


@pytest.fixture(scope="module", autouse=True)
def devnull_stdin():
    """NeMo-Run runs local commands through invoke, which reads stdin; pytest's stand-in stdin raises on a read."""
    stdin, sys.stdin = sys.stdin, open(os.devnull)
    yield
    sys.stdin.close()
    sys.stdin = stdin


def missing_programs() -> list[str]:
    return [p for p in DAEMONS if not (shutil.which(p) or Path("/usr/sbin", p).exists())]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, check, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-2000:] if log is not None and log.is_file() else ""
    raise SlurmClusterError(f"{what}: not ready after {timeout:g}s\n{tail}")


@dataclass
class SlurmCluster:
    root: Path
    node: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client (sbatch, sacct, NeMo-Run's LocalTunnel) needs to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _sbin(self, name: str) -> str:
        return shutil.which(name) or str(Path("/usr/sbin", name))

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen:
        out = open(log, "ab")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=os.environ | self.env, start_new_session=True)
        out.close()
        self.procs.append(proc)
        return proc

    def _run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=os.environ | self.env)

    # -- bring-up -------------------------------------------------------------------------------------------
    def start(self, timeout: float = 90) -> "SlurmCluster":
        for sub in ("etc", "munge", "db", "spool", "state", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        try:
            self._start_munge(timeout)
            db_port = self._start_mariadb(timeout)
            dbd_port = self._start_slurmdbd(db_port, timeout)
            self._start_slurm(dbd_port, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self, timeout: float) -> None:
        key, sock = self.root / "munge" / "munge.key", self.root / "munge" / "munge.sock"
        self._run(["mungekey", "--create", "--keyfile", str(key)]).check_returncode()
        key.chmod(0o400)
        (self.root / "munge").chmod(0o700)
        self._spawn([self._sbin("munged"), "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                     f"--pid-file={self.root / 'munge' / 'munged.pid'}", f"--seed-file={self.root / 'munge' / 'seed'}",
                     f"--log-file={self.root / 'log' / 'munged.log'}"], self.root / "log" / "munged.out")
        wait_until("munged", sock.exists, timeout, self.root / "log" / "munged.log")

    def _start_mariadb(self, timeout: float) -> int:
        db, sock, port, log = self.root / "db", self.root / "db.sock", free_port(), self.root / "log" / "mariadb.log"
        res = self._run(["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={db}",
                         "--auth-root-authentication-method=socket", "--skip-test-db"], timeout=timeout)
        if res.returncode:
            raise SlurmClusterError(f"mariadb-install-db failed: {res.stdout[-1000:]}{res.stderr[-1000:]}")
        self._spawn([self._sbin("mariadbd"), "--no-defaults", "--user=root", f"--datadir={db}", f"--socket={sock}",
                     f"--port={port}", "--bind-address=127.0.0.1", f"--pid-file={self.root / 'db.pid'}",
                     "--skip-name-resolve", "--innodb-buffer-pool-size=32M"], log)
        wait_until("mariadbd", sock.exists, timeout, log)
        sql = ("CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm-ci'; "
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;")
        res = self._run(["mariadb", "--no-defaults", f"--socket={sock}", "-u", "root", "-e", sql])
        if res.returncode:
            raise SlurmClusterError(f"creating the accounting user failed: {res.stderr[-1000:]}")
        return port

    def _auth_lines(self) -> str:
        return f"AuthType=auth/munge\nAuthInfo=socket={self.root / 'munge' / 'munge.sock'}\n"

    def _start_slurmdbd(self, db_port: int, timeout: float) -> int:
        port, log = free_port(), self.root / "log" / "slurmdbd.log"
        conf = self.root / "etc" / "slurmdbd.conf"
        conf.write_text(self._auth_lines() + f"""DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={port}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=slurm
StoragePass=slurm-ci
StorageLoc=slurm_acct_db
PidFile={self.root / 'slurmdbd.pid'}
LogFile={log}
DebugLevel=info
""")
        conf.chmod(0o600)
        self._spawn([self._sbin("slurmdbd"), "-D"], self.root / "log" / "slurmdbd.out")

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until("slurmdbd", listening, timeout, log)
        return port

    def _start_slurm(self, dbd_port: int, timeout: float) -> None:
        self.conf.write_text(self._auth_lines() + f"""ClusterName=kaiyuan-ci
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={self.root / 'state'}
SlurmdSpoolDir={self.root / 'spool'}
SlurmctldPidFile={self.root / 'slurmctld.pid'}
SlurmdPidFile={self.root / 'slurmd.pid'}
SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}
SlurmdLogFile={self.root / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={dbd_port}
AccountingStoragePass={self.root / 'munge' / 'munge.sock'}
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=10
MinJobAge=60
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory=4000 State=UNKNOWN
PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        self._spawn([self._sbin("slurmctld"), "-D", "-c", "-i"], self.root / "log" / "slurmctld.out")
        self._spawn([self._sbin("slurmd"), "-D", "-N", self.node], self.root / "log" / "slurmd.out")
        wait_until(f"node {self.node} idle in sinfo", lambda: self._run(
            ["sinfo", "-h", "-N", "-n", self.node, "-o", "%T"], timeout=10).stdout.strip() == "idle",
            timeout, self.root / "log" / "slurmctld.log")
        wait_until("sacct (slurmctld registered with slurmdbd)",
                   lambda: self._run(["sacct", "-n", "-X"], timeout=10).returncode == 0, timeout,
                   self.root / "log" / "slurmdbd.log")

    # -- tear-down ------------------------------------------------------------------------------------------
    def cancel_jobs(self, timeout: float = 40) -> None:
        """Cancel every job of this cluster and wait until none is left: a job's slurmstepd and ranks would
        outlive slurmd."""
        jobs = self._run(["squeue", "-h", "-o", "%A"], timeout=10).stdout.split()
        if jobs:
            self._run(["scancel", *jobs], timeout=10)
            wait_until("every job gone from squeue", lambda: not self._run(
                ["squeue", "-h", "-o", "%A"], timeout=10).stdout.split(), timeout, self.root / "log" / "slurmd.log")

    def stop(self) -> None:
        """Every job cancelled, then every daemon this cluster started, newest first: SIGTERM, then SIGKILL
        after 15 s."""
        if self.procs and all(proc.poll() is None for proc in self.procs):
            try:
                self.cancel_jobs()
            except (SlurmClusterError, subprocess.TimeoutExpired) as err:
                print(f"slurm_cluster: {err}", flush=True)  # the daemons are stopped regardless
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self.procs.clear()
