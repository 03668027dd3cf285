"""Checkpoint tools on a CPU host (`kaiyuan ckpt …`): list a run's saves, inspect, verify and diff checkpoints from
torch.distributed.checkpoint's metadata and Megatron-Bridge's run_config.yaml, reading tensors one stored chunk at a
time. store: paths and small files; regions: chunked reads; listing, inspect, verify, diff: one command each."""
