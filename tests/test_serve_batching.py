"""Continuous batching in `kaiyuan serve`, on the CPU (eager steps; the GPU's captured steps are
tests/gpu/test_serve_gpu.py): requests join the running batch at the next step and leave when done, greedy
rows equal transformers' generate token for token in fp32 whoever else decodes, each row samples with its
own settings and seed, the per-row sampler filters as transformers' warpers do, the envelope bounds what is
served, /health says ready only after warm-up, and SIGTERM drains a real server process."""

import asyncio
import functools
import json
import re
import signal
import threading
import time

import httpx
import pytest
import torch
from test_serve import AUTH, TOKEN, server_process, tiny_model  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def engine(tiny_model):  # noqa: F811
    from kaiyuan_recipes.serve.batch_decoder import Envelope
    from kaiyuan_recipes.serve.engine import GenerationEngine

    eng = GenerationEngine(tiny_model, "cpu", Envelope(max_batch=8, max_seq_len=256, capture=False))
    assert eng.ready.wait(60)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference(tiny_model):  # noqa: F811
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()

    def greedy(prompt: list[int], n: int) -> list[int]:
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=151643)
        return out[0, len(prompt):].tolist()

    return greedy


def test_requests_join_and_leave_the_running_batch_and_stay_equal_to_generate(engine, reference):
    """B and C are submitted while A decodes (from A's 5th token): they join A's batch at the next step,
    C is sampled, B ends first and leaves; every greedy row equals generate() on its prompt alone."""
    from kaiyuan_recipes.serve.engine import Request, Sampling

    a_prompt, b_prompt, c_prompt = (engine.encode(t)[:n] for t, n in (("Hello world, this is a test", 3),
                                                                       ("另一个提示，用来测试批处理", 7),
                                                                       ("x = [1, 2, 3] + [4, 5, 6]", 5)))
    joined: dict[str, object] = {}
    steps_at: dict[str, int] = {}

    def on_a(token: int) -> None:
        a_tokens.append(token)
        if len(a_tokens) == 5:
            steps_at["join"] = engine.stats["steps"]
            joined["b"] = engine.submit(Request(b_prompt, 8, ignore_eos=True,
                                                on_token=lambda t: steps_at.setdefault("b", engine.stats["steps"])))
            joined["c"] = engine.submit(Request(c_prompt, 20, Sampling(1.3, top_p=0.9, seed=3), ignore_eos=True))

    a_tokens: list[int] = []
    a = engine.generate([Request(a_prompt, 40, ignore_eos=True, on_token=on_a)])[0]
    b, c = joined["b"].result(60), joined["c"].result(60)
    assert a.token_ids == reference(a_prompt, 40)
    assert b.token_ids == reference(b_prompt, 8) and len(c.token_ids) == 20
    assert steps_at["b"] <= steps_at["join"] + 1  # B's first step was the next one, not after A
    assert engine.stats["max_batch"] >= 3


def test_joins_are_gathered_until_enough_requests_wait(tiny_model):  # noqa: F811
    """JoinPolicy(min_rows=3): two requests sent while A decodes wait until A has ended (no row decoding:
    they join at once), three join at the next step."""
    from kaiyuan_recipes.serve.batch_decoder import Envelope
    from kaiyuan_recipes.serve.engine import GenerationEngine, JoinPolicy, Request

    engine = GenerationEngine(tiny_model, "cpu", Envelope(max_batch=8, max_seq_len=256, capture=False),
                              join=JoinPolicy(min_rows=3, max_wait_s=3600))
    prompt = engine.encode("Hello world, this is a test")[:4]
    for count, joins_early in ((2, False), (3, True)):
        first_steps: list[int] = []
        late: list = []
        seen: list[int] = []

        def on_a(token):
            seen.append(token)
            if len(seen) == 30:
                a_end.append(engine.stats["steps"])  # the step of A's last token
            if len(seen) == 5:
                late.extend(engine.submit(Request(prompt, 3, ignore_eos=True, on_token=lambda t: first_steps.append(
                    engine.stats["steps"]))) for _ in range(count))

        a_end: list[int] = []
        engine.generate([Request(prompt, 30, ignore_eos=True, on_token=on_a)])
        [f.result(60) for f in late]
        assert (min(first_steps) < a_end[0]) == joins_early, (a_end, first_steps)
    engine.close()


