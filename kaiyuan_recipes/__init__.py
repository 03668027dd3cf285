"""kaiyuan-recipes: Megatron-Bridge / NeMo recipes for pretraining the Kaiyuan-2B family."""

__version__ = "0.1.0"
