"""The Python warnings upstream raises on every import where Transformer Engine / Apex are absent ("… are not
installed. Falling back to …" from a dozen megatron-core modules, torch.jit's deprecation): about the installed
environment, never about the command at hand (`kaiyuan doctor` reports what is installed). Ground floor: the CLI
and the conversion workers' forkserver ignore them; a training worker keeps them in its full log instead
(training/run_logging.py)."""

from __future__ import annotations

import warnings


def ignore_upstream_warnings() -> None:
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")
