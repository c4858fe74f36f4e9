"""A store on PostgreSQL, behind the same contract as the SQLite file (``record.store``).

Needs the ``postgres`` extra (``psycopg`` 3 and its pool); nothing else of the record imports
this module, so the base package installs and audits without it.

Tables and guarantees are SQLite's: ``entries`` keyed by ``(stream, seq)``, ``checkpoints``,
``evidence`` and ``meta``; triggers refuse any UPDATE, DELETE or TRUNCATE of entries and
checkpoints, so the record is append-only to anyone who does not drop the triggers (which
``record.audit`` then catches). Each ``append`` is one transaction:

- ``seq`` is ``max + 1`` inside that transaction, never drawn from a sequence (a
  rolled-back transaction would burn its values and leave a gap): read there, or, for a
  leased writer's later batches, known from its batch before and checked there
  (``affidavit_expect`` fails the transaction when the stream's size or lease changed);
- before reading it, the transaction takes a transaction-level advisory lock per stream it
  touches, all of them at once in sorted order (so two batches never deadlock), so two
  processes appending to one stream wait for each other instead of reading the same ``max``;
  ``PRIMARY KEY (stream, seq)`` would refuse the second one anyway;
- the commit returns only once its WAL record is flushed to disk: every connection runs with
  ``synchronous_commit=on``, and ``writer_pragmas()`` reports it and the server's ``fsync``.

Group commit comes from two places, neither of them new here. Within one appliance,
``record.log.Log`` queues every appender of the store on its writer thread and writes what
arrived during a commit as the next batch, one transaction, so one WAL flush covers many
entries; the batch goes in pipeline mode, so its inserts cost no round trip each, and a
leased writer's batch after its first waits on nothing before its commit. Across appliances
sharing one server, PostgreSQL groups concurrent commits itself:
the backend that flushes the WAL flushes every commit record written so far, so those
waiting behind it find theirs already durable; ``commit_delay``/``commit_siblings`` (server
settings, off by default) make it wait a little to gather more.

Readers take their own pooled connections and, under MVCC, never block the writer nor see an
uncommitted batch.

One writer per stream, across every appliance sharing the database: a stream's lease is a
session-level advisory lock, held on a connection of its own for as long as the writer runs
(the server drops it when that session ends: a clean close, or the writer's process dying),
and a row in ``leases`` that says who took it and whether they let go. Taking the row, like
every batch's check of it, happens under the stream's transaction lock, so a batch never
interleaves with a change of hands.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, LiteralString

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from record.errors import RecordError, StoreMissing
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
    check_lease,
    claim,
    lease_held,
    write_batch,
)

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS entries (
        stream    TEXT   NOT NULL,
        seq       BIGINT NOT NULL CHECK (seq >= 0),
        line      BYTEA  NOT NULL,
        leaf_hash BYTEA  NOT NULL,
        PRIMARY KEY (stream, seq)
    )""",
    # A line is mostly a sealed body, base64 of ciphertext, which no compression shrinks:
    # trying costs each insert CPU for nothing. Kept uncompressed, and in its row up to a
    # page (``toast_tuple_target``), out of line beyond that.
    "ALTER TABLE entries ALTER COLUMN line SET STORAGE EXTERNAL",
    "ALTER TABLE entries SET (toast_tuple_target = 8160)",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        id     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        stream TEXT   NOT NULL,
        size   BIGINT NOT NULL,
        note   BYTEA  NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS checkpoints_by_stream ON checkpoints (stream, id)",
    """CREATE TABLE IF NOT EXISTS evidence (
        stream TEXT  NOT NULL,
        name   TEXT  NOT NULL,
        data   BYTEA NOT NULL,
        PRIMARY KEY (stream, name)
    )""",
    """CREATE TABLE IF NOT EXISTS meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS leases (
        stream   TEXT    PRIMARY KEY,
        holder   TEXT    NOT NULL,
        since    TEXT    NOT NULL,
        released BOOLEAN NOT NULL
    )""",
    """CREATE OR REPLACE FUNCTION affidavit_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the record is append-only'; END $$""",
    """CREATE OR REPLACE TRIGGER entries_append_only
        BEFORE UPDATE OR DELETE ON entries
        FOR EACH ROW EXECUTE FUNCTION affidavit_append_only()""",
    """CREATE OR REPLACE TRIGGER entries_no_truncate
        BEFORE TRUNCATE ON entries
        FOR EACH STATEMENT EXECUTE FUNCTION affidavit_append_only()""",
    """CREATE OR REPLACE TRIGGER checkpoints_append_only
        BEFORE UPDATE OR DELETE ON checkpoints
        FOR EACH ROW EXECUTE FUNCTION affidavit_append_only()""",
    """CREATE OR REPLACE TRIGGER checkpoints_no_truncate
        BEFORE TRUNCATE ON checkpoints
        FOR EACH STATEMENT EXECUTE FUNCTION affidavit_append_only()""",
)

