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
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query ``[heads, head_dim]`` over ``keys``/``values [n, kv_heads, head_dim]``.

    Returns ``[heads * head_dim]``, written into ``out`` when given. Query head ``h`` reads
    key/value head ``h // (heads // kv_heads)``, as ``transformers``' ``repeat_kv``
    arranges it.
    """
    return _attend(query, keys.permute(1, 2, 0), values.permute(1, 0, 2), scale, out)


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
    # The same views attend() makes of keys[:end], made once: a decode step runs this for
    # every sequence in every layer, so each op saved per row counts (tests/inference/
    # test_attention.py holds the bits equal to the plain formulation).
    keys_t, values_t = keys.permute(1, 2, 0), values.permute(1, 0, 2)
    for i in range(rows):
        end = start + i + 1
        _attend(queries[i], keys_t[:, :, :end], values_t[:, :end], scale, out[i])
    return out


def _attend(
    query: torch.Tensor,
    keys_t: torch.Tensor,
    values_t: torch.Tensor,
    scale: float,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`attend` over ``keys_t [kv_heads, head_dim, n]`` and ``values_t [kv_heads, n,
    head_dim]``: ``softmax(q k^T * scale) v`` as batched products, one per key/value head."""
    heads, head_dim = query.shape
    kv_heads = keys_t.shape[0]
    grouped = query.reshape(kv_heads, heads // kv_heads, head_dim)
    scores = torch.bmm(grouped, keys_t)
    scores.mul_(scale)
    probs = torch.softmax(scores, dim=-1)
    if out is None:
        return torch.bmm(probs, values_t).reshape(heads * head_dim)
    torch.bmm(probs, values_t, out=out.view(kv_heads, heads // kv_heads, head_dim))
    return out
