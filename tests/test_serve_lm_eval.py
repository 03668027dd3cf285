"""lm-evaluation-harness against a real `kaiyuan serve` (uvicorn on a loopback port): its `local-completions`
model (token-id prompts in batches of 4; loglikelihood as echo + logprobs + max_tokens 1, generate_until
with `stop`) must score two local tasks (tests/fixtures/lm_eval: a multiple_choice and a generate_until task)
as lm-eval's own `hf` backend scores them on the same model directory, in fp32 on the CPU:
- every loglikelihood within LOGLIKELIHOOD_TOLERANCE of the hf backend's (the server scores each sequence
  alone, the hf backend in its own batches: float rounding only), every is_greedy flag equal;
- every generated text identical (greedy), and so the metrics (acc, acc_norm, exact_match) equal exactly."""

from pathlib import Path

import pytest
from test_serve import TOKEN, running_server, tiny_model  # noqa: F401  (fixture)

FIXTURES = Path(__file__).parent / "fixtures" / "lm_eval"
TASKS = ["kaiyuan_tiny_choice", "kaiyuan_tiny_until"]
LOGLIKELIHOOD_TOLERANCE = 1e-4  # nats, per request


def evaluate(model: str, model_args: str, batch_size: int) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=TASKS, batch_size=batch_size,
                                   device="cpu", log_samples=True, task_manager=TaskManager(include_path=str(FIXTURES)),
                                   random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)


@pytest.fixture(scope="module")
def both(tiny_model, tmp_path_factory):  # noqa: F811
    mp = pytest.MonkeyPatch()
    mp.chdir(FIXTURES)  # the task YAMLs name their jsonl relative to the working directory
    mp.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_datasets")))
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("OPENAI_API_KEY", TOKEN)  # local-completions sends it as the bearer token
    try:
        hf = evaluate("hf", f"pretrained={tiny_model},dtype=float32,max_length=256", 1)
        with running_server(tiny_model, "--api-token-env", "KAIYUAN_TEST_TOKEN", "--model-name", "tiny",
                            env={"KAIYUAN_TEST_TOKEN": TOKEN}) as url:
            served = evaluate("local-completions",
                              f"model=tiny,base_url={url}/v1/completions,tokenizer={tiny_model},"
                              "tokenizer_backend=huggingface,tokenized_requests=True,max_length=256,"
                              "max_retries=1", 4)
    finally:
        mp.undo()
    return hf, served


def samples(result: dict, task: str) -> list[dict]:
    return sorted(result["samples"][task], key=lambda s: s["doc_id"])


def test_multiple_choice_loglikelihoods_and_scores_equal_the_hf_backend(both):
    hf, served = both
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
