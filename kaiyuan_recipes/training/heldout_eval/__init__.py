"""kaiyuan.heldout_eval: the held-out set scored on the model during training.

check.py refuses a bad file or layout when the config is built; scorer.py runs the model's forward over the
samples (data / tensor parallel, chunked loss); callback.py is the Megatron-Bridge callback that schedules it and
reports the figures. The scoring definitions are kaiyuan_recipes/data/heldout_scoring.py's, shared with
`kaiyuan eval heldout`. Nothing is imported here: the config check must not pull in torch."""
