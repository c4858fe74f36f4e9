"""``docs/record.md`` against the code: its worked example, and a reader written from it alone.

Two proofs that the format document is right and sufficient:

1. Every deterministic value of the document's "Worked example" is regenerated here from the
   project's own code (``record.log.entry_line``, ``record.seal``, ``record.merkle``,
   ``record.checkpoint``, ``record.digest``) and compared with what the document shows, so the
   test breaks when either drifts. HPKE is randomised, so the document's wrapped data key is a
   fixed value that must open to the documented data key.
2. ``tests/record/independent_reader.py``, written only from the document with stdlib and
   ``cryptography`` primitives (no ``record`` import), verifies and decrypts a real bundle that
   ``record.log.Log`` wrote and ``record.bundle.export_stream`` exported; what it opens must
   equal what ``record.reader.StreamKeys`` opens.

Run this file as a script to print the worked example's blocks (the generator).
"""

from __future__ import annotations

import ast
import base64
import hashlib
import hmac
import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import independent_reader  # tests/record/independent_reader.py, a sibling
import pytest
import rfc8785
import uuid6
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

import record.seal
from record import merkle
from record.audit import Continues, Row, audit_stream, verify_store
from record.bundle import export_stream, verify_bundle
from record.checkpoint import (
    Checkpoint,
    Signer,
    Verifier,
    open_checkpoint,
    parse_note,
    sign_checkpoint,
)
from record.continuation import link_to, root_digest
from record.digest import Domain, canonical_json, digest
from record.errors import SchemaError
from record.log import LOG_KEY_NAME, Log, entry_line, origin_for
from record.reader import StreamKeys, associated_data, digest_mismatches
from record.schema import (
    _RFC3339_UTC_RE,
    _STREAM_RE,
    _UUID7_RE,
    BODY_MODELS,
    CLEAR_KINDS,
    SCHEMA_VERSION,
    Continuation,
    Envelope,
    FetchRequest,
    FetchResponse,
    ModelRequest,
    ModelResponse,
    PinsSet,
    Provider,
    RetrievalItem,
    StreamOpened,
    ToolCall,
    ToolResult,
    TurnEnded,
    TurnStarted,
    V1Record,
    WrappedKey,
    parse_body,
    parse_entry,
    project_v1,
)
from record.seal import KeyPair, _wrap_info, open_sealed
from record.sqlite_store import SQLiteStore

DOC = Path(__file__).resolve().parents[2] / "docs" / "record.md"

# --- the worked example's inputs ----------------------------------------------------------------

LOG_SEED = bytes(range(0x00, 0x20))
RECIPIENT_PRIVATE = bytes(range(0x20, 0x40))
DATA_KEY = bytes(range(0x40, 0x60))
NONCE_1 = bytes(range(0x60, 0x6C))
NONCE_2 = bytes(range(0x70, 0x7C))
STREAM = "example-session"
LABELS = {"purpose": "worked example"}
EVENT_IDS = (
    "017f22e2-79b0-7cc3-98c4-dc0c0c07398f",
    "017f22e2-79b1-7cc3-98c4-dc0c0c073990",
    "017f22e2-79b2-7cc3-98c4-dc0c0c073991",
)
TIMES = (
    "2026-07-22T09:30:00.000000Z",
    "2026-07-22T09:30:01.250000Z",
    "2026-07-22T09:30:02.500000Z",
)
QUESTION = b"What is 2 + 2?"
ANSWER = b"4"
#: HPKE encryption is randomised: this one output of ``RecipientKey.wrap`` is fixed in the
#: document, and the test checks that it opens to DATA_KEY rather than regenerating it.
WRAPPED_DATA_KEY = "R+oZe+QE/WIRegOCLmgfuVKKHpzAiYgRr0ONnq14mFZoEaKSpzkXTJCI/rkE8Pa68RPXbhZQlNC9lDZtz+5n8UJ7IEVhCQBlIwFVJX7y6BA="


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _envelope(seq: int, kind: str) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "stream": STREAM,
        "seq": seq,
        "event_id": EVENT_IDS[seq],
        "kind": kind,
        "occurred_at": TIMES[seq],
        "key_epoch": 0,
    }


def _sealed_with(nonce: bytes, plaintext: bytes, ad: bytes) -> bytes:
    """``record.seal.seal`` with its nonce fixed: the same primitive and layout."""
    return nonce + ChaCha20Poly1305(DATA_KEY).encrypt(nonce, plaintext, ad)


