"""Held-out evaluation of a Hugging Face causal LM: per sample, the prompt-conditioned completion NLL
(nats, summed over completion tokens), NLL/token, perplexity and bits per UTF-8 byte; for samples with
choices, each candidate scored by its log-probability given the prompt — accuracy by mean token
log-probability (`mcq_acc_avg_norm`, the main one) and by sum (`mcq_acc_sum`, biased to short options).
Aggregated per capability dimension and overall. The definitions, the sample reader and the truncation rule are
kaiyuan_recipes.data.heldout_scoring's, shared with the evaluation in training (kaiyuan.heldout_eval); this module
runs the HF model.

The lm_head projects in fp32 (fp32_lm_head): in bf16 its logits would be rounded to bf16 before the softmax, half a
unit in the last place on the target's logit and the log-sum-exp (0.03 nats at a logit of 10), as large as the
0.5 % per sample the in-training figures (which project in fp32 too) are held to on short completions."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.heldout_scoring import (
    Encoded,
    LoadReport,
    Sample,
    aggregate,
    encode_pair,
    hf_encoder,
    load_samples,
    sample_rows,
    scoring_pairs,
)

__all__ = ["LoadReport", "Sample", "aggregate", "continuation_logprobs", "evaluate_models", "load_samples", "score"]


@contextlib.contextmanager
def fp32_lm_head(model: Any) -> Iterator[None]:
    """The model's output embedding (a Linear) computing fp32 logits from its upcast input and weight; the rest of
    the model stays in its dtype. Nothing changes for a model without a Linear head or already in fp32."""
    import torch

    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.weight.dtype == torch.float32:
        yield
        return

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        bias = None if head.bias is None else head.bias.float()
        return torch.nn.functional.linear(hidden.float(), head.weight.float(), bias)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


def continuation_logprobs(model: Any, tokenizer: Any, encoded: list[Encoded], batch_size: int,
                          device: str) -> list[list[float]]:
    """Log-probability of every continuation token given its context, batched (right padding)."""
    import torch

    results: list[list[float]] = [[] for _ in encoded]
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i].ids))  # similar lengths share a batch
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(encoded[i].ids) for i in idx)
        input_ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids = encoded[i].ids
            input_ids[row, : len(ids)] = torch.tensor(ids)
            mask[row, : len(ids)] = 1
        with torch.no_grad(), fp32_lm_head(model):
            logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        for row, i in enumerate(idx):
            ids, n_cont = encoded[i].ids, encoded[i].n_scored
            positions = torch.arange(len(ids) - n_cont, len(ids), device=logp.device)
            targets = torch.tensor(ids[len(ids) - n_cont:], device=logp.device)
            results[i] = logp[row, positions - 1, targets].tolist()
    return results


def score(model: Any, tokenizer: Any, samples: list[Sample], max_length: int = 2048, batch_size: int = 8,
          device: str = "cpu", progress: bool = True) -> list[dict[str, Any]]:
    """Per-sample figures (kaiyuan_recipes.data.heldout_scoring.sample_rows); the candidates of one prompt are
    scored in the same pass."""
    from rich.progress import track

    pairs = scoring_pairs(samples)
    encode = hf_encoder(tokenizer)
    encoded = [encode_pair(encode, p.context, p.continuation, max_length) for p in pairs]
    chunks = [list(range(i, min(i + 256, len(pairs)))) for i in range(0, len(pairs), 256)]
    logprobs: list[list[float]] = []
    for chunk in track(chunks, description="scoring", disable=not progress):
        logprobs += continuation_logprobs(model, tokenizer, [encoded[i] for i in chunk], batch_size, device)
    return sample_rows(samples, pairs, encoded, [sum(lp) for lp in logprobs])


def markdown_table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Rows: dimension × model; several models side by side."""
    lines = ["| dimension | model | samples | NLL/token | PPL | bits/byte | MCQ acc (avg-norm) | MCQ acc (sum) |",
             "|---|---|---|---|---|---|---|---|"]
    dims = sorted({d for per_model in results.values() for d in per_model if d != "overall"}) + ["overall"]
    for dim in dims:
        for model, per_dim in results.items():
            m = per_dim.get(dim)
            if m is None:
                continue
            acc = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
            lines.append(f"| {dim} | {model} | {m['samples']} | {m['nll_per_token']:.4f} | {m['ppl']:.2f} | "
                         f"{m['bits_per_byte']:.4f} | {acc(m['mcq_acc_avg_norm'])} | {acc(m['mcq_acc_sum'])} |")
    return "\n".join(lines) + "\n"


def bar_chart(results: dict[str, dict[str, dict[str, Any]]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = sorted({d for per_model in results.values() for d in per_model if d != "overall"}) + ["overall"]
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(dims)), 4.5))
    width = 0.8 / max(1, len(results))
    for k, (model, per_dim) in enumerate(results.items()):
        values = [per_dim[d]["bits_per_byte"] if d in per_dim else 0 for d in dims]
        ax.bar([i + k * width for i in range(len(dims))], values, width, label=model)
    ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(dims))], dims, rotation=20)
    ax.set(ylabel="bits per byte (lower is better)", title="held-out evaluation")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def evaluate_models(models: list[Path], data: Path, out: Path, max_length: int = 2048, device: str = "cpu",
                    batch_size: int = 8, progress: bool = True, allow_skipped: int = 0) -> dict[str, Any]:
    """Score each HF model directory on `data`; write results.json, results.md and bits_per_byte.png. More than
    `allow_skipped` unusable lines is an error before any model is loaded (results over part of a file would pass
    for the whole)."""
    from kaiyuan_recipes.config.run_layout import require_model_dir

    loaded = load_samples(data)
    if not loaded.samples:
        raise ValueError(f"{data}: nothing to score ({'; '.join(loaded.problems[:5])})")
    if len(loaded.problems) > allow_skipped:
        shown = "; ".join(loaded.problems[:10]) + ("; …" if len(loaded.problems) > 10 else "")
        raise ValueError(f"{data}: {len(loaded.problems)} of {len(loaded.problems) + len(loaded.samples)} lines "
                         f"unusable ({shown}); fix them, or score the rest with --allow-skipped "
                         f"{len(loaded.problems)}")
    for model_dir in models:  # before torch and the model's libraries are imported
        require_model_dir(model_dir, "--model")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kaiyuan_recipes.export.megatron_to_hf import as_hf_dir

    results, per_sample = {}, {}
    for k, model_dir in enumerate(models):
        name = Path(model_dir).name
        if name in results:  # two checkpoints with the same directory name
            name = f"{name}#{k + 1}"
        # a Megatron checkpoint is exported first, to a temporary directory that lives until the model is loaded
        with as_hf_dir(model_dir) as hf_dir:
            tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
            dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
            model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=dtype).to(device).eval()
        rows = score(model, tokenizer, loaded.samples, max_length, batch_size, device, progress)
        results[name], per_sample[name] = aggregate(rows), rows
        del model
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"data": str(data), "skipped": len(loaded.problems), "problems": loaded.problems, "results": results,
              "samples": per_sample}
    (out / "results.json").write_text(json.dumps(report, indent=1))
    (out / "results.md").write_text(markdown_table(results))
    bar_chart(results, out / "bits_per_byte.png")
    return report
