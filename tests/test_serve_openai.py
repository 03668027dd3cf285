"""`kaiyuan serve` speaks OpenAI's completions contract as the official `openai` client uses it: plain,
streamed, stop strings, logprobs (checked against the model's own log_softmax), echo and scoring with
max_tokens 0, token-id prompts, n, usage, GET /v1/models, and OpenAI's error body with the field at fault.
Then the hostile cases on the CPU: a client leaving mid-stream frees its row at once, chunked bodies obey
--max-body-bytes, a body that never finishes is a 408, tokenizing does not stall the event loop, an error
inside a stream is an error event, a seeded request is the same alone or sent with others."""

import asyncio
import json
import socket
import time

import httpx
import openai
import pytest
import torch
from test_serve import AUTH, TOKEN, reference_greedy, running_server, tiny_model  # noqa: F401  (fixture)

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def url(tiny_model):  # noqa: F811
    with running_server(tiny_model, "--api-token-env", "KAIYUAN_TEST_TOKEN", "--model-name", "tiny",
                        "--body-timeout-s", "2", env={"KAIYUAN_TEST_TOKEN": TOKEN}) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(tiny_model):  # noqa: F811
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()
    return tok, model


def test_models_and_plain_completion_equal_generate(client, tiny_model, reference):  # noqa: F811
    assert [m.id for m in client.models.list().data] == ["tiny"]
    done = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    tok, _ = reference
    expected = tok.decode(reference_greedy(tiny_model, PROMPT, 12), skip_special_tokens=True)
    assert done.choices[0].text == expected and done.object == "text_completion"
    assert done.choices[0].finish_reason == "length"
    n_prompt = len(tok(PROMPT, add_special_tokens=False)["input_ids"])
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (
        n_prompt, 12, n_prompt + 12)


def test_streamed_equals_plain_and_reports_usage(client):
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0)
    pieces, finish, used = [], None, None
    for chunk in client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        used = chunk.usage or used
    assert "".join(pieces) == plain.choices[0].text and finish == "length" and len(pieces) > 2
    assert used.completion_tokens == 16


