"""lab/pytest_record.py: a real pytest run of a small test file read back into a result file; a failure,
a skip and a parametrised case each recorded as such; no test collected is a failure, not a pass."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = '''
import atexit
import sys

import pytest

# printed after pytest's summary line, as a library's warnings at interpreter exit are (NCCL's, inductor's)
atexit.register(lambda: print("[W1202 ProcessGroupNCCL.cpp] Warning: not destroyed", file=sys.stderr))

def test_passes():
    assert 1 + 1 == 2

@pytest.mark.parametrize("n", [1, 2])
def test_even(n):
    assert n % 2 == 0, f"{n} is odd"

@pytest.mark.skipif(True, reason="needs CUDA")
def test_on_a_gpu():
    pass
'''


def record(tmp_path: Path, *files: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(ROOT / "lab/pytest_record.py"), "--what", "a sample run",
                           "--rev", "abc1234", "--out", str(out), *files], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    return done, json.loads(out.read_text())


def test_each_case_is_recorded_with_its_status_and_the_run_fails_as_pytest_did(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    done, result = record(tmp_path, "test_sample.py")
    assert done.returncode == 1, done.stdout + done.stderr
    assert result["revision"] == "abc1234" and result["what"] == "a sample run" and result["pytest_exit_code"] == 1
    assert "1 failed, 2 passed, 1 skipped" in result["result"] and "Warning" not in result["result"]
    statuses = {t["test"]: t["status"] for t in result["tests"]}
    assert statuses == {"test_sample::test_passes": "passed", "test_sample::test_even[1]": "failed",
                        "test_sample::test_even[2]": "passed", "test_sample::test_on_a_gpu": "skipped"}
    failed = next(t for t in result["tests"] if t["status"] == "failed")
    assert "1 is odd" in failed["message"]
    assert result["command"].startswith("python3 lab/pytest_record.py --what 'a sample run'")


def test_no_test_collected_is_a_failure_with_the_log(tmp_path):
    (tmp_path / "test_empty.py").write_text("x = 1\n")
    done, result = record(tmp_path, "test_empty.py")
    assert done.returncode == 1 and result["pytest_exit_code"] == 5 and result["tests"] == []
    assert "no tests ran" in result["result"] and "log_tail" in result
