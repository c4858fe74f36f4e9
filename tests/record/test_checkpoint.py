"""Tests of record.checkpoint against the C2SP spec examples and our own keys.

The spec examples are read at test time from ``shared/vectors/signed-note/examples.json``
(see its README for provenance and for what a verifier must conclude); nothing is copied.
Where a value can be derived independently (key IDs, signed messages), the test derives it
with hashlib / cryptography directly rather than through the module under test.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
import struct
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from record.checkpoint import (
    MAX_SIGNATURES,
    Checkpoint,
    CheckpointError,
    CosignatureSigner,
    InvalidKey,
    KeyFileError,
    MalformedNote,
    Note,
    NoteSignature,
    SignatureInvalid,
    Signer,
    Verifier,
    cosignature_message,
    open_checkpoint,
    open_note,
    parse_checkpoint,
    parse_note,
    sign_checkpoint,
)

FOO = "signed-note/vkey-example-example.com-foo"
QUASIMODO = "signed-note/intro-quasimodo"
SOFA = "tlog-checkpoint/behind-the-sofa"
SOFA_W1 = "tlog-cosignature/behind-the-sofa-with-w1-cosignature"
EM = "\u2014"


@pytest.fixture(scope="module")
def examples(vectors: Path) -> dict[str, dict[str, Any]]:
    path = vectors / "signed-note" / "examples.json"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    data = json.loads(path.read_text(encoding="utf-8"))
    return {ex["name"]: ex for ex in data["examples"]}


@pytest.fixture(scope="module")
def foo(examples: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return examples[FOO]


def _hand_key_id(name: str, alg: int, public: bytes) -> bytes:
    """signed-note key ID, computed here without the module under test."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([alg]) + public).digest()[:4]


def _root(tag: bytes) -> bytes:
    return hashlib.sha256(tag).digest()


# --------------------------------------------------------------------------------------------
# The spec's example.com/foo note: the one example with a published key
# --------------------------------------------------------------------------------------------


def test_foo_note_verifies_and_key_id_is_recomputed(foo: dict[str, Any]) -> None:
    assert foo["expected_valid"] is True
    verifier = Verifier.from_vkey(foo["vkey"])
    name, hex_id, key_b64 = foo["vkey"].split("+", 2)
    raw = base64.b64decode(key_b64)
    assert raw[0] == 0x01 and len(raw) == 33
    assert verifier.name == name == "example.com/foo"
    assert verifier.kind == "ed25519"
    assert verifier.public_key == raw[1:]
    assert _hand_key_id(name, 0x01, raw[1:]) == bytes.fromhex(hex_id) == verifier.key_id
    assert verifier.key_id.hex() == foo["signatures"][0]["key_id_hex"] == "530d903a"
    assert verifier.vkey() == foo["vkey"]

    opened = open_note(foo["note_text"].encode(), [verifier])
    assert opened.verified_by == ("example.com/foo",)
    assert opened.ignored == ()
    assert opened.cosignatures == ()
    assert opened.note.text == foo["signed_text"]
    assert (
        len(opened.note.signatures[0].signature) == foo["signatures"][0]["sig_bytes_after_key_id"]
    )


def test_flipped_byte_in_signed_text_fails(foo: dict[str, Any]) -> None:
    verifier = Verifier.from_vkey(foo["vkey"])
    data = foo["note_text"].encode()
    text_len = len(foo["signed_text"].encode())
    # Every byte of the text but its final newline: flipping the low bit keeps it printable
    # ASCII, so the note stays well formed and only the signature can catch the change.
    for i in range(text_len - 1):
        tampered = bytearray(data)
        tampered[i] ^= 0x01
        with pytest.raises(SignatureInvalid, match=re.escape("example.com/foo")) as info:
            open_note(bytes(tampered), [verifier])
        assert info.value.key_name == "example.com/foo"
    # The final newline flipped becomes a control character: malformed, not merely unsigned.
    tampered = bytearray(data)
    tampered[text_len - 1] ^= 0x01
    with pytest.raises(MalformedNote):
        open_note(bytes(tampered), [verifier])


def test_flipped_byte_in_signature_fails(foo: dict[str, Any]) -> None:
    verifier = Verifier.from_vkey(foo["vkey"])
    text = foo["signed_text"]
    sig_line = foo["note_text"][len(text) + 1 :]
    name, b64 = sig_line[len(EM) + 1 : -1].split(" ")
    raw = base64.b64decode(b64)
    for i in range(4, len(raw)):  # bytes after the key ID: the Ed25519 signature
        bad = bytearray(raw)
        bad[i] ^= 0x80
        note = f"{text}\n{EM} {name} {base64.b64encode(bytes(bad)).decode()}\n".encode()
        with pytest.raises(SignatureInvalid, match="does not verify"):
            open_note(note, [verifier])


