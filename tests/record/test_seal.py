"""Sealing: only the stream's recipients read its bodies, and each of them reads all of them.

Everything runs through a real ``Log`` on a real SQLite file with real X25519/HPKE and
ChaCha20-Poly1305; the stored lines are read back with the ``sqlite3`` module.

- three recipients (user, auditor, appliance) each open every body of every sealed kind,
  before and after ``Log.rotate_key`` and across a writer restart;
- a key that is not a recipient gets ``CannotOpen``; a recipient dropped at a rotation
  reads the old epoch only;
- a sealed body moved to another entry (same kind, same epoch) does not open: the envelope
  is the associated data, every field of it;
- two streams get different data keys, and a wrapped key is bound to its stream and epoch;
- ``affidavit keys new --out FILE`` (a real subprocess) writes a 0600 private key, prints
  the base64 of its 32-byte X25519 public key, and refuses to overwrite (exit 2);
- the stored bytes (database and WAL) hold no plaintext of a body.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hpke, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from record.digest import Domain, canonical_json, digest
from record.errors import CannotOpen, StoreMissing
from record.log import Log
from record.reader import StreamKeys
from record.schema import (
    Entry,
    FetchRequest,
    FetchResponse,
    KeyRotated,
    ModelRequest,
    ModelResponse,
    PinsSet,
    Provider,
    StreamOpened,
    Strict,
    ToolCall,
    ToolResult,
    TurnEnded,
    TurnStarted,
    parse_body,
    parse_entry,
)
from record.seal import (
    NONCE_SIZE,
    TAG_SIZE,
    KeyPair,
    RecipientKey,
    open_sealed,
    seal,
    seal_buffer,
)
from tests.record.raw_store import stored_lines

STREAM = "seal-test"
SECRET = "zanzibar-marmalade-7731"  # appears in bodies only; never in stored bytes


# -- helpers -----------------------------------------------------------------------------------


def jcs_line(value: object) -> bytes:
    """A line written the way the writer writes one (RFC 8785 member order, no whitespace).

    For these ASCII-keyed values without floats this *is* RFC 8785; a float stays as Python
    writes it (``1.0``), which is how a test puts a wrong JSON type into an otherwise
    canonical line.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def entries_of(store: Path, stream: str) -> list[Entry]:
    return [parse_entry(line) for line in stored_lines(store, stream)]


def every_sealed_kind(tag: str) -> list[Strict]:
    """One body of each sealed kind, with ``SECRET`` in a plain string field of each."""
    raw = canonical_json({"model": "m", "q": tag})
    reply = f"data: {SECRET} {tag}\n\n".encode()
    args = canonical_json({"query": tag})
    page = b"\x00\xff<html>" + tag.encode()
    return [
        TurnStarted(
            turn=0, input_bytes=tag.encode(), input_digest=digest(Domain.INPUT, tag.encode())
        ),
        ModelRequest(
            content_key=digest(Domain.REQUEST, raw),
            input_digest=digest(Domain.INPUT, raw),
            prompt_digest=digest(Domain.PROMPT, raw),
            request_bytes=raw,
            input_bytes=raw,
            prompt_bytes=raw,
            provider=Provider(name="p", endpoint="https://p.example/v1"),
            model_id=f"model-{SECRET}",
            params={"seed": 1},
        ),
        ModelResponse(
            request_seq=1,
            outcome="COMMITTED",
            response_bytes=reply,
            response_digest=digest(Domain.RESPONSE, reply),
            fingerprint=SECRET,
        ),
        ToolCall(
            reply_seq=2,
            call_id=f"call-{tag}",
            server="builtin",
            tool=SECRET,
            arguments=args,
            arguments_digest=digest(Domain.TOOL_ARGUMENTS, args),
            idempotent=True,
        ),
        ToolResult(
            call_seq=3,
            outcome="COMMITTED",
            result_bytes=page,
            result_digest=digest(Domain.TOOL_RESULT, page),
        ),
        FetchRequest(
            method="GET",
            url=f"https://example.org/{SECRET}",
            request_bytes=b"GET / HTTP/1.1\r\n\r\n",
            content_key=digest(Domain.FETCH_REQUEST, b"GET / HTTP/1.1\r\n\r\n"),
        ),
        FetchResponse(
            request_seq=5,
            outcome="FAILED",
            error_bytes=b"timeout",
            error_digest=digest(Domain.ERROR, b"timeout"),
        ),
        PinsSet(pins={"note": SECRET, "tag": tag}),
        TurnEnded(turn=0, outcome="STOPPED"),
    ]


