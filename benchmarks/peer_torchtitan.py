"""torchtitan 0.2.2's own qwen3 1.7B training (its `qwen3` train spec at flavour `1.7B`, a TOML job file as its
train configs are written, its Trainer) on the token stream `ours` reads, at our batch: one process, one GPU;
train_throughput.py runs it as the `torchtitan` / `torchtitan_untied` rows. 0.2.2 is pinned (lab/titan-wheels.txt):
0.3.0 imports torch.distributed.fsdp.DataParallelMeshDims, which torch 2.11 does not have.

The job file is torchtitan's own train_configs/qwen3_1.7b.toml (TOML_QWEN3_1P7B) with these changes (row_job):
| setting                          | value                        | why                                              |
|----------------------------------|------------------------------|--------------------------------------------------|
| training.seq_len                 | 4096                         | our sequence length (the toml's too)             |
| training.local_batch_size        | 2 (toml: 4)                  | our micro-batch                                  |
| training.global_batch_size       | 8 (4 accumulation steps)     | our 32,768 tokens per step                       |
| training.steps                   | --steps (15)                 | as `ours`; tokens/s is the median of steps 4..15 |
| training.dtype, mixed_precision  | float32, bfloat16 (defaults) | fp32 weights, bf16 compute: on one GPU there is  |
|                                  |                              | no FSDP, so torchtitan autocasts (its AMP path)  |
| compile.enable, components       | true, [model, loss]          | torchtitan's advice for speed (toml: off):       |
|                                  |                              | every transformer block and the loss compiled    |
| activation_checkpoint.mode       | none (toml: selective, op)   | the toml's batch of 4 needs it; ours of 2 fits   |
|                                  |                              | 80 GB without (--ac selective: the toml's)       |
| attention                        | SDPA, causal (the flavour's) | its wrapper tries cuDNN, then flash, then math   |
| loss                             | cross_entropy_loss           | 0.2.2's only one: whole logits, upcast to fp32   |
| optimizer                        | AdamW lr 3e-4 (toml: 8e-4),  | ours' lr and decay so the losses compare;        |
|                                  | betas .9/.95, eps 1e-8, wd   | wd on every tensor (ours: not on norms)          |
|                                  | 0.1, fused; max_norm 1       |                                                  |
| lr_scheduler.warmup_steps        | --steps (toml: 20)           | ours ramps 0 -> 3e-4 over the 15 steps; the      |
|                                  |                              | peer's ramp starts at 1/15                       |
| debug.seed                       | 1234                         | the same initial weights run to run              |
| metrics.log_freq                 | 1 (toml: 10)                 | every step's loss and time, as `ours` logs       |
| checkpoint, validation           | off                          | as `ours` in train_throughput.py                 |
| profiling (--profile-step P)     | torchtitan's own: one active | train_throughput.py --profile: training runs to  |
|                                  | step P after 1 warm-up step  | step P; steps past --steps are not timed, the lr |
|                                  | (profile_freq P)             | ramp is still --steps long                       |
| tokenizer, dataloader            | none; this file's loader of  | the same tokens in the same order as `ours` (a   |
|                                  | token_stream.py's stream     | train spec of its own, TITAN_SPEC: the qwen3     |
|                                  |                              | spec with only its data loader swapped)          |
0.2.2 has no CUDA graph and no chunked loss (0.3.0 added both); its attention in the 1.7B flavour is SDPA.

Model differences (the peer's 1.7B flavour vs kaiyuan's qwen3_1p7b recipe; same where not listed): vocab 151936,
hidden 2048, 28 layers, 16 heads, 8 KV heads, head dim 128, FFN 6144 (SwiGLU), QK-norm (RMSNorm per head), RMSNorm
eps 1e-6, RoPE theta 1e6 and no biases on both sides.
- embeddings: tied in the peer (as the released Qwen3-1.7B), untied in ours (1.72 B vs 2.03 B parameters). Same
  model FLOPs per token; untied carries 311 M more parameters of optimizer work and memory. The
  `torchtitan_untied` row unties the peer (a flavour of its own, `1.7B_untied`: torchtitan's init for untied
  models, embedding N(0, 1) and output truncated N(0, 1/sqrt(2048))).
- init: the peer draws wq, wk, wv, w1 from truncated N(0, 0.02) and wo, w2, w3 from N(0, 0.02 / sqrt(2 (layer + 1)))
  (its depth init); ours scales the output projections by 1/sqrt(2 * layers).
- QKV: three projections in the peer (wq, wk, wv), Megatron's fused linear_qkv in ours: the same FLOPs.
How the two train it (what the rows measure, not corrected):
- precision: the peer keeps fp32 weights and gradients and computes in bf16 (torch.autocast); ours keeps bf16
  weights with fp32 main weights and gradients in Megatron's distributed optimizer.
- CUDA graph: none in the peer; ours captures the whole step. compile: the peer's every block and its loss; ours
  its norm kernel.
- loss: the peer's logits whole (and upcast to fp32); ours chunked, the logits never whole.
- FLOPs: the peer's own formula counts causal attention in full and, with tied embeddings, leaves the output
  projection out (11.3 GFLOP per token tied, 13.1 untied); the rows' tflops use Megatron's (from `ours`), one
  count for every row; the peer's figure stays under own_tflops.

usage: python benchmarks/peer_torchtitan.py --stream stream.npy --out row.json [--untied] [--steps 15]
       [--profile-step 17] (a PyTorch profiler trace of step 17, named in the row's `profile`)
       CPU check (no CUDA needed): python benchmarks/peer_torchtitan.py --check --stream stream.npy"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import socket
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.metrics import BaseLogger, LoggerContainer
from torchtitan.config import ConfigManager, JobConfig
from torchtitan.distributed import ParallelDims
from torchtitan.protocols.train_spec import TrainSpec, get_train_spec, register_train_spec
from torchtitan.tools.logging import init_logger
from torchtitan.train import Trainer

MICRO_BATCH, MICRO_BATCHES = 2, 4  # megatron_rows.BATCH["qwen3_1p7b"]
# ours' optimizer (kaiyuan_recipes' qwen3_1p7b recipe): Megatron's Adam with decoupled weight decay
OURS_LR, OURS_WEIGHT_DECAY, OURS_CLIP = 3e-4, 0.1, 1.0
TITAN_SPEC, FLAVOR, UNTIED_FLAVOR = "qwen3_token_stream", "1.7B", "1.7B_untied"
PROFILE_TRACES = "profile_traces"  # the job's profiling.save_traces_folder (0.2.2's default)
# torchtitan v0.2.2's torchtitan/models/qwen3/train_configs/qwen3_1.7b.toml, every value that shapes training
# (its paths, checkpoint folder and float8 section left out: checkpointing is off, float8 not enabled there).
TOML_QWEN3_1P7B = {
    "job": {"description": "Qwen 3 1.7B training"},
    "profiling": {"enable_profiling": False, "profile_freq": 100},
    "metrics": {"log_freq": 10, "enable_tensorboard": False},
    "model": {"name": "qwen3", "flavor": FLAVOR},
    "optimizer": {"name": "AdamW", "lr": 8e-4, "eps": 1e-8},
    "lr_scheduler": {"warmup_steps": 20},
    "training": {"local_batch_size": 4, "seq_len": 4096, "max_norm": 1.0, "steps": 100},
    "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1,
                    "fsdp_reshard_after_forward": "default", "tensor_parallel_degree": 1,
                    "context_parallel_degree": 1},
    "checkpoint": {"enable": False},
    "activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"},
    "compile": {"enable": False, "components": ["model", "loss"]},
}


class StreamDataLoader(BaseDataLoader):
    """token_stream.py's windows in order, `local_batch_size` rows a batch: inputs [:, :-1], labels [:, 1:], as
    torchtitan's text loader yields them ({"input": ...}, labels; no positions: plain causal attention over the
    window, as Megatron's mock data trains, with no reset at end-of-document)."""

    def __init__(self, path: str, *, seq_len: int, local_batch_size: int, dp_world_size: int = 1):
        if dp_world_size != 1:
            raise ValueError("the stream is one GPU's: data parallelism is not part of this benchmark")
        self.stream = np.load(path, mmap_mode="r")
        if self.stream.shape[1] != seq_len + 1:
            raise ValueError(f"{path}: windows of {self.stream.shape[1]} tokens, the run needs {seq_len + 1}")
        self.batch = local_batch_size
        self.next_row = 0

    def __iter__(self):
        while self.next_row + self.batch <= len(self.stream):
            rows = torch.from_numpy(np.array(self.stream[self.next_row:self.next_row + self.batch], dtype=np.int64))
            self.next_row += self.batch
            yield {"input": rows[:, :-1]}, rows[:, 1:]

    def state_dict(self) -> dict:
        return {"next_row": self.next_row}

    def load_state_dict(self, state_dict: dict) -> None:
        self.next_row = state_dict.get("next_row", 0)


