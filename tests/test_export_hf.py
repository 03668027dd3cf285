"""Megatron → HF → Megatron on the CPU for both model families, through real torch_dist files: a
random-weight model is written with Megatron-Bridge's checkpoint writer (gloo), exported by the CLI's
code path, loaded by transformers with no remote code, imported back to a torch_dist checkpoint and
read again; every tensor is compared bit for bit."""

import json

import pytest
import torch

from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir
from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model, import_hf
from kaiyuan_recipes.export.megatron_to_hf import bridge_for, checkpoint_shape, export_hf, newest_iteration_dir

SMALL = dict(num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=4, num_query_groups=2,
             kv_channels=32, seq_length=256, max_position_embeddings=256, position_embedding_type="rope",
             normalization="RMSNorm", layernorm_epsilon=1e-6, gated_linear_unit=True, add_bias_linear=False,
             add_qkv_bias=False, share_embeddings_and_output_weights=False, vocab_size=151936,
             make_vocab_size_divisible_by=128)


def read_checkpoint(path):
    """The weights of a torch_dist checkpoint, read by Megatron-Bridge's loader into our model."""
    from megatron.bridge.training.model_load_save import load_megatron_model

    model = load_megatron_model(str(newest_iteration_dir(path)), use_cpu_init=True)
    model = model[0] if isinstance(model, list) else model
    return {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


@pytest.mark.parametrize("qk_norm, hf_class", [(True, "Qwen3ForCausalLM"), (False, "LlamaForCausalLM")])
def test_roundtrip_through_torch_dist_bit_exact(tmp_path, process_group, qk_norm, hf_class):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shape = SMALL | {"qk_layernorm": qk_norm, "rotary_base": 1000000 if qk_norm else 10000}
    original = build_cpu_model(shape, torch.bfloat16)  # as training holds the model weights
    with torch.no_grad():
        for p in original.parameters():
            p.normal_(0, 0.02)
    bridge_for(shape, tokenizer_vocab=151646).save_megatron_model([original], tmp_path / "megatron")
    assert list((tmp_path / "megatron").glob("iter_*/*.distcp")), "not a torch_dist checkpoint"
    assert checkpoint_shape(tmp_path / "megatron")["qk_layernorm"] is qk_norm

    out = export_hf(tmp_path / "megatron", tmp_path / "hf", None, default_tokenizer_dir(), show_progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [hf_class] and config["tie_word_embeddings"] is False
    assert config["vocab_size"] == 151936 and config["kaiyuan_tokenizer_vocab_size"] == 151646
    assert (out / "generation_config.json").is_file() and not list(tmp_path.glob(".hf.*"))
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype="auto")
    assert type(hf).__name__ == hf_class and hf.dtype == torch.bfloat16
    assert torch.equal(hf.lm_head.weight, original.output_layer.weight)
    assert torch.equal(hf.model.embed_tokens.weight, original.embedding.word_embeddings.weight)
    assert torch.equal(hf.model.layers[1].mlp.down_proj.weight, original.decoder.layers[1].mlp.linear_fc2.weight)
    assert AutoTokenizer.from_pretrained(str(out)).eos_token_id == 151643
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == config["eos_token_id"] == 151643

    back = import_hf(out, tmp_path / "megatron_back", shape)
    assert not list(tmp_path.glob(".megatron_back.*"))
    theirs = read_checkpoint(back)
    ours = {k: v for k, v in original.state_dict().items() if not k.endswith("_extra_state")}
    assert set(ours) == set(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    with pytest.raises(FileExistsError):
        export_hf(tmp_path / "megatron", out, shape)


def test_export_refuses_a_directory_without_checkpoints(tmp_path, process_group):
    (tmp_path / "run").mkdir()
    with pytest.raises(FileNotFoundError, match="no iter_"):
        export_hf(tmp_path / "run", tmp_path / "hf", SMALL)
    assert not (tmp_path / "hf").exists()


def test_export_names_an_fsdp_dtensor_checkpoint(tmp_path, process_group):
    """kaiyuan.zero_stage=2 (Megatron-FSDP) saves fsdp_dtensor; the export says so instead of failing deep inside."""
    it = tmp_path / "run" / "checkpoints" / "iter_0000010"
    it.mkdir(parents=True)
    (it / "run_config.yaml").write_text("checkpoint:\n  ckpt_format: fsdp_dtensor\nmodel:\n  num_layers: 2\n")
    with pytest.raises(ValueError, match=r"run_config.yaml: checkpoint.ckpt_format is 'fsdp_dtensor'"):
        export_hf(tmp_path / "run", tmp_path / "hf", SMALL)
    assert not (tmp_path / "hf").exists()


def test_export_takes_eos_and_pad_from_the_tokenizer(tmp_path, process_group):
    """A tokenizer whose end of text is not Qwen's (GLM-5.2's for laoyao_moe_2b): generation_config.json and
    config.json carry its ids, so generation stops where the tokenizer says."""
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(default_tokenizer_dir(), tok)
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg | {"eos_token": "<|im_end|>",
                                                                 "pad_token": "<|endoftext|>"}))
    model = build_cpu_model(SMALL, torch.bfloat16)
    bridge_for(SMALL, tokenizer_vocab=151646).save_megatron_model([model], tmp_path / "megatron")
    out = export_hf(tmp_path / "megatron", tmp_path / "hf", None, tok, show_progress=False)
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (151645, 151643)
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 151645


def test_export_reads_a_fast_spec_checkpoint(tmp_path, process_group):
    """A run trained on the fast spec records our layer-spec function and apply_rope_fusion=True in
    run_config.yaml. `kaiyuan export hf` in a fresh process (as after training) rebuilds that model: our
    module allowlisted for Megatron-Bridge's instantiation, the compiled RoPE hooks filled before the config
    is validated."""
    import os
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    shape = SMALL | {"qk_layernorm": True, "rotary_base": 1000000}
    original = build_cpu_model(shape, torch.bfloat16, layer_spec="fast")
    bridge_for(shape, tokenizer_vocab=151646).save_megatron_model([original], tmp_path / "megatron")
    run_config = (newest_iteration_dir(tmp_path / "megatron") / "run_config.yaml").read_text()
    assert "kaiyuan_recipes.fastpath.spec.fast_layer_spec" in run_config and "apply_rope_fusion: true" in run_config
    done = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "export", "hf", str(tmp_path / "megatron"),
                           str(tmp_path / "hf")], capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype="auto")
    assert torch.equal(hf.model.layers[1].mlp.down_proj.weight, original.decoder.layers[1].mlp.linear_fc2.weight)
    assert torch.equal(hf.lm_head.weight, original.output_layer.weight)
