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


def _stopped_in_set_up(tmp_path, child_output: str, capsys) -> tuple[int, str]:
    """run_foreground over a child that prints `child_output` and fails, a stop recorded while the phase is set-up."""
    from kaiyuan_recipes.config.run_layout import PHASE_FILE, STOP_FILE
    from kaiyuan_recipes.launch.supervise import run_foreground

    state = tmp_path / "run_state"
    state.mkdir(parents=True)
    (state / PHASE_FILE).write_text(json.dumps({"phase": "setting up: building the config", "at": 0}))
    (state / STOP_FILE).write_text(json.dumps({"signal": "SIGTERM"}))
    code = run_foreground([sys.executable, "-c", f"import sys; sys.stdout.write({child_output!r}); sys.exit(1)"],
                          tmp_path / "train.log", state_dir=state)
    return code, capsys.readouterr().out


TORCHRUN_REPORT = ("E1206 api.py:1002] failed (exitcode: -15) local_rank: 0\nTraceback (most recent call last):\n"
                   "    raise ChildFailedError(\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")


def test_a_stop_in_set_up_keeps_torchrun_s_report_off_the_console_but_not_a_rank_s_error(tmp_path, capsys):
    code, out = _stopped_in_set_up(tmp_path / "plain", TORCHRUN_REPORT, capsys)
    assert code == 0 and "ChildFailedError" not in out and "Traceback" not in out, out
    last = out.strip().splitlines()[-1]
    assert last == "kaiyuan: stopped before its first step; nothing to save, no checkpoint written", out
    assert "ChildFailedError" in (tmp_path / "plain" / "train.log").read_text()
    code, out = _stopped_in_set_up(tmp_path / "error", "kaiyuan: error: no CUDA here\n" + TORCHRUN_REPORT, capsys)
    assert code == 0 and "kaiyuan: a rank reported, as the stop came: no CUDA here\n" in out, out
