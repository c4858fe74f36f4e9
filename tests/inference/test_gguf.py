"""GGUF checkpoints: the loader on files written by ``gguf`` (every tensor type, the q/k
permutation, refusals by name), and on the real SmolLM2-135M-Instruct: its tokenizer
against fixed ids and an independent BPE, its logits and greedy tokens against
``transformers`` loading the same file."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the GGUF loader is part of the `engine` extra")
np = pytest.importorskip("numpy", reason="the GGUF loader is part of the `engine` extra")
gguf = pytest.importorskip("gguf", reason="the GGUF loader is part of the `engine` extra")
regex = pytest.importorskip("regex", reason="the reference tokenizer splits with `regex`")

from inference.checkpoint import Checkpoint, load_checkpoint  # noqa: E402
from inference.config import ModelConfig, UnsupportedModelError  # noqa: E402
from inference.gguf_file import read_gguf  # noqa: E402
from inference.model import DecoderModel  # noqa: E402
from inference.pull import KNOWN_MODELS  # noqa: E402
from record.digest import Domain  # noqa: E402

Q = gguf.GGMLQuantizationType


# -- files written by the gguf package ---------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


LLAMA = ModelConfig.from_dict(
    {
        "model_type": "llama",
        "vocab_size": 258,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    }
)
_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf: str) -> str:
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
    }
    if hf in top:
        return top[hf]
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, index, rest = hf.split(".", 3)
    stem, _, suffix = rest.rpartition(".")
    return f"blk.{index}.{_GGUF_NAMES[stem]}.{suffix}"


def _permute(w: Any, heads: int) -> Any:
    """llama.cpp's converter's q/k permutation (what the loader must undo)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_gguf(
    path: Path,
    weights: dict[str, Any],
    *,
    arch: str = "llama",
    qtype: Any = None,
    pre: str = "smollm",
    raw: dict[str, tuple[Any, Any]] | None = None,
) -> Path:
    """A GGUF file as llama.cpp's converter writes one, through ``gguf.GGUFWriter``."""
    c = LLAMA
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_vocab_size(c.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    tokens = [*_bytes_to_unicode().values(), "<|im_start|>", "<|im_end|>"]
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 256 + [3, 3])
    writer.add_token_merges([])
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(257)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for name, tensor in weights.items():
        array = tensor.numpy().astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            array = _permute(array, heads)
        if qtype is not None and array.ndim == 2:
            writer.add_tensor(_gguf_name(name), gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(_gguf_name(name), array)
    for name, (data, kind) in (raw or {}).items():
        writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _weights(config: ModelConfig = LLAMA) -> dict[str, Any]:
    """Random weights for every tensor of ``config`` (norms included)."""
    generator = torch.Generator().manual_seed(5)
    from inference.model import checkpoint_layout

    layout = checkpoint_layout(config)
    return {n: torch.randn(s, generator=generator) * 0.05 for n, s in layout.items()}


def test_an_f32_llama_loads_to_the_same_logits_bit_for_bit(tmp_path: Path) -> None:
    weights = _weights()
    path = write_gguf(tmp_path / "m.gguf", weights)
    read = read_gguf(path)
    # GGUF stores the epsilon as float32 (and the forward pass adds it to float32 anyway)
    assert read.config == replace(LLAMA, rms_norm_eps=float(np.float32(LLAMA.rms_norm_eps)))
    original, loaded = DecoderModel(LLAMA, weights), DecoderModel(read.config, read.weights)
    ids = [5, 77, 200, 3, 9, 18]
    assert torch.equal(
        loaded.prefill_all(loaded.new_cache(), ids), original.prefill_all(original.new_cache(), ids)
    )
    for name in (
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight",
    ):
        assert torch.equal(read.weights[name], weights[name]), name  # the permutation undone


def test_a_qwen2_with_biases_loads_to_the_same_logits_bit_for_bit(tmp_path: Path) -> None:
    qwen2 = replace(LLAMA, model_type="qwen2", qkv_bias=True)
    weights = _weights(qwen2)
    read = read_gguf(write_gguf(tmp_path / "m.gguf", weights, arch="qwen2"))
    assert read.config == replace(qwen2, rms_norm_eps=float(np.float32(LLAMA.rms_norm_eps)))
    original, loaded = DecoderModel(qwen2, weights), DecoderModel(read.config, read.weights)
    ids = [5, 77, 200, 3, 9, 18]
    assert torch.equal(
        loaded.prefill_all(loaded.new_cache(), ids), original.prefill_all(original.new_cache(), ids)
    )  # qwen2 is converted without llama's q/k permutation, and its biases map by name


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_every_supported_tensor_type_is_dequantized_as_gguf_does(
    tmp_path: Path, qtype: Any
) -> None:
    weights = _weights()
    read = read_gguf(write_gguf(tmp_path / "m.gguf", weights, qtype=qtype))
    name = "model.layers.1.mlp.down_proj.weight"
    expected = gguf.quants.dequantize(gguf.quants.quantize(weights[name].numpy(), qtype), qtype)
    assert read.weights[name].dtype == torch.float32
    assert torch.equal(read.weights[name], torch.from_numpy(expected))
    if qtype not in (Q.F16, Q.BF16):
        assert not torch.equal(read.weights[name], weights[name])  # really quantized


def test_an_unsupported_tensor_type_is_refused_naming_the_tensor_and_type(tmp_path: Path) -> None:
    weights = _weights()
    block = np.zeros((1, 176), dtype=np.uint8)  # one Q5_K block of 256 values
    path = write_gguf(tmp_path / "m.gguf", weights, raw={"blk.0.extra.weight": (block, Q.Q5_K)})
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.extra\.weight has type Q5_K"):
        read_gguf(path)


def test_an_unsupported_architecture_is_refused_by_name(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", _weights(), arch="phi3")
    with pytest.raises(UnsupportedModelError, match="architecture 'phi3' is not supported"):
        read_gguf(path)


def test_an_unknown_pre_tokenizer_is_refused_by_name(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", _weights(), pre="deepseek-v3")
    with pytest.raises(UnsupportedModelError, match="pre-tokenizer 'deepseek-v3'"):
        read_gguf(path)


def test_a_truncated_file_is_a_clear_error(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", _weights())
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:4000])
    with pytest.raises(UnsupportedModelError, match="truncated or corrupt"):
        read_gguf(cut)


def test_the_checkpoint_names_its_source_and_digests_the_file_it_loaded(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", _weights())
    loaded = load_checkpoint(path)
    data = path.read_bytes()
    framed = bytes((Domain.WEIGHTS,)) + b"m.gguf\x00" + len(data).to_bytes(8, "big") + data
    assert loaded.weights_digest == "sha256:" + hashlib.sha256(framed).hexdigest()
    assert loaded.source.to_dict() == {
        "format": "gguf",
        "file": "m.gguf",
        "file_sha256": hashlib.sha256(data).hexdigest(),
        "package": None,  # not a file inference.pull knows
        "version": None,
    }
    assert loaded.tokenizer.chat_template is not None
    assert loaded.tokenizer.eos_token_ids == (257,)


# -- the real model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> Checkpoint:
    return load_checkpoint(smollm2_gguf)


def test_smollm2_config_and_source(smollm2: Checkpoint, smollm2_gguf: Path) -> None:
    c = smollm2.config
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (
        "llama", 30, 576, 1536,
    )  # fmt: skip
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size) == (
        9, 3, 64, 49152,
    )  # fmt: skip
    assert c.tie_word_embeddings and c.rope_theta == 100000.0
    known = KNOWN_MODELS["smollm2-135m"]
    assert smollm2.source.to_dict() == {
        "format": "gguf",
        "file": smollm2_gguf.name,
        "file_sha256": known.file_sha256,
        "package": known.package,
        "version": known.version,
    }
    assert smollm2.tokenizer.chat_template and "<|im_start|>" in smollm2.tokenizer.chat_template


#: Strings and the ids SmolLM2's tokenizer gives them (``tokenizer.ggml.pre = smollm``:
#: every digit alone). Fixed here; the independent BPE below agrees with each.
TOKEN_IDS = {
    "The year 2024 had 366 days.": [504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 38, 2009, 30],
    "  two  spaces,\ttab and\nnewline": [216, 827, 216, 5600, 28, 197, 15999, 284, 198, 28160],
    "Price: $1,234.56 (approx.)!": [27148, 42, 1885, 33, 28, 34, 35, 36, 30, 37, 38, 365, 22046, 2677, 17],
    "Café naïve — 東京 😀 ü": [51, 1939, 2756, 15486, 46494, 1841, 17097, 247, 126, 16736, 122, 40303, 218, 5549, 137],
    "It's don't we'll I'm": [1589, 506, 1326, 982, 392, 3060, 339, 5248],
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n": [1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198],
    "x=3.14159e-10; y=[1,2,3]": [104, 45, 35, 30, 33, 36, 33, 37, 41, 85, 29, 33, 32, 43, 329, 7407, 33, 28, 34, 28, 35, 77],
    "<|endoftext|><repo_name><jupyter_code>print(42)<empty_output>": [0, 3, 13, 3272, 24, 36, 34, 25, 16],
}  # fmt: skip

#: llama.cpp's split for ``smollm`` (``llama-vocab.cpp``): digits alone, then GPT-2's words.
SMOLLM_SPLITS = (
    r"\p{N}",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
)


def _split(text: str) -> Iterator[str]:
    pieces = [text]
    for pattern in SMOLLM_SPLITS:
        out = []
        for piece in pieces:
            pos = 0
            for m in regex.finditer(pattern, piece):
                out += [piece[pos : m.start()]] if m.start() > pos else []
                out.append(m.group())
                pos = m.end()
            out += [piece[pos:]] if pos < len(piece) else []
        pieces = out
    yield from pieces


def reference_encode(
    text: str, tokens: list[str], merges: list[str], specials: set[str]
) -> list[int]:
    """GPT-2's BPE as its paper's code does it (lowest-ranked pair first), in plain Python:
    a second implementation beside ``tokenizers``' Rust one."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranks = {tuple(m.split(" ")): i for i, m in enumerate(merges)}
    chars = _bytes_to_unicode()

    @cache
    def bpe(word: str) -> tuple[str, ...]:
        parts = list(word)
        while len(parts) > 1:
            rank, i = min((ranks.get(p, 1 << 30), i) for i, p in enumerate(pairwise(parts)))
            if rank == 1 << 30:
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return tuple(parts)

    ids: list[int] = []
    pattern = "(" + "|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")"
    for chunk in regex.split(pattern, text):
        if chunk in specials:
            ids.append(vocab[chunk])
        elif chunk:
            for word in _split(chunk):
                ids += [vocab[t] for t in bpe("".join(chars[b] for b in word.encode()))]
    return ids


def test_smollm2_tokenizer_gives_the_fixed_ids_and_round_trips(
    smollm2: Checkpoint, smollm2_gguf: Path
) -> None:
    reader = gguf.GGUFReader(str(smollm2_gguf))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = reader.fields["tokenizer.ggml.merges"].contents()
    kinds = reader.fields["tokenizer.ggml.token_type"].contents()
    specials = {t for t, k in zip(tokens, kinds, strict=True) if k == 3}
    assert len(specials) == 17
    for text, ids in TOKEN_IDS.items():
        assert smollm2.tokenizer.encode(text) == ids, text
        assert reference_encode(text, tokens, merges, specials) == ids, text
        assert smollm2.tokenizer.decode(ids) == text
    for special in specials:  # each special token is one id, however it is surrounded
        assert smollm2.tokenizer.encode(f"a{special}b") == [
            tokens.index("a"), tokens.index(special), tokens.index("b"),
        ]  # fmt: skip
    assert smollm2.tokenizer.eos_token_ids == (tokens.index("<|im_end|>"),)


PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Summarise: the demo page says nothing left this machine.",
    "Wie heißt die Hauptstadt von Deutschland?",
]


@pytest.fixture(scope="module")
def reference_model(smollm2_gguf: Path) -> Any:
    transformers = pytest.importorskip("transformers", reason="the parity reference")
    pytest.importorskip("accelerate", reason="transformers loads GGUF files only with accelerate")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    return model.eval()


def test_smollm2_logits_match_transformers_on_the_same_file(
    smollm2: Checkpoint, reference_model: Any
) -> None:
    model = DecoderModel(smollm2.config, smollm2.weights)
    text = smollm2.tokenizer.render([{"role": "user", "content": PROMPTS[0]}])
    ids = smollm2.tokenizer.encode(text)
    ours = model.prefill_all(model.new_cache(), ids)
    with torch.no_grad():
        theirs = reference_model(torch.tensor([ids])).logits[0]
    relative = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    assert relative <= 1e-5, relative


def test_smollm2_greedy_tokens_match_transformers_on_five_prompts(
    smollm2: Checkpoint, reference_model: Any
) -> None:
    model = DecoderModel(smollm2.config, smollm2.weights)
    eos = smollm2.tokenizer.eos_token_ids[0]
    for prompt in PROMPTS:
        ids = smollm2.tokenizer.encode(
            smollm2.tokenizer.render([{"role": "user", "content": prompt}])
        )
        cache_ = model.new_cache()
        ours = [int(model.prefill(cache_, ids).argmax())]
        while len(ours) < 24 and ours[-1] != eos:
            ours.append(int(model.decode([cache_], [ours[-1]])[0].argmax()))
        with torch.no_grad():
            out = reference_model.generate(
                torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=eos,
                pad_token_id=eos,
            )  # fmt: skip
        theirs = out[0, len(ids) :].tolist()
        assert ours == theirs, (
            prompt,
            smollm2.tokenizer.decode(ours),
            smollm2.tokenizer.decode(theirs),
        )
    assert "Paris" in smollm2.tokenizer.decode(
        _greedy(model, smollm2, PROMPTS[0])
    )  # a real model answers: its first prompt's answer names the capital


def _greedy(model: DecoderModel, checkpoint: Checkpoint, prompt: str) -> list[int]:
    ids = checkpoint.tokenizer.encode(
        checkpoint.tokenizer.render([{"role": "user", "content": prompt}])
    )
    cache_ = model.new_cache()
    out = [int(model.prefill(cache_, ids).argmax())]
    while len(out) < 24 and out[-1] not in checkpoint.tokenizer.eos_token_ids:
        out.append(int(model.decode([cache_], [out[-1]])[0].argmax()))
    return out


def _patched(path: Path, find: bytes, after: int, value: bytes) -> Path:
    """A copy of ``path`` with ``value`` written ``after`` bytes past the first ``find``."""
    data = bytearray(path.read_bytes())
    at = data.index(find) + len(find) + after
    data[at : at + len(value)] = value
    out = path.with_name("patched.gguf")
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize(
    ("find", "after", "value", "message"),
    [
        (b"GGUF", 4, (1 << 60).to_bytes(8, "little"), "truncated or corrupt"),  # tensor count
        (b"general.architecture", 4, (1 << 50).to_bytes(8, "little"), "truncated or corrupt"),
        (b"llama.block_count", 4, (10**9).to_bytes(4, "little"), "metadata says 1000000000 blocks"),
        (b"token_embd.weight", 4, (1 << 40).to_bytes(8, "little"), "claim"),  # a dimension
    ],
    ids=["tensor-count", "string-length", "block-count", "tensor-size"],
)
def test_lengths_and_counts_past_the_file_are_refused_before_allocating(
    tmp_path: Path, find: bytes, after: int, value: bytes, message: str
) -> None:
    path = write_gguf(tmp_path / "m.gguf", _weights())
    with pytest.raises(UnsupportedModelError, match=message):
        read_gguf(_patched(path, find, after, value))


def test_a_broken_chat_template_in_the_file_is_a_typed_error(tmp_path: Path) -> None:
    from inference.tokenizer import ChatTemplateError

    path = write_gguf(tmp_path / "m.gguf", _weights())
    broken = _patched(path, b"{% for m in messages %}", -23, b"{% for m in messages }}")
    with pytest.raises(ChatTemplateError, match="does not parse"):
        load_checkpoint(broken)
