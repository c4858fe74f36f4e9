"""Batch invariance: a sequence's logits are the same bits alone or in any batch.

- the start-up self-test passes through some path and says which;
- the linear kernels: a row through :func:`invariant_linear` (and the per-row path) is
  bit-identical alone and in batches of odd sizes, wherever it sits, and equals stock
  ``F.linear`` numerically; so are our SiLU and RMSNorm, at widths where a vector loop's
  scalar tail would round torch's ``F.silu``/``rsqrt`` differently;
- a decode step of the shipped tiny model alone equals the same step batched with 1, 7
  and 31 other sequences of other lengths (``torch.equal``, 12 probes per batch size), and
  a short generation alone equals the same generation inside a changing batch;
- prefill in pieces through the KV cache (prefix, then the rest; several cut points; or a
  prefill then a decode of the last token) equals a one-shot prefill, bit for bit, and so
  does a cloned-and-truncated cache (the prefix-cache operations).
"""

from __future__ import annotations

import json
import math
import random

import pytest

torch = pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")

import torch.nn.functional as F  # noqa: E402

from inference.cache import SequenceCache  # noqa: E402
from inference.invariant import (  # noqa: E402
    MAX_CALL_ROWS,
    PATHS,
    invariant_linear,
    linear_for,
    padded_linear,
    per_row_linear,
)
from inference.model import DecoderModel, rms_norm, silu  # noqa: E402
from inference.self_test import self_test  # noqa: E402

BATCH_SIZES = (2, 8, 32)
PROBES = 12


def test_self_test_passes_and_reports_its_path() -> None:
    report = self_test()
    assert report.passed, report
    assert report.path in PATHS
    chosen = [c for c in report.checks if c.path == report.path]
    assert chosen and all(c.passed for c in chosen)
    assert any(c.name == "decode step" for c in chosen)
    data = report.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert set(data) >= {"path", "passed", "checks", "mkl_cbwr", "torch_version", "num_threads"}
    print(f"self-test picked {report.path!r}; MKL_CBWR={report.mkl_cbwr!r}")


def test_self_test_on_a_model_leaves_it_on_the_chosen_path(tiny_model: DecoderModel) -> None:
    report = self_test(tiny_model, batch_sizes=(3, 16), decode_batch_sizes=(5,))
    assert report.passed
    assert tiny_model.linear_path == report.path
    assert {c.name for c in report.checks} >= {"linear q_proj", "linear lm_head", "decode step"}
    tiny_model.linear_path = "fixed-chunk-8"


