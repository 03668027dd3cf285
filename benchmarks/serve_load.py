"""Load on a real `kaiyuan serve`, against today's server as the baseline in the same run: each side is a
server process this script starts (this checkout's code, or --baseline-src's: a directory holding an older
copy of the repository, e.g. a `git archive` of main), driven over HTTP by the `openai`
package's async client: --clients concurrent clients, each sending --requests-per-client requests one after
the other, prompts of --prompt-len tokens (token-id prompts), --new-tokens new tokens, a third greedy, a
third sampled (temperature 0.8, top-p 0.95), a third streamed (greedy and sampled in turn). Per side: time
to ready, latency p50 / p95 / max, time to first token (streamed: the first text; otherwise the whole
answer), aggregate new tokens/s, errors, the server's GPU memory, batch-1 decode tokens/s (one streamed
greedy request alone), and the exit time after SIGTERM. Then the ratios ours / baseline.

usage: python benchmarks/serve_load.py --random-qwen3 DIR --baseline-src OLD --out benchmarks/results/X.json
       (HF_DIR instead of --random-qwen3: an exported model; --sides ours: one side only; --baseline-json /
       --ours-json: that side from an earlier run's JSON, e.g. to keep each run under a time limit)"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance, this_command, write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLED = dict(temperature=0.8, top_p=0.95)
SERVER_COUNTERS = ("requests", "steps", "tokens", "decode_s", "prefills", "prefill_s")
TARGETS = {"errors": 0, "p95_latency_s_at_most": 3.0, "tokens_per_s_at_least": 5000,
           "batch_1_tokens_per_s_at_least": 300}


@dataclass
class Outcome:
    kind: str  # greedy, sampled, streamed
    latency_s: float = 0.0
    first_token_s: float | None = None
    tokens: int = 0
    error: str | None = None


@dataclass
class Side:
    name: str
    source: str
    start_s: float = 0.0
    health: dict = field(default_factory=dict)
    load: dict = field(default_factory=dict)
    batch_1: dict = field(default_factory=dict)
    gpu_memory_mib: int | None = None
    exit_s: float | None = None
    exit_code: int | None = None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def gpu_memory_mib(pid: int) -> int | None:
    """The GPU memory nvidia-smi reports for the server process (None without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = [int(mem) for line in out.splitlines() if line.strip()
            for p, mem in [line.split(",")] if int(p) == pid]
    return sum(used) if used else None


def start_server(source: Path, model: Path, port: int, args: list[str], log: Path,
                 timeout_s: float) -> tuple[subprocess.Popen, float, dict]:
    """`kaiyuan serve` from `source`'s code (run in `source`, which `python -m` puts first on the path, and first
    on PYTHONPATH), ready when /health is a 200."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # (the wheels' site)
    # a copy from before the server moved into kaiyuan_recipes/serve/ keeps it in a second package, exporters/
    older = [str(source / "exporters")] if (source / "exporters").is_dir() else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(source), *older, *inherited]))
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "kaiyuan_recipes.cli.main", "serve", str(model.resolve()), "--port",
                             str(port), *args], env=env, cwd=source, stdout=log.open("w"), stderr=subprocess.STDOUT)
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server from {source} exited ({proc.returncode}); see {log}")
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            if r.status_code == 200:
                return proc, time.monotonic() - start, r.json()
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise TimeoutError(f"server from {source} not ready within {timeout_s} s; see {log}")


async def one_request(client, kind: str, prompt: list[int], new_tokens: int, sampled: bool,
                      timeout_s: float) -> Outcome:
    out = Outcome(kind)
    params = dict(model="kaiyuan", prompt=prompt, max_tokens=new_tokens, timeout=timeout_s,
                  **(SAMPLED if sampled else dict(temperature=0)))
    start = time.monotonic()
    try:
        if kind == "streamed":
            stream = await client.completions.create(stream=True, stream_options={"include_usage": True}, **params)
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text and out.first_token_s is None:
                    out.first_token_s = time.monotonic() - start
                if chunk.usage is not None:
                    out.tokens = chunk.usage.completion_tokens
        else:
            done = await client.completions.create(**params)
            out.tokens = done.usage.completion_tokens
            out.first_token_s = time.monotonic() - start
    except Exception as err:  # noqa: BLE001  (every failure is counted and reported, by kind)
        out.error = f"{type(err).__name__}: {str(err)[:200]}"
    out.latency_s = time.monotonic() - start
    return out


async def drive(url: str, prompts: list[list[int]], clients: int, per_client: int, new_tokens: int,
                timeout_s: float, deadline_s: float) -> dict:
    """`clients` concurrent clients, `per_client` requests each; none starts after deadline_s."""
    import openai

    kinds = ("greedy", "sampled", "streamed")
    stop_at = time.monotonic() + deadline_s
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as client:
        async def run_client(i: int) -> list[Outcome]:
            outcomes = []
            for j in range(per_client):
                if time.monotonic() > stop_at:
                    break
                kind = kinds[i % 3]
                sampled = kind == "sampled" or (kind == "streamed" and j % 2 == 1)
                outcomes.append(await one_request(client, kind, prompts[(i * per_client + j) % len(prompts)],
                                                  new_tokens, sampled, timeout_s))
            return outcomes

        start = time.monotonic()
        results = [o for group in await asyncio.gather(*(run_client(i) for i in range(clients))) for o in group]
        wall = time.monotonic() - start
    ok = [o for o in results if o.error is None]
    latencies = [o.latency_s for o in ok]
    firsts = [o.first_token_s for o in ok if o.first_token_s is not None]
    streamed_firsts = [o.first_token_s for o in ok if o.kind == "streamed" and o.first_token_s is not None]
    errors = [o.error for o in results if o.error is not None]
    return {"requests_planned": clients * per_client, "requests_sent": len(results), "completed": len(ok),
            "errors": len(errors), "error_examples": sorted(set(errors))[:5], "wall_s": wall,
            "new_tokens": sum(o.tokens for o in ok), "tokens_per_s": sum(o.tokens for o in ok) / wall,
            "latency_s": {"p50": percentile(latencies, 0.5), "p95": percentile(latencies, 0.95),
                          "max": max(latencies, default=None)},
            "first_token_s": {"p50": percentile(firsts, 0.5), "p95": percentile(firsts, 0.95)},
            "streamed_first_token_s": {"p50": percentile(streamed_firsts, 0.5),
                                       "p95": percentile(streamed_firsts, 0.95)}}


async def batch_1(url: str, prompt: list[int], new_tokens: int) -> dict:
    """One streamed greedy request alone: decode tokens/s between its first and last text."""
    import openai

    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as client:
        stamps, tokens = [], 0
        stream = await client.completions.create(model="kaiyuan", prompt=prompt, max_tokens=new_tokens, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}, timeout=600)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                stamps.append(time.monotonic())
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else None
    return {"new_tokens": tokens, "decode_tokens_per_s": (tokens - 1) / span if span else None}


def run_side(name: str, source: Path, model: Path, server_args: list[str], a: argparse.Namespace,
             prompts: list[list[int]]) -> Side:
    side = Side(name, str(source))
    port = 5600 + (name == "baseline")
    log = (a.log_dir or a.out.parent) / f"{a.out.stem}_{name}_server.log"
    proc, side.start_s, side.health = start_server(source, model, port, server_args, log, a.start_timeout_s)
    url = f"http://127.0.0.1:{port}"
    try:
        for index in range(a.passes):
            before = httpx.get(url + "/health", timeout=10).json()
            result = asyncio.run(drive(url, prompts, a.clients, a.requests_per_client, a.new_tokens,
                                       a.request_timeout_s, a.load_deadline_s))
            after = httpx.get(url + "/health", timeout=10).json()
            # the server's own counters over this pass (e.g. decode_s: its time in decode steps)
            result["server"] = {k: after[k] - before[k] for k in SERVER_COUNTERS if k in after and k in before}
            side.load = result if index == 0 else side.load
            side.load.setdefault("passes", []).append({k: result[k] for k in ("tokens_per_s", "latency_s", "errors",
                                                                                "server")})
            print(name, "pass", index, json.dumps(result), flush=True)
        side.batch_1 = asyncio.run(batch_1(url, prompts[0], a.batch_1_tokens))
        side.gpu_memory_mib = gpu_memory_mib(proc.pid)
        side.health = httpx.get(url + "/health", timeout=10).json()
    finally:
        stop = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            side.exit_code = proc.wait(a.drain_timeout_s + 30)
            side.exit_s = time.monotonic() - stop
        except subprocess.TimeoutExpired:
            proc.kill()
    print(name, json.dumps(asdict(side))[:2000], flush=True)
    return side


def ratios(ours: dict, base: dict) -> dict:
    def get(side: dict, *path: str) -> float | None:
        for key in path:
            side = (side or {}).get(key)
        return side

    def ratio(num: float | None, den: float | None) -> float | None:
        return num / den if num and den else None

    return {"tokens_per_s_ours_over_baseline": ratio(get(ours, "load", "tokens_per_s"),
                                                     get(base, "load", "tokens_per_s")),
            "p95_latency_baseline_over_ours": ratio(get(base, "load", "latency_s", "p95"),
                                                    get(ours, "load", "latency_s", "p95")),
            "p50_latency_baseline_over_ours": ratio(get(base, "load", "latency_s", "p50"),
                                                    get(ours, "load", "latency_s", "p50")),
            "p95_first_token_baseline_over_ours": ratio(get(base, "load", "first_token_s", "p95"),
                                                        get(ours, "load", "first_token_s", "p95")),
            "batch_1_ours_over_baseline": ratio(get(ours, "batch_1", "decode_tokens_per_s"),
                                                get(base, "batch_1", "decode_tokens_per_s"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir", type=Path, nargs="?")
    ap.add_argument("--random-qwen3", type=Path, help="write a random-weight qwen3_1p7b here (unless there) and use it")
    ap.add_argument("--baseline-src", type=Path, help="an older copy of the repo")
    ap.add_argument("--baseline-json", type=Path, help="take the baseline side from this earlier result instead")
    ap.add_argument("--ours-json", type=Path, help="take our side from this earlier result instead")
    ap.add_argument("--sides", nargs="+", default=["ours", "baseline"], choices=["ours", "baseline"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--log-dir", type=Path, help="the servers' logs (default: beside --out)")
    ap.add_argument("--device", default=None, help="the servers' --device (default theirs: cuda when available)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--passes", type=int, default=1, help="the same load this many times against each server")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch-1-tokens", type=int, default=256)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, default=4096, help="ours: the envelope's positions")
    ap.add_argument("--start-timeout-s", type=float, default=400)
    ap.add_argument("--request-timeout-s", type=float, default=300)
    ap.add_argument("--load-deadline-s", type=float, default=240, help="no request starts later than this")
    ap.add_argument("--drain-timeout-s", type=float, default=30)
    ap.add_argument("--ours-args", default="", help="more `kaiyuan serve` options for our side, e.g. "
                                                    "'--join-min-rows 4 --join-max-wait-s 0.1'")
    ap.add_argument("--baseline-args", help="the baseline server's options (default: --max-batch-size MAX_BATCH, "
                                            "418de9a's); e.g. '--max-batch 64 --max-seq-len 4096' for a later one")
    ap.add_argument("--rev", help="the git revision of the tree, recorded in the result (the GPU host has no .git)")
    ap.add_argument("--baseline-rev", help="the git revision --baseline-src holds (a `git archive` has no .git), "
                                           "recorded as the baseline side's revision")
    a = ap.parse_args()
    if a.rev:
        os.environ["KAIYUAN_REVISION"] = a.rev
    from generation import prompts as corpus_prompts
    from generation import write_random_qwen3
    from transformers import AutoTokenizer

    if a.random_qwen3:
        model = a.random_qwen3 if (a.random_qwen3 / "config.json").exists() else write_random_qwen3(a.random_qwen3)
    elif a.hf_dir:
        model = a.hf_dir
    else:
        ap.error("an HF_DIR or --random-qwen3 DIR")
    prompts = corpus_prompts(AutoTokenizer.from_pretrained(str(model)), a.clients * a.requests_per_client, a.prompt_len)
    if not prompts:
        ap.error(f"no sample text of {a.prompt_len} tokens")
    device = ["--device", a.device] if a.device else []
    sides: dict[str, dict] = {}
    if a.ours_json:
        sides["ours"] = json.loads(a.ours_json.read_text())["ours"]
    elif "ours" in a.sides:
        sides["ours"] = asdict(run_side("ours", REPO, model, [*device, "--max-batch", str(a.max_batch), "--max-seq-len",
                                                                str(a.max_seq_len), "--drain-timeout-s",
                                                                str(a.drain_timeout_s), *shlex.split(a.ours_args)], a,
                                         prompts))
    if a.baseline_json:
        sides["baseline"] = json.loads(a.baseline_json.read_text())["baseline"]
    elif "baseline" in a.sides:
        if not a.baseline_src:
            ap.error("--baseline-src DIR (or --baseline-json FILE, or --sides ours)")
        # the 418de9a server's option by default; a later revision's as given
        base_args = shlex.split(a.baseline_args) if a.baseline_args is not None else ["--max-batch-size",
                                                                                      str(a.max_batch)]
        sides["baseline"] = asdict(run_side("baseline", a.baseline_src.resolve(), model, [*device, *base_args], a,
                                            prompts)) | {"revision": a.baseline_rev}
    write_json(a.out, {**provenance(this_command()), "model": str(model),
                       "load": {"clients": a.clients, "requests_per_client": a.requests_per_client,
                                "prompt_tokens": a.prompt_len, "new_tokens": a.new_tokens, "passes": a.passes,
                                "mix": "a third greedy, a third sampled, a third streamed (greedy / sampled in turn)",
                                "sampling": SAMPLED, "distinct_prompts": len(prompts)},
                       "targets": TARGETS, **sides,
                       "ratios": ratios(sides.get("ours", {}), sides.get("baseline", {}))})
    print("wrote", a.out)


if __name__ == "__main__":
    main()
