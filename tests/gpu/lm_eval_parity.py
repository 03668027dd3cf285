"""lm-evaluation-harness on one exported model twice: its `hf` backend, and `local-completions` against a
`kaiyuan serve` of the same directory, both in fp32, on the local tasks of tests/fixtures/lm_eval. Writes every
request's loglikelihood pair, the worst difference and each task's metrics to --out; exits 1 when a
loglikelihood differs by more than --tolerance or a metric differs.
  python3 tests/gpu/lm_eval_parity.py --model HF_DIR --out parity.json [--port 5001] [--device cuda]"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lm_eval"


def task_names() -> list[str]:
    import yaml

    return sorted(yaml.safe_load(p.read_text())["task"] for p in FIXTURES.glob("*.yaml"))


def evaluate(model: str, model_args: str, batch_size: int, device: str) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=task_names(), batch_size=batch_size,
                                   device=device, log_samples=True,
                                   task_manager=TaskManager(include_path=str(FIXTURES)), random_seed=0,
                                   numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)


def wait_healthy(url: str, server: subprocess.Popen, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"kaiyuan serve exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"kaiyuan serve not ready within {limit_s:.0f} s")


def loglikelihoods(result: dict, task: str) -> list[float]:
    values = []
    for sample in sorted(result["samples"][task], key=lambda s: s["doc_id"]):
        for resp in sample["filtered_resps"]:
            values.append(resp[0] if isinstance(resp, (list, tuple)) else resp)
    return [float(v) for v in values if isinstance(v, (int, float))]


def generated_texts(result: dict, task: str) -> list[str]:
    return [r for s in sorted(result["samples"][task], key=lambda s: s["doc_id"]) for r in s["filtered_resps"]
            if isinstance(r, str)]


def compare(hf: dict, served: dict, tolerance: float) -> dict:
    tasks = {}
    for task in hf["results"]:
        ours, theirs = loglikelihoods(served, task), loglikelihoods(hf, task)
        worst = max((abs(a - b) for a, b in zip(ours, theirs)), default=0.0)
        metrics = {k: (served["results"][task].get(k), v) for k, v in hf["results"][task].items()
                   if isinstance(v, (int, float)) and "stderr" not in k}
        tasks[task] = {"requests": len(theirs), "worst_abs_diff": worst, "within_tolerance": worst <= tolerance,
                       "metrics_served_vs_hf": metrics,
                       "generated_texts_equal": generated_texts(served, task) == generated_texts(hf, task),
                       "metrics_equal": all(a == b for a, b in metrics.values()) and len(ours) == len(theirs)}
    return tasks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--port", type=int, default=5001)
    p.add_argument("--device", default="cuda")
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--tolerance", type=float, default=1e-4, help="nats per request")
    p.add_argument("--rev", default="unknown", help="the revision under test (recorded in the JSON)")
    args = p.parse_args()
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", OPENAI_API_KEY="none")
    os.chdir(FIXTURES)  # the task YAMLs name their jsonl relative to the working directory
    url = f"http://127.0.0.1:{args.port}"
    started = time.time()
    hf = evaluate("hf", f"pretrained={args.model},dtype=float32,max_length={args.max_length}", 1, args.device)
    server = subprocess.Popen([sys.executable, "-m", "kaiyuan_recipes.cli.main", "serve", str(args.model),
                               "--port", str(args.port), "--device", args.device, "--dtype", "float32"])
    try:
        wait_healthy(url, server)
        served = evaluate("local-completions",
                          f"model=kaiyuan,base_url={url}/v1/completions,tokenizer={args.model},"
                          f"tokenizer_backend=huggingface,tokenized_requests=True,max_length={args.max_length},"
                          "max_retries=1", 4, args.device)
    finally:
        server.terminate()
        server.wait(timeout=60)
    tasks = compare(hf, served, args.tolerance)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip() if args.device == "cuda" else "cpu"
    record = {"command": " ".join(["python3", "tests/gpu/lm_eval_parity.py", *sys.argv[1:]]), "rev": args.rev,
              "model": str(args.model), "gpu": gpu, "dtype": "float32", "tolerance": args.tolerance,
              "wall_s": round(time.time() - started, 1), "tasks": tasks}
    args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps(record))
    checks = ("within_tolerance", "metrics_equal", "generated_texts_equal")
    return 0 if all(t[c] for t in tasks.values() for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
