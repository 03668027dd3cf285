"""Checkpoints written before the fast path moved to kaiyuan_recipes/fastpath/ name their layer spec here in
run_config.yaml (tests/test_fastpath.py loads such a name)."""

from kaiyuan_recipes.fastpath.spec import fast_layer_spec

__all__ = ["fast_layer_spec"]
