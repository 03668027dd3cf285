"""The held-out evaluator's numbers against log-probabilities computed here independently (one direct
forward pass per sequence, manual gather), on a tiny random HF model with the bundled tokenizer."""

import json
import math
import shutil

import pytest
import torch

from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir
from kaiyuan_recipes.eval.heldout_eval import aggregate, evaluate_models, load_samples, score


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 2.0)  # a peaked, not uniform, next-token distribution
    path = tmp_path_factory.mktemp("tiny") / "tiny_llama"
    model.save_pretrained(path)
    for f in default_tokenizer_dir().iterdir():
        shutil.copy2(f, path / f.name)
    return path


def reference_logprobs(model, tok, prompt, continuation):
    ctx = tok(prompt, add_special_tokens=False)["input_ids"]
    cont = tok(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), dim=-1)[0]
    return [logp[len(ctx) + j - 1, cont[j]].item() for j in range(len(cont))]


def test_numbers_match_independent_computation(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    # find a choice set on which mean and sum log-probability pick different answers
    candidates = [[" A", " a much longer option with many tokens in it"], [" yes", " no, certainly not in any case"],
                  [" 1", " 2 3 4 5 6 7 8 9"], [" x", " the quick brown fox jumps over"]]
    prompt_mc = "Question: which one?\nAnswer:"
    chosen = None
    for choices in candidates:
        lps = [reference_logprobs(model, tok, prompt_mc, c) for c in choices]
        by_sum = max(range(2), key=lambda k: sum(lps[k]))
        by_avg = max(range(2), key=lambda k: sum(lps[k]) / len(lps[k]))
        if by_sum != by_avg:
            chosen = (choices, by_sum, by_avg)
            break
    assert chosen is not None, "no candidate set separates the two rules on this model"
    choices, by_sum, by_avg = chosen
    rows = [
        {"dimension": "english_dialogue", "prompt": "Hello, how are", "completion": " you today?"},
        {"dimension": "chinese_dialogue", "prompt": "你好，", "completion": "世界🎉再见"},  # multi-byte UTF-8
        {"dimension": "logic", "prompt": prompt_mc, "completion": choices[by_avg], "choices": choices,
         "answer": by_avg},
    ]
    data = tmp_path / "h.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    loaded = load_samples(data)
    got = score(model, tok, loaded.samples, max_length=512, batch_size=2, progress=False)
    for row, sample in zip(got, loaded.samples):
        ref = reference_logprobs(model, tok, sample.prompt, sample.completion)
        assert row["tokens"] == len(ref)
        assert row["nll"] == pytest.approx(-sum(ref), rel=1e-5)
        assert row["ppl"] == pytest.approx(math.exp(-sum(ref) / len(ref)), rel=1e-5)
        n_bytes = len(sample.completion.encode("utf-8"))
        assert row["bits_per_byte"] == pytest.approx(-sum(ref) / math.log(2) / n_bytes, rel=1e-5)
    assert got[1]["bytes"] == len("世界🎉再见".encode()) == 16
    mc = got[2]
    assert (mc["pred_sum"], mc["pred_avg_norm"]) == (by_sum, by_avg) and by_sum != by_avg
    agg = aggregate(got)
    assert agg["logic"]["mcq_acc_avg_norm"] == 1.0 and agg["logic"]["mcq_acc_sum"] == 0.0
    total_nll = sum(r["nll"] for r in got)
    assert agg["overall"]["bits_per_byte"] == pytest.approx(total_nll / math.log(2) / sum(r["bytes"] for r in got))


def test_bad_lines_reported_rest_scored_and_outputs(tiny_model, tmp_path):
    lines = [
        json.dumps({"dimension": "math", "prompt": "1+1=", "completion": " 2"}),
        json.dumps({"dimension": "math", "prompt": "2+2="}),
        json.dumps({"dimension": "code", "prompt": "p", "completion": " c", "choices": "A|B", "answer": 0}),
        "{oops",
        json.dumps({"dimension": "code", "prompt": "def f(", "completion": "x):"}),
    ]
    data = tmp_path / "h.jsonl"
    data.write_text("\n".join(lines) + "\n")
    # any unusable line is an error, before a model is loaded, unless that many are allowed
    refused = r"3 of 5 lines unusable \(line 2: .*; fix them, or score the rest with --allow-skipped 3"
    with pytest.raises(ValueError, match=refused):
        evaluate_models([tiny_model], data, tmp_path / "refused", max_length=64, progress=False, allow_skipped=2)
    assert not (tmp_path / "refused").exists()
    report = evaluate_models([tiny_model, tiny_model], data, tmp_path / "out", max_length=64, progress=False,
                             allow_skipped=3)
    assert report["skipped"] == 3
    assert report["problems"] == ["line 2: 'completion' missing or empty",
                                  "line 3: 'choices' must be a list of 2 or more non-empty strings",
                                  "line 4: not JSON (Expecting property name enclosed in double quotes)"]
    assert report["results"]["tiny_llama"]["overall"]["samples"] == 2
    assert report["results"]["tiny_llama#2"] == report["results"]["tiny_llama"]  # side by side, same numbers
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| math | tiny_llama |" in table and (tmp_path / "out" / "bits_per_byte.png").stat().st_size > 1000
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="nothing to score .the file holds no samples"):
        evaluate_models([tiny_model], empty, tmp_path / "out2", progress=False)