def test_a_small_call_behind_a_large_one_is_answered_at_the_next_step(tiny_model, reference):  # noqa: F811
    """A call of 12 choices takes every row (4); a 1-token call sent at its first token is answered at the next
    admission, one decode step later, while none of the large call's rows has ended (without giving way it waited
    the whole 40-token wave). The row that gave way (the seeded one: the cheapest to prefill again) resumes where
    it stopped: it draws the tokens it draws alone, and the greedy rows stay generate()'s."""
    from kaiyuan_recipes.serve.batch_decoder import Envelope
    from kaiyuan_recipes.serve.engine import GenerationEngine, JoinPolicy, Request, Sampling

    engine = GenerationEngine(tiny_model, "cpu", Envelope(max_batch=4, max_seq_len=256, capture=False),
                              join=JoinPolicy(min_rows=1))
    prompt, short = engine.encode("Hello world, this is a test")[:5], engine.encode("The quick brown fox")[:3]
    seeded = Request(short, 40, Sampling(1.1, top_k=50, seed=7), ignore_eos=True)
    alone = engine.generate([seeded])[0].token_ids
    large: list = []
    small: dict = {}

    def on_large(token: int) -> None:
        if "future" not in small:  # the large call's first token: every row is taken
            small["sent_at_step"] = engine.stats["steps"]
            small["future"] = engine.submit(Request(short, 1))
            small["future"].add_done_callback(lambda _: small.update(
                answered_at_step=engine.stats["steps"], large_done=sum(f.done() for f in large)))

    large += engine.submit_all([Request(short, 40, Sampling(1.1, top_k=50, seed=7), ignore_eos=True,
                                        on_token=on_large)]
                               + [Request(prompt, 40, ignore_eos=True, on_token=on_large) for _ in range(11)])
    done = [f.result(120) for f in large]
    assert small["future"].result(60).token_ids == reference(short, 1)
    assert small["answered_at_step"] - small["sent_at_step"] <= 1 and small["large_done"] == 0, small
    assert engine.stats["gave_way"] == 1
    assert done[0].token_ids == alone
    assert all(c.token_ids == reference(prompt, 40) for c in done[1:])
    engine.close()


def test_rows_give_way_from_the_call_holding_most_never_its_last():
    from kaiyuan_recipes.serve.admission import rows_to_give_up

    assert rows_to_give_up({1: [0, 1, 2], 2: [3]}, 1) == [0]
    assert rows_to_give_up({1: [0, 1, 2], 2: [3, 4]}, 3) == [0, 1, 3]  # the largest each time, then no more
    assert rows_to_give_up({1: [0], 2: [1]}, 2) == []  # a call's last row stays
    assert rows_to_give_up({}, 1) == []


def test_requests_submitted_together_join_at_the_same_step(engine, monkeypatch):
    """submit_all (one HTTP request's prompts, generate()): the worker admits them in one go, however slowly
    they are queued (each put here takes 50 ms, time enough for the worker to take the first alone), so the
    batch's composition, and with it every row's numerics, repeats run after run."""
    from kaiyuan_recipes.serve.engine import Request

    put = engine._queue.put
    monkeypatch.setattr(engine._queue, "put", lambda item: (put(item), time.sleep(0.05)))
    for attempt in range(3):
        first_step: dict[int, int] = {}
        requests = [Request(engine.encode(f"prompt {i} of attempt {attempt}")[: 2 + i], 4, ignore_eos=True,
                            on_token=lambda t, i=i: first_step.setdefault(i, engine.stats["steps"]))
                    for i in range(6)]
        engine.generate(requests)
        assert len(set(first_step.values())) == 1, first_step


def test_a_request_of_several_prompts_is_queued_whole_or_not_at_all(engine):
    from kaiyuan_recipes.serve.engine import Request

    fits, too_long = Request([1, 2, 3], 4), Request([1] * 250, 10)
    with pytest.raises(ValueError, match="exceeds the served 256 positions"):
        engine.submit_all([fits, too_long])
    assert not fits.future.done() and not fits.future.running() and engine._queue.qsize() == 0