def build_stream_dataloader(*, dp_world_size: int, dp_rank: int, tokenizer, job_config: JobConfig,
                            **_) -> StreamDataLoader:
    """TITAN_SPEC's build_dataloader_fn (the Trainer's call): the stream named by training.dataset_path."""
    return StreamDataLoader(job_config.training.dataset_path, seq_len=job_config.training.seq_len,
                            local_batch_size=job_config.training.local_batch_size, dp_world_size=dp_world_size)


def titan_spec() -> TrainSpec:
    """torchtitan's qwen3 train spec with this file's data loader and no tokenizer (the stream is token ids; the
    1.7B flavour's SDPA needs none) or validator, and a `1.7B_untied` flavour; registered once as TITAN_SPEC."""
    try:
        return get_train_spec(TITAN_SPEC)
    except ValueError:
        pass
    qwen3 = get_train_spec("qwen3")
    flavors = {**qwen3.model_args,
               UNTIED_FLAVOR: dataclasses.replace(qwen3.model_args[FLAVOR], enable_weight_tying=False)}
    spec = dataclasses.replace(qwen3, model_args=flavors, build_dataloader_fn=build_stream_dataloader,
                               build_tokenizer_fn=None, build_validator_fn=None)
    register_train_spec(TITAN_SPEC, spec)
    return spec


