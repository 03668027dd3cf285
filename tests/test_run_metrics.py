"""training/metrics.py's RunMetricsCallback (the metrics.jsonl that status, plots and benchmarks read), driven by
Megatron-Bridge's callback hooks in the order its train loop fires them, on a clock the test controls."""

import json
from types import SimpleNamespace

import pytest
import torch

from kaiyuan_recipes.config.run_layout import read_metrics
from kaiyuan_recipes.training import metrics


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def context(step: int, flops: float) -> SimpleNamespace:
    cfg = SimpleNamespace(train=SimpleNamespace(global_batch_size=8))
    state = SimpleNamespace(cfg=cfg, train_state=SimpleNamespace(step=step, consumed_train_samples=8 * step,
                                                                 floating_point_operations_so_far=flops))
    return SimpleNamespace(state=state, loss_dict={"lm loss": torch.tensor(2.5)}, grad_norm=1.0,
                           skipped_iter=False, optimizer=None)


def test_a_step_is_timed_from_the_previous_steps_end(tmp_path, monkeypatch):
    """Megatron's logging after a step and the next step's setup count in the next step's time (the GPU waits
    through them too); the first step, and the one after an evaluation or a checkpoint save, run from their own
    start. Model TFLOP/s: the previous step's FLOPs (Megatron adds them after the hook) over the same window."""
    clock = Clock()
    monkeypatch.setattr(metrics.time, "perf_counter", clock)
    callback = metrics.RunMetricsCallback(tmp_path, seq_length=4096)
    flops, step_flops = 0.0, 4e15
    timeline = [(0.0, 2.0, None), (0.5, 1.0, None), (0.25, 1.0, "eval"), (0.5, 1.0, "save"), (0.5, 1.0, None)]
    for step, (before, inside, after) in enumerate(timeline):
        clock.now += before
        callback.on_train_step_start(context(step, flops))
        clock.now += inside
        callback.on_train_step_end(context(step, flops))
        flops += step_flops
        if after == "eval":
            callback.on_eval_start(context(step, flops))
            clock.now += 30.0
        elif after == "save":
            clock.now += 20.0
            callback.on_checkpoint_save(context(step, flops))
    steps = [r for r in read_metrics(tmp_path) if r["event"] == "step"]
    assert [r["step_time_s"] for r in steps] == pytest.approx([2.0, 1.5, 1.25, 1.0, 1.0])
    assert steps[1]["tokens_per_s_per_gpu"] == pytest.approx(8 * 4096 / 1.5)
    assert steps[0]["model_tflops_per_gpu"] is None
    assert steps[1]["model_tflops_per_gpu"] == pytest.approx(step_flops / 1.5 / 1e12)
    assert steps[0]["loss"] == 2.5 and steps[0]["peak_mem_gb"] is None  # no CUDA on this host
    assert [json.loads(line)["event"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()].count(
        "checkpoint") == 1


def test_train_start_records_the_kernel_settings_the_run_trains_with(tmp_path):
    """A benchmark row reads these to say what it trained: the recipe's built config, not a copy of the fields."""
    from kaiyuan_recipes.training.config import build_config

    cfg, run = build_config("gpt_smoke", ["kaiyuan.layer_spec=local", f"kaiyuan.run_root={tmp_path}"])
    callback = metrics.RunMetricsCallback(tmp_path, seq_length=4096, fast_path=run.fastpath)
    ctx = context(0, 0.0)
    ctx.state.cfg = cfg
    callback.on_train_start(ctx)
    start, = (r for r in read_metrics(tmp_path) if r["event"] == "train_start")
    assert start["model"]["transformer_impl"] == "local"
    assert start["model"]["apply_rope_fusion"] is False and start["model"]["gradient_accumulation_fusion"] is False
    assert set(start["model"]) == {*metrics.KERNEL_FIELDS, "fast_path", "sdpa_backend"}
    assert start["model"]["attention_backend"] == "AttnBackend.auto"  # an enum, written as text
    assert start["model"]["fast_path"] == {name: piece.on for name, piece in run.fastpath.pieces.items()}
    assert start["model"]["fast_path"]["chunked_loss"] is False  # auto leaves it off the local spec


def test_a_nan_loss_is_written_as_strict_json(tmp_path):
    """JSON has no NaN: a NaN loss (and an infinite grad norm) are the strings "nan" / "inf" in metrics.jsonl."""
    callback = metrics.RunMetricsCallback(tmp_path, seq_length=16)
    ctx = context(0, 0.0)
    ctx.loss_dict, ctx.grad_norm = {"lm loss": torch.tensor(float("nan"))}, float("inf")
    callback.on_train_step_start(ctx)
    callback.on_train_step_end(ctx)
    line = (tmp_path / "metrics.jsonl").read_text().splitlines()[-1]
    record = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} in {line}"))
    assert record["loss"] == "nan" and record["grad_norm"] == "inf"
