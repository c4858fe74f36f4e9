"""record.merkle against external vectors (read in place) and a literal RFC 9162 reference.

Vectors live in ``../shared/vectors/merkle`` (the ``vectors`` fixture); nothing is copied here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import merkle_reference as ref
import pytest

from record.merkle import (
    EMPTY_ROOT,
    LEAF_PREFIX,
    NODE_PREFIX,
    CompactRange,
    MerkleError,
    ProofError,
    RootMismatch,
    consistency_proof,
    hash_children,
    hash_leaf,
    inclusion_proof,
    root,
    root_from_consistency_proof,
    root_from_inclusion_proof,
    verify_consistency,
    verify_inclusion,
)

# Counts stated by the vectors' own README; a shrinking folder must fail, not pass quietly.
TDEV_INCLUSION_FILES = 98
TDEV_CONSISTENCY_FILES = 98
CCTV_SIZE0_VALID = {0: (0, 0), 1: (0, 1)}  # consistency-valid.json index -> (old, new)


def b64(s: str) -> bytes:
    return base64.b64decode(s, validate=True)


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def merkle_dir(vectors: Path) -> Path:
    return vectors / "merkle"


@pytest.fixture(scope="module")
def manifest(merkle_dir: Path) -> dict[str, Any]:
    files: dict[str, Any] = load(merkle_dir / "manifest.json")["files"]
    return files


def leaves(n: int) -> list[bytes]:
    return [hash_leaf(b"entry %d" % i) for i in range(n)]


def flip_bit(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# Hashing known answers (rfc6962-kat.json)


def test_prefixes_and_empty_root() -> None:
    assert LEAF_PREFIX == b"\x00"
    assert NODE_PREFIX == b"\x01"
    assert hashlib.sha256(b"").digest() == EMPTY_ROOT
    assert hash_leaf(b"") != EMPTY_ROOT
    assert root([]) == EMPTY_ROOT
    assert CompactRange().root() == EMPTY_ROOT


def test_rfc6962_kat_cases(merkle_dir: Path) -> None:
    kat = load(merkle_dir / "rfc6962-kat.json")
    functions: dict[str, Callable[[dict[str, Any]], bytes]] = {
        "EmptyRoot": lambda c: root([]),
        "HashLeaf": lambda c: hash_leaf(bytes.fromhex(c["input_hex"])),
        "HashChildren": lambda c: hash_children(
            bytes.fromhex(c["left_hex"]), bytes.fromhex(c["right_hex"])
        ),
    }
    seen: dict[str, int] = {}
    for case in kat["cases"]:
        expected = bytes.fromhex(case["expected_hex"])
        assert hashlib.sha256(bytes.fromhex(case["preimage_hex"])).digest() == expected, case
        if case["function"] == "HashChildren":
            assert case["input_hex"] == case["left_hex"] + case["right_hex"], case
        assert functions[case["function"]](case) == expected, case["what"]
        seen[case["function"]] = seen.get(case["function"], 0) + 1
    assert seen == {"EmptyRoot": 1, "HashLeaf": 10, "HashChildren": 8}


def test_rfc6962_kat_tree_roots(merkle_dir: Path) -> None:
    roots = load(merkle_dir / "rfc6962-kat.json")["tree_roots"]
    assert [r["tree_size"] for r in roots] == list(range(9))
    cr = CompactRange()
    for entry in roots:
        hashes = [hash_leaf(bytes.fromhex(x)) for x in entry["leaves_hex"]]
        expected = bytes.fromhex(entry["expected_hex"])
        assert len(hashes) == entry["tree_size"]
        assert root(hashes) == expected, entry["tree_size"]
        fresh = CompactRange()
        fresh.extend(hashes)
        assert fresh.root() == expected
        # The running range grows one leaf per entry, like a log writer's.
        if hashes:
            cr.append(hashes[-1])
        assert cr.size == entry["tree_size"]
        assert cr.root() == expected
        assert CompactRange(cr.size, cr.hashes).root() == expected


# ---------------------------------------------------------------------------------------------
# transparency-dev probes: every file, all wrong outcomes collected, one assertion


def _tdev_files(merkle_dir: Path, manifest: dict[str, Any], kind: str) -> list[Path]:
    files = sorted((merkle_dir / "transparency-dev" / kind).rglob("*.json"))
    listed = {k for k in manifest if k.startswith(f"merkle/transparency-dev/{kind}/")}
    assert {f"merkle/{f.relative_to(merkle_dir).as_posix()}" for f in files} == listed
    return files


def _tdev_expect(path: Path, probe: dict[str, Any], manifest: dict[str, Any]) -> bool:
    """True when the probe must verify; the file's wantErr and the manifest must agree."""
    key = "merkle/transparency-dev/" + path.as_posix().split("/transparency-dev/", 1)[1]
    want_ok = not probe["wantErr"]
    assert manifest[key]["expect"] == ("ok" if want_ok else "error"), key
    assert manifest[key]["desc"] == probe["desc"], key
    return want_ok


