"""RFC 9162 (RFC 6962) Merkle tree over SHA-256: tree heads, proofs and their verification.

What it does: hashes leaves and nodes, computes the Merkle Tree Hash (MTH) of a list of leaf
hashes, keeps a running root in O(log n) memory (``CompactRange``), builds inclusion (PATH) and
consistency (SUBPROOF) proofs, and verifies both. Verification follows transparency-dev/merkle
(``proof/verify.go``): the same preconditions, the same proof lengths, the same outcomes on its
probe vectors.

What it never does: I/O, storage, clocks or logging. Callers hand in bytes and get bytes back.

Hashing: leaf = SHA-256(0x00 || data), node = SHA-256(0x01 || left || right), empty tree =
SHA-256(""). These 0x00/0x01 prefixes are RFC 9162's own and are kept exactly as the RFC says.
They are a different input space from the record's digest domains (``record/digest.py``): a
Merkle leaf hashes envelope bytes, never a domain-tagged digest preimage, so the numeric
overlap of 0x00/0x01 with those domain bytes is deliberate and harmless.

Consistency proofs from size 0 (our rule): RFC 9162 §2.1.4 defines a consistency proof only
between two non-empty trees. We take the conservative reading, as transparency-dev does: a
proof is defined only for ``0 < first <= second`` and ``first == 0`` is always refused with
``ProofError``, even ``0 -> 0`` with two empty roots. Every tree is trivially an extension of
the empty tree, so such a "proof" would prove nothing. The CCTV suite (rgdd/CCTV, branch
``merkle``) lists ``0 -> 0`` and ``0 -> 1`` with an empty path as valid; under this rule both
are rejected, by design, and each has its own named test.

Sizes and indices are Python ints; negative values are refused. Hashes are 32 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import sha256

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "LEAF_PREFIX",
    "NODE_PREFIX",
    "CompactRange",
    "MerkleError",
    "ProofError",
    "RootMismatch",
    "consistency_proof",
    "hash_children",
    "hash_leaf",
    "inclusion_proof",
    "root",
    "root_from_consistency_proof",
    "root_from_inclusion_proof",
    "verify_consistency",
    "verify_inclusion",
]

#: RFC 9162 §2.1.1 prefix of a leaf hash preimage.
LEAF_PREFIX = b"\x00"
#: RFC 9162 §2.1.1 prefix of an interior node hash preimage.
NODE_PREFIX = b"\x01"
#: MTH({}): the hash of an empty string, which differs from the hash of an empty leaf.
EMPTY_ROOT = sha256(b"").digest()
#: Length of every hash this module takes or returns.
HASH_SIZE = 32


class MerkleError(Exception):
    """Base of every failure in this module."""


class ProofError(MerkleError):
    """A proof or its arguments are malformed or outside the preconditions (never a match)."""


class RootMismatch(MerkleError):
    """The root a proof leads to is not the root the caller expected."""

    def __init__(self, expected: bytes, calculated: bytes) -> None:
        self.expected = bytes(expected)
        self.calculated = bytes(calculated)
        super().__init__(
            f"calculated root {self.calculated.hex() or '(empty)'} "
            f"does not match expected root {self.expected.hex() or '(empty)'}"
        )


def hash_leaf(data: bytes) -> bytes:
    """SHA-256(0x00 || data), the RFC 9162 leaf hash; ``data`` is streamed, never copied."""
    h = sha256(LEAF_PREFIX)
    h.update(data)
    return h.digest()


def hash_children(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right). Lengths are not checked: callers and verifiers do that."""
    return sha256(NODE_PREFIX + left + right).digest()


def _check_hashes(what: str, hashes: Sequence[bytes]) -> None:
    for i, h in enumerate(hashes):
        if len(h) != HASH_SIZE:
            raise ProofError(f"{what}[{i}] has {len(h)} bytes, want {HASH_SIZE}")


def _check_hash(what: str, h: bytes) -> None:
    if len(h) != HASH_SIZE:
        raise ProofError(f"{what} has {len(h)} bytes, want {HASH_SIZE}")


def _check_non_negative(what: str, n: int) -> None:
    if n < 0:
        raise ProofError(f"{what} is negative: {n}")


