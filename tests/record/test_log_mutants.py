"""``record.log.Log``, the record's one writer, in process and word for word.

A real ``SQLiteStore`` in ``tmp_path``, real Ed25519 checkpoints, real HPKE and
ChaCha20-Poly1305; the stored lines are read back with the ``sqlite3`` module alone
(``tests/record/raw_store.py``) and opened here with the data keys unwrapped from them.

- what ``Log.open`` creates (the signing key beside the store, its name, the store's
  ``log_key``) and the refusal of a store another key signs;
- every field of ``Appended`` against the stored line: ``seq``, ``event_id``,
  ``occurred_at``, the leaf hash, the tree size, the root after that entry and the note that
  covers it;
- the opening and rotation entries (each recipient's wrapped key, for that stream and epoch),
  bodies sealed under the epoch's key, and key epochs counting 0, 1, 2 … across restarts,
  with and without the appliance key;
- each refusal's class and message (no recipients, a stream that exists, a clear kind
  appended, an unknown stream, a closed log, evidence kept twice, no data key in memory, a
  stale tree);
- after a restart, each stream's tree and latest data key read back from the store (once),
  and the next epoch counted on from the last one written;
- group commit: at most 256 entries a batch, one checkpoint per stream per batch, a bad
  request that does not sink its batch, a failed commit that fails all of it, and ``close``
  while a batch waits;
- the sealed line written in base64 slices, equal to one base64 of the whole.
- one writer per stream: each log's holder name, a takeover's ``lease.taken`` (and none for
  an opening a crash left leased), a request refused its lease failing alone in its batch,
  a writer whose lease was taken refused ``LeaseLost``, and on PostgreSQL a shared store
  with no ``log_key`` whose streams refuse another appliance (``NotOwner``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from record import merkle
from record.audit import verify_store
from record.checkpoint import Checkpoint, Signer, open_checkpoint
from record.digest import Domain, canonical_json, digest
from record.errors import CannotOpen, LeaseHeld, LeaseLost, NotOwner, RecordError, UnknownStream
from record.log import Appended, Log, _Request, _sealed_line, entry_line, origin_for
from record.postgres_store import PostgresStore
from record.schema import (
    Envelope,
    EvidenceArchived,
    KeyRotated,
    LeaseTaken,
    StreamOpened,
    ToolResult,
    TurnStarted,
    WrappedKey,
    canonical_body,
)
from record.seal import KeyPair, new_data_key, open_sealed
from record.sqlite_store import SQLiteStore
from record.store import Lease, PendingEntry, StoredCheckpoint
from tests.record.gated_store import GatedStore
from tests.record.raw_store import stored_lines

#: A break that leaves an appender waiting forever (a writer thread that died, a future never
#: set) fails here in seconds, instead of waiting for mutmut's stop or the suite's 240 s.
pytestmark = pytest.mark.timeout(5)

STREAM = "log-1"
OTHER = "log-2"
UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
NO_KEY = (
    "stream 'log-1': no data key in memory; open the log with a recipient key of the stream "
    "(the appliance key) to keep appending"
)


def _started(turn: int) -> TurnStarted:
    data = b"question %d" % turn
    return TurnStarted(turn=turn, input_bytes=data, input_digest=digest(Domain.INPUT, data))


def _split(line: bytes) -> tuple[dict[str, Any], Any]:
    """A stored line's envelope and body, parsed as plain JSON."""
    doc = json.loads(line)
    body = doc.pop("body")
    return doc, body


def _keys(line: bytes, reader: KeyPair, stream: str = STREAM) -> bytes:
    """The data key a clear entry wraps to ``reader`` (for its own stream and epoch)."""
    envelope, body = _split(line)
    for wrapped in body["recipients"]:
        if wrapped["recipient"] == reader.recipient.text():
            sealed = base64.b64decode(wrapped["sealed_key"])
            return reader.unwrap(sealed, stream, envelope["key_epoch"])
    raise AssertionError("not a recipient")


def _open(line: bytes, data_key: bytes) -> bytes:
    """A sealed line's plaintext: its envelope's canonical JSON is the associated data."""
    envelope, body = _split(line)
    return open_sealed(data_key, base64.b64decode(body), canonical_json(envelope))


def _note(log: Log, note: bytes | None, stream: str = STREAM) -> Checkpoint:
    """The checkpoint in ``note``, signed by the log's key, for the stream's origin."""
    assert note is not None
    cp, opened = open_checkpoint(note, [log.signer.verifier()])
    assert opened.verified_by == ("affidavit-log",) and opened.ignored == ()
    assert cp.origin == f"affidavit-log/{log.signer.key_id.hex()}/{stream}"
    return cp


def _leaves(lines: list[bytes]) -> list[bytes]:
    return [merkle.hash_leaf(line) for line in lines]


def _check_appended(
    log: Log, store: Path, appended: Appended, kind: str, stream: str = STREAM
) -> bytes:
    """Every field of ``appended`` against the line stored at its ``seq``; returns the line."""
    lines = stored_lines(store, stream)
    line = lines[appended.seq]
    envelope, _ = _split(line)
    assert appended.stream == stream
    assert envelope["seq"] == appended.seq
    assert envelope["stream"] == stream
    assert envelope["kind"] == appended.kind == kind
    assert envelope["schema_version"] == "1.0"
    assert envelope["event_id"] == appended.event_id and UUID7.fullmatch(appended.event_id)
    assert envelope["occurred_at"] == appended.occurred_at and TIME.fullmatch(appended.occurred_at)
    assert set(envelope) == set(Envelope.model_fields)  # test_schema.py names them
    assert appended.leaf_hash == merkle.hash_leaf(line)
    assert appended.tree_size == appended.seq + 1
    assert appended.root_hash == merkle.root(_leaves(lines[: appended.seq + 1]))
    cp = _note(log, appended.checkpoint, stream)
    assert cp.size >= appended.tree_size
    assert cp.root_hash == merkle.root(_leaves(lines[: cp.size]))
    return line


