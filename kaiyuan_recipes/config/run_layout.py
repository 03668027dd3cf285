"""The run directory: every path inside <run_root>/<run_name>/, named once.

Training, the launch back-ends, status, plots and export all find a run's files through this module. It
imports nothing heavy (the core must import without torch): training writes metrics.jsonl and the launch
back-ends read it through read_metrics here, so neither imports the other for it."""

from __future__ import annotations

import json
import math
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
    def checkpoint_root(path: Path) -> Path:
        """A run directory or its checkpoints/ folder, as the checkpoints folder (anything else as given)."""
        path = Path(path)
        checkpoints = RunLayout(path).checkpoints
        return checkpoints if checkpoints.is_dir() else path

    @staticmethod
    def iteration_dir(checkpoints: Path, iteration: int) -> Path:
        return Path(checkpoints) / f"iter_{int(iteration):07d}"

    @staticmethod
    def latest_iteration_dir(checkpoints: Path) -> Path | None:
        """The iter_* folder Megatron's tracker file names as the newest save (None without a readable tracker;
        the folder itself may be missing)."""
        tracker = Path(checkpoints) / LATEST_ITERATION_FILE
        if not tracker.is_file() or not tracker.read_text().strip().isdigit():
            return None
        return RunLayout.iteration_dir(checkpoints, int(tracker.read_text().strip()))


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
