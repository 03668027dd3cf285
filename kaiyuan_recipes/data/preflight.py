"""What a run's data must satisfy before anything launches, checked over plain values (prefixes, weights, the split,
the samples the run asks of each split, the run's tokenizer) so that the dry run, `kaiyuan start` and `kaiyuan data
index` refuse the same things the ranks would, without building a Megatron config: `.idx` headers are read with
numpy, converter manifests as JSON. No megatron, torch or transformers import here.

The rules follow megatron-core 0.19's dataset builder (datasets/blended_megatron_dataset_builder.py, gpt_dataset.py):
a split takes documents [round(lo * n), round(hi * n)) of each prefix; a sample is seq_length tokens plus one; with
weights each source is read for as many epochs as its share asks; without weights (several prefixes) each is read
once and BlendedDataset asserts every source gives a sample."""

from __future__ import annotations

import difflib
import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from kaiyuan_recipes.data.tokenizer import tokenizer_identity

MANIFEST = "manifest.json"  # what `kaiyuan data convert` writes beside its shards (data/convert.py)
IDX_HEADER = b"MMIDIDX\x00\x00"
SPLITS = ("train", "validation", "test")
MID_LEVEL_SURPLUS = 0.005  # megatron-core's BlendedMegatronDatasetConfig.mid_level_dataset_surplus default
MAX_BLEND_PREFIXES = 32766  # BlendedDataset asserts fewer than 32767 datasets
EPOCHS_WARNED = 4.0  # more repetitions than this is worth a line (the blend plans' default max_epochs)
FEW_VALIDATION_DOCUMENTS = 10  # a validation loss over fewer documents per source is mostly noise

Blend = tuple[Sequence[str], Sequence[float] | None]


class PreflightError(ValueError):
    pass


@dataclass(frozen=True)
class RunTokenizer:
    """The tokenizer a run trains with, as the data checks need it: what to call it, the ids it produces, its
    end-of-document id, and (a Hugging Face directory) tokenizer.json's sha256."""

    name: str
    vocab_size: int
    eod_id: int | None
    sha256: str | None = None


@dataclass(frozen=True)
class DataSpec:
    """What the run asks of its data: dataset.blend with dataset.split, or dataset.blend_per_split; sequence length;
    samples per split (train, validation, test), as Megatron-Bridge asks them; the model's vocabulary size."""

    blend: Blend | None
    blend_per_split: Sequence[Blend | None] | None
    split: str | None
    seq_length: int
    samples: tuple[int, int, int]
    model_vocab_size: int | None = None


@dataclass
class DataCheck:
    errors: list[str] = field(default_factory=list)  # the launch would fail: refuse
    warnings: list[str] = field(default_factory=list)  # it would run, but probably not as meant
    not_visible: str | None = None  # the data is on another host (a cluster path): one line, nothing checked
    tokens: dict[str, int] = field(default_factory=dict)  # split -> tokens the run's sources hold in it
    epochs: float | None = None  # train tokens asked / train tokens held

    @property
    def ok(self) -> bool:
        return not self.errors

    def lines(self) -> list[str]:
        return ([f"error: {e}" for e in self.errors] + [f"warning: {w}" for w in self.warnings]
                + ([f"note: {self.not_visible}"] if self.not_visible else []))

    def refuse(self) -> None:
        """Raise PreflightError with every error, one per line."""
        if self.errors:
            raise PreflightError("the data would fail the launch:\n  " + "\n  ".join(self.errors))


# --- plain facts about the files -----------------------------------------------------------------------------------

def sequence_lengths(prefix: str | Path) -> Any:
    """The tokens of each document of `prefix`.idx (a memory map; megatron-core's IndexedDataset layout)."""
    import numpy

    path = Path(f"{prefix}.idx")
    with open(path, "rb") as fh:
        head = fh.read(34)
    if len(head) < 34 or head[:9] != IDX_HEADER or struct.unpack("<Q", head[9:17])[0] != 1:
        raise PreflightError(f"{path}: not a megatron-core index (bad header); convert the data again")
    count = struct.unpack("<Q", head[18:26])[0]
    if path.stat().st_size < 34 + 4 * count:
        raise PreflightError(f"{path}: truncated ({count:,} documents announced); convert the data again")
    return numpy.memmap(path, dtype=numpy.int32, mode="r", offset=34, shape=(count,)) if count else numpy.zeros(
        0, dtype=numpy.int32)


