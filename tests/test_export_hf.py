"""Megatron → HF → Megatron on the CPU for both model families: a random-weight Megatron model is
written as a HF directory (`write_hf_dir`, the last step of `export_hf`), loaded by transformers with no
remote code, imported back through AutoBridge, and every tensor compared bit for bit.
(Reading a torch_dist checkpoint needs CUDA in megatron-core 0.19's writer/reader: that part of
`export_hf` is proven on the GPU host.)"""

import json

import pytest
import torch

from kaiyuan_exporters.megatron_to_hf import bridge_for, ensure_single_process_group, write_hf_dir
from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

SMALL = dict(num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=4, num_query_groups=2,
             kv_channels=32, seq_length=256, max_position_embeddings=256, position_embedding_type="rope",
             normalization="RMSNorm", layernorm_epsilon=1e-6, gated_linear_unit=True, add_bias_linear=False,
             add_qkv_bias=False, share_embeddings_and_output_weights=False, vocab_size=151936,
             make_vocab_size_divisible_by=128)


@pytest.fixture(scope="module")
def process_group():
    ensure_single_process_group()
    yield
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def build(shape):
    """The model as training builds it: our provider (kaiyuan_recipes.models.providers)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    from kaiyuan_recipes.models.providers import build_provider

    provider = build_provider(shape | {"activation_func": "silu"})
    provider.use_cpu_initialization = True
    provider.params_dtype = torch.float32
    provider.bf16 = False
    provider.finalize()
    provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    return provider.provide()


@pytest.mark.parametrize("qk_norm, hf_class", [(True, "Qwen3ForCausalLM"), (False, "LlamaForCausalLM")])
def test_roundtrip_bit_exact(tmp_path, process_group, qk_norm, hf_class):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shape = SMALL | {"qk_layernorm": qk_norm, "rotary_base": 1000000 if qk_norm else 10000}
    tok_dir = default_tokenizer_dir()
    bridge = bridge_for(shape, tokenizer_vocab=151646)
    original = build(shape)
    with torch.no_grad():
        for p in original.parameters():
            p.normal_(0, 0.02)
    out = write_hf_dir(bridge, original, tmp_path / "hf", tok_dir, show_progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [hf_class] and config["tie_word_embeddings"] is False
    assert config["vocab_size"] == 151936 and config["kaiyuan_tokenizer_vocab_size"] == 151646
    assert (out / "generation_config.json").is_file() and not list(tmp_path.glob(".hf.*"))
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert type(hf).__name__ == hf_class
    assert torch.equal(hf.lm_head.weight, original.output_layer.weight)
    assert torch.equal(hf.model.embed_tokens.weight, original.embedding.word_embeddings.weight)
    assert AutoTokenizer.from_pretrained(str(out)).eos_token_id == 151643

    back = build(shape)
    with torch.no_grad():
        for p in back.parameters():
            p.zero_()
    bridge.load_hf_weights([back], str(out))
    theirs = dict(back.named_parameters())
    for name, tensor in original.named_parameters():
        assert torch.equal(tensor, theirs[name]), name
    with pytest.raises(FileExistsError):
        write_hf_dir(bridge, original, out)
