"""`kaiyuan serve` for real: the CLI starts uvicorn on loopback with a tiny random Qwen3 model; requests
go over HTTP. Generated tokens are checked against transformers' own greedy `generate`; bad input gets a
400 (never a 500, which schemathesis probes from the served OpenAPI spec); 64 concurrent clients all
succeed and are batched together."""

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch
from conftest import free_port

from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out = tmp_path_factory.mktemp("tiny") / "hf"
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         tie_word_embeddings=False, eos_token_id=151643)
    Qwen3ForCausalLM(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(str(default_tokenizer_dir())).save_pretrained(out)
    GenerationConfig(eos_token_id=151643, pad_token_id=151643, do_sample=False).save_pretrained(out)
    return out


@contextlib.contextmanager
def running_server(model_dir, *args: str, env: dict | None = None):
    """`kaiyuan serve MODEL_DIR --device cpu ARGS` on a free loopback port: its URL while it runs; its
    output (checked for the token) when it has stopped."""
    with server_process(model_dir, *args, env=env) as (url, _proc):
        yield url


@contextlib.contextmanager
def server_process(model_dir, *args: str, env: dict | None = None):
    """As running_server, yielding (URL, the server's Popen) once /health says ready."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kaiyuan_recipes.cli.main", "serve", str(model_dir),
                             "--port", str(port), "--device", "cpu", *args],
                            env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(proc.stdout.read())
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.3)
    else:
        proc.kill()
        raise TimeoutError("server did not come up")
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        output = proc.communicate(timeout=30)[0]
        proc.output = output  # the server's log, for the test after its `with`
    assert TOKEN not in output  # no secret in the logs


@pytest.fixture(scope="module")
def server(tiny_model):
    # --max-tokens 16: schemathesis's largest requests (128 prompts x max_tokens) stay quick on a CPU
    with running_server(tiny_model, "--api-token-env", "KAIYUAN_TEST_TOKEN", "--max-tokens", "16",
                        env={"KAIYUAN_TEST_TOKEN": TOKEN}) as url:
        yield url


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def reference_greedy(model_dir, prompt: str, n: int) -> list[int]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=151643)
    return out[0, ids.shape[1]:].tolist()


def test_megatron_api_contract_unchanged(server, tiny_model):
    # The original README's curl: PUT /api with prompts and tokens_to_generate.
    body = {"prompts": ["Hello world", "你好，世界"], "tokens_to_generate": 8, "temperature": 0.0, "top_k": 1}
    r = httpx.put(server + "/api", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    assert set(data) == {"text", "segments", "tokens"}
    for prompt, text, tokens, segments in zip(body["prompts"], data["text"], data["tokens"], data["segments"]):
        assert text.startswith(prompt) and len(segments) == len(tokens)
    expected = reference_greedy(tiny_model, "Hello world", 8)
    prompt_len = len(data["tokens"][0]) - len(expected)
    assert data["tokens"][0][prompt_len:] == expected[: len(data["tokens"][0]) - prompt_len]
    with_lp = httpx.put(server + "/api", json=body | {"logprobs": True}, headers=AUTH, timeout=60).json()
    assert len(with_lp["logprobs"][0]) == len(with_lp["tokens"][0]) - 1
    assert all(v <= 0 for v in with_lp["logprobs"][0])


def test_openai_completions_and_streaming_agree(server, tiny_model):
    body = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0}
    r = httpx.post(server + "/v1/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "text_completion" and data["usage"]["completion_tokens"] <= 12
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    expected = tok.decode(reference_greedy(tiny_model, body["prompt"], 12), skip_special_tokens=True)
    assert data["choices"][0]["text"] == expected
    pieces, finish = [], None
    with httpx.stream("POST", server + "/v1/completions", json=body | {"stream": True}, headers=AUTH, timeout=60) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        for line in s.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                pieces.append(choice["text"])
                finish = choice["finish_reason"] or finish
    assert "".join(pieces) == expected and finish in ("stop", "length") and len(pieces) > 2


@pytest.mark.parametrize("payload, fragment", [
    ({"tokens_to_generate": 4}, "prompts"),
    ({"prompts": ["hi"], "tokens_to_generate": -1}, "tokens_to_generate"),
    ({"prompts": ["hi"], "tokens_to_generate": 10**9}, "tokens_to_generate"),
    ({"prompts": ["hi"], "temperature": -0.5}, "temperature"),
    ({"prompts": ["hi"], "top_p": 1.5}, "top_p"),
    ({"prompts": ["hi"], "top_k": 5, "top_p": 0.5}, "top-k and top-p"),
    ({"prompts": ["word " * 400], "tokens_to_generate": 4}, "exceeds the 256 positions served"),
    ({"prompts": "not a list"}, "prompts"),
    ({"prompts": []}, "prompts"),
])
def test_bad_megatron_input_is_a_400_with_a_message(server, payload, fragment):
    r = httpx.put(server + "/api", json=payload, headers=AUTH, timeout=60)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"]


# The three inputs an outside test found answered with a plain-text 500 (streamed: a 200 with an empty body).
@pytest.mark.parametrize("field, value, fragment", [
    ("seed", 2**64, "seed"),
    ("temperature", 2.2e-313, "temperature"),
    ("prompt", "lone \ud800 surrogate", "lone surrogate"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_out_of_range_or_unencodable_values_are_a_400(server, field, value, fragment, stream):
    body = {"prompt": "Hello", "max_tokens": 2, "stream": stream, field: value}
    content = json.dumps(body).encode()  # json.dumps escapes the surrogate as \ud800, as a client would send it
    r = httpx.post(server + "/v1/completions", content=content, headers=AUTH | {"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"]
    if field != "seed":
        m = httpx.put(server + "/api", headers=AUTH | {"Content-Type": "application/json"}, content=json.dumps(
            {"prompts": [value if field == "prompt" else "Hello"], "tokens_to_generate": 2,
             **({"temperature": value} if field == "temperature" else {})}).encode())
        assert m.status_code == 400 and fragment in m.json()["error"]["message"], m.text


def test_largest_seed_and_smallest_temperature_are_served(server):
    r = httpx.post(server + "/v1/completions", headers=AUTH, timeout=60,
                   json={"prompt": "Hello", "max_tokens": 2, "seed": 2**53 - 1, "temperature": 1e-4})
    assert r.status_code == 200, r.text


def test_malformed_json_oversized_body_and_auth(server):
    r = httpx.put(server + "/api", content=b'{"prompts": [', headers=AUTH | {"Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/completions", json={"prompt": "x", "top_p": 0}, headers=AUTH)
    assert r.status_code == 400 and "top_p" in r.json()["error"]["message"]
    r = httpx.put(server + "/api", content=b"x" * (2 << 20), headers=AUTH | {"Content-Type": "application/json"})
    assert r.status_code == 413
    assert httpx.put(server + "/api", json={"prompts": ["hi"]}).status_code == 401
    assert httpx.put(server + "/api", json={"prompts": ["hi"]},
                     headers={"Authorization": "Bearer nope"}).status_code == 401
    spec = httpx.get(server + "/openapi.json").json()
    assert {"/api", "/v1/completions"} <= set(spec["paths"])


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on `port` (the kernel's own tables, /proc/net/tcp and tcp6)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        if not os.path.exists(table):
            continue
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                if width == 8:  # little-endian IPv4
                    found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:
                    found.add(socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))
    return found


def test_binds_loopback_only(server):
    """The server's listening socket is bound to 127.0.0.1 only, read from the kernel's socket table (on hosts with
    no other interface, trying to connect from another address would test nothing)."""
    port = int(server.rsplit(":", 1)[1])
    assert listening_addresses(port) == {"127.0.0.1"}


def test_64_concurrent_clients_batched_without_errors(server):
    async def load():
        async with httpx.AsyncClient(headers=AUTH, timeout=120) as client:
            async def one(i):
                r = await client.put(server + "/api", json={"prompts": [f"client {i} says"], "tokens_to_generate": 6,
                                                            "temperature": 0.0})
                return r.status_code, r.json()
            return await asyncio.gather(*(one(i) for i in range(64)))

    results = asyncio.run(load())
    assert [code for code, _ in results] == [200] * 64
    assert all(body["text"][0].startswith(f"client {i} says") for i, (_, body) in enumerate(results))
    stats = httpx.get(server + "/health").json()
    assert stats["max_batch"] > 1  # concurrent requests shared a batch


def test_schemathesis_finds_the_server_as_its_openapi_document_says(server):
    """Every check but positive_data_acceptance: no server error, statuses, content types, bodies and
    headers as documented, bad input refused, auth enforced. Schema-valid input the server may still refuse
    are the
    contracts' cross-field rules, which a JSON schema cannot state: prompt + max_tokens within the model's
    positions, Megatron's tokens_to_generate 0 only with logprobs and not top-k with top-p, no logprobs
    in a stream."""
    env = dict(os.environ, SCHEMATHESIS_HOOKS="")
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", server + "/openapi.json", "--checks", "all",
           "--exclude-checks", "positive_data_acceptance", "--max-examples", "10", "--request-timeout", "180",
           "--max-response-time", "120",  # 128 sampled rows on a shared CPU: seconds, not the default 10 s
           "--header", f"Authorization: Bearer {TOKEN}", "--seed", "1", "--generation-database", "none"]
    probe = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert probe.returncode == 0, probe.stdout[-4000:] + probe.stderr[-2000:]
    import re

    counts = re.search(r"(\d+) generated, (\d+) passed", probe.stdout)
    assert counts and int(counts[1]) >= 20 and counts[1] == counts[2], probe.stdout[-2000:]


def test_engine_streams_greedy_tokens_as_they_are_decoded(tiny_model):
    """The tokens a streaming request's callback receives, in order, are the completion's tokens, cut at
    max_new_tokens for each row, and the same as without streaming."""
    from kaiyuan_recipes.serve.engine import GenerationEngine, Request

    engine = GenerationEngine(tiny_model, "cpu")
    prompts = [engine.encode("Hello world, this is a test")[:4], engine.encode("另一个提示，用来测试批处理")[:6]]
    received: list[list[int]] = [[], []]
    requests = [Request(p, n, ignore_eos=True, on_token=received[i].append)
                for i, (p, n) in enumerate(zip(prompts, (11, 6)))]
    done = engine.generate(requests)
    assert [c.token_ids for c in done] == received
    assert [len(r) for r in received] == [11, 6]
    plain = engine.generate([Request(p, n, ignore_eos=True) for p, n in zip(prompts, (11, 6))])
    assert [c.token_ids for c in plain] == received


def test_engine_samples_with_seeds_nuclei_and_streams(tiny_model, monkeypatch):
    """Sampled requests decode in the batch decoder (never generate()): a seed repeats a completion, another
    seed changes it, a nucleus small enough to hold only the top token gives the greedy completion, and
    streamed sampled tokens are the completion's."""
    from kaiyuan_recipes.serve.engine import GenerationEngine, Request, Sampling

    engine = GenerationEngine(tiny_model, "cpu")
    monkeypatch.setattr(engine.model, "generate", lambda *a, **k: pytest.fail("sampled through generate()"))
    prompts = [engine.encode("Hello world, this is a test")[:4], engine.encode("另一个提示，用来测试批处理")[:6]]
    hot = Sampling(temperature=1.5, top_k=50, seed=7)

    def run(sampling, **kw):
        return [c.token_ids for c in engine.generate([Request(p, 12, sampling, ignore_eos=True, **kw)
                                                      for p in prompts])]

    first = run(hot)
    assert run(hot) == first
    assert run(Sampling(temperature=1.5, top_k=50, seed=8)) != first  # 2 x 12 draws from ~50 tokens
    assert run(Sampling(temperature=1.0, top_p=1e-6, seed=1)) == run(Sampling())
    received: list[list[int]] = [[], []]
    done = engine.generate([Request(p, 12, hot, ignore_eos=True, on_token=received[i].append)
                            for i, p in enumerate(prompts)])
    assert [c.token_ids for c in done] == received == first


def test_the_journeys_openai_request_is_served_by_default(server):
    """tests/gpu/journey.sh's request, verbatim, against a server started without --model-name: the default
    served name is "kaiyuan" whatever the model directory is called (a run served from its checkpoints is
    exported to a temporary directory)."""
    body = {"model": "kaiyuan", "prompt": "A hacker is", "max_tokens": 4, "temperature": 0}
    r = httpx.post(server + "/v1/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    assert httpx.get(server + "/v1/models", headers=AUTH).json()["data"][0]["id"] == "kaiyuan"

