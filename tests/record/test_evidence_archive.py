"""``Log.archive_evidence``: the evidence file and its ``evidence.archived`` entry are kept
together or not at all, and a refused archive never sinks the appends batched with it
(real SQLite, real sealing, the real writer thread)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from record.audit import verify_store
from record.digest import Domain, digest
from record.log import Log
from record.schema import TurnStarted
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore

STREAM = "session-evidence"


def _turn(n: int) -> TurnStarted:
    data = b"turn %d" % n
    return TurnStarted(turn=n, input_bytes=data, input_digest=digest(Domain.INPUT, data))


def test_a_refused_archive_keeps_nothing_and_loses_nothing(tmp_path: Path) -> None:
    store = tmp_path / "record.db"
    reader = KeyPair.generate()
    with Log.open(store) as log:
        log.open_stream(STREAM, [reader.recipient])
        kept = log.archive_evidence(STREAM, "sev-snp", "snp.report", b"first")
        assert kept.seq == 1
        with pytest.raises(ValueError, match=r"'snp\.report' is already kept for stream"):
            log.archive_evidence(STREAM, "sev-snp", "snp.report", b"second")
        with pytest.raises(ValueError, match="not a plain file name"):
            log.archive_evidence(STREAM, "sev-snp", "../snp.report", b"escape")
        assert log.append(STREAM, _turn(0)).seq == 2  # no seq burnt, nothing else refused
    reading = SQLiteStore(store, readonly=True)
    try:
        assert reading.evidence(STREAM) == [("snp.report", b"first")]
        assert reading.size(STREAM) == 3
    finally:
        reading.close()
    report = verify_store(store, key=reader)
    assert report.ok, report.problems


def test_appends_batched_with_a_refused_archive_all_land(tmp_path: Path) -> None:
    store = tmp_path / "record.db"
    reader = KeyPair.generate()
    with Log.open(store) as log:
        log.open_stream(STREAM, [reader.recipient])
        log.archive_evidence(STREAM, "sev-snp", "snp.report", b"first")
        errors: list[BaseException] = []

        def write(n: int) -> None:
            try:
                log.append(STREAM, _turn(n))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(n,)) for n in range(20)]
        for thread in threads:
            thread.start()
        for _ in range(5):
            with pytest.raises(ValueError, match="already kept"):
                log.archive_evidence(STREAM, "sev-snp", "snp.report", b"again")
        for thread in threads:
            thread.join()
        assert errors == []
    reading = SQLiteStore(store, readonly=True)
    try:
        assert reading.size(STREAM) == 22
    finally:
        reading.close()
    assert verify_store(store, key=reader).ok
