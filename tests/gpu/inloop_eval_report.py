"""inloop_eval.sh's helper.
    make-input PATH --per-dimension N   a synthetic held-out input for `kaiyuan data heldout`: 7 dimensions x N,
                                        every other sample a 4-choice question, prompts of some tens to hundreds
                                        of tokens
    report --out DIR --rev REV --command CMD --interval K
                                        inloop_eval.json and inloop_eval.png from what the script left in DIR"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from provenance import provenance, write_json  # noqa: E402

from kaiyuan_recipes.data.heldout import DIMENSIONS  # noqa: E402

WORDS = ("the", "model", "reads", "一个", "问题", "answer", "because", "因此", "value", "proof", "函数", "list")
BF16_REL_TOLERANCE = 5e-3


def make_input(path: Path, per_dimension: int) -> None:
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as fh:
        for dim in DIMENSIONS:
            for i in range(per_dimension):
                context = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200)))
                a, b = rng.randint(0, 99), rng.randint(0, 99)
                row = {"dimension": dim, "prompt": f"{context}\nQuestion: {a} + {b} = ?\nAnswer:",
                       "completion": f" {a + b}"}
                if i % 2 == 0:
                    row |= {"choices": [f" {a + b}", f" {a + b + 1}", f" {a * b}", " none of these"], "answer": 0}
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def equality(out: Path, name: str) -> dict[str, Any] | None:
    in_training, post_hoc = out / f"{name}_in_training.json", out / f"{name}_post_hoc" / "results.json"
    if not (in_training.is_file() and post_hoc.is_file()):
        return None
    ours = json.loads(in_training.read_text())["samples"]["in_training"]
    theirs = next(iter(json.loads(post_hoc.read_text())["samples"].values()))
    rel = [abs(a["nll"] - b["nll"]) / b["nll"] for a, b in zip(ours, theirs, strict=True)]
    per_token = sorted(abs(a["nll"] - b["nll"]) / a["tokens"] for a, b in zip(ours, theirs))
    flips, flip_margins = [], []
    for a, b in zip(ours, theirs):
        differs = [key for key in ("pred_sum", "pred_avg_norm") if a.get(key) != b.get(key)]
        if differs:  # the in-training margin of the metric that picked differently: a near-tie or a real difference
            flips.append(a["line"])
            scores = a["choice_logprob_sum" if differs[0] == "pred_sum" else "choice_logprob_avg"]
            top = sorted(scores, reverse=True)
            flip_margins.append(top[0] - top[1])
    return {"samples": len(rel), "max_rel_nll_diff": max(rel), "mean_rel_nll_diff": sum(rel) / len(rel),
            "share_over_tolerance": sum(r >= BF16_REL_TOLERANCE for r in rel) / len(rel),
            "per_token_abs_nll_diff": {"median": per_token[len(per_token) // 2],
                                       "p99": per_token[int(0.99 * (len(per_token) - 1))], "max": per_token[-1]},
            "within_tolerance": max(rel) < BF16_REL_TOLERANCE, "tolerance": BF16_REL_TOLERANCE,
            "mcq_flip_margins_nats": flip_margins,
            "mcq_prediction_mismatches": flips, "mcq_samples": sum("pred_sum" in r for r in ours)}


def timing(metrics: list[dict[str, Any]], interval: int) -> dict[str, Any]:
    steps = [r for r in metrics if r["event"] == "step"]
    evals = [r for r in metrics if r["event"] == "heldout_eval"]
    after_first = [r["step_time_s"] for r in steps[10:]] or [r["step_time_s"] for r in steps]
    step_s = sorted(after_first)[len(after_first) // 2]
    eval_s = [r["eval_s"] for r in evals]
    train_s = sum(r["step_time_s"] for r in steps)
    out = {"median_step_s": step_s, "train_s": train_s, "evaluations": len(evals), "eval_s": eval_s,
           "eval_share_of_training": sum(eval_s) / train_s if train_s else None}
    if eval_s:
        typical = sorted(eval_s[1:] or eval_s)[len(eval_s[1:] or eval_s) // 2]  # the first one also tokenizes
        out |= {"typical_eval_s": typical, f"share_every_{interval}": typical / (interval * step_s),
                "share_every_15000_at_this_step_time": typical / (15000 * step_s)}
    return out


def curves(metrics: list[dict[str, Any]]) -> dict[str, dict[str, list]]:
    evals = [r for r in metrics if r["event"] == "heldout_eval"]
    dims = sorted({d for r in evals for d in r["dimensions"]}) + ["overall"]
    out = {}
    for dim in dims:
        pick = [(r["iteration"], r["overall"] if dim == "overall" else r["dimensions"][dim]) for r in evals]
        out[dim] = {"iteration": [i for i, _ in pick], "nll_per_token": [f["nll_per_token"] for _, f in pick],
                    "bits_per_byte": [f["bits_per_byte"] for _, f in pick],
                    "mcq_acc_avg_norm": [f["mcq_acc_avg_norm"] for _, f in pick],
                    "mcq_acc_sum": [f["mcq_acc_sum"] for _, f in pick]}
    return out


def plot(per_dim: dict[str, dict[str, list]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for dim, c in per_dim.items():
        style = {"linewidth": 2.5, "color": "black"} if dim == "overall" else {}
        axes[0].plot(c["iteration"], c["nll_per_token"], label=dim, **style)
        axes[1].plot(c["iteration"], c["mcq_acc_avg_norm"], label=dim, **style)
    axes[0].set(xlabel="iteration", ylabel="completion NLL per token (nats)", title="held-out NLL, in training")
    axes[1].set(xlabel="iteration", ylabel="mcq_acc_avg_norm", title="held-out MCQ accuracy, in training")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out: Path, rev: str, command: str, interval: int) -> dict[str, Any]:
    import os

    os.environ.setdefault("KAIYUAN_REVISION", rev)
    result: dict[str, Any] = provenance(command) | {"what": "kaiyuan.heldout_eval: held-out NLL / bpb / MCQ accuracy "
                                                    "scored during training, vs kaiyuan eval heldout on the export"}
    data = json.loads((out / "data_heldout.json").read_text()) if (out / "data_heldout.json").is_file() else {}
    result["heldout"] = {"samples": data.get("samples")}
    for name in ("smoke", "qwen"):
        if not (out / f"{name}_metrics.jsonl").is_file():
            continue
        metrics = read_jsonl(out / f"{name}_metrics.jsonl")
        part = {"timing": timing(metrics, interval if name == "smoke" else 10), "equality": equality(out, name),
                "status": json.loads((out / f"{name}_status.json").read_text().splitlines()[0])
                if (out / f"{name}_status.json").is_file() else None}
        if name == "smoke":
            part["curves"] = curves(metrics)
            plot(part["curves"], out / "inloop_eval.png")
            if (out / "smoke_base_metrics.jsonl").is_file():
                part["baseline_without_eval"] = timing(read_jsonl(out / "smoke_base_metrics.jsonl"), interval)
        result[name] = part
    if (out / "pytest_gpu.log").is_file():
        result["pytest_gpu_tail"] = (out / "pytest_gpu.log").read_text().splitlines()[-3:]
    write_json(out / "inloop_eval.json", result)
    shown = {n: {"timing": result[n]["timing"], "equality": result[n]["equality"]} for n in ("smoke", "qwen")
             if n in result}
    print(json.dumps({k: v for k, v in result.items() if k not in ("smoke", "qwen")} | shown, indent=1))
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-input")
    m.add_argument("path", type=Path)
    m.add_argument("--per-dimension", type=int, default=400)
    r = sub.add_parser("report")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--rev", required=True)
    r.add_argument("--command", required=True)
    r.add_argument("--interval", type=int, required=True)
    args = p.parse_args(argv)
    if args.cmd == "make-input":
        make_input(args.path, args.per_dimension)
    else:
        report(args.out, args.rev, args.command, args.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
