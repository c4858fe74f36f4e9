"""The log writer's side of one writer per stream (``record.log``): a refused stream costs
one wait per batch, and a stop that cannot let go still closes the store."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from record.checkpoint import Signer
from record.errors import LeaseHeld, RecordError
from record.log import LOG_KEY_NAME, Log, _Request
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore
from tests.record.raw_store import stored_lines
from tests.record.test_log_mutants import OTHER, STREAM, _started


class _CountedLeases(SQLiteStore):
    """A SQLite store that counts the leases asked of it and, when told, cannot let go of
    them (as a database that went away before the writer stopped)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.asked: list[str] = []
        self.release_fails = False

    def take_lease(self, stream: str, holder: str, *, wait: float = 10.0) -> Any:
        self.asked.append(stream)
        return super().take_lease(stream, holder, wait=wait)

    def release_leases(self, holder: str) -> None:
        if self.release_fails:
            raise sqlite3.OperationalError("the store went away")
        super().release_leases(holder)


def test_a_refused_stream_costs_one_wait_per_batch(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    """Every request of a stream another live writer holds fails with the same refusal, after
    one wait, not one wait each (the writer thread serves every other stream meanwhile)."""
    with Log.open(store, appliance_key=appliance) as first:
        first.open_stream(STREAM, [user.recipient, appliance.recipient])
        first.open_stream(OTHER, [user.recipient, appliance.recipient])
        first.append(STREAM, _started(0))
        signer = Signer.load_or_create(store.with_name(store.name + ".signing-key"), LOG_KEY_NAME)
        counted = _CountedLeases(store)
        second = Log(counted, signer, appliance_key=appliance, lease_wait=0.1)
        try:
            batch = [_Request(STREAM, "", b"") for _ in range(3)]
            assert second._with_leases(batch) == []
            assert counted.asked == [STREAM]
            errors = [r.future.exception() for r in batch]
            assert (
                all(isinstance(e, LeaseHeld) for e in errors) and len({id(e) for e in errors}) == 1
            )
        finally:
            second.close()
    assert len(stored_lines(store, STREAM)) == 2


def test_a_store_that_cannot_let_go_still_closes(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    """Letting go is best effort: the store is closed (and its locks with it) whatever
    happens, and the next writer records the takeover the unreleased row implies."""
    counted = _CountedLeases(store)
    signer = Signer.load_or_create(store.with_name(store.name + ".signing-key"), LOG_KEY_NAME)
    log = Log(counted, signer, appliance_key=appliance)
    log.open_stream(STREAM, [user.recipient, appliance.recipient])
    counted.release_fails = True
    log.close()
    with pytest.raises(PermissionError, match="was closed"):
        counted.append([])
    with Log.open(store, appliance_key=appliance, lease_wait=0) as again:
        again.append(STREAM, _started(0))
    kinds = [json.loads(line)["kind"] for line in stored_lines(store, STREAM)]
    assert kinds == ["stream.opened", "lease.taken", "turn.started"]


def test_log_checkpoint_signs_beside_a_running_writer(
    store: Path, user: KeyPair, appliance: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    """`affidavit log checkpoint` adds no entry, so it needs no lease: beside the writer that
    holds the stream (a running appliance) it signs the stream as stored, at once."""
    from affidavit.cli import main
    from record.audit import verify_store
    from record.checkpoint import open_checkpoint
    from record.log import sign_stored

    with Log.open(store, appliance_key=appliance) as running:
        running.open_stream(STREAM, [user.recipient, appliance.recipient])
        last = running.append(STREAM, _started(0))
        assert main(["log", "checkpoint", STREAM, "--store", str(store), "--json"]) == 0
        note = json.loads(capsys.readouterr().out)
        checkpoint, _ = open_checkpoint(note["note"].encode(), [running.signer.verifier()])
        assert (checkpoint.size, checkpoint.root_hash) == (last.tree_size, last.root_hash)
        after = running.append(STREAM, _started(1))  # the writer goes on, untouched
        assert after.seq == last.seq + 1
        stranger = Signer.generate(LOG_KEY_NAME)  # another key signs nothing of this store
        with pytest.raises(RecordError, match="signed by"):
            sign_stored(running.store, stranger, STREAM)
    assert verify_store(store, key=user).ok


def test_a_malformed_lease_row_fails_one_request_and_the_writer_goes_on(
    store: Path, user: KeyPair, appliance: KeyPair
) -> None:
    """The leases table is a database's, read like any input: a crashed holder's row whose
    `since` is not a time fails the request that found it, by name, and never the writer."""
    with Log.open(store, appliance_key=appliance) as log:
        log.open_stream(STREAM, [user.recipient, appliance.recipient])
    edit = sqlite3.connect(store)
    edit.execute("UPDATE leases SET holder = 'ghost', since = 'not a time', released = 0")
    edit.commit()
    edit.close()
    with Log.open(store, appliance_key=appliance, lease_wait=0) as log:
        with pytest.raises(ValueError, match="previous_since"):
            log._submit(STREAM, _started(0)).result(10)
        assert log.append(STREAM, _started(1)).seq == 1  # the writer still writes
