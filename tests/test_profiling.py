"""profile.enabled=true profile.steps=[N,M]: the override reaches Megatron-Bridge's ProfilingConfig (PyTorch
profiler on rank 0, NVTX ranges on); upstream's profiler, driven in its training loop's order around real
megatron-core layer steps on the CPU, writes the Chrome trace in the run directory, and our summary lists
the operators that ran."""

import gzip
import json
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_gpt_shape

from kaiyuan_recipes.config.overrides import OverrideError
from kaiyuan_recipes.training.config import build_config


def test_profile_overrides_reach_bridge(tmp_path):
    cfg, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "profile.enabled=true",
                                          "profile.steps=[3,5]"])
    p = cfg.profiling
    assert p.use_pytorch_profiler and not p.use_nsys_profiler and p.nvtx_ranges
    assert (p.profile_step_start, p.profile_step_end, p.profile_ranks) == (3, 6, [0])  # upstream's end: exclusive
    off, _ = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}"])
    assert not off.profiling.use_pytorch_profiler
    with pytest.raises(ValueError, match=r"profile.steps: expected \[N, M\]"):
        build_config("gpt_smoke", ["profile.enabled=true", "profile.steps=[5,3]"])
    with pytest.raises(OverrideError, match="profile.stepz"):
        build_config("gpt_smoke", ["profile.stepz=[1,2]"])


def _context(step: int):
    return SimpleNamespace(state=SimpleNamespace(train_state=SimpleNamespace(step=step)))


@pytest.mark.parametrize("train_iters", [6, 5])
def test_trace_written_in_run_dir_with_the_ops_that_ran(tmp_path, megatron_parallel, train_iters):
    """Upstream's profiler and our summary callback, called in megatron.bridge.training.train.train's order:
    profile.steps=[2,4] profiles iterations 2, 3 and 4 as Megatron's log numbers them (ProfilerStep#2..#4),
    and the summary appears in the iteration that begins with the export (5), also when it is the last one.
    (On the GPU host, profile.steps=[6,7] with 8 iterations once wrote no summary: the callback looked one step
    late.)"""
    from megatron.bridge.training.profiling import (
        handle_profiling_step,
        handle_profiling_stop,
        initialize_pytorch_profiler,
    )

    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu
    from kaiyuan_recipes.training.profiling import ProfileSummaryCallback

    cfg, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "profile.enabled=true",
                                          "profile.steps=[2,4]", f"train.train_iters={train_iters}"])
    mlp = provide_on_cpu(build_provider(tiny_gpt_shape(), "local")).decoder.layers[0].mlp
    callback = ProfileSummaryCallback(run.run_dir, cfg.profiling)
    prof = initialize_pytorch_profiler(cfg.profiling, cfg.logger.tensorboard_dir)
    prof.start()
    summarised_at = None
    for step in range(cfg.train.train_iters):  # train_state.step; Megatron logs the iteration as step + 1
        handle_profiling_step(cfg.profiling, step, 0, prof)
        with torch.profiler.record_function(f"iteration {step + 1}"):
            out, _ = mlp(torch.randn(8, 2, 64))  # one layer's fwd/bwd per step
            out.sum().backward()
        callback.on_train_step_end(_context(step))  # before upstream's `train_state.step += 1`
        if callback.done and summarised_at is None:
            summarised_at = step + 1
        handle_profiling_stop(cfg.profiling, step + 1, 0, prof)
    assert summarised_at == 5
    trace = run.run_dir / "torch_profile" / "rank-0.json.gz"
    with gzip.open(trace, "rt") as fh:
        names = {e.get("name") for e in json.load(fh)["traceEvents"]}
    assert "aten::mm" in names  # the MLP's matmuls
    assert {n for n in names if n and n.startswith(("iteration ", "ProfilerStep#"))} == {
        "iteration 2", "iteration 3", "iteration 4", "ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"}
    summary = run.run_dir / "torch_profile" / "summary-rank-0.txt"
    text = summary.read_text()
    assert "CPU operators" in text and "aten::mm" in text


def test_profile_window_must_end_before_the_run_does(tmp_path):
    from kaiyuan_recipes.training.validate import ConfigError, validate

    cfg, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "profile.enabled=true",
                                          "profile.steps=[7,8]", "train.train_iters=8", "kaiyuan.data=mock"])
    with pytest.raises(ConfigError, match="ends at iteration 8: .* train.train_iters=8 must be at least 9"):
        validate(cfg, run, 1)
    cfg, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "profile.enabled=true",
                                          "profile.steps=[7,7]", "train.train_iters=8", "kaiyuan.data=mock"])
    validate(cfg, run, 1)


def test_summary_prefers_gpu_kernels(tmp_path):
    from kaiyuan_recipes.training.profiling import summarize_trace

    # kernels at 0-300, 350-450 and 400-500 us (overlapping streams): busy 450 of 500 us
    events = [{"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "ts": 0.0, "dur": 300.0},
              {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "ts": 350.0, "dur": 100.0},
              {"ph": "X", "cat": "kernel", "name": "flash_fwd_kernel", "ts": 400.0, "dur": 100.0},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 9000.0}]
    trace = tmp_path / "rank-0.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    lines = summarize_trace(trace).splitlines()
    assert "GPU kernels" in lines[0] and "0.5 ms in 3 events" in lines[0]
    assert lines[2].split() == ["0.40", "80.0%", "2", "sm90_xmma_gemm"]
    assert "aten::mm" not in "\n".join(lines)
    assert lines[4] == "by family (GPU busy 90.0% of the profiled window):"
    assert lines[5].split() == ["0.40", "80.0%", "gemm"] and lines[6].split() == ["0.10", "20.0%", "attention", "fwd"]


def test_kernel_families():
    from kaiyuan_recipes.training.profiling import kernel_family

    assert kernel_family("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT") == "gemm"
    assert kernel_family("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel") == "attention bwd"
    assert kernel_family("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert kernel_family("void at::native::(anonymous namespace)::fused_adamw_kernel") == "optimizer"
    assert kernel_family("triton_poi_fused_mul_silu_0") == "element-wise"
    assert kernel_family("void at::native::vectorized_elementwise_kernel<4, add>") == "element-wise"