def test_a_bf16_models_logits_are_fp32_projections(tiny_model):
    """In bf16 the lm_head projects in fp32: each continuation token's log-probability is the fp32 log-softmax of
    hidden.float() @ weight.float()ᵀ, not of logits rounded to bf16 (up to 0.06 nats at these logits of 16 to 32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kaiyuan_recipes.data.heldout_scoring import encode_pair, hf_encoder
    from kaiyuan_recipes.eval.heldout_eval import continuation_logprobs

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.bfloat16).eval()
    encode = hf_encoder(tok)
    encoded = [encode_pair(encode, "Hello, how are", " you today? Fine, thanks.", 64),
               encode_pair(encode, "Question: 2 + 3 = ?\nAnswer:", " 5", 64)]
    hidden = []
    model.lm_head.register_forward_pre_hook(lambda module, args: hidden.append(args[0]))
    got = continuation_logprobs(model, tok, encoded, batch_size=2, device="cpu")
    (h,) = hidden  # [rows, width, hidden], bf16: the final norm's output; rows longest first
    assert h.dtype == torch.bfloat16 and "forward" not in vars(model.lm_head)
    logits = h.float() @ model.lm_head.weight.float().t()
    assert logits.max() > 16
    logprobs = logits.double().log_softmax(-1)
    for row, e in enumerate(sorted(encoded, key=lambda e: -len(e.ids))):
        n = len(e.ids)
        expected = [logprobs[row, n - e.n_scored - 1 + j, e.ids[n - e.n_scored + j]].item() for j in range(e.n_scored)]
        assert got[encoded.index(e)] == pytest.approx(expected, rel=1e-5, abs=1e-4)


def test_eval_heldout_exits_non_zero_when_a_line_is_skipped(tmp_path, capsys):
    """3 of 4 lines unusable: an error naming them (exit 2), not results over one line; --allow-skipped 3 scores it."""
    from kaiyuan_recipes.cli.main import main

    data = tmp_path / "h.jsonl"
    data.write_text("\n".join([json.dumps({"dimension": "math", "prompt": "1+1=", "completion": " 2"}),
                               "{oops", json.dumps({"dimension": "math"}), "[]"]) + "\n")
    args = ["eval", "heldout", "--model", str(tmp_path / "no-model"), "--data", str(data), "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "3 of 4 lines unusable (line 2: not JSON" in err and "--allow-skipped 3" in err, err
    assert main(args + ["--allow-skipped", "2"]) == 2
    assert main(args + ["--allow-skipped", "-1"]) == 2 and "expected 0 or more" in capsys.readouterr().err
