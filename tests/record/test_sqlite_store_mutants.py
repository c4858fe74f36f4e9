"""``record.sqlite_store`` where ``make mutate`` showed the contract tests did not hold it.

What the store hands back (each entry and checkpoint with its stream and bytes), a checkpoint
of a stream the batch did not touch, refusals word for word, a failed evidence insert that
leaves the store usable, readers opened once per thread and closed from any thread, and a
store closed twice. Real SQLite files throughout.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from record.merkle import hash_leaf
from record.sqlite_store import SQLiteStore
from record.store import PendingCheckpoint, PendingEntry, StoredCheckpoint, StoredEntry


def _pending(stream: str, payload: bytes = b"x") -> PendingEntry:
    def build(seq: int) -> tuple[bytes, bytes]:
        line = b'{"seq":%d,"p":"%s"}' % (seq, payload)
        return line, hash_leaf(line)

    return PendingEntry(stream, build)


def _line(seq: int, payload: bytes = b"x") -> bytes:
    return b'{"seq":%d,"p":"%s"}' % (seq, payload)


def test_append_returns_what_it_stored_and_shows_it_as_built(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    built: list[StoredEntry] = []
    stored, signed = store.append(
        [_pending("a", b"1"), _pending("b", b"2")],
        [PendingCheckpoint("a", lambda size: b"note a %d" % size)],
        on_built=built.append,
    )
    expected = [
        StoredEntry("a", 0, _line(0, b"1"), hash_leaf(_line(0, b"1"))),
        StoredEntry("b", 0, _line(0, b"2"), hash_leaf(_line(0, b"2"))),
    ]
    assert stored == expected and built == expected
    assert signed == [StoredCheckpoint("a", 1, b"note a 1")]
    assert list(store.entries("a")) == expected[:1]
    assert list(store.entries("b")) == expected[1:]
    assert store.checkpoints("a") == signed
    store.close()


def test_a_checkpoint_of_a_stream_the_batch_did_not_touch_covers_what_is_stored(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.append([_pending("a"), _pending("a"), _pending("a")])
    sizes: list[int] = []

    def sign(size: int) -> bytes:
        sizes.append(size)
        return b"note %d" % size

    _, signed = store.append(
        [_pending("b")], [PendingCheckpoint("a", sign), PendingCheckpoint("c", sign)]
    )
    assert sizes == [3, 0]
    assert signed == [StoredCheckpoint("a", 3, b"note 3"), StoredCheckpoint("c", 0, b"note 0")]
    assert store.checkpoints("a") == signed[:1] and store.checkpoints("c") == signed[1:]
    assert store.streams() == ["a", "b", "c"]
    store.close()


def test_a_read_only_store_refuses_each_write_word_for_word(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    SQLiteStore(path).close()
    ro = SQLiteStore(path, readonly=True)
    refusal = f"store {path} was opened read-only"
    for write in (
        lambda: ro.append([_pending("s")]),
        lambda: ro.set_meta("k", "v"),
        lambda: ro.archive_evidence("s", "r.bin", b"d"),
    ):
        with pytest.raises(PermissionError) as caught:
            write()
        assert str(caught.value) == refusal
    with pytest.raises(AssertionError) as failed:
        ro.writer_pragmas()
    assert str(failed.value) == "store is read-only"
    ro.close()


def test_a_closed_store_says_it_is_closed_not_read_only(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    store.close()
    for write in (
        lambda: store.append([_pending("s")]),
        lambda: store.set_meta("k", "v"),
        lambda: store.archive_evidence("s", "r.bin", b"d"),
    ):
        with pytest.raises(PermissionError) as caught:
            write()
        assert str(caught.value) == f"store {path} was closed"


def test_evidence_named_twice_is_refused_and_the_store_goes_on(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.archive_evidence("s", "r.bin", b"one")
    with pytest.raises(sqlite3.IntegrityError):
        store.archive_evidence("s", "r.bin", b"two")
    store.archive_evidence("s", "q.bin", b"three")  # no transaction was left open
    store.set_meta("k", "v")
    assert store.evidence("s") == [("q.bin", b"three"), ("r.bin", b"one")]
    store.close()
    again = SQLiteStore(tmp_path / "s.db", readonly=True)
    assert again.evidence("s") == [("q.bin", b"three"), ("r.bin", b"one")]
    assert again.get_meta("k") == "v"
    again.close()


def test_reads_name_their_stream(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.append([_pending("a")], [PendingCheckpoint("a", lambda size: b"n")])
    assert [e.stream for e in store.entries("a", 0, 1)] == ["a"]
    assert [c.stream for c in store.checkpoints("a")] == ["a"]
    store.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to count files")
def test_a_thread_reads_through_one_connection(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.append([_pending("a")])
    store.size("a")
    before = _open_fds()
    for _ in range(30):
        assert store.size("a") == 1
        assert len(list(store.entries("a"))) == 1
    assert _open_fds() - before < 5  # a connection a read would leave 60 files open
    store.close()


def test_readers_of_other_threads_are_closed_by_the_closing_thread(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.append([_pending("a")])
    sizes: list[int] = []
    reader = threading.Thread(target=lambda: sizes.append(store.size("a")))
    reader.start()
    reader.join()
    assert sizes == [1]
    store.close()  # closes the other thread's connection too, without a thread error
    assert not (tmp_path / "s.db-wal").exists()


def test_a_store_closed_twice_stays_closed(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.append([_pending("a")])
    store.close()
    store.close()
    with pytest.raises(PermissionError):
        store.append([_pending("a")])
