"""kaiyuan.heldout_eval's scorer against `kaiyuan eval heldout` on the same weights: a tiny Megatron GPT (gpt_smoke's
blocks, fp32, local spec, on the CPU) scored in process by the in-training scorer, then exported to a HF directory
by the exporter and scored by the post-hoc evaluator's code. Per-sample NLL agrees to fp32 rounding, the MCQ
predictions are identical, and over-long samples are cut and counted alike. The chunked loss (the fast spec's)
gives the same figures without materialising the logits."""

import json
import math

import pytest
import torch
from conftest import megatron_forward_on_cpu, tiny_gpt_shape

from kaiyuan_recipes.data.heldout_scoring import (
    OVERALL,
    aggregate,
    encode_pair,
    hf_encoder,
    read_samples_strict,
    sample_rows,
    scoring_pairs,
)
from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

MAX_LENGTH = 48  # the scorers' sequence length: short, so that some samples are cut
FP32_REL_TOLERANCE = 1e-5  # per-sample NLL, in-training vs exported HF, both fp32 on the CPU
SHAPE = dict(seq_length=MAX_LENGTH, max_position_embeddings=MAX_LENGTH, vocab_size=151936)

ROWS = [
    {"dimension": "english_dialogue", "prompt": "Hello, how are", "completion": " you today?"},
    {"dimension": "english_dialogue", "prompt": "The weather is", "completion": " sunny and warm, so we walk."},
    {"dimension": "chinese_dialogue", "prompt": "你好，", "completion": "世界🎉再见"},  # multi-byte UTF-8
    {"dimension": "math", "prompt": "Question: 2 + 3 = ?\nAnswer:", "completion": " 5",
     "choices": [" 4", " 5", " 6", " five or maybe six, hard to say"], "answer": 1},
    {"dimension": "math", "prompt": "Question: 10 / 2 = ?\nAnswer:", "completion": " 5",
     "choices": [" 2", " 5", " 20", " 8"], "answer": 1},
    {"dimension": "logic", "prompt": "If all A are B and x is A, then x is", "completion": " B",
     "choices": [" B", " not B", " unknown in general", " A only"], "answer": 0},
    # the prompt alone is longer than MAX_LENGTH: the context loses its start
    {"dimension": "logic", "prompt": " ".join(["premise"] * 80) + ". Therefore", "completion": " the conclusion.",
     "choices": [" the conclusion.", " nothing"], "answer": 0},
    # the completion alone is longer than MAX_LENGTH: its last tokens are scored
    {"dimension": "code", "prompt": "def f(x):", "completion": "\n" + "    x = x + 1\n" * 30 + "    return x"},
    {"dimension": "code", "prompt": "import", "completion": " numpy as np"},
]


@pytest.fixture(scope="module")
def heldout_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("heldout") / "heldout.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS))
    return path


def build_model():
    from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model

    torch.manual_seed(0)
    model = build_cpu_model(tiny_gpt_shape(num_layers=2, **SHAPE), torch.float32)
    with torch.no_grad():
        model.output_layer.weight.normal_(0, 0.5)  # a peaked next-token distribution, so choices differ
    return model.eval()


@pytest.fixture(scope="module")
def model(megatron_parallel):
    return build_model()


def in_training_rows(model, path, token_budget):
    from transformers import AutoTokenizer

    from kaiyuan_recipes.training.heldout_eval.scorer import score_encoded

    samples = read_samples_strict(path)
    pairs = scoring_pairs(samples)
    encode = hf_encoder(AutoTokenizer.from_pretrained(str(default_tokenizer_dir())))
    encoded = [encode_pair(encode, p.context, p.continuation, MAX_LENGTH) for p in pairs]
    with torch.no_grad():
        sums = score_encoded([model], encoded, token_budget=token_budget, max_width=MAX_LENGTH)
    return sample_rows(samples, pairs, encoded, sums)


def test_in_training_scores_equal_the_exported_models(model, heldout_file, tmp_path, monkeypatch):
    from kaiyuan_recipes.eval.heldout_eval import evaluate_models
    from kaiyuan_recipes.export.megatron_to_hf import bridge_for, write_hf_dir

    megatron_forward_on_cpu(monkeypatch.setattr)
    # a budget of two 48-token rows: several batches, with padding, in the order the planner picks
    ours = in_training_rows(model, heldout_file, token_budget=2 * MAX_LENGTH)

    tok_dir = default_tokenizer_dir()
    hf_dir = write_hf_dir(bridge_for(tiny_gpt_shape(num_layers=2, **SHAPE), tokenizer_dir=tok_dir), [model],
                          tmp_path / "hf", tok_dir, show_progress=False)
    report = evaluate_models([hf_dir], heldout_file, tmp_path / "eval", max_length=MAX_LENGTH, device="cpu",
                             batch_size=3, progress=False)
    theirs = report["samples"]["hf"]

    assert [r["line"] for r in ours] == [r["line"] for r in theirs] == list(range(1, len(ROWS) + 1))
    worst = max(abs(a["nll"] - b["nll"]) / b["nll"] for a, b in zip(ours, theirs))
    print(f"largest per-sample relative NLL difference, fp32: {worst:.2e}")
    assert worst < FP32_REL_TOLERANCE
    for a, b in zip(ours, theirs):
        assert (a["tokens"], a["bytes"], a["truncated"]) == (b["tokens"], b["bytes"], b["truncated"])
        assert a["choice_logprob_avg"] == pytest.approx(b["choice_logprob_avg"], rel=FP32_REL_TOLERANCE) \
            if "pred_sum" in b else "pred_sum" not in a
        assert (a.get("pred_sum"), a.get("pred_avg_norm")) == (b.get("pred_sum"), b.get("pred_avg_norm"))
    # the two long samples are cut and counted, by both paths
    assert [r["line"] for r in ours if r["truncated"]] == [7, 8]
    assert aggregate(ours)[OVERALL]["truncated"] == report["results"]["hf"][OVERALL]["truncated"] == 2
    assert ours[7]["tokens"] == MAX_LENGTH - 1  # the completion's last tokens, after one token of context
    mine, post_hoc = aggregate(ours), report["results"]["hf"]
    assert set(mine) == set(post_hoc) == {"english_dialogue", "chinese_dialogue", "math", "logic", "code", OVERALL}
    for dim in mine:
        assert mine[dim]["mcq_acc_avg_norm"] == post_hoc[dim]["mcq_acc_avg_norm"]
        assert mine[dim]["mcq_acc_sum"] == post_hoc[dim]["mcq_acc_sum"]
        assert mine[dim]["nll_per_token"] == pytest.approx(post_hoc[dim]["nll_per_token"], rel=FP32_REL_TOLERANCE)


