"""`kaiyuan plot` on real TensorBoard event files written with the SummaryWriter Megatron uses."""

import subprocess
import sys

import pytest

from kaiyuan_recipes.training.plots import plot_runs, read_scalars


def write_run(run_dir, lr_peak, slope):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(run_dir / "tb_logs"))
    for it in range(1, 51):
        w.add_scalar("lm loss", 10.0 - slope * it, it)
        w.add_scalar("learning-rate", lr_peak * min(1.0, it / 10), it)
        w.add_scalar("throughput/device/tokens_per_sec", 69000.0 + it, it)
        w.add_scalar("grad-norm", 1.0 / it, it)
    w.close()
    return run_dir


def test_plot_overlays_runs(tmp_path):
    import matplotlib.image as mpimg

    a = write_run(tmp_path / "run_a", 3e-4, 0.1)
    b = write_run(tmp_path / "run_b", 6e-4, 0.05)
    series = read_scalars(a)
    assert series["lm loss"][0] == (1, pytest.approx(9.9)) and len(series["learning-rate"]) == 50
    written = plot_runs([a, b], tmp_path / "plots")
    assert sorted(p.name for p in written) == ["grad_norm.png", "learning_rate.png", "loss.png", "throughput.png"]
    img = mpimg.imread(written[0])
    assert img.shape[0] > 300 and img.shape[1] > 600


def test_plot_cli_errors_on_missing_events(tmp_path):
    out = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "plot", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no TensorBoard event files" in out.stderr
