"""The log store contract, run against every backend (SQLite today; PostgreSQL next).

A new backend joins by adding a factory to ``BACKENDS``; every test here must then pass.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from record.merkle import hash_leaf
from record.sqlite_store import SQLiteStore
from record.store import LogStore, PendingCheckpoint, PendingEntry

BACKENDS: dict[str, Callable[[Path], LogStore]] = {
    "sqlite": lambda tmp: SQLiteStore(tmp / "contract.db"),
}


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogStore]:
    made = BACKENDS[request.param](tmp_path)
    yield made
    made.close()


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
