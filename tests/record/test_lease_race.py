"""#21 lines 2 and 4: one writer per stream, between processes, on PostgreSQL.

Two writer processes (``tests/record/pg_writer.py``: real ``Log``s, the same appliance's keys,
the private cluster of ``tests/pg_server.py``) are started at once on one stream, round after
round. One takes the stream's lease and writes; the other waits for it. The writer is
SIGKILLed mid-stream; the waiting one takes the lease over, says so in the stream
(``lease.taken``, naming the killed holder), and writes on until it is killed in turn. Then:
no ``seq`` was acknowledged to both, every acknowledged entry is there as given, the stream
has no gap, and the audit with the user's key is clean. A writer that waits less than the
holder lives is refused, naming the holder, and writes nothing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from record.audit import verify_store
from record.log import Log
from record.postgres_store import PostgresStore
from record.schema import LeaseTaken, parse_entry
from tests.record.test_postgres_crash import REPO, Writer, writer_keys

ROUNDS = 4
STREAM = "raced"


def _writer(url: str, keys: list[str], seed: int, wait: float) -> Writer:
    return Writer(
        [sys.executable, "-m", "tests.record.pg_writer", url, *keys, STREAM, str(seed), str(wait)]
    )


def _first_ready(pair: list[Writer]) -> Writer:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for writer in pair:
            if writer.ready.is_set():
                return writer
        time.sleep(0.01)
    raise AssertionError("neither writer took the stream")


def _acked_at_least(writer: Writer, count: int) -> None:
    deadline = time.monotonic() + 60
    while len(writer.acked) < count:
        assert time.monotonic() < deadline, "a writer stopped acknowledging"
        time.sleep(0.01)


@pytest.mark.timeout(300)
def test_two_processes_on_one_stream_take_turns_and_never_share_a_seq(
    postgres_server: Any, tmp_path: Path
) -> None:
    url: str = postgres_server.fresh_database()
    user, appliance, keys = writer_keys(tmp_path)
    with Log.open(url, signing_key=tmp_path / "log.signing-key", appliance_key=appliance) as log:
        log.open_stream(STREAM, [user.recipient, appliance.recipient])  # then let go of it
    acked: list[dict[int, bytes]] = []
    started: list[Writer] = []  # every writer process, so none outlives a failure
    try:
        for round_no in range(ROUNDS):
            pair = [_writer(url, keys, 2 * round_no + i, wait=30) for i in range(2)]
            for writer in pair:
                writer.start()
                started.append(writer)
            holder = _first_ready(pair)
            waiter = pair[1 - pair.index(holder)]
            _acked_at_least(holder, 5)
            assert not waiter.ready.is_set(), "two writers of one stream at once"
            holder.kill()
            assert waiter.ready.wait(60), f"the waiting writer never took over: {waiter.error()}"
            _acked_at_least(waiter, 5)
            waiter.kill()
            acked += [holder.acked, waiter.acked]

        # a writer that will not wait as long as the holder lives is refused, naming it
        holder = _writer(url, keys, 99, wait=30)
        holder.start()
        started.append(holder)
        assert holder.ready.wait(60)
        refused = subprocess.run(
            [sys.executable, "-m", "tests.record.pg_writer", url, *keys, STREAM, "100", "0.5"],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert refused.returncode == 1, refused.stderr[-2000:]
        assert refused.stdout == ""
        assert "lease_held: stream 'raced' is being written by another live process" in (
            refused.stderr
        )
        assert " pid " in refused.stderr and "one writer per stream" in refused.stderr
        holder.kill()
        acked.append(holder.acked)
    finally:
        for writer in started:
            if writer.proc is not None and writer.proc.poll() is None:
                writer.proc.kill()

    seqs = [seq for one in acked for seq in one]
    assert len(seqs) == len(set(seqs)), "one seq acknowledged to two writers"
    store = PostgresStore(url, readonly=True)
    try:
        stored = {e.seq: e for e in store.entries(STREAM)}
        kinds = [parse_entry(e.line).kind for e in stored.values()]
    finally:
        store.close()
    assert sorted(stored) == list(range(len(stored))), "a gap"
    for one in acked:
        assert all(stored[seq].leaf_hash == leaf for seq, leaf in one.items())
    # every start but the very first took the stream from a killed holder, and said so
    assert kinds.count("lease.taken") == 2 * ROUNDS
    report = verify_store(url, key=user)
    assert report.ok, [str(p) for p in report.problems][:10]
    from tests.egress_proxy.loopback import read_bodies

    taken = [b for _, b in read_bodies(url, STREAM, user).values() if isinstance(b, LeaseTaken)]
    holders = [t.holder for t in taken]
    assert len(set(holders)) == len(holders)  # each takeover by a new process
    assert all(t.previous_holder != t.holder and " pid " in t.previous_holder for t in taken)
    assert [t.previous_holder for t in taken[1:]] == holders[:-1]  # a chain of hands
    postgres_server.drop_database(url)
