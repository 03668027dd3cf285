"""lm-evaluation-harness against a real `kaiyuan serve` (uvicorn on a loopback port): its `local-completions`
model (token-id prompts in batches of 4; loglikelihood as echo + logprobs + max_tokens 1, generate_until
with `stop`) must score two local tasks (tests/fixtures/lm_eval: a multiple_choice and a generate_until task)
as lm-eval's own `hf` backend scores them on the same model directory, in fp32 on the CPU:
- every loglikelihood within LOGLIKELIHOOD_TOLERANCE of the hf backend's (the server scores each sequence
  alone, the hf backend in its own batches: float rounding only), every is_greedy flag equal;
- every generated text identical (greedy), and so the metrics (acc, acc_norm, exact_match) equal exactly.
Then on a model whose greedy next token is always end-of-text (what a trained model predicts at a document's
end): the echoed logprobs must hold the generated token, EOS included, or lm-eval drops the last token of
every answer it scores; there a multiple_choice and a loglikelihood_rolling task (documents longer than one
window) must score as under the hf backend, with each backend's max_length as docs/serving.md states."""

import json
from pathlib import Path

import httpx
import pytest
import torch
from test_serve import TOKEN, running_server, tiny_model  # noqa: F401  (fixture)

FIXTURES = Path(__file__).parent / "fixtures" / "lm_eval"
TASKS = ["kaiyuan_tiny_choice", "kaiyuan_tiny_until"]
LOGLIKELIHOOD_TOLERANCE = 1e-4  # nats, per request
EOS = 151643
# lm-eval's hf backend feeds max_length tokens to score max_length; local-completions keeps one position for the
# token it asks for (max_tokens 1) and, in rolling windows, one more for the window's context token: its
# max_length is the hf backend's + 2 for the same windows, and the server's positions must hold that many
HF_MAX_LENGTH = 254
SERVED_MAX_LENGTH = HF_MAX_LENGTH + 2


def evaluate(model: str, model_args: str, batch_size: int, tasks: list[str] = TASKS) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, batch_size=batch_size,
                                   device="cpu", log_samples=True, task_manager=TaskManager(include_path=str(FIXTURES)),
                                   random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)


