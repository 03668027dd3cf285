"""A generated parquet corpus with known contents, for the cleaning tests and benchmarks/clean_throughput.py: clean
documents (pseudo-word prose that passes every shipped heuristic), and planted exact duplicates, near-duplicates at
chosen word-5-gram Jaccard similarities (measured with datatrove's own shingling), and low-quality documents each
made to fail one named step first. `Plant` says what each step should remove."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STOP = ("the", "and", "of", "to", "that", "with", "in", "for", "was", "is", "as", "on", "be", "have")
CONSONANTS, VOWELS = "bcdfghklmnprstvz", "aeiou"


@dataclass
class Plant:
    files: list[Path] = field(default_factory=list)
    clean_ids: list[str] = field(default_factory=list)        # must all survive (one copy of each exact duplicate)
    removed_by: dict[str, list[str]] = field(default_factory=dict)  # step -> ids made to fail that step first
    near_pairs: list[dict[str, Any]] = field(default_factory=list)  # {base, variant, target, jaccard}
    texts: dict[str, str] = field(default_factory=dict)

    def expected_minhash(self, detection) -> tuple[float, float]:
        """Mean and standard deviation of the near-duplicates MinHash removes (one per detected pair)."""
        ps = [detection(p["jaccard"]) for p in self.near_pairs]
        return sum(ps), sum(p * (1 - p) for p in ps) ** 0.5


class ProseGenerator:
    def __init__(self, seed: int, vocab_size: int = 20000):
        self.rng = random.Random(seed)
        words = set()
        while len(words) < vocab_size:
            n = self.rng.randint(2, 4)
            words.add("".join(self.rng.choice(CONSONANTS) + self.rng.choice(VOWELS) for _ in range(n)))
        self.vocab = sorted(words)

    def word(self) -> str:
        return self.rng.choice(self.vocab)

    def sentence(self) -> str:
        n = self.rng.randint(9, 15)
        words = [self.rng.choice(STOP) if self.rng.random() < 0.3 else self.word() for _ in range(n)]
        words[0] = words[0].capitalize()
        return " ".join(words) + "."

    def paragraph(self) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(2, 4)))

    def document(self, paragraphs: tuple[int, int] = (6, 10)) -> str:
        # single newlines: C4's line filter rewrites a document with blank lines, and clean ones must come out as is
        return "\n".join(self.paragraph() for _ in range(self.rng.randint(*paragraphs)))


def shingles(text: str, ngrams: int = 5, language: str = "en") -> set[int]:
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature

    from kaiyuan_recipes.data.clean.pipeline import hash_config

    sig = MinhashDedupSignature("/nonexistent-unused", MinhashConfig(n_grams=ngrams, hash_config=hash_config()),
                                language=language)
    return set(sig.get_shingles(text).ravel().tolist())


def jaccard(a: str, b: str, ngrams: int = 5) -> float:
    sa, sb = shingles(a, ngrams), shingles(b, ngrams)
    return len(sa & sb) / len(sa | sb)


def near_duplicate(gen: ProseGenerator, base: str, target: float, ngrams: int = 5) -> tuple[str, float]:
    """`base` with words replaced by fresh ones, spread out, until the word-n-gram Jaccard is as close to `target`
    as whole replacements allow. Each replacement (away from others) swaps `ngrams` shingles for new ones."""
    words = base.split(" ")
    total = len(shingles(base, ngrams))
    replace = max(1, round(total * (1 - target) / (ngrams * (1 + target))))
    step = max(1, len(words) // replace)
    positions = [min(len(words) - 1, step // 2 + i * step) for i in range(replace)]
    out = list(words)
    for pos in positions:
        tail = "." if out[pos].endswith(".") else ""
        head = out[pos].rstrip(".")
        new = gen.word()
        out[pos] = (new.capitalize() if head[:1].isupper() else new) + tail
    text = " ".join(out)
    return text, jaccard(base, text, ngrams)


def low_quality(gen: ProseGenerator, kind: str) -> str:
    if kind == "length":
        return gen.sentence()[:60]
    if kind == "gopher_repetition":
        line = gen.paragraph()
        return "\n".join([line] * 8 + [gen.paragraph()])
    if kind == "gopher_quality":  # symbol soup
        symbols = "#$%&*@!~^+=<>|"
        return "\n".join(" ".join("".join(gen.rng.choice(symbols) for _ in range(gen.rng.randint(2, 6)))
                                  for _ in range(12)) for _ in range(10))
    if kind == "c4":  # boilerplate: a menu of one-word lines and a cookie notice around two sentences
        menu = [gen.word().capitalize() for _ in range(30)]
        notice = "This site uses cookies to improve the service and your experience."
        return "\n".join(menu[:15] + [gen.sentence(), notice, gen.sentence()] + menu[15:])
    if kind == "fineweb":  # one sentence on two lines: far under Gopher's repetition bounds, over FineWeb's 1 %
        paras, line = [gen.paragraph() for _ in range(12)], gen.sentence()
        return "\n".join(paras[:4] + [line] + paras[4:8] + [line] + paras[8:])
    raise ValueError(kind)


LOW_QUALITY_STEPS = ("length", "gopher_repetition", "gopher_quality", "c4", "fineweb")


def write_corpus(out_dir: Path, files: int = 4, clean_per_file: int = 60, exact_groups: int = 8,
                 near: dict[float, int] | None = None, low_per_step: int = 4, seed: int = 0,
                 with_rank: bool = True) -> Plant:
    """The corpus, spread over `files` parquet files with columns id, text (and rank)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    near = {0.95: 8, 0.85: 8, 0.6: 8} if near is None else near
    gen = ProseGenerator(seed)
    plant = Plant(removed_by={s: [] for s in ("exact_dedup", *LOW_QUALITY_STEPS)})
    rows: list[list[tuple[str, str]]] = [[] for _ in range(files)]

    def put(doc_id: str, text: str) -> None:
        rows[gen.rng.randrange(files)].append((doc_id, text))
        plant.texts[doc_id] = text

    for f in range(files):
        for i in range(clean_per_file):
            put(f"clean-{f}-{i}", gen.document())
            plant.clean_ids.append(f"clean-{f}-{i}")
    for g in range(exact_groups):  # 1 or 2 extra copies of a clean document
        doc_id = f"exact-{g}"
        text = gen.document()
        put(doc_id, text)
        plant.clean_ids.append(doc_id)
        for c in range(1 + g % 2):
            put(f"{doc_id}-copy{c}", text)
            plant.removed_by["exact_dedup"].append(f"{doc_id}-copy{c}")
    for target, count in near.items():
        for k in range(count):
            base = gen.document((10, 14))
            variant, j = near_duplicate(gen, base, target)
            a, b = f"near-{target}-{k}-a", f"near-{target}-{k}-b"
            put(a, base)
            put(b, variant)
            plant.near_pairs.append({"base": a, "variant": b, "target": target, "jaccard": j})
    for step in LOW_QUALITY_STEPS:
        for k in range(low_per_step):
            doc_id = f"low-{step}-{k}"
            put(doc_id, low_quality(gen, step))
            plant.removed_by[step].append(doc_id)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f, file_rows in enumerate(rows):
        gen.rng.shuffle(file_rows)
        columns: dict[str, Any] = {"id": [r[0] for r in file_rows], "text": [r[1] for r in file_rows]}
        if with_rank:
            columns["rank"] = [float(i) for i in range(len(file_rows))]
        path = out_dir / f"part-{f:05d}.parquet"
        pq.write_table(pa.table(columns), path, row_group_size=64)
        plant.files.append(path)
    return plant
