"""Reading a store writes nothing: not the file, not a ``-wal``, not a ``-shm``.

Replay (``egress_proxy.replay.read_stream``, what reconstruct reads through) and the audit
open the store with a read-only SQLite URI (``mode=ro``). A read-only connection to a WAL
database would still create ``-wal`` and ``-shm`` beside it, so the writer leaves a closed
store in rollback-journal mode; these tests hash all three files before and after, and show
that a write through the replay's own store is refused by SQLite itself.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

import egress_proxy.replay
import record.backends
from record.audit import verify_store
from record.digest import Domain, digest
from record.log import Log
from record.schema import TurnStarted
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore

STREAM = "session-ro"
SUFFIXES = ("", "-wal", "-shm")


def _files(store: Path) -> dict[str, str | None]:
    """sha256 of the database and of its -wal and -shm (None: the file does not exist)."""
    out: dict[str, str | None] = {}
    for suffix in SUFFIXES:
        path = store.with_name(store.name + suffix)
        out[suffix or "db"] = (
            hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
        )
    return out


def _write(store: Path, user: KeyPair, turns: int) -> None:
    with Log.open(store, appliance_key=user) as log:
        if not log.store.size(STREAM):
            log.open_stream(STREAM, [user.recipient])
        for turn in range(turns):
            text = b"turn %d" % turn
            started = TurnStarted(
                turn=turn, input_bytes=text, input_digest=digest(Domain.INPUT, text)
            )
            log.append(STREAM, started)


@pytest.fixture
def closed_store(tmp_path: Path) -> tuple[Path, KeyPair]:
    user = KeyPair.generate()
    store = tmp_path / "record.db"
    _write(store, user, 3)
    return store, user


def test_a_closed_store_is_one_file(closed_store: tuple[Path, KeyPair]) -> None:
    store, _ = closed_store
    files = _files(store)
    assert files["db"] is not None and files["-wal"] is None and files["-shm"] is None


def test_replay_and_audit_of_a_closed_store_change_no_file(
    closed_store: tuple[Path, KeyPair],
) -> None:
    store, user = closed_store
    before = _files(store)
    bodies = egress_proxy.replay.read_stream(store, STREAM, user)
    assert [seq for seq, _ in bodies] == [0, 1, 2, 3]
    assert verify_store(store, key=user).ok
    assert _files(store) == before


def test_the_next_writer_goes_back_to_wal(closed_store: tuple[Path, KeyPair]) -> None:
    store, user = closed_store
    with Log.open(store, appliance_key=user) as log:
        assert isinstance(log.store, SQLiteStore)
        assert log.store.writer_pragmas()["journal_mode"] == "wal"
        log.append(
            STREAM, TurnStarted(turn=9, input_bytes=b"", input_digest=digest(Domain.INPUT, b""))
        )
    assert egress_proxy.replay.read_stream(store, STREAM, user)[-1][0] == 4


def test_reading_a_live_store_adds_nothing_to_the_file_or_its_wal(tmp_path: Path) -> None:
    """While the writer holds the store (WAL mode), readers share its -shm index, which is
    theirs to update; the database and the WAL, the data, stay byte for byte."""
    user = KeyPair.generate()
    store = tmp_path / "record.db"
    with Log.open(store, appliance_key=user) as log:
        log.open_stream(STREAM, [user.recipient])
        before = _files(store)
        assert before["-wal"] is not None
        egress_proxy.replay.read_stream(store, STREAM, user)
        after = _files(store)
        assert (after["db"], after["-wal"]) == (before["db"], before["-wal"])


def test_a_write_through_the_replays_store_is_refused_by_sqlite(
    closed_store: tuple[Path, KeyPair], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, user = closed_store
    opened: list[SQLiteStore] = []

    class Kept(SQLiteStore):
        """The real store class; only remembers the instances replay opens."""

        def __init__(self, *args: object, **kwargs: bool) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            opened.append(self)

    monkeypatch.setattr(record.backends, "SQLiteStore", Kept)  # what replay opens stores with
    before = _files(store)
    egress_proxy.replay.read_stream(store, STREAM, user)
    (replays,) = opened
    assert replays.readonly
    with pytest.raises(PermissionError):
        replays.set_meta("planted", "x")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        replays._reader().execute("INSERT INTO meta (key, value) VALUES ('planted', 'x')")
    replays.close()
    assert _files(store) == before
