"""The audit names each problem with the entry it concerns, for a store and for a bundle.

Every test runs on real SQLite files written by ``record.log.Log`` (real sealing, real
Ed25519 checkpoints), copied and then tampered with the way someone holding the file could:
with SQL on the store (``DROP TRIGGER`` first where a row must change or go; an INSERT
passes the append-only triggers as they are) or by editing the files of an exported bundle.
``verify`` is ``record.audit.verify_store`` for a store file and
``record.bundle.verify_bundle`` for a bundle directory. Each test asserts the exact set of
``(code, seq)`` pairs reported, so a problem named at the wrong entry fails as surely as a
missed one.

The logs (stream ``session-main``; each turn is 8 entries and ends with ``turn.ended``; the
writer signs a checkpoint at every commit, and these appends come one at a time, so there is
a checkpoint of every size 1, 2, 3 …):

* ``base``: ``stream.opened``, turn 0 (9 entries), turn 1 (17); a copy taken between turn 0
  and turn 1 is kept as the *rolled-back* log (9 entries).
* ``fork_a`` / ``fork_b``: two copies of ``base`` (same signing key) that each append
  turns 2 and 3 with different content: their checkpoints of sizes 18 … 33 disagree.

A change at position ``k`` leaves the checkpoints of sizes up to ``k`` matching; every larger
one has another root, and the entries from ``k`` on are an unsigned tail.
"""

from __future__ import annotations

import base64
import json
import shutil
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import uuid6

from record import merkle
from record.audit import Report, verify_store
from record.bundle import export_stream, verify_bundle
from record.checkpoint import Checkpoint, Signer, open_checkpoint, sign_checkpoint
from record.digest import Domain, canonical_json, digest
from record.log import LOG_KEY_NAME, Appended, Log, entry_line, origin_for
from record.reader import StreamKeys
from record.schema import TurnStarted, parse_entry
from record.seal import KeyPair, seal
from record.sqlite_store import SQLiteStore

STREAM = "session-main"
TARGETS = ("store", "bundle")

WriteTurn = Callable[..., list[Appended]]
Problems = set[tuple[str, int | None]]


# -- building the logs -------------------------------------------------------------------------


def _key_file(store: Path) -> Path:
    return store.with_name(store.name + ".signing-key")


def _settle(store: Path) -> None:
    """Fold the WAL into the file (the writer's read-only connection closes last, leaving it)."""
    conn = sqlite3.connect(store)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    assert not store.with_name(store.name + "-wal").exists()