@pytest.fixture
def log(store: Path, user: KeyPair, appliance: KeyPair) -> Iterator[Log]:
    with Log.open(store, appliance_key=appliance) as opened:
        opened.open_stream(STREAM, [user.recipient, appliance.recipient])
        yield opened


def _gated(store: Path) -> tuple[Log, GatedStore]:
    gated = GatedStore(store)
    return Log(gated, Signer.load_or_create(store.with_name("gated.key"), "affidavit-log")), gated


def _wait_queued(log: Log, count: int) -> None:
    for _ in range(3000):
        if log._queue.qsize() >= count:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{count} requests never queued")


# -- opening the log -------------------------------------------------------------------------


def test_open_creates_the_signing_key_beside_the_store(tmp_path: Path) -> None:
    path = tmp_path / "record.db"
    with Log.open(path) as log:
        assert isinstance(log, Log)
        assert log.signer.name == "affidavit-log"
        assert log.log_key() == log.signer.vkey()
        assert log.log_key().startswith(f"affidavit-log+{log.signer.key_id.hex()}+")
        assert log.store.get_meta("log_key") == log.log_key()
        assert log.appliance_key is None
        writers = [t for t in threading.enumerate() if t.name == "record-writer"]
        assert log._thread in writers and log._thread.daemon
    key = tmp_path / "record.db.signing-key"
    assert key.is_file() and path.is_file()
    assert Signer.load_or_create(key, "affidavit-log").vkey() == log.log_key()
    assert not log._thread.is_alive()
    assert not path.with_name("record.db-wal").exists()  # the store was closed

    # the same key again: the same log key; another one given: used, the default untouched
    with Log.open(str(path)) as again:
        assert again.log_key() == log.log_key()
    other = tmp_path / "other.key"
    appliance = KeyPair.generate()
    with Log.open(tmp_path / "second.db", signing_key=other, appliance_key=appliance) as second:
        assert second.appliance_key is appliance
        assert Signer.load_or_create(other, "affidavit-log").vkey() == second.log_key()
    assert not (tmp_path / "second.db.signing-key").exists()


def test_a_store_another_key_signs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "record.db"
    with Log.open(path) as log:
        vkey = log.log_key()
    stranger = Signer.generate("affidavit-log")
    store = SQLiteStore(path)
    try:
        with pytest.raises(RecordError) as caught:
            Log(store, stranger)
        assert type(caught.value) is RecordError
        assert str(caught.value) == f"this store's checkpoints are signed by {vkey}, not this key"
        assert store.get_meta("log_key") == vkey
    finally:
        store.close()
    signer = Signer.load_or_create(tmp_path / "record.db.signing-key", "affidavit-log")
    with Log(SQLiteStore(path), signer) as log:
        assert log.log_key() == vkey


def test_close_is_idempotent_and_a_closed_log_takes_nothing(log: Log, store: Path) -> None:
    log.close()
    log.close()
    assert not log._thread.is_alive()
    with pytest.raises(RecordError) as caught:
        log.append(STREAM, _started(0))
    assert type(caught.value) is RecordError and str(caught.value) == "the log is closed"
    with pytest.raises(RecordError) as caught:
        log.checkpoint(STREAM)  # refused, not left waiting on a writer that is gone
    assert type(caught.value) is RecordError and str(caught.value) == "the log is closed"
    assert len(stored_lines(store, STREAM)) == 1


def test_a_database_store_needs_its_signing_key_named(tmp_path: Path) -> None:
    """A PostgreSQL store's log key is the appliance's, never beside a file: ``Log.open``
    refuses a URL without ``signing_key`` before it connects anywhere."""
    with pytest.raises(ValueError) as caught:
        Log.open("postgresql://127.0.0.1:1/none")
    assert str(caught.value) == "a PostgreSQL store needs signing_key: the log key's file"
    assert list(tmp_path.iterdir()) == []


def test_a_file_store_s_signing_key_is_beside_it_unless_named(tmp_path: Path) -> None:
    named = tmp_path / "keys" / "log.key"
    named.parent.mkdir()
    with Log.open(tmp_path / "record.db", signing_key=named) as log:
        vkey = log.log_key()
    assert named.is_file() and not (tmp_path / "record.db.signing-key").exists()
    assert Signer.load_or_create(named, "affidavit-log").vkey() == vkey


# -- the opening entry -----------------------------------------------------------------------