def _labeled_extract(suite_id: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
    return hmac.new(salt, b"HPKE-v1" + suite_id + label + ikm, hashlib.sha256).digest()


def _labeled_expand(suite_id: bytes, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
    labeled = length.to_bytes(2, "big") + b"HPKE-v1" + suite_id + label + info
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + labeled + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def hpke_open_steps(private: bytes, wrapped: bytes, info: bytes) -> dict[str, bytes]:
    """RFC 9180 base-mode Open for the record's suite, step by step (for the document).

    Written out here, not taken from ``cryptography``, so that the intermediate values the
    document shows exist; the test checks the result against ``KeyPair.unwrap``.
    """
    kem_id = b"KEM\x00\x20"  # DHKEM(X25519, HKDF-SHA256)
    hpke_id = b"HPKE\x00\x20\x00\x01\x00\x03"  # + HKDF-SHA256, ChaCha20Poly1305
    sk = X25519PrivateKey.from_private_bytes(private)
    enc, ct = wrapped[:32], wrapped[32:]
    pk_r = sk.public_key().public_bytes_raw()
    dh = sk.exchange(X25519PublicKey.from_public_bytes(enc))
    eae_prk = _labeled_extract(kem_id, b"", b"eae_prk", dh)
    shared = _labeled_expand(kem_id, eae_prk, b"shared_secret", enc + pk_r, 32)
    psk_id_hash = _labeled_extract(hpke_id, b"", b"psk_id_hash", b"")
    info_hash = _labeled_extract(hpke_id, b"", b"info_hash", info)
    context = b"\x00" + psk_id_hash + info_hash
    secret = _labeled_extract(hpke_id, shared, b"secret", b"")
    key = _labeled_expand(hpke_id, secret, b"key", context, 32)
    base_nonce = _labeled_expand(hpke_id, secret, b"base_nonce", context, 12)
    plaintext = ChaCha20Poly1305(key).decrypt(base_nonce, ct, b"")  # empty aad, seq 0
    return {
        "enc": enc,
        "dh": dh,
        "shared_secret": shared,
        "key": key,
        "base_nonce": base_nonce,
        "plaintext": plaintext,
    }


def generate() -> dict[str, str]:
    """Every value of the worked example, computed by the project's code."""
    v: dict[str, str] = {}
    signer = Signer(LOG_KEY_NAME, Ed25519PrivateKey.from_private_bytes(LOG_SEED))
    recipient = KeyPair(X25519PrivateKey.from_private_bytes(RECIPIENT_PRIVATE))
    origin = origin_for(signer, STREAM)

    v["log_key_name"] = signer.name
    v["log_key_seed"] = LOG_SEED.hex()
    v["log_public_key"] = signer.public_key_bytes().hex()
    v["log_key_id"] = signer.key_id.hex()
    v["log_vkey"] = signer.vkey()
    v["log_skey"] = signer.skey()
    v["recipient_private_key"] = RECIPIENT_PRIVATE.hex()
    v["recipient_public_key"] = recipient.recipient.text()
    v["recipient_private_key_pem"] = recipient.to_pem().decode("ascii")
    v["data_key"] = DATA_KEY.hex()
    v["stream"] = STREAM
    v["origin"] = origin

    v["hpke_info"] = _wrap_info(STREAM, 0).hex()
    v["wrapped_data_key"] = WRAPPED_DATA_KEY
    steps = hpke_open_steps(
        RECIPIENT_PRIVATE, base64.b64decode(WRAPPED_DATA_KEY), _wrap_info(STREAM, 0)
    )
    for name in ("enc", "dh", "shared_secret", "key", "base_nonce"):
        v[f"hpke_{name}"] = steps[name].hex()

    lines: list[bytes] = []

    # seq 0: stream.opened, clear.
    opened = StreamOpened(
        origin=origin,
        log_key=signer.vkey(),
        key_epoch=0,
        recipients=[
            WrappedKey(
                recipient=recipient.recipient.text(),
                sealed_key=base64.b64decode(WRAPPED_DATA_KEY),
            )
        ],
        labels=LABELS,
    )
    env0 = _envelope(0, "stream.opened")
    body0 = opened.model_dump(mode="json", exclude_none=True)  # as the log writes a clear body
    line0, ad0 = entry_line(env0, body0)
    v["entry0_envelope"] = ad0.decode("ascii")
    v["entry0_body"] = canonical_json(body0).decode("utf-8")
    v["entry0_line"] = line0.decode("utf-8")
    v["entry0_leaf_hash"] = merkle.hash_leaf(line0).hex()
    lines.append(line0)

    # seq 1: turn.started, sealed.
    started = TurnStarted(turn=0, input_bytes=QUESTION, input_digest=digest(Domain.INPUT, QUESTION))
    # seq 2: turn.ended, sealed.
    ended = TurnEnded(
        turn=0,
        outcome="ANSWERED",
        answer_bytes=ANSWER,
        answer_digest=digest(Domain.RESPONSE, ANSWER),
    )
    for seq, body, nonce in ((1, started, NONCE_1), (2, ended, NONCE_2)):
        env = _envelope(seq, body.kind)
        plaintext = canonical_json(body.model_dump(mode="json"))
        ad = canonical_json(env)
        sealed = _sealed_with(nonce, plaintext, ad)
        line, ad_again = entry_line(env, _b64(sealed))
        assert ad_again == ad
        v[f"entry{seq}_envelope"] = ad.decode("ascii")
        v[f"entry{seq}_plaintext"] = plaintext.decode("utf-8")
        v[f"entry{seq}_nonce"] = nonce.hex()
        v[f"entry{seq}_sealed"] = _b64(sealed)
        v[f"entry{seq}_line"] = line.decode("utf-8")
        v[f"entry{seq}_leaf_hash"] = merkle.hash_leaf(line).hex()
        lines.append(line)
    v["entry1_input_digest"] = started.input_digest
    v["entry2_answer_digest"] = ended.answer_digest or ""

    leaves = [merkle.hash_leaf(line) for line in lines]
    v["node_0_1"] = merkle.hash_children(leaves[0], leaves[1]).hex()
    v["root_3"] = merkle.root(leaves).hex()

    note = sign_checkpoint(signer, Checkpoint(origin, 3, merkle.root(leaves)))
    v["checkpoint_signature"] = parse_note(note).signatures[0].signature.hex()
    v["checkpoint_note"] = note.decode("utf-8")
    return v


# --- reading the document -----------------------------------------------------------------------

_BLOCK_RE = re.compile(r"^```example(?: (?P<name>[a-z0-9_]+))?\n(?P<text>.*?)^```$", re.M | re.S)


def doc_values(text: str) -> dict[str, str]:
    """Values of the document's ```` ```example ```` blocks.

    A block ```` ```example NAME ```` holds one value, its whole text (final newline included).
    A plain ```` ```example ```` block holds ``name: value`` lines; ``#`` lines are comments.
    """
    values: dict[str, str] = {}

    def put(name: str, value: str) -> None:
        assert name not in values, f"docs/record.md shows {name} twice"
        values[name] = value

    for match in _BLOCK_RE.finditer(text):
        if match["name"]:
            put(match["name"], match["text"])
            continue
        for line in match["text"].splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            name, sep, value = line.partition(": ")
            assert sep, f"docs/record.md: example line without 'name: value': {line!r}"
            put(name.strip(), value)
    return values


@pytest.fixture(scope="module")
def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def doc(doc_text: str) -> dict[str, str]:
    return doc_values(doc_text)


# --- 1. the worked example is what the code produces -------------------------------------------


def test_worked_example_is_the_last_section(doc_text: str) -> None:
    headings = re.findall(r"^## (.+)$", doc_text, re.M)
    assert headings[-1].endswith("Worked example")


def test_every_worked_example_value_is_regenerated_by_the_code(doc: dict[str, str]) -> None:
    expected = generate()
    assert sorted(doc) == sorted(expected), "the document and the generator list other values"
    wrong = [
        f"{name}:\n  doc:  {doc[name]!r}\n  code: {value!r}"
        for name, value in expected.items()
        if doc[name] != value
    ]
    assert not wrong, (
        f"{len(wrong)} value(s) of docs/record.md differ from the code:\n" + "\n".join(wrong)
    )


def test_documented_wrapped_key_opens_to_the_documented_data_key(doc: dict[str, str]) -> None:
    private = bytes.fromhex(doc["recipient_private_key"])
    wrapped = base64.b64decode(doc["wrapped_data_key"], validate=True)
    pair = KeyPair(X25519PrivateKey.from_private_bytes(private))
    assert pair.unwrap(wrapped, doc["stream"], 0) == bytes.fromhex(doc["data_key"])
    # The same through the document's step-by-step RFC 9180 open, and from the PEM file.
    steps = hpke_open_steps(private, wrapped, bytes.fromhex(doc["hpke_info"]))
    assert steps["plaintext"] == bytes.fromhex(doc["data_key"])
    from_pem = KeyPair.from_pem(doc["recipient_private_key_pem"].encode())
    assert from_pem.unwrap(wrapped, doc["stream"], 0) == bytes.fromhex(doc["data_key"])
    assert from_pem.recipient.text() == doc["recipient_public_key"]


def test_documented_sealed_bodies_open_with_record_seal(doc: dict[str, str]) -> None:
    data_key = bytes.fromhex(doc["data_key"])
    for seq in (1, 2):
        sealed = base64.b64decode(doc[f"entry{seq}_sealed"], validate=True)
        assert sealed[:12] == bytes.fromhex(doc[f"entry{seq}_nonce"])
        ad = doc[f"entry{seq}_envelope"].encode("ascii")
        assert open_sealed(data_key, sealed, ad) == doc[f"entry{seq}_plaintext"].encode()
        entry = parse_entry(doc[f"entry{seq}_line"].encode())
        assert associated_data(entry) == ad
        body = parse_body(entry.kind, doc[f"entry{seq}_plaintext"].encode())
        assert digest_mismatches(body) == []


def test_record_seal_itself_gives_the_documented_values_when_its_nonce_is_fixed(
    doc: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``seal`` draws its nonce from ``os.urandom``; fixed, it must give the documented bytes."""
    for seq in (1, 2):
        nonce = bytes.fromhex(doc[f"entry{seq}_nonce"])
        monkeypatch.setattr(record.seal.os, "urandom", lambda n, nonce=nonce: nonce[:n])
        sealed = record.seal.seal(
            bytes.fromhex(doc["data_key"]),
            doc[f"entry{seq}_plaintext"].encode(),
            doc[f"entry{seq}_envelope"].encode(),
        )
        monkeypatch.undo()
        assert _b64(sealed) == doc[f"entry{seq}_sealed"]


def test_documented_entries_and_checkpoint_verify_with_record(doc: dict[str, str]) -> None:
    lines = [doc[f"entry{i}_line"].encode() for i in range(3)]
    entries = [parse_entry(line) for line in lines]
    pair = KeyPair.from_pem(doc["recipient_private_key_pem"].encode())
    keys = StreamKeys.collect(doc["stream"], entries, pair)
    assert keys.keys == {0: bytes.fromhex(doc["data_key"])}
    rows = [Row(line) for line in lines]
    notes = [("example", doc["checkpoint_note"].encode())]
    assert audit_stream(doc["stream"], rows, notes, doc["log_vkey"], key=pair) == []
    cp, opened = open_checkpoint(
        doc["checkpoint_note"].encode(), [Verifier.from_vkey(doc["log_vkey"])]
    )
    assert (cp.origin, cp.size, cp.root_hash.hex()) == (doc["origin"], 3, doc["root_3"])
    assert opened.verified_by == (doc["log_key_name"],)
    signer = Signer.from_skey(doc["log_skey"])
    assert sign_checkpoint(signer, cp) == doc["checkpoint_note"].encode()


def test_documented_pkcs8_prefix(doc: dict[str, str], doc_text: str) -> None:
    prefix = "302e020100300506032b656e04220420"
    assert prefix in doc_text
    for private in (bytes.fromhex(doc["recipient_private_key"]), bytes(32), bytes([0xFF]) * 32):
        der = X25519PrivateKey.from_private_bytes(private).private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        assert der == bytes.fromhex(prefix) + private


# --- 2. the document names every kind, member, domain, pattern and problem code -----------------


def _member_table(doc_text: str, title: str) -> dict[str, str]:
    """``member -> type cell`` of the table right after the line that is exactly ``title``."""
    match = re.search(rf"^{re.escape(title)}(?: \(.*\))?\n\n((?:\|.*\n)+)", doc_text, re.M)
    assert match, f"docs/record.md has no member table under {title}"
    rows = {}
    for row in match[1].splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1]
    return rows


def _section(doc_text: str, number: str) -> str:
    """The text of ``## <number> …`` up to the next ``## ``."""
    start = doc_text.index(f"\n## {number} ")
    end = doc_text.find("\n## ", start + 1)
    return doc_text[start : end if end > 0 else None]


def _admits_null(annotation: Any) -> bool:
    return type(None) in getattr(annotation, "__args__", ())


@pytest.mark.parametrize("kind", sorted(BODY_MODELS))
def test_every_body_member_is_documented(doc_text: str, kind: str) -> None:
    model = BODY_MODELS[kind]
    table = _member_table(doc_text, f"`{kind}`")
    assert sorted(table) == sorted(model.model_fields)
    for name, info in model.model_fields.items():
        documented_null = table[name].endswith(" or null")
        assert documented_null == _admits_null(info.annotation), f"{kind}.{name}: {table[name]}"


def test_wrapped_key_members_are_documented(doc_text: str) -> None:
    table = _member_table(doc_text, "WrappedKey (an object inside `recipients`)")
    assert sorted(table) == sorted(WrappedKey.model_fields)


def test_kind_table_says_which_bodies_are_clear(doc_text: str) -> None:
    rows = dict(re.findall(r"^\| `([a-z]+\.[a-z]+)` \| (\*\*clear\*\*|sealed) \|", doc_text, re.M))
    assert sorted(rows) == sorted(BODY_MODELS)
    assert {k for k, v in rows.items() if v == "**clear**"} == CLEAR_KINDS


def test_envelope_members_and_patterns_are_the_schemas(doc_text: str) -> None:
    rows = re.findall(r"^\| `([a-z_]+)` \| (string|integer) \|", _section(doc_text, "4."), re.M)
    assert [name for name, _ in rows] == list(Envelope.model_fields)
    for pattern in (_STREAM_RE, _UUID7_RE, _RFC3339_UTC_RE):
        assert f"`{pattern.pattern}`" in doc_text


def test_every_digest_domain_is_documented(doc_text: str) -> None:
    rows = dict(re.findall(r"^\| `0x([0-9A-F]{2})` \| ([A-Z_]+) \|", doc_text, re.M))
    assert rows == {f"{d.value:02X}": d.name for d in Domain}


def test_documented_digest_pairs_are_what_the_reader_checks(doc_text: str) -> None:
    """Each (bytes, digest, domain) the document's §6 table names is one the code checks."""
    table = {}
    for byte, cell in re.findall(
        r"^\| `0x([0-9A-F]{2})` \| [A-Z_]+ \| [^|]+ \| ([^|]+) \|", doc_text, re.M
    ):
        for kind_part in cell.split(";"):
            for kind, dfield, bfield in re.findall(
                r"`([a-z]+\.[a-z]+)\.([a-z_]+)` over `([a-z_]+)`", kind_part
            ):
                table[(kind, dfield)] = (bfield, int(byte, 16))
            for dfield, bfield, kinds in re.findall(
                r"`([a-z_]+)` over `([a-z_]+)` in ((?:`[a-z.]+`,? ?)+)", kind_part
            ):
                for kind in re.findall(r"`([a-z.]+)`", kinds):
                    table[(kind, dfield)] = (bfield, int(byte, 16))
    for (kind, dfield), (bfield, domain) in table.items():
        if kind == "evidence.archived":
            continue  # covers a bundle file, not a body member
        model = BODY_MODELS[kind]
        fields: dict[str, Any] = {}
        for name, info in model.model_fields.items():
            if name == bfield:
                fields[name] = b"bytes"
            elif name == dfield:
                fields[name] = digest(Domain(domain), b"bytes")
            elif info.is_required():
                sample = "ANSWERED" if (kind, name) == ("turn.ended", "outcome") else None
                fields[name] = sample or _SAMPLE[name]
        body = model.model_validate(fields)
        assert not any(dfield in p for p in digest_mismatches(body)), (kind, dfield)
        wrong = body.model_copy(
            update={dfield: digest(Domain((domain + 1) % len(Domain)), b"bytes")}
        )
        assert any(dfield in p for p in digest_mismatches(wrong)), (kind, dfield)
    digest_fields = {
        (kind, name)
        for kind, model in BODY_MODELS.items()
        for name in model.model_fields
        if name == "content_key" or (name.endswith("_digest") and name != "evidence_digest")
    }
    assert set(table) == digest_fields


_SAMPLE: dict[str, Any] = {
    "content_key": "sha256:" + "0" * 64,
    "input_digest": "sha256:" + "0" * 64,
    "prompt_digest": "sha256:" + "0" * 64,
    "request_bytes": b"",
    "input_bytes": b"",
    "prompt_bytes": b"",
    "provider": {"name": "p", "endpoint": "e"},
    "model_id": "m",
    "params": {},
    "request_seq": 0,
    "outcome": "COMMITTED",
    "reply_seq": 0,
    "call_id": "c",
    "server": "s",
    "tool": "t",
    "arguments": b"{}",
    "arguments_digest": "sha256:" + "0" * 64,
    "idempotent": True,
    "call_seq": 0,
    "method": "GET",
    "url": "https://example.org/",
    "turn": 0,
}


def test_every_problem_code_is_documented(doc_text: str) -> None:
    import record.audit

    source = "".join(p.read_text() for p in Path(record.audit.__file__).parent.glob("*.py"))
    emitted = set(re.findall(r'(?:Problem|out\.add)\(\s*"([a-z_]+)"', source))
    documented = set(re.findall(r"^\| `([a-z_]+)` \| ", _section(doc_text, "14."), re.M))
    assert emitted == documented


def test_envelope_needs_no_escape_so_plain_sorted_json_is_jcs() -> None:
    """§3: the document lets a reader serialise the envelope with any sorted, compact JSON."""
    envelope = _envelope(1, "model.request") | {"stream": "A.b_c-9" * 18, "seq": 2**53 - 1}
    assert canonical_json(envelope) == json.dumps(
        envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("ascii")
    assert list(json.loads(canonical_json(envelope))) == [
        "event_id",
        "key_epoch",
        "kind",
        "occurred_at",
        "schema_version",
        "seq",
        "stream",
    ]


def test_consistency_proofs_from_size_zero_are_refused_as_documented(doc_text: str) -> None:
    assert "Consistency proofs from size 0 are\nrejected" in doc_text
    leaves = [merkle.hash_leaf(b"a")]
    with pytest.raises(merkle.ProofError):
        merkle.consistency_proof(0, leaves)
    with pytest.raises(merkle.ProofError):
        merkle.verify_consistency(0, 0, merkle.EMPTY_ROOT, merkle.EMPTY_ROOT, [])
    with pytest.raises(merkle.ProofError):
        merkle.verify_consistency(0, 1, merkle.EMPTY_ROOT, leaves[0], [])
    assert merkle.EMPTY_ROOT.hex().startswith("e3b0c442") and "e3b0c442…b855" in doc_text


# --- 3. a reader written from the document alone, over real bundles ------------------------------


def test_independent_reader_imports_only_stdlib_and_cryptography_primitives() -> None:
    tree = ast.parse(Path(independent_reader.__file__).read_text(encoding="utf-8"))
    imported = {
        name.split(".")[0] if not name.startswith("cryptography") else name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
    }
    third_party = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names}
    assert third_party == {
        "cryptography.exceptions",
        "cryptography.hazmat.primitives.asymmetric.ed25519",
        "cryptography.hazmat.primitives.asymmetric.x25519",
        "cryptography.hazmat.primitives.ciphers.aead",
    }


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [True, False, None], "": "x"},
        {"\ue000": 1, "\U0001d11e": 2, "é": 3, "z": 4},  # UTF-16 order: U+1D11E before U+E000
        'quote " backslash \\ slash / tab \t nl \n cr \r bs \b ff \f nul \x00 us \x1f del \x7f',
        "non-ASCII: naïve ☃ 𝄞 \u2028 \u2029",
        [0, -1, 2**53 - 1, -(2**53 - 1), {}, [], ""],
    ],
)
def test_reader_jcs_is_rfc8785(value: Any) -> None:
    assert independent_reader.jcs(value) == canonical_json(value)


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("stream", "s\n"),
        ("event_id", EVENT_IDS[0] + "\n"),
        ("occurred_at", "\u0662\u0660\u0662\u0666-07-22T09:30:00Z"),  # Arabic-Indic digits
        ("occurred_at", TIMES[0] + "\n"),
    ],
)
def test_reader_matches_envelope_patterns_against_the_whole_string(member: str, value: str) -> None:
    """§4.1: whole-string patterns, ASCII digits, in the reference and the independent reader."""
    envelope = _envelope(1, "turn.ended") | {member: value}
    line = rfc8785.dumps(envelope | {"body": _b64(bytes(40))})  # entry_line takes valid values only
    with pytest.raises(SchemaError, match=member):
        parse_entry(line)
    with pytest.raises(independent_reader.Bad, match=member):
        independent_reader.parse_line(line)