def test_each_row_samples_with_its_own_settings_and_seed(engine, reference):
    """Rows of different settings in one batch (no grouping): a seeded row's tokens are the same alone and
    alongside greedy rows, other temperatures / top-k / top-p, and other seeds; greedy rows stay generate()'s;
    the batch took as many steps as its longest row, not one pass per setting."""
    from kaiyuan_recipes.serve.engine import Request, Sampling

    prompt = engine.encode("The quick brown fox")
    seeded = Sampling(1.2, top_k=40, seed=1234)
    alone = engine.generate([Request(prompt, 16, seeded, ignore_eos=True)])[0].token_ids
    before = dict(engine.stats)
    mixed = engine.generate([Request(prompt, 16, seeded, ignore_eos=True),
                             Request(prompt, 16, ignore_eos=True),
                             Request(prompt, 16, Sampling(0.7, top_p=0.5, seed=1), ignore_eos=True),
                             Request(prompt, 16, Sampling(1.5, seed=99), ignore_eos=True),
                             Request(prompt, 16, Sampling(1.0), ignore_eos=True),
                             Request(prompt, 16, seeded, ignore_eos=True)])
    assert engine.stats["steps"] - before["steps"] == 15  # the prefill gives each row its first token
    assert engine.stats["decode_s"] > before["decode_s"] and engine.stats["prefill_s"] > before["prefill_s"]
    tokens = [c.token_ids for c in mixed]
    assert tokens[0] == alone == tokens[5]
    assert tokens[1] == reference(prompt, 16)
    assert len({tuple(t) for t in tokens}) >= 4  # the other settings and seeds drew other tokens


def test_more_requests_than_rows_queue_and_every_one_finishes(engine, reference):
    from kaiyuan_recipes.serve.engine import Request

    prompts = [engine.encode(f"request number {i} says")[: 3 + i % 4] for i in range(20)]
    got = engine.generate([Request(p, 6 + i % 5, ignore_eos=True) for i, p in enumerate(prompts)])
    assert [c.token_ids for c in got] == [reference(p, 6 + i % 5) for i, p in enumerate(prompts)]
    assert engine.stats["rows"] == 0 and engine.stats["max_batch"] <= 8


def test_a_compiled_step_compiles_at_warm_up_only_and_keeps_greedy_rows_equal_to_generate(tiny_model, reference):  # noqa: F811
    """--decode-mode compiled without its CUDA graphs (the CPU): warm-up runs every bucket's step, so the
    compilation happens there, once; a load over other batch sizes and cache lengths compiles nothing, and its
    greedy rows still equal generate() in fp32."""
    from kaiyuan_recipes.serve.batch_decoder import Envelope
    from kaiyuan_recipes.serve.engine import GenerationEngine, Request, Sampling

    torch._dynamo.reset()  # a compiled layer of the same shape from another test would serve this engine
    torch._dynamo.utils.counters.clear()
    engine = GenerationEngine(tiny_model, "cpu", Envelope(max_batch=8, max_seq_len=256, capture=False, compile=True))
    assert engine.ready.wait(600) and engine.failure is None
    # one compilation for every bucket: batch 2 is not specialised with the model's 2 KV heads, nor the
    # full-length window (256) apart from the shorter ones
    assert engine.envelope.batch_buckets == (2, 4, 8) and engine.envelope.length_buckets == (256,)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert engine.decoder.mode == "compiled, not captured"
    torch._dynamo.utils.counters.clear()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 5000, (int(n),), generator=gen).tolist()
               for n in torch.randint(3, 200, (11,), generator=gen)]
    lengths = [1 + (i * 23) % 50 for i in range(len(prompts))]
    done = engine.generate([Request(p, n, Sampling() if i % 2 else Sampling(0.8, top_p=0.9, seed=i), ignore_eos=True)
                            for i, (p, n) in enumerate(zip(prompts, lengths))])
    engine.close()
    assert not torch._dynamo.utils.counters["stats"], dict(torch._dynamo.utils.counters["stats"])
    assert engine.stats["max_batch"] == 8
    for i, (prompt, n, completion) in enumerate(zip(prompts, lengths, done)):
        assert len(completion.token_ids) == n
        if i % 2:
            assert completion.token_ids == reference(prompt, n)