def test_open_stream_writes_one_wrapped_key_per_recipient(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    with Log.open(store, appliance_key=appliance) as log:
        opened = log.open_stream(STREAM, [user.recipient, appliance.recipient])
        line = _check_appended(log, store, opened, "stream.opened")
        plain = log.open_stream(OTHER, [user.recipient], {"case": "x-1"})
        other_line = _check_appended(log, store, plain, "stream.opened", OTHER)
    assert opened.seq == 0 and plain.seq == 0
    envelope, body = _split(line)
    assert envelope["key_epoch"] == 0
    assert body["origin"] == origin_for(log.signer, STREAM)
    assert body["origin"] == f"affidavit-log/{log.signer.key_id.hex()}/{STREAM}"
    assert body["log_key"] == log.log_key()
    assert body["key_epoch"] == 0 and body["kind"] == "stream.opened"
    assert body["labels"] == {}
    assert [w["recipient"] for w in body["recipients"]] == [
        user.recipient.text(),
        appliance.recipient.text(),
    ]
    assert line == entry_line(envelope, body)[0]
    assert StreamOpened.model_validate(body) == StreamOpened(
        origin=body["origin"],
        log_key=log.log_key(),
        key_epoch=0,
        recipients=[WrappedKey.model_validate(w) for w in body["recipients"]],
        labels={},
    )
    # each recipient unwraps the same key, for this stream and epoch 0 only
    data_key = _keys(line, user)
    assert len(data_key) == 32 and _keys(line, appliance) == data_key
    sealed = base64.b64decode(body["recipients"][0]["sealed_key"])
    for stream, epoch in ((OTHER, 0), (STREAM, 1)):
        with pytest.raises(CannotOpen):
            user.unwrap(sealed, stream, epoch)
    other_envelope, other_body = _split(other_line)
    assert other_body["labels"] == {"case": "x-1"}
    assert [w["recipient"] for w in other_body["recipients"]] == [user.recipient.text()]
    assert other_body["origin"] == f"affidavit-log/{log.signer.key_id.hex()}/{OTHER}"
    assert _keys(other_line, user, OTHER) != data_key  # a fresh key per stream
    assert other_envelope["stream"] == OTHER


def test_open_stream_refusals(log: Log, store: Path, user: KeyPair) -> None:
    with pytest.raises(ValueError) as caught:
        log.open_stream(OTHER, [])
    assert str(caught.value) == "a stream needs at least one recipient key"
    with pytest.raises(ValidationError, match="a stream name"):
        log.open_stream("no/slash", [user.recipient])
    with pytest.raises(ValueError) as caught:
        log.open_stream(STREAM, [user.recipient])
    assert str(caught.value) == "stream 'log-1' already exists"
    # a second opening the writer is handed (past open_stream's own check) is refused too
    body = StreamOpened(
        origin=origin_for(log.signer, STREAM),
        log_key=log.log_key(),
        key_epoch=0,
        recipients=[WrappedKey(recipient=user.recipient.text(), sealed_key=bytes(80))],
    )
    with pytest.raises(ValueError) as caught:
        log._submit(STREAM, body, new_key=(0, new_data_key())).result(5)
    assert str(caught.value) == "stream 'log-1' already exists"
    assert len(stored_lines(store, STREAM)) == 1
    assert stored_lines(store, OTHER) == [] and stored_lines(store, "no/slash") == []


# -- sealed entries --------------------------------------------------------------------------


def test_append_seals_the_body_under_the_streams_key(log: Log, store: Path, user: KeyPair) -> None:
    first = log.append(STREAM, _started(0))
    second = log.append(STREAM, _started(1))
    assert (first.seq, second.seq) == (1, 2)
    lines = stored_lines(store, STREAM)
    data_key = _keys(lines[0], user)
    for appended, turn in ((first, 0), (second, 1)):
        line = _check_appended(log, store, appended, "turn.started")
        envelope, body = _split(line)
        assert envelope["key_epoch"] == 0 and isinstance(body, str)
        assert _open(line, data_key) == canonical_body(_started(turn))
        assert _note(log, appended.checkpoint).size == appended.seq + 1
    assert first.root_hash != second.root_hash
    assert [c.size for c in log.store.checkpoints(STREAM)] == [1, 2, 3]


def test_append_async_is_append(log: Log, store: Path, user: KeyPair) -> None:
    appended = asyncio.run(log.append_async(STREAM, _started(0)))
    line = _check_appended(log, store, appended, "turn.started")
    assert appended.seq == 1
    assert _open(line, _keys(stored_lines(store, STREAM)[0], user)) == canonical_body(_started(0))
    with pytest.raises(UnknownStream):
        asyncio.run(log.append_async("nope", _started(0)))


def test_a_large_body_is_one_base64_written_in_slices(log: Log, store: Path, user: KeyPair) -> None:
    page = bytes(range(256)) * 6500  # 1.6 MB: three slices of base64, the last one short
    body = ToolResult(
        call_seq=0,
        outcome="COMMITTED",
        result_bytes=page,
        result_digest=digest(Domain.TOOL_RESULT, page),
    )
    appended = log.append(STREAM, body)
    line = _check_appended(log, store, appended, "tool.result")
    assert _open(line, _keys(stored_lines(store, STREAM)[0], user)) == canonical_body(body)


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 786431, 786432, 786433, 2 * 786432 + 2])
def test_sealed_line_is_the_base64_of_the_whole(size: int) -> None:
    sealed = bytearray((i * 7 + 3) % 256 for i in range(size))
    ad = b'{"event_id":"e","seq":1}'
    line = _sealed_line(sealed, ad)
    assert bytes(line) == b'{"body":"' + base64.b64encode(sealed) + b'","event_id":"e","seq":1}'


def test_entry_line_is_the_canonical_json_of_body_and_envelope() -> None:
    envelope = {
        "schema_version": "1.0",
        "stream": STREAM,
        "seq": 12,
        "event_id": "0190a6a0-0000-7000-8000-000000000000",
        "kind": "turn.started",
        "occurred_at": "2026-12-01T12:00:00.000000Z",
        "key_epoch": 3,
    }
    for body in ("AAAA", {"key_epoch": 3, "kind": "key.rotated", "z": [1, "é"]}):
        line, ad = entry_line(envelope, body)
        assert ad == canonical_json(envelope)
        assert line == canonical_json({**envelope, "body": body})