def _body_json(body: Any) -> dict[str, Any]:
    out: dict[str, Any] = body.model_dump(mode="json")
    return out


NON_UTF8_REPLY = b'data: {"x":"\xff\xfe"}\n\n\x80\xc3(\x00 cut mid-character \xe2\x82'


def _write_session(tmp_path: Path) -> dict[str, Any]:
    """A real store written by ``record.log.Log``: every kind, a non-UTF-8 body, a rotation."""
    user, auditor, appliance = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    signer = Signer.generate(LOG_KEY_NAME)
    store = tmp_path / "record.db"
    stream = "sess-1.a_b"
    labels = {"pinned": "seed=42", "note": 'naïve "quoted"\n☃', "\ue000": "pua", "𝄞": "clef"}
    log = Log(SQLiteStore(store), signer, appliance_key=appliance)
    try:
        log.open_stream(stream, [user.recipient, appliance.recipient], labels)
        log.append(stream, PinsSet(pins={"seed": 42, "temperature": 0.7}))
        question = "Quel temps fait-il à Zürich ? ☀".encode()
        log.append(
            stream,
            TurnStarted(turn=0, input_bytes=question, input_digest=digest(Domain.INPUT, question)),
        )
        request = canonical_json(
            {"model": "m", "messages": [{"role": "user", "content": question.decode()}]}
        )
        req = log.append(
            stream,
            ModelRequest(
                content_key=digest(Domain.REQUEST, request),
                input_digest=digest(Domain.INPUT, question),
                prompt_digest=digest(Domain.PROMPT, request),
                request_bytes=request,
                input_bytes=question,
                prompt_bytes=request,
                retrieval=[
                    RetrievalItem(
                        doc_id="d", doc_version="1", chunk_digest=digest(Domain.INPUT, b"c")
                    )
                ],
                provider=Provider(name="embedded", endpoint="http://127.0.0.1/v1", api_version="1"),
                model_id="affidavit-tiny",
                params={"temperature": 0.7, "top_p": 1.0, "max_tokens": 64, "big": 1e21},
                pins={"seed": 42},
                clock="2026-11-30T12:00:00Z",
                turn=0,
                step=0,
            ),
        )
        reply = log.append(
            stream,
            ModelResponse(
                request_seq=req.seq,
                outcome="COMMITTED",
                status=200,
                response_bytes=NON_UTF8_REPLY,
                response_digest=digest(Domain.RESPONSE, NON_UTF8_REPLY),
                fingerprint="fp_1",
                reproducibility={"weights": digest(Domain.WEIGHTS, b"w"), "batch_invariant": True},
            ),
        )
        arguments = canonical_json({"url": "https://example.org/"})
        call = log.append(
            stream,
            ToolCall(
                reply_seq=reply.seq,
                call_id="call_0",
                server="builtin",
                tool="web_fetch",
                arguments=arguments,
                arguments_digest=digest(Domain.TOOL_ARGUMENTS, arguments),
                idempotent=True,
            ),
        )
        fetch_request = b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n"
        fetch = log.append(
            stream,
            FetchRequest(
                method="GET",
                url="https://example.org/",
                request_bytes=fetch_request,
                content_key=digest(Domain.FETCH_REQUEST, fetch_request),
            ),
        )
        page = b"HTTP/1.1 200 OK\r\n\r\n<html>\xff</html>"
        log.append(
            stream,
            FetchResponse(
                request_seq=fetch.seq,
                outcome="COMMITTED",
                status=200,
                response_bytes=page,
                response_digest=digest(Domain.FETCH_RESPONSE, page),
            ),
        )
        error = b'{"error":"tool crashed"}'
        log.append(
            stream,
            ToolResult(
                call_seq=call.seq,
                outcome="FAILED",
                error_bytes=error,
                error_digest=digest(Domain.ERROR, error),
            ),
        )
        log.archive_evidence(stream, "sev-snp", "report.bin", b"\x01\x02 evidence \xff")
        log.append(
            stream,
            TurnEnded(
                turn=0,
                outcome="ANSWERED",
                answer_bytes=b"Sunny.",
                answer_digest=digest(Domain.RESPONSE, b"Sunny."),
            ),
        )
        log.rotate_key(stream, [user.recipient, auditor.recipient, appliance.recipient])
        log.append(
            stream, TurnStarted(turn=1, input_bytes=b"", input_digest=digest(Domain.INPUT, b""))
        )
        # A call whose reply never came: no model.response, its v1.0 outcome is UNKNOWN.
        empty = b"{}"
        log.append(
            stream,
            ModelRequest(
                content_key=digest(Domain.REQUEST, empty),
                input_digest=digest(Domain.INPUT, b""),
                prompt_digest=digest(Domain.PROMPT, empty),
                request_bytes=empty,
                input_bytes=b"",
                prompt_bytes=empty,
                provider=Provider(name="embedded", endpoint="http://127.0.0.1/v1"),
                model_id="affidavit-tiny",
                params={},
            ),
        )
        log.append(stream, TurnEnded(turn=1, outcome="STOPPED"))
        log.checkpoint(stream)  # on demand: a second checkpoint of size 15
        log.append(stream, PinsSet(pins={}, cache_mode="shared"))
    finally:
        log.close()
    bundle = tmp_path / "bundle"
    export_stream(store, stream, bundle)
    pem = tmp_path / "user.pem"
    user.write(pem)
    return {
        "bundle": bundle,
        "stream": stream,
        "user": user,
        "auditor": auditor,
        "pem": pem,
        "vkey": signer.vkey(),
        "signer": signer,
    }


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _write_session(tmp_path_factory.mktemp("format-doc"))