def test_the_self_test_names_each_place_that_gets_other_bits(
    tiny_model: DecoderModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe sits at three places of one product (or one decode step) at once; each
    place is still judged on its own: a kernel that rounds only the last row of a product
    differently, and a decode step that does so only for the middle sequence, are named
    at exactly those places, and no path passes."""

    def last_row_off(path: str) -> object:
        def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> object:
            out = padded_linear(x, weight, bias)  # invariant here, but for the last row:
            if x.shape[0] > 1:
                out[-1] = torch.nextafter(out[-1], torch.full_like(out[-1], math.inf))
            return out

        return linear

    with monkeypatch.context() as patched:
        patched.setattr("inference.self_test.linear_for", last_row_off)
        report = self_test(batch_sizes=(3, 13, 16))
    assert not report.passed and report.path == "per-row"
    linear_checks = [c for c in report.checks if c.name.startswith("linear")]
    assert linear_checks and {c.detail for c in linear_checks} == {
        "differs: batch 3 row 2, batch 13 row 12, batch 16 row 15"
    }

    real_decode = tiny_model.decode

    def middle_off(caches: list[SequenceCache], token_ids: list[int]) -> torch.Tensor:
        logits = real_decode(caches, token_ids)
        if len(caches) > 1:
            middle = len(caches) // 2
            logits[middle] = torch.nextafter(logits[middle], torch.full_like(logits[middle], 0))
        return logits

    monkeypatch.setattr(tiny_model, "decode", middle_off)
    report = self_test(tiny_model, batch_sizes=(3,), decode_batch_sizes=(5, 16))
    decode_checks = [c for c in report.checks if c.name == "decode step"]
    assert not report.passed and len(decode_checks) == len(PATHS) - 1  # not per-row's
    assert {c.detail for c in decode_checks} == {"differs: batch 5 row 2, batch 16 row 8"}
    tiny_model.linear_path = "fixed-chunk-8"


def test_prefill_many_fills_each_cache_as_its_own_prefill_does(tiny_model: DecoderModel) -> None:
    rng = random.Random(9)
    vocab = tiny_model.config.vocab_size
    prompts = [_prompt(rng, vocab, n) for n in (1, 5, 17, 3)]
    together = [tiny_model.new_cache() for _ in prompts]
    logits = tiny_model.prefill_many(list(zip(together, prompts, strict=True)))
    assert logits.shape == (len(prompts), vocab)
    for row, cache, prompt in zip(logits, together, prompts, strict=True):
        alone = tiny_model.new_cache()
        assert torch.equal(row, tiny_model.prefill(alone, prompt))
        assert cache.length == alone.length == len(prompt)
        token = rng.randrange(vocab)
        assert torch.equal(tiny_model.decode([cache], [token]), tiny_model.decode([alone], [token]))
    with pytest.raises(ValueError, match="at least one token"):
        tiny_model.prefill_many([(tiny_model.new_cache(), [1]), (tiny_model.new_cache(), [])])


@pytest.mark.parametrize("linear", [padded_linear, invariant_linear, per_row_linear])
def test_linear_rows_do_not_depend_on_the_batch(linear: object) -> None:
    assert callable(linear)
    generator = torch.Generator().manual_seed(5)
    for width, out in ((64, 96), (72, 40), (256, 768)):
        weight = torch.randn((out, width), generator=generator)
        bias = torch.randn((out,), generator=generator)
        row = torch.randn((1, width), generator=generator)
        alone = linear(row, weight, bias)[0]
        torch.testing.assert_close(alone, F.linear(row, weight, bias)[0])
        for batch in (1, 5, 8, 9, 17, 64, MAX_CALL_ROWS + 3):
            for position in {0, batch // 3, batch - 1}:
                rows = torch.randn((batch, width), generator=generator)
                rows[position] = row[0]
                assert torch.equal(linear(rows, weight, bias)[position], alone), (batch, position)


def test_self_test_picks_the_one_call_path_on_this_build() -> None:
    """On the CPU build pinned in constraints.txt, stock ``F.linear`` gives a row alone other
    bits than in a batch (rows past a multiple of four take another kernel), while every
    product of a multiple of 8 rows gives it the same bits, so the self-test settles on ``padded-8``, the
    path that reads the weights once per step. If a torch update changes that, this test
    says so rather than the engine silently running twice as slow."""
    report = self_test()
    assert [c.passed for c in report.checks if c.path == "stock"][:1] == [False], report
    assert report.path == "padded-8", report


def test_padded_path_calls_the_kernel_with_multiples_of_8_rows_up_to_512(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shapes: list[int] = []
    real = F.linear

    def spy(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        shapes.append(x.shape[0])
        return real(x, weight)

    monkeypatch.setattr("inference.invariant.F.linear", spy)
    weight = torch.randn((4, 3))
    for rows in (0, 1, 9, 300, MAX_CALL_ROWS, 2 * MAX_CALL_ROWS + 1):
        shapes.clear()
        x = torch.randn((rows, 3))
        out = padded_linear(x, weight)
        assert out.shape == (rows, 4)
        assert all(n % 8 == 0 and 8 <= n <= MAX_CALL_ROWS for n in shapes), (rows, shapes)
        torch.testing.assert_close(out, F.linear(x, weight))


def test_padded_and_fixed_chunk_paths_give_the_same_bits_here(tiny_model: DecoderModel) -> None:
    """Records written before ``padded-8`` existed ran on ``fixed-chunk-8``; on this build a
    re-execution on the new path must still give them byte for byte (a long prefill, then
    decode steps of 1 and 11 sequences)."""
    rng = random.Random(9)
    vocab = tiny_model.config.vocab_size
    prompts = [_prompt(rng, vocab, 3 + 40 * i) for i in range(11)]
    steps = [rng.randrange(vocab) for _ in prompts]
    out = {}
    try:
        for path in ("fixed-chunk-8", "padded-8"):
            tiny_model.linear_path = path  # type: ignore[assignment]
            caches = [tiny_model.new_cache() for _ in prompts]
            first = [tiny_model.prefill_all(c, p) for c, p in zip(caches, prompts, strict=True)]
            alone = tiny_model.decode([caches[0].clone()], steps[:1])
            out[path] = [*first, alone, tiny_model.decode(caches, steps)]
    finally:
        tiny_model.linear_path = "fixed-chunk-8"
    assert all(
        torch.equal(a, b) for a, b in zip(out["fixed-chunk-8"], out["padded-8"], strict=True)
    )


def test_linear_for_rejects_unknown_paths() -> None:
    assert linear_for("fixed-chunk-8") is invariant_linear
    assert linear_for("padded-8") is padded_linear
    with pytest.raises(ValueError, match="unknown linear path"):
        linear_for("fast")  # type: ignore[arg-type]


def _prompt(rng: random.Random, vocab: int, length: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


def _pool(model: DecoderModel, rng: random.Random, count: int) -> list[SequenceCache]:
    caches = []
    for _ in range(count):
        cache = model.new_cache()
        model.prefill(cache, _prompt(rng, model.config.vocab_size, rng.randint(1, 40)))
        caches.append(cache)
    return caches


@pytest.mark.parametrize("batch", BATCH_SIZES)
def test_decode_alone_equals_decode_batched(tiny_model: DecoderModel, batch: int) -> None:
    rng = random.Random(batch)
    vocab = tiny_model.config.vocab_size
    pool = _pool(tiny_model, rng, PROBES + batch)
    for probe in range(PROBES):
        target = pool[probe]
        token = rng.randrange(vocab)
        alone = tiny_model.decode([target.clone()], [token])[0]
        others = rng.sample([c for c in pool if c is not target], batch - 1)
        position = rng.randrange(batch)
        caches = [c.clone() for c in others]
        caches.insert(position, target.clone())
        tokens = [rng.randrange(vocab) for _ in range(batch)]
        tokens[position] = token
        batched = tiny_model.decode(caches, tokens)
        assert torch.equal(batched[position], alone), (batch, probe, position)


def test_generation_alone_equals_generation_in_a_changing_batch(tiny_model: DecoderModel) -> None:
    rng = random.Random(11)
    vocab = tiny_model.config.vocab_size
    prompt = _prompt(rng, vocab, 17)

    alone_cache = tiny_model.new_cache()
    logits = tiny_model.prefill(alone_cache, prompt)
    alone = [logits]
    for _ in range(8):
        alone.append(tiny_model.decode([alone_cache], [int(alone[-1].argmax())])[0])

    cache = tiny_model.new_cache()
    batched = [tiny_model.prefill(cache, prompt)]
    others = _pool(tiny_model, rng, 8)
    for step in range(8):
        company = others[: (step * 3) % 8]
        caches = [*company[: len(company) // 2], cache, *company[len(company) // 2 :]]
        tokens = [rng.randrange(vocab) for _ in caches]
        tokens[len(company) // 2] = int(batched[-1].argmax())
        batched.append(tiny_model.decode(caches, tokens)[len(company) // 2])
    assert all(torch.equal(a, b) for a, b in zip(alone, batched, strict=True))


def test_prefill_in_pieces_equals_one_shot(tiny_model: DecoderModel) -> None:
    rng = random.Random(3)
    prompt = _prompt(rng, tiny_model.config.vocab_size, 90)
    whole = tiny_model.prefill(tiny_model.new_cache(), prompt)
    for cut in (1, 8, 13, 64, 89):
        cache = tiny_model.new_cache()
        tiny_model.prefill(cache, prompt[:cut])
        assert torch.equal(tiny_model.prefill(cache, prompt[cut:]), whole), cut
    cache = tiny_model.new_cache()
    for start in range(0, len(prompt), 16):
        last = tiny_model.prefill(cache, prompt[start : start + 16])
    assert torch.equal(last, whole)
    cache = tiny_model.new_cache()
    tiny_model.prefill(cache, prompt[:-1])
    assert torch.equal(tiny_model.decode([cache], [prompt[-1]])[0], whole)


def test_prefill_all_rows_equal_prefill_of_each_prefix(tiny_model: DecoderModel) -> None:
    rng = random.Random(4)
    prompt = _prompt(rng, tiny_model.config.vocab_size, 20)
    every = tiny_model.prefill_all(tiny_model.new_cache(), prompt)
    for end in (1, 7, 20):
        assert torch.equal(every[end - 1], tiny_model.prefill(tiny_model.new_cache(), prompt[:end]))


def test_cloned_and_truncated_cache_resumes_exactly(tiny_model: DecoderModel) -> None:
    rng = random.Random(6)
    vocab = tiny_model.config.vocab_size
    prefix, first, second = (_prompt(rng, vocab, n) for n in (30, 12, 9))
    cache = tiny_model.new_cache()
    tiny_model.prefill(cache, prefix)
    kept = cache.clone()
    tiny_model.prefill(cache, first)
    cache.truncate(len(prefix))
    from_truncated = tiny_model.prefill(cache, second)
    from_clone = tiny_model.prefill(kept, second)
    one_shot = tiny_model.prefill(tiny_model.new_cache(), prefix + second)
    assert torch.equal(from_truncated, one_shot)
    assert torch.equal(from_clone, one_shot)
    assert cache.length == kept.length == len(prefix) + len(second)
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate(cache.length + 1)


def test_cache_growth_does_not_change_results(tiny_model: DecoderModel) -> None:
    rng = random.Random(8)
    prompt = _prompt(rng, tiny_model.config.vocab_size, 300)  # crosses a 256-position block
    whole = tiny_model.prefill(tiny_model.new_cache(), prompt)
    cache = tiny_model.new_cache()
    tiny_model.prefill(cache, prompt[:250])
    assert cache.capacity == 256
    assert torch.equal(tiny_model.prefill(cache, prompt[250:]), whole)
    assert cache.capacity == 512


def test_decode_refuses_a_cache_twice(tiny_model: DecoderModel) -> None:
    cache = tiny_model.new_cache()
    tiny_model.prefill(cache, [1, 2, 3])
    with pytest.raises(ValueError, match="twice"):
        tiny_model.decode([cache, cache], [4, 5])
    assert cache.length == 3


def test_elementwise_ops_do_not_depend_on_the_batch() -> None:
    # Widths that are not a multiple of the vector loop put some elements in its scalar tail,
    # where torch's own F.silu / rsqrt round differently on some CPUs; ours must not care.
    generator = torch.Generator().manual_seed(9)
    for width in (100, 64, 4864):
        weight = torch.rand((width,), generator=generator) + 0.5
        row = torch.randn((1, width), generator=generator) * 4
        for batch in (3, 7, 16):
            rows = torch.randn((batch, width), generator=generator) * 4
            rows[batch - 1] = row[0]
            assert torch.equal(silu(rows)[batch - 1], silu(row)[0])
            assert torch.equal(
                rms_norm(rows, weight, 1e-6)[batch - 1], rms_norm(row, weight, 1e-6)[0]
            )
        torch.testing.assert_close(silu(row), F.silu(row))
        torch.testing.assert_close(
            rms_norm(row, weight, 1e-6),
            weight * (row * torch.rsqrt(row.pow(2).mean(-1, keepdim=True) + 1e-6)),
        )