def _copy_store(src: Path, folder: Path) -> Path:
    """A copy of a closed store and its signing key (mode 0600 kept), in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    dst = folder / src.name
    shutil.copyfile(src, dst)
    shutil.copy2(_key_file(src), _key_file(dst))
    return dst


@dataclass(frozen=True)
class Logs:
    user: KeyPair
    appliance: KeyPair
    base: Path
    rolled_back: Path  # base as it was after turn 0: 9 entries
    kept: dict[int, bytes]  # checkpoints handed out by the writer, by tree size
    fork_a: Path
    fork_b: Path
    fork_b_notes: dict[int, bytes]  # fork_b's own checkpoints, by tree size
    signer: Signer  # the log's signing key, read from the key file

    def checkpoint_sizes(self, store: Path) -> list[int]:
        db = SQLiteStore(store, readonly=True)
        try:
            return [c.size for c in db.checkpoints(STREAM)]
        finally:
            db.close()


def _notes(turns: list[list[Appended]]) -> dict[int, bytes]:
    out = {}
    for turn in turns:
        assert turn[-1].checkpoint is not None
        out[turn[-1].tree_size] = turn[-1].checkpoint
    return out


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory, write_turn: WriteTurn) -> Logs:
    root = tmp_path_factory.mktemp("audit-logs")
    user, appliance = KeyPair.generate(), KeyPair.generate()
    base = root / "base" / "record.db"
    base.parent.mkdir()
    with Log.open(base, appliance_key=appliance) as log:
        opened = log.open_stream(STREAM, [user.recipient, appliance.recipient])
        assert opened.checkpoint is not None
        kept = {1: opened.checkpoint, **_notes([write_turn(log, STREAM, 0)])}
    _settle(base)
    rolled_back = _copy_store(base, root / "rolled-back")
    with Log.open(base, appliance_key=appliance) as log:
        kept |= _notes([write_turn(log, STREAM, 1)])
    _settle(base)

    forks = {}
    for tag in ("a", "b"):
        fork = _copy_store(base, root / f"fork-{tag}")
        with Log.open(fork, appliance_key=appliance) as log:
            turns = [write_turn(log, STREAM, t, tag=f" ({tag})".encode()) for t in (2, 3)]
        _settle(fork)
        forks[tag] = (fork, _notes(turns))
    kept |= forks["a"][1]  # the kept checkpoints follow fork_a, the log that went on

    signer = Signer.from_skey(_key_file(base).read_text())
    assert signer.vkey() == _meta(base, "log_key")
    return Logs(
        user,
        appliance,
        base,
        rolled_back,
        kept,
        forks["a"][0],
        forks["b"][0],
        forks["b"][1],
        signer,
    )


def _meta(store: Path, key: str) -> str | None:
    db = SQLiteStore(store, readonly=True)
    try:
        return db.get_meta(key)
    finally:
        db.close()


def _rows(store: Path) -> list[tuple[bytes, bytes]]:
    db = SQLiteStore(store, readonly=True)
    try:
        return [(e.line, e.leaf_hash) for e in db.entries(STREAM)]
    finally:
        db.close()


# -- tampering and verifying, for either target ------------------------------------------------


def _subject(
    target: str,
    store: Path,
    folder: Path,
    *,
    rows: Mapping[int, tuple[bytes, bytes] | None] | None = None,
    extra_note: bytes | None = None,
) -> Path:
    """A tampered copy of ``store`` (target "store") or of its exported bundle ("bundle").

    ``rows``: seq -> new ``(line, leaf_hash)`` of that row, or None to delete it (a bundle
    gets the same lines, in seq order). ``extra_note``: one more checkpoint, inserted.
    """
    folder.mkdir(parents=True, exist_ok=True)
    if target == "store":
        path = _copy_store(store, folder)
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN")
            if rows:
                conn.execute("DROP TRIGGER entries_no_update")
                conn.execute("DROP TRIGGER entries_no_delete")
            for seq, row in (rows or {}).items():
                if row is None:
                    cur = conn.execute(
                        "DELETE FROM entries WHERE stream = ? AND seq = ?", (STREAM, seq)
                    )
                else:
                    cur = conn.execute(
                        "UPDATE entries SET line = ?, leaf_hash = ? WHERE stream = ? AND seq = ?",
                        (row[0], row[1], STREAM, seq),
                    )
                assert cur.rowcount == 1
            if extra_note is not None:  # the triggers let an INSERT through
                size = int(extra_note.split(b"\n")[1])
                conn.execute(
                    "INSERT INTO checkpoints (stream, size, note) VALUES (?, ?, ?)",
                    (STREAM, size, extra_note),
                )
            conn.execute("COMMIT")
        finally:
            conn.close()
        return path
    bundle = folder / "bundle"
    export_stream(store, STREAM, bundle)
    if rows:
        kept_lines = []
        for seq, (line, _) in enumerate(_rows(store)):
            row = rows.get(seq, (line, b""))
            if row is not None:
                kept_lines.append(row[0])
        (bundle / "entries.jsonl").write_bytes(b"".join(line + b"\n" for line in kept_lines))
        # bundle.json is an index, not evidence: a tamperer keeps its count in step.
        index = json.loads((bundle / "bundle.json").read_bytes())
        index["entries"] = len(kept_lines)
        (bundle / "bundle.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    if extra_note is not None:
        count = len(list((bundle / "checkpoints").glob("*.note")))
        (bundle / "checkpoints" / f"{count:06d}.note").write_bytes(extra_note)
    return bundle


def _verify(
    target: str, path: Path, *, key: KeyPair | None = None, kept: list[bytes] | None = None
) -> Report:
    if target == "store":
        return verify_store(path, key=key, kept=kept or ())
    return verify_bundle(path, key=key, kept=kept or ())


def _problems(report: Report) -> Problems:
    assert {p.stream for p in report.problems} <= {STREAM}, report.dumps()
    return {(p.code, p.seq) for p in report.problems}


def _broken_from(logs: Logs, position: int) -> Problems:
    """What a change at ``position`` of ``base`` breaks: every checkpoint larger than it, and
    the entries from it on, which no matching checkpoint covers any more."""
    sizes = logs.checkpoint_sizes(logs.base)
    assert sizes == list(range(1, 18)), "one checkpoint per commit"
    return {("root_mismatch", size - 1) for size in sizes if size > position} | {
        ("unsigned_tail", position)
    }


def _changed(row: tuple[bytes, bytes], offset: int, new: bytes) -> tuple[bytes, bytes]:
    """The row with one byte of its line changed (its stored leaf hash left as it was)."""
    line, leaf = row
    assert len(new) == 1 and line[offset : offset + 1] != new
    return line[:offset] + new + line[offset + 1 :], leaf


# -- clean logs, keys --------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("with_key", ["none", "user", "appliance"])
def test_clean_log_verifies(logs: Logs, target: str, with_key: str, tmp_path: Path) -> None:
    key = {"none": None, "user": logs.user, "appliance": logs.appliance}[with_key]
    path = _subject(target, logs.base, tmp_path)
    report = _verify(target, path, key=key)
    assert report.ok, report.dumps()
    assert report.problems == []
    assert report.entries == 17
    assert report.streams == [STREAM]


@pytest.mark.parametrize("target", TARGETS)
def test_wrong_key_cannot_open(logs: Logs, target: str, tmp_path: Path) -> None:
    stranger = KeyPair.generate()  # not a recipient of the stream
    report = _verify(target, _subject(target, logs.base, tmp_path), key=stranger)
    assert _problems(report) == {("cannot_open", None)}
    # Without a key the same log is fine: the failure is the key's, not the log's.
    assert _verify(target, _subject(target, logs.base, tmp_path / "again")).ok


# -- entries -----------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_seq_gap(logs: Logs, target: str, tmp_path: Path) -> None:
    """A writer that skips seq 18: a valid, sealed entry at 19 follows 17 (INSERT only)."""
    store = _copy_store(logs.base, tmp_path / "gap")
    with Log.open(store, appliance_key=logs.appliance) as log:
        seventeen = log.append(STREAM, _turn_started(2))  # signed: a checkpoint of size 18
    _settle(store)
    assert seventeen.seq == 17
    entries = [parse_entry(line) for line, _ in _rows(store)]
    data_key = StreamKeys.collect(STREAM, entries, logs.user).keys[0]
    envelope = entries[17].model_dump(mode="json", exclude={"body"})
    envelope |= {"seq": 19, "event_id": str(uuid6.uuid7())}
    plaintext = canonical_json(_turn_started(3).model_dump(mode="json"))
    sealed = seal(data_key, plaintext, canonical_json(envelope))
    line, _ = entry_line(envelope, base64.b64encode(sealed).decode("ascii"))
    conn = sqlite3.connect(store)
    try:
        with conn:
            conn.execute(
                "INSERT INTO entries (stream, seq, line, leaf_hash) VALUES (?, ?, ?, ?)",
                (STREAM, 19, line, merkle.hash_leaf(line)),
            )
    finally:
        conn.close()

    path = _subject(target, store, tmp_path / "subject")
    # The inserted entry is the 19th row: no checkpoint covers it.
    expected = {("seq_gap", 18), ("unsigned_tail", 18)}
    assert _problems(_verify(target, path)) == expected
    # Every body still opens and matches its digests: nothing else is wrong.
    assert _problems(_verify(target, path, key=logs.user)) == expected


def _turn_started(turn: int) -> TurnStarted:
    text = b"and then turn %d" % turn
    return TurnStarted(turn=turn, input_bytes=text, input_digest=digest(Domain.INPUT, text))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("part", ["envelope", "body"])
def test_changed_byte_in_entry(logs: Logs, target: str, part: str, tmp_path: Path) -> None:
    """One byte of entry 10 (covered by the checkpoint of size 17) changed."""
    row = _rows(logs.base)[10]
    line = row[0]
    if part == "envelope":  # the last digit of occurred_at's microseconds
        offset = line.index(b'Z","schema_version"') - 1
        new = b"%d" % ((line[offset] - ord("0") + 1) % 10)
    else:  # a base64 character of the sealed body
        offset = len(b'{"body":"') + 20
        new = b"A" if line[offset : offset + 1] != b"A" else b"B"
    path = _subject(target, logs.base, tmp_path, rows={10: _changed(row, offset, new)})

    expected = _broken_from(logs, 10)
    if target == "store":  # the stored leaf hash is the old line's
        expected.add(("leaf_mismatch", 10))
    assert _problems(_verify(target, path)) == expected
    # With a key the body no longer opens: its envelope is the AEAD's associated data.
    assert _problems(_verify(target, path, key=logs.user)) == expected | {("cannot_open", 10)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("field", ["origin", "log_key", "sealed_key"])
def test_changed_byte_in_clear_stream_opened(
    logs: Logs, target: str, field: str, tmp_path: Path
) -> None:
    """A byte of ``stream.opened``'s clear body changed: the signed checkpoints still name it.

    Every checkpoint covers entry 0, so the first (size 1) has another root than the tree.
    """
    row = _rows(logs.base)[0]
    line = row[0]
    offset = line.index(b'"%s":"' % field.encode()) + len(field) + 4 + 1
    new = b"b" if line[offset : offset + 1] != b"b" else b"c"
    path = _subject(target, logs.base, tmp_path, rows={0: _changed(row, offset, new)})

    problems = _problems(_verify(target, path))
    expected = _broken_from(logs, 0)
    if target == "store":
        expected.add(("leaf_mismatch", 0))
    assert expected <= problems, problems
    # A changed origin or log key also makes stream.opened itself wrong (or the checkpoints
    # look foreign): allowed, as long as it names entry 0 or no entry.
    also = {(code, seq) for code in ("malformed_entry", "checkpoint_invalid") for seq in (0, None)}
    assert problems <= expected | also, problems


@pytest.mark.parametrize("target", TARGETS)
def test_deleted_entry(logs: Logs, target: str, tmp_path: Path) -> None:
    path = _subject(target, logs.base, tmp_path, rows={5: None})
    # Sizes 6 … 16 no longer match; the one of size 17 covers more than the 16 left.
    broken = _broken_from(logs, 5) - {("root_mismatch", 16)}
    assert _problems(_verify(target, path)) == {("seq_gap", 5), ("truncated", 16)} | broken


@pytest.mark.parametrize("target", TARGETS)
def test_reordered_entries(logs: Logs, target: str, tmp_path: Path) -> None:
    rows = _rows(logs.base)
    path = _subject(target, logs.base, tmp_path, rows={5: rows[6], 6: rows[5]})
    expected: Problems = {("seq_order", 5)} | _broken_from(logs, 5)
    if target == "store":  # the row stored at seq 5 holds entry 6
        expected.add(("seq_order", 6))
    assert _problems(_verify(target, path)) == expected


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dropped", [1, 3, 8, 17])
def test_tail_truncated_behind_last_checkpoint(
    logs: Logs, target: str, dropped: int, tmp_path: Path
) -> None:
    """The last ``dropped`` entries go: every checkpoint larger than what is left says so.

    A bundle left with no line at all is also malformed (docs/record.md §12 step 2)."""
    left = 17 - dropped
    path = _subject(target, logs.base, tmp_path, rows=dict.fromkeys(range(left, 17)))
    report = _verify(target, path)
    empty = {("malformed_bundle", None)} if target == "bundle" and left == 0 else set()
    assert _problems(report) == {("truncated", left)} | empty
    larger = [size for size in logs.checkpoint_sizes(logs.base) if size > left]
    assert len(report.problems) == len(larger) + len(empty)


# -- checkpoints -------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_checkpoint_not_signed_by_log_key(logs: Logs, target: str, tmp_path: Path) -> None:
    """The true size, root and origin of the log, signed by another key of the same name."""
    real, _ = open_checkpoint(logs.kept[17], [logs.signer.verifier()])
    impostor = Signer.generate(LOG_KEY_NAME)
    forged = sign_checkpoint(impostor, real)
    path = _subject(target, logs.base, tmp_path, extra_note=forged)
    assert _problems(_verify(target, path)) == {("checkpoint_invalid", None)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("size", [20, 25])
def test_two_checkpoints_not_consistent(logs: Logs, target: str, size: int, tmp_path: Path) -> None:
    """A checkpoint over fork_b, signed by the log key, added to fork_a (33 entries).

    Size 25: fork_b's own checkpoint, which gives fork_a's size 25 a second root. Size 20:
    signed here over fork_b's first 20 entries, a size fork_a has no checkpoint of.
    """
    if size == 25:
        note = logs.fork_b_notes[25]
    else:
        leaves = [leaf for _, leaf in _rows(logs.fork_b)[:size]]
        origin = origin_for(logs.signer, STREAM)
        note = sign_checkpoint(logs.signer, Checkpoint(origin, size, merkle.root(leaves)))
    fork, _ = open_checkpoint(note, [logs.signer.verifier()])  # validly signed by the log key
    assert fork.size == size
    assert fork.root_hash != merkle.root([leaf for _, leaf in _rows(logs.fork_a)[:size]])

    path = _subject(target, logs.fork_a, tmp_path, extra_note=note)
    assert _problems(_verify(target, path)) == {("checkpoint_inconsistent", size - 1)}


@pytest.mark.parametrize("target", TARGETS)
def test_body_digest_mismatch_with_key(
    logs: Logs, target: str, write_turn: WriteTurn, tmp_path: Path
) -> None:
    """A reply whose ``response_digest`` is of other bytes, appended and sealed by the writer."""
    store = _copy_store(logs.base, tmp_path / "digest")
    with Log.open(store, appliance_key=logs.appliance) as log:
        turn = write_turn(log, STREAM, 2, wrong_digest=True)
    _settle(store)
    wrong = turn[6].seq  # the turn's final model.response
    assert (turn[6].kind, wrong) == ("model.response", 23)
    path = _subject(target, store, tmp_path / "subject")

    assert _verify(target, path).ok  # the bytes are intact: only a key can see this
    report = _verify(target, path, key=logs.user)
    assert _problems(report) == {("body_digest_mismatch", wrong)}
    assert "response_digest" in report.problems[0].detail


# -- against a checkpoint kept earlier ---------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_against_kept_checkpoints_after_more_appends(
    logs: Logs, target: str, tmp_path: Path
) -> None:
    """Checkpoints kept at 1, 9 and 17 entries; the log has grown to 33 since."""
    kept = [logs.kept[size] for size in (1, 9, 17)]
    path = _subject(target, logs.fork_a, tmp_path)
    report = _verify(target, path, kept=kept)
    assert report.ok, report.dumps()
    assert report.entries == 33


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kept_size", [17, 33])
def test_against_rolled_back_log(logs: Logs, target: str, kept_size: int, tmp_path: Path) -> None:
    """A copy of the store from before the kept checkpoint (9 entries) is a rollback."""
    path = _subject(target, logs.rolled_back, tmp_path)
    assert _verify(target, path).ok  # on its own the old copy is a consistent log
    report = _verify(target, path, kept=[logs.kept[kept_size]])
    assert _problems(report) == {("truncated", 9)}
    assert "rolled back" in report.problems[0].detail


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kept_size", [25, 33])
def test_against_forked_log(logs: Logs, target: str, kept_size: int, tmp_path: Path) -> None:
    """fork_b has as many entries as fork_a, other content, checkpoints by the same key."""
    path = _subject(target, logs.fork_b, tmp_path)
    assert _verify(target, path).ok  # on its own the fork is a consistent log
    report = _verify(target, path, kept=[logs.kept[kept_size]])
    problems = _problems(report)
    assert ("checkpoint_inconsistent", kept_size - 1) in problems, problems
    # At 33 (fork_b's own size) the kept root is also not fork_b's tree at that size.
    allowed = {("checkpoint_inconsistent", kept_size - 1), ("root_mismatch", kept_size - 1)}
    assert problems <= allowed, problems
    if kept_size == 25:  # fork_b's checkpoint at 33 proves its tree at 25: a plain fork
        assert problems == {("checkpoint_inconsistent", 24)}


def test_a_huge_claimed_seq_is_a_gap_reported_without_walking_the_range() -> None:
    """A tampered line may claim seq 10**15: the audit names gaps and counts the rest."""
    from record.audit import Row, audit_stream
    from record.log import entry_line

    def line(seq: int) -> bytes:
        envelope = {
            "schema_version": "1.0",
            "stream": "s",
            "seq": seq,
            "event_id": "017f22e2-79b0-7cc3-98c4-dc0c0c07398f",
            "kind": "turn.started",
            "occurred_at": "2026-07-22T09:30:00.000000Z",
            "key_epoch": 0,
        }
        return entry_line(envelope, "AAAA")[0]

    problems = audit_stream("s", [Row(line(0)), Row(line(10**15))], [], None)
    gaps = [p for p in problems if p.code == "seq_gap"]
    assert [p.seq for p in gaps[:3]] == [1, 2, 3]
    assert gaps[-1].seq is None and gaps[-1].detail == f"… and {10**15 - 1 - 50} more"
