"""torchtitan's own qwen3 1.7B training (its `qwen3_1_7b` config, its Trainer) on the token stream `ours` reads,
at our batch: one process, one GPU; train_throughput.py runs it as the `torchtitan` / `torchtitan_untied` rows.

What the row changes in the peer's config, and why (everything else is torchtitan's own `qwen3_1_7b`):
| setting                     | value                          | why                                                   |
|-----------------------------|--------------------------------|-------------------------------------------------------|
| training.seq_len            | 4096                           | our sequence length (the peer's config has 4096 too)  |
| training.local_batch_size   | 2                              | our micro-batch                                       |
| training.global_batch_size  | 8 (4 accumulation steps)       | our 32,768 tokens per step                            |
| training.steps              | --steps (15)                   | as `ours`; tokens/s is the median of steps 4..15      |
| training.dtype / mixed_precision_param | float32 / bfloat16  | the peer's default: fp32 weights, bf16 compute via    |
|                             |                                | FSDP2's mixed precision on a 1-GPU mesh               |
| training.disable_cuda_graphs | false                         | the peer's default: fwd+bwd of a micro-batch replayed |
|                             |                                | as one CUDA graph (its answer to our whole-step graph)|
| compile.enable, components  | true, [model, loss]            | the authors' advice for speed: per-block compile      |
| loss                        | ChunkedLossWrapper(8 chunks)   | the peer's config: lm_head + CE chunked over sequence |
| activation_checkpoint       | none                           | the config has selective AC; 80 GB holds the step     |
|                             |                                | without it (--ac selective if it does not)            |
| attention                   | flex (the config's backend)    | its flex_flash needs the CuTe flash package; masks    |
|                             |                                | plain causal (positions 0..4095), as Megatron's mock  |
|                             |                                | data trains (no reset at end-of-document)             |
| optimizer                   | AdamW lr 3e-4, betas .9/.95,   | ours' values (the config: 8e-4) so the losses compare;|
|                             | eps 1e-8, wd 0.1, fused, clip 1| wd on every tensor (ours: not on norms)               |
| lr_scheduler                | linear warmup over --steps     | ours ramps 0 -> 3e-4 over the 15 steps (Bridge caps   |
|                             |                                | its 2000-step warmup); the peer's ramp starts at 1/15 |
| checkpoint, validation      | off                            | as `ours` in train_throughput.py                      |
| profiler (--profile-step P) | torchtitan's own: one active   | train_throughput.py --profile: training runs to step  |
|                             | step P after 1 warm-up step    | P; steps past --steps are not timed, the lr ramp is   |
|                             | (profile_freq P)               | still --steps long                                    |
| tokenizer, dataloader       | this file's: token_stream.py's | the same tokens in the same order as `ours`           |
|                             | stream                         |                                                       |

Model differences (peer config vs kaiyuan's qwen3_1p7b recipe; same where not listed): vocab 151936, hidden 2048,
28 layers, 16 heads, 8 KV heads, head dim 128, FFN 6144 (SwiGLU), QK-norm (RMSNorm per head), RMSNorm eps 1e-6,
RoPE theta 1e6 and no biases on both sides.
- embeddings: tied in the peer (as the released Qwen3-1.7B), untied in ours (1.72 B vs 2.03 B parameters). Same
  model FLOPs per token; untied carries 311 M more parameters of optimizer work and memory. The
  `torchtitan_untied` row unties the peer (lm_head and embedding both initialised N(0, 0.02)) to remove this.
- init: the peer draws every linear from N(0, 0.02); ours scales the output projections by 1/sqrt(2 * layers).
- QKV: one fused projection in the peer, Megatron's fused linear_qkv in ours: the same matrix multiply.
How the two train it (what the rows measure, not corrected):
- precision: the peer keeps fp32 weights and gradients and computes in bf16 (FSDP2's cast on a 1-GPU mesh); ours
  keeps bf16 weights with fp32 main weights and gradients in Megatron's distributed optimizer.
- attention: the peer's FlexAttention (Triton, autotuned at compile) vs ours' SDPA kernels.
- CUDA graph: the peer's covers one micro-batch's forward and backward (optimizer eager, fused AdamW); ours the
  whole step. compile: the peer's every transformer block and its loss; ours its norm kernel.
- loss: both chunked (the peer over 8 sequence chunks, the logits never whole).
- FLOPs: the peer's own formula counts causal attention in full (13.1 GFLOP per token here); the rows' tflops use
  Megatron's (from `ours`), which counts half; the peer's figure stays under own_tflops.

usage: python benchmarks/peer_torchtitan.py --stream stream.npy --out row.json [--untied] [--steps 15]
       [--profile-step 17] (a PyTorch profiler trace of step 17, named in the row's `profile`)
       CPU check (no CUDA needed): python benchmarks/peer_torchtitan.py --check [--stream stream.npy]"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.metrics import BaseLogger, LoggerContainer
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.components.validate import Validator
from torchtitan.config import CompileConfig
from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.models.qwen3 import model_registry
from torchtitan.models.qwen3.config_registry import qwen3_1_7b
from torchtitan.tools.logging import init_logger
from torchtitan.tools.profiler import PROFILE_DIR, PROFILE_FILE, PROFILE_ITER_DIR
from torchtitan.trainer import Trainer

MICRO_BATCH, MICRO_BATCHES = 2, 4  # train_throughput.BATCH["qwen3_1p7b"]
# ours' optimizer (kaiyuan_recipes' qwen3_1p7b recipe): Megatron's Adam with decoupled weight decay
OURS_LR, OURS_WEIGHT_DECAY, OURS_CLIP = 3e-4, 0.1, 1.0


class StreamTokenizer(BaseTokenizer):
    """No text: the stream is token ids already; the Trainer only asks for the vocabulary size."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 151936

    def __init__(self, config: Config, *, tokenizer_path: str = ""):
        super().__init__()
        self.vocab_size = config.vocab_size

    def encode(self, *args, **kwargs) -> list[int]:
        raise NotImplementedError("the benchmark's stream is token ids")

    def decode(self, *args, **kwargs) -> str:
        raise NotImplementedError("the benchmark's stream is token ids")

    def get_vocab_size(self) -> int:
        return self.vocab_size


