"""Ordered curriculum phases on real indexed files made by the converter: each source's documents in stored or rank
order, sources interleaved in proportion to their sizes, Megatron-Bridge's own provider dispatch and sampler, and a
resumed stream identical to an uninterrupted one. A shuffled phase over the same files is not in order."""

import random
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from kaiyuan_recipes.data.blend import BlendError
from kaiyuan_recipes.data.convert import ConvertOptions, convert_directory
from kaiyuan_recipes.data.convert_worker import BadInputError, rank_path
from kaiyuan_recipes.data.phase_module import PhaseBlendDataModule
from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

SEQ = 64
MARK = re.compile(r"\[\[(\w+) r(\d+) p(\d+)\]\]")
SIZES = {"web": (3, 40), "code": (2, 30)}  # source: (files, documents per file)
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()


def write_source(root, name, files, per_file, seed):
    """Parquet files whose rows carry a marker with the document's rank and its stored position (file, row);
    ranks are a permutation, so stored order and rank order differ."""
    rng = random.Random(seed)
    ranks = list(range(files * per_file))
    rng.shuffle(ranks)
    src = root / f"{name}_parquet"
    src.mkdir()
    for f in range(files):
        rows = range(f * per_file, (f + 1) * per_file)
        texts = [f"[[{name} r{ranks[p]:04d} p{p:04d}]] " + " ".join(rng.choices(WORDS, k=rng.randint(8, 30)))
                 for p in rows]
        table = pa.table({"text": texts, "rank": pa.array([float(ranks[p]) for p in rows])})
        pq.write_table(table, src / f"part-{f:05d}.parquet")
    out = root / name
    convert_directory(ConvertOptions(input_dir=src, output_dir=out, tokenizer_dir=default_tokenizer_dir(),
                                     output_prefix=name, num_shards=1), show_progress=False)
    return out


@pytest.fixture(scope="module")
def curriculum(tmp_path_factory):
    root = tmp_path_factory.mktemp("ordered")
    dirs = {name: write_source(root, name, *size, seed=i) for i, (name, size) in enumerate(SIZES.items())}
    sources = [{"name": n, "dir": str(d), "weight": "tokens"} for n, d in dirs.items()]
    phases = {number: {"tokens": 40 * SEQ * 8, "order": order, "sources": sources}
              for number, order in ((1, "shuffled"), (2, "by_rank"), (3, "as_stored"))}
    path = root / "ordered.yaml"
    path.write_text(yaml.safe_dump({"seq_length": SEQ, "global_batch_size": 8, "phases": phases}))
    return path, dirs


def test_the_converter_keeps_each_documents_rank_beside_its_shard(curriculum):
    _, dirs = curriculum
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    for name, out in dirs.items():
        shards = sorted(out.glob("*_text_document.bin"))
        assert len(shards) == SIZES[name][0]
        for f, shard in enumerate(shards):
            prefix = str(shard)[:-4]
            ranks, docs = np.load(rank_path(prefix)), IndexedDataset(prefix)
            assert len(ranks) == len(docs) == SIZES[name][1]
            text = tokenizer().detokenize(docs[3].tolist())
            found = MARK.search(text)
            assert found and float(found.group(2)) == ranks[3] and int(found.group(3)) == f * SIZES[name][1] + 3


def test_a_skipped_row_takes_its_rank_with_it(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"text": ["a b", "", "c d", None, "e f"], "rank": [5.0, 4.0, 3.0, 2.0, 1.0]}),
                   src / "a.parquet")
    convert_directory(ConvertOptions(input_dir=src, output_dir=tmp_path / "out", tokenizer_dir=default_tokenizer_dir(),
                                     output_prefix="a", num_shards=1, on_bad_row="skip"), show_progress=False)
    assert np.load(rank_path(tmp_path / "out" / "a_part-00000_text_document")).tolist() == [5.0, 3.0, 1.0]


def test_a_non_numeric_or_missing_rank_is_named(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"text": ["a b", "c d"], "rank": ["x", "y"]}), src / "a.parquet")
    with pytest.raises(BadInputError, match=r"a.parquet: column 'rank' has type string; expected a number"):
        convert_directory(ConvertOptions(input_dir=src, output_dir=tmp_path / "out",
                                         tokenizer_dir=default_tokenizer_dir(), output_prefix="a", num_shards=1),
                          show_progress=False)
    pq.write_table(pa.table({"text": ["a b", "c d"], "rank": [1.0, None]}), src / "a.parquet")
    with pytest.raises(BadInputError, match=r"a.parquet: row 1 \(0-based\): 'rank' is null"):
        convert_directory(ConvertOptions(input_dir=src, output_dir=tmp_path / "out",
                                         tokenizer_dir=default_tokenizer_dir(), output_prefix="a", num_shards=1),
                          show_progress=False)