def _outcome(check: Callable[..., None], *args: Any) -> str:
    """'ok', 'error' (a MerkleError) or 'crash: ...' (anything else, always wrong)."""
    try:
        check(*args)
    except MerkleError:
        return "error"
    except Exception as e:  # a verifier must never fail any other way
        return f"crash: {type(e).__name__}: {e}"
    return "ok"


def _run_inclusion_probe(p: dict[str, Any]) -> None:
    verify_inclusion(
        p["leafIdx"], p["treeSize"], b64(p["leafHash"]), [b64(x) for x in p["proof"] or []],
        b64(p["root"]),
    )  # fmt: skip


def _run_consistency_probe(p: dict[str, Any]) -> None:
    verify_consistency(
        p["size1"], p["size2"], b64(p["root1"]), b64(p["root2"]),
        [b64(x) for x in p["proof"] or []],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "count", "run"),
    [
        ("inclusion", TDEV_INCLUSION_FILES, _run_inclusion_probe),
        ("consistency", TDEV_CONSISTENCY_FILES, _run_consistency_probe),
    ],
)
def test_transparency_dev_probes(
    merkle_dir: Path,
    manifest: dict[str, Any],
    kind: str,
    count: int,
    run: Callable[[dict[str, Any]], None],
) -> None:
    files = _tdev_files(merkle_dir, manifest, kind)
    assert len(files) == count
    wrong: list[str] = []
    oks = 0
    for path in files:
        probe = load(path)
        want = "ok" if _tdev_expect(path, probe, manifest) else "error"
        oks += want == "ok"
        got = _outcome(run, probe)
        if got != want:
            wrong.append(
                f"{path.relative_to(merkle_dir)} ({probe['desc']}): want {want}, got {got}"
            )
    assert oks == 6, "the README says 6 probes of each kind verify"
    assert not wrong, f"{len(wrong)} of {len(files)} {kind} probes wrong:\n" + "\n".join(wrong)


def test_transparency_dev_probes_agree_with_rfc_text(merkle_dir: Path) -> None:
    """The literal RFC 9162 verifiers give every probe they apply to its wantErr outcome.

    This checks the vectors and the reference, so that a shared mistake with our module shows.
    One known exception: the RFC's steps never check hash lengths, so an empty leaf hash with an
    empty root and no path "verifies" there; transparency-dev (and we) refuse the 0-byte leaf.
    """
    wrong: list[str] = []
    checked = 0
    for path in sorted((merkle_dir / "transparency-dev").rglob("*.json")):
        p = load(path)
        proof = [b64(x) for x in p["proof"] or []]
        if "leafIdx" in p:
            ok = ref.verify_inclusion(
                p["leafIdx"], p["treeSize"], b64(p["leafHash"]), proof, b64(p["root"])
            )
        elif 0 < p["size1"] < p["size2"]:
            ok = ref.verify_consistency(
                p["size1"], p["size2"], b64(p["root1"]), b64(p["root2"]), proof
            )
        else:
            continue  # equal or zero sizes: outside §2.1.4.2, covered by our own rule
        checked += 1
        if ok == p["wantErr"]:
            wrong.append(str(path.relative_to(merkle_dir)))
    assert checked > 150
    assert wrong == ["transparency-dev/inclusion/single-entry/empty-root-and-leaf.json"], wrong
    p = load(merkle_dir / wrong[0])
    assert (p["leafHash"], p["root"], p["proof"], p["wantErr"]) == ("", "", [], True)
    with pytest.raises(ProofError, match="leaf_hash has 0 bytes"):
        _run_inclusion_probe(p)