@pytest.fixture(scope="module")
def eos_model(tiny_model, tmp_path_factory):  # noqa: F811
    """The tiny model made to predict end-of-text everywhere, untrained: hidden dimension 0 of the residual stream
    is a constant (set in every embedding, never written by a layer), and only EOS's output row reads it, so
    EOS's logit is a positive constant times 1 / rms(hidden) that outweighs every other token's; the rest of
    the distribution is the random model's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 0.05
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0
            layer.mlp.down_proj.weight[0] = 0
        model.lm_head.weight[EOS] = 0
        model.lm_head.weight[EOS, 0] = 3.0
    out = tmp_path_factory.mktemp("eos") / "hf"
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(tiny_model)).save_pretrained(out)
    return out


def compare(model_dir: Path, tasks: list[str], tmp_path_factory, hf_length: int, served_length: int,
            *server_args: str) -> tuple[dict, dict]:
    """(lm-eval's hf backend, its local-completions against `kaiyuan serve`) on `tasks`, fp32 on the CPU."""
    mp = pytest.MonkeyPatch()
    mp.chdir(FIXTURES)  # the task YAMLs name their jsonl relative to the working directory
    mp.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_datasets")))
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("OPENAI_API_KEY", TOKEN)  # local-completions sends it as the bearer token
    try:
        hf = evaluate("hf", f"pretrained={model_dir},dtype=float32,max_length={hf_length}", 1, tasks)
        with running_server(model_dir, "--api-token-env", "KAIYUAN_TEST_TOKEN", "--model-name", "tiny",
                            *server_args, env={"KAIYUAN_TEST_TOKEN": TOKEN}) as url:
            served = evaluate("local-completions",
                              f"model=tiny,base_url={url}/v1/completions,tokenizer={model_dir},"
                              f"tokenizer_backend=huggingface,tokenized_requests=True,max_length={served_length},"
                              "max_retries=1", 4, tasks)
    finally:
        mp.undo()
    return hf, served


@pytest.fixture(scope="module")
def both(tiny_model, tmp_path_factory):  # noqa: F811
    return compare(tiny_model, TASKS, tmp_path_factory, 256, 256)


@pytest.fixture(scope="module")
def eos_both(eos_model, tmp_path_factory):
    return compare(eos_model, ["kaiyuan_tiny_choice", "kaiyuan_tiny_rolling"], tmp_path_factory, HF_MAX_LENGTH,
                   SERVED_MAX_LENGTH)


def samples(result: dict, task: str) -> list[dict]:
    return sorted(result["samples"][task], key=lambda s: s["doc_id"])


def check_choices(hf: dict, served: dict) -> None:
    task = "kaiyuan_tiny_choice"
    ours, theirs = samples(served, task), samples(hf, task)
    assert len(ours) == len(theirs) == 8
    for a, b in zip(ours, theirs):
        assert [flag for _, flag in a["filtered_resps"]] == [flag for _, flag in b["filtered_resps"]]
        assert [ll for ll, _ in a["filtered_resps"]] == pytest.approx([ll for ll, _ in b["filtered_resps"]],
                                                                      abs=LOGLIKELIHOOD_TOLERANCE)
    for metric in ("acc,none", "acc_norm,none"):
        assert served["results"][task][metric] == hf["results"][task][metric], metric
    worst = max(abs(x[0] - y[0])
                for a, b in zip(ours, theirs) for x, y in zip(a["filtered_resps"], b["filtered_resps"]))
    print(f"\n{task}: hf {hf['results'][task]} / served {served['results'][task]}; worst |dLL| {worst:.2e}")


def test_multiple_choice_loglikelihoods_and_scores_equal_the_hf_backend(both):
    check_choices(*both)


def test_generate_until_texts_and_scores_equal_the_hf_backend(both):
    hf, served = both
    task = "kaiyuan_tiny_until"
    ours, theirs = samples(served, task), samples(hf, task)
    assert len(ours) == len(theirs) == 8
    assert [s["filtered_resps"] for s in ours] == [s["filtered_resps"] for s in theirs]
    texts = [s["filtered_resps"][0] for s in ours]
    assert not any(stop in t for t in texts for stop in ("\n", ".", ","))  # cut at the `until` strings
    # the fixture's targets are this model's own output on half the rows (a score that can tell a difference)
    assert served["results"][task]["exact_match,none"] == hf["results"][task]["exact_match,none"] == 0.5
    print(f"\n{task}: hf {hf['results'][task]} / served {served['results'][task]}\n{texts}")


def test_the_eos_models_greedy_continuation_is_eos(eos_model):
    """The premise of the tests below, on the saved model: end-of-text wins after every prefix of a task text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(eos_model), dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(str(eos_model))((FIXTURES / "tiny_choice.jsonl").read_text())["input_ids"]
    with torch.no_grad():
        assert (model(torch.tensor([ids[:250]])).logits[0].argmax(-1) == EOS).all()


def test_an_eos_continuation_is_part_of_the_echoed_logprobs(eos_model):
    """lm-eval's loglikelihood request as sent: the answer holds the generated EOS (finish "stop", counted in
    completion_tokens), so the last logprob entry is the generated token's and the prompt's are all there."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(eos_model))("Question: How many legs does a spider have?\nAnswer: eight")[
        "input_ids"]
    body = {"model": "kaiyuan", "prompt": [ids], "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    with running_server(eos_model) as url:
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        streamed = httpx.post(url + "/v1/completions", json={"prompt": ids, "max_tokens": 4, "temperature": 0,
                                                             "stream": True, "stream_options": {"include_usage": True}},
                              timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] == 1
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1 and lp["token_logprobs"][0] is None
    assert lp["token_logprobs"][-1] == pytest.approx(max(lp["top_logprobs"][-1].values()))  # the greedy token
    assert choice["text"] == AutoTokenizer.from_pretrained(str(eos_model)).decode(ids)  # EOS has no text
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert events[-1]["usage"]["completion_tokens"] == 1
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == ["stop"]


def test_on_an_eos_model_loglikelihoods_and_scores_equal_the_hf_backend(eos_both):
    check_choices(*eos_both)


def test_on_an_eos_model_rolling_loglikelihoods_equal_the_hf_backend(eos_both):
    hf, served = eos_both
    task = "kaiyuan_tiny_rolling"
    ours, theirs = samples(served, task), samples(hf, task)
    assert len(ours) == len(theirs) == 4
    # the hf backend sums each window in float32, whose resolution at a long document's ~1e4 nats is ~1e-3: the
    # tolerance is 1e-4 or a few float32 roundings of the total, whichever is larger (a dropped token is nats)
    assert [s["filtered_resps"][0] for s in ours] == pytest.approx([s["filtered_resps"][0] for s in theirs],
                                                                    abs=LOGLIKELIHOOD_TOLERANCE, rel=2**-22)
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        assert served["results"][task][metric] == pytest.approx(hf["results"][task][metric], rel=1e-6), metric
    print(f"\n{task}: hf {hf['results'][task]} / served {served['results'][task]}")