class StepRecorder(BaseLogger):
    """Each logged step's metrics as the peer computed them, plus torch's peak allocated memory (ours' measure;
    torchtitan resets the peak after each logged step)."""

    def __init__(self) -> None:
        self.steps: list[dict] = []

    def log(self, metrics: dict, step: int) -> None:
        peak = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None
        self.steps.append({"step": step, **metrics, "peak_allocated_gb": peak})


def profiler_settings(profile_step: int) -> dict:
    """torchtitan's [profiling] fields for a trace of training step `profile_step` alone: its schedule waits
    profile_freq - warmup - active steps, warms up one, records one and writes the trace as that step ends
    (PROFILE_TRACES/iteration_<step>/rank0_trace.json under the dump folder)."""
    return {"enable_profiling": True, "save_traces_folder": PROFILE_TRACES, "profile_freq": profile_step,
            "profiler_warmup": 1, "profiler_active": 1}


def trace_path(dump: str, profile_step: int) -> Path:
    return Path(dump) / PROFILE_TRACES / f"iteration_{profile_step}" / "rank0_trace.json"


def row_job(stream: str, seq: int, steps: int, untied: bool, ac: str, dump: str,
            profile_step: int | None = None) -> dict:
    """The job file's sections: TOML_QWEN3_1P7B with the changes of this module's table; with `profile_step`
    (past `steps` and a warm-up step), training goes on to that step and torchtitan's profiler records it."""
    job = copy.deepcopy(TOML_QWEN3_1P7B)
    changes = {
        "job": {"dump_folder": dump, "description": "kaiyuan-recipes peer row: qwen3 1.7B on ours' token stream"},
        "model": {"name": TITAN_SPEC, "flavor": UNTIED_FLAVOR if untied else FLAVOR, "hf_assets_path": dump},
        "training": {"seq_len": seq, "local_batch_size": MICRO_BATCH, "global_batch_size": MICRO_BATCH * MICRO_BATCHES,
                     "steps": steps, "max_norm": OURS_CLIP, "dataset": "token_stream", "dataset_path": stream,
                     "dtype": "float32", "mixed_precision_param": "bfloat16"},
        "optimizer": {"lr": OURS_LR, "weight_decay": OURS_WEIGHT_DECAY, "beta1": 0.9, "beta2": 0.95,
                      "implementation": "fused"},
        "lr_scheduler": {"warmup_steps": steps},  # the ramp ends at `steps` whether or not a profiled tail follows
        "compile": {"enable": True, "components": ["model", "loss"]},
        "activation_checkpoint": {"mode": ac} | ({"selective_ac_option": "op"} if ac == "selective" else {}),
        "metrics": {"log_freq": 1, "disable_color_printing": True},
        "checkpoint": {"enable": False},
        "validation": {"enable": False},
        "debug": {"seed": 1234},
    }
    if profile_step is not None:
        if profile_step <= steps + 1:
            raise ValueError(f"--profile-step {profile_step}: past the timed steps and a warm-up step "
                             f"(at least {steps + 2})")
        changes["training"]["steps"] = profile_step
        changes["profiling"] = profiler_settings(profile_step)
    for section, values in changes.items():
        job.setdefault(section, {}).update(values)
    return job


