"""A launch whose ranks train on this host (`kaiyuan start` / `kaiyuan train` without --ssh or --slurm) refuses data
that is not here before the run is claimed, in a moment, naming what is missing: the ranks would refuse it only
after Megatron's import and the config's build."""

import os
import subprocess
import sys

import pytest

from kaiyuan_recipes.config.knobs import Knobs
from kaiyuan_recipes.data.on_this_host import refuse_data_missing_here
from kaiyuan_recipes.data.preflight import PreflightError


def kaiyuan(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, "KAIYUAN_ALLOW_NO_GPU": "1"})


def test_a_start_on_a_plan_whose_sources_are_not_converted_is_refused_before_the_run_is_claimed(tmp_path):
    """laoyao_moe_2b's defaults read a category plan over converted sources; on a host without them the start said
    `started` and the rank failed a minute later."""
    out = kaiyuan("start", "laoyao_moe_2b", "ly", f"kaiyuan.run_root={tmp_path / 'runs'}", cwd=tmp_path)
    assert out.returncode != 0
    assert "manifest.json not found (run `kaiyuan data convert` first)" in out.stderr, out.stderr
    assert "kaiyuan.plan=laoyao_moe_2b (" in out.stderr and f"relative dirs from {tmp_path}" in out.stderr
    assert "started" not in out.stdout
    assert not (tmp_path / "runs").exists()  # nothing claimed


def test_a_misspelt_blend_prefix_is_refused_naming_the_closest_one(tmp_path):
    from kaiyuan_recipes.data.sample_corpus import prepare_sample_corpus
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    prefix = prepare_sample_corpus(str(default_tokenizer_dir()))[0][0]
    out = kaiyuan("train", "gpt_smoke", "kaiyuan.data=blend", f"kaiyuan.run_root={tmp_path / 'runs'}",
                  f"dataset.blend=[[{prefix}x],null]", cwd=tmp_path)
    assert out.returncode != 0
    assert f"dataset.blend: {prefix}x: no " in out.stderr and f"closest existing prefix: {prefix}" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_what_is_here_passes(tmp_path):
    from kaiyuan_recipes.data.sample_corpus import prepare_sample_corpus
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    blend = prepare_sample_corpus(str(default_tokenizer_dir()))
    refuse_data_missing_here(Knobs.from_mapping({"data": "blend"}), [list(blend[0]), None], None)
    refuse_data_missing_here(Knobs.from_mapping({"data": "sample"}), None, None)
    per_split = [[[blend[0][0]], None], [[str(tmp_path / "gone")], None], None]
    with pytest.raises(PreflightError, match="gone: no such directory|gone: no gone.bin/.idx"):
        refuse_data_missing_here(Knobs.from_mapping({"data": "blend"}), None, per_split)


def test_a_converted_directory_that_is_not_there_is_refused(tmp_path):
    out = kaiyuan("train", "gpt_smoke", f"kaiyuan.data={tmp_path / 'convertd'}", f"kaiyuan.run_root={tmp_path}/r",
                  cwd=tmp_path)
    assert out.returncode != 0 and "is not a directory" in out.stderr, out.stderr
    assert not (tmp_path / "r").exists()


def test_a_blend_given_through_an_interpolation_is_left_to_the_ranks(tmp_path, monkeypatch):
    """`dataset.blend=[[${oc.env:DATA}/name],null]` (Hydra syntax; Bridge resolves it when it applies the overrides)
    names data that is here: the launch is not refused for the text `${oc.env:DATA}/name`, quoted or not."""
    from kaiyuan_recipes.cli.train import checked_launch
    from kaiyuan_recipes.data.sample_corpus import prepare_sample_corpus
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir
    from kaiyuan_recipes.training.config import build_config

    prefix = prepare_sample_corpus(str(default_tokenizer_dir()))[0][0]
    folder, name = os.path.split(prefix)
    monkeypatch.setenv("KAIYUAN_TEST_DATA", folder)
    common = ["kaiyuan.data=blend", f"kaiyuan.run_root={tmp_path}"]
    for blend in (f"[[${{oc.env:KAIYUAN_TEST_DATA}}/{name}],null]", f"[['${{oc.env:KAIYUAN_TEST_DATA}}/{name}'],null]"):
        checked_launch("gpt_smoke", [*common, f"dataset.blend={blend}"], 1)
    cfg, _ = build_config("gpt_smoke", [*common, f"dataset.blend={blend}"])
    assert cfg.dataset.blend[0] == [prefix]  # what the ranks read
    monkeypatch.setenv("KAIYUAN_TEST_DATA", str(tmp_path / "elsewhere"))  # resolved here, so still checked
    with pytest.raises(PreflightError, match=f"dataset.blend: {tmp_path / 'elsewhere'}/{name}: no such directory"):
        checked_launch("gpt_smoke", [*common, f"dataset.blend={blend}"], 1)
