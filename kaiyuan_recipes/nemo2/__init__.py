"""NeMo 2 (`nemo llm pretrain --factory kaiyuan_qwen3`): factories built from the same recipes/ files as the
Megatron-Bridge recipes. Lives in its own environment (nemo-toolkit 2.7, megatron-core 0.15; `make env-nemo2`)."""
