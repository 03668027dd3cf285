"""kaiyuan.heldout_eval in the training loop: a Megatron-Bridge callback that, every kaiyuan.heldout_eval_interval
iterations, scores the held-out file on the model being trained and reports per-dimension NLL / PPL / bits per
byte and MCQ accuracies (definitions: kaiyuan_recipes/data/heldout_scoring.py).

It runs after the step's optimizer update (on_train_step_end), outside any captured CUDA graph: the whole-step
graph (kaiyuan.cuda_graph) wraps Megatron's forward-backward function, which the evaluation never calls; it calls
the model's forward eagerly, in eval mode and without gradients, and puts the chunks back in train mode. Where the
distributed optimizer overlaps its parameter all-gather with the forward, the forward pre-hooks are turned off
around the evaluation with the parameters synchronised first, as Megatron-Bridge does around its own validation.

Results: TensorBoard scalars heldout/<dimension>/<metric> through the writer Bridge holds, the same figures to the
W&B / MLflow / Comet loggers Bridge configured, one `heldout_eval` line per evaluation in the run's metrics.jsonl
(what `kaiyuan status` shows), and the per-sample rows in <run>/heldout_eval/iter_NNNNNNN.json."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kaiyuan_recipes.atomic import write_text_atomic
from kaiyuan_recipes.compat.bridge_api import Callback
from kaiyuan_recipes.config.run_layout import METRICS_FILE, RunLayout
from kaiyuan_recipes.data.heldout_scoring import (
    OVERALL,
    Sample,
    aggregate,
    encode_pair,
    hf_encoder,
    sample_rows,
    scoring_pairs,
)

METRICS = ("nll_per_token", "ppl", "bits_per_byte", "mcq_acc_avg_norm", "mcq_acc_sum")
EVENT = "heldout_eval"


def is_writer() -> bool:
    """The last rank: where Bridge's loggers live and RunMetricsCallback writes."""
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == dist.get_world_size() - 1


