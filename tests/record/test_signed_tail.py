"""Every acknowledged entry is signed: the writer signs at every commit, the audit fails on
entries no checkpoint covers.

- the writer signs one checkpoint per stream per commit batch, in the batch's transaction, so
  every ``Appended`` carries a note that covers it, and appenders queued behind one commit
  share one signature;
- entries written into the SQLite file with public knowledge only (a whole forged stream, or
  a forged tail after the last checkpoint) are an ``unsigned_tail``: ``log verify`` exits 1
  and names the stream and the count, unless given ``--allow-unsigned-tail``;
- a store written before this change (checkpoints only at ``stream.opened``/``turn.ended``)
  still verifies with ``--allow-unsigned-tail``, its tail counted;
- key epochs must count 0, 1, 2 …: a skipped epoch, though signed, is ``malformed_entry``, in
  the reference audit and in the independent reader.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import independent_reader  # tests/record/independent_reader.py, a sibling
import pytest
import uuid6

from record import merkle
from record.audit import verify_store
from record.bundle import export_stream, verify_bundle
from record.checkpoint import Signer, Verifier, log_origin, open_checkpoint
from record.digest import Domain, digest
from record.log import Appended, Log, entry_line, origin_for
from record.schema import KeyRotated, StreamOpened, TurnStarted, WrappedKey
from record.seal import KeyPair, new_data_key
from tests.record.gated_store import GatedStore

STREAM = "session-signed"
FORGED = "session-forged"


def _started(turn: int) -> TurnStarted:
    text = b"question %d" % turn
    return TurnStarted(turn=turn, input_bytes=text, input_digest=digest(Domain.INPUT, text))


def _affidavit(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *map(str, args)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=cwd,
        timeout=120,
    )


def _covers(note: bytes, log: Log, appended: Appended) -> bool:
    """The note is the log key's and its tree holds ``appended`` at its position."""
    cp, _ = open_checkpoint(note, [log.signer.verifier()])
    leaves = log.store.leaf_hashes(appended.stream, cp.size)
    return (
        cp.origin == origin_for(log.signer, appended.stream)
        and cp.size > appended.seq
        and leaves[appended.seq] == appended.leaf_hash
        and merkle.root(leaves) == cp.root_hash
    )


def test_every_append_is_covered_and_a_batch_costs_one_signature(tmp_path: Path) -> None:
    user = KeyPair.generate()
    store = GatedStore(tmp_path / "record.db")
    signer = Signer.load_or_create(tmp_path / "key", "affidavit-log")
    with Log(store, signer, appliance_key=user) as log:
        opened = log.open_stream(STREAM, [user.recipient])
        assert opened.checkpoint is not None and _covers(opened.checkpoint, log, opened)
        plain = log.append(STREAM, _started(0))  # not a turn.ended: signed all the same
        assert plain.checkpoint is not None and _covers(plain.checkpoint, log, plain)

        store.gate.clear()
        store.entered.clear()
        results: list[Appended] = []
        first = threading.Thread(target=lambda: results.append(log.append(STREAM, _started(1))))
        first.start()
        assert store.entered.wait(30)  # the writer is inside the first commit, held
        queued = [
            threading.Thread(target=lambda t=t: results.append(log.append(STREAM, _started(t))))
            for t in range(2, 12)
        ]
        for thread in queued:
            thread.start()
        while log._queue.qsize() < len(queued):  # all ten wait behind the held commit
            threading.Event().wait(0.01)
        store.gate.set()
        for thread in [first, *queued]:
            thread.join(30)

        assert store.batches == [(1, 1), (1, 1), (1, 1), (10, 1)]  # one signature per batch
        assert len(results) == 11
        for appended in results:
            assert appended.checkpoint is not None and _covers(appended.checkpoint, log, appended)
        batched = [a for a in results if a.seq >= 3]
        assert len({a.checkpoint for a in batched}) == 1  # the ten share the batch's note
        assert [c.size for c in log.store.checkpoints(STREAM)] == [1, 2, 3, 13]
    report = verify_store(tmp_path / "record.db")
    assert report.ok, report.dumps()
    assert report.unsigned == {STREAM: 0}


