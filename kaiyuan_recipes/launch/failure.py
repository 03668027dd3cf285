"""Why a run failed, from its log: what `kaiyuan status` shows for a failed run, and what a benchmark row of a
failed variant records. torchrun's own report (ChildFailedError) comes last and says only that a child failed,
and start-up logs exceptions it caught itself (optional imports without TE) before the real one: the cause is
the last exception a rank raised, or the last error it stated itself (`kaiyuan: error: …`, whichever came later)."""

from __future__ import annotations

import re
from pathlib import Path

# "ValueError: …", "[rank0]: RuntimeError: …", "torch.OutOfMemoryError: …", "….NonFiniteLossError: …", and
# "[default0]:RuntimeError: …" (torchrun --tee's prefix: role + local rank; NeMo-Run's launcher sets it)
EXCEPTION_LINE = re.compile(r"^(\[rank\d+\]: |\[[A-Za-z_]\w*?\d+\]:)?[\w.]*(Error|Exception|Interrupt)\b.*: ")
# what a rank says when it ends on a cause it knows (no CUDA GPU, a data set-up error), with the same prefixes
STATED_ERROR = re.compile(r"^(\[rank\d+\]: |\[[A-Za-z_]\w*?\d+\]:)?kaiyuan: error: ")
TAIL_BYTES = 1 << 20


def last_exception(text: str, lines_before: int = 0) -> str | None:
    """The last exception line a rank raised, with `lines_before` lines of context, or None."""
    lines = text.splitlines()
    raised = [i for i, line in enumerate(lines) if (EXCEPTION_LINE.match(line) and "ChildFailedError" not in line)
              or STATED_ERROR.match(line)]
    if not raised:
        return None
    last = STATED_ERROR.sub("", lines[raised[-1]])
    return "\n".join([*lines[max(0, raised[-1] - lines_before):raised[-1]], last])


def log_tail(path: Path, max_bytes: int = TAIL_BYTES) -> str:
    """The end of a log (a long run's log is large; the failure is at its end)."""
    with open(path, "rb") as fh:
        fh.seek(max(0, fh.seek(0, 2) - max_bytes))
        return fh.read().decode("utf-8", errors="replace")
