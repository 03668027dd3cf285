"""train_throughput.py --profile and benchmarks/peer_profile_report.py on the CPU: the step breakdown of Chrome
traces built here in Kineto's shape (kernel, gpu_memcpy, cuda_runtime, ProfilerStep# events; real kernel names),
the report's JSON, gap table and chart, the `ours` row's profiled tail (the recipe's profiler config, the timed
window and learning-rate ramp left as without it), torchtitan's job, profiler and data loader and OLMo-core's
profiler where their pinned versions import (a folder of lab/titan-wheels.txt or lab/olmo-wheels.txt on
PYTHONPATH; skipped otherwise)."""

import copy
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
FLASH_FWD = "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>"
FLASH_BWD = "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8>>"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NORM = "triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
LOSS = "triton_red_fused__to_copy_arange_eq_exp_gather_logsumexp_select_sub_unsqueeze_0"
ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedOptimizerTensorListFunctor<float, 4>>")
EMBEDDING_BWD = "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<c10::BFloat16, float>"


def step_events(offset: float = 0.0, step: int = 17) -> list[dict]:
    """One step of 1000 us: kernels on two streams (an all-reduce beside the attention backward for 100 us),
    gaps of 2 and 5 us (launches back to back) and of 38 and 75 us (the GPU waiting), 10 us before the first
    activity and 100 after the last; busy 770 us."""
    def kernel(name, ts, dur, stream=7, cat="kernel"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": offset + ts, "dur": dur,
                "args": {"stream": stream, "correlation": int(ts)}}

    def host(name, ts, dur=5.0, cat="cuda_runtime"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": offset + ts, "dur": dur}

    return [host(f"ProfilerStep#{step}", 1000, 1000, cat="user_annotation"),
            {**host(f"ProfilerStep#{step}", 1010, 890), "cat": "gpu_user_annotation"},  # the GPU-side copy
            host("aten::mm", 1001, 20, cat="cpu_op"), host("aten::add_", 1030, 5, cat="cpu_op"),
            *(host("cudaLaunchKernel", 1002 + 5 * i) for i in range(4)), host("cuLaunchKernelEx", 1030),
            host("cudaGraphLaunch", 1040), host("cudaStreamSynchronize", 1050),
            kernel(GEMM, 1010, 300), kernel(FLASH_FWD, 1312, 100), kernel(FLASH_BWD, 1412, 150),
            kernel(NCCL, 1450, 100, stream=13), kernel(NORM, 1600, 40), kernel(ADD, 1645, 30),
            kernel(LOSS, 1675, 50), kernel(ADAM, 1800, 60),
            kernel("Memcpy DtoD (Device -> Device)", 1860, 20, cat="gpu_memcpy"), kernel(EMBEDDING_BWD, 1880, 20)]


def write_trace(path: Path, events: list[dict]) -> Path:
    with gzip.open(path, "wt") as fh:
        json.dump({"schemaVersion": 1, "deviceProperties": [], "traceEvents": events}, fh)
    return path


EXPOSED_US = {"gemm": 300, "attention fwd": 100, "attention bwd": 100, "communication": 50, "norms": 40,
              "element-wise": 30, "loss": 50, "optimizer": 60, "copy / memset": 20, "other": 20}


@pytest.mark.parametrize("steps", [1, 2])
def test_step_breakdown_splits_the_step_into_families_and_idle(steps):
    from kaiyuan_recipes.training.trace_breakdown import step_breakdown

    events = [e for i in range(steps) for e in step_events(offset=1000.0 * i, step=17 + i)]
    b = step_breakdown(events, gap_us=10.0)
    assert b["profiled_steps"] == [f"ProfilerStep#{17 + i}" for i in range(steps)]
    assert b["step_ms"] == pytest.approx(1.0) and b["gpu_busy_ms"] == pytest.approx(0.77)
    assert b["gpu_busy_share"] == pytest.approx(0.77) and b["gpu_idle_ms"] == pytest.approx(0.23)
    assert {f: round(v["exposed_ms"] * 1e3, 6) for f, v in b["families"].items()} == EXPOSED_US
    assert b["families"]["attention bwd"]["kernel_ms"] == pytest.approx(0.15)  # overlap split only in exposed
    assert b["families"]["communication"]["kernel_ms"] == pytest.approx(0.1)
    idle = b["idle"]
    # the gap between two steps (last activity at 1900, the next step's first at 2010) is a longer gap of 110 us
    assert idle["short_gaps"] == {"count": 2, "ms": pytest.approx(0.007)}
    assert idle["long_gaps"]["count"] == pytest.approx(2 + (steps - 1) / steps)
    assert idle["long_gaps"]["ms"] == pytest.approx(0.113 + 0.11 * (steps - 1) / steps)
    assert idle["long_gaps"]["largest_ms"][:2] == pytest.approx([0.11, 0.075] if steps == 2 else [0.075, 0.038])
    assert idle["before_first_activity_ms"] == pytest.approx(0.01 / steps)
    assert idle["after_last_activity_ms"] == pytest.approx(0.1 / steps)
    host = b["host"]
    assert (host["gpu_activities"], host["kernels"], host["kernel_launch_calls"], host["graph_launch_calls"],
            host["sync_calls"], host["cpu_ops"]) == (10, 9, 5, 1, 1, 2)
    assert host["cuda_api_ms"] == pytest.approx(0.035)
    assert b["top_kernels"][0] == {"name": GEMM, "ms": pytest.approx(0.3), "calls": 1, "family": "gemm"}


def test_a_trace_without_gpu_activity_is_refused_by_name(tmp_path):
    from kaiyuan_recipes.training.trace_breakdown import read_trace_events, step_breakdown

    cpu_only = [e for e in step_events() if e["cat"] in ("cpu_op", "user_annotation")]
    with pytest.raises(ValueError, match="no GPU activity"):
        step_breakdown(cpu_only)
    (tmp_path / "x.json").write_text(json.dumps([{"ph": "X"}]))
    with pytest.raises(ValueError, match=r"x.json: not a Chrome trace"):
        read_trace_events(tmp_path / "x.json")


def test_kernel_families_of_both_stacks():
    """Names from profiles of the fast spec (cuDNN SDPA, nvjet GEMMs, torch's norm kernels, our compiled loss) and
    of a torch.compile'd model (Inductor names kernels after the operators it fused; FlexAttention templates)."""
    from kaiyuan_recipes.training.trace_breakdown import kernel_family

    expected = {
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0":
            "attention fwd",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0":
            "attention bwd",
        "void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*, void const*, void*)": "attention bwd",
        "cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<cutlass::bfloat16_t>>>":
            "attention fwd",
        "triton_tem_fused_flex_attention_0": "attention fwd",
        "triton_tem_fused_flex_attention_backward_1": "attention bwd",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "gemm",
        "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4>": "gemm",
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<c10::BFloat16, float>": "norms",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>": "norms",
        "triton_red_fused__fused_rms_norm_backward_2": "norms",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>": "loss",
        "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>": "loss",
        "void at::native::(anonymous namespace)::fused_adamw_kernel": "optimizer",
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
        "direct_copy_kernel_cuda(at::TensorIteratorBase&)>>": "copy / memset",
        "Memset (Device)": "copy / memset",
        "triton_poi_fused__to_copy_add_cat_cos_mul_neg_sin_slice_slice_backward_0": "element-wise",
        "triton_poi_fused_add_cat_mul_rsub_sigmoid_silu_split_0": "element-wise",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t>>":
            "element-wise",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": "communication",
        EMBEDDING_BWD: "other",
    }
    assert {name: kernel_family(name) for name in expected} == expected


def results_file(tmp_path: Path) -> Path:
    """train_throughput.py --profile's shape: two rows with traces beside the file, one without."""
    ours = step_events()
    peer = copy.deepcopy(ours)
    for e in peer:  # the peer: its GEMM takes 100 us longer, everything after it starts 100 us later
        if e["name"] == GEMM:
            e["dur"] += 100
        elif e["cat"] in ("kernel", "gpu_memcpy") and e["ts"] > 1010:
            e["ts"] += 100
    write_trace(tmp_path / "pt_qwen3_1p7b_ours_trace.json.gz", ours)
    write_trace(tmp_path / "pt_qwen3_1p7b_torchtitan_trace.json.gz", peer)
    tokens = 2 * 4 * 4096
    rows = {"ours": {"tokens_per_s": tokens / 0.9e-3, "tflops": 1.0,
                     "profile": {"step": 17, "trace": "pt_qwen3_1p7b_ours_trace.json.gz"}},
            "torchtitan": {"tokens_per_s": tokens / 1.0e-3, "tflops": 0.9,
                           "profile": {"step": 17, "trace": "pt_qwen3_1p7b_torchtitan_trace.json.gz"}},
            "olmo_core": {"tokens_per_s": tokens / 1.1e-3}, "ours_vs_megatron_local": 1.2}  # with_ratios' kind
    path = tmp_path / "pt.json"
    path.write_text(json.dumps({"command": "python benchmarks/train_throughput.py --profile", "revision": "abc1234",
                                "host": {"gpu": "NVIDIA H100 80GB HBM3", "gpus": 1}, "date": "2026-12-06",
                                "seq_length": 4096, "profiled_step": 17,
                                "batch": {"qwen3_1p7b": {"micro_batch": 2, "micro_batches": 4}},
                                "results": {"qwen3_1p7b": rows}}))
    return path


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/peer_profile_report.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KAIYUAN_REVISION": "def5678"})


def test_report_tables_where_each_step_goes_against_the_peak(tmp_path):
    results = results_file(tmp_path)
    # FLOPs per step that take 0.4 ms at the 790 TFLOP/s default, 0.1 ms of them attention's
    fpt, attention = 0.4e-3 * 790e12 / 32768, 0.1e-3 * 790e12 / 32768
    out = tmp_path / "profile.json"
    proc = report("--results", str(results), "--flops-per-token", str(fpt), "--attention-flops-per-token",
                  str(attention), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(out.read_text())
    assert rep["command"].startswith("python benchmarks/peer_profile_report.py --results")
    assert rep["revision"] == "def5678" and rep["gpu"] == "NVIDIA H100 80GB HBM3"
    assert rep["measured"]["revision"] == "abc1234" and rep["peak_tflops"] == 790.0
    assert list(rep["rows"]) == ["ours", "torchtitan"]  # the rows with a trace, in the results' order
    ours, peer = rep["rows"]["ours"], rep["rows"]["torchtitan"]
    gap = {p["part"]: p["ms"] for p in ours["gap_to_peak"]}
    assert gap["model FLOPs at the matrix peak"] == pytest.approx(0.4)
    assert gap["GEMM beyond its FLOPs at the peak"] == pytest.approx(0.3 - 0.3)
    assert gap["attention beyond its FLOPs at the peak"] == pytest.approx(0.2 - 0.1)
    assert gap["norms"] == pytest.approx(0.04) and gap["loss"] == pytest.approx(0.05)
    assert gap["GPU idle: short gaps"] == pytest.approx(0.007)
    assert gap["GPU idle: longer gaps, step start and end"] == pytest.approx(0.113 + 0.01 + 0.1)
    assert sum(gap.values()) == pytest.approx(ours["step_ms"])
    assert sum(p["share"] for p in ours["gap_to_peak"]) == pytest.approx(1.0)
    assert ours["mfu_profiled"] == pytest.approx(0.4) and ours["tflops_profiled"] == pytest.approx(316.0)
    assert ours["step_ms_timed"] == pytest.approx(0.9) and ours["mfu_timed"] == pytest.approx(0.4 / 0.9)
    assert ours["profiler_slowdown"] == pytest.approx(1 / 0.9)
    # the peer's longer GEMM shifts its later kernels by 100 us into the idle tail: same step, less idle
    peer_gap = {p["part"]: p["ms"] for p in peer["gap_to_peak"]}
    assert peer_gap["GEMM beyond its FLOPs at the peak"] == pytest.approx(0.1)
    assert peer["gpu_busy_share"] == pytest.approx(0.87) and peer["step_ms"] == pytest.approx(1.0)
    assert (tmp_path / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "model FLOPs at the matrix peak" in proc.stdout

    # FLOPs per token from the results' own rows (ours first): tflops * 1e12 / tokens_per_s
    proc = report("--results", str(results), "--rows", "torchtitan", "--out", str(out), "--peak-tflops", "1000")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(out.read_text())
    assert rep["flops_per_token"] == pytest.approx(1e12 * 0.9e-3 / 32768)
    # causal attention by Megatron's count for qwen3 1.7B (28 layers, 16 heads of 128) at seq 4096
    assert rep["attention_flops_per_token"] == 6 * 28 * 4096 * 16 * 128
    assert list(rep["rows"]) == ["torchtitan"]


def test_report_names_rows_without_a_trace(tmp_path):
    results = results_file(tmp_path)
    proc = report("--results", str(results), "--rows", "ours", "olmo_core", "--out", str(tmp_path / "r.json"))
    assert proc.returncode != 0 and "rows without a trace: ['olmo_core']" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_ours_profiled_tail_keeps_the_timed_window(tmp_path, monkeypatch):
    """megatron_run(profile_step=17) for --steps 15: the recipe trains 18 iterations with its profiler on 17; the
    row times steps 4..15 only, keeps 15 losses and names the trace, which keep_trace copies beside the results."""
    import argparse

    import train_throughput

    from kaiyuan_recipes.config.run_layout import METRICS_FILE

    commands = []

    def fake_run(command, timeout, env=None):
        commands.append(command)
        state = tmp_path / "gpt_smoke" / "run_state"
        state.mkdir(parents=True)
        (state / METRICS_FILE).write_text("".join(
            json.dumps({"event": "step", "iteration": s, "tokens_per_s_per_gpu": 1000.0 * s,
                        "model_tflops_per_gpu": 1.0, "peak_mem_gb": 2.0, "loss": 20.0 - s}) + "\n"
            for s in range(1, 19)))
        (tmp_path / "gpt_smoke" / "torch_profile").mkdir()
        write_trace(tmp_path / "gpt_smoke" / "torch_profile" / "rank-0.json.gz", step_events())
        return 0, "done"

    monkeypatch.setattr(train_throughput, "run_bounded", fake_run)
    monkeypatch.setattr(train_throughput.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    row = train_throughput.megatron_run("gpt_smoke", "fast", 4, 4, 4096, 15, profile_step=17)
    assert row["tokens_per_s"] == 9500.0 and row["timed_steps"] == 12  # median of steps 4..15
    assert row["losses"] == [20.0 - s for s in range(1, 16)]
    assert "train.train_iters=18" in commands[0] and "profile.steps=[17,17]" in commands[0]
    assert "scheduler.lr_decay_iters=15" in commands[0]
    args = argparse.Namespace(out=tmp_path / "results" / "pt.json")
    args.out.parent.mkdir()
    train_throughput.keep_trace(args, "gpt_smoke", "ours", row)
    assert row["profile"] == {"step": 17, "trace": "pt_gpt_smoke_ours_trace.json.gz"}
    assert (args.out.parent / row["profile"]["trace"]).read_bytes()[:2] == b"\x1f\x8b"


def test_ours_profiled_run_is_a_config_upstream_accepts_with_the_same_lr_ramp(tmp_path):
    """The profiled row's overrides reach Megatron-Bridge's ProfilingConfig (iteration 17, shapes recorded) and
    pass the window check; its learning rate over steps 1..15, from megatron-core's scheduler on the config
    Bridge resolves, equals the 15-step row's."""
    import torch
    import train_throughput
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.validate import resolve_with_upstream, validate

    def lrs(command: list[str]) -> list[float]:
        cfg, run = build_config("qwen3_1p7b", command[6:])
        validate(cfg, run, 1)
        resolved = resolve_with_upstream(cfg, world_size=1)
        s = resolved.scheduler
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = OptimizerParamScheduler(opt, init_lr=s.lr_warmup_init, max_lr=resolved.optimizer.lr,
                                        min_lr=resolved.optimizer.min_lr, lr_warmup_steps=s.lr_warmup_steps,
                                        lr_decay_steps=s.lr_decay_steps, lr_decay_style=s.lr_decay_style,
                                        start_wd=s.start_weight_decay, end_wd=s.end_weight_decay,
                                        wd_incr_steps=s.wd_incr_steps, wd_incr_style=s.weight_decay_incr_style,
                                        wsd_decay_steps=s.wsd_decay_steps, lr_wsd_decay_style=s.lr_wsd_decay_style)
        out = []
        for _ in range(15):
            sched.step(increment=resolved.train.global_batch_size)
            out.append(opt.param_groups[0]["lr"])
        return out, cfg

    base, _ = lrs(train_throughput.megatron_command("qwen3_1p7b", "fast", 2, 4, 4096, 15, tmp_path))
    command = train_throughput.megatron_command("qwen3_1p7b", "fast", 2, 4, 4096, 18, tmp_path,
                                                extra=train_throughput.profile_overrides(15, 17))
    profiled, cfg = lrs(command)
    p = cfg.profiling
    assert (p.use_pytorch_profiler, p.profile_step_start, p.profile_step_end, p.pytorch_profiler_collect_shapes) == (
        True, 17, 18, True)
    assert profiled == pytest.approx(base) and base[-1] > base[0] > 0
    # without lr_decay_iters the longer run ramps over 18 steps: the check can tell
    unpinned, _ = lrs([a for a in command if not a.startswith("scheduler.lr_decay_iters")])
    assert unpinned != pytest.approx(base)


def test_torchtitan_job_traces_one_step_where_the_row_looks(tmp_path):
    """peer_torchtitan's --profile-step: the job file it writes passes torchtitan's own ConfigManager with the
    toml's values where the row keeps them; torchtitan's profiler, driven by that job's [profiling] section as
    Trainer.train drives it, writes one trace, of step 17, at the path the row names; the learning rate of steps
    1..15 is the 15-step run's (the qwen3 spec's own schedule builder)."""
    pytest.importorskip("torchtitan", reason="torchtitan (lab/titan-wheels.txt) is not on this PYTHONPATH")
    import numpy as np
    import peer_torchtitan as pt
    import torch
    import torch.distributed as dist
    from torchtitan.tools.profiling import maybe_enable_profiling

    stream = tmp_path / "stream.npy"
    np.save(stream, np.zeros((8, 129), dtype=np.int32))
    dump = tmp_path / "dump"
    dump.mkdir()
    config = pt.job_config(pt.row_job(str(stream), 128, 15, False, "none", str(dump), profile_step=17), str(dump))
    assert config.training.steps == 17 and config.lr_scheduler.warmup_steps == 15
    assert (config.model.name, config.model.flavor, config.training.global_batch_size) == (pt.TITAN_SPEC, "1.7B", 8)
    assert (config.parallelism.data_parallel_shard_degree, config.optimizer.eps) == (-1, 1e-8)  # the toml's
    assert {k: getattr(config.profiling, k) for k in pt.profiler_settings(17)} == pt.profiler_settings(17)
    with pytest.raises(ValueError, match="--profile-step 16: past the timed steps and a warm-up step"):
        pt.row_job(str(stream), 128, 15, False, "none", str(dump), profile_step=16)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        with maybe_enable_profiling(config.profiling, global_step=0, base_folder=str(dump)) as profiler:
            for step in range(1, config.training.steps + 1):  # Trainer.train: step, then profiler.step()
                with torch.profiler.record_function(f"train step {step}"):
                    torch.ones(4).add_(1)
                profiler.step()
    finally:
        dist.destroy_process_group()
    trace = pt.trace_path(str(dump), 17)
    assert [p.name for p in trace.parents[1].iterdir()] == ["iteration_17"]
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {n for n in names if n and n.startswith("train step ")} == {"train step 17"}

    def titan_lrs(training_steps: int) -> list[float]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
        sched = pt.titan_spec().build_lr_schedulers_fn([opt], config.lr_scheduler, training_steps)
        out = []
        for _ in range(15):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    assert titan_lrs(17) == pytest.approx(titan_lrs(15))


def test_torchtitan_stream_loader_feeds_the_trainer_the_stream_in_order(tmp_path):
    """The spec's data loader, built as the Trainer builds it, yields the stream's windows in order, `local_batch_size`
    rows a batch, inputs and labels one token apart and no positions (the flavour's plain causal attention); a
    stream of another window length is refused by name."""
    pytest.importorskip("torchtitan", reason="torchtitan (lab/titan-wheels.txt) is not on this PYTHONPATH")
    import numpy as np
    import peer_torchtitan as pt

    stream = tmp_path / "stream.npy"
    np.save(stream, np.arange(6 * 9, dtype=np.int32).reshape(6, 9))
    config = pt.job_config(pt.row_job(str(stream), 8, 3, False, "none", str(tmp_path)), str(tmp_path))
    loader = pt.titan_spec().build_dataloader_fn(dp_world_size=1, dp_rank=0, tokenizer=None, job_config=config)
    batches = list(loader)
    assert len(batches) == 3 and all(list(b) == ["input"] for b, _ in batches)
    assert [b["input"][:, 0].tolist() for b, _ in batches] == [[0, 9], [18, 27], [36, 45]]
    assert all((labels - b["input"] == 1).all() for b, labels in batches)
    np.save(stream, np.zeros((6, 10), dtype=np.int32))
    with pytest.raises(ValueError, match="windows of 10 tokens, the run needs 9"):
        pt.titan_spec().build_dataloader_fn(dp_world_size=1, dp_rank=0, tokenizer=None, job_config=config)


def test_olmo_core_profiler_traces_the_profiled_step_where_the_row_looks(tmp_path):
    """peer_olmo_core's --profile-step: OLMo-core's own ProfilerCallback, called as its Trainer calls it (before
    each batch loads; training runs one step past the profiled one), writes one trace, of step 17 alone, at the
    path the row names; a profiled step within the timed ones, or without a warm-up step, is refused."""
    pytest.importorskip("olmo_core", reason="OLMo-core (lab/olmo-wheels.txt) is not on this PYTHONPATH")
    from types import SimpleNamespace

    import peer_olmo_core as po
    import torch

    callback = po.profiler_callback(17)
    callback.trainer = SimpleNamespace(device=torch.device("cpu"), work_dir=tmp_path,
                                       persist_working_file=lambda path: path)
    callback.pre_train()
    for step in range(1, 19):  # Trainer._iter_batches: pre_load_batch, then the step
        callback.pre_load_batch()
        with torch.profiler.record_function(f"train step {step}"):
            torch.ones(4).add_(1)
    trace = po.trace_path(str(tmp_path), 17)
    assert [p.name for p in trace.parent.iterdir()] == [trace.name]
    with gzip.open(trace, "rt") as fh:
        names = {e.get("name") for e in json.load(fh)["traceEvents"]}
    assert {n for n in names if n and n.startswith("train step ")} == {"train step 17"}
    with pytest.raises(ValueError, match="--profile-step 16: past the timed steps and a warm-up step"):
        po.train(str(tmp_path / "unused.npy"), 8, 15, tiny=True, gpu=False, profile_step=16)
    with pytest.raises(ValueError, match="needs a warm-up step"):
        po.profiler_callback(2)


def test_peer_rows_profile_after_the_stream_ours_reads(tmp_path, monkeypatch):
    """--profile --steps 15: the token stream is drawn for ours' 18 iterations (its shuffle depends on them), each
    peer row (torchtitan, OLMo-core) is asked for --profile-step 17 with its time box 150 s longer and its trace is
    kept beside the results under the row's name."""
    import argparse

    import numpy as np
    import token_stream
    import train_throughput

    drawn = []
    monkeypatch.setattr(token_stream, "mock_stream", lambda model, seq, steps, overrides: drawn.append(
        (steps, [o for o in overrides if o.startswith("train.train_iters")])) or np.zeros((1, 9), np.int32))
    calls = []

    def fake_run(command, timeout, env=None):
        calls.append((command, timeout))
        out = Path(command[command.index("--out") + 1])
        row = {"tokens_per_s": 1.0}
        if "--profile-step" in command:
            trace = write_trace(tmp_path / "rank0_trace.json.gz", step_events())
            row["profile"] = {"step": int(command[command.index("--profile-step") + 1]), "trace": str(trace)}
        out.write_text(json.dumps(row))
        return 0, "ok"

    monkeypatch.setattr(train_throughput, "run_bounded", fake_run)
    made_here = train_throughput.tempfile.mkdtemp  # the token stream's folders, in the test's own
    monkeypatch.setattr(train_throughput.tempfile, "mkdtemp",
                        lambda prefix=None: made_here(prefix=prefix, dir=tmp_path))
    args = argparse.Namespace(seq=8, steps=15, profile=True, impl_timeout=240.0, peer_pythonpath=None,
                              out=tmp_path / "pt.json")
    streams: dict = {}
    titan = train_throughput.peer_run(args, "qwen3_1p7b", "torchtitan", streams)
    olmo = train_throughput.peer_run(args, "qwen3_1p7b", "olmo_core", streams)
    assert drawn == [(18, ["train.train_iters=18"])]  # once per model, for the profiled run's length
    (titan_command, titan_timeout), (olmo_command, olmo_timeout) = calls
    assert titan_command[-2:] == ["--profile-step", "17"] and titan_timeout == 390.0
    assert olmo_command[-2:] == ["--profile-step", "17"] and olmo_timeout == 390.0
    for impl, row in (("torchtitan", titan), ("olmo_core", olmo)):
        train_throughput.keep_trace(args, "qwen3_1p7b", impl, row)
        assert row["profile"]["trace"] == f"pt_qwen3_1p7b_{impl}_trace.json.gz"
        assert (tmp_path / row["profile"]["trace"]).exists()
