"""Workarounds for NeMo-Run (nemo-run)."""

from __future__ import annotations


class NoQuote(str):
    """An srun argument NeMo-Run leaves unquoted on purpose (its log paths hold ${SLURM_RESTART_COUNT:-0}); it
    stays one through the `.replace(job, job)` NeMo-Run applies to the --output path."""

    def replace(self, old: str, new: str, count: int = -1) -> "NoQuote":  # type: ignore[override]
        return NoQuote(str.replace(self, old, new, count))


def quote_srun_arguments() -> bool:
    """NeMo-Run 0.11.1 builds the sbatch script's srun line as `arg if isinstance(arg, noquote) else
    shlex.quote(arg)`, but defines `noquote: TypeAlias = str` (core/execution/slurm.py): every string is "noquote",
    so no srun argument is quoted and a container image, a mount or the --chdir directory reaches the script as
    shell code (`img$(cmd)` runs on the node; a space splits a path). Make noquote the marker class it is meant to
    be: only what NeMo-Run wraps in noquote() (the srun log paths) stays as written, the rest is shlex-quoted as
    upstream intends.
    Returns True where upstream still has the defect (patched now or before)."""
    from nemo_run.core.execution import slurm

    if slurm.noquote is str:
        slurm.noquote = NoQuote
    return slurm.noquote is NoQuote
