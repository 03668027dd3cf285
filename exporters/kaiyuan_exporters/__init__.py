"""kaiyuan_exporters: Megatron checkpoints of kaiyuan-recipes models to and from Hugging Face."""
