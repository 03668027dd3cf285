"""How long `kaiyuan` takes to answer what needs no model (a typo, a missing file, a bad batch layout), as a whole
process, beside `python -c pass` timed in the same rounds: the ratio is what a busy host does not change much.
Two source trees side by side (before and after a change), interleaved round by round:

  python benchmarks/cli_latency.py --tree before=DIR_A --tree after=DIR_B --rounds 5 --out FILE.json

Each command runs with the tree first on PYTHONPATH, in an empty working directory, with a fresh KAIYUAN_CACHE."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import provenance, this_command, write_json

COMMANDS = {
    "misspelt recipe": ["train", "qwen3_1.7b", "--dry-run"],
    "misspelt knob": ["train", "gpt_smoke", "kaiyuan.datas=mock"],
    "bad batch layout": ["start", "gpt_smoke", "r1", "--nproc-per-node", "3", "train.global_batch_size=16"],
    "missing run root": ["status", "--run-root", "missing"],
    "serve a missing model": ["serve", "missing"],
    "models list": ["models", "list"],
}


def timed(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=900)
    return time.perf_counter() - t0, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=DIR, a source tree (repeat)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    seconds: dict[str, dict[str, list[float]]] = {name: {c: [] for c in COMMANDS} for name in trees}
    baseline: list[float] = []
    codes: dict[str, dict[str, int]] = {name: {} for name in trees}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.rounds):
            baseline.append(timed([sys.executable, "-c", "pass"], dict(os.environ), work)[0])
            for name, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "KAIYUAN_ALLOW_NO_GPU": "1",
                       "KAIYUAN_CACHE": tempfile.mkdtemp(dir=work)}
                for label, argv in COMMANDS.items():
                    took, code = timed([sys.executable, "-m", "kaiyuan_recipes.cli.main", *argv], env, work)
                    seconds[name][label].append(took)
                    codes[name][label] = code
    python_pass = statistics.median(baseline)
    rows = {name: {label: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v),
                           "ratio_to_python_pass": statistics.median(v) / python_pass, "exit_code": codes[name][label]}
                   for label, v in per.items()} for name, per in seconds.items()}
    result = {**provenance(this_command()), "rounds": args.rounds, "python_pass_median_s": python_pass,
              "commands": {label: " ".join(argv) for label, argv in COMMANDS.items()}, "trees": trees, "rows": rows}
    write_json(args.out, result)
    for label in COMMANDS:
        print(f"{label:24s} " + "  ".join(f"{name} {rows[name][label]['median_s']:6.2f} s "
                                           f"({rows[name][label]['ratio_to_python_pass']:5.1f}x)" for name in trees))
    print(f"python -c pass median {python_pass:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
