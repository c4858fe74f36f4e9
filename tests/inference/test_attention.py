"""Attention keeps its bits: the engine's :func:`attend_sequence` (views made once, batched
products written in place) against the plain formulation it replaced, the one records
made before it were computed with: ``matmul``, ``* scale``, ``softmax``, ``matmul``, one
query row at a time. Any difference in a single bit would change replies to pinned
requests, so the comparison is ``torch.equal`` over many shapes, lengths and offsets."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")

from inference.attention import attend, attend_sequence


def _plain(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    heads, head_dim = query.shape
    kv_heads = keys.shape[1]
    grouped = query.reshape(kv_heads, heads // kv_heads, head_dim)
    scores = torch.matmul(grouped, keys.permute(1, 2, 0)) * scale
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, values.permute(1, 0, 2)).reshape(heads * head_dim)


@pytest.mark.parametrize("threads", [1, 2])
def test_attention_gives_the_bits_of_the_plain_formulation(threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    rng = random.Random(threads)
    generator = torch.Generator().manual_seed(threads)
    try:
        with torch.inference_mode():
            for trial in range(120):
                kv_heads, group, head_dim = rng.choice(
                    [(3, 3, 64), (2, 2, 16), (8, 2, 128), (1, 4, 64), (5, 3, 32)]
                )
                rows, start = rng.randrange(1, 40), rng.randrange(0, 300)
                spare = rng.randrange(0, 5)  # a cache holds more than is written
                keys = torch.randn((start + rows + spare, kv_heads, head_dim), generator=generator)
                values = torch.randn(keys.shape, generator=generator)
                queries = torch.randn((rows, kv_heads * group, head_dim), generator=generator)
                scale = head_dim**-0.5
                got = attend_sequence(queries, keys, values, start, scale)
                for i in range(rows):
                    end = start + i + 1
                    expected = _plain(queries[i], keys[:end], values[:end], scale)
                    assert torch.equal(got[i], expected), (trial, i)
                    assert torch.equal(
                        attend(queries[i], keys[:end], values[:end], scale), expected
                    )
    finally:
        torch.set_num_threads(before)
