"""The `kaiyuan` command as a user runs it (a real subprocess)."""

import json
import subprocess
import sys


def kaiyuan(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "kaiyuan_recipes.cli.main", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_train_dry_run_prints_the_plan(tmp_path):
    out = kaiyuan("train", "gpt_smoke", "--dry-run", "--json", f"kaiyuan.run_root={tmp_path}", "train.train_iters=100")
    assert out.returncode == 0, out.stderr[-3000:]
    plan = json.loads(out.stdout)
    assert plan["model"]["parameters"] == 339_561_216
    assert plan["batch"]["tokens_per_step"] == 16 * 4096
    assert plan["batch"]["train_iters"] == 100
    assert plan["parallel"]["data"] == 1 and plan["parallel"]["zero_stage"] == 1
    assert plan["checkpoint"]["keep_most_recent"] == 3
    assert plan["checkpoint"]["dir"] == str(tmp_path / "gpt_smoke" / "checkpoints")
    assert plan["launch_command"].endswith(
        "-m kaiyuan_recipes.training.entry gpt_smoke kaiyuan.run_root=" + str(tmp_path) + " train.train_iters=100")
    assert "--nproc-per-node=1" in plan["launch_command"]
    assert plan["profiling"] == "off" and plan["model"]["deterministic"] is False
    assert not (tmp_path / "gpt_smoke").exists()  # a dry run writes nothing
    out = kaiyuan("train", "gpt_smoke", "--dry-run", "--json", f"kaiyuan.run_root={tmp_path}", "profile.enabled=true",
                  "profile.steps=[3,5]", "kaiyuan.deterministic=true")
    assert out.returncode == 0, out.stderr[-3000:]
    plan = json.loads(out.stdout)
    assert plan["profiling"] == f"iterations 3..5 on ranks [0] -> {tmp_path / 'gpt_smoke' / 'torch_profile'}"
    assert plan["model"]["deterministic"] is True


def test_train_dry_run_table_and_errors():
    out = kaiyuan("train", "qwen3_1p7b", "--dry-run", "--nproc-per-node", "8")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2,031,739,904" in out.stdout and "grad_accumulation: 32" in out.stdout
    bad = kaiyuan("train", "qwen3_1p8b", "--dry-run")
    assert bad.returncode == 2 and "known recipes: gpt_smoke, laoyao_moe_2b, qwen3_1p7b" in bad.stderr
    bad = kaiyuan("train", "gpt_smoke", "--dry-run", "--nproc-per-node", "3")
    assert bad.returncode == 2 and "global_batch_size=16 is not divisible" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_models_list():
    out = kaiyuan("models", "list")
    assert out.returncode == 0
    assert "gpt_smoke" in out.stdout and "2.032B" in out.stdout and "0.340B" in out.stdout