def split_matrix(split: str) -> list[tuple[float, float] | None]:
    """megatron-core's parse_and_normalize_split + convert_split_vector_to_split_matrix: "99,1,0" ->
    [(0, .99), (.99, 1), None]."""
    parts = [float(x) for x in re.findall(r"[.0-9]+", split)]
    parts += [0.0] * (len(SPLITS) - len(parts))
    if len(parts) != len(SPLITS) or sum(parts) <= 0:
        raise PreflightError(f"dataset.split={split!r}: expected three non-negative shares such as 99,1,0")
    total = sum(parts)
    bounds, lo = [], 0.0
    for share in parts:
        hi = lo + share / total
        bounds.append((lo, hi) if hi > lo else None)
        lo = hi
    return bounds


def documents_in(bounds: tuple[float, float], documents: int) -> tuple[int, int]:
    return int(round(bounds[0] * documents)), int(round(bounds[1] * documents))


def _manifest(directory: str) -> dict[str, Any] | None:
    path = Path(directory) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class DataTokenizer:
    """The tokenizer a converted directory was made with, from its manifest."""

    directory: str
    sha256: str | None
    vocab_size: int | None
    eod_id: int | None


def data_tokenizer(converted_dir: str | Path) -> DataTokenizer | None:
    """What `kaiyuan data convert` recorded for `converted_dir` (None: no manifest there). Manifests from before the
    vocabulary was recorded: read from the tokenizer directory when it is on this host."""
    manifest = _manifest(str(converted_dir))
    if manifest is None or "tokenizer_sha256" not in manifest:
        return None
    vocab, eod = manifest.get("tokenizer_vocab_size"), manifest.get("tokenizer_eod_id")
    directory = str(manifest.get("tokenizer_dir", "?"))
    if vocab is None and (Path(directory) / "tokenizer.json").is_file():
        vocab, eod = tokenizer_identity(directory)
    return DataTokenizer(directory, manifest.get("tokenizer_sha256"), vocab, eod)


# --- the check -----------------------------------------------------------------------------------------------------

@dataclass
class _Use:
    """One split's blend: which documents of which prefixes, and the samples asked of it."""

    split: int
    prefixes: list[str]
    weights: list[float] | None
    bounds: tuple[float, float]
    samples: int
    where: str  # the config field, for messages


def _uses(spec: DataSpec) -> tuple[list[_Use], list[str]]:
    uses, errors = [], []
    if spec.blend_per_split:
        for i, blend in enumerate(spec.blend_per_split):
            if blend is not None and spec.samples[i] > 0:
                uses.append(_Use(i, list(blend[0]), _weights(blend), (0.0, 1.0), spec.samples[i],
                                 f"dataset.blend_per_split[{i}]"))
        return uses, errors
    if spec.blend is None:
        return uses, errors
    try:
        bounds = split_matrix(spec.split or "")
    except PreflightError as err:
        return uses, [str(err)]
    for i, b in enumerate(bounds):
        if b is not None and spec.samples[i] > 0:
            uses.append(_Use(i, list(spec.blend[0]), _weights(spec.blend), b, spec.samples[i], "dataset.blend"))
    return uses, errors


def _weights(blend: Blend) -> list[float] | None:
    return None if blend[1] is None else [float(w) for w in blend[1]]


def closest_dir(path: Path) -> str:
    """'; closest existing: X' for a path whose directory is misspelt, from its nearest existing ancestor."""
    parent, missing = path.parent, path.name
    while not parent.is_dir() and parent != parent.parent:
        parent, missing = parent.parent, parent.name
    if not parent.is_dir():
        return ""
    try:
        names = [p.name for p in parent.iterdir()]
    except OSError:
        return ""
    match = difflib.get_close_matches(missing, names, n=1, cutoff=0.5)
    return f"; closest existing: {parent / match[0]}" if match else f" ({parent / missing} does not exist)"


def prefix_present(prefix: str) -> bool:
    """Both files megatron-core's IndexedDataset reads for `prefix` exist."""
    return Path(f"{prefix}.idx").is_file() and Path(f"{prefix}.bin").is_file()


