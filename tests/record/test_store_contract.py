"""The log store contract, run against every backend: SQLite and PostgreSQL.

A new backend joins by adding an opener to ``BACKENDS``; every test here must then pass. The
PostgreSQL store runs against the run's private cluster (``tests/pg_server.py``), a fresh
database per test, so no test sees another's streams.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sqlite3
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from record.errors import LeaseHeld, LeaseLost, StoreMissing
from record.merkle import hash_leaf
from record.schema import utc_timestamp
from record.sqlite_store import SQLiteStore
from record.store import LogStore, PendingCheckpoint, PendingEntry, StoredCheckpoint

#: ``open_store(readonly=False)``: a store on this test's place; again, the same place.
Opener = Callable[..., LogStore]


def _sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    path = tmp_path / "contract.db"
    return lambda readonly=False: SQLiteStore(path, readonly=readonly)


def _postgresql(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    server = request.getfixturevalue("postgres_server")
    url = server.fresh_database()
    request.addfinalizer(lambda: server.drop_database(url))  # after its stores are closed
    from record.postgres_store import PostgresStore

    return lambda readonly=False: PostgresStore(url, readonly=readonly)


BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Opener]] = {
    "sqlite": _sqlite,
    "postgresql": _postgresql,
}


@pytest.fixture(params=sorted(BACKENDS))
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens stores of one backend on one fresh place; each is closed at the end."""
    opener = BACKENDS[request.param](request, tmp_path)
    opened: list[LogStore] = []

    def open_one(readonly: bool = False) -> LogStore:
        opened.append(opener(readonly=readonly))
        return opened[-1]

    yield open_one
    for made in opened:
        made.close()


@pytest.fixture
def store(open_store: Opener) -> LogStore:
    return open_store()


def pending(stream: str, payload: bytes = b"x") -> PendingEntry:
    def build(seq: int) -> tuple[bytes, bytes]:
        line = b'{"seq":%d,"p":"%s"}' % (seq, payload)
        return line, hash_leaf(line)

    return PendingEntry(stream, build)


def test_seq_is_gapless_per_stream_across_batches(store: LogStore) -> None:
    stored, _ = store.append([pending("a"), pending("b"), pending("a")])
    assert [(e.stream, e.seq) for e in stored] == [("a", 0), ("b", 0), ("a", 1)]
    stored, _ = store.append([pending("a"), pending("b")])
    assert [(e.stream, e.seq) for e in stored] == [("a", 2), ("b", 1)]
    assert [e.seq for e in store.entries("a")] == [0, 1, 2]
    assert store.size("a") == 3 and store.size("b") == 2 and store.size("c") == 0
    assert store.streams() == ["a", "b"]


def test_a_checkpoint_of_a_stream_the_batch_did_not_touch_is_over_its_stored_size(
    store: LogStore,
) -> None:
    store.append([pending("a"), pending("a"), pending("a")])
    _, signed = store.append(
        [pending("b")],
        [
            PendingCheckpoint("a", lambda size: b"a at %d" % size),
            PendingCheckpoint("b", lambda size: b"b at %d" % size),
            PendingCheckpoint("c", lambda size: b"c at %d" % size),
        ],
    )
    assert signed == [
        StoredCheckpoint("a", 3, b"a at 3"),
        StoredCheckpoint("b", 1, b"b at 1"),
        StoredCheckpoint("c", 0, b"c at 0"),
    ]


def test_build_sees_the_seq_it_is_stored_under(store: LogStore) -> None:
    store.append([pending("s"), pending("s")])
    for entry in store.entries("s"):
        assert entry.line.startswith(b'{"seq":%d,' % entry.seq)
        assert entry.leaf_hash == hash_leaf(entry.line)


def test_a_failing_batch_writes_nothing(store: LogStore) -> None:
    store.append([pending("s")])

    def explode(seq: int) -> tuple[bytes, bytes]:
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        store.append([pending("s"), PendingEntry("s", explode)])
    assert store.size("s") == 1
    stored, _ = store.append([pending("s")])
    assert stored[0].seq == 1  # the failed batch burnt no seq


