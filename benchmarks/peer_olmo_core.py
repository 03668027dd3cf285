"""OLMo-core 3.0.0's own qwen3 1.7B training (`TransformerConfig.qwen3_1_7B`, its TransformerTrainModule and
Trainer) on the token stream `ours` reads, at our batch: one process, one GPU; train_throughput.py runs it as the
`olmo_core` row.

What the row sets, and why (the model is OLMo-core's qwen3_1_7B as it ships; the train module follows its
cookbook, olmo_core.internal.cookbook.configure_train_module, where the table does not say otherwise):
| setting                       | value                            | why                                             |
|-------------------------------|----------------------------------|-------------------------------------------------|
| max_sequence_length           | 4096                             | our sequence length                             |
| rank_microbatch_size          | 2 x 4096 tokens                  | our micro-batch                                 |
| global batch                  | 8 x 4096 tokens (4 micro-batches)| our 32,768 tokens per step                      |
| dp_config                     | FSDP, param bf16, reduce fp32    | the cookbook's (HSDP there: the same on one GPU)|
|                               |                                  | fp32 weights, bf16 compute                      |
| compile_model                 | true                             | the cookbook's: per-block compile               |
| CUDA graph                    | none                             | OLMo-core's trainer has none                    |
| lm_head loss_implementation   | default (whole logits, PyTorch)  | its fused_linear needs Liger-Kernel (not here)  |
| attention                     | PyTorch SDPA (its "torch" backend)| flash-attn is not installed                    |
| ac_config                     | none                             | the cookbook's at a memory budget of 1.0; 80 GB |
|                               |                                  | holds the step without it                       |
| optimizer                     | AdamW lr 3e-4, betas .9/.95,     | ours' values so the losses compare; wd on every |
|                               | eps 1e-8, wd 0.1, fused, clip 1  | tensor (ours: not on norms; the cookbook: not on|
|                               |                                  | embeddings, its SkipStepAdamW with foreach)     |
| scheduler                     | linear warmup over --steps       | ours ramps 0 -> 3e-4 over the 15 steps          |
| z-loss (cookbook 1e-5), float8| off                              | ours has neither; float8 needs torchao (absent) |
| profiler (--profile-step P)   | its ProfilerCallback: wait P-2,  | train_throughput.py --profile: step P alone is  |
|                               | warm up 1, record 1 step; no     | traced; the trace is written when the next batch|
|                               | stack or shapes                  | loads, so training runs to P + 1 (not timed)    |
| data loader                   | this file's: token_stream.py's   | the same tokens in the same order as `ours`;    |
|                               | stream, labels given             | labels given, so no position is dropped          |

Model differences against kaiyuan's qwen3_1p7b (same where not listed; the same shape as torchtitan's, see
peer_torchtitan.py): tied embeddings (1.72 B parameters against ours' 2.03 B untied; same FLOPs per token);
RMSNorm of Qwen's form (fp32 inside) with eps 1e-6; init N(0, 0.02) everywhere (ours scales output projections).

usage: python benchmarks/peer_olmo_core.py --stream stream.npy --out row.json [--steps 15] [--profile-step 17]
       CPU check: python benchmarks/peer_olmo_core.py --check --stream stream.npy [--profile-step 5] (a 2-layer
       model of the same vocabulary, eager, fp32, three steps of OLMo-core's Trainer on the first 129 tokens of
       each window; with --profile-step, on to that step under its profiler)"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from olmo_core.config import DType
from olmo_core.data.collator import DataCollator
from olmo_core.data.data_loader import TextDataLoaderBase
from olmo_core.distributed.parallel import DataParallelType
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig, LinearWithWarmup
from olmo_core.train import Duration, TrainerConfig, prepare_training_environment, teardown_training_environment
from olmo_core.train.callbacks import Callback, GPUMemoryMonitorCallback, ProfilerCallback, SpeedMonitorCallback
from olmo_core.train.train_module import TransformerDataParallelConfig, TransformerTrainModuleConfig
from olmo_core.version import VERSION

MICRO_BATCH, MICRO_BATCHES = 2, 4  # megatron_rows.BATCH["qwen3_1p7b"]
VOCAB = 151936  # kaiyuan's qwen3_1p7b (Qwen3's padded vocabulary)
OURS_LR, OURS_WEIGHT_DECAY, OURS_CLIP = 3e-4, 0.1, 1.0


class StreamDataLoader(TextDataLoaderBase):
    """token_stream.py's windows in order, one rank's batch (global batch, in tokens) at a time: input_ids the
    first `seq` tokens of each window, labels the last `seq` (every position trained, as ours)."""

    def __init__(self, path: str, seq: int, *, work_dir: str, global_batch_size: int):
        super().__init__(collator=DataCollator(pad_token_id=0), work_dir=work_dir,
                         global_batch_size=global_batch_size)
        self.stream = np.load(path, mmap_mode="r")
        if self.stream.shape[1] < seq + 1:
            raise ValueError(f"{path}: windows of {self.stream.shape[1]} tokens, the run needs {seq + 1}")
        self.seq = seq

    @property
    def rows_per_batch(self) -> int:
        return self.global_batch_size // self.seq

    @property
    def total_batches(self) -> int:
        return len(self.stream) // self.rows_per_batch

    def _iter_batches(self):
        for first in range(self.batches_processed * self.rows_per_batch, len(self.stream) - self.rows_per_batch + 1,
                           self.rows_per_batch):
            # a shorter run (the CPU check) reads each window's start
            rows = torch.from_numpy(np.array(self.stream[first:first + self.rows_per_batch, :self.seq + 1],
                                             dtype=np.int64))
            yield {"input_ids": rows[:, :-1], "labels": rows[:, 1:]}

    def state_dict(self) -> dict:
        return {"batches_processed": self.batches_processed, "epoch": self._epoch}

    def load_state_dict(self, state_dict: dict) -> None:
        self.batches_processed, self._epoch = state_dict["batches_processed"], state_dict["epoch"]

    def reshuffle(self, epoch: int | None = None, **kwargs) -> None:
        self._epoch = epoch if epoch is not None else (self._epoch or 0) + 1  # the stream's order is fixed

    def get_mock_batch(self) -> dict:
        rows = torch.zeros((self.rows_per_batch, self.seq), dtype=torch.long)
        return {"input_ids": rows, "labels": rows}


class StepRecorder(Callback):
    """Each step's metrics as OLMo-core's callbacks recorded them (a step's may come in several calls), plus torch's
    peak allocated memory."""

    def __init__(self) -> None:
        super().__init__()
        self.by_step: dict[int, dict] = {}

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        record = self.by_step.setdefault(step, {"step": step})
        record.update({k: float(v) for k, v in metrics.items()})
        if torch.cuda.is_available():
            record["peak_allocated_gb"] = max(record.get("peak_allocated_gb", 0.0),
                                              torch.cuda.max_memory_allocated() / 1e9)

    @property
    def steps(self) -> list[dict]:
        return [self.by_step[step] for step in sorted(self.by_step) if step > 0]  # step 0: set-up metrics


def model_config(tiny: bool) -> TransformerConfig:
    config = TransformerConfig.qwen3_1_7B(vocab_size=VOCAB)
    if tiny:  # the same vocabulary and block layout at 2 layers of 64 (the CPU check)
        attention = config.block.sequence_mixer
        config.d_model, config.n_layers, config.block.feed_forward.hidden_size = 64, 2, 128
        attention.n_heads, attention.n_kv_heads, attention.head_dim = 4, 2, 16
    return config


def train_module_config(seq: int, steps: int, gpu: bool) -> TransformerTrainModuleConfig:
    return TransformerTrainModuleConfig(
        rank_microbatch_size=MICRO_BATCH * seq, max_sequence_length=seq,
        optim=AdamWConfig(lr=OURS_LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=OURS_WEIGHT_DECAY, fused=gpu),
        max_grad_norm=OURS_CLIP, scheduler=LinearWithWarmup(warmup=steps, alpha_f=1.0),
        compile_model=gpu,
        dp_config=TransformerDataParallelConfig(name=DataParallelType.fsdp, param_dtype=DType.bfloat16,
                                                reduce_dtype=DType.float32) if gpu else None)


def attention_backend(model) -> str | None:
    """The attention backend the built model's blocks run (OLMo-core picks it when the config leaves it open)."""
    block = next(iter(model.blocks.values()), None)
    backend = getattr(getattr(block, "attention", None), "backend", None)
    return type(backend).__name__ if backend is not None else None


def profiler_callback(profile_step: int) -> ProfilerCallback:
    """OLMo-core's profiler for training step `profile_step` alone. It steps its schedule as each batch after the
    first loads (training step s runs in profiler step s - 1): it waits P - 2 steps, warms up on step P - 1,
    records step P and writes the trace as batch P + 1 loads."""
    if profile_step < 3:
        raise ValueError(f"--profile-step {profile_step}: the profiler needs a warm-up step after step 1")
    return ProfilerCallback(skip_first=0, wait=profile_step - 2, warmup=1, active=1, repeat=1, with_stack=False)


def trace_path(work_dir: str, profile_step: int) -> Path:
    """Where ProfilerCallback writes rank 0's trace of `profile_step` (its work_dir/profiler, step_num then P)."""
    return Path(work_dir) / "profiler" / f"rank-0-step-{profile_step}.chrome_trace.json.gz"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(stream: str, seq: int, steps: int, tiny: bool, gpu: bool, profile_step: int | None = None) -> dict:
    """Build OLMo-core's train module and Trainer and fit; the median of the steady steps. With `profile_step`
    (past `steps` and a warm-up step), training goes on to step profile_step + 1 and OLMo-core's profiler records
    step profile_step; the steps past `steps` are not timed, the learning-rate ramp stays `steps` long."""
    if profile_step is not None and profile_step <= steps + 1:
        raise ValueError(f"--profile-step {profile_step}: past the timed steps and a warm-up step "
                         f"(at least {steps + 2})")
    total = profile_step + 1 if profile_step else steps
    if gpu:  # a one-process group, as torchrun --nproc-per-node=1 would set it
        for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
            os.environ.setdefault(key, value)
    prepare_training_environment(seed=1234, backend="cpu:gloo,cuda:nccl" if gpu else None)
    work = tempfile.mkdtemp(prefix="olmo-core-")
    try:
        device = torch.device("cuda" if gpu else "cpu")
        config = model_config(tiny)
        model = config.build(init_device="meta")
        train_module = train_module_config(seq, steps, gpu).build(model, device=device)
        loader = StreamDataLoader(stream, seq, work_dir=work, global_batch_size=MICRO_BATCH * MICRO_BATCHES * seq)
        recorder = StepRecorder()
        callbacks = {"recorder": recorder, "speed": SpeedMonitorCallback()}
        if gpu:
            callbacks["gpu_memory"] = GPUMemoryMonitorCallback()
        if profile_step:
            callbacks["profiler"] = profiler_callback(profile_step)
        trainer = TrainerConfig(save_folder=work, work_dir=work, max_duration=Duration.steps(total),
                                metrics_collect_interval=1, cancel_check_interval=total + 1, no_checkpoints=True,
                                no_evals=True, callbacks=callbacks).build(train_module, loader)
        trainer.fit()
        params = sum(p.numel() for p in model.parameters())
        flops = train_module.num_flops_per_token(seq)
    finally:
        teardown_training_environment()
    steps_done = [s for s in recorder.steps if s["step"] <= steps]  # a profiled tail is not timed
    steady = steps_done[3:] or steps_done  # the CPU check's three steps are all it has
    if not steps_done:
        return {"error": f"0 of {total} steps logged"}
    timed = [s for s in steady if "throughput/device/TPS" in s]  # its speed monitor skips the first step
    row = {"tokens_per_s": statistics.median(s["throughput/device/TPS"] for s in timed),
           "own_flops_per_token": flops,
           "timed_steps": len(timed),
           "losses": [s.get("train/CE loss") for s in steps_done],
           "model_settings": {"framework": "olmo_core", "version": VERSION, "model": "qwen3_1_7B",
                              "parameters": params, "tied_embeddings": config.tie_word_embeddings, "tiny": tiny,
                              "attention_backend": attention_backend(model), "training_steps": total,
                              "train_module": train_module_config(seq, steps, gpu).as_config_dict(),
                              "profiler": {k: getattr(callbacks["profiler"], k) for k in
                                           ("wait", "warmup", "active", "repeat", "with_stack")}
                              if profile_step else None}}
    if gpu:
        row["own_tflops"] = statistics.median(s["throughput/device/TFLOPs_per_GPU"] for s in timed)
        row["peak_mem_gb"] = max(s.get("peak_allocated_gb", 0.0) for s in steps_done)
    if profile_step:
        trace = trace_path(work, profile_step)
        row["profile"] = {"step": profile_step, "trace": str(trace)} if trace.exists() else {
            "step": profile_step, "error": f"no trace at {trace}"}
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stream", type=Path, required=True, help="token_stream.py's .npy")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--profile-step", type=int, help="go on to this step (past --steps + 1) and keep OLMo-core's "
                    "PyTorch profiler trace of it")
    ap.add_argument("--check", action="store_true", help="the CPU check: a 2-layer model, 3 steps, eager fp32")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.check:
        result = train(str(args.stream), min(args.seq, 128), 3, tiny=True, gpu=False, profile_step=args.profile_step)
    elif not torch.cuda.is_available():
        raise SystemExit("the olmo_core row trains on a CUDA GPU; --check runs a tiny model on the CPU")
    else:
        result = train(str(args.stream), args.seq, args.steps, tiny=False, gpu=True, profile_step=args.profile_step)
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
