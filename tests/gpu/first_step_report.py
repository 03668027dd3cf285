"""Time to the first step, from a journey_qwen3.sh logs folder: when each launch's status showed each set-up phase,
when its first step was logged, the console lines before the first iteration line; earlier measurements of the
same script (--compare FILE, their own JSON) are carried beside it.

    python3 tests/gpu/first_step_report.py LOGS_DIR --out FILE.json [--compare EARLIER.json ...]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

FIRST_ITERATION_LINE = re.compile(r"kaiyuan: iteration \d")  # the decided block names the line, too


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def phases(logs: Path, launch: int) -> dict[str, float]:
    """Seconds from the launch to the first status answer that showed each phase."""
    start = json.loads((logs / f"launch_{launch}.json").read_text())["t"]
    seen: dict[str, float] = {}
    for answer in _lines(logs / f"status_{launch}.jsonl"):
        status = answer["status"]
        name = status.get("phase") or status.get("state") if isinstance(status, dict) else None
        if name and name not in seen:
            seen[name] = round(answer["t"] - start, 1)
    return seen


def first_step(logs: Path, launch: int) -> dict[str, Any] | None:
    """The launch's first logged step: its iteration, seconds since the launch, its own step time."""
    launched = json.loads((logs / f"launch_{launch}.json").read_text())
    after = launched.get("resumes_from", 0)
    for record in _lines(logs / "q1_metrics.jsonl"):
        if record.get("event") == "step" and record["iteration"] > after and record["time"] > launched["t"]:
            return {"iteration": record["iteration"], "s": round(record["time"] - launched["t"], 1),
                    "step_time_s": round(record["step_time_s"], 1),
                    "tokens_per_s_per_gpu": round(record["tokens_per_s_per_gpu"])}
    return None


def report(logs: Path) -> dict[str, Any]:
    meta = json.loads((logs / "journey_meta_qwen3.json").read_text())
    steps = {s["step"]: s for s in _lines(logs / "journey_steps_qwen3.jsonl")}
    console = (logs / "q1_console.log").read_text().splitlines() if (logs / "q1_console.log").is_file() else []
    before = next((n for n, line in enumerate(console) if FIRST_ITERATION_LINE.match(line)), None)
    out: dict[str, Any] = {
        "recipe": meta.get("recipe", "qwen3_1p7b"), "revision": meta["rev"], "gpu": meta["gpu"],
        "host_versions": meta.get("versions", {}),
        "start_returned_s": steps.get("start", {}).get("wall_s"),
        "first_iteration": first_step(logs, 1), "phases_first_start_s": phases(logs, 1),
        "console_lines_before_first_iteration": before,
    }
    if (logs / "launch_2.json").is_file():
        out |= {"restart_returned_s": steps.get("restart", {}).get("wall_s"),
                "restart_next_iteration": first_step(logs, 2), "phases_restart_s": phases(logs, 2)}
    out["stop_with_checkpoint_s"] = [steps[n]["wall_s"] for n in ("stop", "stop_2") if n in steps]
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("logs", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--command", default="bash tests/gpu/journey_qwen3.sh")
    parser.add_argument("--compare", type=Path, nargs="*", default=[],
                        help="earlier results of this report (or its predecessor), carried as they are")
    args = parser.parse_args()
    result = {"command": args.command, **report(args.logs)}
    result["earlier"] = []
    for path in args.compare:
        earlier = json.loads(path.read_text())
        keep = ("revision", "gpu", "start_returned_s", "first_iteration", "first_iteration_s", "restart_next_iteration",
                "restart_next_iteration_s", "phases_first_start_s", "console_lines_before_first_iteration")
        result["earlier"] += [{"file": str(path), **{k: earlier[k] for k in keep if k in earlier}}]
        if "baseline" in earlier:
            result["earlier"] += [{"file": f"{path} (its baseline)", **earlier["baseline"]}]
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({k: result[k] for k in ("first_iteration", "restart_next_iteration") if k in result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