def test_wrong_key_id_is_ignored_and_note_rejected(foo: dict[str, Any]) -> None:
    verifier = Verifier.from_vkey(foo["vkey"])
    note = parse_note(foo["note_text"].encode())
    good = note.signatures[0]
    wrong_id = NoteSignature(good.key_name, bytes(b ^ 0xFF for b in good.key_id), good.signature)
    alone = Note(note.text, (wrong_id,)).encode()
    # signed-note §Signatures: unknown (name, ID) is ignored; nothing known verified: reject.
    with pytest.raises(SignatureInvalid, match="no signature from a trusted key"):
        open_note(alone, [verifier])

    # Ignored, not an error: beside the good signature the note opens and lists it.
    other_name = NoteSignature("example.com/bar", good.key_id, good.signature)
    both = Note(note.text, (wrong_id, good, other_name)).encode()
    opened = open_note(both, [verifier])
    assert opened.verified_by == ("example.com/foo",)
    assert opened.ignored == (wrong_id, other_name)


def test_known_key_failure_rejects_even_if_another_verifies() -> None:
    a, b = Signer.generate("example.org/a"), Signer.generate("example.org/b")
    text = "two signers\n"
    sig_b = b.sign(text)
    broken_b = NoteSignature(sig_b.key_name, sig_b.key_id, bytes(64))
    data = Note(text, (a.sign(text), broken_b)).encode()
    with pytest.raises(SignatureInvalid, match=re.escape("example.org/b")) as info:
        open_note(data, [a.verifier(), b.verifier()])
    assert info.value.key_name == "example.org/b"
    # Without b's key, b's line is unknown and ignored.
    assert open_note(data, [a.verifier()]).ignored == (broken_b,)


def test_repeated_known_signature_is_malformed() -> None:
    a = Signer.generate("example.org/a")
    sig = a.sign("x\n")
    data = Note("x\n", (sig, sig)).encode()
    with pytest.raises(MalformedNote, match="line 4: second signature"):
        open_note(data, [a.verifier()])


# --------------------------------------------------------------------------------------------
# The three parse-only examples
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [QUASIMODO, SOFA, SOFA_W1])
def test_parse_only_examples_parse_and_are_rejected(
    name: str, examples: dict[str, dict[str, Any]], foo: dict[str, Any]
) -> None:
    ex = examples[name]
    assert ex["vkey"] is None and ex["expected_valid"] is None
    data = ex["note_text"].encode()
    note = parse_note(data)
    assert note.text == ex["signed_text"]
    assert [(s.key_name, s.key_id.hex(), len(s.signature)) for s in note.signatures] == [
        (s["key_name"], s["key_id_hex"], s["sig_bytes_after_key_id"]) for s in ex["signatures"]
    ]
    assert note.encode() == data  # parsing loses nothing
    # None is signed by a key we know: the README says a verifier MUST reject them.
    with pytest.raises(SignatureInvalid, match="no signature from a trusted key"):
        open_note(data, [Verifier.from_vkey(foo["vkey"])])
    # Same names, our own keys: the key IDs differ, so the lines are ignored and rejected.
    ours = [Signer.generate(s["key_name"]).verifier() for s in ex["signatures"]]
    with pytest.raises(SignatureInvalid):
        open_note(data, ours)


@pytest.mark.parametrize("name", [SOFA, SOFA_W1])
def test_checkpoint_examples_fields(name: str, examples: dict[str, dict[str, Any]]) -> None:
    ex = examples[name]
    cp = parse_checkpoint(parse_note(ex["note_text"].encode()).text)
    assert cp.origin == ex["checkpoint"]["origin"] == "example.com/behind-the-sofa"
    assert cp.size == ex["checkpoint"]["tree_size"] == 20852163
    assert base64.b64encode(cp.root_hash).decode() == ex["checkpoint"]["root_hash_b64"]
    assert ex["checkpoint"]["root_hash_b64"] == "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I="
    assert list(cp.extensions) == ex["checkpoint"]["extension_lines"] == []
    assert cp.body() == ex["signed_text"]


def test_w1_cosignature_layout(examples: dict[str, dict[str, Any]]) -> None:
    ex = examples[SOFA_W1]
    note = parse_note(ex["note_text"].encode())
    log_sig, w1 = note.signatures
    assert (log_sig.key_name, log_sig.key_id.hex()) == ("example.com/behind-the-sofa", "033de0ae")
    assert (w1.key_name, w1.key_id.hex()) == ("witness.example.com/w1", "8d66cf3f")
    assert len(w1.signature) == 72
    (timestamp,) = struct.unpack(">Q", w1.signature[:8])
    assert timestamp == ex["signatures"][1]["cosignature_timestamp"] == 1679315147
    assert (
        cosignature_message(note.text, timestamp).decode()
        == (ex["ed25519_cosigned_message_example"])
    )


