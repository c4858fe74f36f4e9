"""Batch-invariant matrix multiplies: the paths the start-up self-test
(:mod:`inference.self_test`) chooses from.

A pinned request must return the same bytes alone or in any batch, so every row of every
linear layer must come out bit-identical however many rows are multiplied with it. Stock
``F.linear`` does not promise that: on this project's CPU build (MKL), the rows of a
``[1, k]``, ``[16, k]`` and ``[64, k]`` product differ in the last bits, and
``MKL_CBWR=AVX2,STRICT`` did not change that. What was bit-exact in our measurements is
the fixed-chunk path: multiply in chunks of exactly :data:`CHUNK_ROWS` rows, the last one
zero-padded, so the kernel always sees the same problem shape and a row's result does not
depend on its neighbours or its place in the chunk. But each chunk reads the whole weight
matrix again, and a decode step is bound by reading weights: at 16 rows, two chunks read
the model twice (SmolLM2-135M's lm_head: 2 x 18 ms against 20 ms for one 16-row call).

What broke the rows in our measurements were the rows left over past a multiple of four:
with this build's MKL (AVX-512), the last ``rows % 4`` rows of a product take another
kernel and other bits (so a row alone differs from the same row in 8 rows), while every
row of every product of 8, 16, ... 512 rows got the bits it gets in 8 rows. Hence a path
between the two: pad to a multiple of :data:`CHUNK_ROWS` rows and multiply up to
:data:`MAX_CALL_ROWS` rows in one call, so a decode step reads the weights once and a
512-token prefill is one product instead of 64. Whether that holds is the platform's
business, so the self-test decides. Four paths, in order of preference:

- ``stock``: plain ``F.linear``, kept where the platform's kernel is already invariant;
- ``padded-8``: :func:`padded_linear`, a multiple of 8 rows and at most 512 per call;
- ``fixed-chunk-8``: :func:`invariant_linear`; close to stock from about 16 rows up where
  compute bound, but a single row pays for a whole chunk and every chunk reads the weights;
- ``per-row``: each row alone, the slow last resort.

``inference.self_test.self_test`` probes them in that order (a row alone against the same
row in batches of 3, 13, 16, 64 and 515, plus one decode step of a model alone against the
same step batched) and reports the first that passes, with the value of ``MKL_CBWR``, for
the reproducibility block. Attention needs no path of its own: it runs one query row at a
time (:mod:`inference.attention`), so its shapes never depend on the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import torch
import torch.nn.functional as F

__all__ = [
    "CHUNK_ROWS",
    "MAX_CALL_ROWS",
    "PATHS",
    "LinearFn",
    "LinearPath",
    "invariant_linear",
    "linear_for",
    "padded_linear",
    "per_row_linear",
    "stock_linear",
]

LinearPath = Literal["stock", "padded-8", "fixed-chunk-8", "per-row"]
PATHS: tuple[LinearPath, ...] = get_args(LinearPath)
CHUNK_ROWS = 8
#: The most rows ``padded-8`` multiplies in one call; the self-test probes a batch above it.
MAX_CALL_ROWS = 512
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


def padded_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x [rows, in] @ weight [out, in].T (+ bias)`` with the rows zero-padded to a multiple
    of :data:`CHUNK_ROWS` and multiplied up to :data:`MAX_CALL_ROWS` at a time, so every
    call of the kernel has a multiple of 8 rows, at most 512. Invariant only where the
    platform's kernel gives a row the same bits at each such shape and place, which the
    self-test probes before it picks this path.
    """
    rows = x.shape[0]
    if rows == 0:
        out = x.new_zeros((0, weight.shape[0]))
        return out if bias is None else out + bias
    padded = -(-rows // CHUNK_ROWS) * CHUNK_ROWS
    if padded != rows:
        x = F.pad(x, (0, 0, 0, padded - rows))  # one op: a decode step has many small calls
    x = x.contiguous()  # itself when it already is
    if padded <= MAX_CALL_ROWS:
        out = F.linear(x, weight)
    else:
        parts = [
            F.linear(x[s : s + MAX_CALL_ROWS], weight) for s in range(0, padded, MAX_CALL_ROWS)
        ]
        out = torch.cat(parts)
    if padded != rows:
        out = out[:rows]
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
    "padded-8": padded_linear,
    "fixed-chunk-8": invariant_linear,
    "per-row": per_row_linear,
}


def linear_for(path: LinearPath) -> LinearFn:
    """The linear function of a path name; ``ValueError`` for an unknown name."""
    try:
        return _LINEARS[path]
    except KeyError:
        raise ValueError(f"unknown linear path {path!r} (known: {', '.join(PATHS)})") from None
