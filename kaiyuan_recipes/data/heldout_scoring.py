"""What a held-out score means, in one place for both scorers: `kaiyuan eval heldout` on an exported HF model
(kaiyuan_recipes/eval/heldout_eval.py) and the in-training evaluation on the Megatron model
(kaiyuan_recipes/training/heldout_eval/). Both read samples here, encode each (context, continuation) pair here,
and turn per-pair log-probability sums into per-sample and per-dimension figures here, so the two cannot drift:

- a sample's completion is scored given its prompt: NLL (nats, summed over completion tokens), NLL per token,
  perplexity, bits per UTF-8 byte of the completion;
- each choice of a multiple-choice sample is scored given the prompt: `mcq_acc_avg_norm` picks the choice with the
  highest mean token log-probability (the main accuracy), `mcq_acc_sum` the highest summed log-probability (biased
  to short options);
- a pair longer than the scorer's sequence length keeps its continuation and loses context from the left (a
  continuation longer than that keeps its last tokens); such samples are scored, and counted as `truncated`.

The model-specific part (running the forward, batching) stays with each scorer; this module needs no torch."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.heldout import sample_problems
from kaiyuan_recipes.data.jsonl import read_jsonl_objects

OVERALL = "overall"  # the aggregate over every dimension


class HeldoutFileError(ValueError):
    """A held-out file that cannot be scored as a whole; the message names the file and each bad line."""


@dataclass
class Sample:
    line: int
    dimension: str
    prompt: str
    completion: str
    choices: list[str] | None = None
    answer: int | None = None


@dataclass
class LoadReport:
    samples: list[Sample] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def load_samples(path: Path) -> LoadReport:
    """Every line is checked; bad ones are reported with their line number and left out."""
    report = LoadReport()
    for lineno, row, problem in read_jsonl_objects(path):
        if row is None:
            report.problems.append(problem)
            continue
        problems = sample_problems(row)
        if row.get("dimension") == OVERALL:
            problems.append(f"dimension {OVERALL!r} is the name of the aggregate over all dimensions")
        if problems:  # one entry per skipped line, however many problems it has: the count is of lines
            report.problems.append(f"line {lineno}: " + "; ".join(problems))
            continue
        report.samples.append(Sample(lineno, str(row.get("dimension", "unknown")), str(row.get("prompt", "")),
                                     row["completion"], row.get("choices"), row.get("answer")))
    if not report.samples and not report.problems:
        report.problems.append("the file holds no samples")
    return report


def read_samples_strict(path: Path) -> list[Sample]:
    """Every sample of `path`, or HeldoutFileError naming the file and each bad line (the first ten shown):
    a run that evaluates in training refuses a bad file before it starts rather than at its first evaluation."""
    path = Path(path)
    if not path.is_file():
        raise HeldoutFileError(f"{path}: no such file")
    report = load_samples(path)
    if report.problems:
        shown = "; ".join(report.problems[:10])
        more = f"; … {len(report.problems) - 10} more" if len(report.problems) > 10 else ""
        raise HeldoutFileError(f"{path}: {len(report.problems)} problem(s): {shown}{more}")
    return report.samples


@dataclass(frozen=True)
class Pair:
    """One scored sequence: a sample's completion (choice None) or one of its choices, given its prompt."""

    sample: int
    choice: int | None
    context: str
    continuation: str


def scoring_pairs(samples: Sequence[Sample]) -> list[Pair]:
    pairs = []
    for s_idx, s in enumerate(samples):
        pairs.append(Pair(s_idx, None, s.prompt, s.completion))
        pairs += [Pair(s_idx, c_idx, s.prompt, choice) for c_idx, choice in enumerate(s.choices or [])]
    return pairs


@dataclass(frozen=True)
class Encoded:
    ids: list[int]  # context + continuation token ids, at most max_length
    n_scored: int  # the last n_scored ids are the continuation tokens scored
    truncated: bool


def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str, max_length: int) -> Encoded:
    """`encode`: text → token ids, no special tokens (hf_encoder)."""
    ctx, cont = encode(context), encode(continuation)
    ids = (ctx + cont)[-max_length:]  # keep the continuation; trim the context from the left
    return Encoded(ids, min(len(cont), len(ids) - 1), len(ctx) + len(cont) > max_length)


def hf_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """A Hugging Face tokenizer as `encode`: the text's own tokens, no BOS / EOS added."""
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


def sample_rows(samples: Sequence[Sample], pairs: Sequence[Pair], encoded: Sequence[Encoded],
                logprob_sums: Sequence[float]) -> list[dict[str, Any]]:
    """Per-sample figures from each pair's summed continuation log-probability (nats)."""
    rows: list[dict[str, Any]] = [{"line": s.line, "dimension": s.dimension, "truncated": False} for s in samples]
    choice_scores: dict[int, list[tuple[float, float]]] = {}
    for pair, enc, lp in zip(pairs, encoded, logprob_sums, strict=True):
        row = rows[pair.sample]
        row["truncated"] = row["truncated"] or enc.truncated
        if pair.choice is None:
            nll, tokens = -float(lp), enc.n_scored
            n_bytes = len(samples[pair.sample].completion.encode("utf-8"))
            row.update(nll=nll, tokens=tokens, nll_per_token=nll / tokens, ppl=math.exp(nll / tokens),
                       bytes=n_bytes, bits_per_byte=nll / math.log(2) / n_bytes)
        else:
            choice_scores.setdefault(pair.sample, []).append((float(lp), float(lp) / enc.n_scored))
    for s_idx, scores in choice_scores.items():
        rows[s_idx].update(choice_logprob_sum=[a for a, _ in scores], choice_logprob_avg=[b for _, b in scores],
                           pred_sum=max(range(len(scores)), key=lambda k: scores[k][0]),
                           pred_avg_norm=max(range(len(scores)), key=lambda k: scores[k][1]),
                           answer=samples[s_idx].answer)
    return rows


def aggregate(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per dimension and `overall`: NLL per token and perplexity over all completion tokens, bits per byte over all
    completion bytes, and the MCQ accuracies over the samples with choices (None where there are none)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["dimension"], []).append(r)
    groups[OVERALL] = list(rows)
    out = {}
    for name, rs in groups.items():
        nll, tokens, n_bytes = sum(r["nll"] for r in rs), sum(r["tokens"] for r in rs), sum(r["bytes"] for r in rs)
        mcq = [r for r in rs if "pred_sum" in r]
        out[name] = {
            "samples": len(rs), "nll_per_token": nll / tokens, "ppl": math.exp(nll / tokens),
            "bits_per_byte": nll / math.log(2) / n_bytes, "mcq_samples": len(mcq),
            "mcq_acc_avg_norm": sum(r["pred_avg_norm"] == r["answer"] for r in mcq) / len(mcq) if mcq else None,
            "mcq_acc_sum": sum(r["pred_sum"] == r["answer"] for r in mcq) / len(mcq) if mcq else None,
            "truncated": sum(bool(r.get("truncated")) for r in rs),
        }
    return out