def test_tdev_size1_zero_and_size2_not_zero_is_rejected(merkle_dir: Path) -> None:
    """transparency-dev's 0 -> 1 probe, with root1 = SHA-256(""): refused by our size-0 rule."""
    p = load(
        merkle_dir
        / "transparency-dev/consistency/additional/size1-is-zero-and-size2-is-not-zero.json"
    )
    assert p["wantErr"] is True
    assert (p["size1"], p["size2"], b64(p["root1"])) == (0, 1, EMPTY_ROOT)
    with pytest.raises(ProofError, match="empty tree"):
        _run_consistency_probe(p)


def test_tdev_equal_sizes_compare_roots_bytewise(merkle_dir: Path) -> None:
    """size1 == size2 > 0: empty proof, byte-equal roots, no length check (as transparency-dev).

    The upstream probe uses the 12-byte root "don't care 2" and expects success.
    """
    p = load(
        merkle_dir
        / "transparency-dev/consistency/additional/sizes-are-equal-one-and-proof-is-empty.json"
    )
    assert p["wantErr"] is False and len(b64(p["root1"])) == 12
    _run_consistency_probe(p)
    assert root_from_consistency_proof(1, 1, b"x", []) == b"x"
    with pytest.raises(RootMismatch):
        verify_consistency(1, 1, b"x", b"y", [])


# ---------------------------------------------------------------------------------------------
# CCTV vectors


def _cctv_inclusion(e: dict[str, Any]) -> None:
    verify_inclusion(
        e["leaf_index"], e["tree_size"], b64(e["leaf_hash"]),
        [b64(x) for x in e["inclusion_path"]], b64(e["root_hash"]),
    )  # fmt: skip


def _cctv_consistency(e: dict[str, Any]) -> None:
    verify_consistency(
        e["old_size"], e["new_size"], b64(e["old_root"]), b64(e["new_root"]),
        [b64(x) for x in e["consistency_path"]],
    )  # fmt: skip


@pytest.fixture(scope="module")
def cctv_leaves(merkle_dir: Path) -> list[bytes]:
    tree = load(merkle_dir / "cctv" / "merkle_tree.json")
    return [hash_leaf(e["leaf_data"].encode("ascii")) for e in tree]


def test_cctv_merkle_tree_heads(merkle_dir: Path) -> None:
    tree = load(merkle_dir / "cctv" / "merkle_tree.json")
    assert len(tree) == 16
    assert "".join(e["leaf_data"] for e in tree) == "abcdefghijklmnop"
    cr = CompactRange()
    hashes: list[bytes] = []
    for k, entry in enumerate(tree, start=1):
        leaf = hash_leaf(entry["leaf_data"].encode("ascii"))
        assert leaf == b64(entry["leaf_hash"]), k
        hashes.append(leaf)
        cr.append(leaf)
        assert root(hashes) == b64(entry["root_hash"]), k
        assert cr.root() == b64(entry["root_hash"]), k


def test_cctv_inclusion_valid(merkle_dir: Path, cctv_leaves: list[bytes]) -> None:
    entries = load(merkle_dir / "cctv" / "inclusion-valid.json")
    assert len(entries) == 4
    for e in entries:
        assert _outcome(_cctv_inclusion, e) == "ok", e
        # Our generator gives the same path from the same leaves.
        got = inclusion_proof(e["leaf_index"], cctv_leaves[: e["tree_size"]])
        assert got == [b64(x) for x in e["inclusion_path"]], e


