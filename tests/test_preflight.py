"""The data checks a launch makes before anything starts (data/preflight.py), over real converted .bin/.idx files:
what megatron-core's index builder or a rank would refuse is refused naming the prefix, what would run but not as
meant is a warning, data on another host is one line; `kaiyuan.data=DIR` resolves converted directories with the
tokenizer their manifest records."""

import json
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kaiyuan_recipes.config.knobs import KnobError, Knobs
from kaiyuan_recipes.data.convert import ConvertOptions, convert_directory
from kaiyuan_recipes.data.converted import choose_tokenizer, resolve_data_dirs
from kaiyuan_recipes.data.preflight import (
    DataSpec,
    PreflightError,
    RunTokenizer,
    check_data,
    run_samples,
    sequence_lengths,
    split_matrix,
)
from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir, tokenizer_fingerprint

QWEN2 = RunTokenizer("NullTokenizer(151643)", 151644, 151643)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Two converted directories: `en` (two files: 300 and 40 documents), `zh` (one file of 30 documents)."""
    root = tmp_path_factory.mktemp("preflight")
    inputs = {"en": {"a": [f"english document {i} " + "the quick brown fox " * (10 + i % 5) for i in range(300)],
                     "b": [f"second file {i} " + "jumps over the lazy dog " * 8 for i in range(40)]},
              "zh": {"c": [f"第{i}篇 " + "床前明月光，疑是地上霜。" * 6 for i in range(30)]}}
    out = {}
    for name, files in inputs.items():
        src = root / f"{name}_parquet"
        src.mkdir()
        for stem, texts in files.items():
            pq.write_table(pa.table({"text": texts}), src / f"{stem}.parquet")
        out[name] = root / name
        convert_directory(ConvertOptions(input_dir=src, output_dir=out[name], tokenizer_dir=default_tokenizer_dir(),
                                         output_prefix=name), show_progress=False)
    return out


def prefixes(directory):
    return sorted(str(p.with_suffix("")) for p in directory.glob("*.idx"))


def spec(blend, split="99,1,0", seq=128, samples=(800, 80, 0), **kw):
    return DataSpec(blend=blend, blend_per_split=kw.get("per_split"), split=split, seq_length=seq, samples=samples,
                    model_vocab_size=kw.get("vocab", 151936))


def test_the_index_reader_and_split_bounds_agree_with_megatron_core(converted):
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    for split in ("99,1,0", "98,2", "90,5,5", "1,0,0", "0.7,0.3"):
        ours, theirs = split_matrix(split), convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
        assert [b is None for b in ours] == [b is None for b in theirs], split
        flat = [x for b in ours if b for x in b], [x for b in theirs if b for x in b]
        assert flat[0] == pytest.approx(flat[1], abs=1e-12), split
    for prefix in prefixes(converted["en"]):
        assert list(sequence_lengths(prefix)) == list(IndexedDataset(prefix).sequence_lengths)
    assert run_samples(100, 8, 20, 2) == (800, (100 // 20 + 1) * 2 * 8, 16)


def test_a_misspelt_prefix_is_refused_naming_the_closest_existing_one(converted):
    good = prefixes(converted["en"])[0]
    typo = good.replace("_text_document", "_text_documnt")
    check = check_data(spec(([good, typo], [1.0, 1.0])), QWEN2)
    assert check.errors == [f"{typo}: no {typo.rsplit('/', 1)[1]}.bin/.idx; closest existing prefix: {good}"]
    wrong_dir = str(converted["en"]).replace("/en", "/enn") + "/" + good.rsplit("/", 1)[1]
    check = check_data(spec(([good, wrong_dir], None)), QWEN2)
    assert check.errors == [f"{wrong_dir}: no such directory; closest existing: {converted['en']}"]
    with pytest.raises(PreflightError, match="would fail the launch"):
        check.refuse()


def test_data_on_another_host_is_one_line_unless_the_ranks_run_here(converted):
    cluster = "/lustre/project/tokenized/web_part-00000_text_document"
    check = check_data(spec(([cluster], None)), QWEN2)
    assert check.ok and check.not_visible.startswith("the data (1 prefix(es), e.g. /lustre/project/tokenized/web")
    assert check.lines() == [f"note: {check.not_visible}"]
    check = check_data(spec(([cluster], None)), QWEN2, ranks_here=True)
    assert check.errors and "no such directory" in check.errors[0]


def test_null_weights_that_megatron_core_would_assert_on_are_refused_in_a_sentence(converted):
    """Without weights megatron-core reads each source once and asserts every source gives a sample (an empty
    AssertionError); a source too short for one sample of its validation split is named with what to change."""
    en, zh = prefixes(converted["en"])[0], prefixes(converted["zh"])[0]
    check = check_data(spec(([en, zh], None), split="90,10,0", seq=2048), QWEN2)
    assert any(e.startswith(f"{zh}: its validation split holds ") and "less than one sample of 2,049" in e
               and "null weights" in e for e in check.errors), check.errors
    # enough tokens for a sample of each source, too few samples for the run: refused too (it would run short)
    check = check_data(spec(([en, zh], None), split="90,10,0", seq=16, samples=(10**7, 8, 0)), QWEN2)
    assert len(check.errors) == 1 and "null weights, so megatron-core reads its 2 sources once" in check.errors[0]
    # the same blend with weights runs: the corpus is repeated, and the repetition is a warning with the epochs
    check = check_data(spec(([en, zh], [1.0, 1.0]), split="90,10,0", seq=16, samples=(10**7, 8, 0)), QWEN2)
    assert check.ok and check.epochs > 100
    # equal weights over unequal sources: the smaller is read the more often, and the warning names it
    assert any(f"epochs of {zh}, the most repeated of 2 by its weight" in w for w in check.warnings), check.warnings
    assert check.epochs > 10**7 * 16 / check.tokens["train"]  # more than the blend's overall repetition


def test_null_weights_message_matches_what_megatron_core_does(converted, megatron_parallel):
    """The refused case really fails upstream: megatron-core's builder asserts with nothing after it."""
    from megatron.bridge.training.config import GPTDatasetConfig
    from megatron.bridge.training.tokenizers.config import TokenizerConfig
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    en, zh = prefixes(converted["en"])[0], prefixes(converted["zh"])[0]
    assert not check_data(spec(([en, zh], None), split="90,10,0", seq=2048), QWEN2).ok
    cfg = GPTDatasetConfig(random_seed=1, seq_length=2048, blend=([en, zh], None), split="90,10,0",
                           reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    cfg.tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=151643))
    cfg.path_to_cache = None
    cfg.finalize()
    with pytest.raises(AssertionError):
        BlendedMegatronDatasetBuilder(GPTDataset, [800, 80, 0], lambda: True, cfg).build()


