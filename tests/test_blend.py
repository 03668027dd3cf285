"""Blends: category plans, phases, and the realised sample proportions of megatron-core's
BlendedMegatronDatasetBuilder over real .bin/.idx files."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kaiyuan_recipes.config.recipe_tree import recipes_root
from kaiyuan_recipes.data.blend import (
    BlendError,
    load_curriculum,
    load_plan,
    phase_blend,
    phase_iterations,
    plan_categories,
    to_megatron_blend,
)
from kaiyuan_recipes.data.convert import ConvertOptions, convert_directory
from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir


def fake_output_dir(path, shard_tokens):
    """A converter output directory as far as planning is concerned: its manifest."""
    path.mkdir(parents=True)
    shards = {f"src_part-{i:05d}_text_document": {"tokens": t, "documents": 1} for i, t in enumerate(shard_tokens)}
    (path / "manifest.json").write_text(json.dumps({"shards": shards}))
    for name in shards:  # the shard files exist (planning reads only their sizes from the manifest)
        (path / f"{name}.bin").touch()
        (path / f"{name}.idx").touch()
    return path


def write_plan(tmp_path, available, total=200e9, max_epochs=4):
    spec = json.loads(json.dumps(
        {"total_tokens": total, "seed": 42, "max_epochs": max_epochs, "categories": {}}))
    shares = {"english_web": 0.40, "english_edu": 0.20, "chinese_clean": 0.10, "science": 0.10,
              "logic": 0.10, "math": 0.05, "code": 0.05}
    for name, share in shares.items():
        d = fake_output_dir(tmp_path / name, available[name])
        cat = {"share": share, "sources": [{"name": name, "dir": str(d)}]}
        if name == "science":
            cat["top_up_from"] = "english_edu"
        spec["categories"][name] = cat
    path = tmp_path / "plan.yaml"
    import yaml

    path.write_text(yaml.safe_dump(spec))
    return path


PLENTY = {"english_web": [60e9, 40e9], "english_edu": [60e9], "chinese_clean": [30e9], "science": [25e9],
          "logic": [30e9], "math": [12e9], "code": [15e9]}


def test_plan_shares_weights_and_epochs(tmp_path):
    manifest = plan_categories(*load_plan(write_plan(tmp_path, PLENTY)))
    cats = {c["name"]: c for c in manifest["categories"]}
    assert cats["english_web"]["planned_tokens"] == pytest.approx(80e9)
    assert cats["english_web"]["epochs"] == pytest.approx(0.8)
    assert cats["math"]["epochs"] == pytest.approx(10e9 / 12e9)
    assert sum(manifest["blend"]["weights"]) == pytest.approx(1.0)
    web = [w for p, w in zip(manifest["blend"]["prefixes"], manifest["blend"]["weights"]) if "/english_web/" in p]
    assert web == pytest.approx([0.4 * 0.6, 0.4 * 0.4])  # shards in proportion to their size
    assert manifest["seed"] == 42


def test_science_short_is_topped_up_from_english_edu(tmp_path):
    manifest = plan_categories(*load_plan(write_plan(tmp_path, PLENTY | {"science": [5e9]})))
    cats = {c["name"]: c for c in manifest["categories"]}
    assert cats["science"]["planned_tokens"] == pytest.approx(5e9) and cats["science"]["epochs"] == pytest.approx(1)
    assert cats["english_edu"]["planned_tokens"] == pytest.approx(40e9 + 15e9)
    assert cats["english_edu"]["topped_up_from"] == {"science": pytest.approx(15e9)}
    assert sum(manifest["blend"]["weights"]) == pytest.approx(1.0)


def test_empty_category_and_impossible_budget(tmp_path):
    with pytest.raises(BlendError, match="category 'code': no tokens"):
        plan_categories(*load_plan(write_plan(tmp_path / "a", PLENTY | {"code": [0]})))
    with pytest.raises(BlendError, match="category 'math': needs 1e\\+10 tokens but has 1e\\+09 .> max_epochs=4"):
        plan_categories(*load_plan(write_plan(tmp_path / "b", PLENTY | {"math": [1e9]})))


def test_missing_manifest_is_named(tmp_path):
    with pytest.raises(BlendError, match="source 'english_web': .*nowhere/english_web/manifest.json not found"):
        load_plan(_plan_with_missing_dir(tmp_path))


@pytest.mark.parametrize("edit, message", [
    (lambda p: p["categories"]["math"].update(share=-0.5), "category 'math': share must be a number in \\(0, 1\\]"),
    (lambda p: p["categories"]["math"]["sources"][0].pop("dir"),
     "sources\\[0\\] must be a mapping with 'name' and 'dir'"),
    (lambda p: p["categories"]["math"].update(sources=["math"]), "sources\\[0\\] must be a mapping"),
    (lambda p: p.update(categories=[1, 2]), "'categories' must be a mapping"),
    (lambda p: p.update(total_tokens=0), "total_tokens must be a positive number"),
    (lambda p: p.update(max_epochs=-1), "max_epochs must be a positive number, got -1"),
    (lambda p: p["categories"]["science"].update(top_up_from="zzz"),
     "category 'science': top_up_from 'zzz' is not a category of the plan"),
    (lambda p: p["categories"]["math"].update(top_upfrom="code"),
     r"category 'math': unknown key\(s\) \['top_upfrom'\]; expected share, sources, top_up_from"),
    (lambda p: p["categories"]["math"]["sources"][0].update(wieght=3),
     r"category 'math': sources\[0\]: unknown key\(s\) \['wieght'\]; expected name, dir, pattern"),
])
def test_malformed_plans_get_a_clear_error(tmp_path, edit, message):
    import yaml

    path = write_plan(tmp_path, PLENTY)
    plan = yaml.safe_load(path.read_text())
    edit(plan)
    path.write_text(yaml.safe_dump(plan))
    with pytest.raises(BlendError, match=message):
        load_plan(path)


def test_a_shard_whose_bin_was_deleted_is_refused(tmp_path):
    path = write_plan(tmp_path, PLENTY)
    (tmp_path / "math" / "src_part-00000_text_document.bin").unlink()
    with pytest.raises(BlendError, match="source 'math': .* files are gone \\(src_part-00000_text_document.bin\\)"):
        load_plan(path)


def _plan_with_missing_dir(tmp_path):
    path = write_plan(tmp_path, PLENTY)
    text = path.read_text().replace(str(tmp_path / "english_web"), str(tmp_path / "nowhere" / "english_web"))
    path.write_text(text)
    return path


def test_shipped_curriculum_and_plan_parse():
    cur = load_curriculum(recipes_root() / "curricula" / "kaiyuan_2b.yaml")
    bounds = phase_iterations(cur)
    assert sorted(bounds) == [1, 2, 3, 4, 5] and bounds[1][0] == 1
    assert all(bounds[k][1] + 1 == bounds[k + 1][0] for k in range(1, 5))  # continuous iterations
    total = sum(float(p["tokens"]) for p in cur["phases"].values())
    assert total == pytest.approx(2.2e12)
    plan = recipes_root() / "plans" / "laoyao_moe_2b.yaml"
    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(OmegaConf.load(plan), resolve=True)
    assert {k: v["share"] for k, v in spec["categories"].items()} == {
        "english_web": 0.40, "english_edu": 0.20, "chinese_clean": 0.10, "science": 0.10,
        "logic": 0.10, "math": 0.05, "code": 0.05}
    assert spec["total_tokens"] == 200e9 and spec["seed"] == 42
    assert spec["categories"]["science"]["top_up_from"] == "english_edu"


@pytest.fixture(scope="module")
def three_sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("blend")
    dirs = []
    for k in range(3):
        src = root / f"in{k}"
        src.mkdir()
        texts = [f"source {k} document {i} " + "lorem ipsum dolor sit amet " * (5 + i % 7) for i in range(300)]
        pq.write_table(pa.table({"text": texts}), src / "a.parquet")
        out = root / f"src{k}"
        convert_directory(ConvertOptions(input_dir=src, output_dir=out, tokenizer_dir=default_tokenizer_dir(),
                                         output_prefix=f"s{k}", num_shards=1), show_progress=False)
        dirs.append(out)
    return dirs


def test_phase_weights_by_ratio_or_tokens(three_sources, tmp_path):
    cur = {"seq_length": 64, "global_batch_size": 8, "phases": {1: {"tokens": 1e6, "sources": [
        {"name": "a", "dir": str(three_sources[0]), "weight": 0.5},
        {"name": "b", "dir": str(three_sources[1]), "weight": 0.3},
        {"name": "c", "dir": str(three_sources[2]), "weight": "tokens"}]}}}
    with pytest.raises(BlendError, match="phase 2: not in the curriculum"):
        phase_blend(cur, 2)
    cur["phases"][1]["sources"][2]["weight"] = 0.2
    blend = phase_blend(cur, 1)
    assert blend["weights"] == pytest.approx([0.5, 0.3, 0.2])


def test_realised_proportions_match_weights(three_sources, megatron_parallel):
    """megatron-core's own BlendedMegatronDatasetBuilder over real .bin/.idx: within 1%."""
    from megatron.bridge.training.config import GPTDatasetConfig
    from megatron.bridge.training.tokenizers.config import TokenizerConfig
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    weights = [0.5, 0.3, 0.2]
    prefixes = [str(d / f"s{k}_part-00000_text_document") for k, d in enumerate(three_sources)]
    heldout = prefixes[2]
    fields = to_megatron_blend({"prefixes": prefixes, "weights": weights}, heldout_prefix=heldout)
    cfg = GPTDatasetConfig(random_seed=42, seq_length=64, blend_per_split=fields["blend_per_split"], split=None,
                           reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    cfg.tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer",
                                                    tokenizer_model=str(default_tokenizer_dir())))
    cfg.path_to_cache = None
    cfg.finalize()
    train, valid, test = BlendedMegatronDatasetBuilder(GPTDataset, [20000, 200, None], lambda: True, cfg).build()
    realised = np.bincount(train.dataset_index, minlength=3) / len(train.dataset_index)
    assert np.abs(realised - np.array(weights)).max() < 0.01, realised
    assert test is None and len(valid) >= 200
    # deterministic for a seed
    again = BlendedMegatronDatasetBuilder(GPTDataset, [20000, 200, None], lambda: True, cfg).build()[0]
    assert (again.dataset_index == train.dataset_index).all()


