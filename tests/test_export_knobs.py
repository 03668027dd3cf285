"""Every checkpoint `kaiyuan train` can write exports: for each supported knob combination the config is
built by build_config (as training builds it), a real torch_dist checkpoint of that model is written with
Megatron-Bridge's writer and given the run_config.yaml training writes (cfg.to_yaml), and `kaiyuan export hf`
is run on it in a fresh process, as a user runs it on an export host (no training-time patches installed)."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from kaiyuan_recipes.export.megatron_to_hf import newest_iteration_dir
from kaiyuan_recipes.fastpath import TRAINING_STEP_MODEL_FIELDS
from kaiyuan_recipes.training.config import build_config

# gpt_smoke at a size the CPU writes and exports in seconds (the real vocabulary: the bundled tokenizer ships).
SMALL = ["model.num_layers=2", "model.hidden_size=64", "model.ffn_hidden_size=128", "model.num_attention_heads=4",
         "model.num_query_groups=2", "model.kv_channels=16"]
COMBINATIONS = {
    "fast_graph_wgrad_chunked_zero1": ["kaiyuan.layer_spec=fast", "kaiyuan.cuda_graph=true",
                                       "kaiyuan.wgrad_fusion=true", "kaiyuan.zero_stage=1"],
    "fast_eager_zero0": ["kaiyuan.layer_spec=fast", "kaiyuan.cuda_graph=false", "kaiyuan.wgrad_fusion=false",
                         "kaiyuan.zero_stage=0"],
    "fast_graph_only_full_logits": ["kaiyuan.layer_spec=fast", "kaiyuan.cuda_graph=true",
                                    "kaiyuan.wgrad_fusion=false", "kaiyuan.chunked_loss=false"],
    "fast_wgrad_only": ["kaiyuan.layer_spec=fast", "kaiyuan.cuda_graph=false", "kaiyuan.wgrad_fusion=true"],
    "local_zero1": ["kaiyuan.layer_spec=local", "kaiyuan.zero_stage=1"],
}


def write_training_checkpoint(cfg, out):
    """A torch_dist checkpoint of cfg.model (random weights) whose run_config.yaml is what training writes.
    The model is built with the training-step fields off (their kernels need CUDA), then the config object it
    holds gets training's values back, as a training process's model has them."""
    from megatron.bridge.training.model_load_save import save_megatron_model

    from kaiyuan_recipes.models.providers import provide_on_cpu

    trained = {k: getattr(cfg.model, k) for k in TRAINING_STEP_MODEL_FIELDS}
    for key, value in TRAINING_STEP_MODEL_FIELDS.items():
        setattr(cfg.model, key, value)
    model = provide_on_cpu(cfg.model).to(torch.bfloat16)
    for key, value in trained.items():
        setattr(cfg.model, key, value)
    save_megatron_model([model], out)
    cfg.to_yaml(str(newest_iteration_dir(out) / "run_config.yaml"))
    return model


def test_step_only_fields_are_every_field_the_step_knobs_change():
    """The graph and wgrad knobs change exactly TRAINING_STEP_MODEL_FIELDS (and the graph's pool setting): a new
    field they set must be added there, or the export would rebuild with it."""
    on, _ = build_config("gpt_smoke", SMALL + COMBINATIONS["fast_graph_wgrad_chunked_zero1"])
    off, _ = build_config("gpt_smoke", SMALL + COMBINATIONS["fast_eager_zero0"][:-1] + ["kaiyuan.zero_stage=1"])
    changed = {f.name for f in dataclasses.fields(on.model) if getattr(on.model, f.name) != getattr(off.model, f.name)}
    assert changed - {"cuda_graph_use_single_mempool"} == set(TRAINING_STEP_MODEL_FIELDS)
    assert all(getattr(off.model, k) == v for k, v in TRAINING_STEP_MODEL_FIELDS.items())


def test_every_knob_combination_exports_in_a_fresh_process(tmp_path, process_group):
    written = {}
    for name, knobs in COMBINATIONS.items():
        cfg, _ = build_config("gpt_smoke", SMALL + knobs + [f"kaiyuan.run_root={tmp_path / 'runs'}"])
        model = write_training_checkpoint(cfg, tmp_path / name)
        recorded = (newest_iteration_dir(tmp_path / name) / "run_config.yaml").read_text()
        if "graph" in name and "only" not in name:
            assert "full_iteration" in recorded and "gradient_accumulation_fusion: true" in recorded
        written[name] = model.state_dict()["decoder.layers.1.mlp.linear_fc2.weight"].clone()
    # One process for all exports: what a user's export host has (none of training's patches).
    script = ("import sys; from kaiyuan_recipes.cli.main import main\n"
              "for name in sys.argv[2:]:\n"
              "    rc = main(['export', 'hf', f'{sys.argv[1]}/{name}', f'{sys.argv[1]}/{name}_hf'])\n"
              "    assert rc == 0, name\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path), *COMBINATIONS], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from safetensors.torch import load_file

    for name, weight in written.items():
        out = tmp_path / f"{name}_hf"
        assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"], name
        tensors = {}
        for shard in out.glob("*.safetensors"):
            tensors |= load_file(shard)
        assert torch.equal(tensors["model.layers.1.mlp.down_proj.weight"], weight), name


def test_zero2_checkpoint_is_refused_with_the_way_to_an_exportable_one(tmp_path, process_group):
    from kaiyuan_recipes.export.megatron_to_hf import export_hf

    cfg, _ = build_config("gpt_smoke", SMALL + ["kaiyuan.layer_spec=fast", "kaiyuan.zero_stage=2"])
    assert cfg.checkpoint.ckpt_format == "fsdp_dtensor"
    write_training_checkpoint(cfg, tmp_path / "zero2")
    with pytest.raises(ValueError, match=r"fsdp_dtensor.*kaiyuan.zero_stage=1"):
        export_hf(tmp_path / "zero2", tmp_path / "out")
    assert not (tmp_path / "out").exists()
