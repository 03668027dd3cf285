"""Megatron checkpoints of kaiyuan-recipes models to and from Hugging Face (and NeMo 2), and checkpoint averaging."""
