"""The typed `kaiyuan.*` knobs: the recipes' base YAML sets exactly its fields, the README's table is the one
generated from it, and a wrong knob or value is refused by name."""

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kaiyuan_recipes.config.knobs import BEGIN, END, KnobError, Knobs, knob_table
from kaiyuan_recipes.training.config import build_config

ROOT = Path(__file__).resolve().parents[1]


def test_base_yaml_sets_every_knob_and_only_knobs():
    base = {}
    for name in ("hparams.yaml", "data.yaml"):
        base.update(OmegaConf.to_container(OmegaConf.load(ROOT / "recipes" / "_base" / name)).get("kaiyuan", {}))
    fields = {f.name: f.default for f in dataclasses.fields(Knobs)}
    assert set(base) == set(fields)
    assert {k: v for k, v in base.items() if fields[k] != v} == {}  # the YAML says the dataclass's defaults


def test_readme_knob_table_is_the_generated_one():
    readme = (ROOT / "README.md").read_text()
    assert BEGIN in readme and END in readme, "README.md lost its knob table markers"
    shown = readme.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == knob_table().strip(), (
        "README's knob table differs from kaiyuan_recipes/config/knobs.py: "
        "run `python -m kaiyuan_recipes.config.knobs --write README.md`")


@pytest.mark.parametrize("override, message", [
    ("kaiyuan.chunked_los=false",
     "unknown override key 'kaiyuan.chunked_los'; closest valid key: kaiyuan.chunked_loss"),
    ("kaiyuan.chunked_loss=maybe", "kaiyuan.chunked_loss: expected one of true, false, auto; got 'maybe'"),
    ("kaiyuan.zero_stage=true", "kaiyuan.zero_stage: expected one of 0, 1, 2; got True"),
    ("kaiyuan.phase=0", "kaiyuan.phase: expected a phase number from 1, got 0"),
    ("kaiyuan.run_name=a/b", "kaiyuan.run_name: 'a/b' must be a plain directory name"),
    ("kaiyuan.tokenizer_sha256=abc", "kaiyuan.tokenizer_sha256: expected 64 lowercase hex digits"),
    ("kaiyuan.layer_spec=te", "kaiyuan.layer_spec: expected one of auto, local, fast, transformer_engine; got 'te'"),
])
def test_bad_knobs_are_refused_by_name(tmp_path, override, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", override])


def test_knobs_type_checks_without_a_recipe():
    assert Knobs().zero_stage == 1 and Knobs(cuda_graph=False).cuda_graph is False
    with pytest.raises(KnobError, match="kaiyuan.heldout: expected str or null; got 3 \\(int\\)"):
        Knobs(heldout=3)
    with pytest.raises(KnobError, match="kaiyuan.fused_adamw: expected bool; got 2 \\(int\\)"):
        Knobs(fused_adamw=2)


def test_what_yaml_cli_and_env_interpolation_mean_is_taken():
    """0 / 1 and "true" / "false" for a switch, a digit string for a number (${oc.env:...} always gives a string),
    an upper-case sha256, an empty run name (the recipe's); a value that means nothing is still refused."""
    knobs = Knobs.from_mapping({"deterministic": 1, "cuda_graph": 0, "fused_adamw": "false", "phase": "2",
                                "zero_stage": "0", "run_name": "", "tokenizer_sha256": "AB" * 32})
    assert (knobs.deterministic, knobs.cuda_graph, knobs.fused_adamw, knobs.phase, knobs.zero_stage) == (
        True, False, False, 2, 0)
    assert knobs.run_name is None and knobs.tokenizer_sha256 == "ab" * 32
    for bad in ({"chunked_loss": 2}, {"zero_stage": True}, {"phase": "two"}, {"cuda_graph": "sometimes"}):
        with pytest.raises(KnobError):
            Knobs.from_mapping(bad)


def test_a_phase_from_the_environment_reaches_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("KAIYUAN_TEST_PHASE", "2")
    _, run = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path}", "kaiyuan.data=mock",
                                        "kaiyuan.phase=${oc.env:KAIYUAN_TEST_PHASE,null}"])
    assert run.phase == 2
