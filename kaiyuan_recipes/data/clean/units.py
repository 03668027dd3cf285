"""The tasks of a cleaning run: each input file cut, at parquet row-group boundaries, into runs of consecutive row
groups of about `task_bytes` (uncompressed) each, one task per run. The cut depends only on the files' footers and
`task_bytes`, never on the worker count or the executor, so the same input always gives the same tasks, and the
same copy of a group of duplicates is kept (datatrove chooses it from the documents' task and position in it). A
file cut into n runs gives n output files, NAME-00000-of-0000n.parquet; a file of one run keeps its name."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kaiyuan_recipes.data.clean.inputs import CleanInputError, InputFile

# Large enough that a task's start-up (datatrove's logging, a spaCy model) is small beside its reading, small enough
# that a corpus file of a few gigabytes keeps a machine's cores busy.
DEFAULT_TASK_BYTES = 256 * 1024 * 1024
# Exact dedup keeps the earliest of identical documents by giving task r datatrove's document priority
# EXACT_DEDUP_MAX_TASKS - r (steps.InputOrderExactSignature), and that priority is 16 bits, from 1.
EXACT_DEDUP_MAX_TASKS = 65535


@dataclass(frozen=True)
class WorkUnit:
    input: str                   # the input file, relative to the input directory
    row_groups: tuple[int, int]  # [first, end) of its row groups
    first_row: int               # the file's row number of the first row of `first`: documents are named FILE#row
    output: str                  # the output file, relative to the output directory

    def to_dict(self) -> dict:
        return asdict(self) | {"row_groups": list(self.row_groups)}

    @classmethod
    def from_dict(cls, data: dict) -> WorkUnit:
        return cls(data["input"], tuple(data["row_groups"]), data["first_row"], data["output"])


def _cuts(groups: list[tuple[int, int]], task_bytes: int) -> list[tuple[int, int]]:
    runs, start, size = [], 0, 0
    for i, (_, nbytes) in enumerate(groups):
        size += nbytes
        if size >= task_bytes:
            runs.append((start, i + 1))
            start, size = i + 1, 0
    if start < len(groups) or not runs:
        runs.append((start, len(groups)))
    return runs


def _part_name(relative: str, k: int, n: int) -> str:
    return f"{relative.removesuffix('.parquet')}-{k:05d}-of-{n:05d}.parquet"


def plan_units(files: list[InputFile], task_bytes: int) -> list[WorkUnit]:
    """The tasks, in input order (check_inputs' sorted files, then row order)."""
    units: list[WorkUnit] = []
    for f in files:
        runs = _cuts(f.row_groups, task_bytes)
        offsets = [0]
        for rows, _ in f.row_groups:
            offsets.append(offsets[-1] + rows)
        for k, (first, end) in enumerate(runs):
            output = f.relative if len(runs) == 1 else _part_name(f.relative, k, len(runs))
            units.append(WorkUnit(f.relative, (first, end), offsets[first], output))
    named = {f.relative for f in files}
    seen: dict[str, str] = {}
    for u in units:
        if u.output in seen or (u.output != u.input and u.output in named):
            other = seen.get(u.output, u.output)
            raise CleanInputError(f"{u.input}: its part {u.output} has the name of the input file {other}; rename "
                                  "one or raise --task-bytes")
        seen[u.output] = u.input
    return units
