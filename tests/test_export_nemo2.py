"""The Bridge half of a NeMo 2 checkpoint's export: a weights file as kaiyuan_recipes.nemo2.weights writes it (the
state dict of NeMo's LightningModule, `module.` first, and the model config) → `kaiyuan export hf` → transformers
loads it with the same tensors. The NeMo half (NeMo's loader on a trained checkpoint) runs on the GPU host
(tests/gpu/nemo2_pretrain.sh --part resume dumps them, --part export exports them)."""

import pytest
import torch
from test_export_hf import SMALL

from kaiyuan_recipes.cli.main import main
from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model
from kaiyuan_recipes.nemo2.weights import FORMAT, load_weights, newest_checkpoint, save_weights

SHAPE = SMALL | {"qk_layernorm": True, "rotary_base": 1000000}


def nemo_style_dump(path, model, **config):
    meta = {"checkpoint": "/runs/x/checkpoints/x--step=99-last", "model_class": "Qwen3Model",
            "config": {"num_layers": SHAPE["num_layers"], "hidden_size": SHAPE["hidden_size"], **config}}
    return save_weights({f"module.{k}": v for k, v in model.state_dict().items()}, meta, path)


@pytest.fixture
def original(process_group):
    model = build_cpu_model(SHAPE, torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    return model


def test_nemo2_weights_export_to_hf_with_the_same_tensors(tmp_path, original, monkeypatch):
    from transformers import AutoModelForCausalLM

    from kaiyuan_recipes.models import shape as shape_module

    weights = nemo_style_dump(tmp_path / "w.safetensors", original)
    state, meta = load_weights(weights)
    assert not any(k.startswith("module.") for k in state) and meta["model_class"] == "Qwen3Model"
    monkeypatch.setattr(shape_module.ModelShape, "for_recipe",
                        staticmethod(lambda name: shape_module.ModelShape(SHAPE)))
    assert main(["export", "hf", str(weights), str(tmp_path / "hf"), "--recipe", "small"]) == 0
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype="auto")
    assert type(hf).__name__ == "Qwen3ForCausalLM" and hf.dtype == torch.bfloat16
    assert torch.equal(hf.lm_head.weight, original.output_layer.weight)
    assert torch.equal(hf.model.layers[1].self_attn.q_norm.weight,
                       original.decoder.layers[1].self_attention.q_layernorm.weight)
    assert torch.equal(hf.model.layers[0].post_attention_layernorm.weight,
                       original.decoder.layers[0].pre_mlp_layernorm.weight)


def test_a_checkpoint_of_another_shape_is_named(tmp_path, original, monkeypatch):
    from kaiyuan_recipes.export.nemo2_to_hf import export_nemo2_hf
    from kaiyuan_recipes.models.shape import ModelShape

    weights = nemo_style_dump(tmp_path / "w.safetensors", original, hidden_size=256)
    with pytest.raises(ValueError, match=r"w.safetensors.*hidden_size: checkpoint 256, recipe 128"):
        export_nemo2_hf(weights, tmp_path / "hf", ModelShape(SHAPE))
    assert not (tmp_path / "hf").exists()


def test_missing_tensors_are_named_and_nothing_is_written(tmp_path, original):
    from kaiyuan_recipes.export.nemo2_to_hf import export_nemo2_hf
    from kaiyuan_recipes.models.shape import ModelShape

    state = {f"module.{k}": v for k, v in original.state_dict().items() if "linear_fc2" not in k}
    weights = save_weights(state, {"config": {}}, tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match=r"missing \['decoder.layers.0.mlp.linear_fc2.weight'"):
        export_nemo2_hf(weights, tmp_path / "hf", ModelShape(SHAPE))
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf.*"))


def test_another_safetensors_file_is_refused(tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"model.safetensors: not a weights file.*expected '{FORMAT}'"):
        load_weights(tmp_path / "model.safetensors")


def test_a_nemo2_checkpoint_directory_gets_the_two_commands(tmp_path, capsys):
    ckpt = tmp_path / "run" / "kaiyuan_gpt_smoke" / "checkpoints" / "kaiyuan_gpt_smoke--step=99-last"
    for sub in ("weights", "context"):
        (ckpt / sub).mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"a NeMo 2 checkpoint; dump its weights .*kaiyuan_recipes.nemo2.weights"):
        main(["export", "hf", str(tmp_path / "run"), str(tmp_path / "hf")])


def test_the_newest_nemo2_checkpoint_with_its_context(tmp_path):
    root = tmp_path / "run" / "kaiyuan_gpt_smoke" / "checkpoints"
    names = {"m--step=59-epoch=0": ("weights", "context"), "m--step=79-epoch=0": ("weights",),
             "m--step=39-epoch=0": ("weights", "context")}
    for name, subs in names.items():
        for sub in subs:
            (root / name / sub).mkdir(parents=True)
    assert newest_checkpoint(tmp_path / "run").name == "m--step=59-epoch=0"
    assert newest_checkpoint(root / "m--step=39-epoch=0").name == "m--step=39-epoch=0"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: no NeMo 2 checkpoint"):
        newest_checkpoint(tmp_path / "empty")
