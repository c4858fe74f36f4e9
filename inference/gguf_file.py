"""A GGUF checkpoint (what llama.cpp and Ollama keep on disk), read through ``gguf``.

One ``.gguf`` file carries the architecture (metadata keys ``<arch>.*``), the weights and
the tokenizer (``tokenizer.ggml.*``, ``tokenizer.chat_template``). This module turns it
into what the engine already runs: a :class:`~inference.config.ModelConfig`, float32
tensors under the Hugging Face names of :func:`~inference.model.checkpoint_layout`, and a
``tokenizers`` BPE tokenizer. Parsing and dequantization are the ``gguf`` package's (the
llama.cpp project's own reader); what is written here is only the mapping between the two
naming schemes, which no library offers without also pulling in a model runtime.

What it accepts, and refuses by name (:class:`~inference.config.UnsupportedModelError`):

- architectures ``llama`` and ``qwen2``;
- tensor types F32, F16, BF16, Q8_0, Q4_0 and Q4_1, all dequantized to float32 at load, so
  the forward pass is exactly the one safetensors checkpoints take;
- byte-level BPE vocabularies (``tokenizer.ggml.model = gpt2``) whose pre-tokenizer
  (``tokenizer.ggml.pre``) is one of :data:`PRE_TOKENIZERS`.

llama.cpp's converter permutes the rows of Llama's q and k projections (its RoPE pairs
adjacent dimensions, Hugging Face's pairs halves); :func:`_unpermute` undoes it, as
``transformers``' GGUF loader does. Qwen2 is converted without the permutation.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inference.config import ModelConfig, UnsupportedModelError

__all__ = [
    "GGUF_ARCHITECTURES",
    "GGUF_TENSOR_TYPES",
    "PRE_TOKENIZERS",
    "GgufCheckpoint",
    "check_layout",
    "is_gguf",
    "read_gguf",
]

GGUF_MAGIC = b"GGUF"
GGUF_ARCHITECTURES = ("llama", "qwen2")
GGUF_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

_GPT2_SPLIT = {
    "type": "ByteLevel",
    "add_prefix_space": False,
    "trim_offsets": True,
    "use_regex": True,
}
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _regex_then_bytes(pattern: str) -> dict[str, Any]:
    split = {
        "type": "Split",
        "pattern": {"Regex": pattern},
        "behavior": "Isolated",
        "invert": False,
    }
    return {"type": "Sequence", "pretokenizers": [split, {**_GPT2_SPLIT, "use_regex": False}]}


#: ``tokenizer.ggml.pre`` → the ``tokenizers`` pre-tokenizer that splits text the same way
#: (llama.cpp's ``llama-vocab.cpp`` names the regular expressions of each).
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "default": _GPT2_SPLIT,
    "gpt2": _GPT2_SPLIT,
    # SmolLM (StarCoder's): every digit its own word, then GPT-2's split.
    "smollm": {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, _GPT2_SPLIT],
    },
    "llama-bpe": _regex_then_bytes(_LLAMA3_REGEX),
    "qwen2": _regex_then_bytes(_QWEN2_REGEX),
}

#: GGUF tensor names (per block, after ``blk.N.``) → Hugging Face names (after ``model.layers.N.``).
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_CONTROL = 3  # llama.cpp's token type for control (special) tokens
_USER_DEFINED = 4


@dataclass
class GgufCheckpoint:
    """Everything one GGUF file holds, in the engine's terms."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer_json: str
    chat_template: str | None
    special_tokens: dict[str, str | None]
    eos_token_ids: tuple[int, ...]


