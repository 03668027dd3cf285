"""The Python warnings upstream raises on every import where Transformer Engine / Apex are absent ("… are not
installed. Falling back to …" from a dozen megatron-core modules, torch.jit's deprecation): about the installed
environment, never about the command at hand (`kaiyuan doctor` reports what is installed). Ground floor: the CLI
and the conversion workers' forkserver ignore them; a training worker keeps every warning raised while a module is
imported (raised_while_importing) in its full log instead (training/run_logging.py)."""

from __future__ import annotations

import sys
import warnings


def ignore_upstream_warnings() -> None:
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")


def raised_while_importing() -> bool:
    """Whether the warning being shown comes from a module's import (importlib's frames are on the stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False
