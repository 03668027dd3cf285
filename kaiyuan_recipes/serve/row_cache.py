"""The batch decoder's KV cache: one [max_batch, kv heads, max_seq_len, head dim] pair per layer, each row its own
timeline, behind transformers' cache protocol (RowKVCache), and one layer's view of it in a decode step
(LayerRows, what a regionally compiled decoder layer is given)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class RowKVCache:
    """transformers' cache protocol as decoder layers call it (update(key, value, layer_idx) -> the keys and
    values to attend to), over one [max_batch, kv heads, max_seq_len, head dim] pair per layer, allocated at
    the first update. Before each forward the decoder says what it writes: `prefill(rows)` (each row's
    prompt from column 0; attention over the fresh keys, causal) or `decode(rows, columns, window)` (one
    token per row at its own column; attention over the first len(window) columns, masked by the caller).
    The window is a tensor, not an int, so a compiled step sees its length as a dynamic size, not a constant
    that each bucket would recompile for."""

    is_compileable = False

    def __init__(self, max_batch: int, max_seq_len: int):
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.rows: torch.Tensor | None = None
        self.columns: torch.Tensor | None = None  # None: prefill
        self.window: torch.Tensor | None = None

    def prefill(self, rows: torch.Tensor) -> None:
        self.rows, self.columns = rows, None

    def decode(self, rows: torch.Tensor, columns: torch.Tensor, window: torch.Tensor) -> None:
        self.rows, self.columns, self.window = rows, columns, window

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx == len(self.keys):
            shape = (self.max_batch, key.shape[1], self.max_seq_len, key.shape[3])
            self.keys.append(torch.zeros(shape, dtype=key.dtype, device=key.device))
            self.values.append(torch.zeros(shape, dtype=value.dtype, device=value.device))
        if self.columns is not None:
            return self.layer(layer_idx).update(key, value, layer_idx)
        self.keys[layer_idx][self.rows, :, : key.shape[2]] = key
        self.values[layer_idx][self.rows, :, : value.shape[2]] = value
        return key, value

    def layer(self, index: int) -> "LayerRows":
        """Layer `index`'s cache in the current decode step (what a regionally compiled layer is given)."""
        return LayerRows(self.keys[index], self.values[index], self.rows, self.columns, self.window)

    # what transformers' mask creation asks of a cache (prefill only: decode passes its own 4D mask)
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return query_length, 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


@dataclass
class LayerRows:
    """One layer's keys and values in a decode step, as its update() sees them: the tensors themselves, not
    an index into the cache's lists (a compiled layer would specialise on the index and compile again for
    every layer); the layer_idx that the layer passes is ignored."""

    keys: torch.Tensor
    values: torch.Tensor
    rows: torch.Tensor
    columns: torch.Tensor
    window: torch.Tensor

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys[self.rows, :, self.columns] = key[:, :, 0]
        self.values[self.rows, :, self.columns] = value[:, :, 0]
        rows, length = key.shape[0], self.window.shape[0]
        return self.keys[:rows, :, :length], self.values[:rows, :, :length]