def test_a_compiled_step_compiles_one_decoder_layer_for_all_and_prefills_compile_nothing():
    """Regional compilation: the step's warm-up compiles exactly what it compiles for a model of one layer
    (one graph, the layer's; no recompilation per layer for its cache index); a prefill after it, of a new
    prompt length, runs the layers eagerly (nothing compiles on the request path), and the steps' greedy
    rows are generate()'s."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from kaiyuan_recipes.serve.batch_decoder import BatchDecoder, Envelope

    def warmed_up(layers: int) -> tuple[BatchDecoder, dict]:
        torch.manual_seed(0)
        config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                             tie_word_embeddings=False, eos_token_id=0, pad_token_id=0)
        decoder = BatchDecoder(Qwen3ForCausalLM(config).eval(), Envelope(4, 64, capture=False, compile=True), "cpu")
        torch._dynamo.reset()  # each its own compilation (the compiled layer of another test would serve these)
        torch._dynamo.utils.counters.clear()
        decoder.warm_up()
        # what Dynamo compiled (not how: inductor's and AOTAutograd's counters tell on-disk cache hits too)
        return decoder, {k: dict(torch._dynamo.utils.counters[k]) for k in ("frames", "stats")}

    _, one = warmed_up(1)
    decoder, three = warmed_up(3)
    assert [index for index, _ in decoder._layers] == [0, 1, 2]
    assert decoder.compiled == "one Qwen3DecoderLayer for its 3 layers" and decoder.mode == "compiled, not captured"
    assert three == one and one["stats"]["unique_graphs"] == 1, (one, three)
    hooked = decoder._layers[1][1]
    hooked.forward = hook = functools.partial(type(hooked).forward, hooked)  # an instance forward (e.g. a hook's)
    decoder.step(2, 8, "greedy")
    assert hooked.__dict__["forward"] is hook and "forward" not in decoder._layers[0][1].__dict__
    torch._dynamo.utils.counters.clear()
    prompt = [5, 7, 9, 11, 13]
    first = decoder.prefill([0, 1], [prompt, prompt[::-1]], [(True, 1.0, 0, 1.0, 0)] * 2)
    assert not any(torch._dynamo.utils.counters.values()), dict(torch._dynamo.utils.counters)
    tokens = [first.tolist()] + [decoder.step(2, len(prompt) + n, "greedy").tolist() for n in range(1, 8)]
    assert not any(torch._dynamo.utils.counters.values()), dict(torch._dynamo.utils.counters)
    for row, p in enumerate((prompt, prompt[::-1])):
        reference = decoder.model.generate(torch.tensor([p]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
        assert [t[row] for t in tokens] == reference[0, len(p):].tolist()


def test_the_envelope_buckets_and_bounds_requests(engine):
    from kaiyuan_recipes.serve.batch_decoder import Envelope, bucket_for
    from kaiyuan_recipes.serve.engine import Request

    env = Envelope(max_batch=48, max_seq_len=3000)
    assert env.batch_buckets == (1, 2, 4, 8, 16, 32, 48)
    assert env.length_buckets == (256, 512, 1024, 2048, 3000)
    assert bucket_for(env.length_buckets, 257) == 512 and bucket_for(env.batch_buckets, 33) == 48
    assert Envelope(max_batch=1, max_seq_len=100).length_buckets == (100,)
    with pytest.raises(ValueError, match="max_batch >= 1"):
        Envelope(max_batch=0)
    with pytest.raises(ValueError, match="exceeds the served 256 positions"):
        engine.submit(Request([1] * 200, 57))


@pytest.mark.parametrize("settings", [[(0.7, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.8), (0.9, 7, 0.6), (1.0, 0, 1e-4),
                                       (2.0, 1000, 1.0)]])
def test_per_row_filtering_is_transformers_warpers_row_by_row(settings):
    """One batch, each row its own (temperature, top-k, top-p): each row's filtered logits are exactly what
    transformers' warpers leave for that row alone, in generate()'s order."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from kaiyuan_recipes.serve.sampling import filtered

    torch.manual_seed(0)
    logits = torch.randn(len(settings), 64) * 3
    temperature, top_k, top_p = (torch.tensor(v) for v in zip(*settings))
    ours = filtered(logits, temperature.float(), top_k, top_p.float())
    for row, (t, k, p) in enumerate(settings):
        theirs = TemperatureLogitsWarper(t)(None, logits[row: row + 1].clone())
        if 0 < k < 64:
            theirs = TopKLogitsWarper(k)(None, theirs)
        if p < 1:
            theirs = TopPLogitsWarper(p)(None, theirs)
        mine = ours[row: row + 1]
        assert torch.equal(torch.isinf(mine), torch.isinf(theirs)), row
        torch.testing.assert_close(mine[~torch.isinf(mine)], theirs[~torch.isinf(theirs)])


