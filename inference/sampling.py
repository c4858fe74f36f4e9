"""Seeded, replayable token sampling: one request, one generator, one draw per token.

A pinned request must give the same tokens when replayed, alone or beside any other
requests. So each request owns a :class:`Sampler` with its own ``torch.Generator`` seeded
from the request's seed, and every sampled token consumes exactly one uniform draw, whatever
the logits, the mask or the sampling settings: the draws of a request depend only on its
seed and how many tokens it has sampled, never on other requests or on the global RNG.

The draw ``u`` in ``[0, 1)`` picks a token by inverse CDF over a fixed order: tokens sorted
by descending probability, ties by ascending token id (a stable sort). The arithmetic is
float64 on CPU over the float32 logits (widening is exact), and every step (softmax, sort,
cumulative sum, search) is a deterministic kernel, so the same logits tensor and seed give
the same token and logprobs, bit for bit, in any process on the same build and CPU,
whatever the thread count (the tests check this at a 152k vocabulary too). Order of operations, as in
Hugging Face's samplers: mask, temperature, top-k, top-p (nucleus over the sorted order,
keeping at least one token), renormalise, draw.

Cost per token, one thread: about 0.05 ms at the tiny model's 768 tokens; at 152k, 0.5 ms
greedy, 3 ms with top-k (a selection, then a sort of the few candidates). The full
distribution needs the fixed order only as far as the draw lands, plus the total: the
sampler orders the first 256 tokens (a selection), and proves from them and a bound on the
total that the whole order would draw the same token (:func:`_from_prefix`); at 49k
tokens that is 0.27 ms against 1.1 ms, and SmolLM2-135M at temperature 0.7 needed the whole
order in 6 of 3,200 steps. Where it does, the probabilities are sorted as integers (their
bit patterns order as they do), about three times as fast as a float sort with the same
order, ties included.

Temperature 0 is greedy: the allowed token with the highest logit, ties to the lowest id.
It still consumes its draw, so a stream's draws stay aligned with its token count.

Log-probabilities follow OpenAI: the log-softmax of the raw logits over the full vocabulary,
before temperature, top-k, top-p and any grammar mask. They describe what the model
thinks of each token, not the distribution the token was drawn from; a token forced by a
mask may report a very low logprob. ``top`` is filled whenever ``top_logprobs`` > 0; that
it also needs ``logprobs`` is the API layer's rule.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch

__all__ = [
    "MAX_TOP_LOGPROBS",
    "NoAllowedTokenError",
    "SampledToken",
    "Sampler",
    "SamplingParams",
    "new_seed",
]

MAX_TOP_LOGPROBS = 20
#: Tokens the sampler orders first; the whole order only where they cannot prove the token.
_PREFIX = 256
#: Relative slack per term between two float64 sums of the same non-negative terms.
_SUM_SLACK = 2.0**-48
_SEED_MODULUS = 2**64  # torch.Generator.manual_seed takes 64 bits


class NoAllowedTokenError(ValueError):
    """The mask allows no token (or only tokens the model gives probability 0)."""


@dataclass(frozen=True)
class SamplingParams:
    """A request's sampling settings (OpenAI names); invalid values raise ``ValueError``."""

    temperature: float = 1.0  # 0 → greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 → off
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0  # 0..20

    def __post_init__(self) -> None:
        if not _real(self.temperature) or not (
            math.isfinite(self.temperature) and self.temperature >= 0
        ):
            raise ValueError(f"temperature must be a finite number >= 0, not {self.temperature!r}")
        if not _real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p!r}")
        if not _integer(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, not {self.top_k!r}")
        if self.seed is not None and not _integer(self.seed):
            raise ValueError(f"seed must be an integer, not {self.seed!r}")
        if not isinstance(self.logprobs, bool):
            raise ValueError(f"logprobs must be a boolean, not {self.logprobs!r}")
        if not _integer(self.top_logprobs) or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class SampledToken:
    """A sampled token and its log-probability under the raw model (see the module notes)."""

    token_id: int
    logprob: float  # log-softmax of the raw logits (temperature 1, no mask) at token_id
    top: tuple[tuple[int, float], ...]  # top_logprobs alternatives, best first; () if not asked


def new_seed() -> int:
    """A fresh seed for a request that gave none (the caller reports it for replay)."""
    return secrets.randbelow(2**63)


class Sampler:
    """Samples one request's tokens from its own generator, one draw per token."""

    def __init__(self, params: SamplingParams, *, seed: int) -> None:
        if not _integer(seed):
            raise ValueError(f"seed must be an integer, not {seed!r}")
        self.params = params
        self.seed = seed
        self.draws = 0
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(seed % _SEED_MODULUS)  # negatives and big seeds too

    def sample(self, logits: torch.Tensor, allowed: torch.Tensor | None = None) -> SampledToken:
        """The next token from float ``logits [vocab]``, among ``allowed`` (bool) if given.

        A refused call (bad logits, nothing allowed) raises before drawing.
        """
        if logits.dim() != 1 or not logits.is_floating_point() or logits.numel() == 0:
            raise ValueError(f"logits must be a 1-D float tensor, not {tuple(logits.shape)}")
        raw = logits.detach().to(device="cpu", dtype=torch.float64)
        highest = float(raw.max())  # NaN if any logit is NaN
        if math.isnan(highest) or highest == math.inf:
            raise ValueError("logits hold NaN or +inf")
        masked = raw
        if allowed is not None:
            if allowed.shape != logits.shape or allowed.dtype != torch.bool:
                raise ValueError("allowed must be a bool tensor shaped like the logits")
            masked = raw.masked_fill(~allowed.to("cpu"), -math.inf)
        if float(masked.max()) == -math.inf:
            raise NoAllowedTokenError("no allowed token with a finite logit")

        u = float(torch.rand((), generator=self._generator, dtype=torch.float64))
        self.draws += 1
        # greedy: the first maximum, so ties go to the lowest id
        greedy = self.params.greedy
        token = int(torch.argmax(masked)) if greedy else self._inverse_cdf(masked, u)

        logprobs = torch.log_softmax(raw, dim=0)
        top: tuple[tuple[int, float], ...] = ()
        if self.params.top_logprobs:
            values, ids = _head(logprobs, self.params.top_logprobs)
            top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        return SampledToken(token, float(logprobs[token]), top)

    def _inverse_cdf(self, masked: torch.Tensor, u: float) -> int:
        # Shift before scaling: a tiny temperature then gives -inf, never inf - inf.
        probs = torch.softmax((masked - masked.max()) / self.params.temperature, dim=0)
        keep = int((probs > 0).sum())  # masked and underflowed tokens can never be drawn
        if self.params.top_k:
            keep = min(keep, self.params.top_k)
        elif keep > _PREFIX and probs.numel() >= 8 * _PREFIX:
            token = _from_prefix(probs, keep, u, self.params.top_p)
            if token is not None:
                return token
        return _from_sorted(probs, keep, u, self.params.top_p)


def _from_sorted(probs: torch.Tensor, keep: int, u: float, top_p: float) -> int:
    """The token at ``u`` of the first ``keep`` tokens in the fixed order (the definition)."""
    sorted_probs, order = _head(probs, keep)
    mass = torch.cumsum(sorted_probs, dim=0)
    if top_p < 1:  # a prefix of a sequential sum is the sum of the prefix (_from_prefix)
        mass = mass[: min(keep, int((mass < top_p).sum()) + 1)]
    return _at(mass, order, u)


def _at(cumulative: torch.Tensor, order: torch.Tensor, u: float) -> int:
    """The token whose span of ``cumulative`` (the sums of the tokens kept, in ``order``)
    holds ``u`` times their total: the inverse-CDF step both paths share."""
    target = torch.tensor(u * float(cumulative[-1]), dtype=torch.float64)
    position = int(torch.searchsorted(cumulative, target, right=True))
    return int(order[min(position, cumulative.numel() - 1)])


def _from_prefix(probs: torch.Tensor, keep: int, u: float, top_p: float) -> int | None:
    """:func:`_from_sorted`'s token from the first :data:`_PREFIX` tokens of the order
    alone, or ``None`` where they cannot prove it (then the caller sorts them all).

    Why it is the same token, bit for bit: the cumulative sum is sequential, so the sums of
    the first ``n`` tokens are the first ``n`` sums of the whole, and they never decrease
    (the terms are >= 0 and rounding is monotone). Under top-p, once they reach ``top_p``
    the cut falls inside them. Otherwise the draw's target is ``u`` times the sequential
    total of all ``keep`` (here: every positive) probabilities, which is unknown without
    the whole order, but lies within a proven relative distance of any other float sum of
    them (at most ``2 n`` units of rounding for ``n`` terms; :data:`_SUM_SLACK` per term is
    far wider). If no prefix sum falls between the target's bounds and the last one lies
    above them, the searched position is the same for every target in them.
    """
    head, order = _head(probs, _PREFIX)
    mass = torch.cumsum(head, dim=0)
    if top_p < 1:
        if float(mass[-1]) < top_p:
            return None
        return _at(mass[: int((mass < top_p).sum()) + 1], order, u)
    total = float(probs.sum())
    slack = total * _SUM_SLACK * probs.numel()
    bounds = torch.tensor([u * total - slack, u * total + slack], dtype=torch.float64)
    low, high = torch.searchsorted(mass, bounds, right=True).tolist()
    if low != high or high >= mass.numel():
        return None
    return int(order[low])


def _head(values: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` of a stable descending sort (values, ids): best first, ties to the
    lowest id. Sorts only the candidates at or above the ``n``-th value, all ties included,
    so top-k and top-logprobs cost a selection, not a sort of the whole vocabulary.
    """
    if values.dtype == torch.float64 and n * 8 >= values.numel() and bool((values >= 0).all()):
        order = _descending(values)  # most of the vocabulary: one fast sort of it all
        return values[order[:n]], order[:n]
    candidates = None
    if n < values.numel():
        nth = torch.topk(values, n).values[-1]  # the value is unique whatever topk's ties
        candidates = torch.nonzero(values >= nth).flatten()  # ascending ids
        values = values[candidates]
    sorted_values, order = torch.sort(values, descending=True, stable=True)
    ids = order if candidates is None else candidates[order]
    return sorted_values[:n], ids[:n]


def _descending(values: torch.Tensor) -> torch.Tensor:
    """The ids of non-negative float64 ``values`` in the order of a stable descending sort,
    through integer keys: a non-negative double's bit pattern, read as an int64, orders as
    the double does, so the negated patterns sorted ascending (stable: ties by id) give the
    same order, ties included, and torch sorts integers about three times as fast as floats.
    ``+ 0.0`` turns a ``-0.0`` into ``+0.0``, which the float sort holds equal to it."""
    keys = torch.neg((values + 0.0).view(torch.int64))
    return torch.sort(keys, stable=True).indices


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
