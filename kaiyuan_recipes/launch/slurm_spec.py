"""What a Slurm job of a run asks for (SlurmSpec), checked when it is made, so that every value can go where
NeMo-Run's sbatch script puts it: the lowest layer of the Slurm back-end (launch/slurm_executor.py builds the
executor from it, launch/slurm.py runs the job); no NeMo-Run import here, so `kaiyuan status` stays light.

Where each value lands, and why it is checked the way it is:
- `#SBATCH --opt=value` lines (partition, account, time, job name, the sbatch log path): one line each, so a
  newline or other control character is refused (it would add a directive); partition, account and job name
  must be Slurm names and the time one of sbatch's forms.
- the `srun` line (container image, mounts, working directory, node log path): quoted there with shlex
  (compat.nemo_run.quote_srun_arguments), so any other character arrives as given. Pyxis splits
  --container-mounts at commas and each mount at colons, which no quoting changes: those are refused where they
  would split a path.
- over an ssh:// tunnel NeMo-Run itself runs `mkdir -p <dir>` and `sbatch <dir>/...` on the login node with the
  cluster run directory unquoted, so that path is limited to characters the shell reads as themselves.
- `export K=V` lines: V is shell-quoted by the executor; K must be a variable name."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from kaiyuan_recipes.launch.ssh import PASS_THROUGH_ENV, Node

SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
# Partition, account and job names as sbatch takes them unquoted (Slurm's own names use these characters).
SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
PARTITIONS = re.compile(rf"{SLURM_NAME.pattern}(?:,{SLURM_NAME.pattern})*")  # sbatch -p takes a list
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SHELL_PLAIN_PATH = re.compile(r"[A-Za-z0-9_./+=@%-]+")  # read as itself by the shell, unquoted
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def time_limit_seconds(text: str) -> int:
    """sbatch --time in seconds: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch's forms)."""
    match = SLURM_TIME.fullmatch(str(text))
    if not match or str(text) == "0":
        raise ValueError(f"--time {text!r}: expected MM, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]")
    days, a, b, c = (int(g) if g else None for g in match.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return ((days * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    if c is not None:
        return (a * 60 + b) * 60 + c
    return a * 60 + (b or 0)  # MM or MM:SS


def one_line(option: str, value: str) -> str:
    """`value` for a line of the sbatch script: no newline or other control character."""
    if CONTROL.search(value):
        raise ValueError(f"{option} {value!r}: contains a newline or another control character, which would "
                         "end its line of the sbatch script")
    return value


def slurm_name(option: str, value: str, pattern: re.Pattern[str] = SLURM_NAME) -> str:
    one_line(option, value)
    if not pattern.fullmatch(value):
        raise ValueError(f"{option} {value!r}: expected a Slurm name (letters, digits, '_', '.', '+', '-'; "
                         "not starting with '.', '+' or '-')")
    return value


def job_name(run_name: str) -> str:
    """The Slurm job name of a run (#SBATCH --job-name, NeMo-Run's file names): kaiyuan-<run name>."""
    return slurm_name("run name", f"kaiyuan-{run_name}")


def mount_path(option: str, path: str) -> str:
    """A path that goes into a Pyxis mount (SRC:DST, joined with commas): no ':' or ','."""
    one_line(option, path)
    if "," in path or ":" in path:
        raise ValueError(f"{option} {path!r}: Pyxis splits mounts at ',' and ':', so a path with either "
                         "cannot be mounted")
    return path


@dataclass
class SlurmSpec:
    partition: str
    nodes: int = 1
    gpus_per_node: int | None = 8  # asked of Slurm (--gpus-per-node); None on a CPU partition
    nproc_per_node: int | None = None  # ranks per node (torchrun); default: gpus_per_node
    account: str | None = None
    time: str = "04:00:00"
    container_image: str | None = None  # through Pyxis (srun --container-image); None: on the node itself
    container_mounts: list[str] = field(default_factory=list)
    tunnel: str = "local"  # "local" (on the login node) or ssh://[user@]host[:port] (from a laptop)
    identity_file: str | None = None  # the SSH key for an ssh:// tunnel
    cluster_run_dir: str | None = None  # the run directory as the cluster sees it; default: this one's path
    workdir: str | None = None  # the job's working directory (no container); default: where `start` ran
    # (local tunnel) or the cluster run directory (ssh://)
    signal_grace_s: int = 300  # SIGTERM to the ranks this long before the time limit (--signal=TERM@N)
    retries: int = 0  # NeMo-Run requeues a job that failed this many times (TORCHX_MAX_RETRIES)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.partition or self.partition.startswith("-"):
            raise ValueError(f"--slurm {self.partition!r}: expected a partition name")
        slurm_name("--slurm", self.partition, PARTITIONS)
        if self.account is not None:
            slurm_name("--account", self.account)
        one_line("--time", self.time)
        if self.nodes < 1 or (self.ranks_per_node < 1):
            raise ValueError(f"--nodes {self.nodes} / ranks per node {self.ranks_per_node}: expected at least 1 "
                             "(on a CPU partition: --gpus-per-node 0 --nproc-per-node N)")
        if self.signal_grace_s < 0 or self.retries < 0:
            raise ValueError("signal_grace_s and retries: expected >= 0")
        if self.signal_grace_s >= time_limit_seconds(self.time):  # Slurm would signal the ranks at once
            raise ValueError(f"--signal-grace {self.signal_grace_s}: expected fewer seconds than the time limit "
                             f"(--time {self.time})")
        self._check_container()
        for option, value in (("--identity-file", self.identity_file), ("--cluster-run-root", self.cluster_run_dir),
                              ("working directory", self.workdir)):
            if value is not None:
                one_line(option, value)
        self.ssh_node()  # checks an ssh:// tunnel's form
        if self.tunnel != "local":
            if not self.cluster_run_dir:
                raise ValueError(f"--tunnel {self.tunnel}: give --cluster-run-root (the run root on the cluster)")
            if not SHELL_PLAIN_PATH.fullmatch(self.cluster_run_dir):
                raise ValueError(f"--cluster-run-root {self.cluster_run_dir!r}: over an ssh:// tunnel NeMo-Run runs "
                                 "`mkdir -p` and `sbatch` on the login node with this path unquoted; use letters, "
                                 "digits and '_', '.', '/', '+', '=', '@', '%', '-' only")
        for key in PASS_THROUGH_ENV:
            if key in os.environ:
                self.env.setdefault(key, os.environ[key])
        for key in self.env:
            if not ENV_NAME.fullmatch(key):
                raise ValueError(f"environment variable {key!r}: expected a shell variable name")

    def _check_container(self) -> None:
        if self.container_image is not None:
            one_line("--container-image", self.container_image)
            if not self.container_image or self.container_image.startswith("-"):
                raise ValueError(f"--container-image {self.container_image!r}: expected an image (not an option)")
        for mount in self.container_mounts:
            one_line("--container-mount", mount)
            src, sep, rest = mount.partition(":")
            if not (src and sep and rest) or "," in mount:
                raise ValueError(f"--container-mount {mount!r}: expected SRC:DST[:FLAGS] (Pyxis splits mounts at "
                                 "',', so a path with one cannot be mounted)")

    @property
    def ranks_per_node(self) -> int:
        return self.nproc_per_node or self.gpus_per_node or 0

    def ssh_node(self) -> Node | None:
        if self.tunnel == "local":
            return None
        if not self.tunnel.startswith("ssh://"):
            raise ValueError(f"--tunnel {self.tunnel!r}: expected 'local' or ssh://[user@]host[:port]")
        return Node.parse(self.tunnel.removeprefix("ssh://"))
