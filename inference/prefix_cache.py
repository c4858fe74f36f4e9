"""Reuse of prompt prefixes across requests, scoped by a salt.

An entry maps a token sequence to a :class:`SequenceCache` holding its keys and values.
A new prompt reuses the longest common prefix with any entry **of the same scope**: the
entry is cloned and truncated to that prefix, and only the rest of the prompt is prefilled.
The engine core guarantees that prefilling a prefix and then the rest gives the same bits
as one prefill of the whole prompt, so a hit changes speed, not the reply.

Scopes keep one tenant's prompts from shaping another's timing or (on a non-invariant
path) bits. :func:`cache_scope` derives a request's scope from its ``cache_salt``, its
session or its user. Strict requests never reach the cache: their single-use salt could
only ever miss.

Size is capped in cached token positions; the least recently used entries go first. The
scheduler thread is the only writer; the lock covers readers of :meth:`stats`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from inference.cache import SequenceCache

__all__ = ["PrefixCache", "PrefixCacheStats", "PrefixHit", "cache_scope"]


def cache_scope(
    *, strict: bool, cache_salt: str | None, session: str | None, user: str | None
) -> str | None:
    """A request's scope: its ``cache_salt``, else its session, else its ``user``, else the
    shared anonymous scope; ``None`` in strict mode (the request's salt is single-use, so it
    could only miss: it neither reads nor writes the cache). Prefixes keep kinds apart.
    """
    if strict:
        return None
    if cache_salt is not None:
        return "salt:" + cache_salt
    if session:
        return "session:" + session
    if user:
        return "user:" + user
    return "default"


@dataclass(frozen=True)
class PrefixHit:
    """A private cache for a new prompt, already holding ``cached`` of its tokens."""

    cache: SequenceCache
    cached: int


@dataclass(frozen=True)
class PrefixCacheStats:
    """What the cache holds and how often it helped."""

    entries: int
    tokens: int
    max_tokens: int
    lookups: int
    hits: int
    hit_tokens: int


@dataclass
class _Entry:
    scope: str
    tokens: tuple[int, ...]
    cache: SequenceCache


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """LRU map of (scope, token prefix) to a sequence cache, capped at ``max_tokens``."""

    def __init__(self, max_tokens: int = 65536, *, min_reuse: int = 1) -> None:
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        self.max_tokens = max_tokens
        self.min_reuse = max(1, min_reuse)
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], _Entry] = OrderedDict()
        self._tokens = 0
        self._lookups = 0
        self._hits = 0
        self._hit_tokens = 0
        self._lock = threading.Lock()

    def lookup(self, scope: str, prompt: Sequence[int]) -> PrefixHit | None:
        """A clone of the best entry of ``scope``, cut to its common prefix with ``prompt``.

        At least one prompt token is always left to prefill (its logits start the reply),
        so the reuse is capped at ``len(prompt) - 1``.
        """
        with self._lock:
            self._lookups += 1
            best: _Entry | None = None
            best_len = 0
            limit = len(prompt) - 1
            for entry in self._entries.values():
                if entry.scope != scope:
                    continue
                length = min(common_prefix(entry.tokens, prompt), limit, entry.cache.length)
                if length > best_len:
                    best, best_len = entry, length
            if best is None or best_len < self.min_reuse:
                return None
            self._entries.move_to_end((best.scope, best.tokens))
            self._hits += 1
            self._hit_tokens += best_len
            cache = best.cache.clone()
        cache.truncate(best_len)
        return PrefixHit(cache, best_len)

    def insert(self, scope: str, tokens: Sequence[int], cache: SequenceCache) -> None:
        """Keep ``cache`` (ownership passes here) as the entry for ``tokens`` in ``scope``.

        Entries of the same scope whose tokens are a prefix of ``tokens`` are dropped: the
        new entry serves every lookup they could.
        """
        key_tokens = tuple(tokens[: cache.length])
        if not key_tokens or len(key_tokens) > self.max_tokens:
            return
        with self._lock:
            for key, entry in list(self._entries.items()):
                if entry.scope == scope and key_tokens[: len(entry.tokens)] == entry.tokens:
                    self._remove(key)
            self._entries[(scope, key_tokens)] = _Entry(scope, key_tokens, cache)
            self._tokens += len(key_tokens)
            while self._tokens > self.max_tokens and self._entries:
                self._remove(next(iter(self._entries)))

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()
            self._tokens = 0

    def stats(self) -> PrefixCacheStats:
        """A snapshot of the counters."""
        with self._lock:
            return PrefixCacheStats(
                entries=len(self._entries),
                tokens=self._tokens,
                max_tokens=self.max_tokens,
                lookups=self._lookups,
                hits=self._hits,
                hit_tokens=self._hit_tokens,
            )

    def _remove(self, key: tuple[str, tuple[int, ...]]) -> None:
        entry = self._entries.pop(key)
        self._tokens -= len(entry.tokens)
