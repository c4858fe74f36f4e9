"""A literal RFC 9162 reference, for tests only: slow, recursive, written from the RFC text.

It shares no code with ``record.merkle`` (hashlib only), so a cross-check between the two
can fail. Section numbers are RFC 9162's.
"""

from __future__ import annotations

import hashlib


def _hash(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _k(n: int) -> int:
    """The largest power of two smaller than n (n > 1), as §2.1.1 defines k."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def leaf_hash(entry: bytes) -> bytes:
    """§2.1.1: MTH({d(0)}) = HASH(0x00 || d(0))."""
    return _hash(b"\x00" + entry)


def mth(entries: list[bytes]) -> bytes:
    """§2.1.1 MTH over the entries themselves (not their hashes)."""
    n = len(entries)
    if n == 0:
        return _hash(b"")
    if n == 1:
        return _hash(b"\x00" + entries[0])
    k = _k(n)
    return _hash(b"\x01" + mth(entries[:k]) + mth(entries[k:]))


def path(m: int, entries: list[bytes]) -> list[bytes]:
    """§2.1.3.1 PATH(m, D[n])."""
    n = len(entries)
    if n == 1 and m == 0:
        return []
    k = _k(n)
    if m < k:
        return [*path(m, entries[:k]), mth(entries[k:])]
    return [*path(m - k, entries[k:]), mth(entries[:k])]


def proof(m: int, entries: list[bytes]) -> list[bytes]:
    """§2.1.4.1 PROOF(m, D[n]) = SUBPROOF(m, D[n], true)."""
    return subproof(m, entries, True)


def subproof(m: int, entries: list[bytes], b: bool) -> list[bytes]:
    """§2.1.4.1 SUBPROOF(m, D[n], b)."""
    n = len(entries)
    if m == n:
        return [] if b else [mth(entries)]
    k = _k(n)
    if m <= k:
        return [*subproof(m, entries[:k], b), mth(entries[k:])]
    return [*subproof(m - k, entries[k:], False), mth(entries[:k])]


def verify_inclusion(
    leaf_index: int, tree_size: int, hash_: bytes, inclusion_path: list[bytes], root_hash: bytes
) -> bool:
    """§2.1.3.2, step by step."""
    if leaf_index >= tree_size:
        return False
    fn = leaf_index
    sn = tree_size - 1
    r = hash_
    for p in inclusion_path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = _hash(b"\x01" + p + r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = _hash(b"\x01" + r + p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root_hash


def verify_consistency(
    first: int, second: int, first_hash: bytes, second_hash: bytes, consistency_path: list[bytes]
) -> bool:
    """§2.1.4.2, step by step. The RFC states it for 0 < first < second."""
    if not 0 < first < second:
        return False
    if not consistency_path:
        return False
    path_ = list(consistency_path)
    if first & (first - 1) == 0:
        path_ = [first_hash, *path_]
    fn = first - 1
    sn = second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path_[0]
    for c in path_[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = _hash(b"\x01" + c + fr)
            sr = _hash(b"\x01" + c + sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = _hash(b"\x01" + sr + c)
        fn >>= 1
        sn >>= 1
    return fr == first_hash and sr == second_hash and sn == 0
