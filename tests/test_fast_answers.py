"""Answers that need no model come without Megatron, torch or transformers: each command below runs in a fresh
interpreter and must leave all three out of sys.modules (importing them is what made a typo cost half a minute).
Each one's answer is checked too, so a command that answers fast by answering nothing fails here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

HEAVY = ("megatron", "torch", "transformers")
DRIVER = f"""
import json, sys
from kaiyuan_recipes.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
heavy = sorted({{name.split('.')[0] for name in sys.modules}} & set({HEAVY!r}))
print('@@' + json.dumps({{'code': code, 'heavy': heavy}}), file=sys.stderr)
"""


def answer(tmp_path, *argv, env=None):
    done = subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, **(env or {})})
    marker = [line for line in done.stderr.splitlines() if line.startswith("@@")]
    assert marker, done.stderr[-3000:]
    return json.loads(marker[-1][2:]), done.stdout + done.stderr


def subcommands():
    import argparse

    from kaiyuan_recipes.cli.main import build_parser

    found = []
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, parser in action.choices.items():
                found.append([name])
                for inner in parser._actions:
                    if isinstance(inner, argparse._SubParsersAction):
                        found.extend([name, sub] for sub in inner.choices)
    return found


def test_help_of_every_command_imports_no_model_library(tmp_path):
    for argv in [[], *subcommands()]:
        result, output = answer(tmp_path, *argv, "--help")
        assert result == {"code": 0, "heavy": []}, (argv, result)
        assert "usage: kaiyuan" in output, argv


@pytest.mark.parametrize("argv, expected", [
    (["train", "qwen3_1.7b", "--dry-run"], "unknown recipe 'qwen3_1.7b'"),
    (["train", "gpt_smoke", "kaiyuan.datas=mock"], "closest valid key: kaiyuan.data"),
    (["train", "gpt_smoke", "kaiyuan.zero_stage=7"], "kaiyuan.zero_stage"),
    (["train", "gpt_smoke", "train.global_batch_size=0"], "train.global_batch_size=0"),
    (["train", "gpt_smoke", "--nproc-per-node", "3", "train.global_batch_size=16"], "is not divisible"),
    (["train", "gpt_smoke", "--no-such-option"], "unrecognized arguments"),
    (["status", "--run-root", "missing"], "the run root does not exist"),
    (["status", "r1", "--run-root", "."], "r1"),
    (["logs", "r1", "--run-root", "."], "r1"),
    (["stop", "r1", "--run-root", "."], "r1"),
    (["models", "list"], "qwen3_1p7b"),
    (["start", "gpt_smoke", "r1", "--hosts", "a,b", "--dry-run"], "node 1 (b): "),
    (["ckpt", "ls", "missing"], "missing"),
    (["serve", "missing"], "no such file or directory"),
    (["serve", "."], "neither a Hugging Face model directory"),
    (["export", "hf", "missing", "out"], "no such file or directory"),
    (["eval", "heldout", "--model", "missing", "--data", "x.jsonl", "--out", "o"], "--data x.jsonl: no such file"),
], ids=lambda v: "-".join(v) if isinstance(v, list) else None)
def test_answers_without_a_model_import_no_model_library(tmp_path, argv, expected):
    result, output = answer(tmp_path, *argv)
    assert result["heavy"] == [], (argv, result, output[-2000:])
    assert expected in output, output[-2000:]


def test_start_on_a_host_without_a_gpu_is_refused_before_anything_is_claimed(tmp_path):
    result, output = answer(tmp_path, "start", "gpt_smoke", "r1", f"kaiyuan.run_root={tmp_path / 'runs'}",
                            env={"KAIYUAN_ALLOW_NO_GPU": "0", "CUDA_VISIBLE_DEVICES": ""})
    assert result == {"code": 2, "heavy": []}, output[-2000:]
    assert "training needs a CUDA GPU and this host has none visible" in output
    assert not (tmp_path / "runs").exists()


def test_a_misspelt_container_key_is_refused_at_once_once_the_stack_has_recorded_its_keys(tmp_path, monkeypatch):
    """The key list a full resolution records (config/launch_request.py) lets the launching process refuse a
    misspelt container key without Megatron; before any resolution, the process that trains refuses it."""
    from kaiyuan_recipes.config.launch_request import keys_file, recorded_keys
    from kaiyuan_recipes.training.config import build_config

    env = {"KAIYUAN_CACHE": str(tmp_path / "cache")}
    monkeypatch.setenv("KAIYUAN_CACHE", env["KAIYUAN_CACHE"])
    assert recorded_keys("gpt_smoke", "mock") is None
    build_config("gpt_smoke", ["kaiyuan.data=mock"])
    assert keys_file("gpt_smoke", "mock").is_file() and "train.global_batch_size" in recorded_keys("gpt_smoke",
                                                                                                    "mock").keys
    result, output = answer(tmp_path, "train", "gpt_smoke", "kaiyuan.data=mock", "optimizer.lrr=0.1", env=env)
    assert result == {"code": 2, "heavy": []}, output[-2000:]
    assert "unknown override key 'optimizer.lrr'; closest valid key: optimizer.lr" in output
    result, output = answer(tmp_path, "train", "gpt_smoke", "kaiyuan.data=mock", "optimiser.lr=0.1", env=env)
    assert result == {"code": 2, "heavy": []} and "unknown override section" in output, output[-2000:]


def test_a_dataset_key_the_data_sources_dataset_lacks_is_refused_naming_the_source(tmp_path, monkeypatch):
    """The sample corpus's dataset section (SampleWindowDatasetConfig) has no `data_path`: with kaiyuan.data=sample
    the override would be read by nothing. The process that trains says so, and once that source's keys are
    recorded, so does the launching one, at once; with a blend the same key is the run's."""
    from kaiyuan_recipes.config.launch_request import check_launch_request, recorded_keys
    from kaiyuan_recipes.config.overrides import OverrideError
    from kaiyuan_recipes.training.config import build_config

    env = {"KAIYUAN_CACHE": str(tmp_path / "cache")}
    monkeypatch.setenv("KAIYUAN_CACHE", env["KAIYUAN_CACHE"])
    expected = ("override dataset.data_path: not read with kaiyuan.data=sample (its dataset section is "
                "SampleWindowDatasetConfig, which has no such field)")
    with pytest.raises(OverrideError, match=re.escape(expected)):
        build_config("gpt_smoke", ["kaiyuan.data=sample", "dataset.data_path=[1,/d/a]"])
    assert "dataset.data_path" in recorded_keys("gpt_smoke", "sample").not_with_this_source
    result, output = answer(tmp_path, "train", "gpt_smoke", "kaiyuan.data=sample", "dataset.data_path=[1,/d/a]",
                            env=env)
    assert result == {"code": 2, "heavy": []} and expected in output, output[-2000:]
    build_config("gpt_smoke", ["kaiyuan.data=blend", "dataset.data_path=[1,/d/a]"])
    assert "dataset.data_path" in recorded_keys("gpt_smoke", "blend").keys
    check_launch_request("gpt_smoke", ["kaiyuan.data=blend", "dataset.data_path=[1,/d/a]"])


def test_a_slurm_launch_resolves_nothing_on_the_login_host(tmp_path):
    """The sbatch script comes without Megatron (the job's rank 0 resolves the plan); NeMo-Run, which writes the
    script, imports torch itself."""
    result, output = answer(tmp_path, "start", "gpt_smoke", "r1", "--slurm", "gpu", "--dry-run",
                            "train.global_batch_size=64")
    assert result["code"] == 0 and "megatron" not in result["heavy"], output[-2000:]
    assert "#SBATCH" in output and "decided on the training node" in output