def test_quasimodo_splits_at_last_blank_line(examples: dict[str, dict[str, Any]]) -> None:
    ex = examples[QUASIMODO]
    note = parse_note(ex["note_text"].encode())
    assert note.text == ex["signed_text"]
    assert "\n\n" in note.text  # the inner blank line stayed in the text
    assert note.text.endswith("ed \u00e8 subito sera.\n")
    assert [s.key_name for s in note.signatures] == ["quasimodo.example/salvatore"]
    assert note.signatures[0].key_id.hex() == "367ba04b"


# --------------------------------------------------------------------------------------------
# Our own checkpoints and cosignatures
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cp",
    [
        Checkpoint("example.org/affidavit/log", 0, _root(b"empty")),
        Checkpoint("example.org/affidavit/log", 20852163, _root(b"one")),
        Checkpoint("example.org/log", 2**64 - 1, _root(b"big"), ("ext one", "ext:2")),
    ],
)
def test_checkpoint_sign_open_round_trip(cp: Checkpoint) -> None:
    signer = Signer.generate("example.org/affidavit/log")
    data = sign_checkpoint(signer, cp)
    body = cp.body()
    assert data.startswith(body.encode() + b"\n" + EM.encode() + b" example.org/affidavit/log ")
    assert parse_checkpoint(body) == cp

    opened_cp, opened = open_checkpoint(data, [signer.verifier()])
    assert opened_cp == cp
    assert opened.verified_by == ("example.org/affidavit/log",)

    # The signature checks with the raw public key over the exact body (signed-note Ed25519).
    sig = parse_note(data).signatures[0]
    assert sig.key_id == _hand_key_id(signer.name, 0x01, signer.public_key_bytes())
    Ed25519PublicKey.from_public_bytes(signer.public_key_bytes()).verify(
        sig.signature, body.encode()
    )

    # Another key with the same name: different key ID, ignored, rejected.
    impostor = Signer.generate("example.org/affidavit/log")
    with pytest.raises(SignatureInvalid):
        open_checkpoint(data, [impostor.verifier()])
    # A changed tree size no longer verifies.
    forged = data.replace(f"\n{cp.size}\n".encode(), f"\n{cp.size // 2 + 1}\n".encode(), 1)
    assert forged != data
    with pytest.raises(SignatureInvalid, match="does not verify"):
        open_checkpoint(forged, [signer.verifier()])


def test_signer_key_strings_round_trip() -> None:
    signer = Signer.generate("example.org/log")
    again = Signer.from_skey(signer.skey())
    assert again.vkey() == signer.vkey()
    assert again.public_key_bytes() == signer.public_key_bytes()
    assert signer.skey().startswith("PRIVATE+KEY+example.org/log+" + signer.key_id.hex() + "+")
    assert Verifier.from_vkey(signer.vkey()).public_key == signer.public_key_bytes()
    assert signer.skey().rsplit("+", 1)[-1] not in repr(signer)
    note = signer.sign_note("hello\n")
    assert open_note(note, [again.verifier()]).note.text == "hello\n"


def test_cosignature_round_trip_and_unknown_cosigner_ignored() -> None:
    log = Signer.generate("example.org/log")
    witness = CosignatureSigner.generate("witness.example.org/w1")
    cp = Checkpoint("example.org/log", 42, _root(b"tree"))
    signed = parse_note(sign_checkpoint(log, cp))
    ts = 1700000000
    cosig = witness.cosign(signed.text, ts)

    # tlog-cosignature: type 0x04 vkey and key ID; 8-byte timestamp then the signature over
    # "cosignature/v1\ntime <ts>\n" + body, all checked here by hand.
    wv = Verifier.from_vkey(witness.vkey())
    assert wv.kind == "cosignature"
    assert base64.b64decode(witness.vkey().split("+", 2)[2])[0] == 0x04
    assert cosig.key_id == _hand_key_id(witness.name, 0x04, witness.public_key_bytes())
    assert cosig.signature[:8] == ts.to_bytes(8, "big")
    message = f"cosignature/v1\ntime {ts}\n".encode() + cp.body().encode()
    Ed25519PublicKey.from_public_bytes(witness.public_key_bytes()).verify(
        cosig.signature[8:], message
    )

    data = Note(signed.text, (*signed.signatures, cosig)).encode()
    opened_cp, opened = open_checkpoint(data, [log.verifier(), wv])
    assert opened_cp == cp
    assert opened.verified_by == ("example.org/log", "witness.example.org/w1")
    assert [(c.key_name, c.timestamp) for c in opened.cosignatures] == [(witness.name, ts)]
    assert opened.ignored == ()

    # Only the log's key known: the cosignature is ignored, the note still opens.
    _, log_only = open_checkpoint(data, [log.verifier()])
    assert log_only.verified_by == ("example.org/log",)
    assert log_only.ignored == (cosig,)
    assert log_only.cosignatures == ()

    # Only the witness known: a verified cosignature is a known key verifying.
    _, w_only = open_checkpoint(data, [wv])
    assert w_only.verified_by == (witness.name,)

    # An explicit "now" before the cosignature's time rejects it; none is read implicitly.
    with pytest.raises(SignatureInvalid, match="after"):
        open_checkpoint(data, [log.verifier(), wv], now=ts - 1)
    assert open_checkpoint(data, [log.verifier(), wv], now=ts)[1].cosignatures

    # A changed timestamp breaks the cosignature.
    moved = NoteSignature(
        cosig.key_name, cosig.key_id, (ts + 1).to_bytes(8, "big") + cosig.signature[8:]
    )
    with pytest.raises(SignatureInvalid, match=re.escape("witness.example.org/w1")):
        open_note(Note(signed.text, (*signed.signatures, moved)).encode(), [log.verifier(), wv])

    # The same witness key read as a plain Ed25519 (0x01) key has another key ID: ignored.
    as_note_key = Verifier(
        name=witness.name,
        key_id=_hand_key_id(witness.name, 0x01, witness.public_key_bytes()),
        public_key=witness.public_key_bytes(),
        kind="ed25519",
    )
    with pytest.raises(SignatureInvalid, match="no signature from a trusted key"):
        open_note(Note(signed.text, (cosig,)).encode(), [as_note_key])