class StreamDataLoader(BaseDataLoader):
    """token_stream.py's windows in order, `local_batch_size` rows a batch: inputs [:, :-1], labels [:, 1:], and
    positions 0..seq-1 (one document per row: plain causal attention, as Megatron's mock data trains)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        path: str = ""

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer: BaseTokenizer | None,
                 seq_len: int, local_batch_size: int, snapshot_every_n_steps: int | None = None):
        if dp_world_size != 1:
            raise ValueError("the stream is one GPU's: data parallelism is not part of this benchmark")
        self.stream = np.load(config.path, mmap_mode="r")
        if self.stream.shape[1] != seq_len + 1:
            raise ValueError(f"{config.path}: windows of {self.stream.shape[1]} tokens, the run needs {seq_len + 1}")
        self.batch, self.seq = local_batch_size, seq_len
        self.next_row = 0

    def __iter__(self):
        positions = torch.arange(self.seq).expand(self.batch, self.seq)
        while self.next_row + self.batch <= len(self.stream):
            rows = torch.from_numpy(np.array(self.stream[self.next_row:self.next_row + self.batch], dtype=np.int64))
            self.next_row += self.batch
            yield {"input": rows[:, :-1], "positions": positions}, rows[:, 1:]

    def state_dict(self) -> dict:
        return {"next_row": self.next_row}

    def load_state_dict(self, state_dict: dict) -> None:
        self.next_row = state_dict.get("next_row", 0)


class StepRecorder(BaseLogger):
    """Each logged step's metrics as the peer computed them, plus torch's peak allocated memory (ours' measure)."""

    def __init__(self) -> None:
        self.steps: list[dict] = []

    def log(self, metrics: dict, step: int) -> None:
        peak = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None
        self.steps.append({"step": step, **metrics, "peak_allocated_gb": peak})


def untie(spec) -> None:
    """The peer's model with our untied embeddings: its own init for untied Qwen3 flavours (N(0, 0.02))."""
    model = spec.model
    model.enable_weight_tying = False
    model.tok_embeddings.param_init = {"weight": partial(torch.nn.init.normal_, std=0.02)}


def profiler_settings(profile_step: int) -> dict:
    """torchtitan's Profiler.Config fields (its --profiler.* options) for a trace of training step `profile_step`
    alone: its schedule waits profile_freq - warmup - active steps, warms up one, records one and writes the trace
    as that step ends (profiling/traces/iteration_<step>/rank0_trace.json.gz under the dump folder)."""
    return {"enable_profiling": True, "profile_freq": profile_step, "profiler_warmup": 1, "profiler_active": 1}


def trace_path(dump: str, profile_step: int) -> Path:
    return Path(dump) / PROFILE_DIR / PROFILE_ITER_DIR.format(step=profile_step) / PROFILE_FILE.format(rank=0)


def titan_config(stream: str, seq: int, steps: int, untied: bool, ac: str, dump: str,
                 cuda_graphs: bool = True, profile_step: int | None = None) -> Trainer.Config:
    """torchtitan's qwen3_1_7b with the changes of this module's table; with `profile_step` (past `steps`), the
    run goes on to that step and torchtitan's profiler records it."""
    config = qwen3_1_7b()
    if untied:
        untie(config.model_spec)
    config.hf_assets_path = dump  # no tokenizer or HF weights are read: the stream is token ids
    config.dump_folder = dump
    config.tokenizer = StreamTokenizer.Config(vocab_size=config.model_spec.model.vocab_size)
    config.dataloader = StreamDataLoader.Config(path=stream)
    config.training.seq_len = seq
    config.training.local_batch_size = MICRO_BATCH
    config.training.global_batch_size = MICRO_BATCH * MICRO_BATCHES
    config.training.steps = steps
    if profile_step is not None:
        if profile_step <= steps + 1:
            raise ValueError(f"--profile-step {profile_step}: past the timed steps and a warm-up step "
                             f"(at least {steps + 2})")
        config.training.steps = profile_step
        for name, value in profiler_settings(profile_step).items():
            setattr(config.profiler, name, value)  # a slots dataclass: a field this version lacks fails here
    config.training.max_norm = OURS_CLIP
    config.optimizer = default_adamw(lr=OURS_LR, weight_decay=OURS_WEIGHT_DECAY)
    config.lr_scheduler = LRSchedulersContainer.Config(warmup_steps=steps)  # the ramp ends at `steps` either way
    config.compile = CompileConfig(enable=True, components=["model", "loss"])
    config.training.disable_cuda_graphs = not cuda_graphs
    config.activation_checkpoint = SelectiveAC.Config() if ac == "selective" else None
    config.checkpoint = CheckpointManager.Config(enable=False)
    config.validator = Validator.Config(enable=False)
    config.metrics.log_freq = 1
    config.__post_init__()  # the Trainer.Config's own checks, on the changed config
    return config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(args: argparse.Namespace) -> dict:
    """Build torchtitan's Trainer and train; the median of the steady steps, as train_throughput's rows."""
    if not torch.cuda.is_available():  # torchtitan takes "cuda" when no accelerator is found, and fails late
        raise SystemExit("torchtitan's trainer needs a CUDA GPU in this benchmark; --check runs what needs none")
    # A one-process group on this host, as torchrun --nproc-per-node=1 would set it.
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        os.environ.setdefault(key, value)
    init_logger()  # torchtitan's console lines (its step lines: loss, memory, tps, tflops) go to the row's log
    dump = tempfile.mkdtemp(prefix="torchtitan-")
    config = titan_config(str(args.stream), args.seq, args.steps, args.untied, args.ac, dump, not args.no_cuda_graphs,
                          args.profile_step)
    trainer = config.build()
    recorder = StepRecorder()
    metrics = trainer.metrics_processor
    if isinstance(metrics.logger, LoggerContainer):
        metrics.logger.add_logger(recorder)
    else:  # a rank that logs nothing gets a bare BaseLogger: this one process logs
        container = LoggerContainer()
        container.add_logger(recorder)
        metrics.logger = container
    try:
        trainer.train()
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    timed = [s for s in recorder.steps if s["step"] <= args.steps]  # a profiled tail is not timed
    steady = timed[3:]
    if not steady:
        return {"error": f"{len(recorder.steps)} of {config.training.steps} steps logged"}
    params = sum(p.numel() for p in trainer.model_parts[0].parameters())
    row = {"tokens_per_s": statistics.median(s["throughput(tps)"] for s in steady),
           "own_tflops": statistics.median(s["tflops"] for s in steady),  # torchtitan's formula, for reference
           "own_flops_per_token": metrics.num_flops_per_token,
           "peak_mem_gb": max(s["peak_allocated_gb"] for s in timed),
           "peak_reserved_gib": max(s["memory/max_reserved(GiB)"] for s in timed),
           "timed_steps": len(steady),
           "losses": [s["loss_metrics/global_avg_loss"] for s in timed],
           "model_settings": settings(config, params)}
    if args.profile_step:
        trace = trace_path(dump, args.profile_step)
        row["profile"] = {"step": args.profile_step, "trace": str(trace)} if trace.exists() else {
            "step": args.profile_step, "error": f"no trace at {trace}"}
    return row


def settings(config: Trainer.Config, params: int) -> dict:
    """What trained: the settings of this module's table as the Trainer.Config holds them."""
    model = config.model_spec.model
    attention = model.layers[0].attention
    return {"framework": "torchtitan", "flavor": config.model_spec.flavor, "parameters": params,
            "tied_embeddings": model.enable_weight_tying, "attention": type(attention.inner_attention).__qualname__,
            "seq_len": config.training.seq_len, "local_batch_size": config.training.local_batch_size,
            "global_batch_size": config.training.global_batch_size, "dtype": config.training.dtype,
            "mixed_precision_param": config.training.mixed_precision_param,
            "cuda_graphs": not config.training.disable_cuda_graphs, "compile": config.compile.enable,
            "compile_components": list(config.compile.components),
            "loss": type(config.loss).__qualname__, "loss_chunks": getattr(config.loss, "num_chunks", None),
            "activation_checkpoint": type(config.activation_checkpoint).__qualname__
            if config.activation_checkpoint else None,
            "optimizer": config.optimizer.param_groups[0].optimizer_kwargs | {
                "implementation": config.optimizer.implementation},
            "warmup_steps": config.lr_scheduler.warmup_steps, "max_norm": config.training.max_norm,
            "training_steps": config.training.steps,
            "profiler": {name: getattr(config.profiler, name) for name in profiler_settings(0)}
            if config.profiler.enable_profiling else None}


def check(args: argparse.Namespace) -> dict:
    """What runs without CUDA: the row's config through the Trainer.Config's checks, the 1.7B model on the meta
    device (parameters and the peer's FLOPs per token), and a tiny qwen3 of the peer's (its debugmodel) through one
    forward, the chunked loss and backward on this process's device, fed by the stream's loader."""
    out: dict = {}
    for untied in (False, True):
        config = titan_config(str(args.stream), args.seq, args.steps, untied, args.ac, tempfile.gettempdir(),
                              profile_step=args.profile_step)
        model_config = config.model_spec.model
        with torch.device("meta"):
            model = model_config.build()
        params, flops = model_config.get_nparams_and_flops(model, args.seq)
        out["untied" if untied else "tied"] = {"parameters": params, "own_flops_per_token": flops,
                                               "settings": settings(config, params)}
    loader = StreamDataLoader(StreamDataLoader.Config(path=str(args.stream)), dp_world_size=1, dp_rank=0,
                              tokenizer=None, seq_len=args.seq, local_batch_size=MICRO_BATCH)
    batch, labels = next(iter(loader))
    out["first_batch"] = {"input": list(batch["input"].shape), "labels_shifted": bool(
        torch.equal(batch["input"][:, 1:], labels[:, :-1]))}
    out["tiny_loss"] = tiny_step(batch, labels)
    return out


def tiny_step(batch: dict, labels: torch.Tensor) -> dict:
    """The peer's debugmodel (its qwen3 at 8 layers of 256) on 256 tokens of the batch: the forward without
    gradients (FlexAttention has no CPU backward), then the chunked loss and its backward into the hidden states;
    at init the loss is ~ln(vocab)."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss

    spec = model_registry("debugmodel")
    vocab = spec.model.vocab_size
    model = spec.model.build()
    model.init_weights(buffer_device=None)
    loss_fn = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab)).build(
        compile_config=CompileConfig(enable=False))
    loss_fn.set_lm_head(model.lm_head)
    model._skip_lm_head = True
    inputs, targets = batch["input"][:, :256] % vocab, labels[:, :256] % vocab
    positions = batch["positions"][:, :256]
    with torch.no_grad():
        hidden = model(inputs, positions=positions, attention_masks=model.get_attention_masks(positions=positions))
    hidden.requires_grad_(True)
    loss, _ = loss_fn(hidden, targets, torch.tensor(targets.numel()))
    loss.backward()
    return {"loss": float(loss), "ln_vocab": math.log(vocab), "hidden_grad": hidden.grad is not None,
            "lm_head_grad": model.lm_head.weight.grad is not None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stream", type=Path, required=True, help="token_stream.py's .npy")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--untied", action="store_true", help="our untied embeddings instead of the peer's tied ones")
    ap.add_argument("--ac", choices=["none", "selective"], default="none")
    ap.add_argument("--no-cuda-graphs", action="store_true", help="the peer's fwd+bwd CUDA graph off (its default: on)")
    ap.add_argument("--profile-step", type=int, help="go on to this step (past --steps + 1) and keep torchtitan's "
                    "PyTorch profiler trace of it")
    ap.add_argument("--check", action="store_true", help="the CPU check instead of training")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = check(args) if args.check else train(args)
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
