"""`kaiyuan serve` under load and hostile clients, for real (uvicorn over HTTP, the tiny model on the CPU): a
shutdown during echo/logprobs scoring answers the JSON 503 and exits within --drain-timeout-s + 5 s; a plain
(non-streamed) request whose client left is cancelled as a stream is; the engine holds a bounded number of
requests (a 429 past it); one call of many long choices does not keep a later 1-token call waiting for one of its
rows to end; scoring holds one chunk of logits, not the whole sequence's; a connection that sends part of a request
head, or nothing, is closed; stop strings cost the same whatever their length."""

import json
import os
import signal
import socket
import threading
import time

import httpx
import openai
import pytest
import torch
from test_serve import server_process, tiny_model  # noqa: F401  (fixture)

VOCAB = 151936
SCORE_CHUNK = 256  # scoring.SCORE_CHUNK: positions per scoring forward


@pytest.fixture(scope="module")
def long_model(tiny_model, tmp_path_factory):  # noqa: F811
    """The tiny model with 4096 positions (a rotary model: the weights do not depend on it)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(str(tiny_model))
    config.max_position_embeddings = 4096
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), config=config, dtype=torch.float32)
    out = tmp_path_factory.mktemp("long") / "hf"
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(tiny_model)).save_pretrained(out)
    return out


def health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=10).json()


def wait_for(url: str, ready, seconds: float = 120) -> dict:
    """/health once ready(health) holds (polled; a failure if it never does)."""
    deadline = time.monotonic() + seconds
    while not ready(stats := health(url)):
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    return stats


def in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["r"] = fn()
        except Exception as err:  # noqa: BLE001  (reported by the test)
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_sigterm_during_scoring_answers_the_json_503_within_the_stated_time(tiny_model):  # noqa: F811
    """32 echoed 250-token prompts with logprobs (lm-eval's loglikelihood requests): SIGTERM once they are all
    admitted, while they are being scored. Scoring a chunk at a time, the engine sees the deadline: the client
    gets the JSON 503, and the process exits within --drain-timeout-s + 5 s."""
    prompts = [[(i * 7919 + j * 31) % 150000 for j in range(250)] for i in range(32)]
    body = {"prompt": prompts, "max_tokens": 1, "echo": True, "logprobs": 5, "temperature": 0}
    with server_process(tiny_model, "--drain-timeout-s", "1") as (url, proc):
        thread, out = in_thread(lambda: httpx.post(url + "/v1/completions", json=body, timeout=120))
        wait_for(url, lambda h: h["requests"] >= 32)  # all prefilled: scoring now
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        thread.join(60)
        assert proc.wait(60) == -signal.SIGTERM
        assert time.monotonic() - t0 < 1 + 5 + 2  # the stated bound (+ 2 s for the process's own exit)
    r = out["r"]
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", r.text[:200]
    assert r.json()["error"]["code"] == "shutting_down"


def test_a_plain_request_whose_client_left_is_cancelled(tiny_model):  # noqa: F811
    """As a stream's: its row ends at the next step (the engine's `cancelled` counter), long before its tokens;
    the abandoned wait for its completions leaves nothing unretrieved in the log."""
    with server_process(tiny_model) as (url, proc):
        before = health(url)
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps({"prompt": "The quick brown fox", "max_tokens": 230, "temperature": 0}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_for(url, lambda h: h["tokens"] > before["tokens"])  # decoding: then the client goes away
        stats = wait_for(url, lambda h: h["cancelled"] > before["cancelled"], 10)
        assert stats["tokens"] - before["tokens"] < 200
        # another answer: the event loop has run what the cancelled request's end scheduled
        assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=30).status_code == 200
    assert "never retrieved" not in proc.output and "Traceback" not in proc.output, proc.output


def test_part_of_a_request_head_or_nothing_does_not_hold_a_connection(tiny_model):  # noqa: F811
    """--header-timeout-s 1: a connection that sent half a head, or nothing, is closed; one idle after an answer
    closes after --idle-timeout-s 1; a head sent slowly but within the time is answered."""
    with server_process(tiny_model, "--header-timeout-s", "1", "--idle-timeout-s", "1") as (url, _proc):
        check_connections_are_closed(int(url.rsplit(":", 1)[1]))


def check_connections_are_closed(port: int) -> None:
    for sent in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", b""):
        with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
            sock.sendall(sent)
            assert sock.recv(65536) == b""  # closed by the server (a timeout would raise)
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.3)
        sock.sendall(b"Host: x\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200")
        assert sock.recv(65536) == b""  # kept alive, then closed when idle


def event_loop_cpu_s(pid: int) -> float:
    """CPU seconds the server's main thread (uvicorn's event loop) has used: its own work, whatever the load of
    the host, where wall time would measure the host."""
    fields = open(f"/proc/{pid}/task/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_stop_strings_cost_the_event_loop_the_same_whatever_their_length(long_model):
    """16 stop strings of 2,000 characters that never occur, over 4 streamed choices of 300 tokens: the same text
    as without them, for about the same event-loop CPU time (matching reads each new character once, where
    checking the text's end against every prefix of every stop string costs text x stop length per token)."""
    body = {"prompt": "The quick brown fox", "max_tokens": 300, "temperature": 0, "n": 4, "stream": True}
    stops = [chr(0x4E00 + i) * 2000 for i in range(16)]

    def streamed(url: str, pid: int, extra: dict) -> tuple[float, list[str]]:
        texts = [""] * 4
        before = event_loop_cpu_s(pid)
        with httpx.stream("POST", url + "/v1/completions", json=body | extra, timeout=600) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        texts[choice["index"]] += choice["text"]
        return event_loop_cpu_s(pid) - before, texts

    with server_process(long_model, "--max-batch", "4") as (url, proc):
        plain_s, plain = streamed(url, proc.pid, {})
        stopped_s, stopped = streamed(url, proc.pid, {"stop": stops})
    assert stopped == plain and min(map(len, plain)) > 600, [len(t) for t in plain]
    assert stopped_s < 2 * plain_s + 0.5, (stopped_s, plain_s)


def test_scoring_holds_one_chunk_of_logits_not_the_sequences(long_model):
    """An echoed 1,500-token prompt with logprobs: the server's peak memory grows by about one chunk's logits (and
    their log_softmax), not by the whole sequence's (1,500 x the vocabulary x 4 bytes, thrice over)."""
    prompt = [(j * 7919) % 150000 for j in range(1500)]
    with server_process(long_model, "--max-batch", "2") as (url, proc):
        def peak() -> int:
            status = open(f"/proc/{proc.pid}/status").read()
            return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) * 1024

        warm = httpx.post(url + "/v1/completions", json={"prompt": prompt[:20], "max_tokens": 1, "echo": True,
                                                          "logprobs": 1}, timeout=600)
        assert warm.status_code == 200
        before = peak()
        r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 1,
                                                      "temperature": 0}, timeout=600)
        grown = peak() - before
    assert r.status_code == 200 and len(r.json()["choices"][0]["logprobs"]["token_logprobs"]) == 1501
    chunk = 3 * SCORE_CHUNK * VOCAB * 4  # logits, their fp32 log_softmax and its floor, one chunk's worth
    assert grown < chunk + (256 << 20), grown / 2**20