def test_cctv_inclusion_invalid(merkle_dir: Path) -> None:
    entries = load(merkle_dir / "cctv" / "inclusion-invalid.json")
    assert len(entries) == 4
    wrong = [e for e in entries if _outcome(_cctv_inclusion, e) != "error"]
    assert not wrong, f"{len(wrong)} invalid inclusion entries accepted or crashed: {wrong}"


def test_cctv_consistency_valid(merkle_dir: Path, cctv_leaves: list[bytes]) -> None:
    """Every valid entry verifies, except the size-0 ones our rule refuses (tested below)."""
    entries = load(merkle_dir / "cctv" / "consistency-valid.json")
    size0 = {i: (e["old_size"], e["new_size"]) for i, e in enumerate(entries) if e["old_size"] == 0}
    assert size0 == CCTV_SIZE0_VALID
    checked = 0
    for i, e in enumerate(entries):
        if i in size0:
            continue
        assert _outcome(_cctv_consistency, e) == "ok", (i, e)
        got = consistency_proof(e["old_size"], cctv_leaves[: e["new_size"]])
        assert got == [b64(x) for x in e["consistency_path"]], (i, e)
        checked += 1
    assert checked == 2


def test_cctv_consistency_invalid(merkle_dir: Path) -> None:
    entries = load(merkle_dir / "cctv" / "consistency-invalid.json")
    assert len(entries) == 16
    wrong = [(i, e) for i, e in enumerate(entries) if _outcome(_cctv_consistency, e) != "error"]
    assert not wrong, f"{len(wrong)} invalid consistency entries accepted or crashed: {wrong}"


def _cctv_size0_valid(merkle_dir: Path, index: int) -> dict[str, Any]:
    e: dict[str, Any] = load(merkle_dir / "cctv" / "consistency-valid.json")[index]
    assert (e["old_size"], e["new_size"]) == CCTV_SIZE0_VALID[index]
    assert b64(e["old_root"]) == EMPTY_ROOT and e["consistency_path"] == []
    return e


def test_cctv_consistency_0_to_0_rejected_by_design(merkle_dir: Path) -> None:
    """CCTV lists 0 -> 0 as valid; we refuse first == 0 (RFC 9162 §2.1.4, transparency-dev)."""
    e = _cctv_size0_valid(merkle_dir, 0)
    assert b64(e["new_root"]) == EMPTY_ROOT
    with pytest.raises(ProofError, match="empty tree"):
        _cctv_consistency(e)


def test_cctv_consistency_0_to_1_rejected_by_design(merkle_dir: Path) -> None:
    """CCTV lists 0 -> 1 with an empty path as valid; refused by the same rule."""
    e = _cctv_size0_valid(merkle_dir, 1)
    assert b64(e["new_root"]) == hash_leaf(b"a")
    with pytest.raises(ProofError, match="empty tree"):
        _cctv_consistency(e)


# ---------------------------------------------------------------------------------------------
# Cross-check against the literal RFC 9162 reference, sizes 1..70

MAX_SIZE = 70
DATA = [b"entry %d" % i for i in range(MAX_SIZE)]
HASHES = [hash_leaf(d) for d in DATA]


def test_leaf_hash_matches_reference() -> None:
    assert [ref.leaf_hash(d) for d in DATA] == HASHES


def test_root_and_compact_range_match_reference() -> None:
    cr = CompactRange()
    for n in range(1, MAX_SIZE + 1):
        expected = ref.mth(DATA[:n])
        assert root(HASHES[:n]) == expected, n
        cr.append(HASHES[n - 1])
        assert cr.size == n
        assert len(cr.hashes) == n.bit_count()
        assert cr.root() == expected, n
        assert CompactRange(n, cr.hashes).root() == expected, n


