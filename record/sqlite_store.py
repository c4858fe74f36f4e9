"""The embedded default store: one SQLite file, WAL, every commit fsynced.

Durability: ``journal_mode=WAL`` and ``synchronous=FULL`` on the writer's connection while it
is open, so a commit returns only after the WAL is fsynced; ``seq`` is read and the row
inserted in one ``BEGIN IMMEDIATE`` transaction. A clean close folds the WAL back and leaves
the file in rollback-journal mode, which read-only openers (``mode=ro``) never write to. Readers use their own connections and, under WAL, never
block the writer. Triggers refuse any UPDATE or DELETE, so the file is append-only unless
someone edits it by hand (which ``record.audit`` then catches).

One writer connection per store object: it is used from one thread at a time
(``record.log`` runs all appends on its writer thread and groups concurrent appenders into
one commit). One writer per stream across processes: a stream's lease is a lock on one byte
of ``<file>-leases`` (the byte is the stream name's hash), held on the open file description
(Linux's OFD locks; the kernel drops it when the process ends, however it ends) and a row in
``leases`` that says who took it and whether they let go.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from record.errors import StoreMissing
from record.schema import utc_timestamp
from record.store import (
    LEASE_WAIT_S,
    Lease,
    LogStore,
    PendingCheckpoint,
    PendingEntry,
    StoredCheckpoint,
    StoredEntry,
    check_evidence_name,
    claim,
    lease_held,
    write_batch,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    stream    TEXT    NOT NULL,
    seq       INTEGER NOT NULL,
    line      BLOB    NOT NULL,
    leaf_hash BLOB    NOT NULL,
    PRIMARY KEY (stream, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    id     INTEGER PRIMARY KEY,
    stream TEXT    NOT NULL,
    size   INTEGER NOT NULL,
    note   BLOB    NOT NULL
);
CREATE TABLE IF NOT EXISTS evidence (
    stream TEXT NOT NULL,
    name   TEXT NOT NULL,
    data   BLOB NOT NULL,
    PRIMARY KEY (stream, name)
);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    stream   TEXT    PRIMARY KEY,
    holder   TEXT    NOT NULL,
    since    TEXT    NOT NULL,
    released INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS entries_no_update BEFORE UPDATE ON entries
    BEGIN SELECT RAISE(ABORT, 'the record is append-only'); END;
CREATE TRIGGER IF NOT EXISTS entries_no_delete BEFORE DELETE ON entries
    BEGIN SELECT RAISE(ABORT, 'the record is append-only'); END;
CREATE TRIGGER IF NOT EXISTS checkpoints_no_update BEFORE UPDATE ON checkpoints
    BEGIN SELECT RAISE(ABORT, 'the record is append-only'); END;
CREATE TRIGGER IF NOT EXISTS checkpoints_no_delete BEFORE DELETE ON checkpoints
    BEGIN SELECT RAISE(ABORT, 'the record is append-only'); END;
"""

#: What the writer's connection must have in force (a test asserts each one).
PAGE_SIZE = 16384
DURABILITY_PRAGMAS = {"journal_mode": "wal", "synchronous": 2}  # 2 = FULL