# A leased writer's check of what it saw at its last batch, made inside the next batch's
# transaction (under the stream locks) instead of a read it must wait for: each stream still
# has the size the writer expects and a lease it holds, else the transaction fails. A
# writable open makes it where it is missing (it takes no table lock), so a database made
# before it gets it too.
_EXPECT = """CREATE OR REPLACE FUNCTION affidavit_expect(
        streams TEXT[], sizes BIGINT[], writer TEXT) RETURNS void
    LANGUAGE plpgsql AS $$
    DECLARE
        i INT;
        have BIGINT;
    BEGIN
        FOR i IN 1 .. COALESCE(array_length(streams, 1), 0) LOOP
            SELECT COALESCE(MAX(seq) + 1, 0) INTO have FROM entries WHERE stream = streams[i];
            IF have <> sizes[i] OR NOT EXISTS (SELECT 1 FROM leases WHERE stream = streams[i]
                    AND holder = writer AND NOT released) THEN
                RAISE EXCEPTION USING ERRCODE = 'AFX01',
                    MESSAGE = format('stream %s is not as its writer left it', streams[i]);
            END IF;
        END LOOP;
    END $$"""
_HAS_EXPECT = "SELECT to_regprocedure('affidavit_expect(text[],bigint[],text)') IS NOT NULL"
_EXPECTED = "SELECT affidavit_expect(%s::text[], %s::bigint[], %s)"
_EXPECTATION_FAILED = "AFX01"

#: What the writer's connections must have in force (a test asserts each one).
DURABILITY_SETTINGS = {"fsync": "on", "synchronous_commit": "on"}

# Every connection's session settings; readers also refuse writes at the server.
_WRITER_OPTIONS = "-c synchronous_commit=on"
_READER_OPTIONS = "-c synchronous_commit=on -c default_transaction_read_only=on"

