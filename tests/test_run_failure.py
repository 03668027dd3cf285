"""A failed run says why in its last words, above torchrun's report that only a child failed: a real
`kaiyuan train` on this CPU host (Megatron trains on CUDA only) ends with one line naming the cause and the logs,
and `kaiyuan status` shows the same cause."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kaiyuan_recipes.launch.failure import last_exception
from kaiyuan_recipes.launch.supervise import failure_line


@pytest.mark.skipif(torch.cuda.is_available(), reason="the failure under test is a host without CUDA")
def test_a_run_on_a_host_without_cuda_ends_naming_the_cause(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "train", "gpt_smoke", "kaiyuan.data=mock",
                           f"kaiyuan.run_root={tmp_path}"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-2:]
    assert last[0].startswith("kaiyuan: training failed (exit 1): training needs a CUDA GPU"), last
    assert last[1].startswith("kaiyuan: its output: ") and "upstream.rank<R>.log" in last[1], last
    assert "Megatron requires CUDA" not in done.stdout + done.stderr  # stopped before upstream's assertion
    status = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "status", "--run-root", str(tmp_path),
                             "gpt_smoke"], capture_output=True, text=True, timeout=120)
    shown = json.loads(status.stdout)
    assert shown["state"] == "failed" and shown["error"].startswith("training needs a CUDA GPU"), shown


def test_the_last_words_name_the_last_cause_a_rank_gave():
    output = ("W0101 torch: ValueError: caught and logged at start-up\n"
              "[rank0]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert failure_line(1, output, Path("/r/logs/train.log")).splitlines() == [
        "kaiyuan: training failed (exit 1): [rank0]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "kaiyuan: its output: /r/logs/train.log; every upstream log record: /r/logs/upstream.rank<R>.log"]
    stated = output + "[rank1]: kaiyuan: error: data: prefix /d/x has no .idx\n"
    assert last_exception(stated) == "data: prefix /d/x has no .idx"  # a later stated error wins
    assert failure_line(-signal.SIGKILL, "", Path("t.log")).startswith("kaiyuan: training ended by SIGKILL\n")