def test_the_chunked_loss_gives_the_same_figures(model, heldout_file, monkeypatch):
    """The fast spec's loss (fastpath/chunked_loss.py): the output layer hands its input to the loss, which works
    through the vocabulary chunk by chunk; the figures equal those of the whole logits."""
    from kaiyuan_recipes.fastpath import chunked_loss

    megatron_forward_on_cpu(monkeypatch.setattr)
    plain = in_training_rows(model, heldout_file, token_budget=4 * MAX_LENGTH)
    chunked_model = build_model()  # the same weights (same seed), its output layer patched
    assert torch.equal(chunked_model.output_layer.weight, model.output_layer.weight)
    chunked_loss.install_chunked_loss([chunked_model])
    materialised = []
    monkeypatch.setattr(chunked_loss.DeferredLogits, "materialize",
                        lambda self: materialised.append(1) or self.hidden @ self.weight.t())
    monkeypatch.setattr(chunked_loss, "chunk_tokens", lambda vocab: 32)  # several chunks per batch
    chunked = in_training_rows(chunked_model, heldout_file, token_budget=4 * MAX_LENGTH)
    assert not materialised
    for a, b in zip(chunked, plain):
        assert a["nll"] == pytest.approx(b["nll"], rel=FP32_REL_TOLERANCE)
        assert (a.get("pred_sum"), a.get("pred_avg_norm")) == (b.get("pred_sum"), b.get("pred_avg_norm"))
    assert not math.isnan(aggregate(chunked)[OVERALL]["nll_per_token"])


@pytest.mark.parametrize("loss", ["plain", "chunked"])
def test_a_bf16_models_logits_are_fp32_projections(model, heldout_file, monkeypatch, loss):
    """In bf16 the scorer projects the final hidden state in fp32: each pair's log-probability is the fp32 log-softmax
    of hidden.float() @ weight.float()ᵀ, not of logits rounded to bf16 (half a unit in the last place, 0.03 to 0.06
    nats at these logits of 10 to 30, several times the 0.5 % a short completion's NLL may differ by)."""
    from transformers import AutoTokenizer

    from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model
    from kaiyuan_recipes.fastpath import chunked_loss
    from kaiyuan_recipes.training.heldout_eval import scorer

    megatron_forward_on_cpu(monkeypatch.setattr)
    bf16 = build_cpu_model(tiny_gpt_shape(num_layers=2, **SHAPE), torch.bfloat16)
    bf16.load_state_dict(model.state_dict())
    if loss == "chunked":
        chunked_loss.install_chunked_loss([bf16])
        monkeypatch.setattr(chunked_loss, "chunk_tokens", lambda vocab: 32)
    bf16.eval()
    encode = hf_encoder(AutoTokenizer.from_pretrained(str(default_tokenizer_dir())))
    encoded = [encode_pair(encode, p.context, p.continuation, MAX_LENGTH)
               for p in scoring_pairs(read_samples_strict(heldout_file))]
    hidden = []
    bf16.output_layer.register_forward_pre_hook(lambda module, args: hidden.append(args[0]))
    idx = list(range(len(encoded)))
    with torch.no_grad():
        sums = scorer.batch_logprob_sums(bf16, encoded, idx, MAX_LENGTH, moe=False)
    (h,) = hidden  # [width, rows, hidden], bf16: the final norm's output
    assert h.dtype == torch.bfloat16
    logits = h.float() @ bf16.output_layer.weight.float().t()
    assert logits.max() > 10  # logits where bf16's rounding is a few hundredths of a nat
    logprobs = logits.double().log_softmax(-1)
    _, labels, scored, _ = scorer.batch_tensors(encoded, idx, MAX_LENGTH, h.device)
    expected = (logprobs.transpose(0, 1).gather(2, labels[..., None])[..., 0] * scored).sum(dim=1)
    torch.testing.assert_close(sums, expected, rtol=1e-5, atol=1e-4)
    assert "forward" not in vars(bf16.output_layer) if loss == "plain" else \
        vars(bf16.output_layer)["forward"].__func__ is chunked_loss._deferred_output  # put back as it was
