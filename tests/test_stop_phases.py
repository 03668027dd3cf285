"""A stop in every phase of a run (training/run_phase.py). Set-up: a real `kaiyuan train gpt_smoke` on this CPU,
stopped while its rank sets up, ends within 10 s with no checkpoint and says `stopped before its first step`.
Training and saving: Megatron-Bridge's own exit-signal handler (its real GlobalState and DistributedSignalHandler),
handed over at on_train_start: a SIGTERM during a save lets the save complete and is then seen by the loop."""

import subprocess
import sys
import textwrap
import time

from test_lifecycle import wait_for

from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.launch.lifecycle import LocalRun
from kaiyuan_recipes.launch.membership import members


def test_a_stop_during_set_up_ends_a_real_run_at_once_without_a_checkpoint(tmp_path):
    root = tmp_path / "runs"
    run = LocalRun(root / "setup")
    # `kaiyuan train gpt_smoke` (it resolves the config first), under a supervisor
    argv = [sys.executable, "-m", "kaiyuan_recipes.cli.main", "train", "gpt_smoke", "--nproc-per-node=1",
            "kaiyuan.data=mock", f"kaiyuan.run_root={root}", "kaiyuan.run_name=setup"]
    run.start(argv, {"recipe": "gpt_smoke"})
    assert run.status()["phase"] == "setting up: starting"  # the launcher resolves the config first
    phase = RunLayout(run.run_dir).phase
    assert wait_for(lambda: phase.is_file(), timeout=900), run.layout.console_log.read_text()[-3000:]
    shown = run.status()
    assert shown["state"] == "running" and shown["phase"].startswith("setting up: "), shown
    t0 = time.monotonic()
    result = run.stop(grace=60)
    took = time.monotonic() - t0
    assert took < 10 and not result["sigkill_after_grace"] and not result["checkpoint_saved"], (took, result)
    after = run.status()
    assert after["state"] == "stopped" and after["phase"] == "stopped before its first step", after
    assert after["exit"]["exit_code"] == 0 and after["last_checkpoint"] is None
    assert not any(run.layout.checkpoints.iterdir()) and not members(run.layout.state)
    console = run.layout.console_log.read_text()
    assert "stopped before its first step" in console
    # torchrun's report of the rank the stop ended is no failure: in the run's log, not on the console
    assert "ChildFailedError" not in console and "Traceback" not in console, console[-3000:]
    assert any("ChildFailedError" in log.read_text() for log in run.layout.logs.glob("train-*.log"))


HANDOVER = textwrap.dedent('''
    import os, signal, sys, time, types
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.run_phase import RunPhaseCallback, hold_stop_handler_until_training
    from megatron.bridge.training.state import GlobalState

    cfg, run = build_config("gpt_smoke", ["kaiyuan.data=mock", f"kaiyuan.run_root={sys.argv[1]}"])
    callback = RunPhaseCallback(run.layout.state, hold_stop_handler_until_training(cfg))
    run.layout.state.mkdir(parents=True, exist_ok=True)
    state = GlobalState()
    state.cfg = cfg  # what pretrain does first; Bridge installs its handler here when exit_signal_handler is on
    print("@@ set-up SIGTERM default:", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    callback.on_train_start(types.SimpleNamespace(state=state))
    print("@@ training:", cfg.train.exit_signal_handler, flush=True)
    state.train_state.step = cfg.checkpoint.save_interval - 1  # the step before a periodic save
    callback.on_train_step_end(types.SimpleNamespace(state=state))
    print("@@ saving", flush=True)
    deadline = time.monotonic() + 120
    while not callback.stop_requested and time.monotonic() < deadline:  # "the save" runs on through a SIGTERM
        time.sleep(0.05)
    time.sleep(0.5)
    print("@@ save complete", flush=True)
    callback.on_checkpoint_save(types.SimpleNamespace(state=state))
    print("@@ stop seen by the loop:", any(state.signal_handler.signals_received()), flush=True)
''')


def test_bridge_handles_sigterm_only_from_the_first_step_and_a_save_completes(tmp_path):
    script = tmp_path / "handover.py"
    script.write_text(HANDOVER)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs")], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    lines = []
    for line in proc.stdout:
        if not line.startswith("@@ "):  # upstream's own log lines
            continue
        lines.append(line[3:].strip())
        if line.startswith("@@ saving"):
            phase = RunLayout(tmp_path / "runs" / "gpt_smoke").phase
            assert '"saving"' in phase.read_text()
            proc.terminate()
    assert proc.wait(timeout=120) == 0, lines
    assert lines == ["set-up SIGTERM default: True", "training: True", "saving", "save complete",
                     "stop seen by the loop: True"]
