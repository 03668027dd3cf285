"""`kaiyuan serve RUN_DIR` and `kaiyuan eval heldout --model RUN_DIR` export a Megatron run to a temporary directory
first (~4 GB for qwen3_1p7b): none is left behind, however the process ends — served and stopped by SIGTERM,
stopped by SIGTERM or Ctrl-C while starting, refused at start-up, or an evaluation that ends or fails. Real
torch_dist checkpoints of a tiny model; TMPDIR points into the test's directory, where the exports go."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import free_port
from test_export_checks import run_1024, run_151936  # noqa: F401  (fixtures)

STARTS_WITHIN_S = 400  # Megatron's imports, the export and the model's load on a busy CPU host


def exports_in(tmpdir):
    return sorted(p.name for p in tmpdir.glob("kaiyuan-export-*"))


def start_serve(run_dir, tmpdir):
    tmpdir.mkdir()
    return subprocess.Popen([sys.executable, "-m", "kaiyuan_recipes.cli.main", "serve", str(run_dir), "--device",
                             "cpu", "--port", str(free_port())], env=dict(os.environ, TMPDIR=str(tmpdir)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(condition, proc):
    deadline = time.monotonic() + STARTS_WITHIN_S
    while not condition():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the server did not get there in time"
        time.sleep(0.05)


def serving(proc):
    port = proc.args[proc.args.index("--port") + 1]

    def ready():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        except httpx.TransportError:
            return False
    return ready


def test_served_then_stopped_by_sigterm(run_151936, tmp_path):  # noqa: F811
    proc = start_serve(run_151936, tmp_path / "tmp")
    try:
        wait_for(serving(proc), proc)
        assert not exports_in(tmp_path / "tmp")  # the model is in memory: its export is gone already
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == -signal.SIGTERM  # the process still ends by the signal
    finally:
        proc.kill()
        output = proc.communicate()[0]
    assert not exports_in(tmp_path / "tmp"), output[-3000:]


def test_a_test_runner_started_without_ctrl_c_still_gives_its_tests_children_ctrl_c(tmp_path):
    """A shell without job control starts `make test &` with SIGINT ignored, and every child inherits that: the
    Ctrl-C test below then waited out its timeout. The suite's conftest gives the session Ctrl-C back."""
    probe = tmp_path / "test_probe.py"
    probe.write_text("import signal, subprocess, sys\n"
                     "def test_child():\n"
                     "    code = ('import signal; '\n"
                     "            'print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)')\n"
                     "    assert subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)"
                     ".stdout.strip() == 'True'\n")
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(probe)], cwd=tmp_path, capture_output=True, text=True, timeout=STARTS_WITHIN_S,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_stopped_while_exporting(run_151936, tmp_path, sig):  # noqa: F811
    proc = start_serve(run_151936, tmp_path / "tmp")
    try:
        wait_for(lambda: exports_in(tmp_path / "tmp"), proc)
        proc.send_signal(sig)
        rc = proc.wait(120)
    finally:
        proc.kill()
        output = proc.communicate()[0]
    assert rc != 0 and not exports_in(tmp_path / "tmp"), output[-3000:]
    if sig == signal.SIGTERM:
        assert rc == -signal.SIGTERM, output[-3000:]


def test_a_start_up_refused_leaves_nothing(run_1024, tmp_path):  # noqa: F811
    proc = start_serve(run_1024, tmp_path / "tmp")
    output = proc.communicate(timeout=STARTS_WITHIN_S)[0]
    assert proc.returncode == 2 and "vocab_size 1024 is smaller than the tokenizer's" in output, output[-3000:]
    assert "is a Megatron checkpoint: exporting it to a temporary Hugging Face directory first" in output
    # serve has no --tokenizer: the advice is the command that has one, then serving its output
    assert f"(kaiyuan export hf {run_1024} OUT --tokenizer DIR), then give OUT instead" in output, output[-3000:]
    assert not exports_in(tmp_path / "tmp")


@pytest.mark.parametrize("device, rc", [("cpu", 0), ("no-such-device", 2)], ids=["scored", "failed"])
def test_eval_heldout_of_a_run_leaves_nothing(run_151936, tmp_path, device, rc):  # noqa: F811
    data = tmp_path / "heldout.jsonl"
    data.write_text(json.dumps({"dimension": "code", "prompt": "def f(", "completion": "x):"}) + "\n")
    (tmp_path / "tmp").mkdir()
    done = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "eval", "heldout", "--model",
                           str(run_151936), "--data", str(data), "--out", str(tmp_path / "out"), "--device", device],
                          env=dict(os.environ, TMPDIR=str(tmp_path / "tmp")), capture_output=True, text=True,
                          timeout=STARTS_WITHIN_S)
    assert done.returncode == rc, done.stderr[-3000:]
    assert (tmp_path / "out" / "results.json").is_file() is (rc == 0)
    assert not exports_in(tmp_path / "tmp")
