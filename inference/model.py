"""The decoder: our own float32 forward pass for Llama, Qwen2 and Qwen3 checkpoints.

Embedding, then per layer RMSNorm → q/k/v projections (bias for Qwen2, per-head RMSNorm
of q and k for Qwen3) → RoPE → grouped-query attention → o projection → residual →
RMSNorm → SwiGLU MLP → residual; a final RMSNorm and the lm_head (tied to the embedding
or not). Weights keep the Hugging Face tensor names (:func:`checkpoint_layout`).

Batch invariance is a property of every operation here, not of the batch:

- every matrix multiply of a token row goes through the linear path of
  :mod:`inference.invariant`, whose rows do not depend on how many rows run together;
- attention runs per sequence and per query row (:mod:`inference.attention`);
- elementwise work uses only operations whose result for an element does not depend on
  where it falls in a vectorised loop: ``+ - * /``, ``sqrt`` and ``exp``. ``torch.rsqrt``,
  ``torch.sigmoid`` and ``F.silu`` are not among them on the CPU build we measured (their
  vectorised and scalar-tail results differ in the last bit), so RMSNorm is written with
  ``1 / sqrt`` and SiLU as ``x / (1 + exp(-x))``; row reductions (the RMSNorm mean) run
  over one row of fixed length.

So a decode step of a sequence gives the same logits alone or batched, and prefilling a
suffix after a cached prefix gives the same logits as prefilling the whole prompt at once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.attention import attend_sequence
from inference.cache import SequenceCache
from inference.config import ModelConfig, load_config
from inference.invariant import LinearFn, LinearPath, linear_for
from inference.rope import RotaryTable, apply_rotary
from inference.weights import load_weights

__all__ = ["DecoderModel", "checkpoint_layout", "rms_norm", "silu"]

#: Tensors some checkpoints carry that the forward pass recomputes or ignores.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_layout(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name the checkpoint must hold, with its shape (HF naming)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim
    layout: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config.tie_word_embeddings:
        layout["lm_head.weight"] = (config.vocab_size, hidden)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        layout[p + "input_layernorm.weight"] = (hidden,)
        layout[p + "post_attention_layernorm.weight"] = (hidden,)
        for name, out in (("q", q_width), ("k", kv_width), ("v", kv_width)):
            layout[p + f"self_attn.{name}_proj.weight"] = (out, hidden)
            if config.qkv_bias:
                layout[p + f"self_attn.{name}_proj.bias"] = (out,)
        layout[p + "self_attn.o_proj.weight"] = (hidden, q_width)
        if config.o_bias:
            layout[p + "self_attn.o_proj.bias"] = (hidden,)
        if config.qk_norm:
            layout[p + "self_attn.q_norm.weight"] = (config.head_dim,)
            layout[p + "self_attn.k_norm.weight"] = (config.head_dim,)
        for name, shape in (("gate", (inter, hidden)), ("up", (inter, hidden))):
            layout[p + f"mlp.{name}_proj.weight"] = shape
            if config.mlp_bias:
                layout[p + f"mlp.{name}_proj.bias"] = (inter,)
        layout[p + "mlp.down_proj.weight"] = (hidden, inter)
        if config.mlp_bias:
            layout[p + "mlp.down_proj.bias"] = (hidden,)
    return layout


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x²) + eps)`` over the last dimension (invariant ops only)."""
    variance = (x * x).mean(-1, keepdim=True)
    return weight * (x * torch.reciprocal(torch.sqrt(variance + eps)))