def write_curriculum(tmp_path, weight="0.5", tokens="1e6"):
    a, b = fake_output_dir(tmp_path / "a", [100]), fake_output_dir(tmp_path / "b", [300])
    path = tmp_path / "cur.yaml"
    path.write_text(f"seq_length: 64\nglobal_batch_size: 8\nphases:\n"
                    f"  1:\n    tokens: 1e6\n    sources: [{{name: a, dir: {a}, weight: tokens}}]\n"
                    f"  2:\n    tokens: {tokens}\n    sources:\n"
                    f"      - {{name: a, dir: {a}, weight: 1}}\n"
                    f"      - {{name: b, dir: {b}, weight: {weight}}}\n")
    return path


@pytest.mark.parametrize("weight, shown", [(".nan", "nan"), (".inf", "inf"), ("-.inf", "-inf"), ("-1", "-1"),
                                           ("0", "0"), ("abc", "'abc'"), ("true", "True")])
def test_curriculum_weights_that_are_not_positive_numbers_name_phase_and_entry(tmp_path, weight, shown):
    path = write_curriculum(tmp_path, weight=weight)
    with pytest.raises(BlendError) as err:
        load_curriculum(path)
    assert str(err.value) == (f"{path}: phase 2: sources[1] (b): weight {shown} is not a positive finite number "
                              "or 'tokens'")