# The statements, named once here (module constants, out of the functions a mutation run
# changes: SQLite reads keywords in any case, so each case mutant would be equivalent).
_WRITER_PRAGMAS = (
    f"PRAGMA page_size={PAGE_SIZE}",
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA fullfsync=ON",  # macOS: F_FULLFSYNC; a no-op elsewhere
)
_WAIT_FOR_LOCKS = "PRAGMA busy_timeout=10000"
_MAP_READS = "PRAGMA mmap_size=268435456"  # audits read every byte: map, don't copy
_NO_WAIT = "PRAGMA busy_timeout=0"
_LEAVE_WAL = "PRAGMA journal_mode=DELETE"
_BEGIN, _COMMIT, _ROLLBACK = "BEGIN IMMEDIATE", "COMMIT", "ROLLBACK"
_INSERT_EVIDENCE = "INSERT INTO evidence (stream, name, data) VALUES (?, ?, ?)"
_INSERT_ENTRY = "INSERT INTO entries (stream, seq, line, leaf_hash) VALUES (?, ?, ?, ?)"
_INSERT_CHECKPOINT = "INSERT INTO checkpoints (stream, size, note) VALUES (?, ?, ?)"
_INSERT_META = "INSERT INTO meta (key, value) VALUES (?, ?)"
_SIZE = "SELECT COALESCE(MAX(seq) + 1, 0) FROM entries WHERE stream = ?"
_META = "SELECT value FROM meta WHERE key = ?"
_ENTRIES = (
    "SELECT seq, line, leaf_hash FROM entries WHERE stream = ? AND seq >= ?"
    " AND (? < 0 OR seq < ?) ORDER BY seq"
)
_STREAMS = "SELECT stream FROM entries UNION SELECT stream FROM checkpoints ORDER BY stream"
_LEAF_HASHES = "SELECT leaf_hash FROM entries WHERE stream = ? AND (? < 0 OR seq < ?) ORDER BY seq"
_CHECKPOINTS = "SELECT size, note FROM checkpoints WHERE stream = ? ORDER BY id"
_EVIDENCE = "SELECT name, data FROM evidence WHERE stream = ? ORDER BY name"
_LEASE = "SELECT holder, since, released FROM leases WHERE stream = ?"
_PUT_LEASE = "INSERT OR REPLACE INTO leases (stream, holder, since, released) VALUES (?, ?, ?, ?)"
_RELEASE = "UPDATE leases SET released = 1 WHERE holder = ?"

# ``struct flock`` as Linux lays it out on 64-bit machines (type, whence, start, len, pid):
# Python's fcntl module takes it packed, and no library wraps open-file-description locks.
_FLOCK = struct.Struct("hhqqi4x")
#: How often a waiting ``take_lease`` tries the lock again.
_LEASE_POLL_S = 0.05


