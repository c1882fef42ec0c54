"""An LRU of embedding rows keyed by the exact input, per model (off unless configured)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np
import numpy.typing as npt


class EmbeddingCache:
    def __init__(self, size: int, on_lookup: Callable[[bool], None] | None = None) -> None:
        """`on_lookup(hit)` is told of every `get` (the pool's hit/miss counters)."""
        self.size = size
        self._on_lookup = on_lookup
        self._rows: OrderedDict[Hashable, tuple[npt.NDArray[np.float32], int]] = OrderedDict()

    def get(self, key: Hashable) -> tuple[npt.NDArray[np.float32], int] | None:
        """(row, token count) for an input seen before."""
        found = self._rows.get(key)
        if self._on_lookup is not None:
            self._on_lookup(found is not None)
        if found is not None:
            self._rows.move_to_end(key)
        return found

    def put(self, key: Hashable, row: npt.NDArray[np.float32], tokens: int) -> None:
        if self.size <= 0:
            return
        self._rows[key] = (row, tokens)
        self._rows.move_to_end(key)
        while len(self._rows) > self.size:
            self._rows.popitem(last=False)

    def clear(self) -> None:
        self._rows.clear()