def _record_entries(bundle: Path) -> list[Any]:
    return [parse_entry(line) for line in (bundle / "entries.jsonl").read_bytes().splitlines()]


def test_independent_reader_verifies_and_opens_a_real_bundle(session: dict[str, Any]) -> None:
    bundle, user = session["bundle"], session["user"]
    # Nothing pinned: the checkpoints are checked with the vkey of log_key.pub.
    assert (bundle / "log_key.pub").read_text().strip() == session["vkey"]
    report = independent_reader.verify_bundle(bundle, private_key_pem=session["pem"].read_bytes())
    assert report.problems == []
    reference = verify_bundle(bundle, key=user)
    assert reference.ok, reference.problems

    entries = _record_entries(bundle)
    assert len(entries) == len(report.envelopes) == 16
    assert report.stream == session["stream"]
    assert sorted(report.data_keys) == [0, 1]
    assert {e.key_epoch for e in entries} == {0, 1}
    keys = StreamKeys.collect(session["stream"], entries, user)
    assert report.data_keys == keys.keys
    # Every body the reader opened is, value for value and byte for byte, what record opens.
    assert sorted(report.bodies) == [e.seq for e in entries]
    for entry in entries:
        opened = keys.open(entry)
        assert report.bodies[entry.seq] == _body_json(opened), entry.kind
        if entry.kind not in CLEAR_KINDS:
            assert report.plaintexts[entry.seq] == canonical_json(_body_json(opened))
    response = next(e for e in entries if e.kind == "model.response")
    assert base64.b64decode(report.bodies[response.seq]["response_bytes"]) == NON_UTF8_REPLY
    # Checkpoints: one per commit (these appends came one at a time), and the on-demand one
    # after size 15; every entry is covered.
    notes = sorted((bundle / "checkpoints").glob("*.note"))
    assert [cp.size for cp in report.checkpoints] == [*range(1, 16), 15, 16]
    assert len(notes) == 17
    assert report.uncovered == 0
    for cp in report.checkpoints:
        assert cp.root == merkle.root([merkle.hash_leaf(e) for e in _lines(bundle)[: cp.size]])


