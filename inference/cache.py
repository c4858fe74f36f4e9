"""The key/value cache of one sequence.

Each sequence owns its cache; sequences never share a tensor, so attention for one can
never see (or be shaped by) another. Per layer, keys and values are stored token-major,
``[capacity, kv_heads, head_dim]``: the first ``n`` positions are then one contiguous block
whose layout does not depend on the capacity, so attention over them runs on the same
memory layout however the cache grew. Capacity grows in whole blocks of :data:`GROW`
positions; rows beyond :attr:`SequenceCache.length` are scratch.
"""

from __future__ import annotations

import torch

__all__ = ["GROW", "SequenceCache"]

GROW = 256


class SequenceCache:
    """Per-layer K/V of one sequence, its :attr:`length` in tokens, and prefix operations."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int) -> None:
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.length = 0
        empty = (0, kv_heads, head_dim)
        self.keys = [torch.empty(empty, dtype=torch.float32) for _ in range(num_layers)]
        self.values = [torch.empty(empty, dtype=torch.float32) for _ in range(num_layers)]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more positions after :attr:`length`."""
        needed = self.length + extra
        if needed <= self.capacity:
            return
        capacity = -(-needed // GROW) * GROW
        for layer in range(self.num_layers):
            self.keys[layer] = self._regrown(self.keys[layer], capacity)
            self.values[layer] = self._regrown(self.values[layer], capacity)

    def _regrown(self, old: torch.Tensor, capacity: int) -> torch.Tensor:
        new = torch.zeros((capacity, self.kv_heads, self.head_dim), dtype=torch.float32)
        new[: self.length] = old[: self.length]
        return new

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``keys``/``values [n, kv_heads, head_dim]`` at positions ``start .. start+n``."""
        end = start + keys.shape[0]
        if end > self.capacity:
            raise ValueError(f"write up to {end} exceeds capacity {self.capacity}; reserve first")
        self.keys[layer][start:end] = keys
        self.values[layer][start:end] = values

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (keeps a prefix for reuse)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length

    def clone(self) -> SequenceCache:
        """An independent copy of the first :attr:`length` positions."""
        copy = SequenceCache(self.num_layers, self.kv_heads, self.head_dim)
        copy.reserve(self.length)
        for layer in range(self.num_layers):
            copy.keys[layer][: self.length] = self.keys[layer][: self.length]
            copy.values[layer][: self.length] = self.values[layer][: self.length]
        copy.length = self.length
        return copy