def scalars(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    return {f"heldout/{dim}/{name}": float(figures[name]) for dim, figures in results.items()
            for name in METRICS if figures.get(name) is not None}


@contextlib.contextmanager
def evaluating(model: list[Any], optimizer: Any, cfg: Any) -> Iterator[None]:
    """The chunks in eval mode without gradients, their parameters current; train mode and hooks restored."""
    import torch
    from megatron.bridge.training.train import (
        disable_forward_pre_hook,
        enable_forward_pre_hook,
        force_param_sync,
        should_disable_forward_pre_hook,
    )

    hooked: list[Any] = []
    if should_disable_forward_pre_hook(cfg.ddp.use_megatron_fsdp, cfg.optimizer.use_distributed_optimizer,
                                       cfg.ddp.overlap_param_gather):
        hooked = [chunk for chunk in model if getattr(chunk, "remove_forward_pre_hook_handles", None)]
        if hooked:
            disable_forward_pre_hook(hooked, optimizer=optimizer)  # with a synchronous parameter all-gather
        else:  # the first iteration: Bridge turns the hooks on after it, and nothing has gathered the update yet
            force_param_sync([chunk for chunk in model if hasattr(chunk, "remove_forward_pre_hook_handles")],
                             optimizer)
    for chunk in model:
        chunk.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for chunk in model:
            chunk.train()
        if hooked:
            enable_forward_pre_hook(hooked)


class HeldoutEvalCallback(Callback):
    def __init__(self, samples: list[Sample], tokenizer_dir: str, interval: int, run_dir: Path, seq_length: int,
                 micro_batch_size: int, after_eval: Any = None):
        """`after_eval(context)`: called once an evaluation ends (RunMetricsCallback.on_eval_start, so the
        next step's time does not include the evaluation's)."""
        self.samples, self.tokenizer_dir, self.interval = samples, tokenizer_dir, interval
        self.layout = RunLayout(Path(run_dir))
        self.max_length, self.token_budget = seq_length, micro_batch_size * seq_length
        self.after_eval = after_eval
        self.pairs = scoring_pairs(samples)
        self.encoded: list[Any] | None = None

    def encode(self) -> list[Any]:
        """Tokenized once per run, with the tokenizer directory the run trains with."""
        if self.encoded is None:
            from transformers import AutoTokenizer

            encode = hf_encoder(AutoTokenizer.from_pretrained(self.tokenizer_dir))
            self.encoded = [encode_pair(encode, p.context, p.continuation, self.max_length) for p in self.pairs]
            truncated = {p.sample for p, e in zip(self.pairs, self.encoded) if e.truncated}
            if truncated and is_writer():
                print(f"held-out evaluation: {len(truncated)} of {len(self.samples)} samples are longer than "
                      f"{self.max_length} tokens; their context is cut from the left (counted as 'truncated')",
                      flush=True)
        return self.encoded

    def on_train_step_end(self, context: Any) -> None:
        iteration = context.state.train_state.step + 1  # Bridge counts the step after this hook
        if iteration % self.interval == 0:
            self.evaluate(context, iteration)

    def evaluate(self, context: Any, iteration: int) -> dict[str, Any] | None:
        from kaiyuan_recipes.training.heldout_eval.scorer import score_encoded

        cfg = context.state.cfg
        encoded = self.encode()
        t0 = time.perf_counter()
        should_stop = None
        if cfg.train.exit_signal_handler:  # `kaiyuan stop` during an evaluation: stop scoring, let Bridge save
            handler = context.state.signal_handler
            should_stop = lambda: any(handler.signals_received())  # noqa: E731
        with evaluating(context.model, context.optimizer, cfg):
            sums = score_encoded(context.model, encoded, self.token_budget, self.max_length,
                                 moe=bool(getattr(cfg.model, "num_moe_experts", None)), should_stop=should_stop)
        if self.after_eval is not None:
            self.after_eval(context)
        if sums is None:
            if is_writer():
                print(f"held-out evaluation at iteration {iteration} left unfinished: a stop was requested", flush=True)
            return None
        rows = sample_rows(self.samples, self.pairs, encoded, sums)
        results = aggregate(rows)
        record = {"event": EVENT, "iteration": iteration, "time": time.time(),
                  "eval_s": time.perf_counter() - t0, "samples": len(rows), "sequences": len(encoded),
                  "overall": results[OVERALL], "dimensions": {k: v for k, v in results.items() if k != OVERALL}}
        if is_writer():
            self.report(context.state, iteration, record, rows)
        return record

    def report(self, state: Any, iteration: int, record: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        figures = scalars({OVERALL: record["overall"], **record["dimensions"]})
        figures["heldout/eval_time_s"] = record["eval_s"]
        writer = state.tensorboard_logger
        if writer is not None:
            for tag, value in figures.items():
                writer.add_scalar(tag, value, iteration)
            writer.flush()
        if state.wandb_logger is not None:
            state.wandb_logger.log(figures, iteration)
        if state.mlflow_logger is not None:
            from megatron.bridge.training.utils.mlflow_utils import _sanitize_mlflow_metrics

            state.mlflow_logger.log_metrics(_sanitize_mlflow_metrics(figures), step=iteration)
        if state.comet_logger is not None:
            state.comet_logger.log_metrics(figures, step=iteration)
        self.layout.heldout_eval.mkdir(parents=True, exist_ok=True)
        # the shape of `kaiyuan eval heldout`'s results.json, with this run as the one model
        results = {OVERALL: record["overall"], **record["dimensions"]}
        write_text_atomic(self.layout.heldout_eval / f"iter_{iteration:07d}.json", json.dumps(
            {"iteration": iteration, "max_length": self.max_length, "results": {"in_training": results},
             "samples": {"in_training": rows}}, indent=1))
        self.layout.state.mkdir(parents=True, exist_ok=True)
        with open(self.layout.state / METRICS_FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        overall, acc = record["overall"], record["overall"]["mcq_acc_avg_norm"]
        print(f"held-out evaluation at iteration {iteration}: NLL/token {overall['nll_per_token']:.4f}, bits/byte "
              f"{overall['bits_per_byte']:.4f}, MCQ acc (avg-norm) {'—' if acc is None else f'{acc:.3f}'}, "
              f"{overall['truncated']} truncated ({record['eval_s']:.1f} s)", flush=True)


def heldout_eval_callback(cfg: Any, run: Any, after_eval: Any = None) -> HeldoutEvalCallback:
    """The callback for `run` (kaiyuan.heldout_eval set), its file read and checked again in this worker."""
    from kaiyuan_recipes.training.heldout_eval.check import check_heldout_eval, eval_interval

    return HeldoutEvalCallback(check_heldout_eval(cfg, run), str(cfg.tokenizer.tokenizer_model),
                               eval_interval(cfg, run), run.run_dir, cfg.dataset.seq_length,
                               cfg.train.micro_batch_size, after_eval)
