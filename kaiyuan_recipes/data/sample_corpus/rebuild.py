"""Rebuild the bundled sample corpus (not used at run time; documents where the texts come from).

English: The Jargon File 4.4.7 (Eric S. Raymond et al.) — public domain (Debian package jargon-text).
Chinese: 唐诗三百首 (Three Hundred Tang Poems, compiled 1763) and 100 Song ci — classical texts in the
public domain, as collected in Debian's fortunes-zh package (files tang300, song100).

usage: apt-get download jargon-text fortunes-zh && dpkg -x <each>.deb x
       python rebuild.py x  (writes en_jargon.parquet, zh_poems.parquet beside this file)"""

from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def jargon_documents(root: Path, target_chars: int = 3000) -> list[str]:
    text = gzip.open(root / "usr/share/doc/jargon-text/jargon.txt.gz", "rt", encoding="utf-8", errors="replace").read()
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    docs, current = [], []
    for para in paragraphs:
        current.append(para)
        if sum(map(len, current)) >= target_chars:
            docs.append("\n\n".join(current))
            current = []
    if current:
        docs.append("\n\n".join(current))
    return docs


def poem_documents(root: Path) -> list[str]:
    docs = []
    for name in ("tang300", "song100"):
        raw = (root / "usr/share/games/fortunes" / name).read_text(encoding="utf-8")
        docs += [ANSI.sub("", d).strip() for d in raw.split("\n%\n") if ANSI.sub("", d).strip()]
    return docs


def write(name: str, docs: list[str], source: str) -> None:
    table = pa.table({"text": docs, "source": [source] * len(docs)})
    pq.write_table(table, HERE / name, compression="zstd", row_group_size=256)


if __name__ == "__main__":
    root = Path(sys.argv[1])
    write("en_jargon.parquet", jargon_documents(root), "jargon-file-4.4.7 (public domain)")
    write("zh_poems.parquet", poem_documents(root), "tang300+song100 (public domain classical poems)")