def test_clear_kinds_unknown_streams_and_non_bodies_are_refused(
    log: Log, store: Path, user: KeyPair
) -> None:
    opened = StreamOpened(
        origin="o",
        log_key=log.log_key(),
        key_epoch=0,
        recipients=[WrappedKey(recipient=user.recipient.text(), sealed_key=bytes(80))],
    )
    rotated = KeyRotated(
        key_epoch=1,
        recipients=[WrappedKey(recipient=user.recipient.text(), sealed_key=bytes(80))],
    )
    for body, kind in ((opened, "stream.opened"), (rotated, "key.rotated")):
        with pytest.raises(ValueError) as caught:
            log.append(STREAM, body)
        assert str(caught.value) == f"{kind} entries are written by open_stream/rotate_key"
    for call in (
        lambda: log.append("nope", _started(0)),
        lambda: log.rotate_key("nope", [user.recipient]),
        lambda: log.checkpoint("nope"),
        lambda: log.archive_evidence("nope", "tdx", "q.bin", b"q"),
    ):
        with pytest.raises(UnknownStream) as unknown:
            call()
        assert str(unknown.value) == "stream 'nope' has not been opened"
    with pytest.raises(ValueError, match="not an entry body: Checkpoint"):
        log.append(STREAM, Checkpoint("o", 0, bytes(32)))  # type: ignore[arg-type]
    assert len(stored_lines(store, STREAM)) == 1
    assert log.store.streams() == [STREAM]


# -- key epochs ------------------------------------------------------------------------------


