"""The journey's result file from what tests/gpu/journey.sh left in its output folders (one per part): every step's
exit code, wall time and key figure, read from the step's own log or the run's metrics, never restated.
  python3 tests/gpu/journey_report.py OUT_DIR [OUT_DIR...] --out benchmarks/results/DATE_journey.json"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def _steps(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in metrics if r.get("event") == "step"]


def _fast_path(model: dict[str, Any]) -> dict[str, Any]:
    return model.get("fast_path") or {}


def _layer_spec(model: dict[str, Any]) -> str | None:
    """The spec's name as `kaiyuan.layer_spec` spells it: the fast spec is built on megatron-core's local
    transformer_impl, so that field alone would call it `local`."""
    return "fast" if _fast_path(model).get("fast_spec") else model.get("transformer_impl")


def _launch_to_step(folder: Path, launch: int) -> dict[str, Any]:
    """Launch N of the qwen3 journey: seconds from `kaiyuan start` to its training loop (set-up done) and to its
    first step's loss in the metrics, the iteration it began at, and every distinct state `kaiyuan status` showed
    meanwhile."""
    launched = json.loads((folder / f"launch_{launch}.json").read_text())
    metrics = _json_lines(folder / "q1_metrics.jsonl")
    after = [r for r in _steps(metrics) if r.get("time", 0) >= launched["t"]]
    states: list[str] = []
    for answer in _json_lines(folder / f"status_{launch}.jsonl"):
        status = answer["status"]
        shown = status.get("state", status.get("raw")) if isinstance(status, dict) else None
        if isinstance(status, dict) and status.get("phase"):
            shown = f"{shown}: {status['phase']}"
        if shown and (not states or states[-1] != shown):
            states.append(shown)
    figure: dict[str, Any] = {"states_seen": states}
    starts = [r for r in metrics if r.get("event") == "train_start" and r.get("time", 0) >= launched["t"]]
    if starts:  # set-up over: Bridge's training loop begins (the first step's own time comes after)
        figure["seconds_launch_to_training_loop"] = round(starts[0]["time"] - launched["t"], 1)
    if after:
        figure |= {"first_iteration": after[0]["iteration"], "first_loss": after[0]["loss"],
                   "seconds_launch_to_first_step_logged": round(after[0]["time"] - launched["t"], 1)}
    if "resumes_from" in launched:
        figure["resumes_from_checkpoint"] = launched["resumes_from"]
    return figure


def key_figure(name: str, log: str, folder: Path) -> dict[str, Any]:
    """What the step shows, from its own output (or its run's metrics)."""
    if name in ("first_step", "resumed_step"):
        return _launch_to_step(folder, 1 if name == "first_step" else 2)
    if name == "lm_eval_parity" and (record := _last_json(log)):
        return {"gpu": record.get("gpu"), "dtype": record.get("dtype"),
                "tasks": {task: {k: v for k, v in t.items() if k != "metrics_served_vs_hf"}
                          | {"metrics": t["metrics_served_vs_hf"]} for task, t in record["tasks"].items()}}
    if name == "openai_client" and (body := _last_json(log)):
        return {"text": body["choices"][0]["text"][:120], "usage": body.get("usage")}
    if name == "train":
        metrics = _json_lines(folder / "gpt_smoke_metrics.jsonl")
        steps = [s for s in _steps(metrics) if s["iteration"] <= 200]
        starts = [r for r in metrics if r.get("event") == "train_start"]
        if steps:
            last, last20 = steps[-10:], steps[-20:]
            return {"final_iteration": steps[-1]["iteration"], "final_loss": steps[-1]["loss"],
                    "first_loss": steps[0]["loss"], "mean_loss_last20": sum(s["loss"] for s in last20) / len(last20),
                    "tokens_per_s_last10": round(sum(s["tokens_per_s_per_gpu"] for s in last) / len(last)),
                    # what `auto` picked: the layer spec the run trained on and its loss (metrics' train_start)
                    "layer_spec": _layer_spec(starts[0].get("model") or {}) if starts else None,
                    "chunked_loss": _fast_path(starts[0].get("model") or {}).get("chunked_loss") if starts else None}
    if name == "phase2" and (folder / "q1_metrics.jsonl").is_file():
        metrics = _json_lines(folder / "q1_metrics.jsonl")
        starts = [r["iteration"] for r in metrics if r.get("event") == "train_start"]
        steps = _steps(metrics)
        launch = _launch_to_step(folder, 3) if (folder / "launch_3.json").is_file() else {}
        return {"train_starts_at": starts, "final_iteration": steps[-1]["iteration"] if steps else None,
                "final_loss": steps[-1]["loss"] if steps else None,
                **{k: v for k, v in launch.items() if k != "states_seen"}}
    if name.startswith("index_"):  # `kaiyuan data index`'s last line
        if m := re.search(r"built (\d+) index entries \(([\d.,]+) MB\) in ([\d.]+) s", log):
            return {"entries_built": int(m[1]), "index_mb": float(m[2].replace(",", "")), "index_s": float(m[3])}
        if m := re.search(r"every index this run reads is cached .*\((\d+) entries there; ([\d.]+) s\)", log):
            return {"entries_built": 0, "entries_cached": int(m[1]), "index_s": float(m[2])}
    if name == "phase2":
        steps = _steps(_json_lines(folder / "gpt_smoke_metrics.jsonl"))
        if steps:
            return {"first_iteration": min(s["iteration"] for s in steps if s["iteration"] > 200),
                    "final_iteration": steps[-1]["iteration"], "final_loss": steps[-1]["loss"]}
    if name == "doctor":  # `kaiyuan doctor --json`: one JSON document, after whatever upstream printed
        start = log.find("{\n")
        try:  # raw_decode: what stderr printed after the document is not part of it
            report = json.JSONDecoder().raw_decode(log[start:])[0] if start >= 0 else {}
        except ValueError:
            return {}
        return {"verdict": report.get("verdict"), "exit_code": report.get("exit_code")}
    if name.startswith("status") or name == "stop":
        record = _last_json(log) or {}
        keep = ("state", "iteration", "loss", "checkpoint_saved", "sigkill_after_grace", "last_checkpoint")
        return {k: record[k] for k in keep if k in record}
    if name == "curl_megatron" and (body := _last_json(log)):
        return {"texts": [t[:120] for t in body.get("text", [])],
                "new_tokens": [len(t) for t in body.get("tokens", [])]}
    if name == "openai_completion" and (body := _last_json(log)):
        return {"text": body["choices"][0]["text"][:120], "usage": body.get("usage")}
    if name == "eval":
        rows = [line for line in log.splitlines() if line.startswith("|")]
        return {"table": rows[:12]}
    if name == "restart":
        metrics = _json_lines(folder / "detached_metrics.jsonl")
        starts = [r["iteration"] for r in metrics if r.get("event") == "train_start"]
        return {"train_starts_at": starts}
    if name.startswith("export") and (m := re.search(r"\(([\d.]+) s\)", log)):
        return {"export_s": float(m[1])}
    return {}


def _one(values: list[Any]) -> Any:
    """What every part recorded alike, else each part's (a journey's parts ran on one stack, or it says so)."""
    distinct = [v for i, v in enumerate(values) if v not in values[:i]]
    return distinct[0] if len(distinct) == 1 else distinct or None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rev",
                    help="the revision the tree was at, where a part recorded a wrong --rev (said in the file)")
    args = ap.parse_args()
    parts, steps = [], []
    for folder in args.folders:
        for meta_file in sorted(folder.glob("journey_meta_*.json")):
            meta = json.loads(meta_file.read_text())
            if args.rev and meta["rev"] != args.rev:
                meta |= {"rev_recorded_by_the_run": meta["rev"], "rev": args.rev}
            parts.append(meta)
            for step in _json_lines(folder / f"journey_steps_{meta['part']}.jsonl"):
                log = (folder / f"{step['step']}.log").read_text(errors="replace") if (
                    folder / f"{step['step']}.log").is_file() else ""
                steps.append(step | {"part": meta["part"], "figure": key_figure(step["step"], log, folder)})
    revs = sorted({p["rev"] for p in parts})
    result = {
        "name": "journey", "date": time.strftime("%Y-%m-%d"),
        "command": [(f"bash tests/gpu/journey_qwen3.sh --rev {p['rev']}" if p["part"] == "qwen3" else
                     f"bash tests/gpu/journey.sh --part {p['part']} --rev {p['rev']}")
                    + (f" --stack {p['stack']}" if p.get("stack", "bridge") != "bridge" else "") for p in parts],
        "report_command": "python3 tests/gpu/journey_report.py " + " ".join(map(str, args.folders)),
        "rev": revs[0] if len(revs) == 1 else revs, "host": sorted({p["host"] for p in parts}),
        "gpu": sorted({p["gpu"] for p in parts}),
        "stack": _one([p.get("stack", "bridge") for p in parts]),
        "versions": _one([p["versions"] for p in parts if "versions" in p]),
        "overrides": ("kaiyuan.run_root and train.train_iters only (recipe defaults)" if any(
            p["part"] == "qwen3" for p in parts) else "kaiyuan.run_root only (recipe defaults)"),
        "all_ok": bool(steps) and all(s["ok"] for s in steps), "steps": steps,
    }
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({"all_ok": result["all_ok"], "failed": [s["step"] for s in steps if not s["ok"]]}))
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
