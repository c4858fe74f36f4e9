"""Weight files: which are read, how they convert, and the documented weights digest.

- the digest equals the rule in ``inference.weights``' docstring, recomputed here with
  hashlib alone (0x0A, then per file in sorted name order: name, 0x00, 8-byte big-endian
  length, bytes), and it changes with any byte, name or file;
- shards: an index file decides which files count; without one, every ``*.safetensors``;
- bfloat16 weights load as float32; a checkpoint missing a tensor, or holding one this
  configuration does not use, is refused with the tensor named.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")

from safetensors.torch import save_file  # noqa: E402

from inference.model import DecoderModel  # noqa: E402
from inference.weights import load_weights, weight_files, weights_digest  # noqa: E402


def reference_digest(files: list[Path]) -> str:
    h = hashlib.sha256(b"\x0a")
    for path in sorted(files, key=lambda p: p.name):
        data = path.read_bytes()
        h.update(path.name.encode() + b"\x00" + len(data).to_bytes(8, "big") + data)
    return "sha256:" + h.hexdigest()


def test_digest_follows_the_documented_rule(tmp_path: Path) -> None:
    save_file({"b": torch.ones(3)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    save_file({"a": torch.zeros(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    (tmp_path / "notes.txt").write_text("not a weight file")
    files = weight_files(tmp_path)
    assert [p.name for p in files] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    digest = weights_digest(tmp_path)
    assert digest == reference_digest(files)

    (tmp_path / "notes.txt").write_text("changed, still not weights")
    assert weights_digest(tmp_path) == digest
    (tmp_path / "model-00001-of-00002.safetensors").rename(tmp_path / "renamed.safetensors")
    assert weights_digest(tmp_path) != digest


def test_index_decides_the_shards(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(2)}, str(tmp_path / "part-1.safetensors"))
    save_file({"b": torch.ones(3)}, str(tmp_path / "part-2.safetensors"))
    save_file({"stale": torch.ones(1)}, str(tmp_path / "old-copy.safetensors"))
    index = {"weight_map": {"b": "part-2.safetensors", "a": "part-1.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert [p.name for p in weight_files(tmp_path)] == ["part-1.safetensors", "part-2.safetensors"]
    assert set(load_weights(tmp_path)) == {"a", "b"}

    index["weight_map"]["c"] = "part-3.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="part-3"):
        weight_files(tmp_path)


def test_no_weights_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="safetensors"):
        weights_digest(tmp_path)


def test_bfloat16_loads_as_float32(tmp_path: Path) -> None:
    value = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    save_file({"w": value}, str(tmp_path / "model.safetensors"))
    loaded = load_weights(tmp_path)["w"]
    assert loaded.dtype == torch.float32
    assert torch.equal(loaded, value.to(torch.float32))


def test_checkpoint_must_match_the_configuration(tiny_model_dir: Path, tmp_path: Path) -> None:
    from inference.config import load_config

    config = load_config(tiny_model_dir)
    weights = load_weights(tiny_model_dir)
    missing = dict(weights)
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"lacks 1 tensors.*up_proj"):
        DecoderModel(config, missing)
    extra = {**weights, "model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}
    with pytest.raises(ValueError, match=r"does not use.*q_proj\.bias"):
        DecoderModel(config, extra)
    wrong = {**weights, "model.norm.weight": torch.ones(63)}
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape"):
        DecoderModel(config, wrong)
