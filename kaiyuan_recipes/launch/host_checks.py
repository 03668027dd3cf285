"""What `kaiyuan start` and `kaiyuan train` refuse about this host and the run directory before a run is claimed,
without torch: training needs a CUDA GPU here, and a run directory belongs to one recipe."""

from __future__ import annotations

import os
from pathlib import Path

from kaiyuan_recipes.config.plan_file import PlanFileError, read_plan
from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.launch.run_records import RunStateError, read_command

# Set to 1 to launch where no GPU is visible (a test whose ranks stand in for training on the CPU).
ALLOW_NO_GPU_ENV = "KAIYUAN_ALLOW_NO_GPU"


class HostCheckError(ValueError):
    pass


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, as the driver and CUDA_VISIBLE_DEVICES say (torch is not imported)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "NoDevFiles"):
        return 0
    driver = Path("/proc/driver/nvidia/gpus")
    count = len(list(driver.iterdir())) if driver.is_dir() else 0
    if not count:
        count = len([p for p in Path("/dev").glob("nvidia[0-9]*")])
    if visible is not None and count:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count


def require_gpus(nproc_per_node: int) -> None:
    if os.environ.get(ALLOW_NO_GPU_ENV) == "1":
        return
    found = visible_gpus()
    if found == 0:
        raise HostCheckError("training needs a CUDA GPU and this host has none visible (no NVIDIA driver devices, "
                             "or CUDA_VISIBLE_DEVICES hides them); `kaiyuan train RECIPE --dry-run` checks a run "
                             "without one, `kaiyuan doctor` says what this host can do")
    if nproc_per_node > found:
        raise HostCheckError(f"--nproc-per-node {nproc_per_node}: this host has {found} GPU(s) visible")


def recorded_recipe(run_dir: Path) -> str | None:
    """The recipe the run directory was last launched with (its plan, else its launch record); None if new."""
    layout = RunLayout(Path(run_dir))
    try:
        plan = read_plan(layout.run_dir)
    except PlanFileError:
        plan = None
    if plan is not None and isinstance(plan.get("recipe"), str):
        return plan["recipe"]
    try:
        recipe = read_command(layout).get("recipe")
    except RunStateError:
        return None  # a damaged record: the claim that follows reports it
    return recipe if isinstance(recipe, str) else None


def refuse_another_recipes_run(run_dir: Path, recipe: str) -> None:
    """A restart resumes from the run's checkpoints: those of another recipe (another model shape) cannot load."""
    before = recorded_recipe(run_dir)
    if before is not None and before != recipe:
        raise HostCheckError(f"run directory {run_dir} belongs to recipe {before!r}, not {recipe!r}: its checkpoints "
                             f"are that model's; choose another run name (or kaiyuan.run_root)")
