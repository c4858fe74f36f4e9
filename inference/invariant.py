"""Batch-invariant matrix multiplies: the paths the start-up self-test
(:mod:`inference.self_test`) chooses from.

A pinned request must return the same bytes alone or in any batch, so every row of every
linear layer must come out bit-identical however many rows are multiplied with it. Stock
``F.linear`` does not promise that: on this project's CPU build (MKL), the rows of a
``[1, k]``, ``[16, k]`` and ``[64, k]`` product differ in the last bits, and
``MKL_CBWR=AVX2,STRICT`` did not change that. What was bit-exact in our measurements is
the fixed-chunk path: multiply in chunks of exactly :data:`CHUNK_ROWS` rows, the last one
zero-padded, so the kernel always sees the same problem shape and a row's result does not
depend on its neighbours or its place in the chunk. Three paths, in order of preference:

- ``stock``: plain ``F.linear``, kept where the platform's kernel is already invariant;
- ``fixed-chunk-8``: :func:`invariant_linear`; close to stock from about 16 rows up, but a
  single row pays for a whole chunk (several times a stock matrix-vector product);
- ``per-row``: each row alone, the slow last resort.

``inference.self_test.self_test`` probes them in that order (a row alone against the same row in batches
of 3, 16 and 64, plus one decode step of a model alone against the same step batched) and
reports the first that passes, with the value of ``MKL_CBWR`` for the reproducibility
block. Attention needs no path of its own: it runs one query row at a time
(:mod:`inference.attention`), so its shapes never depend on the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import torch
import torch.nn.functional as F

__all__ = [
    "CHUNK_ROWS",
    "PATHS",
    "LinearFn",
    "LinearPath",
    "invariant_linear",
    "linear_for",
    "per_row_linear",
    "stock_linear",
]

LinearPath = Literal["stock", "fixed-chunk-8", "per-row"]
PATHS: tuple[LinearPath, ...] = get_args(LinearPath)
CHUNK_ROWS = 8
LinearFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def stock_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` by the platform kernel, however it blocks the rows."""
    out = F.linear(x, weight)
    return out if bias is None else out + bias


def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x [rows, in] @ weight [out, in].T (+ bias)`` in zero-padded chunks of 8 rows.

    Every call of the kernel has the shape ``[8, in] x [in, out]``, so row ``i`` of the
    result is the same bits whatever the other rows are and wherever ``i`` falls in its
    chunk. The bias is added afterwards, elementwise, which is exact per row.
    """
    rows = x.shape[0]
    padded = -(-rows // CHUNK_ROWS) * CHUNK_ROWS
    buffer = x.new_zeros((padded, x.shape[1]))
    buffer[:rows] = x
    parts = [
        F.linear(buffer[start : start + CHUNK_ROWS], weight)
        for start in range(0, padded, CHUNK_ROWS)
    ]
    out = torch.cat(parts)[:rows] if parts else x.new_zeros((0, weight.shape[0]))
    return out if bias is None else out + bias


def per_row_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Each row multiplied alone, as a fresh ``[1, in]`` tensor: invariant, and slow."""
    parts = [F.linear(x[i : i + 1].clone(), weight) for i in range(x.shape[0])]
    out = torch.cat(parts) if parts else x.new_zeros((0, weight.shape[0]))
    return out if bias is None else out + bias


_LINEARS: dict[LinearPath, LinearFn] = {
    "stock": stock_linear,
    "fixed-chunk-8": invariant_linear,
    "per-row": per_row_linear,
}


def linear_for(path: LinearPath) -> LinearFn:
    """The linear function of a path name; ``ValueError`` for an unknown name."""
    try:
        return _LINEARS[path]
    except KeyError:
        raise ValueError(f"unknown linear path {path!r} (known: {', '.join(PATHS)})") from None