class SQLiteStore(LogStore):
    """A store in one SQLite file. ``readonly=True`` opens an existing file for audit."""

    def __init__(self, path: Path | str, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly and not self.path.is_file():
            raise StoreMissing(f"store {self.path} does not exist")
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []  # every thread's, so close() ends them all
        self._readers_lock = threading.Lock()
        self._writer: sqlite3.Connection | None = None
        self._lease_fd: int | None = None  # ``<file>-leases``, opened at the first lease
        if not readonly:
            self._writer = self._connect(readonly=False)
            self._writer.executescript(_SCHEMA)

    # -- connections ---------------------------------------------------------------------------

    def _connect(self, *, readonly: bool) -> sqlite3.Connection:
        if readonly:
            uri = f"file:{self.path}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        else:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            # Entries are kilobytes each: big pages keep a line in one page instead of a chain
            # of overflow pages, which is what an audit pays for. Only takes effect on a new file.
            for pragma in _WRITER_PRAGMAS:
                conn.execute(pragma)
        conn.execute(_WAIT_FOR_LOCKS)
        if readonly:
            conn.execute(_MAP_READS)
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect(readonly=True)
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def _writable(self) -> sqlite3.Connection:
        """The writer's connection, or why there is none: opened read-only, or closed."""
        if self._writer is None:
            why = "opened read-only" if self.readonly else "closed"
            raise PermissionError(f"store {self.path} was {why}")
        return self._writer

    def writer_pragmas(self) -> dict[str, object]:
        """The durability settings in force on the writer's connection."""
        assert self._writer is not None, "store is read-only"
        return {
            name: self._writer.execute(f"PRAGMA {name}").fetchone()[0]
            for name in DURABILITY_PRAGMAS
        }

    # -- writing -------------------------------------------------------------------------------

    def append(
        self,
        entries: Sequence[PendingEntry],
        checkpoints: Sequence[PendingCheckpoint] = (),
        on_built: Callable[[StoredEntry], None] | None = None,
        holder: str | None = None,
    ) -> tuple[list[StoredEntry], list[StoredCheckpoint]]:
        conn = self._writable()
        conn.execute(_BEGIN)
        try:
            written = write_batch(_Batch(conn), entries, checkpoints, on_built, holder)
            conn.execute(_COMMIT)
        except BaseException:
            conn.execute(_ROLLBACK)
            raise
        return written

    def take_lease(self, stream: str, holder: str, *, wait: float = LEASE_WAIT_S) -> Lease | None:
        conn = self._writable()
        if self._lease_fd is None:
            self._lease_fd = os.open(
                f"{self.path}-leases", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
        offset = _lease_byte(stream)
        deadline = time.monotonic() + wait
        while not _lock_byte(self._lease_fd, offset):
            if time.monotonic() >= deadline:
                raise lease_held(stream, self._lease_row(conn, stream))
            time.sleep(_LEASE_POLL_S)
        conn.execute(_BEGIN)
        try:
            taken, orphaned = claim(stream, self._lease_row(conn, stream), holder, utc_timestamp())
            conn.execute(_PUT_LEASE, (stream, taken.holder, taken.since, 0))
            conn.execute(_COMMIT)
        except BaseException:
            conn.execute(_ROLLBACK)
            raise
        return orphaned

    def release_leases(self, holder: str) -> None:
        conn = self._writable()
        conn.execute(_BEGIN)
        try:
            conn.execute(_RELEASE, (holder,))
            conn.execute(_COMMIT)
        except BaseException:
            conn.execute(_ROLLBACK)
            raise
        self._drop_locks()

    def _drop_locks(self) -> None:
        if self._lease_fd is not None:
            os.close(self._lease_fd)  # drops every lock taken through it
            self._lease_fd = None

    @staticmethod
    def _lease_row(conn: sqlite3.Connection, stream: str) -> Lease | None:
        row = conn.execute(_LEASE, (stream,)).fetchone()
        return None if row is None else Lease(stream, str(row[0]), str(row[1]), bool(row[2]))

    def lease(self, stream: str) -> Lease | None:
        return self._lease_row(self._reader(), stream)

    def writer_alive(self, stream: str) -> bool:
        try:  # a description of its own: closing it lets go of a lock taken to look
            fd = os.open(f"{self.path}-leases", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False  # no writer ever took a lease here
        try:
            return not _lock_byte(fd, _lease_byte(stream))
        finally:
            os.close(fd)

    @staticmethod
    def _size(conn: sqlite3.Connection, stream: str) -> int:
        row = conn.execute(_SIZE, (stream,)).fetchone()
        return int(row[0])

    def set_meta(self, key: str, value: str) -> None:
        conn = self._writable()
        conn.execute(_BEGIN)
        try:
            row = conn.execute(_META, (key,)).fetchone()
            if row is None:
                conn.execute(_INSERT_META, (key, value))
            elif row[0] != value:
                raise ValueError(f"store {self.path}: {key} is already {row[0]!r}")
            conn.execute(_COMMIT)
        except BaseException:
            conn.execute(_ROLLBACK)
            raise

    def archive_evidence(self, stream: str, name: str, data: bytes) -> None:
        conn = self._writable()
        check_evidence_name(name)
        conn.execute(_BEGIN)
        try:
            conn.execute(_INSERT_EVIDENCE, (stream, name, data))
            conn.execute(_COMMIT)
        except BaseException:
            conn.execute(_ROLLBACK)
            raise

    # -- reading -------------------------------------------------------------------------------

    def entries(
        self, stream: str, start: int = 0, stop: int | None = None
    ) -> Iterator[StoredEntry]:
        stop = -1 if stop is None else stop
        cur = self._reader().execute(_ENTRIES, (stream, start, stop, stop))
        for seq, line, leaf in cur:
            yield StoredEntry(stream, seq, bytes(line), bytes(leaf))

    def streams(self) -> list[str]:
        # A stream whose entries were all deleted still has its checkpoints: list it too.
        rows = self._reader().execute(_STREAMS)
        return [r[0] for r in rows]

    def size(self, stream: str) -> int:
        return self._size(self._reader(), stream)

    def leaf_hashes(self, stream: str, stop: int | None = None) -> list[bytes]:
        stop = -1 if stop is None else stop
        rows = self._reader().execute(_LEAF_HASHES, (stream, stop, stop))
        return [bytes(r[0]) for r in rows]

    def checkpoints(self, stream: str) -> list[StoredCheckpoint]:
        rows = self._reader().execute(_CHECKPOINTS, (stream,))
        return [StoredCheckpoint(stream, int(size), bytes(note)) for size, note in rows]

    def evidence(self, stream: str) -> list[tuple[str, bytes]]:
        rows = self._reader().execute(_EVIDENCE, (stream,))
        return [(str(name), bytes(data)) for name, data in rows]

    def get_meta(self, key: str) -> str | None:
        row = self._reader().execute(_META, (key,)).fetchone()
        return None if row is None else str(row[0])

    def close(self) -> None:
        """Close every reader connection, whichever thread opened it, and then the writer.

        The writer goes last: the last connection to close folds the WAL back into the main
        file, and only a writable one can, so a closed store is one self-contained file.
        """
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
        self._local = threading.local()
        self._drop_locks()
        if self._writer is not None:
            self._leave_wal(self._writer)
            self._writer.close()
            self._writer = None

    @staticmethod
    def _leave_wal(conn: sqlite3.Connection) -> None:
        """Fold the WAL into the file and leave it in rollback-journal mode.

        A read-only connection to a WAL database creates ``-wal`` and ``-shm`` files beside it
        (it needs the shared index); to a rollback-journal one it writes nothing at all, so an
        audit or a replay of a closed store leaves every byte and every file as it was. The
        next writer turns WAL back on. Another process still reading keeps the file in WAL
        mode: then nothing is changed, and nothing waits.
        """
        try:
            conn.execute(_NO_WAIT)
            conn.execute(_LEAVE_WAL)
        except sqlite3.OperationalError:
            pass  # busy: someone else has the store open; it stays in WAL mode


def _lease_byte(stream: str) -> int:
    """The byte of ``<file>-leases`` whose lock is ``stream``'s lease."""
    return int.from_bytes(hashlib.sha256(stream.encode()).digest()[:6], "big")


def _lock_byte(fd: int, offset: int) -> bool:
    """Take a write lock on one byte of ``fd``'s file without waiting; False when another
    holds it. The lock belongs to the open file description (``F_OFD_SETLK``): a second
    store object in the same process is refused like another process would be."""
    request = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    try:
        if hasattr(fcntl, "F_OFD_SETLK"):
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
        else:  # no OFD locks (macOS): the process's own lock, which suffices across processes
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


class _Batch:
    """The writer's open transaction, as ``write_batch`` writes a batch into it."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def leases(self, streams: Sequence[str]) -> dict[str, Lease]:
        rows = (SQLiteStore._lease_row(self._conn, stream) for stream in streams)
        return {row.stream: row for row in rows if row is not None}  # in-process: no trips

    def size(self, stream: str) -> int:
        return SQLiteStore._size(self._conn, stream)

    def insert_evidence(self, stream: str, name: str, data: bytes) -> None:
        self._conn.execute(_INSERT_EVIDENCE, (stream, name, data))

    def insert_entry(self, entry: StoredEntry) -> None:
        self._conn.execute(_INSERT_ENTRY, (entry.stream, entry.seq, entry.line, entry.leaf_hash))

    def insert_checkpoint(self, checkpoint: StoredCheckpoint) -> None:
        self._conn.execute(
            _INSERT_CHECKPOINT, (checkpoint.stream, checkpoint.size, checkpoint.note)
        )