def is_gguf(path: str | Path) -> bool:
    """True when ``path`` is a file that starts with GGUF's magic bytes."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as handle:
        return handle.read(4) == GGUF_MAGIC


def read_gguf(path: str | Path) -> GgufCheckpoint:
    """Read and dequantize a GGUF checkpoint; refuse what the engine cannot run exactly.

    The file is hostile until parsed: :func:`check_layout` first bounds every count and
    length by the file's size (``gguf``'s reader trusts them, so a flipped length byte could
    ask it for terabytes), and any error the reader raises on a malformed file becomes an
    :class:`UnsupportedModelError` naming the file.
    """
    check_layout(path)
    try:
        return _read(path)
    except UnsupportedModelError:
        raise
    except (ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
        raise UnsupportedModelError(f"{path}: not a readable GGUF file: {exc}") from None


def check_layout(path: str | Path) -> None:
    """Walk the header, metadata and tensor table, checking each count and length fits the
    file (and each tensor's data, by its type's block size), before anything is allocated.

    Hand-written because ``gguf``'s reader has no such bounds; it reads nothing else, and
    only the pages of the file it walks (a memory map).
    """
    if Path(path).stat().st_size < len(GGUF_MAGIC):
        raise UnsupportedModelError(f"{path}: not a GGUF file (shorter than its magic)")
    with (
        Path(path).open("rb") as handle,
        mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data,
    ):
        _check(_Scan(data, len(data), str(path)), str(path))


def _check(scan: _Scan, path: str) -> None:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    size = scan.size
    if scan.take(4) != GGUF_MAGIC:
        raise UnsupportedModelError(f"{path}: not a GGUF file (no GGUF magic)")
    version = scan.number("<I")
    if version not in (2, 3):
        raise UnsupportedModelError(f"{path}: GGUF version {version} is not supported (2, 3)")
    tensors, pairs = scan.number("<Q"), scan.number("<Q")
    scan.fits(pairs * 13 + tensors * 24, "the header's counts reach")
    for _ in range(pairs):
        scan.string()
        scan.value(scan.number("<I"))
    needed = 0
    for _ in range(tensors):
        scan.string()
        dims = scan.number("<I")
        if not 1 <= dims <= 4:
            raise UnsupportedModelError(f"{path}: a tensor claims {dims} dimensions")
        count = 1
        for _ in range(dims):
            count *= scan.number("<Q")
        kind = scan.number("<I")
        scan.number("<Q")  # offset, checked by the reader against the data it maps
        try:
            block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            continue  # an unknown type: refused by name once the reader lists it
        needed += count // block * nbytes
    if needed > size:
        raise UnsupportedModelError(
            f"{path}: its tensors claim {needed} bytes of data; the file has {size}"
        )


_HEADER_SCAN_LIMIT = 256 << 20  # metadata larger than this is refused (vocabularies: a few MB)
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class _Scan:
    """A cursor over the file's head that refuses any length running past its end."""

    def __init__(self, data: mmap.mmap, size: int, path: str) -> None:
        self.data, self.size, self.path, self.pos = data, size, path, 0

    def fits(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > min(self.size, _HEADER_SCAN_LIMIT):
            raise UnsupportedModelError(
                f"{self.path}: truncated or corrupt: {what} past the end of the file (or "
                f"of its first {_HEADER_SCAN_LIMIT >> 20} MiB, the most metadata it may hold)"
            )

    def take(self, n: int) -> bytes:
        self.fits(n, "a length reaches")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def number(self, fmt: str) -> int:
        value: int = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return value

    def string(self) -> None:
        self.take(self.number("<Q"))

    def value(self, kind: int, depth: int = 0) -> None:
        if kind in _SCALAR_SIZES:
            self.take(_SCALAR_SIZES[kind])
        elif kind == 8:
            self.string()
        elif kind == 9 and depth == 0:
            item, count = self.number("<I"), self.number("<Q")
            if item in _SCALAR_SIZES:
                self.take(count * _SCALAR_SIZES[item])
            else:
                self.fits(count * 8, "an array reaches")
                for _ in range(count):
                    self.value(item, depth + 1)
        else:
            raise UnsupportedModelError(
                f"{self.path}: metadata value type {kind} is not valid here"
            )


def _read(path: str | Path) -> GgufCheckpoint:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    meta = _Metadata(reader, str(path))
    arch = meta.text("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(GGUF_ARCHITECTURES)})"
        )
    tensors = {t.name: t for t in reader.tensors}
    for t in reader.tensors:
        if t.tensor_type.name not in GGUF_TENSOR_TYPES:
            raise UnsupportedModelError(
                f"{path}: tensor {t.name} has type {t.tensor_type.name}, which the engine "
                f"does not dequantize (supported: {', '.join(GGUF_TENSOR_TYPES)})"
            )
    if "rope_freqs.weight" in tensors:
        raise UnsupportedModelError(
            f"{path}: per-frequency RoPE factors (rope_freqs) are not supported"
        )
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise UnsupportedModelError(f"{path}: RoPE scaling {scaling!r} is not supported")

    tokens = meta.strings("tokenizer.ggml.tokens")
    config = _config(meta, arch, tensors, len(tokens))
    blocks = {name.split(".")[1] for name in tensors if name.startswith("blk.")}
    if config.num_hidden_layers != len(blocks):  # before anything is sized by the metadata
        raise UnsupportedModelError(
            f"{path}: metadata says {config.num_hidden_layers} blocks; the file holds "
            f"tensors of {len(blocks)}"
        )
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        values = dequantize(tensor.data, tensor.tensor_type)
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
            values = _unpermute(values, heads)
        # A copy only where needed: F32 tensors are views of the mapped file, quantized
        # ones already fresh float32 arrays of their own.
        owned = np.require(values, np.float32, ["C_CONTIGUOUS", "OWNDATA", "WRITEABLE"])
        weights[_hf_name(name, str(path))] = torch.from_numpy(owned)
    tokenizer_json, specials, eos = _tokenizer(meta, tokens, str(path))
    template = meta.get("tokenizer.chat_template")
    return GgufCheckpoint(
        config=config,
        weights=weights,
        tokenizer_json=tokenizer_json,
        chat_template=template if isinstance(template, str) else None,
        special_tokens=specials,
        eos_token_ids=eos,
    )


class _Metadata:
    """Typed access to a reader's key-value pairs, with errors that name the file and key."""

    def __init__(self, reader: Any, path: str) -> None:
        self._fields = reader.fields
        self._path = path

    def get(self, key: str) -> Any:
        field = self._fields.get(key)
        return None if field is None else field.contents()

    def number(self, key: str, default: float | None = None) -> Any:
        value = self.get(key)
        if value is None and default is not None:
            return default
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise UnsupportedModelError(
                f"{self._path}: metadata {key!r} must be a number, got {value!r}"
            )
        return value

    def text(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise UnsupportedModelError(
                f"{self._path}: metadata {key!r} must be a string, got {value!r}"
            )
        return value

    def strings(self, key: str, *, optional: bool = False) -> list[str]:
        value = self.get(key)
        if value is None and optional:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UnsupportedModelError(f"{self._path}: metadata {key!r} must be a list of strings")
        return value


def _config(meta: _Metadata, arch: str, tensors: dict[str, Any], n_tokens: int) -> ModelConfig:
    """The ``config.json`` this file's metadata stands for, parsed by the usual rules."""
    heads = int(meta.number(f"{arch}.attention.head_count"))
    hidden = int(meta.number(f"{arch}.embedding_length"))
    head_dim = int(meta.number(f"{arch}.attention.key_length", hidden // heads))
    rotary = int(meta.number(f"{arch}.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise UnsupportedModelError(
            f"RoPE over {rotary} of {head_dim} head dimensions (partial rotary) is not supported"
        )
    raw = {
        "model_type": arch,
        "vocab_size": int(meta.number(f"{arch}.vocab_size", n_tokens)),
        "hidden_size": hidden,
        "intermediate_size": int(meta.number(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(meta.number(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.number(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(meta.number(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.number(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta.number(f"{arch}.context_length")),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
    }
    return ModelConfig.from_dict(raw)


def _hf_name(name: str, path: str) -> str:
    """``blk.3.attn_q.weight`` → ``model.layers.3.self_attn.q_proj.weight``."""
    stem, _, suffix = name.rpartition(".")
    if stem.startswith("blk."):
        _, index, part = (stem + "..").split(".", 2)  # a short name maps to nothing
        mapped = _BLOCK_NAMES.get(part.rstrip("."))
        if mapped is not None:
            return f"model.layers.{index}.{mapped}.{suffix}"
    elif stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{suffix}"
    raise UnsupportedModelError(f"{path}: tensor {name} has no place in the engine's forward pass")


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (rows of each head: interleaved → halves)."""
    rows = weight.shape[0]
    half = rows // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _tokenizer(
    meta: _Metadata, tokens: list[str], path: str
) -> tuple[str, dict[str, str | None], tuple[int, ...]]:
    """``tokenizer.json`` text, the special tokens' texts and the end-of-sequence ids."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise UnsupportedModelError(
            f"{path}: tokenizer model {model!r} is not supported (only byte-level BPE, 'gpt2')"
        )
    pre = meta.get("tokenizer.ggml.pre") or "default"
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"{path}: pre-tokenizer {pre!r} is not supported "
            f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})"
        )
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = meta.strings("tokenizer.ggml.merges", optional=True)  # a writer drops empty lists
    added = [
        {
            "id": i,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind == _CONTROL,
        }
        for i, (text, kind) in enumerate(zip(tokens, types, strict=True))
        if kind in (_CONTROL, _USER_DEFINED)
    ]
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {text: i for i, text in enumerate(tokens)},
            "merges": merges,
        },
    }

    def token(key: str) -> str | None:
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[value] if isinstance(value, int) and 0 <= value < len(tokens) else None

    specials = {
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "unk_token": token("unknown"),
        "pad_token": token("padding"),
    }
    eos = {
        value
        for key in ("eos", "eot", "eom")
        if isinstance(value := meta.get(f"tokenizer.ggml.{key}_token_id"), int)
    }
    return json.dumps(document, ensure_ascii=False), specials, tuple(sorted(eos))