def test_inclusion_proofs_match_reference_and_verify() -> None:
    rng = random.Random(9162)
    for n in range(1, MAX_SIZE + 1):
        tree_root = ref.mth(DATA[:n])
        for m in range(n):
            proof = inclusion_proof(m, HASHES[:n])
            assert proof == ref.path(m, DATA[:n]), (m, n)
            assert ref.verify_inclusion(m, n, HASHES[m], proof, tree_root)
            assert root_from_inclusion_proof(m, n, HASHES[m], proof) == tree_root
            verify_inclusion(m, n, HASHES[m], proof, tree_root)
            for i, elem in enumerate(proof):
                bad = [*proof[:i], flip_bit(elem, rng.randrange(256)), *proof[i + 1 :]]
                with pytest.raises(RootMismatch):
                    verify_inclusion(m, n, HASHES[m], bad, tree_root)
            with pytest.raises(RootMismatch):
                verify_inclusion(m, n, flip_bit(HASHES[m], rng.randrange(256)), proof, tree_root)
            if n > 1:  # Another leaf's hash at this index does not verify.
                with pytest.raises(RootMismatch):
                    verify_inclusion(m, n, HASHES[(m + 1) % n], proof, tree_root)


def test_consistency_proofs_match_reference_and_verify() -> None:
    rng = random.Random(6962)
    roots = [EMPTY_ROOT] + [ref.mth(DATA[:n]) for n in range(1, MAX_SIZE + 1)]
    for n in range(1, MAX_SIZE + 1):
        for m in range(1, n + 1):
            proof = consistency_proof(m, HASHES[:n])
            assert proof == ref.proof(m, DATA[:n]), (m, n)
            assert root_from_consistency_proof(m, n, roots[m], proof) == roots[n]
            verify_consistency(m, n, roots[m], roots[n], proof)
            if m == n:
                assert proof == []
                continue
            assert ref.verify_consistency(m, n, roots[m], roots[n], proof)
            for i, elem in enumerate(proof):
                bad = [*proof[:i], flip_bit(elem, rng.randrange(256)), *proof[i + 1 :]]
                with pytest.raises(RootMismatch):
                    verify_consistency(m, n, roots[m], roots[n], bad)
                assert not ref.verify_consistency(m, n, roots[m], roots[n], bad)
            with pytest.raises(RootMismatch):
                verify_consistency(m, n, flip_bit(roots[m], rng.randrange(256)), roots[n], proof)
            with pytest.raises(RootMismatch):
                verify_consistency(m, n, roots[m], flip_bit(roots[n], rng.randrange(256)), proof)


def test_random_mutations_agree_with_reference() -> None:
    """Random truncations, extensions and index/size changes: ours fails iff the RFC text does."""
    rng = random.Random(2024)
    roots = [EMPTY_ROOT] + [ref.mth(DATA[:n]) for n in range(1, MAX_SIZE + 1)]
    disagreements: list[tuple[Any, ...]] = []
    for _ in range(3000):
        n = rng.randrange(2, MAX_SIZE + 1)
        m = rng.randrange(n)
        proof = inclusion_proof(m, HASHES[:n])
        cut = rng.randrange(len(proof) + 1)
        variants: list[tuple[int, int, list[bytes]]] = [
            (m, n, proof[:cut] + proof[cut + 1 :]),
            (m, n, [*proof[:cut], HASHES[rng.randrange(n)], *proof[cut:]]),
            (rng.randrange(n), n, proof),
            (m, rng.randrange(m + 1, MAX_SIZE + 1), proof),
        ]
        for idx, size, pr in variants:
            ours = _outcome(verify_inclusion, idx, size, HASHES[idx], pr, roots[size])
            theirs = ref.verify_inclusion(idx, size, HASHES[idx], pr, roots[size])
            if (ours == "ok") != theirs or ours.startswith("crash"):
                disagreements.append(("inclusion", idx, size, ours, theirs))
        m1 = rng.randrange(1, n)
        cproof = consistency_proof(m1, HASHES[:n])
        cut = rng.randrange(len(cproof) + 1)
        cvariants: list[tuple[int, int, list[bytes]]] = [
            (m1, n, cproof[:cut] + cproof[cut + 1 :]),
            (m1, n, [*cproof[:cut], HASHES[rng.randrange(n)], *cproof[cut:]]),
            (rng.randrange(1, n), n, cproof),
            (m1, rng.randrange(m1 + 1, MAX_SIZE + 1), cproof),
        ]
        for s1, s2, pr in cvariants:
            ours = _outcome(verify_consistency, s1, s2, roots[s1], roots[s2], pr)
            theirs = ref.verify_consistency(s1, s2, roots[s1], roots[s2], pr)
            if (ours == "ok") != theirs or ours.startswith("crash"):
                disagreements.append(("consistency", s1, s2, ours, theirs))
    assert not disagreements, f"{len(disagreements)} disagreements: {disagreements[:20]}"


