"""Analytic parameter count of a GPT-style model (Qwen3 / Llama family), from its shape alone."""

from __future__ import annotations

from dataclasses import dataclass


def padded_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel: int = 1) -> int:
    multiple = divisible_by * tensor_parallel
    return ((vocab_size + multiple - 1) // multiple) * multiple


@dataclass(frozen=True)
class ParamCount:
    embedding: int
    output_layer: int
    per_layer: int
    num_layers: int
    final_norm: int
    active_per_layer: int = 0  # MoE: the parameters one token passes through (0 = dense, same as per_layer)

    @property
    def active(self) -> int:
        """Parameters per token, input embedding lookup excluded (the output layer is a matmul)."""
        return self.output_layer + (self.active_per_layer or self.per_layer) * self.num_layers + self.final_norm

    @property
    def non_embedding(self) -> int:
        return self.per_layer * self.num_layers + self.final_norm

    @property
    def total(self) -> int:
        return self.embedding + self.output_layer + self.non_embedding


def count_parameters(shape: dict) -> ParamCount:
    """`shape` holds GPTModelProvider field names (a model.yaml, or dataclasses.asdict(provider))."""
    h = shape["hidden_size"]
    ffn = shape["ffn_hidden_size"]
    heads = shape["num_attention_heads"]
    groups = shape.get("num_query_groups") or heads
    head_dim = shape.get("kv_channels") or h // heads
    bias = bool(shape.get("add_bias_linear", False))
    qkv_bias = bool(shape.get("add_qkv_bias", bias))
    gated = bool(shape.get("gated_linear_unit", False))
    norm_params = h if shape.get("normalization", "LayerNorm") == "RMSNorm" else 2 * h

    q_out, kv_out = heads * head_dim, groups * head_dim
    attention = h * (q_out + 2 * kv_out) + q_out * h
    attention += (q_out + 2 * kv_out) * qkv_bias + h * bias
    if shape.get("qk_layernorm", False):
        attention += 2 * (head_dim if norm_params == h else 2 * head_dim)
    def ffn_params(width: int) -> int:
        return h * width * (2 if gated else 1) + width * h + (width * (2 if gated else 1) + h) * bias

    experts = shape.get("num_moe_experts") or 0
    if experts:  # every layer MoE: a router and `experts` FFNs of moe_ffn_hidden_size, top-k active
        expert = ffn_params(shape.get("moe_ffn_hidden_size") or ffn)
        router = h * experts
        per_layer = attention + router + experts * expert + 2 * norm_params
        active_per_layer = attention + router + shape.get("moe_router_topk", 2) * expert + 2 * norm_params
    else:
        per_layer = attention + ffn_params(ffn) + 2 * norm_params
        active_per_layer = 0

    vocab = padded_vocab_size(shape["vocab_size"], shape.get("make_vocab_size_divisible_by", 128))
    embedding = vocab * h
    tied = shape.get("share_embeddings_and_output_weights", True)
    return ParamCount(
        embedding=embedding,
        output_layer=0 if tied else vocab * h,
        per_layer=per_layer,
        num_layers=shape["num_layers"],
        final_norm=norm_params,
        active_per_layer=active_per_layer,
    )
