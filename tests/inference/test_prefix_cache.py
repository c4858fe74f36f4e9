"""The salted prefix cache.

- a lookup reuses the longest common prefix within its scope only, always leaves at least
  one prompt token to prefill, and hands out a private clone (the entry stays intact);
- entries are evicted least-recently-used first under a cap in token positions, and an
  entry that extends another replaces it;
- scopes come from ``cache_salt``, then the session, then ``user``, then a shared default;
  strict mode has none; different kinds of scope never collide;
- prefilling the rest after a cache hit gives the same logits, bit for bit, as a cold
  one-shot prefill, so a hit cannot change a reply.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the engine needs torch (the `engine` extra)")

from inference.cache import SequenceCache  # noqa: E402
from inference.model import DecoderModel  # noqa: E402
from inference.prefix_cache import PrefixCache, cache_scope, common_prefix  # noqa: E402


def _cache(length: int) -> SequenceCache:
    cache = SequenceCache(num_layers=1, kv_heads=1, head_dim=2)
    cache.reserve(length)
    for position in range(length):
        value = torch.full((1, 1, 2), float(position))
        cache.write(0, position, value, value)
    cache.length = length
    return cache


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5], [6]) == 0


def test_lookup_reuses_the_longest_prefix_of_its_scope() -> None:
    pc = PrefixCache(1000)
    assert pc.lookup("a", [1, 2, 3]) is None
    pc.insert("a", [1, 2, 3, 4, 5], _cache(5))
    pc.insert("a", [1, 9], _cache(2))
    pc.insert("b", [1, 2, 3, 4, 5, 6, 7], _cache(7))

    hit = pc.lookup("a", [1, 2, 3, 4, 8, 8])
    assert hit is not None and hit.cached == 4 and hit.cache.length == 4
    full = pc.lookup("a", [1, 2, 3, 4, 5])  # the whole prompt cached: the last token is redone
    assert full is not None and full.cached == 4
    assert pc.lookup("a", [7, 7]) is None
    assert pc.lookup("c", [1, 2, 3, 4, 5]) is None
    other = pc.lookup("b", [1, 2, 3, 4, 5, 6, 7, 8])
    assert other is not None and other.cached == 7

    hit.cache.write(0, 0, torch.full((1, 1, 2), 99.0), torch.full((1, 1, 2), 99.0))
    again = pc.lookup("a", [1, 2, 3, 4, 8])
    assert again is not None and float(again.cache.keys[0][0, 0, 0]) == 0.0
    stats = pc.stats()
    assert (stats.lookups, stats.hits, stats.hit_tokens) == (7, 4, 4 + 4 + 7 + 4)


def test_min_reuse_and_single_token_prompts() -> None:
    pc = PrefixCache(1000, min_reuse=3)
    pc.insert("a", [1, 2, 3, 4], _cache(4))
    assert pc.lookup("a", [1, 2, 7]) is None
    assert pc.lookup("a", [1]) is None
    hit = pc.lookup("a", [1, 2, 3, 9])
    assert hit is not None and hit.cached == 3


def test_eviction_is_lru_under_a_token_cap() -> None:
    pc = PrefixCache(10)
    pc.insert("a", [1, 1, 1, 1], _cache(4))
    pc.insert("a", [2, 2, 2, 2], _cache(4))
    assert pc.lookup("a", [1, 1, 1, 1, 5]) is not None  # touch the first: now most recent
    pc.insert("a", [3, 3, 3, 3], _cache(4))  # 12 > 10: the least recent ([2 …]) goes
    assert pc.lookup("a", [2, 2, 2, 2, 5]) is None
    assert pc.lookup("a", [1, 1, 1, 1, 5]) is not None
    assert pc.lookup("a", [3, 3, 3, 3, 5]) is not None
    assert pc.stats().tokens == 8 and pc.stats().entries == 2
    pc.insert("a", list(range(11)), _cache(11))  # larger than the whole cap: not kept
    assert pc.stats().entries == 2
    pc.clear()
    assert pc.stats().entries == 0 and pc.stats().tokens == 0


def test_an_extending_entry_replaces_its_prefix() -> None:
    pc = PrefixCache(100)
    pc.insert("a", [1, 2, 3], _cache(3))
    pc.insert("b", [1, 2, 3], _cache(3))
    pc.insert("a", [1, 2, 3, 4, 5], _cache(5))
    assert pc.stats().entries == 2 and pc.stats().tokens == 8
    pc.insert("a", [1, 2, 3, 4, 5, 6, 7], _cache(6))  # keyed by what the cache holds
    hit = pc.lookup("a", [1, 2, 3, 4, 5, 6, 7, 8])
    assert hit is not None and hit.cached == 6


def test_cache_scope_order_and_strict_mode() -> None:
    def scope(**kw: object) -> str | None:
        args: dict[str, object] = {"strict": False, "cache_salt": None, "session": None}
        args["user"] = None
        args.update(kw)
        return cache_scope(**args)  # type: ignore[arg-type]

    assert scope() == "default"
    assert scope(user="u") == "user:u"
    assert scope(user="u", session="s") == "session:s"
    assert scope(user="u", session="s", cache_salt="x") == "salt:x"
    assert scope(user="u", session="s", cache_salt="x", strict=True) is None
    assert len({scope(user="k"), scope(session="k"), scope(cache_salt="k")}) == 3


def test_prefill_after_a_hit_equals_a_cold_prefill(tiny_model: DecoderModel) -> None:
    pc = PrefixCache(4096)
    generator = torch.Generator().manual_seed(3)
    vocab = tiny_model.config.vocab_size
    for trial in range(4):
        shared = [int(t) for t in torch.randint(0, vocab, (20 + trial * 7,), generator=generator)]
        first = shared + [int(t) for t in torch.randint(0, vocab, (5,), generator=generator)]
        second = shared + [int(t) for t in torch.randint(0, vocab, (9,), generator=generator)]
        warmup = tiny_model.new_cache()
        tiny_model.prefill(warmup, first)
        pc.insert(f"t{trial}", first, warmup)

        hit = pc.lookup(f"t{trial}", second)
        assert hit is not None and hit.cached >= len(shared)
        warm = tiny_model.prefill(hit.cache, second[hit.cached :])
        cold = tiny_model.prefill(tiny_model.new_cache(), second)
        assert torch.equal(warm, cold), trial
        step_warm = tiny_model.decode([hit.cache], [7])
        cold_cache = tiny_model.new_cache()
        tiny_model.prefill(cold_cache, second)
        assert torch.equal(step_warm, tiny_model.decode([cold_cache], [7])), trial