def test_checkpoints_are_signed_after_the_batch_and_kept_in_order(store: LogStore) -> None:
    seen: list[int] = []

    def sign(size: int) -> bytes:
        seen.append(size)
        return b"note at %d" % size

    _, cps = store.append([pending("s"), pending("s")], [PendingCheckpoint("s", sign)])
    assert seen == [2] and cps[0].size == 2
    store.append([pending("s")], [PendingCheckpoint("s", sign)])
    assert [(c.size, c.note) for c in store.checkpoints("s")] == [
        (2, b"note at 2"),
        (3, b"note at 3"),
    ]


def test_range_reads_and_leaf_hashes(store: LogStore) -> None:
    store.append([pending("s", b"%d" % i) for i in range(10)])
    assert [e.seq for e in store.entries("s", 3, 6)] == [3, 4, 5]
    leaves = store.leaf_hashes("s")
    assert len(leaves) == 10
    assert store.leaf_hashes("s", stop=4) == leaves[:4]
    assert leaves == [e.leaf_hash for e in store.entries("s")]


def test_a_long_stream_reads_whole_and_in_order(store: LogStore) -> None:
    """More entries than one read page (PostgreSQL pages by 1024): none lost or repeated."""
    total = 2 * 1024 + 3
    store.append([pending("s", b"%d" % i) for i in range(total)])
    assert [e.seq for e in store.entries("s")] == list(range(total))
    assert [e.seq for e in store.entries("s", 1000, 2050)] == list(range(1000, 2050))
    assert [e.seq for e in store.entries("s", 1024, 1025)] == [1024]
    assert len(store.leaf_hashes("s")) == total


def test_meta_is_set_once(store: LogStore) -> None:
    store.set_meta("log_key", "k1")
    store.set_meta("log_key", "k1")  # the same value again is fine
    with pytest.raises(ValueError, match="already"):
        store.set_meta("log_key", "k2")
    assert store.get_meta("log_key") == "k1"
    assert store.get_meta("absent") is None


def test_evidence_is_kept_per_stream(store: LogStore) -> None:
    store.archive_evidence("s", "report.bin", b"\x00\xff")
    assert store.evidence("s") == [("report.bin", b"\x00\xff")]
    assert store.evidence("t") == []
    with pytest.raises(ValueError, match="plain file name"):
        store.archive_evidence("s", "../escape", b"")


def test_an_entrys_evidence_is_kept_with_it_or_not_at_all(store: LogStore) -> None:
    """The file an ``evidence.archived`` entry names goes in with the entry: a batch that
    fails after the file's insert leaves neither (a file no entry names would fail every
    bundle of the stream as ``evidence_unlisted``)."""

    def explode(seq: int) -> tuple[bytes, bytes]:
        raise RuntimeError("build failed")

    kept = pending("s")
    kept.evidence = ("report.bin", b"\x00\xff")
    with pytest.raises(RuntimeError, match="build failed"):
        store.append([kept, PendingEntry("s", explode)])
    assert store.evidence("s") == [] and store.size("s") == 0

    stored, _ = store.append([kept])
    assert stored[0].seq == 0
    assert store.evidence("s") == [("report.bin", b"\x00\xff")]
    bad = pending("s")
    bad.evidence = ("../escape", b"")
    with pytest.raises(ValueError, match="plain file name"):
        store.append([pending("s"), bad])
    assert store.size("s") == 1  # the batch with it is refused whole


def test_readers_see_only_committed_batches_while_a_write_is_open(store: LogStore) -> None:
    store.append([pending("s")])
    inside = threading.Event()
    release = threading.Event()
    observed: list[int] = []

    def slow_build(seq: int) -> tuple[bytes, bytes]:
        inside.set()
        release.wait(10)
        line = b'{"seq":%d}' % seq
        return line, hash_leaf(line)

    writer = threading.Thread(target=store.append, args=([PendingEntry("s", slow_build)],))
    writer.start()
    assert inside.wait(10)
    observed.append(store.size("s"))  # a reader, mid-transaction: not blocked, sees 1
    release.set()
    writer.join(10)
    observed.append(store.size("s"))
    assert observed == [1, 2]