class Parties:
    def __init__(self) -> None:
        self.user = KeyPair.generate()
        self.auditor = KeyPair.generate()
        self.appliance = KeyPair.generate()
        self.stranger = KeyPair.generate()

    @property
    def recipients(self) -> list[RecipientKey]:
        return [self.user.recipient, self.auditor.recipient, self.appliance.recipient]

    @property
    def readers(self) -> dict[str, KeyPair]:
        return {"user": self.user, "auditor": self.auditor, "appliance": self.appliance}


@pytest.fixture
def parties() -> Parties:
    return Parties()


@pytest.fixture
def log(store: Path, parties: Parties) -> Iterator[Log]:
    with Log.open(store, appliance_key=parties.appliance) as opened:
        yield opened


# -- every recipient opens every body ----------------------------------------------------------


def test_every_recipient_opens_every_body_across_rotation_and_restart(
    store: Path, log: Log, parties: Parties
) -> None:
    log.open_stream(STREAM, parties.recipients)
    written: list[Strict] = []
    for body in every_sealed_kind("epoch0"):
        log.append(STREAM, body)
        written.append(body)
    rotated = log.rotate_key(STREAM, parties.recipients)
    for body in every_sealed_kind("epoch1"):
        log.append(STREAM, body)
        written.append(body)
    log.close()
    # A restarted writer recovers the epoch-1 key with the appliance key and keeps going.
    with Log.open(store, appliance_key=parties.appliance) as again:
        for body in every_sealed_kind("after-restart"):
            again.append(STREAM, body)
            written.append(body)

    entries = entries_of(store, STREAM)
    sealed = [e for e in entries if isinstance(e.body, str)]
    assert [e.key_epoch for e in sealed] == [0] * 9 + [1] * 18
    assert entries[rotated.seq].kind == "key.rotated"
    assert len(sealed) == len(written)

    for who, key in parties.readers.items():
        keys = StreamKeys.collect(STREAM, entries, key)
        assert set(keys.keys) == {0, 1}, who
        opened = [keys.open(e) for e in sealed]
        assert opened == written, who

    # every recipient unwraps the same data key of each epoch, and the epochs' keys differ
    data_keys = {
        who: StreamKeys.collect(STREAM, entries, k).keys for who, k in parties.readers.items()
    }
    assert data_keys["user"] == data_keys["auditor"] == data_keys["appliance"]
    assert data_keys["user"][0] != data_keys["user"][1]
    assert {len(k) for k in data_keys["user"].values()} == {32}


def test_opening_and_rotation_entries_carry_one_wrapped_key_per_recipient(
    store: Path, log: Log, parties: Parties
) -> None:
    log.open_stream(STREAM, parties.recipients)
    log.rotate_key(STREAM, [parties.user.recipient, parties.appliance.recipient])
    log.close()
    opened, rotated = entries_of(store, STREAM)
    assert opened.kind == "stream.opened" and isinstance(opened.body, dict)
    assert rotated.kind == "key.rotated" and isinstance(rotated.body, dict)
    first = parse_body(opened.kind, opened.body)
    second = parse_body(rotated.kind, rotated.body)
    assert isinstance(first, StreamOpened) and isinstance(second, KeyRotated)
    assert [w.recipient for w in first.recipients] == [r.text() for r in parties.recipients]
    assert [w.recipient for w in second.recipients] == [
        parties.user.recipient.text(),
        parties.appliance.recipient.text(),
    ]
    assert (first.key_epoch, second.key_epoch, rotated.key_epoch) == (0, 1, 1)
    # each wrapped key is HPKE output (enc 32 + key 32 + tag 16), different per recipient
    wrapped = [w.sealed_key for w in first.recipients]
    assert {len(w) for w in wrapped} == {80}
    assert len(set(wrapped)) == 3