def toml_text(job: dict) -> str:
    """The job as a TOML file (sections of strings, numbers, booleans and lists of strings: all a job file uses)."""
    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"a job file value of type {type(v).__name__}: {v!r}")

    return "\n".join(f"[{section}]\n" + "".join(f"{key} = {value(v)}\n" for key, v in values.items())
                     for section, values in job.items())


def job_config(job: dict, folder: str) -> JobConfig:
    """torchtitan's JobConfig as its launcher builds it: the job written as a TOML file, read by ConfigManager
    (`--job.config_file`), which checks every section and field against JobConfig."""
    titan_spec()
    path = Path(folder) / "peer_torchtitan.toml"
    path.write_text(toml_text(job))
    return ConfigManager().parse_args(["--job.config_file", str(path)])


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
    config = job_config(row_job(str(args.stream), args.seq, args.steps, args.untied, args.ac, dump,
                                args.profile_step), dump)
    trainer = Trainer(config)
    recorder = StepRecorder()
    metrics = trainer.metrics_processor
    if isinstance(metrics.logger, LoggerContainer):
        metrics.logger.add_logger(recorder)
    else:  # no TensorBoard or W&B: the processor has a bare BaseLogger
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
    model = trainer.model_parts[0]
    params = sum(p.numel() for p in model.parameters())
    row = {"tokens_per_s": statistics.median(s["throughput(tps)"] for s in steady),
           "own_tflops": statistics.median(s["tflops"] for s in steady),  # torchtitan's formula, for reference
           "own_flops_per_token": metrics.num_flops_per_token,
           "peak_mem_gb": max(s["peak_allocated_gb"] for s in timed),
           "peak_reserved_gib": max(s["memory/max_reserved(GiB)"] for s in timed),
           "timed_steps": len(steady),
           "losses": [s["loss_metrics/global_avg_loss"] for s in timed],
           "model_settings": settings(config, trainer.model_args, params,
                                      autocast=not trainer.parallel_dims.fsdp_enabled)}
    if args.profile_step:
        trace = trace_path(dump, args.profile_step)
        row["profile"] = {"step": args.profile_step, "trace": str(trace)} if trace.exists() else {
            "step": args.profile_step, "error": f"no trace at {trace}"}
    return row


def settings(config: JobConfig, model_args, params: int, autocast: bool) -> dict:
    """What trained: the settings of this module's table as the JobConfig and the flavour's model args hold them."""
    import torchtitan
    from torchtitan.models.attention import ScaledDotProductAttentionWrapper

    training, ac = config.training, config.activation_checkpoint
    return {"framework": "torchtitan", "version": getattr(torchtitan, "__version__", None),
            "flavor": config.model.flavor, "parameters": params, "tied_embeddings": model_args.enable_weight_tying,
            "attention": model_args.attn_type, "attention_mask": model_args.attn_mask_type,
            "sdpa_backends": [b.name for b in ScaledDotProductAttentionWrapper().sdpa_backends]
            if model_args.attn_type == "sdpa" else None,
            "seq_len": training.seq_len, "local_batch_size": training.local_batch_size,
            "global_batch_size": training.global_batch_size, "dtype": training.dtype,
            "mixed_precision_param": training.mixed_precision_param,
            "mixed_precision": "torch.autocast" if autocast else "FSDP2",
            "cuda_graphs": False, "compile": config.compile.enable,
            "compile_components": list(config.compile.components),
            "loss": "cross_entropy_loss (whole logits, fp32)",
            "activation_checkpoint": ac.mode if ac.mode != "selective" else f"selective ({ac.selective_ac_option})",
            "optimizer": {k: getattr(config.optimizer, k) for k in ("name", "lr", "beta1", "beta2", "eps",
                                                                   "weight_decay", "implementation")},
            "warmup_steps": config.lr_scheduler.warmup_steps, "max_norm": training.max_norm,
            "training_steps": training.steps, "seed": config.debug.seed,
            "profiler": {name: getattr(config.profiling, name) for name in profiler_settings(0)}
            if config.profiling.enable_profiling else None}


