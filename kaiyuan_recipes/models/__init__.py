"""Model providers (Megatron-Bridge GPTModelProvider configurations), discoverable by name."""

from kaiyuan_recipes.models.registry import available_models, get_model_provider

__all__ = ["available_models", "get_model_provider"]
