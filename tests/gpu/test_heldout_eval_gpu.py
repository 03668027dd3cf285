"""GPU: kaiyuan.heldout_eval's scorer in bf16 on CUDA against `kaiyuan eval heldout` on the same weights exported to
HF (bf16 on CUDA too): gpt_smoke's shape with the fast spec and the chunked loss (what training runs without TE),
random weights with a peaked output layer, a held-out file of 7 dimensions with 4-choice questions and one sample
longer than the sequence length. Per-sample NLL within 0.5 % relative; MCQ predictions identical except where two
choices tie within bf16 rounding (counted and printed). Prints the largest relative difference.

usage (a CUDA GPU): python -m pytest -q -s tests/gpu/test_heldout_eval_gpu.py"""

from __future__ import annotations

import json

import pytest
import torch

from kaiyuan_recipes.data.heldout import DIMENSIONS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SEQ = 1024
BF16_REL_TOLERANCE = 5e-3


@pytest.fixture(scope="module", autouse=True)
def _parallel(megatron_parallel):  # tests/conftest.py: NCCL process group + CUDA RNG tracker
    yield


def heldout_rows() -> list[dict]:
    rows = []
    for d, dim in enumerate(DIMENSIONS):
        for i in range(6):
            row = {"dimension": dim, "prompt": f"[{dim} #{i}] 问题：{i} + {d} = ?\nAnswer:", "completion": f" {i + d}"}
            if i % 2 == 0:
                row |= {"choices": [f" {i + d}", f" {i + d + 1}", " 0", " none of the above"], "answer": 0}
            rows.append(row)
    rows.append({"dimension": "code", "prompt": "x = 1\n" * 700, "completion": "print(x)"})  # > SEQ tokens
    return rows


def test_in_training_scorer_equals_the_exported_model_in_bf16(tmp_path):
    from megatron.core.process_groups_config import ProcessGroupCollection
    from transformers import AutoTokenizer

    from kaiyuan_recipes.data.heldout_scoring import (
        encode_pair,
        hf_encoder,
        read_samples_strict,
        sample_rows,
        scoring_pairs,
    )
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir
    from kaiyuan_recipes.eval.heldout_eval import evaluate_models
    from kaiyuan_recipes.export.megatron_to_hf import bridge_for, write_hf_dir
    from kaiyuan_recipes.fastpath.chunked_loss import install_chunked_loss
    from kaiyuan_recipes.models.providers import build_provider
    from kaiyuan_recipes.models.shape import ModelShape
    from kaiyuan_recipes.training.heldout_eval.scorer import score_encoded

    path = tmp_path / "heldout.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in heldout_rows()))
    shape = ModelShape.for_recipe("gpt_smoke").with_fields(seq_length=SEQ)
    provider = build_provider(dict(shape.fields), "fast")
    provider.params_dtype, provider.bf16 = torch.bfloat16, True
    provider.finalize()
    # provide() reads the process groups from the provider (Megatron-Bridge sets them in
    # provide_distributed_model); here the ones megatron_parallel initialised
    provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    torch.manual_seed(0)
    model = provider.provide().cuda().to(torch.bfloat16).eval()
    with torch.no_grad():
        model.output_layer.weight.normal_(0, 0.1)
    install_chunked_loss([model])

    samples = read_samples_strict(path)
    pairs = scoring_pairs(samples)
    tok_dir = default_tokenizer_dir()
    encode = hf_encoder(AutoTokenizer.from_pretrained(str(tok_dir)))
    encoded = [encode_pair(encode, p.context, p.continuation, SEQ) for p in pairs]
    with torch.no_grad():
        ours = sample_rows(samples, pairs, encoded, score_encoded([model], encoded, 8 * SEQ, SEQ))

    hf_dir = write_hf_dir(bridge_for(shape, tokenizer_dir=tok_dir), [model.cpu()], tmp_path / "hf", tok_dir,
                          show_progress=False)
    theirs = evaluate_models([hf_dir], path, tmp_path / "eval", max_length=SEQ, device="cuda",
                             progress=False)["samples"]["hf"]
    worst = max(abs(a["nll"] - b["nll"]) / b["nll"] for a, b in zip(ours, theirs))
    flips = [a["line"] for a, b in zip(ours, theirs)
             if (a.get("pred_sum"), a.get("pred_avg_norm")) != (b.get("pred_sum"), b.get("pred_avg_norm"))]
    print(f"bf16: largest per-sample relative NLL difference {worst:.2e}; MCQ predictions differing: {flips}")
    assert worst < BF16_REL_TOLERANCE
    assert sum(r["truncated"] for r in ours) == sum(r["truncated"] for r in theirs) == 1
    for line in flips:  # only a tie within bf16 rounding may pick differently
        a = next(r for r in ours if r["line"] == line)
        top = sorted(a["choice_logprob_avg"], reverse=True)
        assert top[0] - top[1] < 2e-2, (line, a["choice_logprob_avg"])