def _lines(bundle: Path) -> list[bytes]:
    return (bundle / "entries.jsonl").read_bytes().splitlines()


def test_independent_reader_verifies_without_a_key_against_a_pinned_log_key(
    session: dict[str, Any],
) -> None:
    report = independent_reader.verify_bundle(session["bundle"], log_key=session["vkey"])
    assert report.problems == []
    assert report.bodies == {}  # no key: §13 does not run
    assert len(report.checkpoints) == 17


def test_v1_record_projection_follows_the_documented_mapping(
    session: dict[str, Any], doc_text: str
) -> None:
    mapped = re.findall(r"^\| `([a-z_]+)` \| (request|response)", _section(doc_text, "15."), re.M)
    assert [name for name, _ in mapped] == list(V1Record.model_fields)
    report = independent_reader.verify_bundle(
        session["bundle"], private_key_pem=session["pem"].read_bytes()
    )
    entries = _record_entries(session["bundle"])
    keys = StreamKeys.collect(session["stream"], entries, session["user"])
    bodies = {e.seq: keys.open(e) for e in entries}
    requests = [e for e in entries if e.kind == "model.request"]
    outcomes = []
    for entry in requests:
        response = next(
            (
                b
                for b in bodies.values()
                if isinstance(b, ModelResponse) and b.request_seq == entry.seq
            ),
            None,
        )
        request_body = bodies[entry.seq]
        assert isinstance(request_body, ModelRequest)
        expected = project_v1(entry.envelope(), request_body, response).model_dump(mode="json")
        assert independent_reader.v1_record(report, entry.seq) == expected
        outcomes.append(expected["outcome"])
    assert outcomes == ["COMMITTED", "UNKNOWN"]