# The first key of every advisory lock taken here (the second is the stream's hash), so they
# never collide with anyone else's single-key locks; ``_SCHEMA_LOCK`` serialises two stores
# creating the tables at once (CREATE ... IF NOT EXISTS is not safe against itself).
_LOCK_SPACE = 0x41666664  # "Affd"
_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(%s, 0)"
_STREAM_LOCK = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
# A lease's lock lives in a space of its own: a session lock and a transaction lock on one
# key would block each other, and a batch must not wait for its own writer's lease.
_LEASE_SPACE = 0x4166644C  # "AffL"
_TRY_LEASE = "SELECT pg_try_advisory_lock(%s, hashtext(%s))"
_UNLOCK_LEASE = "SELECT pg_advisory_unlock(%s, hashtext(%s))"
_HAS_RECORD = "SELECT to_regclass('entries') IS NOT NULL"
# The newest table: a database without it gets the (idempotent) DDL.
_HAS_SCHEMA = "SELECT to_regclass('leases') IS NOT NULL"
_SHOW = "SELECT current_setting(%s)"
_INSERT_EVIDENCE = "INSERT INTO evidence (stream, name, data) VALUES (%s, %s, %s)"
_INSERT_CHECKPOINT = "INSERT INTO checkpoints (stream, size, note) VALUES (%s, %s, %s)"
_INSERT_META = "INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING"
_SIZE = "SELECT COALESCE(MAX(seq) + 1, 0) FROM entries WHERE stream = %s"
_META = "SELECT value FROM meta WHERE key = %s"
_ENTRIES = (
    "SELECT seq, line, leaf_hash FROM entries WHERE stream = %s AND seq >= %s"
    " AND (%s::bigint IS NULL OR seq < %s::bigint) ORDER BY seq LIMIT %s"
)
_STREAMS = "SELECT stream FROM entries UNION SELECT stream FROM checkpoints ORDER BY stream"
_LEAF_HASHES = (
    "SELECT leaf_hash FROM entries WHERE stream = %s"
    " AND (%s::bigint IS NULL OR seq < %s::bigint) ORDER BY seq"
)
_CHECKPOINTS = "SELECT size, note FROM checkpoints WHERE stream = %s ORDER BY id"
_EVIDENCE = "SELECT name, data FROM evidence WHERE stream = %s ORDER BY name"
_LEASE = "SELECT holder, since, released FROM leases WHERE stream = %s"
# A batch's one read before it writes: each stream's lease row (if any) and next seq.
_LEASES_AND_SIZES = (
    "SELECT s.stream, l.holder, l.since, l.released,"
    " (SELECT COALESCE(MAX(e.seq) + 1, 0) FROM entries e WHERE e.stream = s.stream)"
    " FROM unnest(%s::text[]) AS s(stream) LEFT JOIN leases l ON l.stream = s.stream"
)
_INSERT_ENTRY = "INSERT INTO entries (stream, seq, line, leaf_hash) VALUES (%s, %s, %s, %s)"
_PUT_LEASE = (
    "INSERT INTO leases (stream, holder, since, released) VALUES (%s, %s, %s, false)"
    " ON CONFLICT (stream) DO UPDATE SET holder = EXCLUDED.holder, since = EXCLUDED.since,"
    " released = false"
)
_RELEASE = "UPDATE leases SET released = true WHERE holder = %s"
#: How often a waiting ``take_lease`` tries the lock again.
_LEASE_POLL_S = 0.05

#: Entries read per query by ``entries()``: a long stream is paged, never held whole.
PAGE = 1024


