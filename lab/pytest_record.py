"""Run GPU test files and write their result file, so no result of a GPU test is written by hand: pytest's own
JUnit XML read back into benchmarks/results' shape (what, command, revision, host, date, the summary line, each
test's status and, for a failure, its message), written atomically.
    python3 lab/pytest_record.py --what "..." --rev REV --out $OUT/DATE_NAME.json tests/gpu/test_x.py [...]
Arguments after `--` go to pytest. The exit code is pytest's, except that no test collected (pytest's 5) is 1."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import provenance, write_json  # noqa: E402

NO_TESTS_COLLECTED = 5
SUMMARY = re.compile(r"\b(passed|failed|errors?|skipped|no tests ran)\b.* in [0-9.]+s\b")


def cases(junit: Path) -> list[dict[str, str]]:
    """Each test case of a JUnit XML file: `module::name`, passed / failed / skipped, and why when not passed."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        record = {"test": f"{module}::{case.get('name')}", "status": "passed"}
        for tag, status in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
            found = case.find(tag)
            if found is not None:
                record |= {"status": status, "message": (found.get("message") or "")[:500]}
                break
        out.append(record)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="the test files (tests/gpu/test_*.py)")
    ap.add_argument("--what", required=True, help="what the run shows, in a sentence")
    ap.add_argument("--rev", help="the git revision of the tree (the GPU host has no .git)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.rev:
        os.environ["KAIYUAN_REVISION"] = args.rev
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        # pytest's output passed through as it comes (a run cut short by a time limit still leaves its log)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                   *args.files, *pytest_args]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output = []
        for line in proc.stdout:  # bounded: ends when pytest exits
            sys.stdout.write(line)
            sys.stdout.flush()
            output.append(line)
        returncode = proc.wait()
        tests = cases(junit) if junit.is_file() else []
    text = "".join(output)
    # pytest's own summary line, not whatever was printed last (a warning at interpreter exit, on the same pipe)
    lines = [line.strip("= ") for line in text.splitlines() if SUMMARY.search(line)]
    summary = lines[-1] if lines else f"pytest exited {returncode} with no summary line"
    record = {"what": args.what, **provenance(shlex.join(["python3", "lab/pytest_record.py", *argv])),
              "result": summary, "pytest_exit_code": returncode, "tests": tests}
    if returncode != 0 and not tests:
        record["log_tail"] = text[-3000:]
    write_json(args.out, record)
    print("wrote", args.out)
    return 1 if returncode == NO_TESTS_COLLECTED else returncode


if __name__ == "__main__":
    raise SystemExit(main())
