"""Where a profiled training step's GPU time goes, from a PyTorch profiler (Kineto) Chrome trace: each GPU
activity's kernel family by its name, the time per family, how busy the GPU was, the idle gaps between activities
and the host's launch calls. No Megatron import: profiling.py's summary and benchmarks/peer_profile_report.py both
read traces through this module."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

# Activities that occupy the GPU (copy engines included); Kineto writes memcpy / memset apart from kernels.
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
ATTENTION_KEYS = ("flash", "fmha", "sdpa", "cudnn", "attention")  # cuDNN's SDPA, FA2/FA3, FlexAttention's templates
BACKWARD_KEYS = ("bwd", "bprop", "backward", "dq_dk_dv", "dot_do_o", "convert_dq")
# Kernel families by name, lower-cased (first match wins; a family with a second key list needs one key of each).
# Attention comes before GEMM because FA3's kernels carry "cutlass" in their names; norms, loss and optimizer
# before element-wise because torch.compile names its kernels after the operators it fused (an RMSNorm's
# triton_per_fused_..._rsqrt_... kernel is a norm, a pointwise triton_poi_fused_... kernel is element-wise).
KERNEL_FAMILIES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("communication", ("nccl",), ()),
    ("attention bwd", ATTENTION_KEYS, BACKWARD_KEYS),
    ("attention fwd", ATTENTION_KEYS, ()),
    ("gemm", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "grouped_mm", "tem_fused_mm", "tem_fused_addmm",
              "tem_fused_bmm"), ()),
    ("optimizer", ("adam", "multi_tensor", "foreach"), ()),
    ("loss", ("cross_entropy", "crossentropy", "logsumexp", "log_softmax", "logsoftmax", "nll_loss"), ()),
    ("norms", ("rsqrt", "rms_norm", "rmsnorm", "layer_norm", "layernorm", "gammabeta"), ()),
    ("copy / memset", ("memcpy", "memset", "direct_copy", "batchedcopy", "fillfunctor"), ()),
    ("element-wise", ("elementwise", "triton", "reduce_kernel", "functor", "unrolled", "vectorized", "index",
                      "scatter", "gather"), ()),
    ("other", ("",), ()),
)
FAMILIES = tuple(family for family, _, _ in KERNEL_FAMILIES)


def kernel_family(name: str) -> str:
    lowered = name.lower()
    return next(family for family, keys, also in KERNEL_FAMILIES
                if any(k in lowered for k in keys) and (not also or any(k in lowered for k in also)))


def read_trace_events(trace: Path) -> list[dict]:
    """The trace's events (a .json or .json.gz Chrome trace); an error naming the file when it has none."""
    opener = gzip.open if str(trace).endswith(".gz") else open
    with opener(trace, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"{trace}: not a Chrome trace (no traceEvents list)")
    return events


def spans_of(events: list[dict], categories: tuple[str, ...]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in categories and "dur" in e and "ts" in e]


def busy_share(spans: list[dict]) -> float:
    """Share of the window from the first span's start to the last one's end in which one ran."""
    merged = _merged(spans)
    window = merged[-1][1] - merged[0][0]
    return sum(b - a for a, b in merged) / window if window > 0 else 1.0


def _merged(spans: list[dict]) -> list[tuple[float, float]]:
    """The union of the spans' [ts, ts + dur) as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for a, b in sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def exposed_by_family(spans: list[dict]) -> dict[str, float]:
    """Busy time (us) split among families: where k activities overlap (streams side by side), each gets 1/k of
    that time, so the families add up to the GPU's busy time, not more."""
    edges = sorted([(float(e["ts"]), 1, kernel_family(e["name"])) for e in spans]
                   + [(float(e["ts"]) + float(e["dur"]), -1, kernel_family(e["name"])) for e in spans])
    running: Counter[str] = Counter()
    exposed: dict[str, float] = defaultdict(float)
    last = None
    for t, change, family in edges:
        active = sum(running.values())
        if active and last is not None and t > last:
            for fam, n in running.items():
                if n:
                    exposed[fam] += (t - last) * n / active
        running[family] += change
        last = t
    return dict(exposed)