def test_cosign_refuses_non_checkpoint_text() -> None:
    witness = CosignatureSigner.generate("witness.example.org/w1")
    with pytest.raises(MalformedNote):
        witness.cosign("just a note\n", 1)
    with pytest.raises(ValueError, match="2\\^63"):
        witness.cosign(Checkpoint("o", 1, _root(b"x")).body(), 2**63)


# --------------------------------------------------------------------------------------------
# Key files
# --------------------------------------------------------------------------------------------


def test_key_file_created_0600_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "log.key"
    created = Signer.load_or_create(path, "example.org/log")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text(encoding="ascii") == created.skey() + "\n"
    loaded = Signer.load_or_create(path, "example.org/log")
    assert loaded.vkey() == created.vkey()
    with pytest.raises(KeyFileError, match=re.escape("expected 'example.org/other'")):
        Signer.load_or_create(path, "example.org/other")


def test_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.key"
    path.write_text(Signer.generate("example.org/log").skey() + "\n", encoding="ascii")
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError) as info:
        Signer.load_or_create(path, "example.org/log")
    assert str(path) in str(info.value)
    assert "0o644" in str(info.value)
    os.chmod(path, 0o600)
    assert Signer.load_or_create(path, "example.org/log").name == "example.org/log"


def test_key_file_with_garbage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.key"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, b"not a key\n")
    os.close(fd)
    with pytest.raises(KeyFileError, match=re.escape(str(path))):
        Signer.load_or_create(path, "example.org/log")


# --------------------------------------------------------------------------------------------
# Malformed input
# --------------------------------------------------------------------------------------------

_SIG = base64.b64encode(b"\x01\x02\x03\x04" + bytes(64)).decode()
_LINE = f"{EM} example.org/k {_SIG}\n"


