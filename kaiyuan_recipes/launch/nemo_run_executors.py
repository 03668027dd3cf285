"""NeMo-Run executors for kaiyuan runs, usable in `run.Experiment` / `run.run` with NeMo-Run's own
status, logs and cancel:

- `local_executor(n)`: NeMo-Run's LocalExecutor with its torchrun launcher (N processes on this node);
- `SSHMultiNodeExecutor(hosts=[…])`: one torchrun per host over SSH (optionally `docker exec` into a
  same-named container), driven by kaiyuan_recipes.launch.ssh through a torchx scheduler registered as
  `kaiyuan_ssh` in the `torchx.schedulers` entry-point group.

`training_script(recipe, overrides)` is the task: the training entry module as a NeMo-Run Script."""

import base64
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, List, Optional, Union

import nemo_run as run
from nemo_run.core.execution.base import Executor
from nemo_run.run.torchx_backend.schedulers import api as nemo_run_schedulers
from torchx.schedulers.api import AppDryRunInfo, DescribeAppResponse, ListAppResponse, Scheduler, Stream
from torchx.specs import AppDef, AppState, Role

from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.launch.ssh import MultiNodeRun, MultiNodeSpec
from kaiyuan_recipes.launch.torchrun import ENTRY_MODULE
from kaiyuan_recipes.run_states import RunState

SCHEDULER = "kaiyuan_ssh"


def training_script(recipe: str, overrides: list[str] | None = None) -> run.Script:
    return run.Script(path=ENTRY_MODULE, args=[recipe, *(overrides or [])], m=True, entrypoint="python")


def local_executor(nproc_per_node: int = 1, env_vars: dict[str, str] | None = None) -> run.LocalExecutor:
    return run.LocalExecutor(ntasks_per_node=nproc_per_node, launcher="torchrun", env_vars=env_vars or {})


@dataclass(kw_only=True)
class SSHMultiNodeExecutor(Executor):
    # A list, or one string of hosts separated by commas/spaces (what NeMo-Run's CLI can pass).
    hosts: Union[str, List[str]] = field(default_factory=list)
    gpus_per_node: int = 8
    master_port: int = 29500
    container: Optional[str] = None
    workdir: str = field(default_factory=os.getcwd)
    python: str = "python"
    identity_file: Optional[str] = None
    known_hosts: Optional[str] = None
    accept_unknown_hosts: bool = False
    stop_grace_s: float = 300.0

    def assign(self, exp_id: str, exp_dir: str, task_id: str, task_dir: str) -> None:
        self.experiment_id = exp_id
        self.experiment_dir = exp_dir
        self.job_dir = os.path.join(exp_dir, task_dir)

    def host_list(self) -> List[str]:
        return self.hosts.replace(",", " ").split() if isinstance(self.hosts, str) else list(self.hosts)

    def nnodes(self) -> int:
        return len(self.host_list())

    def nproc_per_node(self) -> int:
        return self.gpus_per_node

    def spec(self) -> MultiNodeSpec:
        return MultiNodeSpec(nodes=self.host_list(), nproc_per_node=self.gpus_per_node, master_port=self.master_port,
                             container=self.container, workdir=self.workdir, python=self.python,
                             env=dict(self.env_vars), identity_file=self.identity_file, known_hosts=self.known_hosts,
                             accept_unknown_hosts=self.accept_unknown_hosts)


def _register_with_nemo_run() -> None:
    """nemo-run 0.11 keys executor support by class (scheduler name maps, the executors an Experiment may
    run in parallel / detached) and has no API to extend those; the scheduler itself is found through the
    `torchx.schedulers` entry point. A multi-node job lives on its nodes, so it can be detached from."""
    from nemo_run.run.experiment import Experiment

    nemo_run_schedulers.EXECUTOR_MAPPING[SSHMultiNodeExecutor] = SCHEDULER
    nemo_run_schedulers.REVERSE_EXECUTOR_MAPPING[SCHEDULER] = SSHMultiNodeExecutor
    for attr in ("_PARALLEL_SUPPORTED_EXECUTORS", "_DETACH_SUPPORTED_EXECUTORS"):
        if SSHMultiNodeExecutor not in getattr(Experiment, attr):
            setattr(Experiment, attr, (*getattr(Experiment, attr), SSHMultiNodeExecutor))