def describe(conninfo: str) -> str:
    """The store's name in messages: the connection string without its password."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "a malformed postgresql:// URL"  # never the text itself: it may hold a password
    host = params.get("host") or "localhost"
    port = f":{params['port']}" if params.get("port") else ""
    user = f"{params['user']}@" if params.get("user") else ""
    return f"postgresql://{user}{host}{port}/{params.get('dbname') or ''}"


class PostgresStore(LogStore):
    """A store in one PostgreSQL database (``conninfo``: a URL or ``key=value`` string),
    which several appliances may share (``shared``).

    ``readonly=True`` opens an existing store for audit: it never creates the tables, its
    sessions are read-only at the server, and every write is refused here first.
    """

    shared = True

    def __init__(self, conninfo: str, *, readonly: bool = False, max_connections: int = 8) -> None:
        self.name = describe(conninfo)
        self.readonly = readonly
        given = str(conninfo_to_dict(conninfo).get("options") or "")
        options = f"{given} {_READER_OPTIONS if readonly else _WRITER_OPTIONS}".strip()
        self._conninfo, self._options = conninfo, options
        self._lease_conn: psycopg.Connection[Any] | None = None  # holds the leases' locks
        # Per stream, what this store's last committed batch left: the next seq and the lease
        # it wrote under (the writer thread alone reads and writes it).
        self._left: dict[str, tuple[int, Lease]] = {}
        with psycopg.connect(conninfo, autocommit=True, options=options) as conn:
            if readonly:
                if not _fetch_one(conn, _HAS_RECORD, ()):
                    raise StoreMissing(f"store {self.name} holds no record (no entries table)")
            else:
                with conn.transaction():
                    conn.execute(_SCHEMA_LOCK, (_LOCK_SPACE,))
                    # Only a database without the tables gets the DDL (one transaction, so
                    # all of it or none): CREATE TRIGGER on a table others are writing
                    # takes a lock that deadlocks with their batches.
                    if not _fetch_one(conn, _HAS_SCHEMA, ()):
                        for statement in _SCHEMA:
                            conn.execute(statement)
                    if not _fetch_one(conn, _HAS_EXPECT, ()):
                        conn.execute(_EXPECT)
        self._closed = False
        self._close_lock = threading.Lock()
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=max(2, max_connections),  # a writer and a reader at least
            kwargs={"autocommit": True, "options": options},
            name=self.name,
            open=True,
        )

    def _writable(self) -> ConnectionPool[psycopg.Connection[Any]]:
        """The pool to write through, or why not: opened read-only, or closed."""
        if self.readonly or self._closed:
            why = "opened read-only" if self.readonly else "closed"
            raise PermissionError(f"store {self.name} was {why}")
        return self._pool

    def writer_pragmas(self) -> dict[str, object]:
        """The durability settings in force on a writer's connection (``fsync`` is the
        server's own; ``synchronous_commit`` is set on every connection of this store)."""
        with self._writable().connection() as conn:
            return {name: _fetch_one(conn, _SHOW, (name,)) for name in DURABILITY_SETTINGS}

    # -- writing -------------------------------------------------------------------------------

    def append(
        self,
        entries: Sequence[PendingEntry],
        checkpoints: Sequence[PendingCheckpoint] = (),
        on_built: Callable[[StoredEntry], None] | None = None,
        holder: str | None = None,
    ) -> tuple[list[StoredEntry], list[StoredCheckpoint]]:
        pool = self._writable()
        touched = sorted({p.stream for p in entries} | {cp.stream for cp in checkpoints})
        left = self._left
        expected = (
            {stream: left[stream] for stream in touched}
            if holder is not None
            and touched
            and all(s in left and left[s][1].holder == holder for s in touched)
            else None
        )
        # Pipeline mode: a statement whose result the batch does not read (the locks, every
        # insert, the commit) is sent without waiting for the one before it, so a batch
        # costs the round trips of its reads and the commit's, not one per row. A leased
        # writer that wrote the batch before reads nothing: the server checks what it expects
        # (``affidavit_expect``). An error still fails the transaction, and raises by the
        # commit at the latest.
        try:
            with pool.connection() as conn, conn.pipeline(), conn.transaction():
                for stream in touched:  # sorted: two batches lock in one order, never deadlock
                    conn.execute(_STREAM_LOCK, (_LOCK_SPACE, stream))
                batch = _Batch(conn, expected)
                written = write_batch(batch, entries, checkpoints, on_built, holder)
                batch.flush()
        except BaseException as exc:
            for stream in touched:  # whatever failed, the next batch reads them again
                left.pop(stream, None)
            failed = getattr(exc, "sqlstate", None) == _EXPECTATION_FAILED
            if failed and holder is not None and expected is not None:
                self._explain(touched, expected, holder)
            raise
        if holder is not None:
            for stream in touched:
                left[stream] = (batch.sizes[stream], batch.seen[stream])
        return written

    def _explain(
        self, streams: Sequence[str], expected: dict[str, tuple[int, Lease]], holder: str
    ) -> None:
        """Raise what went wrong when the server found a stream not as this writer left it:
        its lease lost (``LeaseLost``), or entries this writer did not write."""
        with self._pool.connection() as conn:
            for stream in streams:
                check_lease(stream, _lease_row(conn, stream), holder)
                have = int(_fetch_one(conn, _SIZE, (stream,)))
                if have != expected[stream][0]:
                    raise RecordError(
                        f"stream {stream!r} holds {have} entries, but this writer left it at "
                        f"{expected[stream][0]}: someone else wrote to it; nothing of this "
                        "batch was written"
                    )

    def take_lease(self, stream: str, holder: str, *, wait: float = LEASE_WAIT_S) -> Lease | None:
        self._writable()
        if self._lease_conn is None or self._lease_conn.closed:
            self._lease_conn = psycopg.connect(
                self._conninfo, autocommit=True, options=self._options
            )
        conn = self._lease_conn
        self._left.pop(stream, None)  # a new lease row: the next batch reads it again
        deadline = time.monotonic() + wait
        while not _fetch_one(conn, _TRY_LEASE, (_LEASE_SPACE, stream)):
            if time.monotonic() >= deadline:
                raise lease_held(stream, _lease_row(conn, stream))
            time.sleep(_LEASE_POLL_S)
        with conn.transaction():
            conn.execute(_STREAM_LOCK, (_LOCK_SPACE, stream))  # no batch of it meanwhile
            taken, orphaned = claim(stream, _lease_row(conn, stream), holder, utc_timestamp())
            conn.execute(_PUT_LEASE, (stream, taken.holder, taken.since))
        return orphaned

    def release_leases(self, holder: str) -> None:
        self._left.clear()
        with self._writable().connection() as conn:
            conn.execute(_RELEASE, (holder,))
        self._drop_locks()

    def _drop_locks(self) -> None:
        """End the leases' session: the server drops every lock it held."""
        if self._lease_conn is not None:
            self._lease_conn.close()
            self._lease_conn = None

    def lease(self, stream: str) -> Lease | None:
        with self._pool.connection() as conn:
            return _lease_row(conn, stream)

    def writer_alive(self, stream: str) -> bool:
        # a session of its own: a pooled connection would keep a lock it took
        with psycopg.connect(self._conninfo, autocommit=True, options=self._options) as conn:
            if not _fetch_one(conn, _TRY_LEASE, (_LEASE_SPACE, stream)):
                return True
            conn.execute(_UNLOCK_LEASE, (_LEASE_SPACE, stream))
            return False

    def set_meta(self, key: str, value: str) -> None:
        with self._writable().connection() as conn, conn.transaction():
            conn.execute(_INSERT_META, (key, value))  # the first writer's value stays
            kept = _fetch_one(conn, _META, (key,))
            if kept != value:
                raise ValueError(f"store {self.name}: {key} is already {kept!r}")

    def archive_evidence(self, stream: str, name: str, data: bytes) -> None:
        pool = self._writable()
        check_evidence_name(name)
        with pool.connection() as conn, conn.transaction():
            conn.execute(_INSERT_EVIDENCE, (stream, name, data))

    # -- reading -------------------------------------------------------------------------------

    def _rows(self, query: LiteralString, params: Sequence[object]) -> list[tuple[Any, ...]]:
        with self._pool.connection() as conn:
            return conn.execute(query, params).fetchall()

    def entries(
        self, stream: str, start: int = 0, stop: int | None = None
    ) -> Iterator[StoredEntry]:
        # Page by seq: no connection is held while the caller works on a page, and entries
        # are never rewritten, so the pages join into one consistent read.
        while True:
            rows = self._rows(_ENTRIES, (stream, start, stop, stop, PAGE))
            for seq, line, leaf in rows:
                yield StoredEntry(stream, int(seq), bytes(line), bytes(leaf))
            if len(rows) < PAGE:
                return
            start = int(rows[-1][0]) + 1

    def streams(self) -> list[str]:
        # A stream whose entries were all deleted still has its checkpoints: list it too.
        return [str(r[0]) for r in self._rows(_STREAMS, ())]

    def size(self, stream: str) -> int:
        return int(self._rows(_SIZE, (stream,))[0][0])

    def leaf_hashes(self, stream: str, stop: int | None = None) -> list[bytes]:
        return [bytes(r[0]) for r in self._rows(_LEAF_HASHES, (stream, stop, stop))]

    def checkpoints(self, stream: str) -> list[StoredCheckpoint]:
        rows = self._rows(_CHECKPOINTS, (stream,))
        return [StoredCheckpoint(stream, int(size), bytes(note)) for size, note in rows]

    def evidence(self, stream: str) -> list[tuple[str, bytes]]:
        return [(str(name), bytes(data)) for name, data in self._rows(_EVIDENCE, (stream,))]

    def get_meta(self, key: str) -> str | None:
        rows = self._rows(_META, (key,))
        return str(rows[0][0]) if rows else None

    def close(self) -> None:
        """Close every pooled connection; writes are refused from here on."""
        with self._close_lock:
            if not self._closed:
                self._closed = True
                self._drop_locks()
                self._pool.close()


