"""README.md and docs/ are a user's how-to and reference: within their size budget, and free of how the team reaches
its own GPU host (that tooling lives in lab/) and of session history."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
WORD_BUDGET = 12_000  # README.md + docs/*.md, counted as `wc -w` counts
README_BYTES = 12 * 1024
LAB_TERMS = re.compile(r"\blease\b|device call|\$OUT\b|/tmp/site|carry list|stage\.py|gpu-wheels|\bsession\b", re.I)


def test_readme_and_docs_within_their_budget():
    words = sum(len(page.read_text().split()) for page in PAGES)
    assert words <= WORD_BUDGET, f"README.md + docs/*.md hold {words:,} words, over {WORD_BUDGET:,}"
    assert (ROOT / "README.md").stat().st_size <= README_BYTES


def test_no_page_narrates_the_teams_gpu_host():
    found = [f"{page.relative_to(ROOT)}:{n}: {line.strip()}" for page in PAGES
             for n, line in enumerate(page.read_text().splitlines(), start=1) if LAB_TERMS.search(line)]
    assert not found, "\n".join(found)