def test_per_row_draws_follow_the_filtered_distribution_and_repeat_with_the_key():
    from kaiyuan_recipes.serve.sampling import RowSettings, next_tokens

    rows = 20000
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(rows, 3)
    for top_k, top_p, expected in ((0, 1.0, [0.7, 0.2, 0.1]), (2, 1.0, [0.7 / 0.9, 0.2 / 0.9, 0]),
                                   (0, 0.75, [0.7 / 0.9, 0.2 / 0.9, 0])):
        settings = RowSettings(torch.zeros(rows, dtype=torch.bool), torch.ones(rows), torch.full((rows,), top_k),
                               torch.full((rows,), top_p), torch.arange(rows), torch.zeros(rows, dtype=torch.long))
        drawn = next_tokens(logits, settings)
        counts = torch.bincount(drawn, minlength=3).float() / rows
        torch.testing.assert_close(counts, torch.tensor(expected), atol=0.015, rtol=0)
        assert torch.equal(next_tokens(logits, settings), drawn)  # the same keys and steps: the same draws
        settings.step += 1
        assert not torch.equal(next_tokens(logits, settings), drawn)  # the next step: other draws
        settings.greedy[:] = True
        assert set(next_tokens(logits, settings).tolist()) == {0}


def test_health_is_a_503_until_warm_up_is_done_and_queued_requests_wait_for_it(tiny_model, monkeypatch):  # noqa: F811
    from fastapi.testclient import TestClient

    from kaiyuan_recipes.serve.app import create_app
    from kaiyuan_recipes.serve.batch_decoder import BatchDecoder
    from kaiyuan_recipes.serve.engine import GenerationEngine

    release = threading.Event()
    warm_up = BatchDecoder.warm_up

    def held(self):
        assert release.wait(60)
        return warm_up(self)

    monkeypatch.setattr(BatchDecoder, "warm_up", held)
    engine = GenerationEngine(tiny_model, "cpu")
    with TestClient(create_app(engine)) as c:
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "warming_up" and r.json()["warmup"] is None
        answer: dict = {}
        early = threading.Thread(target=lambda: answer.update(r=c.post("/v1/completions", json={
            "prompt": "Hello", "max_tokens": 3, "temperature": 0})))
        early.start()
        time.sleep(0.3)
        assert "r" not in answer  # queued behind the warm-up, not refused
        release.set()
        early.join(60)
        assert answer["r"].status_code == 200 and answer["r"].json()["usage"]["completion_tokens"] == 3
        ready = c.get("/health").json()
        assert ready["status"] == "ok" and ready["warmup"]["seconds"] > 0 and ready["warmup"]["cache_bytes"] > 0


