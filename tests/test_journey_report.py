"""tests/gpu/journey_report.py on folders shaped as journey.sh leaves them: the stack and versions the parts
recorded, each step's figure read from its own log (here the doctor's JSON verdict, upstream noise around it)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = {"torch": "2.11.0+cu130", "megatron-core": "0.18.0", "megatron-bridge": "0.5.0", "transformers": "5.8.1"}


def part(folder: Path, name: str, stack: str, steps: list[dict], logs: dict[str, str]) -> Path:
    folder.mkdir()
    (folder / f"journey_meta_{name}.json").write_text(json.dumps(
        {"part": name, "rev": "abc1234", "stack": stack, "host": "vm", "gpu": "NVIDIA H200", "versions": VERSIONS}))
    (folder / f"journey_steps_{name}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    for step, text in logs.items():
        (folder / f"{step}.log").write_text(text)
    return folder


def report(tmp_path: Path, *folders: Path) -> tuple[int, dict]:
    out = tmp_path / "journey.json"
    done = subprocess.run([sys.executable, "tests/gpu/journey_report.py", *map(str, folders), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(out.read_text())


def test_a_fw2606_part_reports_its_stack_versions_and_the_doctor_verdict(tmp_path):
    doctor = {"verdict": {"tested": False, "message": "untested megatron-bridge stack: torch 2.11.0"}, "exit_code": 1}
    noisy = "UserWarning: transformers>=5.0 support is experimental\n" + json.dumps(doctor, indent=2) + "\nW1201 x\n"
    folder = part(tmp_path / "logs_foreground", "foreground", "fw2606",
                  [{"step": "doctor", "rc": 1, "wall_s": 3.0, "ok": True, "command": "kaiyuan doctor --json"},
                   {"step": "status", "rc": 0, "wall_s": 0.5, "ok": True, "command": "expect_state"}],
                  {"doctor": noisy, "status": '{"state": "finished", "iteration": 200, "loss": 2.7}\n'})
    rc, result = report(tmp_path, folder)
    assert rc == 0 and result["all_ok"]
    assert result["stack"] == "fw2606" and result["versions"] == VERSIONS
    assert result["command"] == ["bash tests/gpu/journey.sh --part foreground --rev abc1234 --stack fw2606"]
    figures = {s["step"]: s["figure"] for s in result["steps"]}
    assert figures["doctor"] == doctor and figures["status"]["iteration"] == 200


def test_parts_on_different_stacks_are_reported_each_and_a_failed_step_fails_the_report(tmp_path):
    fg = part(tmp_path / "a", "foreground", "bridge", [{"step": "train", "rc": 0, "wall_s": 1, "ok": True,
                                                       "command": "kaiyuan train"}], {})
    dt = part(tmp_path / "b", "detached", "fw2606", [{"step": "start", "rc": 1, "wall_s": 1, "ok": False,
                                                     "command": "kaiyuan start"}], {})
    rc, result = report(tmp_path, fg, dt)
    assert rc == 1 and not result["all_ok"]
    assert result["stack"] == ["bridge", "fw2606"] and result["versions"] == VERSIONS  # the same versions: one


# train_start's model settings -> the spec's name: the fast spec runs on megatron-core's local transformer_impl
SPECS = [({"transformer_impl": "transformer_engine", "fast_path": {"fast_spec": False, "chunked_loss": True}},
          "transformer_engine"),
         ({"transformer_impl": "local", "fast_path": {"fast_spec": True, "chunked_loss": True}}, "fast"),
         ({"transformer_impl": "local", "fast_path": {"fast_spec": False, "chunked_loss": False}}, "local")]


@pytest.mark.parametrize("model, spec", SPECS)
def test_the_train_figure_names_the_layer_spec_auto_picked_and_the_last_20_mean(tmp_path, model, spec):
    folder = part(tmp_path / "logs_foreground", "foreground", "te",
                  [{"step": "train", "rc": 0, "wall_s": 190.0, "ok": True, "command": "kaiyuan train gpt_smoke"}], {})
    records = [{"event": "train_start", "iteration": 0, "model": model}]
    records += [{"event": "step", "iteration": i, "loss": 12.0 - i / 20, "tokens_per_s_per_gpu": 1000 + i}
                for i in range(1, 201)]
    (folder / "gpt_smoke_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rc, result = report(tmp_path, folder)
    train = next(s["figure"] for s in result["steps"] if s["step"] == "train")
    assert rc == 0 and result["stack"] == "te"
    assert train["layer_spec"] == spec and train["final_iteration"] == 200
    assert train["chunked_loss"] is model["fast_path"]["chunked_loss"]  # the loss it trained with, as recorded
    assert abs(train["mean_loss_last20"] - (12.0 - 190.5 / 20)) < 1e-9 and train["tokens_per_s_last10"] == 1196


def test_the_qwen3_phase2_launch_is_timed_to_its_first_step_after_its_indices_are_built(tmp_path):
    from kaiyuan_recipes.training.dataset_index import IndexReport, describe

    cache = tmp_path / "cache"
    cache.mkdir()
    built = [cache / "a-GPTDataset-train-description.txt", cache / "a-GPTDataset-train-shuffle_index.npy"]
    for path in built:
        path.write_bytes(b"x" * 2_500_000)
    steps = [{"step": s, "rc": 0, "wall_s": 1.0, "ok": True, "command": c} for s, c in (
        ("index_phase2", "kaiyuan data index"), ("index_phase2_again", "kaiyuan data index"),
        ("phase2", "kaiyuan train"))]
    logs = {"index_phase2": "indexing ...\n" + describe(IndexReport(cache, built=built, cached=2, seconds=51.24)),
            "index_phase2_again": describe(IndexReport(cache, cached=6, seconds=2.5)) + "\n"}
    folder = part(tmp_path / "logs_qwen3", "qwen3", "bridge", steps, logs)
    (folder / "launch_3.json").write_text(json.dumps({"t": 1000.0, "event": "launch", "resumes_from": 20}))
    metrics = [{"event": "train_start", "iteration": 0, "time": 899.0}]
    metrics += [{"event": "step", "iteration": i, "loss": 9.0, "time": 900.0 + i} for i in range(1, 21)]
    metrics += [{"event": "train_start", "iteration": 20, "time": 1050.0}]
    metrics += [{"event": "step", "iteration": 20 + i, "loss": 8.0 + i, "time": 1061.5 + i} for i in (1, 2)]
    (folder / "q1_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    rc, result = report(tmp_path, folder)
    figures = {s["step"]: s["figure"] for s in result["steps"]}
    assert rc == 0
    assert figures["index_phase2"] == {"entries_built": 1, "index_mb": 5.0, "index_s": 51.2}
    assert figures["index_phase2_again"] == {"entries_built": 0, "entries_cached": 6, "index_s": 2.5}
    phase2 = figures["phase2"]
    assert phase2["seconds_launch_to_first_step_logged"] == 62.5 and phase2["first_iteration"] == 21
    assert phase2["seconds_launch_to_training_loop"] == 50.0  # its own train_start, not phase 1's
    assert phase2["resumes_from_checkpoint"] == 20 and phase2["final_iteration"] == 22
