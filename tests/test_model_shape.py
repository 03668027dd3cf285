"""One model shape and its translations: the HF config we write maps back, through Megatron-Bridge's own
HF → provider mapping, onto the provider we train; the sequence length is the data's, stated once."""

import pytest

from kaiyuan_recipes.config.recipe_tree import known_recipes, load_model_file
from kaiyuan_recipes.models.shape import SHAPE_FIELDS, ModelShape
from kaiyuan_recipes.training.config import build_config

# Fields the HF side has no name for, or represents differently (our padded vocab is kept; HF's MoE configs
# carry no aux-loss/pre-softmax pair that round-trips, and RoPE models have no position table in Megatron).
NOT_IN_HF = {"max_position_embeddings", "make_vocab_size_divisible_by", "seq_length", "moe_aux_loss_coeff",
             "moe_router_pre_softmax"}


@pytest.mark.parametrize("recipe", known_recipes())
def test_hf_config_maps_back_through_megatron_bridge_onto_our_provider(recipe):
    from kaiyuan_recipes import compat

    compat.import_megatron_bridge()
    from megatron.bridge import AutoBridge

    shape = ModelShape.for_recipe(recipe)
    ours = shape.provider("local")
    theirs = AutoBridge.from_hf_config(shape.hf_config(151646)).to_megatron_provider(load_weights=False)
    compared = [k for k in SHAPE_FIELDS if k not in NOT_IN_HF and shape.get(k) is not None]
    differing = {k: (getattr(ours, k), getattr(theirs, k)) for k in compared if getattr(ours, k) != getattr(theirs, k)}
    assert differing == {}, differing


def test_seq_length_is_the_datas_and_stated_once(tmp_path):
    for recipe in known_recipes():
        assert "seq_length" not in load_model_file(recipe), f"recipes/{recipe}/model.yaml restates seq_length"
    cfg, _ = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "dataset.seq_length=2048"])
    assert cfg.model.seq_length == cfg.dataset.seq_length == 2048
    cfg, _ = build_config("laoyao_moe_2b", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock"])
    assert (cfg.model.seq_length == cfg.dataset.seq_length == 8192
            == ModelShape.for_recipe("laoyao_moe_2b")["seq_length"])


def test_parameter_count_and_checkpoint_shape_come_from_the_same_fields():
    shape = ModelShape.for_recipe("qwen3_1p7b")
    assert shape.parameters().total == 2_031_739_904
    recorded = {**shape.fields, "recompute_granularity": None, "bf16": True}  # a run_config.yaml's model section
    assert ModelShape.from_run_config(recorded).fields == {k: v for k, v in shape.fields.items() if k in SHAPE_FIELDS}
