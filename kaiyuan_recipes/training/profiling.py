"""`profile.enabled=true profile.steps=[N,M]`: Megatron-Bridge's PyTorch profiler over iterations N..M (as
Megatron's log numbers them, both included; ProfilerStep#N..#M in the trace) on the listed ranks (a Chrome /
Perfetto trace at <run>/torch_profile/rank-R.json.gz, written by upstream) with megatron-core's NVTX ranges
on, so an `nsys` capture lines up with the steps; and a short text summary of the trace's top kernels
(<run>/torch_profile/summary-rank-R.txt)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from kaiyuan_recipes.compat.bridge_api import Callback
from kaiyuan_recipes.config.run_layout import PROFILE_DIR  # upstream's: <tensorboard_dir>/../torch_profile
from kaiyuan_recipes.training.trace_breakdown import busy_share, kernel_family, read_trace_events


def profiling_config(section: dict[str, Any]) -> Any | None:
    """The ProfilingConfig for the recipe tree's `profile` section, or None when it is off."""
    if not section.get("enabled", False):
        return None
    steps = list(section.get("steps") or [])
    if len(steps) != 2 or not all(isinstance(s, int) for s in steps) or not 1 <= steps[0] <= steps[1]:
        raise ValueError(f"profile.steps: expected [N, M] with 1 <= N <= M (iterations, both profiled), "
                         f"got {section.get('steps')!r}")
    from megatron.bridge.training.config import ProfilingConfig

    # Upstream's window is [start, end) in logged iterations, exported when iteration `end` begins.
    return ProfilingConfig(use_pytorch_profiler=True, profile_step_start=steps[0], profile_step_end=steps[1] + 1,
                           profile_ranks=list(section.get("ranks", [0])), nvtx_ranges=True,
                           pytorch_profiler_collect_shapes=bool(section.get("record_shapes", False)))


def profiled_iterations(config: Any) -> tuple[int, int]:
    """profile.steps' [N, M] back from upstream's ProfilingConfig (whose end is exclusive)."""
    return config.profile_step_start, config.profile_step_end - 1


def summarize_trace(trace: Path, top: int = 15) -> str:
    """Total time per name over the trace's GPU kernels (CPU operators when it has no kernels), largest
    first, with the share of the total and the call count; for kernels also the time per kernel family and
    how busy the GPU was (a low share means launch- or host-bound steps)."""
    events = read_trace_events(trace)
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in spans if e.get("cat") == "kernel"]
    chosen, kind = (kernels, "GPU kernels") if kernels else ([e for e in spans if e.get("cat") == "cpu_op"],
                                                               "CPU operators")
    total_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in chosen:
        total_us[e["name"]] += float(e["dur"])
        calls[e["name"]] += 1
    grand = sum(total_us.values()) or 1.0
    lines = [f"{trace.name}: top {top} {kind} by total time ({grand / 1e3:.1f} ms in {len(chosen)} events)",
             f"{'total ms':>10} {'share':>6} {'calls':>7}  name"]
    for name, us in sorted(total_us.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{us / 1e3:10.2f} {100 * us / grand:5.1f}% {calls[name]:7d}  {name[:110]}")
    if kernels and all("ts" in e for e in kernels):
        families: dict[str, float] = defaultdict(float)
        for name, us in total_us.items():
            families[kernel_family(name)] += us
        lines.append(f"by family (GPU busy {100 * busy_share(kernels):.1f}% of the profiled window):")
        lines += [f"{us / 1e3:10.2f} {100 * us / grand:5.1f}%  {family}"
                  for family, us in sorted(families.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines) + "\n"


def write_summaries(run_dir: Path) -> list[Path]:
    written = []
    for trace in sorted((Path(run_dir) / PROFILE_DIR).glob("rank-*.json*")):
        rank = trace.name.split(".")[0]
        out = trace.parent / f"summary-{rank}.txt"
        out.write_text(summarize_trace(trace))
        written.append(out)
    return written


class ProfileSummaryCallback(Callback):
    """Writes the summaries once upstream has exported the trace: when iteration M + 1 begins, which callbacks
    see as train_state.step == M (the step before its increment)."""

    def __init__(self, run_dir: Path, profiling: Any):
        self.run_dir, self.export_step, self.done = Path(run_dir), profiled_iterations(profiling)[1], False

    def on_train_step_end(self, context: Any) -> None:
        if not self.done and context.state.train_state.step >= self.export_step:
            written = write_summaries(self.run_dir)
            for path in written:
                print(path.read_text(), flush=True)
            self.done = bool(written)
