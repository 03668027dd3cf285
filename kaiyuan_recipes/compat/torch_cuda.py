"""Workarounds for PyTorch's CUDA module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def graph_capture(graph: Any, **kwargs: Any) -> Iterator[None]:
    """torch.cuda.graph(graph, **kwargs), with the current stream back as it was when the capture fails.
    A capture that CUDA invalidated (e.g. a host sync inside it) fails in capture_end, and torch.cuda.graph's
    __exit__ calls capture_end before leaving its stream context: its capture stream stays current."""
    import torch  # (compat is imported by the base install, which has no torch)

    stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, **kwargs):
            yield
    except BaseException:
        torch.cuda.set_stream(stream)
        raise
