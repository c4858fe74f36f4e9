"""Rotary position embeddings: the cos/sin of each position, and rotating q and k by them.

The frequencies are computed as ``transformers`` computes them (float32 inverse frequencies,
float32 ``position * inv_freq``), so our angles equal theirs. The cos/sin table is filled in
fixed blocks of :data:`BLOCK` positions, each block always computed with the same shapes,
so the values for a position never depend on which batch or which prompt asked for it
first: a row's rotation is a pure function of its position.
"""

from __future__ import annotations

import math

import torch

from inference.config import ModelConfig, RopeScaling

__all__ = ["BLOCK", "RotaryTable", "apply_rotary", "inverse_frequencies"]

BLOCK = 256


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """float32 ``[head_dim // 2]`` inverse frequencies, Llama 3 schedule applied if configured."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    if config.rope_scaling is not None:
        inv_freq = _llama3(inv_freq, config.rope_scaling)
    return inv_freq


def _llama3(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1's schedule: long wavelengths slowed by ``factor``, a smooth ramp between."""
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryTable:
    """cos/sin rows by position, ``[head_dim]`` each (the two halves repeat), grown by block."""

    def __init__(self, config: ModelConfig) -> None:
        self._inv_freq = inverse_frequencies(config)
        self._max_positions = config.max_position_embeddings
        dim = config.head_dim
        self._cos = torch.empty((0, dim), dtype=torch.float32)
        self._sin = torch.empty((0, dim), dtype=torch.float32)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` rows ``[len(positions), head_dim]`` for int64 ``positions``."""
        if positions.numel() == 0:
            return self._cos[:0], self._sin[:0]
        highest = int(positions.max())
        if highest >= self._max_positions:
            raise ValueError(
                f"position {highest} is beyond max_position_embeddings {self._max_positions}"
            )
        while self._cos.shape[0] <= highest:
            self._grow()
        return self._cos[positions], self._sin[positions]

    def _grow(self) -> None:
        start = self._cos.shape[0]
        positions = torch.arange(start, start + BLOCK, dtype=torch.int64).to(torch.float32)
        freqs = positions[:, None] * self._inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        self._cos = torch.cat((self._cos, angles.cos()))
        self._sin = torch.cat((self._sin, angles.sin()))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [rows, heads, head_dim]`` by per-row ``cos``/``sin [rows, head_dim]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