@pytest.mark.parametrize(
    ("data", "line", "words"),
    [
        (b"", None, "note is empty"),
        (
            f"hello\n{_LINE}".encode(),
            None,
            "no blank line separating the text from the signatures",
        ),
        (b"hello\n\n", 3, "no signature lines after the blank line"),
        (
            f"hello\n\n{EM} example.org/k !!!!\n".encode(),
            3,
            "signature of 'example.org/k' is not standard base64: ",
        ),
        (
            f"hello\n\n{EM} example.org/k AAAA=\n".encode(),
            3,
            "signature of 'example.org/k' is not the canonical standard base64 encoding",
        ),
        (f"hello\n\n{_LINE[:-1]}".encode(), 3, "missing final newline"),
        (
            f"hello\n\n{_LINE * (MAX_SIGNATURES + 1)}".encode(),
            103,
            "101 signature lines; at most 100 are accepted",
        ),
        (b"hello \xff\n\n" + _LINE.encode(), 1, "not valid UTF-8 at byte 6"),
        (b"\nb\xff\n\n" + _LINE.encode(), 2, "not valid UTF-8 at byte 2"),
        (f"\nb\tc\n\n{_LINE}".encode(), 2, "control character '\\t' is not allowed"),
        (f"a\nb\tc\n\n{_LINE}".encode(), 2, "control character '\\t' is not allowed"),
        (
            f"hello\n\n- example.org/k {_SIG}\n".encode(),
            3,
            "signature line does not start with an em dash and a space",
        ),
        (
            f"hello\n\n\u2013 example.org/k {_SIG}\n".encode(),
            3,
            "signature line does not start with an em dash and a space",
        ),
        (
            f"hello\n\n{EM} example.org+k {_SIG}\n".encode(),
            3,
            "key name 'example.org+k' contains '+'",
        ),
        (
            f"hello\n\n{EM} example.org/k\u00a0x {_SIG}\n".encode(),
            3,
            "key name 'example.org/k\\xa0x' contains a space character",
        ),
        (
            f"hello\n\n{EM} example.org/k\n".encode(),
            3,
            "signature line for 'example.org/k' has no signature",
        ),
        (
            f"hello\n\n{EM} example.org/k {_SIG} extra\n".encode(),
            3,
            "signature of 'example.org/k' is not standard base64: ",
        ),
        (
            f"hello\n\n{EM} example.org/k AQIDBA==\n".encode(),
            3,
            "signature of 'example.org/k' is 4 bytes; at least 5",
        ),
        (f"hello\n\n{_LINE}{EM}  {_SIG}\n".encode(), 4, "key name is empty"),
    ],
)
def test_malformed_notes(data: bytes, line: int | None, words: str) -> None:
    with pytest.raises(MalformedNote) as info:
        parse_note(data)
    if words.endswith(": "):  # binascii's own words follow
        assert info.value.reason.startswith(words)
    else:
        assert info.value.reason == words
    assert info.value.line == line
    if line is not None:
        assert str(info.value).startswith(f"line {line}: ")
    # open_note parses first: the same bytes are malformed there too, whatever keys we hold.
    with pytest.raises(MalformedNote):
        open_note(data, [Signer.generate("example.org/k").verifier()])


def test_hundred_signatures_are_accepted() -> None:
    note = parse_note(f"hello\n\n{_LINE * MAX_SIGNATURES}".encode())
    assert len(note.signatures) == MAX_SIGNATURES


_ROOT64 = base64.b64encode(bytes(32)).decode()


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (f"o\n1\n{_ROOT64}", 3, "checkpoint text does not end in a newline"),
        (
            "o\n1\n",
            None,
            "checkpoint has 2 lines; origin, tree size and root hash are required",
        ),
        (f"\n1\n{_ROOT64}\n", 1, "origin is empty"),
        (f"o\n01\n{_ROOT64}\n", 2, "tree size '01' has a leading zero"),
        (f"o\n-1\n{_ROOT64}\n", 2, "tree size '-1' is not an ASCII decimal number"),
        (f"o\n+1\n{_ROOT64}\n", 2, "tree size '+1' is not an ASCII decimal number"),
        (f"o\nX\n{_ROOT64}\n", 2, "tree size 'X' is not an ASCII decimal number"),
        (
            f"o\n\u0661\n{_ROOT64}\n",
            2,
            "tree size '\u0661' is not an ASCII decimal number",
        ),  # ARABIC-INDIC DIGIT ONE: not ASCII
        (f"o\n{2**64}\n{_ROOT64}\n", 2, f"tree size {2**64} does not fit in 64 bits"),
        (
            f"o\n1\n{base64.b64encode(bytes(31)).decode()}\n",
            3,
            "root hash is 31 bytes; expected 32",
        ),
        ("o\n1\nAB==\n", 3, "root hash is not the canonical standard base64 encoding"),
        (f"o\n1\n{_ROOT64}\next\n\n", 5, "extension line is empty"),
    ],
)
def test_malformed_checkpoints(text: str, line: int | None, words: str) -> None:
    with pytest.raises(MalformedNote) as info:
        parse_checkpoint(text)
    assert info.value.reason == words
    assert info.value.line == line


def test_open_checkpoint_rejects_a_signed_non_checkpoint() -> None:
    signer = Signer.generate("example.org/log")
    with pytest.raises(MalformedNote, match="line 2"):
        open_checkpoint(signer.sign_note("example.org/log\nnot a size\nx\n"), [signer.verifier()])


@pytest.mark.parametrize(
    ("vkey", "words"),
    [
        ("example.com/foo+530d903b+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k", "does not match"),
        ("example.com/bar+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k", "does not match"),
        ("example.com/foo+530d903a+AukyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k", "type"),
        ("example.com/foo+530d903+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k", "8 hexadecimal"),
        ("example.com/foo", "vkey must be"),
    ],
)
def test_bad_vkeys(vkey: str, words: str) -> None:
    with pytest.raises(InvalidKey, match=words):
        Verifier.from_vkey(vkey)


