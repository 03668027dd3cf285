"""`kaiyuan.data=DIR` or `[DIR1, DIR2]`: directories `kaiyuan data convert` wrote, as one Megatron blend (every shard,
weighed by tokens unless weights are given) and the tokenizer their manifests record. Cheap and megatron-free: a launch
host resolves it without building a Megatron config."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kaiyuan_recipes.data.blend import BlendError, load_source
from kaiyuan_recipes.data.preflight import MANIFEST, DataTokenizer, PreflightError, closest_dir, data_tokenizer


@dataclass(frozen=True)
class ConvertedData:
    """One or more `kaiyuan data convert` output directories as a Megatron blend."""

    dirs: list[str]
    prefixes: list[str]
    weights: list[float]
    tokens: list[int]  # per directory
    tokenizer: DataTokenizer

    @property
    def blend(self) -> tuple[list[str], list[float]]:
        return list(self.prefixes), list(self.weights)


def resolve_data_dirs(dirs: Sequence[str], weights: Sequence[float] | None = None) -> ConvertedData:
    """Every shard of each converted directory; a directory weighs by its tokens unless `weights` (one positive
    number per directory) says otherwise, and inside a directory each shard by its tokens. The directories must share
    one tokenizer (their manifests' sha256)."""
    dirs = [str(d) for d in dirs]
    if not dirs:
        raise PreflightError("kaiyuan.data: no directory given")
    if weights is not None:
        if len(weights) != len(dirs):
            raise PreflightError(f"kaiyuan.data_weights: {len(weights)} weight(s) for {len(dirs)} director"
                                 f"{'y' if len(dirs) == 1 else 'ies'} ({', '.join(dirs)}); give one per directory")
        for d, w in zip(dirs, weights):
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
                raise PreflightError(f"kaiyuan.data_weights: {w!r} for {d} is not a positive finite number")
    sources = []
    for d in dirs:
        if not Path(d).expanduser().is_dir():
            raise PreflightError(f"kaiyuan.data: {d} is not a directory{closest_dir(Path(d).expanduser())} "
                                 "(expected what `kaiyuan data convert --output-dir` wrote)")
        try:
            sources.append(load_source(d, str(Path(d).expanduser().resolve())))  # the ranks may run elsewhere
        except BlendError as err:
            raise PreflightError(f"kaiyuan.data: {err}") from None
    tokenizers = [data_tokenizer(Path(d).expanduser()) for d in dirs]
    for d, tok in zip(dirs, tokenizers):
        if tok is None:
            raise PreflightError(f"kaiyuan.data: {d}/{MANIFEST} records no tokenizer; convert it again with "
                                 "`kaiyuan data convert`")
    shas = {tok.sha256 for tok in tokenizers}
    if len(shas) > 1:
        a, b = tokenizers[0], next(t for t in tokenizers if t.sha256 != tokenizers[0].sha256)
        raise PreflightError(f"kaiyuan.data: {dirs[0]} was converted with {a.directory} (sha256 {a.sha256}) but "
                             f"{dirs[tokenizers.index(b)]} with {b.directory} (sha256 {b.sha256}); one run reads one "
                             "vocabulary: convert both with the same --tokenizer")
    raw = [float(s.total_tokens) for s in sources] if weights is None else [float(w) for w in weights]
    for d, s in zip(dirs, sources):
        if s.total_tokens <= 0:
            raise PreflightError(f"kaiyuan.data: {d} holds no tokens")
    total = sum(raw)
    prefixes, shard_weights = [], []
    for w, src in zip(raw, sources):
        for prefix, tokens in zip(src.prefixes, src.tokens):
            if tokens > 0:  # an empty shard would be a zero weight, which megatron-core rejects
                prefixes.append(prefix)
                shard_weights.append(w / total * tokens / src.total_tokens)
    return ConvertedData(dirs, prefixes, shard_weights, [s.total_tokens for s in sources], tokenizers[0])


def choose_tokenizer(data: ConvertedData, given: str | None) -> tuple[str | None, str]:
    """The tokenizer directory a run on `data` trains with, and why: `given` (kaiyuan.tokenizer) when its
    tokenizer.json is the one the data was converted with; else the directory the manifest names, when it is here and
    unchanged. None: the bundled tokenizer, when the data was converted with it (the caller materialises it). A
    mismatch or a tokenizer that cannot be found is refused, naming both."""
    from kaiyuan_recipes.data.tokenizer import sha256_of

    recorded = data.tokenizer
    if given:
        path = Path(given).expanduser() / "tokenizer.json"
        if not path.is_file():
            raise PreflightError(f"kaiyuan.tokenizer: {given} is not a tokenizer directory (no tokenizer.json)")
        sha = sha256_of(path)
        if sha != recorded.sha256:
            raise PreflightError(
                f"kaiyuan.tokenizer={given} (tokenizer.json sha256 {sha}) is not the tokenizer {data.dirs[0]} was "
                f"converted with ({recorded.directory}, sha256 {recorded.sha256}): drop kaiyuan.tokenizer to train "
                "with the data's, or convert the data again with --tokenizer " + str(given))
        return str(given), f"kaiyuan.tokenizer, as recorded in {data.dirs[0]}/{MANIFEST}"
    here = Path(recorded.directory) / "tokenizer.json"
    if here.is_file() and sha256_of(here) == recorded.sha256:
        return recorded.directory, f"as recorded in {data.dirs[0]}/{MANIFEST}"
    if recorded.sha256 == bundled_tokenizer_sha256():
        return None, f"the bundled Qwen2 tokenizer, as recorded in {data.dirs[0]}/{MANIFEST}"
    raise PreflightError(f"{data.dirs[0]} was converted with {recorded.directory} (sha256 {recorded.sha256}), which is "
                         "not on this host (or has changed): give kaiyuan.tokenizer=DIR holding that tokenizer")


def bundled_tokenizer_sha256() -> str:
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir, tokenizer_fingerprint

    return tokenizer_fingerprint(default_tokenizer_dir())
