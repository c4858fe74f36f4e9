"""The architecture of a decoder checkpoint, read from its ``config.json``.

One frozen :class:`ModelConfig` covers the Llama, Qwen2 and Qwen3 families: they share the
block (RMSNorm, RoPE, grouped-query attention, SwiGLU) and differ only in a few switches,
which are spelled out here rather than inferred from weight names:

- ``llama``: ``attention_bias`` puts a bias on q/k/v/o, ``mlp_bias`` on the MLP;
- ``qwen2``: q/k/v always carry a bias, o never does;
- ``qwen3``: ``attention_bias`` as Llama, plus an RMSNorm over each head of q and k.

RoPE settings come either from ``rope_theta`` and ``rope_scaling`` (checkpoints on the hub)
or from ``rope_parameters`` (what ``transformers`` 5 writes); only the default and the
``llama3`` frequency schedules are supported. Anything this engine cannot run exactly
(another ``model_type``, sliding-window attention, another activation or RoPE type) is a
:class:`UnsupportedModelError` naming it, never a silent approximation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "ModelConfig",
    "RopeScaling",
    "UnsupportedModelError",
    "load_config",
]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


class UnsupportedModelError(ValueError):
    """The checkpoint asks for something this engine does not implement."""


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency schedule (``rope_type: llama3``): long waves slowed by ``factor``."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """What the forward pass needs to know; field names follow ``config.json``."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool

    @property
    def num_key_value_groups(self) -> int:
        """Query heads that share one key/value head."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Parse a ``config.json`` object; :class:`UnsupportedModelError` for what we can't run."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported by the embedded engine "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        hidden_act = raw.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise UnsupportedModelError(f"hidden_act {hidden_act!r} is not supported (only silu)")
        if raw.get("use_sliding_window"):
            raise UnsupportedModelError("sliding-window attention is not supported")
        if raw.get("pretraining_tp", 1) not in (1, None):
            raise UnsupportedModelError("pretraining_tp other than 1 is not supported")

        hidden = _int(raw, "hidden_size")
        heads = _int(raw, "num_attention_heads")
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        head_dim = int(raw.get("head_dim") or hidden // heads)
        if heads % kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        if head_dim % 2:
            raise UnsupportedModelError(f"head_dim {head_dim} is odd; RoPE needs pairs")
        rope_theta, rope_scaling = _rope(raw, _int(raw, "max_position_embeddings"))

        attention_bias = bool(raw.get("attention_bias", False))
        if model_type == "qwen2":
            qkv_bias, o_bias = True, False
        else:
            qkv_bias = o_bias = attention_bias
        return cls(
            model_type=model_type,
            vocab_size=_int(raw, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_int(raw, "intermediate_size"),
            num_hidden_layers=_int(raw, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=_int(raw, "max_position_embeddings"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=model_type == "llama" and bool(raw.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
        )


def load_config(model_dir: str | Path) -> ModelConfig:
    """:class:`ModelConfig` of the checkpoint in ``model_dir`` (its ``config.json``)."""
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: not a Hugging Face model directory") from None
    if not isinstance(raw, dict):
        raise UnsupportedModelError(f"{path} is not a JSON object")
    return ModelConfig.from_dict(raw)


def _int(raw: dict[str, Any], key: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise UnsupportedModelError(f"config.json: {key!r} must be an integer, got {value!r}")
    return value


def _rope(raw: dict[str, Any], max_positions: int) -> tuple[float, RopeScaling | None]:
    """``(rope_theta, llama3 scaling or None)`` from either spelling of the RoPE settings."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise UnsupportedModelError(f"config.json: RoPE parameters {params!r} are not an object")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise UnsupportedModelError("per-layer-type RoPE parameters are not supported")
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial not in (1, 1.0, None):
        raise UnsupportedModelError(f"partial_rotary_factor {partial!r} is not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise UnsupportedModelError(f"rope type {rope_type!r} is not supported (default, llama3)")
    original = params.get("original_max_position_embeddings", max_positions)
    return theta, RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(original),
    )