def test_sigterm_lets_in_flight_requests_finish_refuses_new_ones_and_exits(tiny_model):  # noqa: F811
    body = {"prompt": "The quick brown fox", "max_tokens": 100, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with server_process(tiny_model, "--api-token-env", "KAIYUAN_TEST_TOKEN", "--max-batch", "1",
                        "--drain-timeout-s", "60", env={"KAIYUAN_TEST_TOKEN": TOKEN}) as (url, proc):
        with httpx.stream("POST", url + "/v1/completions", json=body | {"n": 2}, headers=AUTH, timeout=60) as s:
            lines = s.iter_lines()
            next(lines)  # the first event: decoding has begun (2 rows, one after the other: max-batch 1)
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            deadline = t0 + 10
            while True:  # new connections are refused soon after the signal
                try:
                    httpx.get(url + "/health", timeout=1)
                except httpx.TransportError:
                    break
                assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
                time.sleep(0.05)
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert proc.wait(65) == -signal.SIGTERM  # after its graceful shutdown uvicorn re-raises the signal
        assert time.monotonic() - t0 < 60 + 5  # the stated bound: --drain-timeout-s plus 5 s
    assert not any("error" in e for e in events)
    assert events[-1]["usage"]["completion_tokens"] == 200  # every row finished after the signal: 2 x 100


def test_the_server_log_says_when_it_is_warmed_up_and_health_how_it_decodes(tiny_model):  # noqa: F811
    """`kaiyuan serve` quiets upstream loggers to warnings; the engine's warm-up line still reaches the log."""
    with server_process(tiny_model, "--max-batch", "2") as (url, proc):
        envelope = httpx.get(url + "/health").json()["envelope"]
    assert envelope == {"max_batch": 2, "max_seq_len": 256, "decode_mode": "eager"}  # the CPU default
    assert re.search(r"warm-up: [0-9.]+ s, 0 CUDA graphs, KV cache [0-9.]+ GiB", proc.output), proc.output


def test_sigterm_fails_what_is_left_after_the_drain_timeout(tiny_model):  # noqa: F811
    """--drain-timeout-s 1 and more work than that: the stream ends with a 503 error event, a request that
    waited in the queue is a 503, and the process exits within the timeout plus its stated 5 s."""
    long = {"prompt": "The quick brown fox", "max_tokens": 240, "temperature": 0}
    with server_process(tiny_model, "--max-batch", "1", "--drain-timeout-s", "1") as (url, proc):
        result: dict = {}

        def plain() -> None:
            result["r"] = httpx.post(url + "/v1/completions", json=long | {"n": 20}, timeout=60)

        with httpx.stream("POST", url + "/v1/completions", json=long | {"stream": True, "n": 20}, timeout=60) as s:
            lines = s.iter_lines()
            next(lines)
            waiting = threading.Thread(target=plain)
            waiting.start()
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        waiting.join(30)
        assert proc.wait(30) == -signal.SIGTERM  # after its graceful shutdown uvicorn re-raises the signal
        assert time.monotonic() - t0 < 1 + 5 + 2
    assert events[-1]["error"]["type"] == "server_error" and "shut down" in events[-1]["error"]["message"]
    assert result["r"].status_code == 503 and result["r"].json()["error"]["code"] == "shutting_down"


@pytest.mark.parametrize("args, message", [
    (["--decode-mode", "graph"], "--decode-mode graph needs a CUDA device"),
    (["--decode-mode", "compiled"], "--decode-mode compiled needs a CUDA device"),
    (["--max-seq-len", "1000"], "--max-seq-len 1000: the model has 256 positions"),
])
def test_an_envelope_the_model_or_host_cannot_serve_is_refused_at_start(tiny_model, args, message):  # noqa: F811
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "serve", str(tiny_model), "--device",
                           "cpu", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]


def test_a_stream_that_lags_takes_every_new_token_at_once(engine, reference):
    """A stream whose consumer is slower than the decoder gets the text of every token since its last turn in
    one event (not one event-loop callback and one event per token), and its text is still the greedy
    completion's."""
    from kaiyuan_recipes.serve.openai.protocol import CompletionRequest
    from kaiyuan_recipes.serve.openai.serving import prepare, requests_for, start_stream, stream
    from kaiyuan_recipes.serve.stops import Detokenizer

    body = CompletionRequest(prompt="The quick brown fox", max_tokens=200, temperature=0, stream=True)
    prompts = prepare(engine, body, 256)
    requests = requests_for(body, prompts)
    for req in requests:
        req.ignore_eos = True

    async def consume() -> list[dict]:
        events = []
        async for line in stream(engine, body, prompts, start_stream(engine, requests), "cmpl-test", 0, "tiny"):
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                await asyncio.sleep(0.05)  # the consumer lags: tokens pile up meanwhile
        return events

    events = asyncio.run(consume())
    expected = reference(prompts[0].ids, 200)
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == engine.decode(expected)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    detokenizer = Detokenizer(engine.decode)
    visible = sum(bool(detokenizer.add(t)) for t in expected)  # tokens completing some text: uncoalesced, an event each
    assert len(events) < visible / 2, (len(events), visible)


