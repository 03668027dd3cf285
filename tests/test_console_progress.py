"""The console's progress line (training/console_progress.py) on the real callback: one line at the first step of a
start or resume, then one per log interval, each with the interval's mean loss."""

from types import SimpleNamespace

import pytest

from kaiyuan_recipes.training.console_progress import ConsoleProgressCallback


def context(step: int, loss: float) -> SimpleNamespace:
    cfg = SimpleNamespace(train=SimpleNamespace(train_iters=100, global_batch_size=8))
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