def test_bad_signing_inputs() -> None:
    signer = Signer.generate("example.org/log")
    for text in ["", "no final newline", "tab\there\n"]:
        with pytest.raises(ValueError):
            signer.sign_note(text)
    with pytest.raises(InvalidKey):
        Signer.generate("has space")
    with pytest.raises(InvalidKey, match="type 0x01"):
        Signer.from_skey(CosignatureSigner.generate("w").skey())
    with pytest.raises(ValueError, match="root hash"):
        Checkpoint("o", 1, b"short")
    with pytest.raises(ValueError, match="origin"):
        Checkpoint("two\nlines", 1, _root(b"x"))
    with pytest.raises(ValueError, match="share name"):
        open_note(signer.sign_note("x\n"), [signer.verifier(), signer.verifier()])
    assert issubclass(MalformedNote, CheckpointError)
    assert issubclass(SignatureInvalid, CheckpointError)


# --------------------------------------------------------------------------------------------
# Exact refusals: each error names what was wrong, in words a reader can act on
# --------------------------------------------------------------------------------------------


def test_errors_keep_their_reason_and_line() -> None:
    with pytest.raises(MalformedNote) as malformed:
        parse_note(b"")
    assert str(malformed.value) == "note is empty"
    assert (malformed.value.reason, malformed.value.line) == ("note is empty", None)
    with pytest.raises(MalformedNote) as lined:
        parse_note(b"hello\n\n")
    assert lined.value.reason == "no signature lines after the blank line"
    assert str(lined.value) == "line 3: no signature lines after the blank line"
    signer = Signer.generate("example.org/log")
    with pytest.raises(SignatureInvalid) as invalid:
        open_note(signer.sign_note("x\n"), [Signer.generate("example.org/other").verifier()])
    assert invalid.value.reason == str(invalid.value)
    assert invalid.value.reason.startswith("no signature from a trusted key")


def test_parse_checkpoint_refuses_control_characters_by_line() -> None:
    with pytest.raises(MalformedNote) as info:
        parse_checkpoint(f"o\n1\t\n{_ROOT64}\n")
    assert str(info.value) == "line 2: control character '\\t' is not allowed"
    assert info.value.line == 2


def test_cosignature_timestamps_span_zero_to_2_63_minus_1() -> None:
    text = Checkpoint("example.org/log", 1, _root(b"x")).body()
    witness = CosignatureSigner.generate("example.org/w")
    signer = Signer.generate("example.org/log")
    for timestamp in (0, 2**63 - 1):
        assert cosignature_message(text, timestamp).startswith(
            f"cosignature/v1\ntime {timestamp}\n".encode()
        )
        note = Note(text, (signer.sign(text), witness.cosign(text, timestamp))).encode()
        opened = open_note(note, [signer.verifier(), witness.verifier()])
        assert [c.timestamp for c in opened.cosignatures] == [timestamp]
    for timestamp in (-1, 2**63):
        with pytest.raises(ValueError, match=f"timestamp {timestamp} is outside 0..2"):
            cosignature_message(text, timestamp)


def test_key_pair_repr_names_the_key_never_the_seed() -> None:
    signer = Signer.generate("example.org/log")
    assert repr(signer) == f"Signer(name='example.org/log', key_id='{signer.key_id.hex()}')"
    # PRIVATE+KEY+<name>+<key id>+<base64 seed>: the seed's base64 may itself hold a "+"
    seed = signer.skey().split("+", 4)[4]
    assert seed and seed not in repr(signer)


@pytest.mark.parametrize(
    ("skey", "message"),
    [
        ("example.org/log+01020304+AQ==", "signer key must start with PRIVATE+KEY+"),
        (
            "PRIVATE+KEY+example.org/log+01020304",
            "signer key must be PRIVATE+KEY+<name>+<hex key ID>+<base64 key>",
        ),
        (
            "PRIVATE+KEY+example.org/log+01020304+AB==",
            "signer key 'example.org/log': key is not the canonical standard base64 encoding",
        ),
    ],
)
def test_bad_signer_keys(skey: str, message: str) -> None:
    with pytest.raises(InvalidKey) as info:
        Signer.from_skey(skey)
    assert str(info.value) == message


def test_signer_key_with_a_wrong_key_id() -> None:
    good = Signer.generate("example.org/log").skey()
    name, kid, key = good.removeprefix("PRIVATE+KEY+").split("+", 2)
    wrong = f"{int(kid, 16) ^ 1:08x}"
    with pytest.raises(InvalidKey) as info:
        Signer.from_skey(f"PRIVATE+KEY+{name}+{wrong}+{key}")
    assert str(info.value) == f"signer key 'example.org/log': key ID {wrong} does not match the key"


def test_key_file_with_a_utf8_key_name_round_trips(tmp_path: Path) -> None:
    """signed-note key names are UTF-8: such a key is stored and read back, not refused."""
    path = tmp_path / "log.key"
    created = Signer.load_or_create(path, "bücher.example/log")
    assert path.read_bytes() == (created.skey() + "\n").encode("utf-8")
    assert Signer.load_or_create(path, "bücher.example/log").vkey() == created.vkey()