def silu(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(x)`` as ``x / (1 + exp(-x))`` (invariant ops only)."""
    return x / (1.0 + torch.exp(-x))


@dataclass
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    gate_bias: torch.Tensor | None = None
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None


class DecoderModel:
    """A loaded checkpoint with prefill and batched decode over per-sequence caches."""

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        *,
        linear_path: LinearPath = "fixed-chunk-8",
    ) -> None:
        self.config = config
        self.linear_path = linear_path
        layout = checkpoint_layout(config)
        _check_weights(layout, weights, config)
        w = {name: weights[name].to(torch.float32).contiguous() for name in layout}
        self._embed = w["model.embed_tokens.weight"]
        self._lm_head = self._embed if config.tie_word_embeddings else w["lm_head.weight"]
        self._final_norm = w["model.norm.weight"]
        self._layers = [_layer(w, f"model.layers.{i}.") for i in range(config.num_hidden_layers)]
        self._rope = RotaryTable(config)
        self._scale = config.head_dim**-0.5

    @classmethod
    def load(
        cls, model_dir: str | Path, *, linear_path: LinearPath = "fixed-chunk-8"
    ) -> DecoderModel:
        """Read ``config.json`` and the safetensors weights of a model directory."""
        return cls(load_config(model_dir), load_weights(model_dir), linear_path=linear_path)

    @classmethod
    def random(cls, config: ModelConfig, *, seed: int = 0) -> DecoderModel:
        """Random weights (normal, std 0.02; norms at 1) for probes; not for shipping."""
        generator = torch.Generator().manual_seed(seed)
        weights = {}
        for name, shape in checkpoint_layout(config).items():
            if name.endswith("norm.weight"):
                weights[name] = torch.ones(shape)
            else:
                weights[name] = torch.randn(shape, generator=generator) * 0.02
        return cls(config, weights)

    @property
    def linear_path(self) -> LinearPath:
        """The path every token-row matrix multiply takes (see :mod:`inference.invariant`)."""
        return self._linear_path

    @linear_path.setter
    def linear_path(self, path: LinearPath) -> None:
        self._linear: LinearFn = linear_for(path)
        self._linear_path = path

    def new_cache(self) -> SequenceCache:
        """An empty cache shaped for this model."""
        c = self.config
        return SequenceCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim)

    def probe_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Weights the invariance self-test multiplies: a projection, the MLP down, lm_head."""
        first = self._layers[0]
        return [("q_proj", first.q), ("down_proj", first.down), ("lm_head", self._lm_head)]

    def prefill(self, cache: SequenceCache, token_ids: list[int]) -> torch.Tensor:
        """Append ``token_ids`` to ``cache``; logits ``[vocab]`` of the last of them."""
        if not token_ids:
            raise ValueError("prefill needs at least one token")
        return self._last_logits([(cache, token_ids)])[0]

    def prefill_many(self, segments: list[tuple[SequenceCache, list[int]]]) -> torch.Tensor:
        """:meth:`prefill` of several caches in one forward pass: logits ``[len(segments),
        vocab]`` of each segment's last token. The linear layers read the weights once for
        all of them, and each row is the bits its own prefill gives (batch invariance)."""
        if not segments or any(not tokens for _, tokens in segments):
            raise ValueError("prefill needs at least one token for each of its caches")
        return self._last_logits(segments)

    def _last_logits(self, segments: list[tuple[SequenceCache, list[int]]]) -> torch.Tensor:
        """The forward pass of both prefills: logits of each segment's last token."""
        with torch.inference_mode():
            hidden = self._forward(segments)
            ends = torch.tensor(list(itertools.accumulate(len(t) for _, t in segments))) - 1
            return self._linear(hidden[ends], self._lm_head, None)

    def prefill_all(self, cache: SequenceCache, token_ids: list[int]) -> torch.Tensor:
        """As :meth:`prefill`, but logits ``[len(token_ids), vocab]`` of every position."""
        if not token_ids:
            raise ValueError("prefill needs at least one token")
        with torch.inference_mode():
            hidden = self._forward([(cache, token_ids)])
            return self._linear(hidden, self._lm_head, None)

    def decode(self, caches: list[SequenceCache], token_ids: list[int]) -> torch.Tensor:
        """One step for each sequence: logits ``[len(caches), vocab]``.

        The linear layers run over the stacked rows in one batch; attention runs per
        sequence against its own cache. Each cache grows by one position.
        """
        if len(caches) != len(token_ids):
            raise ValueError(f"{len(caches)} caches but {len(token_ids)} tokens")
        if not caches:
            raise ValueError("decode needs at least one sequence")
        with torch.inference_mode():
            hidden = self._forward([(c, [t]) for c, t in zip(caches, token_ids, strict=True)])
            return self._linear(hidden, self._lm_head, None)

    def _forward(self, segments: list[tuple[SequenceCache, list[int]]]) -> torch.Tensor:
        """Final-normed hidden states ``[rows, hidden]`` of every new token, caches updated."""
        c = self.config
        if len({id(cache) for cache, _ in segments}) != len(segments):
            raise ValueError("a cache appears twice in one step")
        ids: list[int] = []
        positions: list[int] = []
        for cache, tokens in segments:
            if (cache.kv_heads, cache.head_dim) != (c.num_key_value_heads, c.head_dim) or (
                cache.num_layers != c.num_hidden_layers
            ):
                raise ValueError("cache was made for a different model")
            ids.extend(tokens)
            positions.extend(range(cache.length, cache.length + len(tokens)))
        if min(ids) < 0 or max(ids) >= c.vocab_size:
            raise ValueError(f"token id out of range for vocab_size {c.vocab_size}")
        cos, sin = self._rope.lookup(torch.tensor(positions, dtype=torch.int64))
        for cache, tokens in segments:
            cache.reserve(len(tokens))

        rows = len(ids)
        linear = self._linear
        x = self._embed[torch.tensor(ids, dtype=torch.int64)]
        for index, layer in enumerate(self._layers):
            h = rms_norm(x, layer.input_norm, c.rms_norm_eps)
            q = linear(h, layer.q, layer.q_bias).view(rows, c.num_attention_heads, c.head_dim)
            k = linear(h, layer.k, layer.k_bias).view(rows, c.num_key_value_heads, c.head_dim)
            v = linear(h, layer.v, layer.v_bias).view(rows, c.num_key_value_heads, c.head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q = rms_norm(q, layer.q_norm, c.rms_norm_eps)
                k = rms_norm(k, layer.k_norm, c.rms_norm_eps)
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)

            attended = torch.empty((rows, c.num_attention_heads * c.head_dim))
            row = 0
            for cache, tokens in segments:
                n = len(tokens)
                cache.write(index, cache.length, k[row : row + n], v[row : row + n])
                attended[row : row + n] = attend_sequence(
                    q[row : row + n],
                    cache.keys[index],
                    cache.values[index],
                    cache.length,
                    self._scale,
                )
                row += n
            x = x + linear(attended, layer.o, layer.o_bias)

            h = rms_norm(x, layer.post_norm, c.rms_norm_eps)
            gate = linear(h, layer.gate, layer.gate_bias)
            up = linear(h, layer.up, layer.up_bias)
            x = x + linear(silu(gate) * up, layer.down, layer.down_bias)

        for cache, tokens in segments:
            cache.length += len(tokens)
        return rms_norm(x, self._final_norm, c.rms_norm_eps)


def _check_weights(
    layout: dict[str, tuple[int, ...]], weights: dict[str, torch.Tensor], config: ModelConfig
) -> None:
    missing = sorted(set(layout) - set(weights))
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    ignorable = {"lm_head.weight"} if config.tie_word_embeddings else set()
    unexpected = sorted(
        name
        for name in set(weights) - set(layout) - ignorable
        if not name.endswith(_IGNORED_SUFFIXES)
    )
    if unexpected:
        raise ValueError(
            f"checkpoint holds {len(unexpected)} tensors this {config.model_type} "
            f"configuration does not use, e.g. {unexpected[:3]}"
        )
    for name, shape in layout.items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"{name} has shape {tuple(weights[name].shape)}, expected {shape}")


def _layer(w: dict[str, torch.Tensor], p: str) -> _Layer:
    def opt(name: str) -> torch.Tensor | None:
        return w.get(p + name)

    return _Layer(
        input_norm=w[p + "input_layernorm.weight"],
        post_norm=w[p + "post_attention_layernorm.weight"],
        q=w[p + "self_attn.q_proj.weight"],
        k=w[p + "self_attn.k_proj.weight"],
        v=w[p + "self_attn.v_proj.weight"],
        o=w[p + "self_attn.o_proj.weight"],
        gate=w[p + "mlp.gate_proj.weight"],
        up=w[p + "mlp.up_proj.weight"],
        down=w[p + "mlp.down_proj.weight"],
        q_bias=opt("self_attn.q_proj.bias"),
        k_bias=opt("self_attn.k_proj.bias"),
        v_bias=opt("self_attn.v_proj.bias"),
        o_bias=opt("self_attn.o_proj.bias"),
        gate_bias=opt("mlp.gate_proj.bias"),
        up_bias=opt("mlp.up_proj.bias"),
        down_bias=opt("mlp.down_proj.bias"),
        q_norm=opt("self_attn.q_norm.weight"),
        k_norm=opt("self_attn.k_norm.weight"),
    )