def tokenizer():
    from kaiyuan_recipes import compat

    compat.import_megatron_bridge()
    from megatron.bridge.training.config import TokenizerConfig
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    return build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer",
                                           tokenizer_model=str(default_tokenizer_dir())))


def phase_datasets(path, phase, cache):
    """The phase's datasets as Megatron-Bridge builds them: its provider dispatch on the config's type."""
    from megatron.bridge.data.utils import get_dataset_provider

    config = PhaseBlendDataModule(curriculum=str(path), phase=phase, seq_length=SEQ, global_batch_size=8,
                                  split="100,0,0").dataset_config()
    config.path_to_cache, config.tokenizer = str(cache), tokenizer()
    config.finalize()
    provider = get_dataset_provider(config)
    first = getattr(config, "first_sample", 0)  # the samples the earlier phases consumed
    return config, provider([first + 240, 0, 0], config)[0]


def marks(sample_tokens, tok):
    return [(m.group(1), int(m.group(2)), int(m.group(3))) for m in MARK.finditer(tok.detokenize(sample_tokens))]


def stream(dataset, tok, consumed=None, steps=None, dp=2, micro=2, gbs=8):
    """Each step's global batch through Megatron-Bridge's sampler, in the order the sampler cut it: each micro-batch
    round is `dp` consecutive slices, one per data-parallel rank."""
    from megatron.bridge.data.samplers import build_pretraining_data_loader

    consumed = getattr(dataset, "first", 0) if consumed is None else consumed  # a phase starts where the last ended
    loaders = [iter(build_pretraining_data_loader(dataset, consumed, "single", micro, 0, True, data_parallel_rank=r,
                                                  data_parallel_size=dp, global_batch_size=gbs)) for r in range(dp)]
    steps = steps if steps is not None else (len(dataset) - consumed) // gbs
    out = []
    for _ in range(steps * gbs // (dp * micro)):
        for loader in loaders:
            out.extend(row.tolist() for row in next(loader)["tokens"])
    return out


def test_an_ordered_phase_is_monotone_within_each_source_and_interleaved_by_size(curriculum, tmp_path):
    path, _ = curriculum
    tok = tokenizer()
    from kaiyuan_recipes.data.ordered_dataset import OrderedGPTDatasetConfig

    for phase, key in ((2, 1), (3, 2)):  # by_rank: rank rises; as_stored: (file, row) rises
        config, dataset = phase_datasets(path, phase, tmp_path / f"cache{phase}")
        assert isinstance(config, OrderedGPTDatasetConfig)
        samples = stream(dataset, tok, steps=6)  # inside the first epoch of either source
        seen = {name: [] for name in SIZES}
        which = []
        for sample in samples:
            found = marks(sample, tok)
            assert len({name for name, *_ in found}) <= 1, found  # a sample packs documents of one source
            for mark in found:
                seen[mark[0]].append(mark[key])
            which.append(found[0][0] if found else None)
        for name, values in seen.items():
            assert len(values) > 20 and values == sorted(values), (phase, name, values)
        # sizes by tokens: the running share of each source stays at its token share
        blended = dataset.dataset  # PhaseStart over megatron-core's BlendedDataset
        share = blended.weights[list(blended.datasets).index(next(
            d for d in blended.datasets if "web" in d.dataset_path))]
        assert share is not None and 0.5 < share < 0.8
        web = np.cumsum([w == "web" for w in which if w])
        n = np.arange(1, len(web) + 1)
        assert np.max(np.abs(web - share * n)) <= 2.5, np.max(np.abs(web - share * n))


def test_a_shuffled_phase_over_the_same_files_is_not_in_order(curriculum, tmp_path):
    path, _ = curriculum
    tok = tokenizer()
    config, dataset = phase_datasets(path, 1, tmp_path / "cache1")
    assert type(config).__name__ == "GPTDatasetConfig"
    ranks = [r for sample in stream(dataset, tok, steps=20) for name, r, _ in marks(sample, tok) if name == "web"]
    assert len(ranks) > 20 and ranks != sorted(ranks)


def test_a_resumed_ordered_stream_continues_at_the_same_sample(curriculum, tmp_path, capfd):
    path, _ = curriculum
    tok = tokenizer()
    _, dataset = phase_datasets(path, 2, tmp_path / "cache")
    whole = stream(dataset, tok, steps=12)
    assert capfd.readouterr().err.count("(train, order by_rank): built") == 2  # one per source
    _, reopened = phase_datasets(path, 2, tmp_path / "cache")  # a restarted job: the cached indices reloaded
    assert capfd.readouterr().err.count("(train, order by_rank): loaded") == 2
    start = dataset.first  # phase 2 starts after phase 1's samples
    assert start == 40 * 8  # phase 1: 40 steps of 8
    resumed = stream(dataset, tok, steps=5) + stream(reopened, tok, consumed=start + 5 * 8, steps=7)
    assert resumed == whole
    assert stream(dataset, tok, consumed=start + 5 * 8, steps=1) != whole[:8]  # not the start again


def test_an_ordered_phase_starts_at_its_own_first_document(curriculum, tmp_path):
    """Phase 2 resumes phase 1's run, whose sampler has consumed phase 1's samples: the phase still begins with its
    lowest-ranked documents, not that many samples deep into its order."""
    path, _ = curriculum
    tok = tokenizer()
    _, dataset = phase_datasets(path, 2, tmp_path / "cache")
    seen = [(name, r) for sample in stream(dataset, tok, steps=3) for name, r, _ in marks(sample, tok)]
    for source in SIZES:  # each source begins at its lowest rank
        assert next(r for name, r in seen if name == source) == 0, source
    with pytest.raises(IndexError, match="precedes this phase's first sample 320"):
        dataset[0]


def test_bad_orders_and_loaders_are_refused(curriculum, tmp_path):
    path, _ = curriculum
    spec = yaml.safe_load(path.read_text())
    spec["phases"][2]["order"] = "by_quality"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec))
    with pytest.raises(BlendError, match="phase 2: order 'by_quality'; expected one of shuffled, as_stored, by_rank"):
        PhaseBlendDataModule(curriculum=str(bad), phase=2).dataset_config()
    config = PhaseBlendDataModule(curriculum=str(path), phase=2, seq_length=SEQ).dataset_config()
    config.dataloader_type, config.tokenizer = "cyclic", tokenizer()
    with pytest.raises(ValueError, match="dataset.dataloader_type must be 'single'.*got 'cyclic'"):
        config.finalize()
    src = tmp_path / "plain"
    src.mkdir()
    pq.write_table(pa.table({"text": ["one two three"] * 50}), src / "a.parquet")
    convert_directory(ConvertOptions(input_dir=src, output_dir=tmp_path / "plain_out",
                                     tokenizer_dir=default_tokenizer_dir(), output_prefix="plain", num_shards=1),
                      show_progress=False)
    spec["phases"][2].update(order="by_rank", sources=[{"name": "plain", "dir": str(tmp_path / "plain_out")}])
    bad.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match="plain_out: order by_rank needs the documents' ranks"):
        phase_datasets(bad, 2, tmp_path / "cache_noranks")