def _fetch_one(
    conn: psycopg.Connection[Any], query: LiteralString, params: Sequence[object]
) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None, "a query that always returns one row returned none"
    return row[0]


def _lease_row(conn: psycopg.Connection[Any], stream: str) -> Lease | None:
    row = conn.execute(_LEASE, (stream,)).fetchone()
    return None if row is None else Lease(stream, str(row[0]), str(row[1]), bool(row[2]))


class _Batch:
    """An open transaction of the pool, as ``write_batch`` writes a batch into it.

    Its entries are held back and sent as one ``executemany`` (:meth:`flush`) before
    anything that reads or follows them. The leases' read also reads the streams' sizes; or,
    with ``expected`` (what this writer's last batch left, for a leased writer), it reads
    nothing: it returns those leases and queues the server's check of them and of the sizes,
    which fails the transaction if either changed. In pipeline mode a batch then costs no
    round trip before its commit.
    """

    def __init__(
        self, conn: psycopg.Connection[Any], expected: dict[str, tuple[int, Lease]] | None
    ) -> None:
        self._conn = conn
        self._expected = expected
        self.sizes: dict[str, int] = {}  # next seq, as this transaction sees it
        self.seen: dict[str, Lease] = {}  # the lease rows read (or expected) by leases()
        self._held: list[StoredEntry] = []

    def leases(self, streams: Sequence[str]) -> dict[str, Lease]:
        self.flush()
        if self._expected is not None:  # every stream of the batch, all under one holder
            wanted = [self._expected[s] for s in streams]
            self._conn.execute(
                _EXPECTED, (list(streams), [size for size, _ in wanted], wanted[0][1].holder)
            )
            for stream, (size, lease) in zip(streams, wanted, strict=True):
                self.sizes[stream] = size
                self.seen[stream] = lease
            return dict(self.seen)
        rows = self._conn.execute(_LEASES_AND_SIZES, (list(streams),)).fetchall()
        for stream, holder, since, released, size in rows:
            self.sizes[str(stream)] = int(size)
            if holder is not None:
                lease = Lease(str(stream), str(holder), str(since), bool(released))
                self.seen[str(stream)] = lease
        return dict(self.seen)

    def size(self, stream: str) -> int:
        if stream not in self.sizes:
            self.flush()
            self.sizes[stream] = int(_fetch_one(self._conn, _SIZE, (stream,)))
        return self.sizes[stream]

    def insert_evidence(self, stream: str, name: str, data: bytes) -> None:
        self._conn.execute(_INSERT_EVIDENCE, (stream, name, data))

    def insert_entry(self, entry: StoredEntry) -> None:
        self._held.append(entry)
        self.sizes[entry.stream] = entry.seq + 1

    def insert_checkpoint(self, checkpoint: StoredCheckpoint) -> None:
        self.flush()
        self._conn.execute(
            _INSERT_CHECKPOINT, (checkpoint.stream, checkpoint.size, checkpoint.note)
        )

    def flush(self) -> None:
        """Send the entries held back, in one ``executemany`` (whose results the pipeline
        does not wait for)."""
        if self._held:
            held, self._held = self._held, []
            with self._conn.cursor() as cursor:
                cursor.executemany(
                    _INSERT_ENTRY, [(e.stream, e.seq, e.line, e.leaf_hash) for e in held]
                )
