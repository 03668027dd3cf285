"""The document's building blocks: a section is a list of entries, each a table, prose or an image, and each table or
prose names the result file it reads and how its figures come out of that file's JSON (a Callable on the data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

Data = dict[str, Any]


@dataclass
class Table:
    """A table from one result file: its caption, its header, and rows(data) -> the cells of each row."""

    file: str
    caption: str | Callable[[Data], str]
    header: list[str] | Callable[[Data], list[str]]
    rows: Callable[[Data], list[list[str]]]
    after: str | Callable[[Data], str] = ""


@dataclass
class Text:
    """Prose whose figures come from one result file (file None: prose with no figure)."""

    file: str | None
    text: str | Callable[[Data], str]
    bullet: bool = False


@dataclass
class Image:
    path: str
    alt: str


@dataclass
class Section:
    title: str
    entries: list = field(default_factory=list)


def value_of(spec: str | Callable[[Data], str], data: Data) -> str:
    return spec(data) if callable(spec) else spec