def missing_prefix(prefix: str) -> str:
    path = Path(prefix)
    if path.parent.is_dir():
        names = sorted(p.name[:-4] for p in path.parent.glob("*.idx"))
        match = difflib.get_close_matches(path.name, names, n=1, cutoff=0.5)
        example = f", e.g. {path.parent / names[0]}" if names else ""
        hint = (f"; closest existing prefix: {path.parent / match[0]}" if match else
                f"; {path.parent} holds {len(names)} prefix(es){example}")
        return f"{prefix}: no {path.name}.bin/.idx{hint}"
    return f"{prefix}: no such directory{closest_dir(path)}"


def _check_weights(use: _Use, errors: list[str]) -> None:
    if len(use.prefixes) > MAX_BLEND_PREFIXES:
        errors.append(f"{use.where}: {len(use.prefixes):,} prefixes; megatron-core blends at most "
                      f"{MAX_BLEND_PREFIXES:,}")
    if use.weights is None:
        return
    if len(use.weights) != len(use.prefixes):
        errors.append(f"{use.where}: {len(use.prefixes)} prefixes but {len(use.weights)} weights; give one weight per "
                      "prefix")
        use.weights = None
        return
    for prefix, w in zip(use.prefixes, use.weights):
        if not (math.isfinite(w) and w > 0):
            errors.append(f"{use.where}: weight {w!r} of {prefix} is not a positive finite number")
            use.weights = None
            return


def _check_tokenizer(directories: set[str], run: RunTokenizer, model_vocab: int | None, errors: list[str],
                     warnings: list[str]) -> None:
    for directory in sorted(directories):
        data = data_tokenizer(directory)
        if data is None:
            continue  # not converted by kaiyuan (no manifest): nothing recorded to compare
        what = f"{directory} was converted with {data.directory} (sha256 {data.sha256})"
        if run.sha256 is not None:
            if data.sha256 != run.sha256:
                errors.append(f"{what}; the run trains with {run.name} (sha256 {run.sha256}): convert the data with "
                              "the run's tokenizer, or give the run the data's (kaiyuan.tokenizer)")
            continue
        if data.vocab_size is None:
            warnings.append(f"{what}, whose vocabulary is not recorded and not on this host: not compared with "
                            f"{run.name}")
            continue
        if data.eod_id != run.eod_id:
            errors.append(f"{what}: end-of-document id {data.eod_id}; the run's {run.name} has {run.eod_id}: give the "
                          f"run that tokenizer (kaiyuan.tokenizer={data.directory})")
        limit = model_vocab if model_vocab is not None else run.vocab_size
        if data.vocab_size > limit:
            errors.append(f"{what}: {data.vocab_size:,} ids, more than the model's vocabulary ({limit:,})")