def test_rotate_key_starts_the_next_epoch_for_the_recipients_given(
    log: Log, store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    before = log.append(STREAM, _started(0))
    auditor = KeyPair.generate()
    rotated = log.rotate_key(STREAM, [auditor.recipient, appliance.recipient])
    line = _check_appended(log, store, rotated, "key.rotated")
    envelope, body = _split(line)
    assert rotated.seq == 2
    assert envelope["key_epoch"] == 1
    assert body == {
        "kind": "key.rotated",
        "key_epoch": 1,
        "recipients": body["recipients"],
    }
    assert [w["recipient"] for w in body["recipients"]] == [
        auditor.recipient.text(),
        appliance.recipient.text(),
    ]
    new_key = _keys(line, auditor)
    assert _keys(line, appliance) == new_key
    old_key = _keys(stored_lines(store, STREAM)[0], user)
    assert new_key != old_key
    after = log.append(STREAM, _started(1))
    after_line = _check_appended(log, store, after, "turn.started")
    assert _split(after_line)[0]["key_epoch"] == 1
    assert _open(after_line, new_key) == canonical_body(_started(1))
    with pytest.raises(CannotOpen):
        _open(after_line, old_key)
    assert _split(stored_lines(store, STREAM)[before.seq])[0]["key_epoch"] == 0

    again = log.rotate_key(STREAM, [user.recipient])
    assert _split(_check_appended(log, store, again, "key.rotated"))[0]["key_epoch"] == 2
    assert _split(stored_lines(store, STREAM)[again.seq])[1]["key_epoch"] == 2
    last = log.append(STREAM, _started(2))
    last_line = _check_appended(log, store, last, "turn.started")
    assert _split(last_line)[0]["key_epoch"] == 2
    assert _open(last_line, _keys(stored_lines(store, STREAM)[again.seq], user))


def test_epochs_count_on_across_restarts_with_and_without_the_appliance_key(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    with Log.open(store, appliance_key=appliance) as log:
        log.open_stream(STREAM, [user.recipient, appliance.recipient])
        log.append(STREAM, _started(0))
        log.rotate_key(STREAM, [user.recipient, appliance.recipient])  # seq 2: epoch 1
        log.append(STREAM, _started(1))
    # restarted with the appliance key: the latest key is unwrapped, past sealed entries
    with Log.open(store, appliance_key=appliance) as log:
        appended = log.append(STREAM, _started(2))
        line = _check_appended(log, store, appended, "turn.started")
    assert appended.seq == 4
    assert _split(line)[0]["key_epoch"] == 1
    epoch1 = _keys(stored_lines(store, STREAM)[2], user)
    assert _open(line, epoch1) == canonical_body(_started(2))
    # restarted without it: nothing sealed can be written, but the next epoch is still 2
    with Log.open(store) as log:
        with pytest.raises(CannotOpen) as caught:
            log.append(STREAM, _started(3))
        assert type(caught.value) is CannotOpen and str(caught.value) == NO_KEY
        cp = log.checkpoint(STREAM)  # a checkpoint needs no data key
        assert cp.size == 5
        rotated = log.rotate_key(STREAM, [user.recipient])
        line = _check_appended(log, store, rotated, "key.rotated")
        assert _split(line)[0]["key_epoch"] == 2 and _split(line)[1]["key_epoch"] == 2
        appended = log.append(STREAM, _started(4))  # the new key is in memory
        after = _check_appended(log, store, appended, "turn.started")
    assert _split(after)[0]["key_epoch"] == 2
    assert _open(after, _keys(line, user)) == canonical_body(_started(4))
    # and again: epoch 2 is sealed to the user only, so the appliance key opens nothing
    with Log.open(store, appliance_key=appliance) as log:
        with pytest.raises(CannotOpen) as caught:
            log.append(STREAM, _started(5))
        assert str(caught.value) == NO_KEY
        assert log.rotate_key(STREAM, [appliance.recipient]).seq == 7
    epochs = [_split(x)[0]["key_epoch"] for x in stored_lines(store, STREAM)]
    assert epochs == [0, 0, 1, 1, 1, 2, 2, 3]


def test_restarted_with_a_key_the_stream_is_sealed_to_second(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    stranger = KeyPair.generate()
    with Log.open(store) as log:
        log.open_stream(STREAM, [user.recipient, appliance.recipient])
    for key in (stranger, None):
        with Log.open(store, appliance_key=key) as log:
            with pytest.raises(CannotOpen) as caught:
                log.archive_evidence(STREAM, "tdx", "q.bin", b"quote")
            assert str(caught.value) == NO_KEY
    with Log.open(store, appliance_key=appliance) as log:
        appended = log.append(STREAM, _started(0))
        line = _check_appended(log, store, appended, "turn.started")
    assert _split(line)[0]["key_epoch"] == 0
    assert _open(line, _keys(stored_lines(store, STREAM)[0], user)) == canonical_body(_started(0))
    assert len(stored_lines(store, STREAM)) == 2
    reading = SQLiteStore(store, readonly=True)
    try:
        assert reading.evidence(STREAM) == []
    finally:
        reading.close()


def test_open_stream_after_a_restart_refuses_a_stream_the_store_holds(
    store: Path, user: KeyPair
) -> None:
    with Log.open(store) as log:
        log.open_stream(STREAM, [user.recipient])
    with Log.open(store) as log:
        with pytest.raises(ValueError) as caught:
            log.open_stream(STREAM, [user.recipient])
        assert str(caught.value) == "stream 'log-1' already exists"
        assert log.checkpoint(STREAM).size == 1
    assert len(stored_lines(store, STREAM)) == 1


def test_a_stream_with_no_clear_entry_counts_its_epochs_from_0(store: Path, user: KeyPair) -> None:
    """A stream another writer put in the file without an opening entry (the audit calls it
    malformed): the writer finds no key in it, and its first rotation is epoch 1."""
    with Log.open(store) as log:
        log.open_stream(OTHER, [user.recipient])
    envelope = {
        "schema_version": "1.0",
        "stream": STREAM,
        "seq": 0,
        "event_id": "0190a6a0-0000-7000-8000-000000000000",
        "kind": "turn.started",
        "occurred_at": "2026-12-01T12:00:00.000000Z",
        "key_epoch": 0,
    }
    line = entry_line(envelope, "AAAA")[0]
    conn = sqlite3.connect(store)
    try:
        with conn:
            conn.execute(
                "INSERT INTO entries (stream, seq, line, leaf_hash) VALUES (?, ?, ?, ?)",
                (STREAM, 0, line, merkle.hash_leaf(line)),
            )
    finally:
        conn.close()
    with Log.open(store, appliance_key=user) as log:
        with pytest.raises(CannotOpen) as caught:
            log.append(STREAM, _started(0))
        assert str(caught.value) == NO_KEY
        rotated = log.rotate_key(STREAM, [user.recipient])
        line = _check_appended(log, store, rotated, "key.rotated")
    assert rotated.seq == 1
    assert _split(line)[0]["key_epoch"] == 1 and _split(line)[1]["key_epoch"] == 1


# -- checkpoints and evidence ----------------------------------------------------------------


def test_checkpoint_signs_the_current_tree_and_adds_no_entry(
    log: Log, store: Path, user: KeyPair
) -> None:
    log.append(STREAM, _started(0))
    signed = log.checkpoint(STREAM)
    assert type(signed) is StoredCheckpoint
    assert (signed.stream, signed.size) == (STREAM, 2)
    cp = _note(log, signed.note)
    assert cp.size == 2 and cp.root_hash == merkle.root(_leaves(stored_lines(store, STREAM)))
    assert [c.size for c in log.store.checkpoints(STREAM)] == [1, 2, 2]
    assert log.store.checkpoints(STREAM)[-1] == signed
    assert len(stored_lines(store, STREAM)) == 2
    # what the writer hands the on-demand request: the tree as it stands, no entry
    appended = log.append(STREAM, _started(1))
    bare = _Request(STREAM, "", b"")
    log._queue.put(bare)
    result = bare.future.result(5)
    root = merkle.root(_leaves(stored_lines(store, STREAM)))
    assert result == Appended(STREAM, 2, "", "", "", b"", 3, root, result.checkpoint)
    assert _note(log, result.checkpoint).size == 3
    assert appended.tree_size == 3


def test_archive_evidence_keeps_the_file_with_its_entry(
    log: Log, store: Path, user: KeyPair
) -> None:
    appended = log.archive_evidence(STREAM, "sev-snp", "snp.report", b"report bytes")
    line = _check_appended(log, store, appended, "evidence.archived")
    plain = _open(line, _keys(stored_lines(store, STREAM)[0], user))
    assert EvidenceArchived.model_validate_json(plain) == EvidenceArchived(
        evidence_kind="sev-snp",
        file="snp.report",
        evidence_digest=digest(Domain.EVIDENCE, b"report bytes"),
    )
    assert log.store.evidence(STREAM) == [("snp.report", b"report bytes")]
    with pytest.raises(ValueError) as caught:
        log.archive_evidence(STREAM, "sev-snp", "snp.report", b"other")
    assert str(caught.value) == "evidence 'snp.report' is already kept for stream 'log-1'"
    log.open_stream(OTHER, [user.recipient])
    log.archive_evidence(OTHER, "tdx", "snp.report", b"other")  # another stream's own file
    assert log.store.evidence(OTHER) == [("snp.report", b"other")]
    assert log.store.evidence(STREAM) == [("snp.report", b"report bytes")]
    assert len(stored_lines(store, STREAM)) == 2


# -- group commit ----------------------------------------------------------------------------


def test_a_batch_holds_at_most_256_entries_each_with_its_own_root(
    store: Path, user: KeyPair
) -> None:
    log, gated = _gated(store)
    with log:
        log.open_stream(STREAM, [user.recipient])
        gated.hold()
        first = log._submit(STREAM, _started(0))
        assert gated.entered.wait(30)
        queued = [log._submit(STREAM, _started(n)) for n in range(1, 301)]
        _wait_queued(log, 300)
        gated.gate.set()
        results = [f.result(5) for f in [first, *queued]]
        assert gated.batches == [(1, 1), (1, 1), (256, 1), (44, 1)]
        lines = stored_lines(store, STREAM)
        leaves = _leaves(lines)
        assert [r.seq for r in results] == list(range(1, 302))
        tree = merkle.CompactRange()
        tree.append(leaves[0])
        for appended, line in zip(results, lines[1:], strict=True):
            tree.append(merkle.hash_leaf(line))
            envelope, _ = _split(line)
            assert appended.leaf_hash == merkle.hash_leaf(line)
            assert appended.tree_size == appended.seq + 1
            assert appended.root_hash == tree.root()
            assert (appended.event_id, appended.occurred_at) == (
                envelope["event_id"],
                envelope["occurred_at"],
            )
            assert appended.kind == "turn.started" and appended.stream == STREAM
        assert {r.checkpoint for r in results[1:257]} == {results[1].checkpoint}
        assert _note(log, results[1].checkpoint).size == 258
        assert _note(log, results[-1].checkpoint).size == 302
        assert [c.size for c in log.store.checkpoints(STREAM)] == [1, 2, 258, 302]
        assert _note(log, results[-1].checkpoint).root_hash == merkle.root(leaves)


def test_a_bad_request_does_not_sink_its_batch(store: Path, user: KeyPair) -> None:
    log, gated = _gated(store)
    with log:
        log.open_stream(STREAM, [user.recipient])
        gated.hold()
        first = log._submit(STREAM, _started(0))
        assert gated.entered.wait(30)
        # two openings of one new stream, a rotation and an append after it, a checkpoint
        data_key = new_data_key()
        wrapped = [WrappedKey(recipient=user.recipient.text(), sealed_key=bytes(80))]
        opening = StreamOpened(
            origin=origin_for(log.signer, OTHER),
            log_key=log.log_key(),
            key_epoch=0,
            recipients=wrapped,
        )
        opened = log._submit(OTHER, opening, new_key=(0, data_key))
        twice = log._submit(OTHER, opening, new_key=(0, new_data_key()))
        bare = _Request(OTHER, "", b"")  # a checkpoint request before the others
        log._queue.put(bare)
        new_key = new_data_key()
        rotated = log._submit(
            STREAM, KeyRotated(key_epoch=1, recipients=wrapped), new_key=(1, new_key)
        )
        sealed = log._submit(STREAM, _started(1))
        _wait_queued(log, 5)
        gated.gate.set()
        with pytest.raises(ValueError) as caught:
            twice.result(5)
        assert str(caught.value) == "stream 'log-2' already exists"
        assert first.result(5).seq == 1
        assert opened.result(5).seq == 0 and opened.result().tree_size == 1
        assert rotated.result(5).seq == 2
        after = sealed.result(5)
        assert after.seq == 3
        assert bare.future.result(5).tree_size == 1
        assert gated.batches == [(1, 1), (1, 1), (3, 2)]
        line = stored_lines(store, STREAM)[3]
        assert _split(line)[0]["key_epoch"] == 1
        assert _open(line, new_key) == canonical_body(_started(1))
        assert len(stored_lines(store, OTHER)) == 1
        assert [c.size for c in log.store.checkpoints(OTHER)] == [1]
        assert [c.size for c in log.store.checkpoints(STREAM)] == [1, 2, 4]
        # the batch's state is kept: the next batch goes on from it
        more = log.append(OTHER, _started(0))
        assert more.seq == 1 and _split(stored_lines(store, OTHER)[1])[0]["key_epoch"] == 0
        assert _open(stored_lines(store, OTHER)[1], data_key) == canonical_body(_started(0))
        again = log.rotate_key(STREAM, [user.recipient])
        assert _split(stored_lines(store, STREAM)[again.seq])[0]["key_epoch"] == 2


def test_a_second_writer_of_a_stream_is_refused_and_writes_nothing(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    """One writer per stream: a second live one (here a second log on the same file, with
    the same keys) waits ``lease_wait`` for the first to let go, then is refused, naming it."""
    with Log.open(store, appliance_key=appliance) as first:
        first.open_stream(STREAM, [user.recipient, appliance.recipient])
        first.append(STREAM, _started(0))
        with Log.open(store, appliance_key=appliance, lease_wait=0.2) as second:
            with pytest.raises(LeaseHeld) as caught:
                second.append(STREAM, _started(1))
            assert caught.value.code == "lease_held"
            assert f"({first.holder}, since " in str(caught.value)
            assert "one writer per stream" in str(caught.value)
            assert len(stored_lines(store, STREAM)) == 2
        first.append(STREAM, _started(1))  # the first is untouched by the attempt
    # a clean close lets go: the next writer takes the stream with no takeover to record
    with Log.open(store, appliance_key=appliance, lease_wait=0) as third:
        assert third.append(STREAM, _started(2)).seq == 3
    kinds = [json.loads(line)["kind"] for line in stored_lines(store, STREAM)]
    assert "lease.taken" not in kinds


def test_a_stale_tree_fails_the_whole_batch_and_writes_nothing(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    log, gated = _gated(store)
    with log:
        log.open_stream(STREAM, [user.recipient, appliance.recipient])
        log.open_stream(OTHER, [user.recipient, appliance.recipient])
        log.append(STREAM, _started(0))
        # a row written past the log (the store's own append, which no lease guards: never do
        # this) leaves the writer's tree stale
        raw = SQLiteStore(store)
        try:
            raw.append([PendingEntry(STREAM, lambda seq: (b"{}", merkle.hash_leaf(b"{}")))])
        finally:
            raw.close()
        gated.hold()
        head = log._submit(OTHER, _started(0))
        assert gated.entered.wait(30)
        stale = log._submit(STREAM, _started(2))
        other = log._submit(OTHER, _started(1))
        _wait_queued(log, 2)
        gated.gate.set()
        assert head.result(5).seq == 1
        for future in (stale, other):
            with pytest.raises(RecordError) as caught:
                future.result(5)
            assert type(caught.value) is RecordError
            assert str(caught.value) == "tree of log-1 has 3 leaves, store has 4"
        assert len(stored_lines(store, STREAM)) == 3
        assert len(stored_lines(store, OTHER)) == 2
        # the failed batch left the writer's state as it was: still stale, still refused
        with pytest.raises(RecordError) as caught:
            log.append(STREAM, _started(3))
        assert str(caught.value) == "tree of log-1 has 3 leaves, store has 4"
        assert log.append(OTHER, _started(2)).seq == 2


def test_after_a_restart_each_stream_goes_on_from_its_own_tree(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    with Log.open(store, appliance_key=appliance) as log:
        log.open_stream(STREAM, [user.recipient, appliance.recipient])
        log.open_stream(OTHER, [appliance.recipient, user.recipient])
        for turn in range(3):
            log.append(STREAM, _started(turn))
    with Log.open(store, appliance_key=appliance) as log:
        first = log.append(STREAM, _started(3))
        other = log.append(OTHER, _started(0))
        last = log.append(STREAM, _started(4))
        assert (first.seq, other.seq, last.seq) == (4, 1, 5)
        for appended, stream in ((first, STREAM), (other, OTHER), (last, STREAM)):
            line = _check_appended(log, store, appended, "turn.started", stream)
            key = _keys(stored_lines(store, stream)[0], user, stream)
            assert _open(line, key) == canonical_body(
                _started(appended.seq - 1 if stream == STREAM else 0)
            )


def test_a_stream_is_read_again_once_its_lease_is_taken(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    """What the writer read of a stream before it held the stream's lease may be stale:
    entries another writer added meanwhile are picked up when it takes the lease, and its
    appends go on after them."""
    with Log.open(store, appliance_key=appliance) as log:
        log.open_stream(STREAM, [user.recipient, appliance.recipient])
        log.archive_evidence(STREAM, "sev-snp", "snp.report", b"report")
    with Log.open(store, appliance_key=appliance) as log:
        with pytest.raises(ValueError, match="already kept"):  # reads the stream, writes nothing
            log.archive_evidence(STREAM, "sev-snp", "snp.report", b"again")
        with Log.open(store, appliance_key=appliance) as second:
            assert second.append(STREAM, _started(0)).seq == 2
        appended = log.append(STREAM, _started(1))
        assert (appended.seq, appended.tree_size) == (3, 4)
    assert len(stored_lines(store, STREAM)) == 4
    assert verify_store(store, key=user).ok


def test_close_while_a_batch_waits_commits_it_and_stops(store: Path, user: KeyPair) -> None:
    log, gated = _gated(store)
    log.open_stream(STREAM, [user.recipient])
    gated.hold()
    first = log._submit(STREAM, _started(0))
    assert gated.entered.wait(30)
    queued = [log._submit(STREAM, _started(n)) for n in range(1, 4)]
    closing = threading.Thread(target=log.close, daemon=True)
    closing.start()
    _wait_queued(log, 4)  # the three and the writer's stop
    gated.gate.set()
    closing.join(20)
    assert not closing.is_alive() and not log._thread.is_alive()
    assert [f.result(5).seq for f in [first, *queued]] == [1, 2, 3, 4]
    assert gated.batches == [(1, 1), (1, 1), (3, 1)]
    assert len(stored_lines(store, STREAM)) == 5
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        sizes = [r[0] for r in conn.execute("SELECT size FROM checkpoints ORDER BY rowid")]
    finally:
        conn.close()
    assert sizes == [1, 2, 5]


def test_a_database_store_keeps_its_signing_key_where_named(
    tmp_path: Path, postgres_server: Any
) -> None:
    url: str = postgres_server.fresh_database()
    key = tmp_path / "record.signing-key"
    try:
        with Log.open(url, signing_key=key) as log:
            log.open_stream(STREAM, [KeyPair.generate().recipient])
            vkey = log.log_key()
        assert Signer.load_or_create(key, "affidavit-log").vkey() == vkey
        with Log.open(url, signing_key=key) as again:  # the same key, read back
            assert again.log_key() == vkey and again.store.size(STREAM) == 1
    finally:
        postgres_server.drop_database(url)


# -- one writer per stream: what the writer does with leases ---------------------------------


def test_each_log_names_itself_by_host_process_and_a_tag_of_its_own(store: Path) -> None:
    with Log.open(store) as first, Log.open(store) as second:
        pattern = rf"{re.escape(socket.gethostname())} pid {os.getpid()} [0-9a-f]{{8}}"
        assert re.fullmatch(pattern, first.holder) and re.fullmatch(pattern, second.holder)
        assert first.holder != second.holder


def test_a_takeover_from_a_writer_that_never_let_go_is_recorded_before_its_first_entry(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    with Log.open(store, appliance_key=appliance) as first:
        first.open_stream(STREAM, [user.recipient, appliance.recipient])
        first.append(STREAM, _started(0))
        held = first.store.lease(STREAM)
        assert held is not None and (held.holder, held.released) == (first.holder, False)
        # as the end of its process would: its lock goes, its unreleased row stays
        first.store._drop_locks()  # type: ignore[attr-defined]
        with Log.open(store, appliance_key=appliance, lease_wait=0) as second:
            turns = [second._submit(STREAM, _started(n)) for n in (1, 2)]  # one batch or two
            assert [f.result(5).seq for f in turns] == [3, 4]
            assert second.append(STREAM, _started(3)).seq == 5
            taken = second.store.lease(STREAM)
            assert taken is not None and (taken.holder, taken.released) == (second.holder, False)
    lines = stored_lines(store, STREAM)
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds == ["stream.opened", "turn.started", "lease.taken", *["turn.started"] * 3]
    key = _keys(lines[0], user)
    expected = LeaseTaken(
        holder=second.holder, previous_holder=first.holder, previous_since=held.since
    )
    assert _open(lines[2], key) == canonical_body(expected)
    assert [_open(line, key) for line in lines[3:]] == [
        canonical_body(_started(n)) for n in (1, 2, 3)
    ]
    assert verify_store(store, key=user).ok


def test_an_opening_whose_lease_was_left_by_a_crash_records_no_takeover(
    store: Path, user: KeyPair
) -> None:
    """A writer that took a new stream's lease and crashed before its opening was committed
    left a lease row and nothing else: the next opener takes it silently."""
    crashed = SQLiteStore(store)
    crashed.take_lease(STREAM, "crashed")
    crashed.close()  # no release: the lock goes with the file, the row stays
    with Log.open(store, lease_wait=0) as log:
        log.open_stream(STREAM, [user.recipient])
        assert log.append(STREAM, _started(0)).seq == 1
        lease = log.store.lease(STREAM)
        assert lease is not None and (lease.holder, lease.released) == (log.holder, False)
    kinds = [json.loads(line)["kind"] for line in stored_lines(store, STREAM)]
    assert kinds == ["stream.opened", "turn.started"]
    raw = SQLiteStore(store, readonly=True)
    try:
        after = raw.lease(STREAM)
        assert after is not None and (after.holder, after.released) == (log.holder, True)
    finally:
        raw.close()


def test_a_request_refused_its_lease_fails_alone_in_its_batch(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    """A second live writer of the file (the same keys) holds OTHER: a request for it fails
    alone, and the requests for STREAM queued with it in one batch are written."""
    with Log.open(store, appliance_key=appliance) as rival:
        rival.open_stream(OTHER, [user.recipient, appliance.recipient])  # held from here on
        held = rival.store.lease(OTHER)
        assert held is not None
        gated = GatedStore(store)
        signer = Signer.load_or_create(store.with_name("record.db.signing-key"), "affidavit-log")
        with Log(gated, signer, appliance_key=appliance, lease_wait=0) as log:
            log.open_stream(STREAM, [user.recipient, appliance.recipient])
            gated.hold()
            head = log._submit(STREAM, _started(0))
            assert gated.entered.wait(30)
            refused = log._submit(OTHER, _started(0))
            after = log._submit(STREAM, _started(1))
            _wait_queued(log, 2)
            gated.gate.set()
            with pytest.raises(LeaseHeld) as caught:
                refused.result(5)
            assert type(caught.value) is LeaseHeld
            assert str(caught.value) == (
                f"stream 'log-2' is being written by another live process ({rival.holder}, "
                f"since {held.since}): one writer per stream; stop that one first, or continue "
                "the session in a new stream"
            )
            assert (head.result(5).seq, after.result(5).seq) == (1, 2)
            assert gated.batches[-1] == (1, 1)
            assert len(stored_lines(store, OTHER)) == 1
        assert rival.append(OTHER, _started(0)).seq == 1  # the rival is untouched


def test_a_shared_store_keeps_no_log_key_and_a_stream_is_its_openers(
    tmp_path: Path, postgres_server: Any, user: KeyPair, appliance: KeyPair
) -> None:
    url: str = postgres_server.fresh_database()
    try:
        mine, theirs = Signer.generate("affidavit-log"), Signer.generate("affidavit-log")
        with Log(PostgresStore(url), mine, appliance_key=appliance) as log:
            log.open_stream(STREAM, [user.recipient, appliance.recipient])
            assert log.store.get_meta("log_key") is None
            owner, since = log.holder, log.store.lease(STREAM).since  # type: ignore[union-attr]
        # another appliance's log on the same database: not refused, but not the stream's owner
        with Log(PostgresStore(url), theirs, lease_wait=0) as other:
            assert other.store.get_meta("log_key") is None
            for write in (
                lambda: other.append(STREAM, _started(0)),
                lambda: other.checkpoint(STREAM),
            ):
                with pytest.raises(NotOwner) as caught:
                    write()
                assert str(caught.value) == (
                    f"stream 'log-1' was opened by the appliance whose log key is {mine.vkey()};"
                    f" this one ({theirs.vkey()}) may not append to it: continue the session in "
                    "a new stream"
                )
            other.open_stream(OTHER, [user.recipient])  # its own stream: written
            assert other.append(OTHER, _started(0)).seq == 1
            # refused before its lease was taken: the owner's row stands, let go; nothing written
            assert other.store.lease(STREAM) == Lease(STREAM, owner, since, released=True)
            assert other.store.size(STREAM) == 1
        # the owner goes on after it
        with Log(PostgresStore(url), mine, appliance_key=appliance, lease_wait=0) as log:
            assert log.append(STREAM, _started(0)).seq == 1
            with pytest.raises(NotOwner):
                log.append(OTHER, _started(1))
    finally:
        postgres_server.drop_database(url)


def test_a_writer_whose_lease_was_taken_from_it_writes_nothing_more(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    """Each batch is checked against the writer's lease inside its transaction: a writer that
    lost its stream (its lock gone, as if its process had been taken for dead, and another
    took the stream) is refused from then on, and nothing of its batch is written."""
    with Log.open(store, appliance_key=appliance) as log:
        log.open_stream(STREAM, [user.recipient, appliance.recipient])
        log.store._drop_locks()  # type: ignore[attr-defined]
        rival = SQLiteStore(store)
        try:
            orphaned = rival.take_lease(STREAM, "rival", wait=0)
            assert orphaned is not None and orphaned.holder == log.holder
            with pytest.raises(LeaseLost) as caught:
                log.append(STREAM, _started(0))
            assert str(caught.value) == (
                f"stream 'log-1': this writer ({log.holder}) does not hold its lease (rival "
                "does); nothing of this batch was written"
            )
            with pytest.raises(LeaseLost):
                log.checkpoint(STREAM)
        finally:
            rival.close()
    assert len(stored_lines(store, STREAM)) == 1