@pytest.mark.parametrize("tokens", [".nan", ".inf", "-5", "0"])
def test_curriculum_token_budgets_that_are_not_positive_numbers_are_named(tmp_path, tokens):
    path = write_curriculum(tmp_path, tokens=tokens)
    with pytest.raises(BlendError, match=rf"{path}: phase 2: tokens .* is not a positive finite number"):
        load_curriculum(path)


def test_curriculum_weights_near_the_float_maximum_normalise(tmp_path):
    path = write_curriculum(tmp_path, weight="1e308")
    cur = load_curriculum(path)
    cur["phases"][2]["sources"][0]["weight"] = 1e308  # the two sum past the float maximum
    assert phase_blend(cur, 2)["weights"] == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize("total", [".nan", ".inf"])
def test_plan_total_that_is_not_finite_is_named(tmp_path, total):
    path = write_plan(tmp_path, PLENTY)
    path.write_text(path.read_text().replace("total_tokens: 200000000000.0", f"total_tokens: {total}"))
    with pytest.raises(BlendError, match=rf"{path}: total_tokens must be a positive number"):
        load_plan(path)


@pytest.mark.parametrize("field, value, message", [
    ("dataset.blend", "[[/d/a,/d/b],[nan,1]]", "dataset.blend: weight nan of entry 0 (/d/a)"),
    ("dataset.blend", "[[/d/a,/d/b],[1,inf]]", "dataset.blend: weight inf of entry 1 (/d/b)"),
    ("dataset.blend", "[[/d/a,/d/b],[1,-2]]", "dataset.blend: weight -2 of entry 1 (/d/b)"),
    ("dataset.blend", "[[/d/a,/d/b],[0,0]]", "dataset.blend: weight 0 of entry 0 (/d/a)"),
    ("dataset.blend", "[[/d/a,/d/b],[1]]", "dataset.blend: 2 prefixes but weights [1]"),
    ("dataset.data_path", "[nan,/d/a,1,/d/b]", "dataset.data_path: weight nan of entry 0 (/d/a)"),
])
def test_blend_weights_that_are_not_positive_numbers_fail_the_dry_run(capsys, field, value, message):
    from kaiyuan_recipes.cli.main import main

    rc = main(["train", "gpt_smoke", "--dry-run", "--json", "kaiyuan.data=blend", f"{field}={value}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"kaiyuan: error: {message}") and len(err.strip().splitlines()) == 1, err


def test_data_plan_takes_a_shipped_plan_by_name(tmp_path, monkeypatch, capsys):
    from kaiyuan_recipes.cli.main import main as kaiyuan

    for name, tokens in PLENTY.items():
        fake_output_dir(tmp_path / "tokenized" / name, tokens)
    monkeypatch.setenv("LAOYAO_DATA", str(tmp_path / "tokenized"))
    monkeypatch.chdir(tmp_path)
    assert kaiyuan(["data", "plan", "laoyao_moe_2b", "--out", "plan.json"]) == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "plan.json").read_text())
    assert [c["name"] for c in manifest["categories"]][:2] == ["english_web", "english_edu"]
    assert all(p.startswith(str(tmp_path / "tokenized")) for p in manifest["blend"]["prefixes"])
    assert kaiyuan(["data", "plan", "laoyao_moe_3b"]) == 2
    assert "unknown plan 'laoyao_moe_3b'; known: laoyao_moe_2b" in capsys.readouterr().err
