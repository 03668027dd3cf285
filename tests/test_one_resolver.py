"""build_config resolves a run in one order, each layer applied once: the recipe, the data source's defaults, the
user's overrides, then the fields that follow from the others."""

import pytest

from kaiyuan_recipes.data.sample_window import SAMPLE_WINDOW_STEPS
from kaiyuan_recipes.training.config import build_config


def test_the_sample_window_is_sized_by_the_overridden_batch_and_evaluation_cadence(tmp_path):
    """The data source runs before the overrides are applied, yet sizes its window by the values the run will
    have: it reads them as the command line states them."""
    common = [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=sample"]
    plain, _ = build_config("gpt_smoke", common)
    cfg, _ = build_config("gpt_smoke", [*common, "train.global_batch_size=8", "validation.eval_interval=10",
                                        "validation.eval_iters=3"])
    assert plain.dataset.train_window_samples == SAMPLE_WINDOW_STEPS * plain.train.global_batch_size
    assert cfg.dataset.train_window_samples == SAMPLE_WINDOW_STEPS * 8
    assert cfg.dataset.eval_window_samples == (SAMPLE_WINDOW_STEPS // 10 + 1) * 3 * 8


def test_a_data_source_reading_a_malformed_stated_value_names_it(tmp_path):
    with pytest.raises(ValueError, match=r"validation.eval_iters=-2: expected an integer, 0 or more"):
        build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=sample", "validation.eval_iters=-2"])


def test_a_blend_given_only_on_the_command_line_is_the_runs(tmp_path):
    """kaiyuan.data=blend checks for a blend after the overrides: one given on the command line counts."""
    cfg, _ = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=blend",
                                        "dataset.blend=[[/data/x/web_part-00000_text_document],null]"])
    assert cfg.dataset.blend == [["/data/x/web_part-00000_text_document"], None]
    with pytest.raises(ValueError, match="kaiyuan.data=blend needs dataset.blend"):
        build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=blend", "dataset.blend=null"])


def test_an_override_of_a_field_the_data_source_sets_wins(tmp_path):
    """The mock source clears the blend; the user's override, applied after it, stands."""
    cfg, _ = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock",
                                        "dataset.blend=[[/data/x/a_text_document],null]"])
    assert cfg.dataset.blend == [["/data/x/a_text_document"], None]


def test_the_sample_window_of_a_recipe_without_periodic_evaluation(tmp_path, monkeypatch):
    """A recipe stating `validation.eval_interval: null` (Bridge's own default: no periodic evaluation) trains on the
    sample corpus: Bridge then asks for one evaluation's samples (data/loaders.py get_train_valid_test_num_samples),
    and that is the window."""
    import shutil

    from kaiyuan_recipes.config import recipe_tree

    root = tmp_path / "recipes"
    shutil.copytree(recipe_tree.recipes_root(), root, ignore=shutil.ignore_patterns("__pycache__"))
    hparams = root / "gpt_smoke" / "hparams.yaml"
    hparams.write_text(hparams.read_text().replace("eval_interval: 100", "eval_interval: null"))
    monkeypatch.setattr(recipe_tree, "recipes_root", lambda: root)
    monkeypatch.setenv("KAIYUAN_NO_KEY_CACHE", "1")  # the copied recipe is another fingerprint's; no recorded keys
    cfg, _ = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=sample"])
    assert cfg.validation.eval_interval is None
    assert cfg.dataset.eval_window_samples == 1 * cfg.validation.eval_iters * cfg.train.global_batch_size


def test_a_stated_value_given_as_an_interpolation_is_read_as_bridge_applies_it(tmp_path):
    """`validation.eval_global_batch_size=${train.global_batch_size}` (Hydra syntax): Bridge resolves it when the
    overrides are applied; the data source, which runs before, reads the same number (its raw text made the window
    a string of digits)."""
    cfg, _ = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=sample",
                                        "train.global_batch_size=8",
                                        "validation.eval_global_batch_size=${train.global_batch_size}"])
    assert cfg.validation.eval_global_batch_size == 8
    assert cfg.dataset.eval_window_samples == (SAMPLE_WINDOW_STEPS // cfg.validation.eval_interval + 1) * 4 * 8
