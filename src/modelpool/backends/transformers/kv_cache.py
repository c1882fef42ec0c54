"""The batch's KV cache: each layer's keys and values live in a buffer with spare columns,
so a decode step writes its one new column in place instead of copying the whole cache.

transformers' `DynamicLayer` appends by `torch.cat`: every decode step copied every layer's
whole K/V to add one column (~5–6% of a 16–32 stream step on SmolLM2-135M, growing with
the length). `SpareLayer` keeps a buffer `[rows, heads, capacity, head_dim]`, writes new
columns after the used ones, and hands attention a view of the used part. When the buffer
is full it is re-allocated with a quarter of the used length spare (16 to 256 columns), so
a copy happens every few steps and not every step, and the spare is bounded: at most
`used / 4` columns, and never more than `MAX_SPARE`.

Rows joining or leaving the batch (`join_rows`, `keep_rows`) rebuild the buffers once; any
other code that replaces a layer's `keys`/`values` (transformers' own `crop`,
`batch_repeat_interleave`, `reorder_cache`) goes through the property setters, which drop
the buffer: the next `update` copies the new tensors into a fresh one.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

MIN_SPARE = 16
MAX_SPARE = 256


def spare_columns(used: int) -> int:
    """Columns a re-allocated buffer keeps beyond `used`: a quarter of it, 16 to 256."""
    return max(MIN_SPARE, min(MAX_SPARE, used // 4))


class SpareLayer(DynamicLayer):  # type: ignore[no-untyped-call]  # (transformers' __init_subclass__)
    """A `DynamicLayer` whose `keys`/`values` are views of buffers with spare columns."""

    def __init__(self, **kwargs: Any) -> None:
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._used = 0
        self._loose_keys: torch.Tensor | None = None
        self._loose_values: torch.Tensor | None = None
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    # transformers reads and assigns `keys`/`values` directly; the views keep that working.
    @property
    def keys(self) -> torch.Tensor | None:
        if self._key_buffer is not None:
            return self._key_buffer[:, :, : self._used]
        return self._loose_keys

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._loose_keys, self._key_buffer = tensor, None

    @property
    def values(self) -> torch.Tensor | None:
        if self._value_buffer is not None:
            return self._value_buffer[:, :, : self._used]
        return self._loose_values

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._loose_values, self._value_buffer = tensor, None

    @property
    def capacity(self) -> int:
        """Columns the buffers hold, used and spare (0 without buffers)."""
        return 0 if self._key_buffer is None else self._key_buffer.shape[2]

    def held_bytes(self) -> int:
        """Bytes of this layer's buffers, spare columns included."""
        buffers = (self._key_buffer, self._value_buffer)
        return sum(b.numel() * b.element_size() for b in buffers if b is not None)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held = self.held()
        start = 0 if held is None else held[0].shape[2]
        end = start + key_states.shape[2]
        if self._key_buffer is None or end > self.capacity:
            self._allocate([held] if held is not None else [], key_states, value_states, start, end)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[:, :, start:end].copy_(key_states)
        self._value_buffer[:, :, start:end].copy_(value_states)
        self._used = end
        return self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]

    def stack_rows(self, parts: list[tuple[torch.Tensor, torch.Tensor]], width: int) -> None:
        """Hold `parts` (each one's K/V, left-padded caches) one under the other, each padded
        on the left to `width` columns with zeros (masked out, but finite: a NaN there
        would still poison the row's softmax)."""
        keys, values = parts[0]
        self._allocate(parts, keys, values, width, width)
        self._used = width

    def keep_rows(self, index: torch.Tensor, first: int) -> None:
        """Keep the rows `index`, and the columns from `first` on."""
        held = self.held()
        if held is None:
            return
        keys, values = (part.index_select(0, index)[:, :, first:] for part in held)
        self._allocate([(keys, values)], keys, values, keys.shape[2], keys.shape[2])
        self._used = keys.shape[2]

    def held(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The K/V held now (a view of the buffers, or tensors someone assigned), None if empty."""
        keys, values = self.keys, self.values
        if keys is None or values is None or keys.numel() == 0:
            return None
        return keys, values

    def _allocate(self, parts: list[tuple[torch.Tensor, torch.Tensor]], keys: torch.Tensor, values: torch.Tensor,
                  width: int, needed: int) -> None:  # fmt: skip
        """New buffers with room for `needed` columns and the spare, holding `parts` one
        under the other, each right-aligned at `width` columns (zeros on its left)."""
        rows = sum(part[0].shape[0] for part in parts) or keys.shape[0]
        capacity = needed + spare_columns(needed)
        key_buffer = keys.new_empty(rows, keys.shape[1], capacity, keys.shape[3])
        value_buffer = values.new_empty(rows, values.shape[1], capacity, values.shape[3])
        row = 0
        for part_keys, part_values in parts:
            below, pad = row + part_keys.shape[0], width - part_keys.shape[2]
            for buffer, part in ((key_buffer, part_keys), (value_buffer, part_values)):
                buffer[row:below, :, :pad].zero_()
                buffer[row:below, :, pad:width].copy_(part)
            row = below
        self._key_buffer, self._value_buffer = key_buffer, value_buffer


class SpareCache(DynamicCache):
    """A `DynamicCache` (what the models expect) whose layers are `SpareLayer`s."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = SpareLayer

    def stack_rows(self, other: SpareCache, width: int) -> None:
        """Append `other`'s rows under this cache's, both left-padded to `width` columns."""
        for layer, own in zip(self.layers, other.layers, strict=True):
            assert isinstance(layer, SpareLayer) and isinstance(own, SpareLayer)
            parts = [held for held in (layer.held(), own.held()) if held is not None]
            if parts:
                layer.stack_rows(parts, width)

    def keep_rows(self, index: torch.Tensor, first: int) -> None:
        """Keep the rows `index` (in that order) and the columns from `first` on."""
        for layer in self.layers:
            assert isinstance(layer, SpareLayer)
            layer.keep_rows(index, first)

    def held_bytes(self) -> int:
        """Bytes the buffers hold, spare columns included (for the memory tests and status)."""
        return sum(layer.held_bytes() for layer in self.layers if isinstance(layer, SpareLayer))
