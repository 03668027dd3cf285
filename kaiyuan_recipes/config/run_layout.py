"""The run directory: every path inside <run_root>/<run_name>/, named once.

Training, the launch back-ends, status, plots and export all find a run's files through this module. It
imports nothing heavy (the core must import without torch): training writes metrics.jsonl and the launch
back-ends read it through read_metrics here, so neither imports the other for it."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_DIR = "run_state"
# What a supervisor keeps in the state folder it is given: the run's run_state/, or on each node of a
# multi-node run, run_state/nodes/<rank>/ (launch/supervise.py).
IDENTITY_FILE = "supervisor.json"  # the supervisor's ProcessIdentity
EXIT_FILE = "exit.json"
CHILD_PID_FILE = "child.pid"
METRICS_FILE = "metrics.jsonl"  # training.metrics.RunMetricsCallback writes it into the run's state folder
STOP_FILE = "stop.json"  # a stop was asked for (kaiyuan stop, or a SIGTERM to a foreground `kaiyuan train`)
STOP_LOCK_FILE = "stop.lock"  # held by the `kaiyuan stop` under way, from its SIGTERM to its result
PHASE_FILE = "phase.json"  # what the run is doing now (training/run_phase.py): setting up: ..., training, saving
# Megatron's checkpoint folder: one iter_NNNNNNN/ per save, each with the config it was trained with.
LATEST_ITERATION_FILE = "latest_checkpointed_iteration.txt"
RUN_CONFIG_FILE = "run_config.yaml"
PLAN_FILE = "plan.json"  # the run's resolved plan, written once per launch by rank 0 (config/plan_file.py)
# profile.enabled=true: Megatron-Bridge writes rank-R.json.gz into <run>/PROFILE_DIR (training/profiling.py)
PROFILE_DIR = "torch_profile"
ITER_DIR = re.compile(r"^iter_(\d+)$")  # one save: iter_NNNNNNN/
MAX_ITERATION_DIGITS = 18  # an int64 iteration count (Bridge's) has at most 19 digits; 18 stays far from Python's limit


class CheckpointError(ValueError):
    """A path that is not what the command needs; the message names the path and what was expected."""


@dataclass(frozen=True)
class RunLayout:
    run_dir: Path

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.run_dir / "tb_logs"

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def console_log(self) -> Path:
        return self.logs / "console.log"

    @property
    def heldout_eval(self) -> Path:
        """kaiyuan.heldout_eval's per-sample results, one iter_NNNNNNN.json per evaluation."""
        return self.run_dir / "heldout_eval"

    @property
    def dataset_cache(self) -> Path:
        return self.run_dir / "dataset_cache"

    def make_dirs(self) -> None:
        """The folders a launch writes into (checkpoints, TensorBoard, logs, run_state)."""
        for path in (self.checkpoints, self.tensorboard, self.logs, self.state):
            path.mkdir(parents=True, exist_ok=True)

    @property
    def state(self) -> Path:
        """Launch state: the supervisor's identity, the command, exit.json (run_state/)."""
        return self.run_dir / STATE_DIR

    @property
    def supervisor_identity(self) -> Path:
        return self.state / IDENTITY_FILE

    @property
    def legacy_supervisor_pid(self) -> Path:
        """What versions before the recorded identity wrote instead (a bare PID)."""
        return self.state / "supervisor.pid"

    @property
    def exit_record(self) -> Path:
        return self.state / EXIT_FILE

    @property
    def child_pid(self) -> Path:
        return self.state / CHILD_PID_FILE

    @property
    def command(self) -> Path:
        """The exact command of a detached run, its recorded environment, the recipe and train_iters."""
        return self.state / "command.json"

    @property
    def plan(self) -> Path:
        """The resolved plan the ranks train with (config/plan_file.py)."""
        return self.state / PLAN_FILE

    @property
    def plan_container(self) -> Path:
        """The plan's ConfigContainer in Megatron-Bridge's run_config.yaml form: what the other ranks load."""
        return self.state / RUN_CONFIG_FILE

    @property
    def metrics(self) -> Path:
        return self.state / METRICS_FILE

    @property
    def phase(self) -> Path:
        return self.state / PHASE_FILE

    @property
    def multinode_state(self) -> Path:
        """Present exactly when the run was started on several nodes over SSH."""
        return self.state / "multinode.json"

    @property
    def slurm_state(self) -> Path:
        """Present exactly when the run was submitted to Slurm (launch/slurm.py): the spec and the job id."""
        return self.state / "slurm.json"

    @property
    def stop_request(self) -> Path:
        return self.state / STOP_FILE

    @property
    def stop_lock(self) -> Path:
        return self.state / STOP_LOCK_FILE

    @property
    def nemo_run_role(self) -> Path:
        """The NeMo-Run role name a run scheduled through kaiyuan_ssh was given (its job dir is the run dir)."""
        return self.run_dir / "role_name"

    def node_state(self, rank: int) -> Path:
        return self.state / "nodes" / str(rank)

    def node_log(self, rank: int | str) -> Path:
        """Node `rank`'s console log (a str: a pattern Slurm fills in, srun's %n)."""
        return self.logs / f"node{rank}.log"

    @staticmethod
    def run_dirs_under(run_root: Path) -> list[Path]:
        """The run directories under `run_root` that have launch state."""
        return sorted(p.parent for p in Path(run_root).glob(f"*/{STATE_DIR}"))

    @staticmethod
    def iteration_dir(checkpoints: Path, iteration: int) -> Path:
        return Path(checkpoints) / f"iter_{int(iteration):07d}"

    @staticmethod
    def latest_iteration_dir(checkpoints: Path) -> Path | None:
        """The iter_* folder Megatron's tracker file names as the newest save (None without a readable tracker;
        the folder itself may be missing)."""
        iteration = tracker_iteration(checkpoints)
        return None if iteration is None else RunLayout.iteration_dir(checkpoints, iteration)


