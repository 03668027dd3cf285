"""Reading <run>/run_state/metrics.jsonl (written by training.metrics.RunMetricsCallback). The reader and the
file name live with the run directory's layout (kaiyuan_recipes/config/run_layout.py), so the launch back-ends read
a run's metrics without importing training; training and the benchmarks import them from here too."""

from kaiyuan_recipes.config.run_layout import METRICS_FILE, read_metrics

__all__ = ["METRICS_FILE", "read_metrics"]