def test_a_recipient_added_at_rotation_opens_only_the_later_epoch(
    session: dict[str, Any], tmp_path: Path
) -> None:
    pem = tmp_path / "auditor.pem"
    session["auditor"].write(pem)
    report = independent_reader.verify_bundle(
        session["bundle"], private_key_pem=pem.read_bytes(), log_key=session["vkey"]
    )
    reference = verify_bundle(session["bundle"], key=session["auditor"], log_key=session["vkey"])
    assert sorted(report.data_keys) == [1]
    entries = _record_entries(session["bundle"])
    sealed_epoch0 = {e.seq for e in entries if e.key_epoch == 0 and e.kind not in CLEAR_KINDS}
    assert {seq for code, seq, _ in report.problems} == sealed_epoch0
    assert report.codes() == {"cannot_open"}
    assert {(p.code, p.seq) for p in reference.problems} == {
        ("cannot_open", seq) for seq in sealed_epoch0
    }


def _edit_line(bundle: Path, index: int, edit: Callable[[bytes], bytes]) -> None:
    lines = _lines(bundle)
    lines[index] = edit(lines[index])
    (bundle / "entries.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))


def _flip_body(line: bytes) -> bytes:
    i = line.index(b'"body":"') + 20
    return line[:i] + (b"A" if line[i : i + 1] != b"A" else b"B") + line[i + 1 :]


def _tamper_signature(bundle: Path) -> None:
    note = bundle / "checkpoints" / "000001.note"
    text = note.read_bytes()
    i = text.rindex(b" ") + 10
    note.write_bytes(text[:i] + (b"A" if text[i : i + 1] != b"A" else b"B") + text[i + 1 :])


def _drop_line(bundle: Path, index: int) -> None:
    lines = _lines(bundle)
    del lines[index]
    (bundle / "entries.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))


def _swap_lines(bundle: Path, i: int, j: int) -> None:
    lines = _lines(bundle)
    lines[i], lines[j] = lines[j], lines[i]
    (bundle / "entries.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))


def _keep_first(bundle: Path, n: int) -> None:
    lines = _lines(bundle)[:n]
    (bundle / "entries.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    (bundle / "bundle.json").write_text(
        json.dumps(json.loads((bundle / "bundle.json").read_text()) | {"entries": n})
    )


TAMPERING: dict[str, tuple[Callable[[Path], None], set[str]]] = {
    "sealed body changed": (
        lambda b: _edit_line(b, 3, _flip_body),
        {"root_mismatch", "cannot_open", "unsigned_tail"},
    ),
    "envelope time changed": (
        lambda b: _edit_line(
            b, 2, lambda line: line.replace(b'"occurred_at":"2', b'"occurred_at":"1')
        ),
        {"root_mismatch", "cannot_open", "unsigned_tail"},
    ),
    "entry deleted": (
        lambda b: _drop_line(b, 5),
        {"seq_gap", "root_mismatch", "malformed_bundle", "truncated", "unsigned_tail"},
    ),
    "entries swapped": (
        lambda b: _swap_lines(b, 4, 5),
        {"seq_order", "root_mismatch", "unsigned_tail"},
    ),
    "log truncated": (lambda b: _keep_first(b, 10), {"truncated"}),
    "forged line appended": (lambda b: _append_forged_line(b), {"unsigned_tail"}),
    "newest checkpoints removed": (lambda b: _drop_notes(b, 3), {"unsigned_tail"}),
    "checkpoint signature changed": (_tamper_signature, {"checkpoint_invalid"}),
    "last newline cut": (
        lambda b: (b / "entries.jsonl").write_bytes((b / "entries.jsonl").read_bytes()[:-1]),
        {"malformed_bundle"},
    ),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_independent_reader_finds_what_the_reference_audit_finds(
    session: dict[str, Any], tmp_path: Path, case: str
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(session["bundle"], bundle)
    tamper, expected = TAMPERING[case]
    tamper(bundle)
    report = independent_reader.verify_bundle(
        bundle, private_key_pem=session["pem"].read_bytes(), log_key=session["vkey"]
    )
    reference = verify_bundle(bundle, key=session["user"], log_key=session["vkey"])
    assert report.codes() == reference.codes() == expected


def test_kept_checkpoints_catch_a_rollback_and_a_fork(session: dict[str, Any]) -> None:
    """§12 step 9: checkpoints a user kept, checked like the bundle's own."""
    signer, stream = session["signer"], session["stream"]
    origin = origin_for(signer, stream)
    lines = _lines(session["bundle"])
    fine = sign_checkpoint(
        signer, Checkpoint(origin, 5, merkle.root([merkle.hash_leaf(x) for x in lines[:5]]))
    )
    later = sign_checkpoint(signer, Checkpoint(origin, 40, bytes(32)))  # rolled back since
    forked = sign_checkpoint(signer, Checkpoint(origin, 7, bytes(32)))  # another history
    cases = {(fine,): set(), (later,): {"truncated"}, (forked,): {"checkpoint_inconsistent"}}
    for kept, expected in cases.items():
        report = independent_reader.verify_bundle(
            session["bundle"], log_key=session["vkey"], kept=kept
        )
        reference = verify_bundle(session["bundle"], log_key=session["vkey"], kept=kept)
        assert report.codes() == reference.codes() == expected


def test_independent_reader_refuses_another_log_key(session: dict[str, Any]) -> None:
    other = Signer.generate(LOG_KEY_NAME).vkey()
    report = independent_reader.verify_bundle(session["bundle"], log_key=other)
    reference = verify_bundle(session["bundle"], log_key=other)
    # no checkpoint verifies, so nothing is signed: every line is an unsigned tail
    assert report.codes() == reference.codes() == {"checkpoint_invalid", "unsigned_tail"}


def test_independent_reader_refuses_a_non_canonical_line(
    session: dict[str, Any], tmp_path: Path
) -> None:
    """§4.4's SHOULD: a re-spaced line (here the last, whose checkpoint is removed) is refused."""
    bundle = tmp_path / "bundle"
    shutil.copytree(session["bundle"], bundle)
    _drop_notes(bundle, 1)
    _edit_line(bundle, 15, lambda line: line.replace(b'","event_id"', b'", "event_id"'))
    report = independent_reader.verify_bundle(
        bundle, log_key=session["vkey"], allow_unsigned_tail=True
    )
    assert report.codes() == {"malformed_entry"}
    assert report.uncovered == 1


def test_unsigned_tail_is_counted_and_tolerated_only_when_allowed(
    session: dict[str, Any], tmp_path: Path
) -> None:
    """§12 step 8: lines after the largest matching checkpoint are counted; they are a problem
    unless the verifier is told to tolerate them (a store from before every commit was
    signed)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(session["bundle"], bundle)
    _drop_notes(bundle, 3)  # the notes of sizes 16, 15 (on demand) and 15
    strict = independent_reader.verify_bundle(bundle, log_key=session["vkey"])
    assert strict.problems == [("unsigned_tail", 14, "2 lines no checkpoint covers")]
    tolerant = independent_reader.verify_bundle(
        bundle, log_key=session["vkey"], allow_unsigned_tail=True
    )
    assert (tolerant.problems, tolerant.uncovered) == ([], 2)
    reference = verify_bundle(bundle, log_key=session["vkey"])
    assert [(p.code, p.seq) for p in reference.problems] == [("unsigned_tail", 14)]
    assert reference.unsigned == {session["stream"]: 2}
    allowed = verify_bundle(bundle, log_key=session["vkey"], allow_unsigned_tail=True)
    assert (allowed.ok, allowed.unsigned) == (True, {session["stream"]: 2})


def _drop_notes(bundle: Path, count: int) -> None:
    """Remove the ``count`` newest checkpoint notes (and keep the index in step)."""
    notes = sorted((bundle / "checkpoints").glob("*.note"))
    for note in notes[len(notes) - count :]:
        note.unlink()
    index = json.loads((bundle / "bundle.json").read_bytes())
    index["checkpoints"] = len(notes) - count
    (bundle / "bundle.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _append_forged_line(bundle: Path) -> None:
    """A valid ``key.rotated`` written from public keys only (``recipients.txt``): a data key
    of the forger's own, wrapped to every recipient. Everything checks, but nothing signs it."""
    lines = _lines(bundle)
    envelope = json.loads(lines[-1])
    del envelope["body"]
    envelope |= {"seq": len(lines), "event_id": str(uuid6.uuid7()), "kind": "key.rotated"}
    envelope["key_epoch"] = 2
    data_key = record.seal.new_data_key()
    stream = envelope["stream"]
    wrapped = [
        {"recipient": text, "sealed_key": base64.b64encode(r.wrap(data_key, stream, 2)).decode()}
        for text in (bundle / "recipients.txt").read_text().split()
        for r in [record.seal.RecipientKey.from_text(text)]
    ]
    body = {"kind": "key.rotated", "key_epoch": 2, "recipients": wrapped}
    line, _ = entry_line(envelope, body)
    (bundle / "entries.jsonl").write_bytes(b"".join(x + b"\n" for x in [*lines, line]))
    index = json.loads((bundle / "bundle.json").read_bytes())
    index["entries"] = len(lines) + 1
    (bundle / "bundle.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


# --- 5. a stream that continues another: §5.3 Continuation, §12 step 11 --------------------------


def test_continuation_members_are_documented(doc_text: str) -> None:
    table = _member_table(doc_text, "Continuation (the object in `continues`)")
    assert sorted(table) == sorted(Continuation.model_fields)


def test_independent_reader_checks_a_continuation_as_the_reference_does(tmp_path: Path) -> None:
    """§12 step 11 from the document alone, over real bundles: the link holds against the old
    stream's bundle, is reported unchecked without it, and a link to another root is
    ``continuation_broken`` for both readers. (One appliance here: a SQLite file keeps one
    log key; ``test_continuation.py`` has two, on PostgreSQL.)"""
    user, signer = KeyPair.generate(), Signer.generate(LOG_KEY_NAME)
    store = tmp_path / "record.db"
    question = b"carry on"
    with Log(SQLiteStore(store), signer) as log:
        log.open_stream("old", [user.recipient])
        log.append(
            "old",
            TurnStarted(turn=0, input_bytes=question, input_digest=digest(Domain.INPUT, question)),
        )
        link = link_to(log.store, "old")
        spliced = link.model_copy(update={"root": root_digest(log.store.leaf_hashes("old")[:1])})
        log.open_stream("new", [user.recipient], continues=link)
        log.open_stream("spliced", [user.recipient], continues=spliced)
    bundles = {s: tmp_path / s for s in ("old", "new", "spliced")}
    for stream, bundle in bundles.items():
        export_stream(store, stream, bundle)
    pem = user.to_pem()

    report = independent_reader.verify_bundle(
        bundles["new"], private_key_pem=pem, continued=bundles["old"]
    )
    assert report.problems == []
    assert report.continues == {"stream": "old", "size": 2, "checked": True}
    assert report.bodies[0]["continues"] == link.model_dump(mode="json")
    alone = independent_reader.verify_bundle(bundles["new"])
    assert alone.problems == [] and alone.continues == {
        "stream": "old",
        "size": 2,
        "checked": False,
    }
    broken = independent_reader.verify_bundle(bundles["spliced"], continued=bundles["old"])
    assert broken.codes() == {"continuation_broken"}
    assert [seq for _, seq, _ in broken.problems] == [0]
    assert independent_reader.verify_bundle(bundles["old"]).continues is None

    reference = verify_store(store)
    assert {(p.stream, p.code) for p in reference.problems} == {("spliced", "continuation_broken")}
    assert reference.continues == {
        "new": Continues("old", 2, 2, checked=True, holds=True),
        "spliced": Continues("old", 2, 2, checked=True, holds=False),
    }
    assert verify_bundle(bundles["spliced"]).ok  # alone, nothing to check the link against


def print_blocks() -> None:  # the generator: python tests/record/test_format_doc.py
    for name, value in generate().items():
        if "\n" in value:
            sys.stdout.write(f"```example {name}\n{value}```\n")
        else:
            sys.stdout.write(f"{name}: {value}\n")


if __name__ == "__main__":
    print_blocks()