def root(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH over already-hashed leaves; ``EMPTY_ROOT`` for none.

    Level by level, promoting an unpaired last node unchanged: that builds the same tree as
    RFC 9162's split at the largest power of two below n, without recursion, in n - 1 hashes.
    """
    n = len(leaf_hashes)
    if n == 0:
        return EMPTY_ROOT
    _check_hashes("leaf_hashes", leaf_hashes)
    if n == 1:
        return bytes(leaf_hashes[0])
    prefix = NODE_PREFIX
    level = [
        sha256(prefix + leaf_hashes[i] + leaf_hashes[i + 1]).digest() for i in range(0, n - 1, 2)
    ]
    if n & 1:
        level.append(bytes(leaf_hashes[n - 1]))
    while len(level) > 1:
        odd = level.pop() if len(level) & 1 else None
        level = [
            sha256(prefix + a + b).digest() for a, b in zip(level[::2], level[1::2], strict=True)
        ]
        if odd is not None:
            level.append(odd)
    return level[0]


class CompactRange:
    """The running root of an append-only tree in O(log n) memory.

    Holds one hash per set bit of ``size``: the roots of the perfect subtrees that cover
    ``[0, size)``, left (largest) to right. A log writer keeps this instead of re-reading its
    leaves; ``hashes`` and ``CompactRange(size, hashes)`` save and restore it.
    """

    __slots__ = ("_hashes", "_size")

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        _check_non_negative("size", size)
        if len(hashes) != size.bit_count():
            raise ProofError(
                f"a range of size {size} needs {size.bit_count()} hashes, got {len(hashes)}"
            )
        _check_hashes("hashes", hashes)
        self._size = size
        self._hashes = [bytes(h) for h in hashes]

    @property
    def size(self) -> int:
        """Number of leaves appended so far."""
        return self._size

    @property
    def hashes(self) -> tuple[bytes, ...]:
        """Roots of the perfect subtrees covering the range, largest first (the saved state)."""
        return tuple(self._hashes)

    def append(self, leaf_hash: bytes) -> None:
        """Add one leaf hash; merges as many perfect subtrees as ``size`` has trailing ones."""
        _check_hash("leaf_hash", leaf_hash)
        h = bytes(leaf_hash)
        s = self._size
        while s & 1:
            h = hash_children(self._hashes.pop(), h)
            s >>= 1
        self._hashes.append(h)
        self._size += 1

    def extend(self, leaf_hashes: Sequence[bytes]) -> None:
        """Append each leaf hash in order."""
        for h in leaf_hashes:
            self.append(h)

    def root(self) -> bytes:
        """MTH of the leaves so far: fold the subtree roots right to left."""
        if not self._hashes:
            return EMPTY_ROOT
        r = self._hashes[-1]
        for h in reversed(self._hashes[:-1]):
            r = hash_children(h, r)
        return r

    def __repr__(self) -> str:
        return f"CompactRange(size={self._size}, root={self.root().hex()})"


def _split(n: int) -> int:
    """Largest power of two strictly below ``n`` (n > 1): RFC 9162's k."""
    return 1 << ((n - 1).bit_length() - 1)


def inclusion_proof(index: int, leaf_hashes: Sequence[bytes]) -> list[bytes]:
    """PATH(index, D[n]) of RFC 9162 §2.1.3.1, lowest sibling first.

    Walks down from the root; each sibling subtree is hashed once, so the whole proof costs
    O(n) hashes and O(log n) recursion-free steps.
    """
    n = len(leaf_hashes)
    _check_non_negative("index", index)
    if index >= n:
        raise ProofError(f"index is beyond size: {index} >= {n}")
    path: list[bytes] = []
    lo, hi = 0, n
    while hi - lo > 1:
        mid = lo + _split(hi - lo)
        if index < mid:
            path.append(root(leaf_hashes[mid:hi]))
            hi = mid
        else:
            path.append(root(leaf_hashes[lo:mid]))
            lo = mid
    path.reverse()
    return path


def consistency_proof(old_size: int, leaf_hashes: Sequence[bytes]) -> list[bytes]:
    """PROOF(m, D[n]) = SUBPROOF(m, D[n], true) of RFC 9162 §2.1.4.1, lowest node first.

    Defined for ``0 < old_size <= n``; equal sizes give the empty proof. ``old_size == 0`` is
    refused (see the module docstring).
    """
    n = len(leaf_hashes)
    _check_non_negative("old_size", old_size)
    if old_size == 0:
        raise ProofError(f"consistency proof from empty tree is meaningless: 0 -> {n}")
    if old_size > n:
        raise ProofError(f"old_size {old_size} > new size {n}")
    proof: list[bytes] = []
    lo, hi, m = 0, n, old_size
    whole = True  # SUBPROOF's b: still on the left edge, where the verifier knows MTH(D[m]).
    while m != hi - lo:
        mid = lo + _split(hi - lo)
        if m <= mid - lo:
            proof.append(root(leaf_hashes[mid:hi]))
            hi = mid
        else:
            proof.append(root(leaf_hashes[lo:mid]))
            m -= mid - lo
            lo = mid
            whole = False
    if not whole:
        proof.append(root(leaf_hashes[lo:hi]))
    proof.reverse()
    return proof


def _decomp_incl_proof(index: int, size: int) -> tuple[int, int]:
    """Lengths of the inner and border parts of the inclusion proof of ``index`` in ``size``.

    Inner: levels below where the paths to ``index`` and ``size - 1`` diverge (siblings left or
    right). Border: left siblings only, one per set bit of ``index`` above that point.
    """
    inner = (index ^ (size - 1)).bit_length()
    border = (index >> inner).bit_count()
    return inner, border


def _chain_inner(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    for i, h in enumerate(proof):
        seed = hash_children(seed, h) if (index >> i) & 1 == 0 else hash_children(h, seed)
    return seed


def _chain_inner_right(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    """Like ``_chain_inner`` but only left siblings: the hash of the older, smaller subtree."""
    for i, h in enumerate(proof):
        if (index >> i) & 1:
            seed = hash_children(h, seed)
    return seed


def _chain_border_right(seed: bytes, proof: Sequence[bytes]) -> bytes:
    for h in proof:
        seed = hash_children(h, seed)
    return seed


def _match(calculated: bytes, expected: bytes) -> None:
    if calculated != expected:
        raise RootMismatch(expected=expected, calculated=calculated)


def root_from_inclusion_proof(
    index: int, size: int, leaf_hash: bytes, proof: Sequence[bytes]
) -> bytes:
    """The root that ``proof`` gives for ``leaf_hash`` at ``index`` in a tree of ``size``.

    ``ProofError`` unless ``0 <= index < size``, the leaf hash and every proof element are 32
    bytes, and the proof has exactly the length the tree shape implies.
    """
    _check_non_negative("index", index)
    _check_non_negative("size", size)
    if index >= size:
        raise ProofError(f"index is beyond size: {index} >= {size}")
    _check_hash("leaf_hash", leaf_hash)
    inner, border = _decomp_incl_proof(index, size)
    if len(proof) != inner + border:
        raise ProofError(
            f"wrong proof size {len(proof)}, want {inner + border} for index {index} in size {size}"
        )
    _check_hashes("proof", proof)
    res = _chain_inner(bytes(leaf_hash), proof[:inner], index)
    return _chain_border_right(res, proof[inner:])


def verify_inclusion(
    index: int, size: int, leaf_hash: bytes, proof: Sequence[bytes], root: bytes
) -> None:
    """Return if ``proof`` puts ``leaf_hash`` at ``index`` in the tree of ``size`` and ``root``.

    Raises ``ProofError`` for malformed input and ``RootMismatch`` when the roots differ.
    """
    _match(root_from_inclusion_proof(index, size, leaf_hash, proof), root)


def root_from_consistency_proof(
    size1: int, size2: int, root1: bytes, proof: Sequence[bytes]
) -> bytes:
    """The root of the tree of ``size2`` that ``proof`` extends from ``root1`` of ``size1``.

    As transparency-dev: ``size2 < size1`` and ``size1 == 0`` are refused; ``size1 == size2``
    needs an empty proof and gives back ``root1`` unchanged (no length check there: the
    caller's byte comparison is the whole claim); otherwise the proof must be non-empty, of
    exactly the implied length, and must reproduce ``root1`` (``RootMismatch`` if not).
    """
    _check_non_negative("size1", size1)
    _check_non_negative("size2", size2)
    if size2 < size1:
        raise ProofError(f"size2 ({size2}) < size1 ({size1})")
    if size1 == 0:
        raise ProofError(f"consistency proof from empty tree is meaningless: 0 -> {size2}")
    if size1 == size2:
        if proof:
            raise ProofError(f"size1 = size2 = {size1}, but proof has {len(proof)} elements")
        return bytes(root1)
    if not proof:
        raise ProofError(f"empty proof for {size1} -> {size2}")
    _check_hash("root1", root1)

    # Now 0 < size1 < size2. The largest perfect subtree that ends at size1 is the seed: the
    # first proof element, or root1 itself when size1 is a power of two (then it is left out).
    level = (size1 & -size1).bit_length() - 1
    index = (size1 - 1) >> level
    inner, border = _decomp_incl_proof(size1 - 1, size2)
    inner -= level
    start = 0 if index == 0 else 1
    if len(proof) != start + inner + border:
        raise ProofError(
            f"wrong proof size {len(proof)}, want {start + inner + border} for {size1} -> {size2}"
        )
    _check_hashes("proof", proof)
    seed = bytes(root1) if start == 0 else proof[0]
    rest = proof[start:]

    hash1 = _chain_inner_right(seed, rest[:inner], index)
    hash1 = _chain_border_right(hash1, rest[inner:])
    _match(hash1, root1)

    hash2 = _chain_inner(seed, rest[:inner], index)
    return _chain_border_right(hash2, rest[inner:])


def verify_consistency(
    size1: int, size2: int, root1: bytes, root2: bytes, proof: Sequence[bytes]
) -> None:
    """Return if ``proof`` shows the tree (size2, root2) extends (size1, root1).

    Raises ``ProofError`` for malformed input or ``size1 == 0``, ``RootMismatch`` otherwise.
    """
    _match(root_from_consistency_proof(size1, size2, root1, proof), root2)
