"""Where the per-sample differences between the in-training held-out scorer and `kaiyuan eval heldout` come from in
bf16, on the CPU (torch runs bf16 GEMMs there too):

    PYTHONPATH=. python benchmarks/heldout_bf16_cpu.py --out benchmarks/results/heldout_bf16_cpu.json

A small Megatron GPT (gpt_smoke's blocks, local spec, the Qwen2 tokenizer's vocabulary) is trained in fp32 for a few
steps on text of the held-out set's shape (tests/gpu/inloop_eval_report.py's synthetic input: word soup, then a sum
whose digits are the completion) until its NLL/token is about gpt_smoke's after 200 iterations; its weights are
rounded to bf16 so that every variant holds the same numbers. The same samples are then scored by: the in-training
scorer on the model in bf16 with bf16 logits (the scorer before its fp32 output layer), in bf16 (the scorer as it
is: fp32 output layer), in bf16 with the chunked loss, in fp32; the exporter's HF model scored by
`kaiyuan eval heldout`'s code in bf16 and fp32, and in bf16 with its lm_head in fp32. Per pair of variants: per-sample
relative NLL difference (max, share over 0.5 %), per-token absolute difference, MCQ predictions that differ.
The in-training scorer also scores each pair alone, unpadded, against its padded batches."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests"), str(ROOT)]

import torch  # noqa: E402
from provenance import provenance, write_json  # noqa: E402

WORDS = ("the", "model", "reads", "一个", "问题", "answer", "because", "因此", "value", "proof", "函数", "list")
TOLERANCE = 5e-3


def heldout_rows(rng: random.Random, per_dimension: int, max_words: int) -> list[dict[str, Any]]:
    from kaiyuan_recipes.data.heldout import DIMENSIONS

    rows = []
    for dim in DIMENSIONS:
        for i in range(per_dimension):
            context = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, max_words)))
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            row = {"dimension": dim, "prompt": f"{context}\nQuestion: {a} + {b} = ?\nAnswer:",
                   "completion": f" {a + b}"}
            if i % 2 == 0:
                row |= {"choices": [f" {a + b}", f" {a + b + 1}", f" {a * b}", " none of these"], "answer": 0}
            rows.append(row)
    return rows


def setup() -> None:
    from conftest import megatron_forward_on_cpu

    from kaiyuan_recipes import compat

    compat.apply()
    from megatron.core import parallel_state

    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    megatron_forward_on_cpu()


def train(model: Any, encode: Any, steps: int, batch: int, seq: int, lr: float) -> list[float]:
    """fp32 Adam on fresh text of the held-out set's shape; every token's loss."""
    rng = random.Random(1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        rows = heldout_rows(rng, 1, 30)[:batch]
        ids = [encode(r["prompt"] + r["completion"])[:seq + 1] for r in rows]
        width = max(len(x) for x in ids) - 1
        tokens = torch.zeros(len(ids), width, dtype=torch.long)
        labels = torch.zeros(len(ids), width, dtype=torch.long)
        mask = torch.zeros(len(ids), width)
        for k, x in enumerate(ids):
            tokens[k, :len(x) - 1], labels[k, :len(x) - 1], mask[k, :len(x) - 1] = torch.tensor(x[:-1]), \
                torch.tensor(x[1:]), 1
        loss = model(tokens, torch.arange(width).expand(len(ids), width), None, labels=labels)
        loss = (loss * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def in_training(model: Any, encoded: list[Any], budget: int, max_length: int, bf16_logits: bool = False) -> list[float]:
    from kaiyuan_recipes.training.heldout_eval import scorer

    patch = contextlib.nullcontext()
    if bf16_logits:  # the scorer before its fp32 output layer: logits in the model's dtype
        patch = _patched(scorer, "fp32_output_layer", lambda chunk: contextlib.nullcontext())
    with patch, torch.no_grad():
        return scorer.score_encoded([model.eval()], encoded, token_budget=budget, max_width=max_length)


def alone(model: Any, encoded: list[Any], bf16_logits: bool = False) -> list[float]:
    """Each pair in a batch of its own, no padding."""
    from kaiyuan_recipes.training.heldout_eval import scorer

    patch = _patched(scorer, "fp32_output_layer", lambda chunk: contextlib.nullcontext()) if bf16_logits \
        else contextlib.nullcontext()
    with patch, torch.no_grad():
        return [float(scorer.batch_logprob_sums(model, encoded, [i], len(e.ids) - 1, moe=False)[0])
                for i, e in enumerate(encoded)]


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def hf_logprob_sums(model: Any, tokenizer: Any, encoded: list[Any], fp32_head: bool) -> list[float]:
    from kaiyuan_recipes.eval.heldout_eval import continuation_logprobs

    if not fp32_head:
        return [sum(lp) for lp in continuation_logprobs(model, tokenizer, encoded, 8, "cpu")]
    head = model.get_output_embeddings()
    original = head.forward
    head.forward = lambda h: torch.nn.functional.linear(h.float(), head.weight.float())
    try:
        return [sum(lp) for lp in continuation_logprobs(model, tokenizer, encoded, 8, "cpu")]
    finally:
        head.forward = original


def compare(samples: list[Any], pairs: list[Any], encoded: list[Any], a: list[float], b: list[float]) -> dict[str, Any]:
    """a against b (the reference): per-sample relative NLL difference, per-token absolute, MCQ predictions."""
    from kaiyuan_recipes.data.heldout_scoring import sample_rows

    ra, rb = sample_rows(samples, pairs, encoded, a), sample_rows(samples, pairs, encoded, b)
    rel = sorted(abs(x["nll"] - y["nll"]) / y["nll"] for x, y in zip(ra, rb))
    tok = sorted(abs(x["nll"] - y["nll"]) / x["tokens"] for x, y in zip(ra, rb))
    flips = [x["line"] for x, y in zip(ra, rb) if (x.get("pred_sum"), x.get("pred_avg_norm"))
             != (y.get("pred_sum"), y.get("pred_avg_norm"))]
    return {"max_rel_nll_diff": rel[-1], "share_over_0.5%": sum(r > TOLERANCE for r in rel) / len(rel),
            "median_rel_nll_diff": rel[len(rel) // 2],
            "per_token_abs_nll_diff": {"median": tok[len(tok) // 2], "p99": tok[int(0.99 * (len(tok) - 1))],
                                       "max": tok[-1]},
            "mcq_prediction_mismatches": len(flips), "mcq_samples": sum("pred_sum" in r for r in ra)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--per-dimension", type=int, default=20)
    ap.add_argument("--max-words", type=int, default=60, help="context words per held-out prompt, at most")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--max-length", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    setup()
    from conftest import tiny_gpt_shape
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kaiyuan_recipes.data.heldout_scoring import (
        aggregate,
        encode_pair,
        hf_encoder,
        read_samples_strict,
        sample_rows,
        scoring_pairs,
    )
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir
    from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model
    from kaiyuan_recipes.export.megatron_to_hf import bridge_for, write_hf_dir
    from kaiyuan_recipes.fastpath.chunked_loss import install_chunked_loss

    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="heldout-bf16-"))
    path = tmp / "heldout.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n"
                            for r in heldout_rows(random.Random(0), args.per_dimension, args.max_words)))
    samples = read_samples_strict(path)
    pairs = scoring_pairs(samples)
    tok_dir = default_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    encode = hf_encoder(tokenizer)
    encoded = [encode_pair(encode, p.context, p.continuation, args.max_length) for p in pairs]

    shape = tiny_gpt_shape(num_layers=args.layers, hidden_size=args.hidden, ffn_hidden_size=3 * args.hidden,
                           num_attention_heads=4, num_query_groups=2, kv_channels=args.hidden // 4,
                           seq_length=args.max_length, max_position_embeddings=args.max_length, vocab_size=151936)
    torch.manual_seed(0)
    fp32 = build_cpu_model(shape, torch.float32)
    losses = train(fp32, encode, args.steps, 16, args.max_length, args.lr)
    with torch.no_grad():
        for p in fp32.parameters():  # bf16-representable: every variant holds the same weights
            p.copy_(p.bfloat16().float())
    fp32.eval()

    def bf16_model(chunked: bool = False) -> Any:
        m = build_cpu_model(shape, torch.bfloat16)
        m.load_state_dict(fp32.state_dict())
        if chunked:
            install_chunked_loss([m])
        return m.eval()

    budget = 4 * args.max_length  # micro-batch 4
    bf16 = bf16_model()
    sums = {"inloop_bf16_bf16_logits": in_training(bf16, encoded, budget, args.max_length, bf16_logits=True),
            "inloop_bf16": in_training(bf16, encoded, budget, args.max_length),
            "inloop_bf16_chunked": in_training(bf16_model(chunked=True), encoded, budget, args.max_length),
            "inloop_fp32": in_training(fp32, encoded, budget, args.max_length),
            "inloop_fp32_alone": alone(fp32, encoded),
            "inloop_bf16_bf16_logits_alone": alone(bf16, encoded, bf16_logits=True),
            "inloop_bf16_alone": alone(bf16, encoded)}
    hf_dir = write_hf_dir(bridge_for(shape, tokenizer_dir=tok_dir), [fp32], tmp / "hf", tok_dir, show_progress=False)
    logit_stats = {}
    for name, dtype in (("hf_bf16", torch.bfloat16), ("hf_fp32", torch.float32)):
        hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=dtype).eval()
        sums[name] = hf_logprob_sums(hf, tokenizer, encoded, fp32_head=False)
        if dtype == torch.bfloat16:
            sums["hf_bf16_fp32_head"] = hf_logprob_sums(hf, tokenizer, encoded, fp32_head=True)
        else:
            with torch.no_grad():
                logits = torch.cat([hf(input_ids=torch.tensor([e.ids])).logits[0, -e.n_scored - 1:-1]
                                    for e in encoded[:200]])
            top = logits.max(dim=-1).values
            logit_stats = {"max_logit_median": top.median().item(), "max_logit_max": top.max().item(),
                           "lse_minus_max_median": (logits.logsumexp(-1) - top).median().item()}
        del hf

    comparisons = [("inloop_bf16_bf16_logits", "hf_fp32"), ("hf_bf16", "hf_fp32"),
                   ("inloop_bf16_bf16_logits", "hf_bf16"), ("inloop_bf16", "hf_bf16"), ("inloop_bf16", "hf_fp32"),
                   ("inloop_bf16_chunked", "inloop_bf16"), ("inloop_bf16", "hf_bf16_fp32_head"),
                   ("hf_bf16_fp32_head", "hf_fp32"), ("inloop_fp32", "hf_fp32"),
                   ("inloop_fp32_alone", "inloop_fp32"), ("inloop_bf16_alone", "inloop_bf16"),
                   ("inloop_bf16_bf16_logits_alone", "inloop_bf16_bf16_logits")]
    overall = {k: aggregate(sample_rows(samples, pairs, encoded, v))["overall"]["nll_per_token"]
               for k, v in sums.items()}
    result = {**provenance("PYTHONPATH=. python benchmarks/heldout_bf16_cpu.py " + " ".join(sys.argv[1:])),
              "host_cpu": _cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "model": {k: shape[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "vocab_size")},
              "training": {"steps": args.steps, "lr": args.lr, "first_loss": losses[0], "last_loss": losses[-1]},
              "heldout": {"samples": len(samples), "pairs": len(pairs), "max_length": args.max_length,
                          "completion_tokens_median": sorted(e.n_scored for e in encoded)[len(encoded) // 2],
                          "context_tokens_max": max(len(e.ids) for e in encoded)},
              "tolerance": TOLERANCE, "logits_fp32_at_scored_positions": logit_stats,
              "nll_per_token_overall": overall,
              "differences": {f"{a} vs {b}": compare(samples, pairs, encoded, sums[a], sums[b])
                              for a, b in comparisons},
              "elapsed_s": time.time() - t0}
    write_json(args.out, result)
    print(json.dumps(result["differences"], indent=1))


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores visible)"
    return "unknown"


if __name__ == "__main__":
    main()
