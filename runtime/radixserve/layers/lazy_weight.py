"""Checkpoint tensors read on demand, so a tensor-parallel rank reads only its shard: `narrow`
(and `[a:b]` on the first dim) compose into one block that is read from the safetensors file when
a layer copies it into its parameter."""
from __future__ import annotations

from typing import Any

import torch


class LazyWeight:
    def __init__(self, source: Any, shape: tuple[int, ...], ranges: tuple[tuple[int, int], ...] | None = None) -> None:
        self._source = source  # a safetensors slice (safe_open(...).get_slice(name))
        self._full_shape = shape
        self._ranges = ranges or tuple((0, n) for n in shape)

    @property
    def shape(self) -> torch.Size:
        return torch.Size(b - a for a, b in self._ranges)

    def dim(self) -> int:
        return len(self._ranges)

    def narrow(self, dim: int, start: int, length: int) -> LazyWeight:
        a, b = self._ranges[dim]
        if start < 0 or start + length > b - a:
            raise ValueError(f"narrow({dim}, {start}, {length}) outside a dimension of {b - a}")
        ranges = list(self._ranges)
        ranges[dim] = (a + start, a + start + length)
        return LazyWeight(self._source, self._full_shape, tuple(ranges))

    def __getitem__(self, key: slice) -> LazyWeight:
        start, stop, step = key.indices(self.shape[0])
        assert step == 1, "only contiguous first-dim slices"
        return self.narrow(0, start, stop - start)

    def load(self) -> torch.Tensor:
        if not self._ranges:  # a scalar
            return self._source[:]
        return self._source[tuple(slice(a, b) for a, b in self._ranges)]


def materialize(t: torch.Tensor | LazyWeight) -> torch.Tensor:
    return t.load() if isinstance(t, LazyWeight) else t
