"""The random tiny model for fast tests, made the same way byte for byte on every run.

``make_model(dir)`` writes a complete Hugging Face style Qwen3 checkpoint, tiny enough for
tests and the demo (2 layers, hidden 64, 4 query heads over 2 key/value heads):

- ``tokenizer.json``: byte-level BPE trained with ``tokenizers`` on ``data/corpus.txt``
  (the trainer is deterministic), vocabulary :data:`VOCAB_SIZE` with the
  ChatML specials and the tool-call tags;
- ``model.safetensors``: weights drawn from a seeded SHA-256 counter stream (uniform, std
  0.02; norms at 1), so they depend on nothing but :data:`SEED` and IEEE arithmetic, not
  on the torch or numpy version; written by :func:`write_safetensors`, which fixes the
  tensor order and header bytes itself rather than trusting a library's layout;
- ``config.json``, ``generation_config.json`` and ``tokenizer_config.json`` (with the
  ChatML template of ``data/chat_template.jinja``: tools in the system turn, assistant
  ``<tool_call>`` blocks, ``tool`` messages as ``<tool_response>``), as sorted JSON.

``data/tiny_model.sha256`` holds the known answers: the weights digest (as
:func:`inference.weights.weights_digest` computes it) and each file's SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from inference.config import ModelConfig
from inference.model import checkpoint_layout
from inference.weights import weights_digest

__all__ = [
    "KNOWN_ANSWERS",
    "SEED",
    "VOCAB_SIZE",
    "MadeModel",
    "known_answers",
    "make_model",
    "train_tokenizer",
    "write_safetensors",
]

DATA = Path(__file__).parent / "data"
CORPUS = DATA / "corpus.txt"
CHAT_TEMPLATE = DATA / "chat_template.jinja"
KNOWN_ANSWERS = DATA / "tiny_model.sha256"

SEED = b"affidavit tiny model v1"
VOCAB_SIZE = 768
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TAG_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
INIT_STD = 0.02

_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "initializer_range": INIT_STD,
    "torch_dtype": "float32",
    "bos_token_id": None,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


@dataclass(frozen=True)
class MadeModel:
    """Where the model went and the digests to compare with :func:`known_answers`."""

    path: Path
    weights_digest: str
    file_sha256: dict[str, str]

    def answers(self) -> dict[str, str]:
        """The same keys as :func:`known_answers`."""
        return {"weights_digest": self.weights_digest, **self.file_sha256}


def make_model(out_dir: str | Path) -> MadeModel:
    """Write the tiny model into ``out_dir`` (created; it must be absent or empty)."""
    root = Path(out_dir)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root} exists and is not an empty directory")
    root.mkdir(parents=True, exist_ok=True)

    tokenizer_json = train_tokenizer(CORPUS.read_text(encoding="utf-8"))
    ids = {tok: _token_id(tokenizer_json, tok) for tok in SPECIAL_TOKENS}
    config = dict(_CONFIG, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    layout = checkpoint_layout(ModelConfig.from_dict(config))
    tensors = {name: _init(name, shape) for name, shape in sorted(layout.items())}

    files = {
        "config.json": _json_bytes(config),
        "generation_config.json": _json_bytes(
            {
                "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                "pad_token_id": ids["<|endoftext|>"],
                "do_sample": False,
            }
        ),
        "tokenizer.json": tokenizer_json.encode("utf-8"),
        "tokenizer_config.json": _json_bytes(
            {
                "add_bos_token": False,
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "chat_template": CHAT_TEMPLATE.read_text(encoding="utf-8"),
                "clean_up_tokenization_spaces": False,
                "model_max_length": _CONFIG["max_position_embeddings"],
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        ),
        "model.safetensors": write_safetensors(tensors),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    return MadeModel(
        path=root,
        weights_digest=weights_digest(root),
        file_sha256={
            name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())
        },
    )


def train_tokenizer(corpus: str) -> str:
    """``tokenizer.json`` text of a byte-level BPE trained on ``corpus``.

    The trainer breaks ties between equally frequent pairs deterministically: the same
    corpus gives the same bytes with any number of threads (checked by training in
    separate processes; the known-answer test keeps checking it).
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TAG_TOKENS),
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    if tokenizer.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        raise RuntimeError(
            f"the corpus yields {tokenizer.get_vocab_size(with_added_tokens=True)} tokens, "
            f"not {VOCAB_SIZE}: it is too small for the vocabulary"
        )
    text: str = tokenizer.to_str(pretty=False)
    return text


def write_safetensors(tensors: dict[str, np.ndarray[Any, Any]]) -> bytes:
    """The bytes of a safetensors file of float32 arrays, laid out in sorted-name order.

    Header: sorted-key compact JSON with ``__metadata__ = {"format": "pt"}``, padded with
    spaces to a multiple of 8 bytes, after its 8-byte little-endian length; then each
    tensor's little-endian bytes in the same order.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name], dtype="<f4")
        blob = array.tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
        blobs.append(blob)
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def known_answers() -> dict[str, str]:
    """The committed digests: ``weights_digest`` and ``<file name>`` → SHA-256 hex."""
    answers = {}
    for line in KNOWN_ANSWERS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split()
            answers[key] = value
    return answers


def _init(name: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """Uniform weights with std :data:`INIT_STD` from SHA-256(SEED, name, counter); norms 1."""
    count = int(np.prod(shape))
    if name.endswith("norm.weight"):
        return np.ones(shape, dtype=np.float32)
    stream = bytearray()
    counter = 0
    while len(stream) < 4 * count:
        block = SEED + b"\x00" + name.encode("utf-8") + b"\x00" + counter.to_bytes(8, "big")
        stream += hashlib.sha256(block).digest()
        counter += 1
    words = np.frombuffer(bytes(stream[: 4 * count]), dtype=">u4").astype(np.float64)
    uniform = (words + 0.5) / 2.0**32 * 2.0 - 1.0  # in (-1, 1), exact in float64
    half_width = INIT_STD * math.sqrt(3.0)  # sqrt is correctly rounded everywhere
    return (uniform * half_width).astype(np.float32).reshape(shape)


def _token_id(tokenizer_json: str, token: str) -> int:
    for added in json.loads(tokenizer_json)["added_tokens"]:
        if added["content"] == token:
            return int(added["id"])
    raise KeyError(token)


def _json_bytes(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8")