def test_key_file_that_appears_while_creating_is_the_one_used(tmp_path: Path) -> None:
    """Another process may create the file between the check and the link: load theirs.

    A dangling symlink at the key path looks absent to the check, and makes the link fail
    as a file created meanwhile would. Pointed at our own temporary file, it loads back.
    """
    path = tmp_path / "log.key"
    path.symlink_to(f".{path.name}.{os.getpid()}.tmp")
    loaded = Signer.load_or_create(path, "example.org/log")
    assert loaded.name == "example.org/log"
    gone = tmp_path / "gone.key"
    gone.symlink_to(tmp_path / "nowhere")
    with pytest.raises(KeyFileError) as info:
        Signer.load_or_create(gone, "example.org/log")
    assert str(info.value).startswith(f"cannot open signing key file {gone}: [Errno 2]")


def test_key_file_refusals_name_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "folder.key"
    folder.mkdir()
    with pytest.raises(KeyFileError) as info:
        Signer.load_or_create(folder, "example.org/log")
    assert str(info.value) == f"signing key file {folder} is not a regular file"

    shared = tmp_path / "shared.key"
    shared.write_text(Signer.generate("example.org/log").skey() + "\n", encoding="ascii")
    os.chmod(shared, 0o640)
    with pytest.raises(KeyFileError) as info:
        Signer.load_or_create(shared, "example.org/log")
    assert str(info.value) == (
        f"signing key file {shared} has mode 0o640; group and others must have "
        "no access (chmod 600)"
    )

    binary = tmp_path / "binary.key"
    fd = os.open(binary, os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, b"PRIVATE+KEY+\xff\n")
    os.close(fd)
    with pytest.raises(KeyFileError) as info:
        Signer.load_or_create(binary, "example.org/log")
    assert str(info.value).startswith(f"cannot read signing key file {binary}: 'utf-8' codec")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "note text is empty"),
        ("no final newline", "note text does not end in a newline"),
        ("fine\ntab\there\n", "line 2 contains control character '\\t'"),
    ],
)
def test_note_text_refusals(text: str, message: str) -> None:
    """Signing and encoding refuse text that is not a note's, and say why."""
    signer = Signer.generate("example.org/log")
    with pytest.raises(ValueError) as signing:
        signer.sign(text)
    assert str(signing.value) == message
    placeholder = NoteSignature("example.org/log", signer.key_id, bytes(64))
    with pytest.raises(ValueError) as encoding:
        Note(text, (placeholder,)).encode()
    assert str(encoding.value) == message


def test_note_encode_counts_signatures() -> None:
    sig = NoteSignature("example.org/log", b"\x01\x02\x03\x04", bytes(64))
    with pytest.raises(ValueError) as none:
        Note("x\n", ()).encode()
    assert str(none.value) == "a note needs at least one signature"
    assert len(parse_note(Note("x\n", (sig,) * MAX_SIGNATURES).encode()).signatures) == 100
    with pytest.raises(ValueError) as many:
        Note("x\n", (sig,) * (MAX_SIGNATURES + 1)).encode()
    assert str(many.value) == "a note holds at most 100 signatures"


def test_short_signature_from_a_trusted_key_is_named() -> None:
    signer = Signer.generate("example.org/log")
    short = NoteSignature("example.org/log", signer.key_id, bytes(4))
    with pytest.raises(SignatureInvalid) as info:
        open_note(Note("x\n", (short,)).encode(), [signer.verifier()])
    assert str(info.value) == (
        f"signature from example.org/log ({signer.key_id.hex()}) is 4 bytes; Ed25519 uses 64"
    )
    assert info.value.key_name == "example.org/log"


def test_key_name_refusal_is_named() -> None:
    with pytest.raises(InvalidKey) as info:
        Signer.generate("has space")
    assert str(info.value) == "key name 'has space' contains a space character"


def test_checkpoint_fields_are_checked_when_built() -> None:
    root_hash = _root(b"x")
    cp = Checkpoint("o", 1, root_hash, ["ext"])  # type: ignore[arg-type]
    assert cp.extensions == ("ext",)
    assert cp.body() == f"o\n1\n{base64.b64encode(root_hash).decode()}\next\n"
    for size in (-1, 2**64, True):
        with pytest.raises(ValueError) as info:
            Checkpoint("o", size, root_hash)
        assert str(info.value) == f"tree size {size!r} is not a uint64"
    assert Checkpoint("o", 2**64 - 1, root_hash).size == 2**64 - 1
    for ext in ("", "two\nlines", "tab\there"):
        with pytest.raises(ValueError) as info:
            Checkpoint("o", 1, root_hash, (ext,))
        assert str(info.value) == f"extension line {ext!r} must be one non-empty line"