# Where a run's saves are and which one is the newest, decided here for `kaiyuan ckpt`, average, export and status.
def iteration_of(path: Path) -> int | None:
    """The iteration an iter_NNNNNNN directory holds (None for any other name)."""
    m = ITER_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def checkpoint_root(path: Path) -> Path:
    """A run directory, its checkpoints/ folder or one iter_* in it, as the folder that holds iter_* directories."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: does not exist")
    if iteration_of(path) is not None:
        root = path.parent
    else:
        checkpoints = RunLayout(path).checkpoints
        root = checkpoints if checkpoints.is_dir() else path
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory (expected a run directory or its checkpoints/ folder)")
    return root


def iteration_dirs(root: Path) -> list[Path]:
    """The iter_* directories under a checkpoints folder, oldest first (by iteration number, as Bridge sorts). A
    symbolic link named iter_* is not one: what it points at is not this run's save."""
    found = [p for p in Path(root).iterdir() if p.is_dir() and not p.is_symlink() and iteration_of(p) is not None]
    return sorted(found, key=iteration_of)


def tracker_iteration(root: Path) -> int | None:
    """The iteration latest_checkpointed_iteration.txt names (None when absent; 'release' is not an iteration)."""
    tracker = Path(root) / LATEST_ITERATION_FILE
    text = tracker.read_text(errors="replace").strip() if tracker.is_file() else ""
    if not (text.isascii() and text.isdigit()):
        return None
    if len(text) > MAX_ITERATION_DIGITS:
        raise CheckpointError(f"{tracker}: a number of {len(text):,} digits, not an iteration (a damaged tracker "
                              "file: write the iteration to resume from, or remove it)")
    return int(text)


def newest_iteration_dir(root: Path) -> Path | None:
    """The save under a checkpoints folder a resume loads: the one the tracker file names, else the highest-numbered
    (None when there is no save)."""
    saves = iteration_dirs(root)
    if not saves:
        return None
    named = tracker_iteration(root)
    return next((p for p in saves if iteration_of(p) == named), saves[-1])


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float as the string "nan", "inf" or "-inf": JSON has no NaN, and a NaN loss
    is worth keeping as what it was (not as a missing value)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def dumps_record(value: Any, **kwargs: Any) -> str:
    """Strict JSON of `value` (json_safe first), as metrics.jsonl and `kaiyuan status` write it."""
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)


def read_metrics(state_dir: Path) -> list[dict[str, Any]]:
    """The records of <state_dir>/metrics.jsonl, oldest first ([] before the first one). A line that is not a
    JSON object (cut short by a kill, damaged) is skipped; the rest are intact."""
    path = Path(state_dir) / METRICS_FILE
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def is_megatron_checkpoint(path: Path) -> bool:
    """A run directory, its checkpoints/ folder or one iter_NNNNNNN/ save (not a Hugging Face directory)."""
    path = Path(path)
    return not (path / "config.json").is_file() and (
        RunLayout(path).checkpoints.is_dir() or path.name.startswith("iter_")
        or (path / LATEST_ITERATION_FILE).is_file())


def require_model_dir(path: Path, option: str = "model") -> Path:
    """A model a command can load: a Hugging Face directory (config.json) or a Megatron run / checkpoint. Anything
    else is refused naming it, before torch or the model's libraries are imported."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{option} {path}: no such file or directory")
    if not path.is_dir() or not ((path / "config.json").is_file() or is_megatron_checkpoint(path)):
        raise FileNotFoundError(f"{option} {path}: neither a Hugging Face model directory (config.json) nor a "
                                f"Megatron run or checkpoint (checkpoints/, iter_NNNNNNN/ or {LATEST_ITERATION_FILE})")
    return path