def test_sqlite_refuses_updates_and_deletes(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.append([pending("s")])
    store.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE entries SET line = x'00'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM entries")
    conn.close()


def test_readonly_store_refuses_writes_and_missing_files(tmp_path: Path) -> None:
    from record.errors import StoreMissing

    with pytest.raises(StoreMissing, match="does not exist"):
        SQLiteStore(tmp_path / "absent.db", readonly=True)
    SQLiteStore(tmp_path / "s.db").close()
    ro = SQLiteStore(tmp_path / "s.db", readonly=True)
    with pytest.raises(PermissionError, match="read-only"):
        ro.append([pending("s")])
    ro.close()


def test_a_readonly_store_needs_a_record_and_refuses_every_write(open_store: Opener) -> None:
    with pytest.raises(StoreMissing):
        open_store(readonly=True)  # nothing written there yet: no record to audit
    writer = open_store()
    writer.append([pending("s")])
    writer.set_meta("log_key", "k1")
    ro = open_store(readonly=True)
    for write in (
        lambda: ro.append([pending("s")]),
        lambda: ro.set_meta("log_key", "k1"),
        lambda: ro.archive_evidence("s", "report.bin", b""),
    ):
        with pytest.raises(PermissionError, match="was opened read-only"):
            write()
    assert [e.seq for e in ro.entries("s")] == [0] and ro.get_meta("log_key") == "k1"
    writer.close()
    with pytest.raises(PermissionError, match="was closed"):
        writer.append([pending("s")])


def test_concurrent_appenders_to_one_stream_get_gapless_distinct_seqs(
    open_store: Opener,
) -> None:
    """Two writers (two stores on one place, as two processes would be) append batches to
    one stream at the same moments: every seq is taken once, none is skipped, each batch's
    seqs are consecutive and its checkpoint covers exactly the entries before it."""
    batches, per_batch = 15, 3
    stores = [open_store(), open_store()]
    start = threading.Barrier(len(stores))
    got: list[list[int]] = [[], []]
    sizes: list[list[int]] = [[], []]
    failures: list[BaseException] = []

    def appender(i: int) -> None:
        try:
            for _ in range(batches):
                start.wait(10)  # both begin their transactions together
                stored, cps = stores[i].append(
                    [pending("s", b"w%d" % i) for _ in range(per_batch)],
                    [PendingCheckpoint("s", lambda size: b"note at %d" % size)],
                )
                seqs = [e.seq for e in stored]
                assert seqs == list(range(seqs[0], seqs[0] + per_batch))
                assert cps[0].size == seqs[-1] + 1
                got[i].extend(seqs)
                sizes[i].append(cps[0].size)
        except BaseException as exc:
            failures.append(exc)
            start.abort()

    threads = [threading.Thread(target=appender, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    total = len(stores) * batches * per_batch
    assert sorted(got[0] + got[1]) == list(range(total))
    assert [e.seq for e in stores[0].entries("s")] == list(range(total))
    assert sorted(c.size for c in stores[1].checkpoints("s")) == sorted(sizes[0] + sizes[1])


# -- PostgreSQL only -----------------------------------------------------------------------------


@pytest.fixture
def pg_url(postgres_server: Any) -> Iterator[str]:
    url: str = postgres_server.fresh_database()
    yield url
    postgres_server.drop_database(url)


def test_postgres_durability_settings_are_in_force(pg_url: str) -> None:
    """``fsync`` is on at the server, and ``synchronous_commit`` is on for the store's
    connections even where the database's own default turned it off."""
    import psycopg
    from psycopg import sql

    from record.postgres_store import DURABILITY_SETTINGS, PostgresStore

    alter = sql.SQL("ALTER DATABASE {} SET synchronous_commit = off")
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(alter.format(sql.Identifier(pg_url.rsplit("/", 1)[1])))
    with psycopg.connect(pg_url, autocommit=True) as conn:  # what a plain session gets now
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        assert conn.execute("SHOW fsync").fetchone() == ("on",)
    store = PostgresStore(pg_url)
    try:
        assert DURABILITY_SETTINGS == {"fsync": "on", "synchronous_commit": "on"}
        assert store.writer_pragmas() == {"fsync": "on", "synchronous_commit": "on"}
    finally:
        store.close()


def test_postgres_refuses_updates_deletes_and_truncates(pg_url: str) -> None:
    import psycopg

    from record.postgres_store import PostgresStore

    store = PostgresStore(pg_url)
    store.append([pending("s")], [PendingCheckpoint("s", lambda size: b"n")])
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for statement in (
            "UPDATE entries SET line = '\\x00'",
            "DELETE FROM entries",
            "TRUNCATE entries",
            "UPDATE checkpoints SET note = '\\x00'",
            "DELETE FROM checkpoints",
            "TRUNCATE checkpoints",
        ):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(statement)  # type: ignore[arg-type]
        assert conn.execute("SELECT count(*) FROM entries").fetchone() == (1,)


def test_postgres_names_itself_without_the_password(postgres_server: Any, pg_url: str) -> None:
    from record.postgres_store import PostgresStore

    with pytest.raises(StoreMissing) as refused:
        PostgresStore(pg_url, readonly=True)
    dbname = pg_url.rsplit("/", 1)[1]
    where = f"postgresql://affidavit@127.0.0.1:{postgres_server.port}/{dbname}"
    assert str(refused.value) == f"store {where} holds no record (no entries table)"
    assert postgres_server.password not in str(refused.value)


def test_the_log_and_its_audit_run_unchanged_on_postgres(pg_url: str, write_turn: Any) -> None:
    """Sealing, Merkle trees and checkpoints above the store do not change with it: a log
    written in two runs (the second recovers its tree and key from the store) audits clean,
    bodies opened with the user's key."""
    from record.audit import Row, check_stream
    from record.checkpoint import Signer
    from record.log import LOG_KEY_NAME, Log
    from record.postgres_store import PostgresStore
    from record.seal import KeyPair

    user, appliance = KeyPair.generate(), KeyPair.generate()
    signer = Signer.generate(LOG_KEY_NAME)
    with Log(PostgresStore(pg_url), signer, appliance_key=appliance) as log:
        log.open_stream("session-main", [user.recipient, appliance.recipient])
        write_turn(log, "session-main", 0)
    with Log(PostgresStore(pg_url), signer, appliance_key=appliance) as log:
        last = write_turn(log, "session-main", 1)
    assert last[-1].seq == 16
    ro = PostgresStore(pg_url, readonly=True)
    try:
        rows = (Row(e.line, e.seq, e.leaf_hash) for e in ro.entries("session-main"))
        notes = [(f"#{i}", c.note) for i, c in enumerate(ro.checkpoints("session-main"))]
        # a shared store keeps no one log key: the stream's own is its appliance's
        assert ro.get_meta("log_key") is None
        audit = check_stream("session-main", rows, notes, signer.vkey(), key=user)
    finally:
        ro.close()
    assert audit.problems == [] and (audit.entries, audit.covered) == (17, 17)


def test_postgres_opens_beside_a_writer_without_deadlocking_it(pg_url: str) -> None:
    """A store opened while another appends (an appliance restarting beside a running one)
    runs no DDL on the tables in use: the running writer's batches, entries then their
    checkpoint, never wait on it."""
    from record.postgres_store import PostgresStore

    running = PostgresStore(pg_url)
    stop, failures = threading.Event(), list[BaseException]()

    def write() -> None:
        try:
            while not stop.is_set():
                running.append([pending("busy")], [PendingCheckpoint("busy", lambda n: b"%d" % n)])
        except BaseException as exc:
            failures.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(20):
            PostgresStore(pg_url).close()
    finally:
        stop.set()
        writer.join(30)
        running.close()
    assert not failures, failures


def test_concurrent_batches_without_checkpoints_take_distinct_seqs(open_store: Opener) -> None:
    """The stream is held for a batch of entries alone, not only when it also signs."""
    stores = [open_store(), open_store()]
    start = threading.Barrier(len(stores))
    failures: list[BaseException] = []

    def appender(i: int) -> None:
        try:
            for _ in range(15):
                start.wait(10)
                stores[i].append([pending("s", b"w%d" % i) for _ in range(3)])
        except BaseException as exc:
            failures.append(exc)
            start.abort()

    threads = [threading.Thread(target=appender, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    assert [e.seq for e in stores[0].entries("s")] == list(range(90))


def test_what_is_read_names_its_stream(store: LogStore) -> None:
    store.append([pending("a"), pending("b")], [PendingCheckpoint("b", lambda n: b"%d" % n)])
    assert [e.stream for e in store.entries("a")] == ["a"]
    assert [c.stream for c in store.checkpoints("b")] == ["b"]


def test_postgres_readers_are_read_only_at_the_server(pg_url: str) -> None:
    """A read-only store's sessions refuse a write themselves, whatever asks them."""
    import psycopg

    from record.postgres_store import PostgresStore

    PostgresStore(pg_url).close()  # the tables
    reader = PostgresStore(pg_url, readonly=True)
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction), reader._pool.connection() as c:
            c.execute("INSERT INTO meta (key, value) VALUES ('planted', 'x')")
    finally:
        reader.close()


def test_postgres_keeps_the_options_a_url_gives_beside_its_own(pg_url: str) -> None:
    from record.postgres_store import PostgresStore

    url = f"{pg_url}?options=-c%20statement_timeout%3D12345"
    for readonly in (False, True):
        store = PostgresStore(url, readonly=readonly)
        try:
            with store._pool.connection() as conn:
                shown = [
                    conn.execute(f"SHOW {name}").fetchone()
                    for name in ("statement_timeout", "synchronous_commit")
                ]
            assert shown == [("12345ms",), ("on",)]
        finally:
            store.close()


# -- one writer per stream: leases ------------------------------------------------------------


def test_a_lease_is_one_holders_and_a_second_live_one_is_refused(open_store: Opener) -> None:
    first, second = open_store(), open_store()
    assert first.take_lease("a", "first") is None  # nobody held it before
    with pytest.raises(LeaseHeld) as caught:
        second.take_lease("a", "second", wait=0.2)
    assert type(caught.value) is LeaseHeld
    assert "stream 'a' is being written by another live process (first, since " in str(caught.value)
    assert second.take_lease("b", "second", wait=0) is None  # another stream is free
    lease = second.lease("a")
    assert lease is not None and (lease.holder, lease.released) == ("first", False)


def test_every_batch_checks_its_writers_lease_inside_the_transaction(open_store: Opener) -> None:
    store = open_store()
    store.take_lease("a", "me")
    stored, _ = store.append([pending("a")], holder="me")
    assert [e.seq for e in stored] == [0]
    for holder, stream, refused, who in (
        ("someone else", "a", "a", "me"),
        ("me", "unleased", "unleased", "nobody"),
    ):
        with pytest.raises(LeaseLost) as caught:
            store.append([pending(stream), pending("a")], holder=holder)
        assert "nothing of this batch was written" in str(caught.value)
        assert str(caught.value) == (
            f"stream {refused!r}: this writer ({holder}) does not hold its lease ({who} does); "
            "nothing of this batch was written"
        )
    assert store.size("a") == 1 and store.size("unleased") == 0
    # a checkpoint alone is a write to its stream too
    with pytest.raises(LeaseLost):
        store.append([], [PendingCheckpoint("unleased", lambda size: b"note")], holder="me")
    assert store.checkpoints("unleased") == []


def test_a_released_lease_passes_on_with_nothing_to_record(open_store: Opener) -> None:
    first = open_store()
    first.take_lease("a", "first")
    first.take_lease("b", "first")
    first.release_leases("first")
    lease = first.lease("a")
    assert lease is not None and lease.released
    with pytest.raises(LeaseLost):  # let go means let go: its batches are refused now
        first.append([pending("a")], holder="first")
    second = open_store()
    assert second.take_lease("a", "second", wait=0) is None
    assert second.take_lease("b", "second", wait=0) is None


def test_a_holder_that_never_let_go_is_named_to_the_next_taker(open_store: Opener) -> None:
    """A writer that ends without releasing (here: its store closed, as a crash closes its
    file and its session) frees the stream at once, and the taker learns who it was."""
    first = open_store()
    first.take_lease("a", "crashed")
    held = first.lease("a")
    first.close()
    second = open_store()
    orphaned = second.take_lease("a", "next", wait=5)
    assert orphaned == held and orphaned is not None and not orphaned.released
    again = second.take_lease("a", "next", wait=0)  # taking one's own lease again: no news
    assert again is None


def test_a_waiting_taker_gets_the_stream_once_its_holder_lets_go(open_store: Opener) -> None:
    first, second = open_store(), open_store()
    first.take_lease("a", "first")
    letting_go = threading.Timer(0.3, first.release_leases, ("first",))
    started = time.monotonic()
    letting_go.start()
    try:
        assert second.take_lease("a", "second", wait=10) is None  # let go: nothing to record
    finally:
        letting_go.join()
    assert time.monotonic() - started >= 0.25  # it waited for the holder
    lease = second.lease("a")
    assert lease is not None and (lease.holder, lease.released) == ("second", False)
    assert [e.seq for e in second.append([pending("a")], holder="second")[0]] == [0]


def test_leases_of_many_streams_are_held_apart(open_store: Opener) -> None:
    first, second = open_store(), open_store()
    streams = [f"s-{n}" for n in range(16)]
    for n, stream in enumerate(streams):
        (first, second)[n % 2].take_lease(stream, ("first", "second")[n % 2], wait=0)
    for n, stream in enumerate(streams):
        lease = first.lease(stream)
        assert lease is not None and lease.holder == ("first", "second")[n % 2]
        assert lease.released is False and lease.stream == stream
        with pytest.raises(LeaseHeld):  # each still the taker's
            (second, first)[n % 2].take_lease(stream, "third", wait=0)
    first.release_leases("first")
    for n, stream in enumerate(streams):
        lease = second.lease(stream)
        assert lease is not None and lease.released is (n % 2 == 0)


def test_a_store_takes_a_lease_again_after_letting_go(open_store: Opener) -> None:
    store = open_store()
    store.take_lease("a", "me")
    store.release_leases("me")
    assert store.take_lease("a", "me", wait=0) is None
    lease = store.lease("a")
    assert lease is not None and (lease.holder, lease.released) == ("me", False)
    assert [e.seq for e in store.append([pending("a")], holder="me")[0]] == [0]
    other = open_store()
    with pytest.raises(LeaseHeld):  # held again, by its lock as by its row
        other.take_lease("a", "other", wait=0)


def test_a_readonly_store_reads_the_lease_rows(open_store: Opener) -> None:
    open_store().take_lease("a", "me")
    reader = open_store(readonly=True)
    lease = reader.lease("a")
    assert lease is not None and (lease.stream, lease.holder, lease.released) == ("a", "me", False)
    assert reader.lease("b") is None


@pytest.mark.skipif(not hasattr(fcntl, "F_OFD_SETLK"), reason="no OFD locks here")
def test_sqlite_leases_are_one_byte_locks_on_a_private_file_beside_the_store(
    tmp_path: Path,
) -> None:
    """The byte is the first six bytes of the stream name's SHA-256, big-endian: any process
    that locks it (open-file-description locks) holds the stream, and only that byte."""
    path = tmp_path / "contract.db"
    store = SQLiteStore(path)
    try:
        store.take_lease("a", "me")
        leases = tmp_path / "contract.db-leases"
        assert stat.S_IMODE(leases.stat().st_mode) == 0o600
        offset = int.from_bytes(hashlib.sha256(b"b").digest()[:6], "big")
        fd = os.open(leases, os.O_RDWR)
        try:
            for start, length in ((offset - 1, 1), (offset + 1, 1)):  # its neighbours
                lock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
            assert store.take_lease("b", "me", wait=0) is None
            other = SQLiteStore(path)
            try:
                fcntl.fcntl(
                    fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_UNLCK, 0, 0, 0, 0)
                )
                offset_c = int.from_bytes(hashlib.sha256(b"c").digest()[:6], "big")
                lock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, offset_c, 1, 0)
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
                with pytest.raises(LeaseHeld) as caught:  # no row: nobody named
                    other.take_lease("c", "other", wait=0)
                assert "(another writer)" in str(caught.value)
            finally:
                other.close()
        finally:
            os.close(fd)
    finally:
        store.close()


def test_a_readonly_or_closed_store_takes_and_lets_go_of_no_lease(open_store: Opener) -> None:
    writer = open_store()
    writer.take_lease("a", "me")
    ro = open_store(readonly=True)
    writes: list[Callable[[], object]] = [
        lambda: ro.take_lease("b", "me", wait=0),
        lambda: ro.release_leases("me"),
    ]
    for write in writes:
        with pytest.raises(PermissionError, match="was opened read-only"):
            write()
    lease = ro.lease("a")
    assert lease is not None and lease.released is False and ro.lease("b") is None
    writer.close()
    writes = [lambda: writer.take_lease("b", "me", wait=0), lambda: writer.release_leases("me")]
    for write in writes:
        with pytest.raises(PermissionError, match="was closed"):
            write()
    lease = ro.lease("a")
    assert lease is not None and lease.released is False  # closed is not let go


def test_postgres_a_lease_changes_hands_only_between_batches_of_its_stream(pg_url: str) -> None:
    """Taking a lease row waits for a batch of the stream that is open (which holds the
    stream's transaction lock), so no batch checks a lease that changes hands under it."""
    import psycopg

    from record.postgres_store import PostgresStore

    store = PostgresStore(pg_url)
    taken: list[object] = []
    try:
        with psycopg.connect(pg_url) as batch:  # a batch of stream "a", open
            batch.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (0x41666664, "a"))
            taker = threading.Thread(target=lambda: taken.append(store.take_lease("a", "me")))
            taker.start()
            taker.join(0.5)
            assert taker.is_alive() and taken == []  # waits for the batch
            assert store.lease("a") is None
            batch.commit()
            taker.join(10)
        assert taken == [None]
        lease = store.lease("a")
        assert lease is not None and (lease.holder, lease.released) == ("me", False)
    finally:
        store.close()


def test_a_lease_row_says_when_it_was_taken(open_store: Opener) -> None:
    store = open_store()
    before = utc_timestamp()
    store.take_lease("a", "me")
    after = utc_timestamp()
    lease = store.lease("a")
    assert lease is not None and before <= lease.since <= after  # RFC 3339 UTC sorts as text
    with pytest.raises(LeaseHeld) as caught:
        open_store().take_lease("a", "other", wait=0)
    assert f"(me, since {lease.since})" in str(caught.value)


def test_sqlite_a_failed_lease_statement_leaves_no_transaction_open(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "contract.db")
    try:
        bad: Any = ["not", "text"]
        with pytest.raises(sqlite3.ProgrammingError):
            store.take_lease("a", bad)
        with pytest.raises(sqlite3.ProgrammingError):
            store.release_leases(bad)
        assert store.lease("a") is None
        assert store.take_lease("a", "me") is None  # the writer is not left in a transaction
        store.release_leases("me")
        lease = store.lease("a")
        assert lease is not None and lease.released is True
    finally:
        store.close()


_TRY_LOCKS = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
for start in map(int, sys.argv[2:]):
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, start)
        print("free")
    except OSError:
        print("held")