@pytest.fixture
def signed_store(tmp_path: Path) -> tuple[Path, KeyPair]:
    user = KeyPair.generate()
    path = tmp_path / "record.db"
    with Log.open(path, appliance_key=user) as log:
        log.open_stream(STREAM, [user.recipient])
        for turn in range(3):
            log.append(STREAM, _started(turn))
    return path, user


def _insert(store: Path, stream: str, lines: list[bytes], start: int) -> None:
    """What anyone who can write the file can do: INSERT passes the append-only triggers."""
    conn = sqlite3.connect(store)
    try:
        with conn:
            conn.executemany(
                "INSERT INTO entries (stream, seq, line, leaf_hash) VALUES (?, ?, ?, ?)",
                [(stream, start + i, x, merkle.hash_leaf(x)) for i, x in enumerate(lines)],
            )
    finally:
        conn.close()


def _meta(store: Path, key: str) -> str:
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return str(conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0])
    finally:
        conn.close()


def _clear_line(stream: str, seq: int, body: StreamOpened | KeyRotated) -> bytes:
    envelope = {
        "schema_version": "1.0",
        "stream": stream,
        "seq": seq,
        "event_id": str(uuid6.uuid7()),
        "kind": body.kind,
        "occurred_at": "2026-12-01T12:00:00Z",
        "key_epoch": body.key_epoch,
    }
    line, _ = entry_line(envelope, body.model_dump(mode="json"))
    return line


def _wrapped(
    user: KeyPair, stream: str, epoch: int, data_key: bytes | None = None
) -> list[WrappedKey]:
    """A data key (a fresh one unless given) wrapped to ``user``'s public key."""
    sealed = user.recipient.wrap(data_key or new_data_key(), stream, epoch)
    return [WrappedKey(recipient=user.recipient.text(), sealed_key=sealed)]


def _forge_stream(store: Path, user: KeyPair) -> None:
    """A whole stream from public keys only: the log's vkey (meta) and the user's recipient."""
    vkey = _meta(store, "log_key")
    verifier = Verifier.from_vkey(vkey)
    opened = StreamOpened(
        origin=log_origin(verifier.name, verifier.key_id, FORGED),
        log_key=vkey,
        key_epoch=0,
        recipients=_wrapped(user, FORGED, 0),
        labels={},
    )
    rotated = KeyRotated(key_epoch=1, recipients=_wrapped(user, FORGED, 1))
    _insert(store, FORGED, [_clear_line(FORGED, 0, opened), _clear_line(FORGED, 1, rotated)], 0)


def test_a_forged_stream_fails_verify_naming_the_stream_and_count(
    signed_store: tuple[Path, KeyPair],
) -> None:
    store, user = signed_store
    _forge_stream(store, user)
    report = verify_store(store, key=user)  # with a key: every body is well-formed
    assert [(p.code, p.stream, p.seq) for p in report.problems] == [("unsigned_tail", FORGED, 0)]
    assert report.unsigned == {FORGED: 2, STREAM: 0}

    result = _affidavit("log", "verify", store, cwd=store.parent)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "unsigned_tail" in result.stdout and FORGED in result.stdout
    assert "2 of 2 entries" in result.stdout
    doc = json.loads(_affidavit("log", "verify", store, "--json", cwd=store.parent).stdout)
    assert doc["ok"] is False and doc["unsigned_tail"] == {FORGED: 2, STREAM: 0}


def test_a_forged_tail_after_the_last_checkpoint_fails_verify(
    signed_store: tuple[Path, KeyPair],
) -> None:
    store, user = signed_store
    rotated = KeyRotated(key_epoch=1, recipients=_wrapped(user, STREAM, 1))
    _insert(store, STREAM, [_clear_line(STREAM, 4, rotated)], 4)
    report = verify_store(store, key=user)
    assert [(p.code, p.stream, p.seq) for p in report.problems] == [("unsigned_tail", STREAM, 4)]
    assert report.unsigned == {STREAM: 1}
    result = _affidavit("log", "verify", store, "--json", cwd=store.parent)
    assert result.returncode == 1
    assert json.loads(result.stdout)["unsigned_tail"] == {STREAM: 1}