def check(args: argparse.Namespace) -> dict:
    """What runs without CUDA: the row's job through torchtitan's ConfigManager, the 1.7B flavours on the meta
    device (parameters and the peer's FLOPs per token, as the Trainer computes them), the stream's loader as the
    Trainer builds it, and three training steps of the spec's debugmodel flavour on this process's device
    through the spec's own parallelize function (the row's activation checkpointing), loss, optimizer and
    learning-rate schedule, under the Trainer's autocast."""
    out: dict = {}
    folder = tempfile.mkdtemp(prefix="torchtitan-check-")
    spec = titan_spec()
    for untied in (False, True):
        config = job_config(row_job(str(args.stream), args.seq, args.steps, untied, args.ac, folder,
                                    args.profile_step), folder)
        model_args = copy.deepcopy(spec.model_args[config.model.flavor])
        model_args.update_from_config(config)  # as Trainer.__init__
        with torch.device("meta"):
            model = spec.model_cls(model_args)
        own_count, flops = model_args.get_nparams_and_flops(model, config.training.seq_len)
        params = sum(p.numel() for p in model.parameters())  # a tied weight once, as train() counts
        out["untied" if untied else "tied"] = {"parameters": params, "own_parameter_count": own_count,
                                               "own_flops_per_token": flops,
                                               "settings": settings(config, model_args, params, autocast=True)}
    loader = spec.build_dataloader_fn(dp_world_size=1, dp_rank=0, tokenizer=None, job_config=config)
    batch, labels = next(iter(loader))
    out["first_batch"] = {"input": list(batch["input"].shape), "labels_shifted": bool(
        torch.equal(batch["input"][:, 1:], labels[:, :-1]))}
    out["tiny_steps"] = tiny_steps(spec, config, batch["input"], labels)
    return out


def tiny_steps(spec: TrainSpec, config: JobConfig, inputs: torch.Tensor, labels: torch.Tensor) -> dict:
    """The spec's debugmodel flavour (8 layers of 256, vocab 2048) on 256 tokens of the batch: parallelize_fn
    (activation checkpointing as the row's job; compile off, this is the CPU), the spec's optimizer and schedule
    builders, and Trainer.forward_backward_step's arithmetic (autocast, loss sum / tokens, backward); at init
    the loss is ~ln(vocab), and repeating one batch it falls."""
    config = copy.deepcopy(config)
    config.compile.enable = False
    model_args = copy.deepcopy(spec.model_args["debugmodel"])
    model_args.update_from_config(config)
    model = spec.model_cls(model_args)
    parallel_dims = ParallelDims(dp_shard=1, dp_replicate=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    model = spec.parallelize_fn(model, parallel_dims, config)
    with torch.no_grad():  # as Trainer.__init__
        model.init_weights(buffer_device=None)
    model.train()
    optimizers = spec.build_optimizers_fn([model], config.optimizer, parallel_dims)
    schedulers = spec.build_lr_schedulers_fn(optimizers, config.lr_scheduler, config.training.steps)
    loss_fn = spec.build_loss_fn(config, parallel_dims=parallel_dims)
    vocab = model_args.vocab_size
    inputs, targets = inputs[:, :256] % vocab, labels[:, :256] % vocab
    losses, lrs = [], []
    for _ in range(3):
        optimizers.zero_grad()
        lrs.append(schedulers.schedulers[0].get_last_lr()[0])
        with torch.autocast(inputs.device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(inputs), targets) / targets.numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.training.max_norm)
        optimizers.step()
        schedulers.step()
        losses.append(float(loss))
    return {"losses": losses, "ln_vocab": math.log(vocab), "lrs": lrs,
            "activation_checkpoint": config.activation_checkpoint.mode,
            "grads": all(p.grad is not None for p in model.parameters())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stream", type=Path, required=True, help="token_stream.py's .npy")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--untied", action="store_true", help="our untied embeddings instead of the peer's tied ones")
    ap.add_argument("--ac", choices=["none", "selective"], default="none",
                    help="activation checkpointing (selective: the toml's, per op)")
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
