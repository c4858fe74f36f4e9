"""Causal grouped-query attention, one query row at a time, against one sequence's cache.

Why one row at a time: the result for a query must be a function of that query and the
keys/values before it, never of how many other queries were computed alongside it. A
batched ``[rows, keys]`` score matrix with a causal mask breaks that twice over: the
matrix multiply may round differently with the number of rows, and the softmax and the
``P·V`` sum run over the padded key length, so the order of additions changes with it.
Here a row at position ``p`` always runs the same operations on the same shapes
(``p + 1`` keys), whether it comes from a one-shot prefill, a prefill after a cached
prefix, or a decode step in any batch, so all three give the same bits.
"""

from __future__ import annotations

import torch

__all__ = ["attend", "attend_sequence"]


def attend(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query ``[heads, head_dim]`` over ``keys``/``values [n, kv_heads, head_dim]``.

    Returns ``[heads * head_dim]``. Query head ``h`` reads key/value head
    ``h // (heads // kv_heads)``, as ``transformers``' ``repeat_kv`` arranges it.
    """
    heads, head_dim = query.shape
    kv_heads = keys.shape[1]
    grouped = query.reshape(kv_heads, heads // kv_heads, head_dim)
    scores = torch.matmul(grouped, keys.permute(1, 2, 0)) * scale
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, values.permute(1, 0, 2))
    return out.reshape(heads * head_dim)


def attend_sequence(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    start: int,
    scale: float,
) -> torch.Tensor:
    """Queries ``[n, heads, head_dim]`` at positions ``start .. start+n``, causally.

    ``keys``/``values`` are the sequence's cache tensors with those positions already
    written; row ``i`` attends to positions ``0 .. start+i``. Returns ``[n, heads*head_dim]``.
    """
    rows = queries.shape[0]
    out = torch.empty((rows, queries.shape[1] * queries.shape[2]), dtype=queries.dtype)
    for i in range(rows):
        end = start + i + 1
        out[i] = attend(queries[i], keys[:end], values[:end], scale)
    return out