def _as_old_store(store: Path, keep: set[int]) -> None:
    """What a writer from before this change left: checkpoints only of the sizes in ``keep``
    (it signed at ``stream.opened`` and ``turn.ended``)."""
    conn = sqlite3.connect(store, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("DROP TRIGGER checkpoints_no_delete")
        marks = ",".join("?" * len(keep))
        conn.execute(f"DELETE FROM checkpoints WHERE size NOT IN ({marks})", tuple(keep))
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_an_old_store_verifies_only_when_its_unsigned_tail_is_allowed(
    signed_store: tuple[Path, KeyPair],
) -> None:
    store, _ = signed_store
    _as_old_store(store, {1})  # only stream.opened was signed; three entries after it
    strict = _affidavit("log", "verify", store, cwd=store.parent)
    assert strict.returncode == 1, strict.stdout
    assert "3 of 4 entries" in strict.stdout

    allowed = _affidavit("log", "verify", store, "--allow-unsigned-tail", cwd=store.parent)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert allowed.stdout.startswith("ok: ")
    assert f"allowed: {STREAM}: 3 entries no checkpoint covers" in allowed.stdout
    doc = json.loads(
        _affidavit(
            "log", "verify", store, "--allow-unsigned-tail", "--json", cwd=store.parent
        ).stdout
    )
    assert doc == {"ok": True, "entries": 4, "problems": [], "unsigned_tail": {STREAM: 3}}

    # The library says the same.
    report = verify_store(store, allow_unsigned_tail=True)
    assert report.ok and report.unsigned == {STREAM: 3}

    # Signing the tail now (the operator's on-demand checkpoint) covers it.
    signed = _affidavit("log", "checkpoint", STREAM, "--store", store, cwd=store.parent)
    assert signed.returncode == 0, signed.stderr
    assert _affidavit("log", "verify", store, cwd=store.parent).returncode == 0


def _skip_an_epoch(store: Path, user: KeyPair) -> int:
    """A key rotation to epoch 2 right after epoch 0, written and signed by the writer."""
    with Log.open(store, appliance_key=user) as log:
        data_key = new_data_key()
        body = KeyRotated(key_epoch=2, recipients=_wrapped(user, STREAM, 2, data_key))
        skipped = log._submit(STREAM, body, new_key=(2, data_key)).result()
        log.append(STREAM, _started(9))
    return skipped.seq


def test_a_skipped_key_epoch_is_malformed_for_the_audit_and_the_reader(
    signed_store: tuple[Path, KeyPair], tmp_path: Path
) -> None:
    store, user = signed_store
    seq = _skip_an_epoch(store, user)
    report = verify_store(store, key=user)
    assert [(p.code, p.seq) for p in report.problems] == [("malformed_entry", seq)]
    assert "expected 1" in report.problems[0].detail

    bundle = tmp_path / "bundle"
    export_stream(store, STREAM, bundle)
    assert {(p.code, p.seq) for p in verify_bundle(bundle).problems} == {("malformed_entry", seq)}
    pem = tmp_path / "user.pem"
    user.write(pem)
    independent = independent_reader.verify_bundle(bundle, private_key_pem=pem.read_bytes())
    assert [(code, at) for code, at, _ in independent.problems] == [("malformed_entry", seq)]


def test_consecutive_key_epochs_are_fine(
    signed_store: tuple[Path, KeyPair], tmp_path: Path
) -> None:
    """The control for the test above: the same log with epoch 1 instead of 2."""
    store, user = signed_store
    with Log.open(store, appliance_key=user) as log:
        log.rotate_key(STREAM, [user.recipient])
        log.append(STREAM, _started(9))
    assert verify_store(store, key=user).ok
    bundle = tmp_path / "bundle"
    export_stream(store, STREAM, bundle)
    pem = tmp_path / "user.pem"
    user.write(pem)
    assert independent_reader.verify_bundle(bundle, private_key_pem=pem.read_bytes()).ok