"""


def test_sqlite_without_ofd_locks_a_lease_is_the_processs_lock_on_its_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where there are no open-file-description locks (macOS), the lease is a POSIX lock on
    the same byte: another process is refused it, and only it."""
    monkeypatch.delattr(fcntl, "F_OFD_SETLK", raising=False)
    path = tmp_path / "contract.db"
    store = SQLiteStore(path)
    try:
        assert store.take_lease("a", "me", wait=0) is None
        offset = int.from_bytes(hashlib.sha256(b"a").digest()[:6], "big")
        starts = [str(n) for n in (offset - 1, offset, offset + 1)]
        child = subprocess.run(
            [sys.executable, "-c", _TRY_LOCKS, f"{path}-leases", *starts],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        assert child.stdout.split() == ["free", "held", "free"]
    finally:
        store.close()


def test_postgres_the_lease_session_commits_durably_too(pg_url: str) -> None:
    """The lease row is written on the lease's own session, which gets the store's session
    settings like every other: ``synchronous_commit`` on even where the database's default
    turned it off."""
    import psycopg
    from psycopg import sql

    from record.postgres_store import PostgresStore

    alter = sql.SQL("ALTER DATABASE {} SET synchronous_commit = off")
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(alter.format(sql.Identifier(pg_url.rsplit("/", 1)[1])))
    store = PostgresStore(pg_url)
    try:
        store.take_lease("a", "me")
        session = store._lease_conn  # the connection that holds the leases' locks
        assert session is not None
        assert session.execute("SHOW synchronous_commit").fetchone() == ("on",)
    finally:
        store.close()