def test_a_key_that_is_not_a_recipient_opens_nothing(
    store: Path, log: Log, parties: Parties
) -> None:
    log.open_stream(STREAM, parties.recipients)
    for body in every_sealed_kind("x"):
        log.append(STREAM, body)
    log.rotate_key(STREAM, parties.recipients)
    log.append(STREAM, every_sealed_kind("y")[0])
    log.close()
    entries = entries_of(store, STREAM)
    with pytest.raises(CannotOpen):
        StreamKeys.collect(STREAM, entries, parties.stranger)
    # nor can it unwrap any recipient's wrapped key directly
    first = parse_body("stream.opened", entries[0].body)  # type: ignore[arg-type]
    assert isinstance(first, StreamOpened)
    for wrapped in first.recipients:
        with pytest.raises(CannotOpen):
            parties.stranger.unwrap(wrapped.sealed_key, STREAM, 0)
    # a recipient's data key, guessed at by a stranger, is not a thing it can forge either:
    stranger_keys = StreamKeys(STREAM, {0: os.urandom(32), 1: os.urandom(32)})
    for entry in entries:
        if isinstance(entry.body, str):
            with pytest.raises(CannotOpen):
                stranger_keys.open(entry)


def test_recipient_dropped_at_rotation_reads_only_the_old_epoch(
    store: Path, log: Log, parties: Parties
) -> None:
    log.open_stream(STREAM, parties.recipients)
    old = log.append(STREAM, every_sealed_kind("old")[0])
    log.rotate_key(STREAM, [parties.user.recipient, parties.appliance.recipient])
    new = log.append(STREAM, every_sealed_kind("new")[0])
    log.close()
    entries = entries_of(store, STREAM)
    auditor = StreamKeys.collect(STREAM, entries, parties.auditor)
    assert set(auditor.keys) == {0}
    assert isinstance(auditor.open(entries[old.seq]), TurnStarted)
    with pytest.raises(CannotOpen):
        auditor.open(entries[new.seq])
    user = StreamKeys.collect(STREAM, entries, parties.user)
    assert isinstance(user.open(entries[new.seq]), TurnStarted)


# -- the envelope is the associated data -------------------------------------------------------


def _with(entry: Entry, **changes: object) -> Entry:
    line = json.loads(entry.model_dump_json())
    line.update(changes)
    return parse_entry(jcs_line(line))


def test_a_body_moved_to_another_entry_does_not_open(
    store: Path, log: Log, parties: Parties
) -> None:
    log.open_stream(STREAM, parties.recipients)
    a = log.append(STREAM, every_sealed_kind("first")[0])
    b = log.append(STREAM, every_sealed_kind("second")[0])
    log.close()
    entries = entries_of(store, STREAM)
    ea, eb = entries[a.seq], entries[b.seq]
    assert (ea.kind, ea.key_epoch) == (eb.kind, eb.key_epoch)  # only seq, id and time differ
    keys = StreamKeys.collect(STREAM, entries, parties.user)
    assert keys.open(ea) != keys.open(eb)  # both open where they were written

    swapped_a, swapped_b = _with(ea, body=eb.body), _with(eb, body=ea.body)
    for moved in (swapped_a, swapped_b):
        with pytest.raises(CannotOpen):
            keys.open(moved)


