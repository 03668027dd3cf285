"""The console's progress line (training/console_progress.py) on the real callback: one line at the first step of a
start or resume, then one per log interval, each with the interval's mean loss."""

from types import SimpleNamespace

import pytest

from kaiyuan_recipes.training.console_progress import ConsoleProgressCallback


def context(step: int, loss: float) -> SimpleNamespace:
    cfg = SimpleNamespace(train=SimpleNamespace(train_iters=100, global_batch_size=8, micro_batch_size=2),
                          data_parallel_size=1)
    train_state = SimpleNamespace(step=step, floating_point_operations_so_far=1e12 * step)
    state = SimpleNamespace(cfg=cfg, train_state=train_state)
    optimizer = SimpleNamespace(param_groups=[{"lr": 3e-4}])
    return SimpleNamespace(state=state, loss_dict={"lm loss": loss}, optimizer=optimizer)


@pytest.mark.parametrize("resumed_at", [0, 20])
def test_a_line_at_the_first_step_then_one_per_interval(capsys, resumed_at):
    callback = ConsoleProgressCallback(log_interval=10, seq_length=16)
    callback.on_train_start(context(resumed_at, 0.0))
    for step in range(resumed_at, resumed_at + 20):  # Bridge calls the hook before it increments train_state.step
        callback.on_train_step_end(context(step, float(step)))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("kaiyuan: iteration")]
    iterations = [int(line.split()[2].split("/")[0]) for line in lines]
    assert iterations == [resumed_at + 1, resumed_at + 10, resumed_at + 20], lines
    assert f"loss {resumed_at:.4f}" in lines[0]  # the first step's own loss


def test_the_first_line_says_why_its_step_is_long_and_has_a_tflops_figure(capsys, monkeypatch):
    """The first line's window holds no FLOPs of its own (Megatron adds a step's after the hook): its TFLOP/s comes
    from Megatron-Bridge's formula for one step, and it says how many micro-batches the step ran."""
    from megatron.bridge.training.utils import flop_utils

    monkeypatch.setattr(flop_utils, "num_floating_point_operations", lambda cfg, batch_size: 2e12 * batch_size)
    callback = ConsoleProgressCallback(log_interval=10, seq_length=16)
    first = context(0, 1.0)
    first.state.train_state.floating_point_operations_so_far = 0.0
    callback.on_train_start(first)
    callback.on_train_step_end(first)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("kaiyuan: iteration"))
    assert "iteration 1/100 (first step: 4 micro-batches of 2 x 16, compilation and warm-up included)" in line
    assert "TFLOP/s -" not in line and "TFLOP/s/GPU" in line
