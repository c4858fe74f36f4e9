"""Seeded sampling: a request's tokens depend on its seed and its logits, nothing else.

- the same seed and logits give the same tokens and logprobs, bit for bit, in this process
  and in a fresh one; requests interleaved in any order, and the global RNG, never move a
  request's draws; every token costs exactly one draw, greedy ones included;
- greedy is the argmax (ties to the lowest id); top-k and top-p never let a token outside
  their set through over hundreds of seeds; a mask is honoured and an empty one refused;
- draws follow the probabilities (a loose frequency check);
- logprobs are the raw full-vocabulary log-softmax, whatever the temperature and mask;
- the shipped tiny model generates the same tokens for a seed alone or beside another
  request.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")

from inference.model import DecoderModel
from inference.sampling import (
    NoAllowedTokenError,
    SampledToken,
    Sampler,
    SamplingParams,
    new_seed,
)

REPO = Path(__file__).resolve().parents[2]
VOCAB = 768


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread for this module's model steps, restored afterwards.

    The tiny model's matrices are far too small to gain from threads, and on a shared
    2-core machine a busy neighbour kept MKL's second thread waiting: 2 s of generation
    took over a minute. The sampler's results do not depend on the thread count: the
    subprocess test runs there with two threads and compares bits.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def logits_stream(seed: int, steps: int, scale: float = 3.0) -> list[torch.Tensor]:
    """Float32 logits as a model would give them, with some exact ties thrown in."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        logits = torch.randn(VOCAB, generator=generator) * scale
        logits[10:20] = logits[5]  # ties
        out.append(logits.to(torch.float32))
    return out


def run(params: SamplingParams, seed: int, stream: list[torch.Tensor]) -> list[SampledToken]:
    sampler = Sampler(params, seed=seed)
    return [sampler.sample(logits) for logits in stream]


PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.7, top_p=0.9, top_k=50, logprobs=True, top_logprobs=5),
    SamplingParams(temperature=0),
]


@pytest.mark.parametrize("params", PARAMS)
def test_same_seed_same_tokens(params: SamplingParams) -> None:
    stream = logits_stream(1, 40)
    first = run(params, 1234, stream)
    assert first == run(params, 1234, stream)
    if not params.greedy:
        assert [t.token_id for t in first] != [t.token_id for t in run(params, 1235, stream)]


def test_interleaving_and_the_global_rng_never_move_a_requests_draws() -> None:
    params = SamplingParams(temperature=0.9, top_p=0.95)
    streams = {seed: logits_stream(seed, 30) for seed in (11, 12, 13)}
    alone = {seed: run(params, seed, stream) for seed, stream in streams.items()}
    order = [seed for seed in streams for _ in range(30)]
    for shuffle in range(3):
        random.Random(shuffle).shuffle(order)
        samplers = {seed: Sampler(params, seed=seed) for seed in streams}
        got: dict[int, list[SampledToken]] = {seed: [] for seed in streams}
        for seed in order:
            torch.manual_seed(shuffle)  # other code touching the global generator
            torch.rand(3)
            got[seed].append(samplers[seed].sample(streams[seed][len(got[seed])]))
        assert got == alone


def test_one_draw_per_token_whatever_the_settings() -> None:
    stream = logits_stream(2, 12)
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[[3, 500]] = True
    for params in [*PARAMS, SamplingParams(top_k=1), SamplingParams(top_p=0.01)]:
        sampler = Sampler(params, seed=5)
        for i, logits in enumerate(stream):
            sampler.sample(logits, mask if i % 2 else None)
        assert sampler.draws == len(stream)
        expected = torch.Generator().manual_seed(5)
        torch.rand(len(stream), generator=expected, dtype=torch.float64)
        assert torch.equal(sampler._generator.get_state(), expected.get_state())


def _replay(params: SamplingParams, seed: int, stream: list[torch.Tensor]) -> list[Any]:
    return [
        [t.token_id, t.logprob.hex(), [[i, p.hex()] for i, p in t.top]]
        for t in run(params, seed, stream)
    ]