def test_without_repeated_decoder_layers_the_step_is_not_compiled(monkeypatch, caplog):
    """A model whose decoder layers are not found (decoder_layers() None) is not compiled whole, which would take
    minutes at start-up: its step runs as in graph mode, and the log says so."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from kaiyuan_recipes.serve import batch_decoder
    from kaiyuan_recipes.serve.batch_decoder import BatchDecoder, Envelope

    config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    model = Qwen3ForCausalLM(config).eval()
    assert batch_decoder.decoder_layers(model)  # the control: found without the patch
    monkeypatch.setattr(batch_decoder, "decoder_layers", lambda m: None)
    with caplog.at_level("WARNING", logger="kaiyuan_recipes.serve.batch_decoder"):
        decoder = BatchDecoder(model, Envelope(4, 64, capture=False, compile=True), "cpu")
    assert decoder.compiled == "nothing" and decoder.mode == "eager"
    assert "no repeated decoder layers found" in caplog.text


def test_two_engines_in_one_process_warm_up_one_at_a_time(tiny_model, monkeypatch):  # noqa: F811
    """Another thread's device work during a CUDA graph capture invalidates it (seen on the H200 when a benchmark
    warmed two engines at once): warm-ups in one process do not overlap."""
    from kaiyuan_recipes.serve.batch_decoder import BatchDecoder, Envelope
    from kaiyuan_recipes.serve.engine import GenerationEngine

    spans, inner, both = [], BatchDecoder._warm_up, threading.Event()

    def timed(self):
        start = time.monotonic()
        assert both.wait(60)  # until both engines exist: without the lock both warm-ups are under way by then
        time.sleep(0.3)
        try:
            return inner(self)
        finally:
            spans.append((start, time.monotonic()))

    monkeypatch.setattr(BatchDecoder, "_warm_up", timed)
    engines = [GenerationEngine(tiny_model, "cpu", Envelope(max_batch=2, max_seq_len=64, capture=False))
               for _ in range(2)]
    both.set()
    try:
        assert all(e.ready.wait(60) for e in engines)
    finally:
        for e in engines:
            e.close()
    (a_start, a_end), (b_start, b_end) = sorted(spans)
    assert b_start >= a_end, spans


@pytest.mark.parametrize("family, window, refused", [
    ("mistral", 16, True), ("mistral", 62, True), ("mistral", 63, False), ("mistral", None, False),
    ("mistral_full_layer_types", 16, True), ("phi3", 16, True), ("llama_stray_key", 16, False),
    ("qwen3", 16, False), ("qwen3_sliding", 16, True)])
def test_a_sliding_window_the_decoder_would_not_apply_is_refused(family, window, refused):
    """The decoder passes its own masks, so a window that a model's attention applies through its mask (every
    layer of Mistral's or Phi-3's, the sliding layers of a config with layer_types) would be ignored beyond
    `window` positions. A model whose modeling ignores the key (Llama's), or a config that turns the window off
    (Qwen3's use_sliding_window=False), is served. Envelope: 64 positions, so a window of 63 is the whole sequence."""
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Phi3Config, Qwen3Config

    from kaiyuan_recipes.serve.batch_decoder import BatchDecoder, Envelope

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128)
    config = {
        "mistral": lambda: MistralConfig(sliding_window=window, head_dim=8, **small),
        "mistral_full_layer_types": lambda: MistralConfig(sliding_window=window, head_dim=8,
                                                          layer_types=["full_attention"] * 2, **small),
        "phi3": lambda: Phi3Config(sliding_window=window, pad_token_id=0, **small),
        "llama_stray_key": lambda: LlamaConfig(sliding_window=window, head_dim=8, **small),
        "qwen3": lambda: Qwen3Config(use_sliding_window=False, sliding_window=window, head_dim=8, **small),
        "qwen3_sliding": lambda: Qwen3Config(use_sliding_window=True, sliding_window=window, max_window_layers=1,
                                             head_dim=8, **small),
    }[family]()
    model = AutoModelForCausalLM.from_config(config)
    envelope = Envelope(max_batch=2, max_seq_len=64, capture=False)
    if refused:
        with pytest.raises(ValueError, match="sliding"):
            BatchDecoder(model, envelope, "cpu")
    else:
        BatchDecoder(model, envelope, "cpu")