def test_note_signature_fields_are_checked() -> None:
    kid = b"\x01\x02\x03\x04"
    for args, message in [
        (("has space", kid, b"s"), "key name 'has space' contains a space character"),
        (("example.org/k", kid[:3], b"s"), "key ID must be 4 bytes, got 3"),
        (("example.org/k", kid, b""), "signature is empty"),
    ]:
        with pytest.raises(ValueError) as info:
            NoteSignature(*args)
        assert str(info.value) == message


def test_signature_line_lengths() -> None:
    """Four bytes of key ID and a one-byte signature is the shortest line; a bare name is none."""
    one = base64.b64encode(b"\x01\x02\x03\x04\x05").decode()
    note = parse_note(f"hello\n\n{EM} example.org/k {one}\n".encode())
    assert note.signatures[0].signature == b"\x05"
    with pytest.raises(MalformedNote) as info:
        parse_note(f"hello\n\n{EM} example.org/k \n".encode())
    assert info.value.reason == "signature line for 'example.org/k' has no signature"


def test_verifier_refusals_are_named() -> None:
    signer = Signer.generate("example.org/log")
    public = signer.public_key_bytes()
    with pytest.raises(InvalidKey) as info:
        Verifier("has space", signer.key_id, public, "ed25519")
    assert str(info.value) == "key name 'has space' contains a space character"
    with pytest.raises(InvalidKey) as info:
        Verifier("example.org/log", signer.key_id, public[:31], "ed25519")
    assert str(info.value) == "example.org/log: an Ed25519 public key is 32 bytes"
    _, kid, key = signer.vkey().split("+", 2)
    for vkey, message in [
        ("example.com/foo", "vkey must be <name>+<hex key ID>+<base64 key>"),
        (f"has space+{kid}+{key}", "key name 'has space' contains a space character"),
        (
            f"example.org/log+{kid}+AB==",
            "vkey 'example.org/log': key is not the canonical standard base64 encoding",
        ),
    ]:
        with pytest.raises(InvalidKey) as info:
            Verifier.from_vkey(vkey)
        assert str(info.value) == message


def test_cosignature_refusals_name_the_witness() -> None:
    text = Checkpoint("example.org/log", 1, _root(b"x")).body()
    signer = Signer.generate("example.org/log")
    witness = CosignatureSigner.generate("example.org/w")
    label = f"example.org/w ({witness.key_id.hex()})"
    good = witness.cosign(text, 10)
    for signature, message in [
        (good.signature[:71], f"cosignature from {label} is 71 bytes; expected 72"),
        (
            struct.pack(">Q", 2**63) + good.signature[8:],
            f"cosignature from {label} has timestamp {2**63} > 2^63-1",
        ),
    ]:
        bad = NoteSignature("example.org/w", witness.key_id, signature)
        note = Note(text, (signer.sign(text), bad)).encode()
        with pytest.raises(SignatureInvalid) as info:
            open_note(note, [signer.verifier(), witness.verifier()])
        assert (str(info.value), info.value.key_name) == (message, "example.org/w")
    note = Note(text, (signer.sign(text), good)).encode()
    with pytest.raises(SignatureInvalid) as info:
        open_note(note, [signer.verifier(), witness.verifier()], now=9)
    assert str(info.value) == "cosignature from example.org/w is dated 10, after 9"
    assert info.value.key_name == "example.org/w"


def test_untrusted_note_names_every_signer() -> None:
    one, two = Signer.generate("example.org/one"), Signer.generate("example.org/two")
    note = Note("x\n", (one.sign("x\n"), two.sign("x\n"))).encode()
    with pytest.raises(SignatureInvalid) as info:
        open_note(note, [Signer.generate("example.org/three").verifier()])
    assert str(info.value) == (
        "no signature from a trusted key; note is signed by "
        f"example.org/one ({one.key_id.hex()}), example.org/two ({two.key_id.hex()})"
    )


def test_note_whose_text_is_one_empty_line() -> None:
    """The last blank line may start the note: the text is then one newline."""
    note = parse_note(f"\n\n{_LINE}".encode())
    assert note.text == "\n"
    assert [s.key_name for s in note.signatures] == ["example.org/k"]


def test_key_ids_are_hexadecimal_in_either_case() -> None:
    signer = Signer.generate("example.org/log")
    _, kid, key = signer.vkey().split("+", 2)
    upper = Verifier.from_vkey(f"example.org/log+{kid.upper()}+{key}")
    assert upper.key_id == signer.key_id
    with pytest.raises(InvalidKey) as info:
        Verifier.from_vkey(f"example.org/log+XXXXXXXX+{key}")
    assert str(info.value) == "key ID 'XXXXXXXX' is not 8 hexadecimal digits"
