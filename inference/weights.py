"""A checkpoint's weight files: which they are, their tensors in float32, and their digest.

**Which files.** If ``model.safetensors.index.json`` exists, the files its ``weight_map``
names; otherwise every ``*.safetensors`` file in the directory. Either way they are taken
in sorted order of their file names (Python string order of the names, i.e. code points).

**Weights digest** (the engine's half of the reproducibility block)::

    SHA-256( 0x0A
             || for each weight file, in sorted name order:
                  name (UTF-8 bytes of the file name, no directory)
                  || 0x00
                  || length of the file in bytes, 8-byte big-endian
                  || the file's bytes )

written ``sha256:<64 lowercase hex>``. ``0x0A`` is ``record.digest.Domain.WEIGHTS``;
``record.digest.digest`` takes the whole input as one ``bytes`` object, which a
multi-gigabyte checkpoint should not be, so the hash is streamed with ``hashlib`` here and
the domain byte is written in exactly one place, as ``bytes((Domain.WEIGHTS,))``. The name
and the length frame each file, so no two different file sets hash the same stream. The
index JSON and the other files of the directory are not weights and are not covered.

A GGUF checkpoint is one file that holds the weights, the tokenizer and the chat template
together; its digest is the same rule over that one file (:func:`file_digests`), so it
covers every byte the engine loads from it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file

from record.digest import PREFIX, Domain

if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = ["file_digests", "load_weights", "weight_files", "weights_digest"]

INDEX_NAME = "model.safetensors.index.json"
_CHUNK = 1 << 20


def weight_files(model_dir: str | Path) -> list[Path]:
    """The checkpoint's safetensors files, sorted by name (see the module docstring)."""
    root = Path(model_dir)
    index = root / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        names = sorted(set(weight_map.values()))
        if not names:
            raise FileNotFoundError(f"{index} names no weight files")
    else:
        names = sorted(p.name for p in root.glob("*.safetensors"))
        if not names:
            raise FileNotFoundError(f"{root} holds no *.safetensors file")
    files = [root / name for name in names]
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"weight file {path} is missing")
    return files


def load_weights(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of every weight file, converted to contiguous float32, keyed by name."""
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(model_dir):
        for name, tensor in load_file(str(path), device="cpu").items():
            if name in tensors:
                raise ValueError(f"tensor {name!r} appears in more than one weight file")
            tensors[name] = tensor.to(torch.float32).contiguous()
    return tensors


def weights_digest(model_dir: str | Path) -> str:
    """``sha256:<hex>`` of the weight files, by the rule in the module docstring."""
    return _digest(weight_files(model_dir), plain=None)


def file_digests(path: Path) -> tuple[str, str]:
    """One file's weights digest and its plain SHA-256 hex, in one read of its bytes (a
    GGUF checkpoint: the block names both)."""
    plain = hashlib.sha256()
    return _digest([path], plain=plain), plain.hexdigest()


def _digest(files: list[Path], plain: _Hash | None) -> str:
    h = hashlib.sha256(bytes((Domain.WEIGHTS,)))
    for path in files:
        h.update(path.name.encode("utf-8"))
        h.update(b"\x00")
        size = path.stat().st_size
        h.update(size.to_bytes(8, "big"))
        read = 0
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                h.update(chunk)
                if plain is not None:
                    plain.update(chunk)
                read += len(chunk)
        if read != size:
            raise OSError(f"{path} changed while it was hashed ({size} bytes, then {read})")
    return PREFIX + h.hexdigest()