def test_stop_strings_cut_the_text_streamed_or_not(client):
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    stop = full[12:15]
    assert stop and full.count(stop) >= 1
    want = full[: full.index(stop)]
    for stops in (stop, [stop, "never-there"]):
        got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stop=stops)
        assert got.choices[0].text == want and got.choices[0].finish_reason == "stop"
        assert got.usage.completion_tokens < 24  # generation stopped there, not at max_tokens
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stop=stop,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs_are_the_models_log_softmax(client, reference):
    tok, model = reference
    got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    lp = got.choices[0].logprobs
    prompt_ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    ids = prompt_ids + tok(got.choices[0].text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    generated = ids[len(prompt_ids):]
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6 == len(generated)
    for k, token in enumerate(generated):
        row = logp[len(prompt_ids) - 1 + k]
        assert lp.token_logprobs[k] == pytest.approx(row[token].item(), abs=1e-4)
        values, indices = row.topk(3)
        assert len(lp.top_logprobs[k]) <= 3
        assert list(lp.top_logprobs[k].values())[0] == pytest.approx(values[0].item(), abs=1e-4)
        assert lp.token_logprobs[k] == pytest.approx(max(lp.top_logprobs[k].values()), abs=1e-6)  # greedy
    assert lp.text_offset[0] == len(PROMPT) and "".join(lp.tokens) == got.choices[0].text


def test_echo_with_max_tokens_0_scores_token_id_prompts(client, reference):
    tok, model = reference
    batch = [tok(t, add_special_tokens=False)["input_ids"] for t in ("Hello world, this is", "另一个提示")]
    got = client.completions.create(model="tiny", prompt=batch, max_tokens=0, echo=True, logprobs=1, temperature=0)
    assert [c.index for c in got.choices] == [0, 1]
    for ids, choice in zip(batch, got.choices):
        lp = choice.logprobs
        assert choice.text == tok.decode(ids) and len(lp.tokens) == len(ids)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        want = [logp[i - 1, ids[i]].item() for i in range(1, len(ids))]
        assert lp.token_logprobs[1:] == pytest.approx(want, abs=1e-4)
    single = client.completions.create(model="tiny", prompt=batch[0], max_tokens=1, echo=True, logprobs=1)
    assert len(single.choices) == 1 and len(single.choices[0].logprobs.tokens) == len(batch[0]) + 1
    assert single.usage.completion_tokens == 1


def test_lists_of_strings_and_n(client):
    got = client.completions.create(model="tiny", prompt=["one", "two"], max_tokens=4, n=3, temperature=0.8, seed=5)
    assert [c.index for c in got.choices] == list(range(6)) and got.usage.completion_tokens <= 24
    greedy = client.completions.create(model="tiny", prompt=["one", "two"], max_tokens=4, n=2, temperature=0)
    texts = [c.text for c in greedy.choices]
    assert texts[0] == texts[1] and texts[2] == texts[3]


@pytest.mark.parametrize("extra, field", [
    ({"best_of": 2}, "best_of"), ({"suffix": "end"}, "suffix"), ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"), ({"extra_body": {"mirostat": 1}}, "mirostat"),
    ({"logprobs": 99}, "logprobs"), ({"stop": [""]}, "stop"), ({"prompt": [[]]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"), ({"max_tokens": 254}, "positions"), ({"n": 0}, "n"),
])
def test_client_mistakes_are_400s_naming_the_field(client, extra, field):
    kwargs = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4} | extra
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**kwargs)
    body = err.value.body
    assert set(body) == {"message", "type", "param", "code"} and body["type"] == "invalid_request_error"
    assert field in body["message"], body


@pytest.mark.parametrize("content, param, message", [
    ({"prompt": "x", "foo-bar": 1}, "foo-bar", "foo-bar: unknown field"),
    ({"prompt": "x", "a[0]": 1}, "a[0]", "a[0]: unknown field"),
    ({"prompt": "x", "stream": True, "stream_options": {"x-y": True}}, "stream_options", "stream_options.x-y"),
    ({"prompt": [5, -2]}, "prompt", "prompt[1]: token id -2"),
    ({"prompt": [[5, 6], [-3]]}, "prompt", "prompt[1][0]: token id -3"),
    ({"prompt": ["a", 3]}, "prompt", "prompt: a string, a list of strings"),
    ({"prompt": "x", "stop": ["a", ""]}, "stop", "stop[1]:"),
    (b"hello", "body", "body: not valid JSON"),
    (b'{"prompt": "x",}', "body", "body: not valid JSON"),
    (b"", "body", "body: a JSON object is required"),
    (b"[1, 2]", "body", "body: a JSON object is required"),
    (b'{"prompt": "\xff"}', "body", "body: not valid JSON (not UTF-8 at byte 12)"),
    (b"[" * 100_000 + b"]" * 100_000, "body", "body: not valid JSON (nested too deeply)"),
    (b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", "body", "body: not valid JSON (an integer of more"),
])
def test_every_400_names_its_field(url, content, param, message):
    """The field at fault by its name as sent (an unknown key whatever its characters, a list item by its index),
    in `param` and at the head of the message; a body that is not a JSON object is `body`."""
    kwargs = {"json": content} if isinstance(content, dict) else {"content": content}
    r = httpx.post(url + "/v1/completions", headers=AUTH | {"Content-Type": "application/json"}, **kwargs)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(message), error


def test_unknown_model_path_and_token_are_the_same_error_body(url, client):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=1)
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    for r in (httpx.get(url + "/nowhere", headers=AUTH), httpx.delete(url + "/v1/completions", headers=AUTH),
              httpx.get(url + "/v1/models")):
        assert r.status_code in (401, 404, 405) and set(r.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_chat_completions_is_a_404_pointing_at_completions(url):
    """A base model has no chat template: OpenAI's chat route is a JSON 404 that names the route to use, and
    the openai client raises it as NotFoundError."""
    with pytest.raises(openai.NotFoundError) as err:
        openai.OpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0).chat.completions.create(
            model="kaiyuan", messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["code"] == "unknown_url", err.value.body
    assert "serves a base model" in err.value.body["message"] and "POST /v1/completions" in err.value.body["message"]


def test_megatron_api_keeps_its_shape_and_logprobs(url):
    r = httpx.put(url + "/api", json={"prompts": ["Hello"], "tokens_to_generate": 3, "logprobs": True,
                                      "temperature": 0}, headers=AUTH, timeout=60)
    assert set(r.json()) == {"text", "segments", "tokens", "logprobs"}
    assert len(r.json()["logprobs"][0]) == len(r.json()["tokens"][0]) - 1


def test_envelope_is_checked_before_any_model_work(url):
    before = httpx.get(url + "/health").json()["requests"]
    for prompt in ("word " * 300, [1] * 250):
        r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 10}, headers=AUTH)
        assert r.status_code == 400 and "256 positions" in r.json()["error"]["message"]
    assert httpx.get(url + "/health").json()["requests"] == before


def test_a_client_leaving_mid_stream_frees_its_row(url):
    before = httpx.get(url + "/health").json()
    body = {"prompt": PROMPT, "max_tokens": 230, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH, timeout=60) as s:
        next(s.iter_lines())  # the first event, then the client goes away
    deadline = time.monotonic() + 10
    while (stats := httpx.get(url + "/health").json())["cancelled"] == before["cancelled"]:
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    assert stats["tokens"] - before["tokens"] < 200  # stopped long before its 230 tokens
    t0 = time.monotonic()
    nxt = httpx.post(url + "/v1/completions", json={"prompt": "next", "max_tokens": 2}, headers=AUTH)
    assert nxt.status_code == 200
    assert time.monotonic() - t0 < 5


def test_chunked_bodies_obey_the_limit_and_slow_bodies_time_out(url):
    def chunks():
        for _ in range(40):
            yield b'{"prompt": "' + b"x" * 65536

    r = httpx.post(url + "/v1/completions", content=chunks(), headers=AUTH | {"Content-Type": "application/json"})
    assert r.status_code == 413 and "bytes" in r.json()["error"]["message"]
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\"")
        t0 = time.monotonic()
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 8


