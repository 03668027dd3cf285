"""Every figure quoted in benchmarks/README.md and docs/*.md in the marked form is in the result file it cites.

The marked form: the figure in bold, then, later in the same table row or paragraph, a link to a `.json` file under
`results/`: `**42,775** tokens/s ([train_throughput](results/2026-12-01_train_throughput.json))`. The figure is
found when a number in the first such link's file, rounded to the figure's decimals, equals it (`**42,775**`
matches 42774.58). In benchmarks/README.md every bold number must cite a file."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_README = ROOT / "benchmarks" / "README.md"
DOCS = [BENCHMARKS_README, *sorted((ROOT / "docs").glob("*.md"))]
FIGURE = re.compile(r"\*\*(-?\d[\d,]*(?:\.\d+)?)\*\*")
JSON_LINK = re.compile(r"\]\(([^)\s]*results/[^)\s]+\.json)\)")


def numbers_in(value) -> list[float]:
    """Every number of a JSON document, at any depth (booleans are not figures)."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers_in(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers_in(v)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    return []


def blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each table row and each paragraph (its wrapped lines joined)."""
    out, joining = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("|") or not line.strip():
            if line.strip():
                out.append((number, line))
            joining = False
        elif joining:
            out[-1] = (out[-1][0], f"{out[-1][1]} {line}")
        else:
            out.append((number, line))
            joining = True
    return out


def quoted_figures(doc: Path) -> list[tuple[int, str, Path | None]]:
    """(line number, figure as written, the JSON it cites or None) for each bold figure of doc."""
    found = []
    for number, block in blocks(doc.read_text()):
        links = [(m.start(), (doc.parent / m.group(1)).resolve()) for m in JSON_LINK.finditer(block)]
        for figure in FIGURE.finditer(block):
            cited = next((path for start, path in links if start > figure.end()), None)
            found.append((number, figure.group(1), cited))
    return found


def in_file(figure: str, numbers: list[float]) -> bool:
    decimals = len(figure.partition(".")[2])
    value = float(figure.replace(",", ""))
    return any(round(n, decimals) == value for n in numbers)


def problems(doc: Path) -> list[str]:
    out = []
    for line, figure, cited in quoted_figures(doc):
        where = f"{doc.relative_to(ROOT)}:{line}: **{figure}**"
        if cited is None:
            if doc == BENCHMARKS_README:
                out.append(f"{where} cites no result file (a link to results/*.json after it in its row or paragraph)")
        elif not cited.is_file():
            out.append(f"{where} cites {cited.relative_to(ROOT)}, which does not exist")
        elif not in_file(figure, numbers_in(json.loads(cited.read_text()))):
            out.append(f"{where} is not a number of {cited.relative_to(ROOT)}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quoted_figure_is_in_the_file_it_cites(doc):
    assert problems(doc) == []


def test_the_benchmarks_readme_quotes_figures():
    assert sum(cited is not None for _, _, cited in quoted_figures(BENCHMARKS_README)) >= 10


def test_a_figure_absent_from_its_file_or_citing_nothing_is_reported(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    (results / "r.json").write_text(json.dumps({"run": {"tokens_per_s": 42774.58, "ok": True}, "gb": [57.52]}))
    doc = tmp_path / "README.md"
    doc.write_text("| a | **42,775** | **57.5** | [r](results/r.json) |\n"
                   "**42,776** tokens/s ([r](results/r.json)); **1** ([r](results/r.json))\n\n"
                   "**3** ([gone](results/gone.json));\n**7** alone, a wrapped line of the same paragraph\n\n"
                   "**57.5** GB, its file on the next line\n([r](results/r.json))\n")
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "BENCHMARKS_README", doc)
    assert problems(doc) == ["README.md:2: **42,776** is not a number of results/r.json",
                             "README.md:2: **1** is not a number of results/r.json",  # true is not 1
                             "README.md:4: **3** cites results/gone.json, which does not exist",
                             "README.md:4: **7** cites no result file (a link to results/*.json after it in its row or "
                             "paragraph)"]