def profiler_steps(events: list[dict]) -> list[dict]:
    """The host-side ProfilerStep#N spans (one per profiled step), in order."""
    return sorted((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
                   and e.get("cat") != "gpu_user_annotation" and "dur" in e), key=lambda e: float(e["ts"]))


def step_breakdown(events: list[dict], gap_us: float = 10.0, top: int = 15) -> dict[str, Any]:
    """Per profiled step: the step's window (from its first ProfilerStep's start, or the first GPU activity's
    when the trace has none, to the later of the last step's end and the last activity's end), GPU busy time and
    idle, each family's kernel time (summed) and exposed time (overlap split), the idle gaps between activities
    (shorter than `gap_us`: back-to-back launches; longer: the GPU waited on the host or a sync) and the host's
    CUDA calls. Times in ms."""
    gpu = spans_of(events, GPU_CATEGORIES)
    if not gpu:
        raise ValueError("the trace has no GPU activity (kernel, gpu_memcpy, gpu_memset events): was the profiler "
                         "run with CUDA activities on a GPU?")
    steps = profiler_steps(events)
    n = max(len(steps), 1)
    merged = _merged(gpu)
    first, last = merged[0][0], merged[-1][1]
    start = min(float(steps[0]["ts"]), first) if steps else first
    end = max(max(float(s["ts"]) + float(s["dur"]) for s in steps), last) if steps else last
    gaps = [b[0] - a[1] for a, b in zip(merged, merged[1:])]
    busy = sum(b - a for a, b in merged)
    kernel_us: dict[str, float] = defaultdict(float)
    counts: Counter[str] = Counter()
    by_name: dict[str, float] = defaultdict(float)
    calls: Counter[str] = Counter()
    for e in gpu:
        family = kernel_family(e["name"])
        kernel_us[family] += float(e["dur"])
        counts[family] += 1
        by_name[e["name"]] += float(e["dur"])
        calls[e["name"]] += 1
    exposed = exposed_by_family(gpu)
    runtime = spans_of(events, RUNTIME_CATEGORIES)

    def per_step_ms(us: float) -> float:
        return us / n / 1e3

    def calls_named(*keys: str) -> float:
        return sum(1 for e in runtime if any(k in e["name"] for k in keys)) / n

    short = [g for g in gaps if g < gap_us]
    long = sorted((g for g in gaps if g >= gap_us), reverse=True)
    return {
        "profiled_steps": [s["name"] for s in steps],
        "step_ms": per_step_ms(end - start),
        "gpu_busy_ms": per_step_ms(busy),
        "gpu_busy_share": busy / (end - start),
        "gpu_idle_ms": per_step_ms(end - start - busy),
        "families": {f: {"exposed_ms": per_step_ms(exposed.get(f, 0.0)), "kernel_ms": per_step_ms(kernel_us[f]),
                         "count": counts[f] / n} for f in FAMILIES if counts[f]},
        "idle": {"before_first_activity_ms": per_step_ms(first - start), "after_last_activity_ms": per_step_ms(
                     end - last),
                 "gap_threshold_us": gap_us,
                 "short_gaps": {"count": len(short) / n, "ms": per_step_ms(sum(short))},
                 "long_gaps": {"count": len(long) / n, "ms": per_step_ms(sum(long)),
                               "largest_ms": [g / 1e3 for g in long[:5]]}},
        "host": {"gpu_activities": len(gpu) / n, "kernels": sum(1 for e in gpu if e["cat"] == "kernel") / n,
                 "mean_activity_us": sum(float(e["dur"]) for e in gpu) / len(gpu),
                 "kernel_launch_calls": calls_named("LaunchKernel", "cuLaunch"),
                 "graph_launch_calls": calls_named("GraphLaunch"),
                 "sync_calls": calls_named("Synchronize"),
                 "cuda_api_ms": per_step_ms(sum(float(e["dur"]) for e in runtime)),
                 "cpu_ops": sum(1 for e in events if e.get("cat") == "cpu_op") / n},
        "top_kernels": [{"name": name, "ms": per_step_ms(us), "calls": calls[name] / n, "family": kernel_family(name)}
                        for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]],
    }