# ---------------------------------------------------------------------------------------------
# Preconditions and error types


def test_inclusion_preconditions() -> None:
    h = HASHES[:5]
    proof = inclusion_proof(2, h)
    r = root(h)
    with pytest.raises(ProofError, match="5 >= 5"):
        verify_inclusion(5, 5, h[0], proof, r)
    with pytest.raises(ProofError, match="negative"):
        verify_inclusion(-1, 5, h[0], proof, r)
    with pytest.raises(ProofError, match="leaf_hash has 31 bytes"):
        verify_inclusion(2, 5, h[2][:31], proof, r)
    with pytest.raises(ProofError, match=r"wrong proof size 2, want 3"):
        verify_inclusion(2, 5, h[2], proof[:2], r)
    with pytest.raises(ProofError, match=r"wrong proof size 4, want 3"):
        verify_inclusion(2, 5, h[2], [*proof, h[0]], r)
    with pytest.raises(ProofError, match=r"proof\[1\] has 0 bytes"):
        verify_inclusion(2, 5, h[2], [proof[0], b"", proof[2]], r)
    with pytest.raises(ProofError, match="3 >= 3"):
        inclusion_proof(3, h[:3])
    with pytest.raises(ProofError):
        inclusion_proof(0, [])


def test_consistency_preconditions() -> None:
    h = HASHES[:7]
    proof = consistency_proof(3, h)
    r3, r7 = root(h[:3]), root(h)
    with pytest.raises(ProofError, match=r"size2 \(3\) < size1 \(7\)"):
        verify_consistency(7, 3, r7, r3, proof)
    with pytest.raises(ProofError, match="empty tree"):
        verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])
    with pytest.raises(ProofError, match="empty tree"):
        verify_consistency(0, 7, EMPTY_ROOT, r7, [])
    with pytest.raises(ProofError, match="proof has 1 elements"):
        verify_consistency(3, 3, r3, r3, [r3])
    with pytest.raises(ProofError, match="empty proof for 3 -> 7"):
        verify_consistency(3, 7, r3, r7, [])
    assert len(proof) == 4  # seed (3 is not a power of two), one inner, two border
    with pytest.raises(ProofError, match=r"wrong proof size 3, want 4 for 3 -> 7"):
        verify_consistency(3, 7, r3, r7, proof[:3])
    with pytest.raises(ProofError, match=r"wrong proof size 5, want 4 for 3 -> 7"):
        verify_consistency(3, 7, r3, r7, [*proof, r3])
    with pytest.raises(ProofError, match="root1 has 9 bytes"):
        verify_consistency(3, 7, b"WrongRoot", r7, proof)
    with pytest.raises(ProofError, match="empty tree"):
        consistency_proof(0, h)
    with pytest.raises(ProofError, match="old_size 8 > new size 7"):
        consistency_proof(8, h)
    assert consistency_proof(7, h) == []


def test_root_mismatch_carries_both_roots() -> None:
    h = HASHES[:4]
    proof = inclusion_proof(1, h)
    wrong = bytes(32)
    with pytest.raises(RootMismatch) as info:
        verify_inclusion(1, 4, h[1], proof, wrong)
    assert info.value.expected == wrong
    assert info.value.calculated == root(h)
    assert wrong.hex() in str(info.value) and root(h).hex() in str(info.value)
    assert isinstance(info.value, MerkleError)
    assert issubclass(ProofError, MerkleError)