def test_tokenizing_a_large_prompt_does_not_stall_the_event_loop(url):
    big = {"prompt": "lorem ipsum dolor sit amet " * 36000, "max_tokens": 1}  # ~970 kB: tokenized, then a 400

    async def probe():
        async with httpx.AsyncClient(headers=AUTH, timeout=60) as c:
            started = time.monotonic()
            posts = [asyncio.ensure_future(c.post(url + "/v1/completions", json=big)) for _ in range(3)]
            await asyncio.sleep(0.05)
            worst = 0.0
            while not all(p.done() for p in posts):
                t0 = time.monotonic()
                assert (await c.get(url + "/health")).status_code == 200
                worst = max(worst, time.monotonic() - t0)
            return worst, time.monotonic() - started, [(await p).status_code for p in posts]

    worst, total, codes = asyncio.run(probe())
    # Tokenized on the event loop, the three prompts would run one after another and /health would wait for a whole
    # one: about a third of the total. In a thread it answers between them. Relative to the total, so that a busy
    # host (which slows both) does not decide the outcome.
    assert codes == [400] * 3 and worst < 0.2 * total, (worst, total)


def test_a_seeded_request_is_the_same_alone_or_with_others(url):
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 1.2, "seed": 1234}
    alone = httpx.post(url + "/v1/completions", json=body, headers=AUTH, timeout=60).json()["choices"][0]["text"]

    async def together():
        async with httpx.AsyncClient(headers=AUTH, timeout=60) as c:
            others = [c.post(url + "/v1/completions", json=body | {"seed": 7 + i}) for i in range(3)]
            same = [c.post(url + "/v1/completions", json=body) for _ in range(4)]
            return [r.json()["choices"][0]["text"] for r in await asyncio.gather(*same, *others)]

    texts = asyncio.run(together())
    assert texts[:4] == [alone] * 4 and len(set(texts)) > 1


def test_an_error_inside_a_stream_is_an_error_event(tiny_model, monkeypatch):  # noqa: F811
    from fastapi.testclient import TestClient

    from kaiyuan_recipes.serve.app import create_app
    from kaiyuan_recipes.serve.engine import GenerationEngine

    engine = GenerationEngine(tiny_model, "cpu")
    assert engine.ready.wait(60)

    def broken(*args):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.decoder, "step", broken)
    with TestClient(create_app(engine), raise_server_exceptions=False) as c:
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "stream": True})
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert events[-1]["error"]["type"] == "server_error" and "device lost" not in r.text
        plain = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
        assert plain.status_code == 500 and plain.json()["error"]["type"] == "server_error"


def test_openapi_document_describes_the_answers(url):
    spec = httpx.get(url + "/openapi.json").json()
    assert {"/api", "/v1/completions", "/v1/models", "/health"} <= set(spec["paths"])
    post = spec["paths"]["/v1/completions"]["post"]["responses"]
    assert "422" not in post and {"200", "400", "401", "404", "413"} <= set(post)
    assert "text/event-stream" in post["200"]["content"]
    assert post["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")


def test_engine_ends_rows_at_stop_strings_and_cancellation(tiny_model):  # noqa: F811
    """The engine ends a row with the token that completes a stop string, and a row whose request was
    cancelled at its next step."""
    from kaiyuan_recipes.serve.engine import GenerationEngine, Request

    engine = GenerationEngine(tiny_model, "cpu")
    ids = engine.encode(PROMPT)
    full = engine.generate([Request(ids, 40, ignore_eos=True)])[0].token_ids
    text = engine.decode(full)
    stop = text[10:13]
    got = engine.generate([Request(ids, 40, stop=(stop,), top_logprobs=1)])[0]
    k = next(i for i in range(1, len(full) + 1) if stop in engine.decode(full[:i]))
    assert got.token_ids == full[:k] and got.finish_reason == "stop"
    assert len(got.scores.logprobs) == len(ids) + k - 1
    gone = Request(ids, 40, ignore_eos=True, on_token=lambda t: gone.cancelled.set())
    assert len(engine.generate([gone])[0].token_ids) == 1  # the row ends at the step after
    assert engine.stats["cancelled"] == 1
