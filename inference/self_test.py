"""The start-up self-test: which batch-invariant path (:mod:`inference.invariant`) keeps a
row bit-identical on this machine, alone or batched.

It probes the paths in order (a row alone against the same row in batches of 3, 13, 16,
64 and 515, plus one decode step of a model alone against the same step batched) and
reports the first that passes, with the value of ``MKL_CBWR``, for the reproducibility
block. It lives apart from the paths because it drives a model, and the model uses the
paths.

It runs at every engine start, and on a real model each product reads every weight, so
each batch is one product (or one decode step) holding the probe at its first, middle and
last place at once, and the other sequences of the decode probe are prefilled together.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from inference.invariant import PATHS, LinearPath, linear_for
from inference.model import DecoderModel

__all__ = ["InvarianceCheck", "InvarianceReport", "self_test"]


@dataclass(frozen=True)
class InvarianceCheck:
    """One probe: a row alone against the same row batched, through one path."""

    name: str
    path: LinearPath
    batch_sizes: tuple[int, ...]
    passed: bool
    detail: str


@dataclass(frozen=True)
class InvarianceReport:
    """Which path the engine runs and why; the server copies it into its block."""

    path: LinearPath
    passed: bool
    checks: tuple[InvarianceCheck, ...]
    mkl_cbwr: str | None
    torch_version: str
    num_threads: int

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        data = asdict(self)
        data["checks"] = [dict(c, batch_sizes=list(c["batch_sizes"])) for c in data["checks"]]
        return data


_SYNTHETIC_SHAPES = ((64, 64), (128, 64), (64, 128), (896, 896), (4864, 896))


def self_test(
    model: DecoderModel | None = None,
    *,
    batch_sizes: Sequence[int] = (3, 13, 16, 64, 515),
    decode_batch_sizes: Sequence[int] = (5, 16),
    seed: int = 0,
) -> InvarianceReport:
    """Probe the paths in order and return the first that keeps rows bit-identical.

    Linear probes use ``model``'s own weights (first layer's q and down projections, and
    the lm_head) or, without a model, synthetic weights of typical shapes. The decode probe
    runs one decode step of one sequence alone and then batched with other sequences of
    other lengths, through ``model`` or a small random model. With a ``model``, the path
    that passed (or ``per-row`` if none did) is left set on it.
    """
    generator = torch.Generator().manual_seed(seed)
    probe_model = model if model is not None else _small_model(seed)
    checks: list[InvarianceCheck] = []
    chosen: LinearPath | None = None
    with torch.inference_mode():
        weights = _probe_weights(model, generator)
        for path in PATHS:
            linear_checks = [
                _linear_check(name, path, weight, batch_sizes, generator)
                for name, weight in weights
            ]
            checks.extend(linear_checks)
            if not all(c.passed for c in linear_checks):
                continue
            probe_model.linear_path = path
            decode_check = _decode_check(probe_model, path, decode_batch_sizes, seed)
            checks.append(decode_check)
            if decode_check.passed:
                chosen = path
                break
    probe_model.linear_path = chosen or "per-row"
    return InvarianceReport(
        path=chosen or "per-row",
        passed=chosen is not None,
        checks=tuple(checks),
        mkl_cbwr=os.environ.get("MKL_CBWR"),
        torch_version=torch.__version__,
        num_threads=torch.get_num_threads(),
    )


def _probe_weights(
    model: DecoderModel | None, generator: torch.Generator
) -> list[tuple[str, torch.Tensor]]:
    if model is not None:
        return model.probe_weights()
    return [
        (f"synthetic {k}->{n}", torch.randn((n, k), generator=generator))
        for k, n in _SYNTHETIC_SHAPES
    ]


def _positions(batch: int) -> list[int]:
    return sorted({0, batch // 2, batch - 1})


def _differing(
    batch: int, positions: list[int], out: torch.Tensor, alone: torch.Tensor
) -> list[str]:
    """The places of a batch whose row is not ``alone``'s bits."""
    return [f"batch {batch} row {p}" for p in positions if not torch.equal(out[p], alone)]


def _linear_check(
    name: str,
    path: LinearPath,
    weight: torch.Tensor,
    batch_sizes: Sequence[int],
    generator: torch.Generator,
) -> InvarianceCheck:
    linear = linear_for(path)
    width = weight.shape[1]
    row = torch.randn((1, width), generator=generator)
    alone = linear(row.clone(), weight, None)[0]
    failures = []
    for batch in batch_sizes:
        positions = _positions(batch)
        rows = torch.randn((batch, width), generator=generator)
        rows[positions] = row[0]
        failures += _differing(batch, positions, linear(rows, weight, None), alone)
    detail = "bit-identical" if not failures else "differs: " + ", ".join(failures)
    return InvarianceCheck(f"linear {name}", path, tuple(batch_sizes), not failures, detail)


def _decode_check(
    model: DecoderModel, path: LinearPath, batch_sizes: Sequence[int], seed: int
) -> InvarianceCheck:
    """One decode step of a sequence alone, then batched among others of other lengths
    (at the first, middle and last place of each batch)."""
    generator = torch.Generator().manual_seed(seed + 1)
    vocab = model.config.vocab_size

    def tokens(n: int) -> list[int]:
        return [int(t) for t in torch.randint(0, vocab, (n,), generator=generator)]

    probe = model.new_cache()
    model.prefill(probe, tokens(5))
    step = tokens(1)[0]
    alone = model.decode([probe.clone()], [step])[0]
    failures = []
    for batch in batch_sizes:
        positions = _positions(batch)
        others = [model.new_cache() for _ in range(batch - len(positions))]
        if others:
            model.prefill_many([(cache, tokens(1 + i % 7)) for i, cache in enumerate(others)])
        peers = iter(others)
        caches = [probe.clone() if p in positions else next(peers) for p in range(batch)]
        steps = tokens(batch)
        for position in positions:
            steps[position] = step
        failures += _differing(batch, positions, model.decode(caches, steps), alone)
    detail = "bit-identical" if not failures else "differs: " + ", ".join(failures)
    return InvarianceCheck("decode step", path, tuple(batch_sizes), not failures, detail)


def _small_model(seed: int) -> DecoderModel:
    from inference.config import ModelConfig

    config = ModelConfig(
        model_type="qwen3",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        qk_norm=True,
    )
    return DecoderModel.random(config, seed=seed)
