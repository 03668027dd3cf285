"""A model's shape, and every translation of it: the Megatron provider, the Hugging Face config, the NeMo 2
config and the parameter count. Recipes state the shape once in recipes/<name>/model.yaml (GPTModelProvider field
names); the sequence length is the data's (dataset.seq_length), never restated there.

The HF direction is hf_config.py (checked against Megatron-Bridge's own HF → provider mapping in
tests/test_model_shape.py); the count is param_count.py (checked against built models)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

# The fields that decide a model's maths: what a checkpoint's run_config.yaml is read back into for export.
SHAPE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "kv_channels", "seq_length", "max_position_embeddings", "normalization", "layernorm_epsilon",
                "gated_linear_unit", "add_bias_linear", "qk_layernorm", "rotary_base",
                "share_embeddings_and_output_weights", "vocab_size", "make_vocab_size_divisible_by",
                "num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk", "moe_router_pre_softmax",
                "moe_aux_loss_coeff")
# model.yaml fields that NeMo 2's config classes do not take (NeMo 2 pads the vocabulary itself).
NOT_NEMO2_FIELDS = ("max_position_embeddings", "should_pad_vocab")


@dataclass(frozen=True)
class ModelShape:
    fields: Mapping[str, Any] = field(default_factory=dict)  # GPTModelProvider field names, activation by name

    @classmethod
    def of(cls, shape: "ModelShape | Mapping[str, Any]") -> "ModelShape":
        return shape if isinstance(shape, ModelShape) else cls(dict(shape))

    @classmethod
    def for_recipe(cls, name: str) -> "ModelShape":
        """recipes/<name>/model.yaml with the recipe's dataset.seq_length."""
        from kaiyuan_recipes.config.recipe_tree import load_model_file, load_recipe_tree

        seq_length = int(load_recipe_tree(name).dataset.seq_length)
        return cls({**load_model_file(name), "seq_length": seq_length})

    @classmethod
    def from_run_config(cls, model_section: Mapping[str, Any]) -> "ModelShape":
        """The shape a checkpoint was trained with, from its run_config.yaml's model section."""
        return cls({k: model_section[k] for k in SHAPE_FIELDS if model_section.get(k) is not None})

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def with_fields(self, **changes: Any) -> "ModelShape":
        return ModelShape({**self.fields, **changes})

    @property
    def max_positions(self) -> int | None:
        return self.fields.get("max_position_embeddings")

    def provider(self, layer_spec: str = "auto") -> Any:
        """Megatron-Bridge's GPTModelProvider on the given layer spec."""
        from kaiyuan_recipes.models.providers import build_provider

        return build_provider(dict(self.fields), layer_spec)

    def hf_config(self, tokenizer_vocab: int | None = None, **special: Any) -> Any:
        """The transformers config with the same maths (special: dtype, eos_token_id, pad_token_id)."""
        from kaiyuan_recipes.models.hf_config import hf_config_for

        return hf_config_for(dict(self.fields), tokenizer_vocab, **special)

    def nemo2_config(self) -> Any:
        """NeMo 2's Qwen3Config (QK-norm) or GPTConfig with these fields, as a NeMo-Run Config (NeMo 2 env only)."""
        import nemo_run as run
        import torch.nn.functional as F
        from nemo.collections import llm

        fields = {k: v for k, v in self.fields.items() if k not in NOT_NEMO2_FIELDS}
        fields["activation_func"] = getattr(F, fields.get("activation_func", "silu"))
        cls = llm.Qwen3Config if self.fields.get("qk_layernorm") else llm.GPTConfig
        return run.Config(cls, **fields)

    def parameters(self) -> Any:
        """The analytic parameter count (param_count.ParamCount)."""
        from kaiyuan_recipes.models.param_count import count_parameters

        return count_parameters(dict(self.fields))


# The `kaiyuan_recipes.models` entry points (models/registry.py): one provider factory per shipped recipe.
def provider_for_recipe(name: str, layer_spec: str = "auto"):
    return ModelShape.for_recipe(name).provider(layer_spec)


def gpt_smoke(layer_spec: str = "auto"):
    """~340M GPT (12 layers, 768 hidden, GQA 8/4, SwiGLU, RoPE, untied embeddings)."""
    return provider_for_recipe("gpt_smoke", layer_spec)


def qwen3_1p7b(layer_spec: str = "auto"):
    """Qwen3-1.7B shape: 28 layers, 2048 hidden, GQA 16/8, QK-norm, untied; 2.03B parameters."""
    return provider_for_recipe("qwen3_1p7b", layer_spec)


def laoyao_moe_2b(layer_spec: str = "auto"):
    """~2B-total / ~0.5B-active Qwen3-MoE-style model: 24 layers, 64 experts of 320, top-8, GLM-5.2 vocab."""
    return provider_for_recipe("laoyao_moe_2b", layer_spec)