def test_root_mismatch_names_an_empty_root() -> None:
    """An empty root (a caller's or an equal-size ``root1``) is spelt out, not left blank."""
    h = HASHES[:3]
    r3 = root(h)
    with pytest.raises(RootMismatch) as info:
        verify_consistency(3, 3, b"", r3, [])
    assert str(info.value) == f"calculated root (empty) does not match expected root {r3.hex()}"
    with pytest.raises(RootMismatch) as info:
        verify_inclusion(0, 3, h[0], inclusion_proof(0, h), b"")
    assert str(info.value) == f"calculated root {r3.hex()} does not match expected root (empty)"


def _proof_of_5_to_6() -> list[bytes]:
    """Seed, one inner and one border element: the border counts in the wanted length."""
    proof = consistency_proof(5, HASHES[:6])
    assert len(proof) == 3
    return proof


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: CompactRange(-1), "size is negative: -1"),
        (lambda: CompactRange(1, [b"abc"]), "hashes[0] has 3 bytes, want 32"),
        (lambda: inclusion_proof(-1, HASHES[:3]), "index is negative: -1"),
        (lambda: consistency_proof(-1, HASHES[:3]), "old_size is negative: -1"),
        (lambda: root_from_inclusion_proof(-1, 5, HASHES[0], []), "index is negative: -1"),
        (lambda: root_from_inclusion_proof(0, -1, HASHES[0], []), "size is negative: -1"),
        (
            lambda: root_from_inclusion_proof(4, 5, HASHES[4], []),
            "wrong proof size 0, want 1 for index 4 in size 5",
        ),
        (lambda: root_from_consistency_proof(-1, 5, HASHES[0], []), "size1 is negative: -1"),
        (lambda: root_from_consistency_proof(1, -1, HASHES[0], []), "size2 is negative: -1"),
        (
            lambda: root_from_consistency_proof(5, 6, root(HASHES[:5]), _proof_of_5_to_6()[:2]),
            "wrong proof size 2, want 3 for 5 -> 6",
        ),
        (
            lambda: root_from_consistency_proof(
                5, 6, root(HASHES[:5]), [_proof_of_5_to_6()[0], b"", HASHES[0]]
            ),
            "proof[1] has 0 bytes, want 32",
        ),
    ],
)
def test_precondition_messages_name_the_argument(call: Callable[[], object], message: str) -> None:
    """Each refusal names the argument and the numbers that were wrong, exactly."""
    with pytest.raises(ProofError) as info:
        call()
    assert str(info.value) == message


def test_compact_range_validates_state_and_leaves() -> None:
    with pytest.raises(ProofError, match="size 5 needs 2 hashes, got 1"):
        CompactRange(5, [HASHES[0]])
    with pytest.raises(ProofError, match="negative"):
        CompactRange(-1)
    with pytest.raises(ProofError, match="leaf_hash has 3 bytes"):
        CompactRange().append(b"abc")
    with pytest.raises(ProofError, match=r"leaf_hashes\[1\] has 4 bytes"):
        root([HASHES[0], b"abcd"])


def test_root_is_iterative_on_a_large_tree() -> None:
    """A deep tree (2**16 + 3 leaves) is no problem for recursion limits and agrees everywhere."""
    n = (1 << 16) + 3
    hashes = [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(n)]
    cr = CompactRange()
    cr.extend(hashes)
    expected = cr.root()
    assert root(hashes) == expected
    proof = inclusion_proof(n - 2, hashes)
    verify_inclusion(n - 2, n, hashes[n - 2], proof, expected)
    cproof = consistency_proof(1 << 16, hashes)
    verify_consistency(1 << 16, n, root(hashes[: 1 << 16]), expected, cproof)


def test_large_index_from_probe_is_refused_cleanly() -> None:
    """uint64 max (the leafIdx-sub-@1 probes) must raise ProofError, not overflow."""
    big = (1 << 64) - 1
    with pytest.raises(ProofError, match=str(big)):
        verify_inclusion(big, 1, HASHES[0], [], HASHES[0])
    seq: Sequence[bytes] = ()
    with pytest.raises(ProofError):
        verify_inclusion(0, 0, HASHES[0], seq, EMPTY_ROOT)