def test_a_subprocess_draws_the_same_tokens_bit_for_bit(tmp_path: Path) -> None:
    """Also with two threads there and one here (:func:`one_thread`), and at a real model's
    vocabulary size, where reductions are long enough for torch to consider splitting."""
    big = [torch.randn(151_936, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    cases = [(PARAMS[0], logits_stream(3, 25)), (PARAMS[1], logits_stream(4, 25))]
    cases += [(PARAMS[0], big), (PARAMS[1], big)]
    torch.save([(p.__dict__, torch.stack(stream)) for p, stream in cases], tmp_path / "cases.pt")
    script = f"""
import json, torch
from inference.sampling import Sampler, SamplingParams
torch.set_num_threads(2)
out = []
for params, stream in torch.load({str(tmp_path / "cases.pt")!r}):
    sampler = Sampler(SamplingParams(**params), seed=987654321987)
    tokens = [sampler.sample(logits) for logits in stream]
    out.append([[t.token_id, t.logprob.hex(), [[i, p.hex()] for i, p in t.top]] for t in tokens])
print(json.dumps(out))
"""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert json.loads(done.stdout) == [_replay(p, 987654321987, s) for p, s in cases]


def test_greedy_takes_the_argmax_and_the_lowest_id_on_ties() -> None:
    logits = torch.zeros(VOCAB)
    logits[[40, 7, 300]] = 5.0
    sampler = Sampler(SamplingParams(temperature=0), seed=0)
    assert sampler.sample(logits).token_id == 7
    allowed = torch.ones(VOCAB, dtype=torch.bool)
    allowed[7] = False
    assert sampler.sample(logits, allowed).token_id == 40
    for logits in logits_stream(4, 10):
        assert sampler.sample(logits).token_id == int(torch.argmax(logits))


def _top(logits: torch.Tensor, n: int) -> set[int]:
    order = sorted(range(VOCAB), key=lambda i: (-float(logits[i]), i))
    return set(order[:n])


def test_top_k_is_honoured_over_many_seeds() -> None:
    logits = logits_stream(5, 1, scale=0.5)[0]  # flat: a broken top-k would leak
    allowed = _top(logits, 4)
    seen = {Sampler(SamplingParams(top_k=4), seed=s).sample(logits).token_id for s in range(400)}
    assert seen == allowed


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    logits = torch.full((VOCAB,), -1e4)
    logits[[9, 2, 5, 700]] = torch.log(torch.tensor([0.45, 0.30, 0.15, 0.10]))
    seen = {Sampler(SamplingParams(top_p=0.7), seed=s).sample(logits).token_id for s in range(400)}
    assert seen == {9, 2}  # 0.45 < 0.7 <= 0.75
    seen = {Sampler(SamplingParams(top_p=0.01), seed=s).sample(logits).token_id for s in range(50)}
    assert seen == {9}  # at least one token always stays


def test_a_mask_is_honoured_and_an_empty_one_refused() -> None:
    generator = torch.Generator().manual_seed(6)
    for seed, logits in enumerate(logits_stream(6, 200)):
        allowed = torch.rand(VOCAB, generator=generator) < 0.05
        allowed[int(torch.argmax(logits))] = False  # the best token is excluded
        token = Sampler(SamplingParams(), seed=seed).sample(logits, allowed).token_id
        assert allowed[token]
    with pytest.raises(NoAllowedTokenError, match="no allowed token"):
        Sampler(SamplingParams(), seed=0).sample(logits, torch.zeros(VOCAB, dtype=torch.bool))
    only = torch.zeros(VOCAB, dtype=torch.bool)
    only[3] = True
    minus_inf = torch.zeros(VOCAB)
    minus_inf[3] = -math.inf
    with pytest.raises(NoAllowedTokenError):
        Sampler(SamplingParams(), seed=0).sample(minus_inf, only)


def test_draws_follow_the_probabilities() -> None:
    logits = torch.full((VOCAB,), -1e4)
    probs = [0.5, 0.3, 0.2]
    logits[[4, 8, 15]] = torch.log(torch.tensor(probs))
    n = 3000
    counts = {4: 0, 8: 0, 15: 0}
    sampler = Sampler(SamplingParams(), seed=99)
    for _ in range(n):
        counts[sampler.sample(logits).token_id] += 1
    for token, p in zip((4, 8, 15), probs, strict=True):
        assert abs(counts[token] / n - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_logprobs_are_the_raw_full_vocabulary_log_softmax() -> None:
    logits = logits_stream(7, 1)[0]
    expected = torch.log_softmax(logits.double(), dim=0)
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    allowed[100:110] = True
    params = SamplingParams(temperature=0.3, top_k=3, logprobs=True, top_logprobs=20)
    token = Sampler(params, seed=1).sample(logits, allowed)
    assert 100 <= token.token_id < 110
    assert token.logprob == float(expected[token.token_id])
    assert [i for i, _ in token.top] == sorted(range(VOCAB), key=lambda i: (-expected[i], i))[:20]
    assert all(p == float(expected[i]) for i, p in token.top)
    assert Sampler(SamplingParams(), seed=1).sample(logits).top == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"seed": "7"}, "seed"),
        ({"logprobs": 1}, "logprobs"),
    ],
)
def test_bad_params_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_seeds_of_any_size_and_sign() -> None:
    stream = logits_stream(8, 5)
    for seed in (-1, 0, 2**63, 2**70 + 3, new_seed()):
        assert run(SamplingParams(), seed, stream) == run(SamplingParams(), seed, stream)
    with pytest.raises(ValueError, match="seed"):
        Sampler(SamplingParams(), seed=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NaN"):
        Sampler(SamplingParams(), seed=0).sample(torch.full((VOCAB,), math.nan))


def test_the_tiny_model_replays_a_seed_alone_or_beside_another(tiny_model: DecoderModel) -> None:
    params = SamplingParams(temperature=0.8, top_p=0.95)

    def generate(prompts: dict[int, list[int]], steps: int) -> dict[int, list[int]]:
        caches = {seed: tiny_model.new_cache() for seed in prompts}
        logits = {seed: tiny_model.prefill(caches[seed], p) for seed, p in prompts.items()}
        samplers = {seed: Sampler(params, seed=seed) for seed in prompts}
        out: dict[int, list[int]] = {seed: [] for seed in prompts}
        for _ in range(steps):
            for seed in prompts:
                out[seed].append(samplers[seed].sample(logits[seed]).token_id)
            seeds = list(prompts)
            rows = tiny_model.decode([caches[s] for s in seeds], [out[s][-1] for s in seeds])
            logits = dict(zip(seeds, rows, strict=True))
        return out

    alone = generate({21: [5, 6, 7]}, 20)
    together = generate({22: [9, 9], 21: [5, 6, 7]}, 20)
    assert together[21] == alone[21]
    assert together[22] != alone[21]


@pytest.mark.parametrize("vocab", [1, 5, 768, 49152])
def test_probabilities_sort_as_integers_in_the_float_sorts_order_ties_included(vocab: int) -> None:
    """``_descending`` (the integer-key sort of the full distribution) against torch's stable
    descending float sort: the same ids in the same order, on ties, zeros, ``-0.0``,
    subnormals and ones."""
    from inference.sampling import _descending

    generator = torch.Generator().manual_seed(vocab)
    for trial in range(40):
        logits = torch.randn(vocab, generator=generator, dtype=torch.float64) * (trial % 9)
        if trial % 3 == 0:
            logits[::2] = logits[0]  # ties
        if trial % 4 == 0:
            logits[::5] = -math.inf  # masked: probability 0
        probs = torch.softmax(logits, dim=0)
        if trial % 5 == 0 and vocab > 2:
            probs[1] = -0.0
            probs[2] = 5e-324  # the smallest subnormal
        if trial == 7:
            probs = torch.zeros(vocab, dtype=torch.float64)
            probs[-1] = 1.0
        expected = torch.sort(probs, descending=True, stable=True).indices
        assert torch.equal(_descending(probs), expected), (vocab, trial)


def _language_like(generator: torch.Generator, vocab: int, sharpness: float) -> torch.Tensor:
    """Float32 logits shaped as a language model's: a few likely tokens and a long Zipf
    tail, in a random order, with exact ties among the likely ones."""
    ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
    logits = -sharpness * torch.log(ranks) + torch.randn(vocab, generator=generator) * 0.3
    logits[3:6] = logits[2]
    return logits[torch.randperm(vocab, generator=generator)].to(torch.float32)


@pytest.mark.parametrize(
    ("params", "proves"),
    [
        (SamplingParams(temperature=0.7), True),
        (SamplingParams(temperature=1.0, logprobs=True, top_logprobs=3), True),
        (SamplingParams(temperature=0.9, top_p=0.5), True),
        # a top-p beyond the mass of the first tokens: every step takes the whole order
        (SamplingParams(temperature=1.3, top_p=0.95), False),
    ],
    ids=["t0.7", "t1.0", "t0.9-p0.5", "t1.3-p0.95"],
)
def test_the_sorted_prefix_draws_what_the_whole_order_draws(
    params: SamplingParams, proves: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler orders only the likeliest tokens first (``_from_prefix``) and sorts the
    whole vocabulary only where they cannot prove the token: the same tokens and logprobs,
    bit for bit, as the whole order every time, and the shortcut taken in most steps where
    the first tokens hold the mass."""
    import inference.sampling as sampling

    generator = torch.Generator().manual_seed(17)
    mask = torch.ones(49_152, dtype=torch.bool)
    mask[::7] = False
    stream = [_language_like(generator, 49_152, 0.6 + 0.1 * (i % 12)) for i in range(60)]
    taken = []
    real = sampling._from_prefix

    def counted(*args: Any) -> int | None:
        token = real(*args)
        taken.append(token is not None)
        return token

    monkeypatch.setattr(sampling, "_from_prefix", counted)
    for seed in (1, 2):
        sampler = Sampler(params, seed=seed)
        fast = [sampler.sample(logits, mask if i % 2 else None) for i, logits in enumerate(stream)]
        with monkeypatch.context() as whole:
            whole.setattr(sampling, "_PREFIX", 10**9)
            sampler = Sampler(params, seed=seed)
            slow = [
                sampler.sample(logits, mask if i % 2 else None) for i, logits in enumerate(stream)
            ]
        assert fast == slow
    assert len(taken) == 2 * len(stream)
    print(f"the prefix proved {sum(taken)} of {len(taken)} tokens")
    assert sum(taken) > len(taken) // 2 if proves else not any(taken)


def test_the_sorted_prefix_refuses_what_it_cannot_prove() -> None:
    """Draws aimed at the cumulative sums themselves (and the floats beside them), where
    the bound on the total decides: never a different token, and ``None`` where the bound
    straddles a sum; a flat distribution, whose first tokens hold too little mass, is
    always left to the whole order."""
    from inference.sampling import _PREFIX, _from_prefix, _from_sorted, _head

    generator = torch.Generator().manual_seed(23)
    refused = proven = 0
    for trial in range(12):
        logits = _language_like(generator, 49_152, 0.8 + 0.1 * trial).to(torch.float64)
        probs = torch.softmax(logits / 0.8, dim=0)
        keep = int((probs > 0).sum())
        sums = torch.cumsum(_head(probs, keep)[0], dim=0)
        total = float(sums[-1])
        for j in (0, 1, 7, 40, _PREFIX - 2, _PREFIX - 1, _PREFIX):
            exact = float(sums[j]) / total
            for u in (math.nextafter(exact, 0), exact, math.nextafter(exact, 1)):
                for top_p in (1.0, 0.9):
                    token = _from_prefix(probs, keep, u, top_p)
                    if token is None:
                        refused += 1
                    else:
                        proven += 1
                        assert token == _from_sorted(probs, keep, u, top_p), (trial, j, u)
    assert refused and proven
    flat = torch.softmax(torch.zeros(49_152, dtype=torch.float64), dim=0)
    assert _from_prefix(flat, 49_152, 0.5, 1.0) is None
    assert _from_prefix(flat, 49_152, 0.5, 0.9) is None