def test_the_shipped_kaiyuan_2b_curriculum_follows_the_authors_pipeline():
    from kaiyuan_recipes.data.blend import load_curriculum, phase_iterations, phase_order
    from kaiyuan_recipes.data.phase_module import curriculum_path

    cur = load_curriculum(curriculum_path("kaiyuan_2b"))
    phases = {int(k): v for k, v in cur["phases"].items()}
    assert sorted(phases) == [1, 2, 3, 4, 5]
    assert [phase_order(cur, n) for n in phases] == ["shuffled", "shuffled", "as_stored", "as_stored", "as_stored"]
    assert [phases[n]["schedule"] for n in phases] == ["warmup_stable", "stable", "stable", "stable", "decay"]
    assert sum(float(p["tokens"]) for p in phases.values()) == pytest.approx(2.2e12)  # the model card's total
    module = PhaseBlendDataModule(curriculum="kaiyuan_2b", phase=5)
    bounds = phase_iterations(cur, 512 * 4096)
    assert module.schedule()["lr_wsd_decay_iters"] == bounds[5][1] - bounds[5][0] + 1  # decay = phase 5 only


def test_validation_stays_shuffled_and_a_held_out_prefix_works_in_an_ordered_phase(curriculum, tmp_path):
    """Only the train split is ordered: a validation split of the sources, or a held-out prefix (no ranks), is
    megatron-core's shuffled GPTDataset, so validation loss compares across phases."""
    from megatron.bridge.data.utils import get_dataset_provider

    path, dirs = curriculum
    heldout = sorted(dirs["code"].glob("*.bin"))[0].with_suffix("")
    for heldout_prefix, sizes in ((None, [320 + 80, 40, 0]), (str(heldout), [320 + 80, 40, 0])):
        module = PhaseBlendDataModule(curriculum=str(path), phase=2, seq_length=SEQ, global_batch_size=8,
                                      heldout_prefix=heldout_prefix, split="80,20,0")
        config = module.dataset_config()
        config.path_to_cache, config.tokenizer = str(tmp_path / f"c{heldout_prefix is None}"), tokenizer()
        config.finalize()
        train, valid, _ = get_dataset_provider(config)(sizes, config)
        parts = getattr(valid, "datasets", [valid])
        assert all(not np.array_equal(d.shuffle_index, np.arange(len(d.shuffle_index))) for d in parts)
        assert all(np.array_equal(d.shuffle_index, np.arange(len(d.shuffle_index))) for d in train.dataset.datasets)
        assert len(valid[0]["tokens"]) == SEQ