def test_an_empty_validation_split_is_refused_and_a_small_one_is_a_warning(converted):
    zh = prefixes(converted["zh"])[0]  # 30 documents: 99,1,0 gives validation documents [30, 30) -- none
    check = check_data(spec(([zh], None), seq=16), QWEN2)
    assert check.errors == [f"{zh}: its validation split holds 0 document(s) at dataset.split 99,1,0 and 80 samples "
                            "are asked of it; give it more documents, or name each split's data (kaiyuan.heldout "
                            "for validation)"]
    check = check_data(spec(([zh], None), split="90,10,0", seq=16), QWEN2)
    assert check.ok and any(w.startswith(f"validation reads 3 document(s) of {zh}") for w in check.warnings)
    # no validation asked (validation.eval_interval=0): nothing to say about it
    assert check_data(spec(([zh], None), seq=16, samples=(80, 0, 0)), QWEN2).errors == []


def test_data_converted_with_another_tokenizer_is_refused_naming_both(converted, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(converted["zh"], other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest.update(tokenizer_sha256="0" * 64, tokenizer_dir="/somewhere/glm_tokenizer", tokenizer_eod_id=154820,
                    tokenizer_vocab_size=154856)
    (other / "manifest.json").write_text(json.dumps(manifest))
    prefix = prefixes(other)[0]
    check = check_data(spec(([prefix], None), split="90,10,0", seq=16), QWEN2)
    what = f"{other} was converted with /somewhere/glm_tokenizer (sha256 {'0' * 64})"
    assert check.errors == [f"{what}: end-of-document id 154820; the run's NullTokenizer(151643) has 151643: give the "
                            "run that tokenizer (kaiyuan.tokenizer=/somewhere/glm_tokenizer)",
                            f"{what}: 154,856 ids, more than the model's vocabulary (151,936)"]
    sha = tokenizer_fingerprint(default_tokenizer_dir())
    hf = RunTokenizer(str(default_tokenizer_dir()), 151646, 151643, sha)
    check = check_data(spec(([prefix], None), split="90,10,0", seq=16), hf)
    assert len(check.errors) == 1 and f"the run trains with {default_tokenizer_dir()} (sha256 {sha})" in check.errors[0]
    # the data's own tokenizer passes, either way of naming it
    good = prefixes(converted["zh"])[0]
    assert check_data(spec(([good], None), split="90,10,0", seq=16), hf).ok
    assert check_data(spec(([good], None), split="90,10,0", seq=16), QWEN2).ok


def test_converted_directories_resolve_to_shards_weighed_by_tokens(converted, tmp_path):
    data = resolve_data_dirs([str(converted["en"]), str(converted["zh"])])
    manifests = [json.loads((converted[n] / "manifest.json").read_text())["shards"] for n in ("en", "zh")]
    tokens = {str(converted[n] / k): v["tokens"] for n, m in zip(("en", "zh"), manifests) for k, v in m.items()}
    total = sum(tokens.values())
    assert data.prefixes == sorted(tokens) and data.weights == pytest.approx([tokens[p] / total for p in data.prefixes])
    weighted = resolve_data_dirs([str(converted["en"]), str(converted["zh"])], [3, 1])
    assert sum(weighted.weights[-1:]) == pytest.approx(0.25) and sum(weighted.weights[:-1]) == pytest.approx(0.75)
    assert choose_tokenizer(data, None)[0] == str(default_tokenizer_dir().resolve())
    assert choose_tokenizer(data, str(default_tokenizer_dir()))[0] == str(default_tokenizer_dir())
    with pytest.raises(PreflightError, match=r"kaiyuan.data: .*/enx is not a directory; closest existing: .*/en "):
        resolve_data_dirs([str(converted["en"]) + "x"])
    with pytest.raises(PreflightError, match="1 weight\\(s\\) for 2 directories"):
        resolve_data_dirs([str(converted["en"]), str(converted["zh"])], [1])
    other = tmp_path / "other"
    shutil.copytree(converted["zh"], other)
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps(manifest | {"tokenizer_sha256": "1" * 64}))
    with pytest.raises(PreflightError, match="one run reads one vocabulary"):
        resolve_data_dirs([str(converted["en"]), str(other)])
    with pytest.raises(PreflightError, match="not the tokenizer .* was converted with"):
        choose_tokenizer(resolve_data_dirs([str(other)]), str(default_tokenizer_dir()))


def test_the_data_knob_takes_directories_and_their_weights():
    assert Knobs(data="./conv").data_dirs == ["./conv"]
    assert Knobs(data=["./a", "./b"], data_weights=[1, "2"]).data_weights == [1.0, 2.0]
    assert Knobs(data="blend").data_dirs is None
    with pytest.raises(KnobError, match="one positive number per directory"):
        Knobs(data=["./a", "./b"], data_weights=[1])
    with pytest.raises(KnobError, match="not kaiyuan.data=sample"):
        Knobs(data_weights=[1])
    with pytest.raises(KnobError, match="positive finite"):
        Knobs(data="./a", data_weights=[0])
    with pytest.raises(KnobError, match="kaiyuan.data: a list must name"):
        Knobs(data=[])


def test_a_run_on_converted_directories_trains_with_their_tokenizer(converted, tmp_path):
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.summary import summarize
    from kaiyuan_recipes.training.validate import ConfigError, validate

    overrides = [f"kaiyuan.data=[{converted['en']},{converted['zh']}]", f"kaiyuan.run_root={tmp_path}",
                 "train.train_iters=4", "dataset.seq_length=64", "dataset.split='90,10,0'"]
    cfg, run = build_config("gpt_smoke", overrides)
    assert cfg.tokenizer.tokenizer_type == "HuggingFaceTokenizer"
    assert cfg.tokenizer.tokenizer_model == str(default_tokenizer_dir().resolve())
    assert cfg.dataset.blend[0] == resolve_data_dirs([str(converted["en"]), str(converted["zh"])]).prefixes
    layout = validate(cfg, run, 1, upstream=False)
    data = summarize(cfg, run, layout, ["torchrun"])["data"]
    assert "as recorded in" in data["tokenizer"] and data["tokens"].startswith("train ")
    # a misspelt blend prefix fails the dry run's validate, naming the closest
    good = prefixes(converted["en"])[0]
    cfg, run = build_config("gpt_smoke", ["kaiyuan.data=blend", f"dataset.blend=[[{good}x],null]",
                                          f"kaiyuan.run_root={tmp_path}"])
    with pytest.raises(ConfigError, match=f"closest existing prefix: {good}"):
        validate(cfg, run, 1, upstream=False)


def test_the_checks_import_neither_megatron_nor_torch_nor_transformers():
    """A launch host runs them without building a Megatron config (the lead's `kaiyuan start`)."""
    code = ("import sys, kaiyuan_recipes.data.preflight, kaiyuan_recipes.data.converted; "
            "print(sorted(m for m in ('megatron', 'torch', 'transformers', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_export_serve_and_eval_of_a_run_take_the_tokenizer_it_trained_with(tmp_path):
    """A run on converted data records its HuggingFaceTokenizer in each save's run_config.yaml; `kaiyuan export hf`,
    and serve / eval of a run (as_hf_dir), ship that one without --tokenizer; a NullTokenizer run the bundled one."""
    import yaml

    from kaiyuan_recipes.export.megatron_to_hf import trained_tokenizer_dir

    own = tmp_path / "own_tokenizer"
    shutil.copytree(default_tokenizer_dir(), own)
    save = tmp_path / "run" / "checkpoints" / "iter_0000004"
    save.mkdir(parents=True)
    (save / "run_config.yaml").write_text(yaml.safe_dump(
        {"tokenizer": {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": str(own)}}))
    assert trained_tokenizer_dir(tmp_path / "run") == own
    (save / "run_config.yaml").write_text(yaml.safe_dump(
        {"tokenizer": {"tokenizer_type": "NullTokenizer", "vocab_size": 151643}}))
    assert trained_tokenizer_dir(tmp_path / "run") == default_tokenizer_dir()


def test_a_run_shorter_than_its_schedule_is_a_warning_of_the_dry_run(converted, tmp_path):
    """qwen3_1p7b's schedule (2,000 warm-up iterations, a checkpoint and an evaluation every 2,000) on a 200-iteration
    run trains, but never at its peak learning rate, saving or evaluating only at its end: said before the launch."""
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.validate import schedule_warnings, validate

    base = [f"kaiyuan.data={converted['en']}", f"kaiyuan.run_root={tmp_path}", "dataset.split='80,20,0'"]
    cfg, run = build_config("qwen3_1p7b", base + ["train.train_iters=200"])
    validate(cfg, run, 8, upstream=False, data_here=True)
    found = run.data_check.warnings
    assert any(w.startswith("scheduler.lr_warmup_iters=2000 is not shorter than train.train_iters=200") for w in found)
    assert any(w.startswith("checkpoint.save_interval=2000 is longer than the run (200 iterations)") for w in found)
    assert any(w.startswith("validation.eval_interval=2000 is longer than the run") for w in found)
    cfg, _ = build_config("qwen3_1p7b", base + ["train.train_iters=200", "scheduler.lr_warmup_iters=20",
                                                "checkpoint.save_interval=100", "validation.eval_interval=50"])
    assert schedule_warnings(cfg) == []
