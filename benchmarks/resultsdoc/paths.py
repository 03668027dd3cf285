"""Where the result files and the generated documents live (the command line can point elsewhere)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "benchmarks" / "results"
DOC = ROOT / "benchmarks" / "RESULTS.md"
PROOFS_README = ROOT / "tests" / "gpu" / "README.md"
