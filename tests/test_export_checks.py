"""What `kaiyuan export hf` refuses, before it writes anything: a --recipe whose shape is not the checkpoint's (the
export would pair the recipe's config.json with the checkpoint's weights), and a model vocabulary smaller than the
tokenizer's (ids the tokenizer produces would have no embedding row). Real torch_dist checkpoints, written by
Megatron-Bridge's own writer."""

import json

import pytest
import torch

from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir
from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model
from kaiyuan_recipes.export.megatron_to_hf import bridge_for, export_hf
from kaiyuan_recipes.models.shape import ModelShape

TINY = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
            kv_channels=16, seq_length=128, max_position_embeddings=128, position_embedding_type="rope",
            normalization="RMSNorm", layernorm_epsilon=1e-6, gated_linear_unit=True, add_bias_linear=False,
            add_qkv_bias=False, share_embeddings_and_output_weights=False, qk_layernorm=True, rotary_base=1000000,
            vocab_size=151936, make_vocab_size_divisible_by=128)


def write_run(run_dir, shape):
    """A run directory whose checkpoints/ holds one torch_dist checkpoint of a random model of `shape`."""
    model = build_cpu_model(shape, torch.bfloat16)
    bridge_for(shape).save_megatron_model([model], run_dir / "checkpoints")
    return run_dir


@pytest.fixture(scope="module")
def run_151936(tmp_path_factory, process_group):
    return write_run(tmp_path_factory.mktemp("ckpt") / "run", TINY)


@pytest.fixture(scope="module")
def run_1024(tmp_path_factory, process_group):
    return write_run(tmp_path_factory.mktemp("ckpt") / "run", TINY | {"vocab_size": 1024})


def nothing_written(out):
    return not out.exists() and not list(out.parent.glob(f".{out.name}.*"))


def test_a_recipe_of_another_shape_is_refused_naming_each_field(run_151936, tmp_path):
    out = tmp_path / "hf"
    with pytest.raises(ValueError) as refused:
        export_hf(run_151936, out, ModelShape.for_recipe("qwen3_1p7b"), default_tokenizer_dir(), show_progress=False)
    message = str(refused.value)
    assert "run_config.yaml: the checkpoint is not the recipe's model" in message
    for named in ("num_layers 28 (recipe) vs 2 (checkpoint)", "hidden_size 2048 (recipe) vs 64 (checkpoint)",
                  "ffn_hidden_size 6144 (recipe) vs 128 (checkpoint)", "kv_channels 128 (recipe) vs 16 (checkpoint)"):
        assert named in message
    assert "vocab_size" not in message  # both 151,936: only the fields that differ are named
    assert nothing_written(out)


def test_a_recipe_of_the_checkpoints_shape_is_exported_with_its_positions(run_151936, tmp_path):
    """seq_length and max_position_embeddings are no weight's shape: a recipe may state its own."""
    shape = ModelShape(TINY | {"seq_length": 64, "max_position_embeddings": 512})
    out = export_hf(run_151936, tmp_path / "hf", shape, default_tokenizer_dir(), show_progress=False)
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["max_position_embeddings"]) == (64, 2, 512)


def test_a_vocabulary_smaller_than_the_tokenizers_is_refused(run_1024, tmp_path):
    out = tmp_path / "hf"
    with pytest.raises(ValueError, match=r"vocab_size 1024 is smaller than the tokenizer's 151646 tokens") as refused:
        export_hf(run_1024, out, None, default_tokenizer_dir(), show_progress=False)
    assert "--tokenizer" in str(refused.value)
    assert nothing_written(out)
