"""Our forward pass against ``transformers``' own implementation, on the same weights.

For Llama (with and without biases, Llama 3 RoPE scaling, multi-head and grouped-query),
Qwen2 (q/k/v bias) and Qwen3 (per-head q/k RMSNorm, tied embeddings), a tiny random model
is built with ``transformers``' classes (eager attention, float32, fixed seed, every weight
and bias randomised so none is trivially zero or one), saved with ``save_pretrained`` as
safetensors and loaded by our engine. We compare:

- the logits of every prompt position from one prefill (:meth:`DecoderModel.prefill_all`);
- the last-position logits of each step of a greedy continuation through our KV cache
  (:meth:`DecoderModel.decode`) against a full ``transformers`` forward of the same tokens.

Relative error is ``max|ours - theirs| / max|theirs|`` and must be at most 1e-4. The tiny
model we ship is checked the same way against ``transformers``' Qwen3.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")
transformers = pytest.importorskip(
    "transformers", reason="parity tests compare against transformers (a test dependency)"
)

from inference.config import UnsupportedModelError, load_config  # noqa: E402
from inference.model import DecoderModel  # noqa: E402

TOLERANCE = 1e-4
PROMPT_LENGTH = 24
STEPS = 6

COMMON: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
}

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-gqa": ("Llama", {}),
    "llama-mha-biases": (
        "Llama",
        {"num_key_value_heads": 4, "attention_bias": True, "mlp_bias": True},
    ),
    "llama3-rope-scaling": (
        "Llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            "rope_theta": 500000.0,
        },
    ),
    "qwen2-bias": ("Qwen2", {"rope_theta": 1000000.0}),
    "qwen3-qk-norm-tied": ("Qwen3", {"head_dim": 32, "tie_word_embeddings": True}),
}


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


def build_reference(family: str, overrides: dict[str, Any], path: Path) -> Any:
    """A random ``transformers`` model of ``family``, saved to ``path``; returned in eval mode."""
    config_class = getattr(transformers, f"{family}Config")
    model_class = getattr(transformers, f"{family}ForCausalLM")
    config = config_class(**{**COMMON, **overrides}, attn_implementation="eager")
    torch.manual_seed(0)
    model = model_class(config).to(torch.float32).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name:
                parameter.copy_(1.0 + 0.1 * noise)
            else:
                parameter.copy_(0.08 * noise)
    model.save_pretrained(path)
    return model


def reference_logits(model: Any) -> Callable[[list[int]], torch.Tensor]:
    def logits(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = model(torch.tensor([tokens])).logits[0]
        return out

    return logits


def check_parity(
    ours: DecoderModel, theirs: Callable[[list[int]], torch.Tensor], vocab: int
) -> list[float]:
    """Errors of the prefill (all positions) and of each greedy decode step."""
    generator = torch.Generator().manual_seed(2)
    prompt = [int(t) for t in torch.randint(0, vocab, (PROMPT_LENGTH,), generator=generator)]
    cache = ours.new_cache()
    got = ours.prefill_all(cache, prompt)
    errors = [relative_error(got, theirs(prompt))]
    tokens = list(prompt)
    step_logits = got[-1]
    for _ in range(STEPS):
        tokens.append(int(step_logits.argmax()))
        step_logits = ours.decode([cache], [tokens[-1]])[0]
        errors.append(relative_error(step_logits, theirs(tokens)[-1]))
    assert cache.length == len(tokens)
    return errors


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case: str, tmp_path: Path) -> None:
    family, overrides = CASES[case]
    reference = build_reference(family, overrides, tmp_path)
    ours = DecoderModel.load(tmp_path)
    assert ours.config.model_type == family.lower()
    errors = check_parity(ours, reference_logits(reference), COMMON["vocab_size"])
    print(f"{case}: prefill rel err {errors[0]:.2e}, decode max {max(errors[1:]):.2e}")
    assert max(errors) <= TOLERANCE, errors


def test_config_switches_follow_the_family(tmp_path: Path) -> None:
    build_reference("Qwen2", {}, tmp_path / "qwen2")
    qwen2 = load_config(tmp_path / "qwen2")
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm) == (True, False, False)
    build_reference("Qwen3", {"head_dim": 32}, tmp_path / "qwen3")
    qwen3 = load_config(tmp_path / "qwen3")
    assert (qwen3.qkv_bias, qwen3.qk_norm, qwen3.head_dim) == (False, True, 32)
    assert qwen3.num_key_value_groups == 2


def test_shipped_model_matches_transformers_qwen3(tiny_model_dir: Path) -> None:
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()
    assert type(reference).__name__ == "Qwen3ForCausalLM"
    ours = DecoderModel.load(tiny_model_dir)
    errors = check_parity(ours, reference_logits(reference), ours.config.vocab_size)
    assert max(errors) <= TOLERANCE, errors


def test_unknown_model_type_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "mistral", "hidden_size": 64}')
    with pytest.raises(UnsupportedModelError, match="'mistral'"):
        load_config(tmp_path)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"use_sliding_window": True}, "sliding-window"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn'"),
        ({"hidden_act": "gelu"}, "'gelu'"),
    ],
)
def test_what_we_cannot_run_is_refused(tmp_path: Path, extra: dict[str, Any], message: str) -> None:
    import json

    config = {"model_type": "qwen2", **COMMON, **extra}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=message):
        load_config(tmp_path)