def test_a_full_engine_is_a_429_streamed_or_not_and_serves_again_once_emptied(tiny_model):  # noqa: F811
    """--max-batch 1 --max-queue 2: one decoding request and a waiting call of 2 fill it; a further call is a 429
    with OpenAI's error body (streamed too: before its stream begins) and Retry-After, and nothing of it runs."""
    long = {"prompt": "The quick brown fox", "max_tokens": 240, "temperature": 0}
    with server_process(tiny_model, "--max-batch", "1", "--max-queue", "2") as (url, _proc):
        with httpx.stream("POST", url + "/v1/completions", json=long | {"stream": True}, timeout=120) as s:
            lines = s.iter_lines()
            next(lines)
            waiting, out = in_thread(lambda: httpx.post(url + "/v1/completions",
                                                        json={"prompt": "hi", "max_tokens": 3, "n": 2}, timeout=120))
            stats = wait_for(url, lambda h: h["unfinished"] == 3)
            assert stats["max_unfinished"] == 3
            for extra in ({}, {"stream": True}):
                r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1} | extra, timeout=30)
                assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
                assert r.headers["retry-after"] == "1" and r.headers["content-type"] == "application/json"
            m = httpx.put(url + "/api", json={"prompts": ["x"], "tokens_to_generate": 1}, timeout=30)
            assert m.status_code == 429, m.text
        waiting.join(120)  # the stream's client left: its row freed, the waiting call decodes
        assert out["r"].status_code == 200
        assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=30).status_code == 200


def test_one_large_call_does_not_starve_a_small_one(tiny_model):  # noqa: F811
    """An outside test's case: n=128 choices of 255 tokens with logprobs, then a 1-token request. Every row is the
    large call's, so one of them gives way: the small request is answered while the large call's first wave of rows
    is still decoding (only 8 + 1 requests ever admitted), not once one of its rows has ended, and the large call,
    16 rounds of rows and 128 scorings from its end, is still unanswered."""
    # --max-batch 8: rounds of 8 rows (a CPU); the large call is cut off at the end (--drain-timeout-s 1)
    with server_process(tiny_model, "--max-batch", "8", "--join-min-rows", "1", "--drain-timeout-s", "1") as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        large, out = in_thread(lambda: httpx.post(url + "/v1/completions", json={
            "prompt": [9707], "max_tokens": 255, "n": 128, "logprobs": 1, "temperature": 0}, timeout=600))
        wait_for(url, lambda h: h["requests"] >= 8)  # the large call holds every row
        small = client.completions.create(model="kaiyuan", prompt="Hello", max_tokens=1, temperature=0)
        assert small.usage.completion_tokens == 1
        stats = health(url)
        assert stats["requests"] == 9 and stats["gave_way"] == 1, stats  # its first wave still decodes
        assert large.is_alive() and not out, out  # still decoding or scoring its own


def test_the_stop_matcher_agrees_with_searching_the_whole_text():
    """Fed piece by piece, the matcher finds where find_stop finds the first stop string in the text so far, and
    holds back exactly the longest end of the text that begins a stop string (what a stream must not send)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from kaiyuan_recipes.serve.stops import StopMatcher, find_stop

    def longest_start(text: str, stops: tuple[str, ...]) -> int:
        return max((k for s in stops for k in range(1, min(len(s) - 1, len(text)) + 1) if text.endswith(s[:k])),
                   default=0)

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.text("abc", max_size=6), max_size=12), st.lists(st.text("abc", min_size=1, max_size=5),
                                                                       min_size=1, max_size=4))
    def check(pieces: list[str], stops: list[str]) -> None:
        matcher, text = StopMatcher(tuple(stops)), ""
        for piece in pieces:
            text += piece
            found = matcher.feed(piece)
            assert found == find_stop(text, stops)
            if found is not None:
                return
            assert matcher.held_back() == longest_start(text, tuple(stops))

    check()