@pytest.mark.parametrize(
    "change",
    [
        {"seq": 99},
        {"occurred_at": "2020-01-01T00:00:00.000000Z"},
        {"event_id": "01890a5d-ac96-774b-bcce-b302099a8057"},
        {"stream": "another-stream"},
        {"kind": "turn.ended"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_every_envelope_field_is_bound_to_the_body(
    store: Path, log: Log, parties: Parties, change: dict[str, object]
) -> None:
    log.open_stream(STREAM, parties.recipients)
    at = log.append(STREAM, every_sealed_kind("x")[0])
    log.close()
    entries = entries_of(store, STREAM)
    keys = StreamKeys.collect(STREAM, entries, parties.user)
    assert isinstance(keys.open(entries[at.seq]), TurnStarted)
    with pytest.raises(CannotOpen):
        keys.open(_with(entries[at.seq], **change))


def test_a_tampered_ciphertext_does_not_open(store: Path, log: Log, parties: Parties) -> None:
    log.open_stream(STREAM, parties.recipients)
    at = log.append(STREAM, every_sealed_kind("x")[0])
    log.close()
    entries = entries_of(store, STREAM)
    keys = StreamKeys.collect(STREAM, entries, parties.user)
    sealed = bytearray(base64.b64decode(entries[at.seq].body))  # type: ignore[arg-type]
    for i in (0, 12, len(sealed) - 1):  # nonce, ciphertext, tag
        flipped = bytearray(sealed)
        flipped[i] ^= 0x01
        with pytest.raises(CannotOpen):
            keys.open(_with(entries[at.seq], body=base64.b64encode(bytes(flipped)).decode()))


# -- data keys per stream ----------------------------------------------------------------------


def test_two_streams_get_different_data_keys(store: Path, log: Log, parties: Parties) -> None:
    log.open_stream("stream-a", parties.recipients)
    log.open_stream("stream-b", parties.recipients)
    log.close()
    a, b = entries_of(store, "stream-a"), entries_of(store, "stream-b")
    key_a = StreamKeys.collect("stream-a", a, parties.user).keys[0]
    key_b = StreamKeys.collect("stream-b", b, parties.user).keys[0]
    assert key_a != key_b
    # a wrapped key is bound to its stream and epoch (HPKE info): it opens nowhere else
    opened = parse_body("stream.opened", a[0].body)  # type: ignore[arg-type]
    assert isinstance(opened, StreamOpened)
    wrapped = opened.recipients[0].sealed_key
    assert parties.user.unwrap(wrapped, "stream-a", 0) == key_a
    with pytest.raises(CannotOpen):
        parties.user.unwrap(wrapped, "stream-b", 0)
    with pytest.raises(CannotOpen):
        parties.user.unwrap(wrapped, "stream-a", 1)


# -- nothing readable at rest ------------------------------------------------------------------


def test_stored_bytes_hold_no_plaintext(store: Path, log: Log, parties: Parties) -> None:
    log.open_stream(STREAM, parties.recipients)
    bodies = every_sealed_kind("needle")
    for body in bodies:
        log.append(STREAM, body)
    log.close()
    at_rest = b"".join(
        p.read_bytes() for p in sorted(store.parent.iterdir()) if p.name.startswith(store.name)
    )
    assert STREAM.encode() in at_rest  # the envelope is clear: the search does find things
    assert SECRET.encode() not in at_rest
    reply = next(b for b in bodies if isinstance(b, ModelResponse))
    assert reply.response_bytes is not None
    assert base64.b64encode(reply.response_bytes) not in at_rest  # as it sits in the plaintext
    assert canonical_json(reply.model_dump(mode="json"))[:40] not in at_rest
    # ... while a recipient does read the secret back
    entries = entries_of(store, STREAM)
    keys = StreamKeys.collect(STREAM, entries, parties.auditor)
    assert any(SECRET in json.dumps(keys.open(e).model_dump(mode="json")) for e in entries)


# -- affidavit keys new ------------------------------------------------------------------------


def affidavit(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *map(str, args)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=cwd,
        timeout=120,
    )


def test_keys_new_writes_a_private_key_0600_and_prints_its_public_key(tmp_path: Path) -> None:
    out = tmp_path / "me.key"
    result = affidavit("keys", "new", "--out", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600

    printed = result.stdout.strip()
    assert result.stdout == printed + "\n"
    raw = base64.b64decode(printed, validate=True)
    assert len(raw) == 32
    X25519PublicKey.from_public_bytes(raw)
    public = RecipientKey.from_text(printed)

    pair = KeyPair.read(out)
    assert pair.recipient.text() == printed == public.text()
    assert b"PRIVATE KEY" in out.read_bytes()

    # and the pair works: a stream sealed to the printed key opens with the written file
    with Log.open(tmp_path / "record.db", appliance_key=pair) as log:
        log.open_stream(STREAM, [public])
        log.append(STREAM, every_sealed_kind("k")[0])
    entries = entries_of(tmp_path / "record.db", STREAM)
    keys = StreamKeys.collect(STREAM, entries, KeyPair.read(out))
    assert isinstance(keys.open(entries[1]), TurnStarted)


def test_keys_new_twice_gives_two_different_keys(tmp_path: Path) -> None:
    one = affidavit("keys", "new", "--out", tmp_path / "a.key", cwd=tmp_path)
    two = affidavit("keys", "new", "--out", tmp_path / "b.key", cwd=tmp_path)
    assert one.returncode == two.returncode == 0
    assert one.stdout != two.stdout


def test_keys_new_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "me.key"
    assert affidavit("keys", "new", "--out", out, cwd=tmp_path).returncode == 0
    before = out.read_bytes()
    again = affidavit("keys", "new", "--out", out, cwd=tmp_path)
    assert again.returncode == 2
    assert str(out) in again.stderr
    assert again.stdout == ""
    assert out.read_bytes() == before
    assert stat.S_IMODE(out.stat().st_mode) == 0o600

    other = tmp_path / "not-a-key.txt"
    other.write_bytes(b"precious")
    clobber = affidavit("keys", "new", "--out", other, cwd=tmp_path)
    assert clobber.returncode == 2
    assert other.read_bytes() == b"precious"


def test_keys_new_without_out_is_a_usage_error(tmp_path: Path) -> None:
    result = affidavit("keys", "new", cwd=tmp_path)
    assert result.returncode == 2
    assert "--out" in result.stderr
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# The recipe piece by piece: AEAD layout, HPKE info, key text and key files, and each refusal


def test_sealed_body_layout_and_its_refusals() -> None:
    key, ad = os.urandom(32), b"envelope"
    for sealer in (seal, seal_buffer):
        sealed = bytes(sealer(key, b"body", ad))
        assert len(sealed) == NONCE_SIZE + len(b"body") + TAG_SIZE
        nonce = sealed[:NONCE_SIZE]
        # the layout is the library's own: nonce || ChaCha20-Poly1305(key, nonce, body, ad)
        assert ChaCha20Poly1305(key).decrypt(nonce, sealed[NONCE_SIZE:], ad) == b"body"
        assert open_sealed(key, sealed, ad) == b"body"
        assert bytes(sealer(key, b"body", ad))[:NONCE_SIZE] != nonce  # a fresh nonce each time
        empty = bytes(sealer(key, b"", ad))  # the shortest body there is: nonce and tag only
        assert len(empty) == NONCE_SIZE + TAG_SIZE and open_sealed(key, empty, ad) == b""
        with pytest.raises(ValueError) as info:
            sealer(key[:31], b"body", ad)
        assert str(info.value) == "data key must be 32 bytes, got 31"
    with pytest.raises(ValueError) as info:
        open_sealed(key + b"x", empty, ad)
    assert str(info.value) == "data key must be 32 bytes, got 33"
    with pytest.raises(CannotOpen) as short:
        open_sealed(key, empty[:-1], ad)
    assert str(short.value) == "sealed body is too short"
    for wrong_key, wrong_ad in [(os.urandom(32), ad), (key, b"another envelope")]:
        with pytest.raises(CannotOpen) as info_open:
            open_sealed(wrong_key, empty, wrong_ad)
        assert str(info_open.value) == "body does not open with this stream key"


def test_data_key_is_wrapped_with_hpke_to_stream_and_epoch() -> None:
    """RFC 9180 base mode, X25519 / HKDF-SHA256 / ChaCha20-Poly1305, info names stream and epoch."""
    reader = KeyPair.generate()
    data_key = os.urandom(32)
    wrapped = reader.recipient.wrap(data_key, "s1", 3)
    assert len(wrapped) == 32 + 32 + 16
    suite = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
    info = b"affidavit/data-key/v1\x00s1\x003"
    assert suite.decrypt(wrapped, reader.private, info=info) == data_key
    assert reader.unwrap(wrapped, "s1", 3) == data_key
    for stream, epoch in [("s2", 3), ("s1", 4)]:
        with pytest.raises(CannotOpen) as info_open:
            reader.unwrap(wrapped, stream, epoch)
        assert str(info_open.value) == "data key does not open with this private key"
    with pytest.raises(CannotOpen) as info_open:
        KeyPair.generate().unwrap(wrapped, "s1", 3)
    assert str(info_open.value) == "data key does not open with this private key"
    with pytest.raises(CannotOpen) as length:
        reader.unwrap(wrapped[:-1], "s1", 3)
    assert str(length.value) == "wrapped data key has the wrong length"
    with pytest.raises(ValueError) as info_key:
        reader.recipient.wrap(data_key[:16], "s1", 3)
    assert str(info_key.value) == "data key must be 32 bytes, got 16"


def test_recipient_key_text() -> None:
    reader = KeyPair.generate()
    text = reader.recipient.text()
    raw = reader.private.public_key().public_bytes_raw()
    assert text == base64.b64encode(raw).decode("ascii")
    assert RecipientKey.from_text(f" {text}\n").text() == text
    with pytest.raises(ValueError) as info:
        RecipientKey.from_text("not base64!")
    assert str(info.value) == "recipient key 'not base64!' is not base64"
    spaced = f"{text[:10]} {text[10:]}"  # lenient base64 would skip the space and accept it
    with pytest.raises(ValueError) as info:
        RecipientKey.from_text(spaced)
    assert str(info.value) == f"recipient key {spaced!r} is not base64"
    short = base64.b64encode(raw[:31]).decode("ascii")
    with pytest.raises(ValueError) as info:
        RecipientKey.from_text(short)
    assert str(info.value) == f"recipient key {short!r} is 31 bytes, not 32"


def test_private_key_file(tmp_path: Path) -> None:
    reader = KeyPair.generate()
    path = tmp_path / "reader.pem"
    reader.write(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert KeyPair.read(path).recipient.text() == reader.recipient.text()
    with pytest.raises(FileExistsError):
        KeyPair.generate().write(path)
    assert KeyPair.read(path).recipient.text() == reader.recipient.text()
    os.chmod(path, 0o640)
    with pytest.raises(ValueError) as mode:
        KeyPair.read(path)
    assert str(mode.value) == f"key file {path} has mode 0640: others could read it"
    with pytest.raises(StoreMissing) as missing:
        KeyPair.read(tmp_path / "absent.pem")
    assert str(missing.value) == f"key file {tmp_path / 'absent.pem'} does not exist"
    with pytest.raises(ValueError) as garbage:
        KeyPair.from_pem(b"not a key")
    assert str(garbage.value).startswith("key: not a PEM private key (")
    ed25519 = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    other = tmp_path / "ed25519.pem"
    fd = os.open(other, os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, ed25519)
    os.close(fd)
    with pytest.raises(ValueError) as kind:
        KeyPair.read(other)
    assert str(kind.value) == f"{other}: not an X25519 private key"
