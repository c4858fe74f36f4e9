"""A leased writer's batch on PostgreSQL reads nothing before its commit.

After its first batch, a leased writer knows each stream's size and lease as it left them,
so the next batch does not read them (a round trip it would wait for): it queues
``affidavit_expect``, which fails the transaction at the server when either changed. These
tests change them behind the writer's back and check that the batch is refused, with the
error the reading path would give (or a plain one where that path would have written), and
that nothing of it is written. Real server: the run's private cluster (``tests/pg_server.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from record.errors import LeaseLost, RecordError
from record.merkle import hash_leaf
from record.store import PendingCheckpoint, PendingEntry

psycopg = pytest.importorskip("psycopg", reason="psycopg is missing: the `postgres` extra")
from record.postgres_store import PostgresStore  # noqa: E402  (needs psycopg)


def pending(stream: str) -> PendingEntry:
    def build(seq: int) -> tuple[bytes, bytes]:
        line = b'{"seq":%d}' % seq
        return line, hash_leaf(line)

    return PendingEntry(stream, build)


@pytest.fixture
def url(postgres_server: Any) -> Iterator[str]:
    made = postgres_server.fresh_database()
    yield made
    postgres_server.drop_database(made)


@pytest.fixture
def writer(url: str) -> Iterator[PostgresStore]:
    """A store holding the lease of stream ``a`` as ``me``, with two batches written (the
    second one already on the path that reads nothing)."""
    store = PostgresStore(url)
    store.take_lease("a", "me")
    store.append([pending("a")], holder="me")
    store.append([pending("a"), pending("a")], holder="me")
    yield store
    store.close()


def test_a_lease_taken_behind_the_writers_back_refuses_its_next_batch(
    url: str, writer: PostgresStore
) -> None:
    writer._drop_locks()  # as if its session had died, and another writer took the stream
    rival = PostgresStore(url)
    try:
        orphaned = rival.take_lease("a", "rival", wait=0)
        assert orphaned is not None and orphaned.holder == "me"
        with pytest.raises(LeaseLost) as caught:
            writer.append([pending("a")], holder="me")
        assert str(caught.value) == (
            "stream 'a': this writer (me) does not hold its lease (rival does); "
            "nothing of this batch was written"
        )
        assert writer.size("a") == 3
        stored, _ = rival.append([pending("a")], holder="rival")
        assert [e.seq for e in stored] == [3]
    finally:
        rival.close()


def test_entries_written_behind_the_writers_back_refuse_its_next_batch(
    url: str, writer: PostgresStore
) -> None:
    with psycopg.connect(url, autocommit=True) as conn:  # no lease: the triggers allow it
        conn.execute(
            "INSERT INTO entries (stream, seq, line, leaf_hash) VALUES ('a', 3, %s, %s)",
            (b"{}", hash_leaf(b"{}")),
        )
    with pytest.raises(RecordError) as caught:
        writer.append([pending("a"), pending("a")], holder="me")
    assert str(caught.value) == (
        "stream 'a' holds 4 entries, but this writer left it at 3: someone else wrote to it; "
        "nothing of this batch was written"
    )
    assert writer.size("a") == 4
    assert writer.checkpoints("a") == []


def test_a_checkpoint_alone_is_checked_too(url: str, writer: PostgresStore) -> None:
    with psycopg.connect(url, autocommit=True) as conn:  # its row says it let go
        conn.execute("UPDATE leases SET released = true WHERE stream = 'a'")
    with pytest.raises(LeaseLost) as caught:
        writer.append([], [PendingCheckpoint("a", lambda size: b"note")], holder="me")
    assert "this writer (me) does not hold its lease (nobody does)" in str(caught.value)
    assert writer.checkpoints("a") == []


def test_a_database_made_before_the_check_gets_it_when_a_writer_opens_it(url: str) -> None:
    PostgresStore(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP FUNCTION affidavit_expect(TEXT[], BIGINT[], TEXT)")
    store = PostgresStore(url)
    try:
        store.take_lease("a", "me")
        for _ in range(3):
            store.append([pending("a")], holder="me")
        assert [e.seq for e in store.entries("a")] == [0, 1, 2]
    finally:
        store.close()


def test_an_empty_batch_of_a_leased_writer_writes_nothing(writer: PostgresStore) -> None:
    assert writer.append([], holder="me") == ([], [])
    stored, _ = writer.append([pending("a")], holder="me")
    assert [e.seq for e in stored] == [3]