_register_with_nemo_run()

def app_id_for(run_dir: Path) -> str:
    """torchx app handles are `scheduler://session/app_id`: the run directory, encoded without slashes."""
    return base64.urlsafe_b64encode(str(Path(run_dir).resolve()).encode()).decode().rstrip("=")


def run_dir_of(app_id: str) -> Path:
    return Path(base64.urlsafe_b64decode(app_id + "=" * (-len(app_id) % 4)).decode())


_STATES = {RunState.RUNNING: AppState.RUNNING, RunState.FINISHED: AppState.SUCCEEDED,
           RunState.STOPPED: AppState.CANCELLED, RunState.FAILED: AppState.FAILED}


def torchrun_target(role: Role) -> list[str]:
    """What torchrun runs for a NeMo-Run role: `python -m mod …` / `python script.py …` → `-m mod …` / `script.py …`."""
    if Path(role.entrypoint).name.startswith("python"):
        return list(role.args)
    if role.entrypoint.endswith(".py"):
        return [role.entrypoint, *role.args]
    raise ValueError(f"{SCHEDULER}: runs Python tasks under torchrun; got entrypoint {role.entrypoint!r} "
                     "(use run.Script(path=module, m=True, entrypoint='python'))")


class SSHMultiNodeScheduler(nemo_run_schedulers.SchedulerMixin, Scheduler[dict]):  # type: ignore[misc]
    def __init__(self, session_name: str, **_: Any) -> None:
        super().__init__(SCHEDULER, session_name)

    def _submit_dryrun(self, app: AppDef, cfg: Any) -> AppDryRunInfo:
        if not isinstance(cfg, SSHMultiNodeExecutor):
            raise TypeError(f"{SCHEDULER}: needs an SSHMultiNodeExecutor, got {type(cfg).__name__}")
        if len(app.roles) != 1:
            raise ValueError(f"{SCHEDULER}: one role per job, got {len(app.roles)}")
        role = app.roles[0]
        executor = cfg
        request = {"run_dir": executor.job_dir, "role": role.name, "target": torchrun_target(role),
                   "spec": executor.spec(), "grace": executor.stop_grace_s}
        hosts = ", ".join(executor.host_list())
        return AppDryRunInfo(request, lambda r: f"torchrun {' '.join(r['target'])} on {hosts}")

    def schedule(self, dryrun_info: AppDryRunInfo) -> str:
        request = dryrun_info.request
        run_dir = Path(request["run_dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        RunLayout(run_dir).nemo_run_role.write_text(request["role"])
        MultiNodeRun(run_dir, request["spec"]).start(request["target"])
        return app_id_for(run_dir)

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        layout = RunLayout(run_dir_of(app_id))
        if not layout.multinode_state.is_file():
            return None
        status = MultiNodeRun(layout.run_dir).status()
        role = layout.nemo_run_role.read_text() if layout.nemo_run_role.is_file() else "main"
        return DescribeAppResponse(app_id=app_id, state=_STATES.get(status["state"], AppState.UNKNOWN),
                                   roles=[Role(name=role, image="", num_replicas=len(status["nodes"]))],
                                   msg=str(status["nodes"]))

    def list(self) -> list[ListAppResponse]:
        return []

    def _cancel_existing(self, app_id: str) -> None:
        MultiNodeRun(run_dir_of(app_id)).stop(grace=300.0)

    def log_iter(self, app_id: str, role_name: str, k: int = 0, regex: Optional[str] = None,
                 since: Optional[datetime] = None, until: Optional[datetime] = None, should_tail: bool = False,
                 streams: Optional[Stream] = None) -> Iterable[str]:
        import re

        lines = MultiNodeRun(run_dir_of(app_id)).node_log(k, 100000).splitlines()
        return [line for line in lines if not regex or re.search(regex, line)]


def create_scheduler(session_name: str, **kwargs: Any) -> SSHMultiNodeScheduler:
    return SSHMultiNodeScheduler(session_name, **kwargs)