def check_data(spec: DataSpec, tokenizer: RunTokenizer | None = None, ranks_here: bool = False) -> DataCheck:
    """Everything about the data that `kaiyuan data index` or a rank would refuse, as errors; what would run but
    probably not as meant (a corpus repeated many times, a validation split of a few documents), as warnings. Data
    that is nowhere on this host (`ranks_here` False: the ranks run elsewhere) is one line, `not_visible`."""
    check = DataCheck()
    uses, check.errors = _uses(spec)
    if not uses:
        return check
    prefixes = sorted({p for u in uses for p in u.prefixes})
    present = {p for p in prefixes if prefix_present(p)}
    if not present and not ranks_here and not any(Path(p).parent.is_dir() for p in prefixes):
        check.not_visible = (f"the data ({len(prefixes)} prefix(es), e.g. {prefixes[0]}) is not on this host: not "
                             "checked here; the training node must see it")
        return check
    check.errors += [missing_prefix(p) for p in prefixes if p not in present]
    lengths = {}
    for p in sorted(present):
        try:
            lengths[p] = sequence_lengths(p)
        except (OSError, PreflightError) as err:
            check.errors.append(str(err))
    if tokenizer is not None:
        _check_tokenizer({str(Path(p).parent) for p in lengths}, tokenizer, spec.model_vocab_size, check.errors,
                         check.warnings)
    seq = spec.seq_length
    for use in uses:
        _check_weights(use, check.errors)
        name = SPLITS[use.split]
        held = {}  # prefix -> (documents, tokens) in this split
        for p in use.prefixes:
            if p in lengths:
                lo, hi = documents_in(use.bounds, len(lengths[p]))
                held[p] = (hi - lo, int(lengths[p][lo:hi].sum()))
        if len(held) < len(use.prefixes):
            continue  # named above
        check.tokens[name] = check.tokens.get(name, 0) + sum(t for _, t in held.values())
        split_note = f" at dataset.split {spec.split}" if use.where == "dataset.blend" else ""
        empty = [p for p, (docs, tokens) in held.items() if tokens <= 0]
        for p in empty:
            check.errors.append(f"{p}: its {name} split holds {held[p][0]} document(s){split_note} and "
                                f"{use.samples:,} samples are asked of it; give it more documents, or name each "
                                "split's data (kaiyuan.heldout for validation)")
        if empty:
            continue
        if use.weights is None and len(use.prefixes) > 1:
            # megatron-core reads each source once and weighs them by their sample counts
            per_source = {p: (tokens - 1) // seq for p, (_, tokens) in held.items()}
            short = [p for p, n in per_source.items() if n < 1]
            for p in short:
                check.errors.append(
                    f"{p}: its {name} split holds {held[p][1]:,} tokens, less than one sample of {seq + 1:,}; with "
                    f"null weights ({use.where}) megatron-core reads each source once and fails on a source without "
                    "a sample (an empty AssertionError): give weights (e.g. each prefix's tokens; kaiyuan.data=DIR "
                    "does that), a shorter dataset.seq_length, or more documents")
            # Megatron-Bridge cycles a GPT validation set; the train split is read once and would run dry
            if not short and use.split == 0 and sum(per_source.values()) < use.samples:
                check.errors.append(
                    f"{use.where} has null weights, so megatron-core reads its {len(per_source)} sources once: "
                    f"{sum(per_source.values()):,} {name} samples where the run asks {use.samples:,}; give weights "
                    "(the corpus is then repeated), or fewer train.train_iters")
            continue
        asked_tokens = use.samples * seq
        if use.split == 0:
            have = check.tokens[name]
            check.epochs, over = asked_tokens / have, f"over {len(held)} prefix(es)"
            if use.weights is not None and len(held) > 1:  # each source repeated as its share asks
                share = {p: w / sum(use.weights) for p, w in zip(use.prefixes, use.weights)}
                repeats = {p: asked_tokens * share[p] / max(held[p][1], 1) for p in held}
                most = max(repeats, key=lambda p: repeats[p])
                if repeats[most] > 1.01 * min(repeats.values()):  # weights other than the sources' token counts
                    check.epochs, over = repeats[most], f"of {most}, the most repeated of {len(held)} by its weight"
            if check.epochs > EPOCHS_WARNED:
                check.warnings.append(
                    f"the run reads {asked_tokens:,} train tokens from {have:,} (~{check.epochs:,.0f} epochs {over}): "
                    "a corpus this small is memorised; fewer train.train_iters or more data")
        if use.split == 1:
            fewest = min(held, key=lambda p: held[p][0])
            if held[fewest][0] < FEW_VALIDATION_DOCUMENTS:
                check.warnings.append(
                    f"validation reads {held[fewest][0]} document(s) of {fewest}{split_note} "
                    f"({sum(d for d, _ in held.values()):,} in all): its loss is mostly noise; give "
                    "kaiyuan.heldout (`kaiyuan data heldout`) or a larger validation share")
    return check


def run_samples(train_iters: int, global_batch_size: int, eval_interval: int | None, eval_iters: int,
                eval_global_batch_size: int | None = None, train_samples: int | None = None) -> tuple[int, int, int]:
    """The samples Megatron-Bridge asks of each split (data/loaders.py get_train_valid_test_num_samples)."""
    evaluations = train_iters // eval_interval + 1 if eval_interval else 0
    eval_batch = eval_global_batch_size if eval_global_batch_size is not None else global_batch_size
    train = train_samples if train_samples is not None else train_iters * global_batch_size
    return train, evaluations * eval_iters * eval_batch, eval_iters * eval_batch
