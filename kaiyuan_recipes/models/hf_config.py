"""The Hugging Face config with the same math as a recipe's model shape (models/shape.py): MoE →
Qwen3MoeForCausalLM; Qwen3 (QK-norm) → Qwen3ForCausalLM; the GPT shape without QK-norm (RoPE, RMSNorm, SwiGLU,
GQA, no bias) → LlamaForCausalLM.
The padded vocabulary is kept (as Qwen's own checkpoints do) and the tokenizer's size recorded."""

from __future__ import annotations

from typing import Any


def hf_config_for(shape: dict[str, Any], tokenizer_vocab: int | None = None, dtype: str = "bfloat16",
                  eos_token_id: int | None = None, pad_token_id: int | None = None):
    """eos / pad default to the bundled Qwen2 tokenizer's <|endoftext|>; pad defaults to eos."""
    from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

    from kaiyuan_recipes.data.tokenizer import SPECIAL_TOKENS

    eos = SPECIAL_TOKENS["<|endoftext|>"] if eos_token_id is None else eos_token_id

    if shape.get("add_bias_linear") or not shape.get("gated_linear_unit") or shape.get("normalization") != "RMSNorm":
        raise ValueError("model.yaml: only bias-free SwiGLU + RMSNorm models have a standard HF class here")
    common = dict(
        vocab_size=shape["vocab_size"],
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["ffn_hidden_size"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_attention_heads"],
        num_key_value_heads=shape.get("num_query_groups") or shape["num_attention_heads"],
        head_dim=shape.get("kv_channels") or shape["hidden_size"] // shape["num_attention_heads"],
        max_position_embeddings=shape.get("max_position_embeddings", shape.get("seq_length", 4096)),
        rms_norm_eps=shape.get("layernorm_epsilon", 1e-6),
        rope_theta=float(shape.get("rotary_base", 10000)),
        tie_word_embeddings=bool(shape.get("share_embeddings_and_output_weights", False)),
        hidden_act="silu",
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=eos if pad_token_id is None else pad_token_id,
        dtype=dtype,
    )
    if shape.get("num_moe_experts"):
        if not shape.get("qk_layernorm"):
            raise ValueError("model.yaml: an MoE model exports as Qwen3MoeForCausalLM, which has QK-norm")
        config = Qwen3MoeConfig(**common, attention_bias=False, num_experts=shape["num_moe_experts"],
                                num_experts_per_tok=shape.get("moe_router_topk", 2),
                                moe_intermediate_size=shape.get("moe_ffn_hidden_size") or shape["ffn_hidden_size"],
                                norm_topk_prob=not shape.get("moe_router_pre_softmax", False), decoder_sparse_step=1,
                                mlp_only_layers=[], router_aux_loss_coef=shape.get("moe_aux_loss_coeff", 1e-3))
        config.architectures = ["Qwen3MoeForCausalLM"]
    elif shape.get("qk_layernorm"):
        config = Qwen3Config(**common, attention_bias=False)
        config.architectures = ["Qwen3ForCausalLM"]
    else:
        config = LlamaConfig(**common, attention_bias=False, mlp_bias=False)
        config.architectures = ["LlamaForCausalLM"]
    if tokenizer_vocab is not None:
        config.kaiyuan_tokenizer_vocab_size = tokenizer_vocab  # ids >= this are padding rows
    return config
