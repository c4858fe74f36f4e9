"""#21 line 2: several appliances share one PostgreSQL store, each stream its opener's for life.

Two appliances (their own log keys and sealing keys) write to one database (the private
cluster of ``tests/pg_server.py``). Each opens and writes its own streams; the store keeps
no one log key, so each stream is checked against the key its opening names. One appliance
never appends to the other's stream: it is refused (``NotOwner``) and nothing is written.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from record.audit import verify_store
from record.checkpoint import Signer
from record.digest import Domain, digest
from record.errors import NotOwner
from record.log import LOG_KEY_NAME, Log
from record.postgres_store import PostgresStore
from record.schema import TurnStarted
from record.seal import KeyPair

REPO = Path(__file__).resolve().parents[2]


def _turn(n: int) -> TurnStarted:
    data = f"turn {n}".encode()
    return TurnStarted(turn=n, input_bytes=data, input_digest=digest(Domain.INPUT, data))


@pytest.fixture
def url(postgres_server: Any) -> Iterator[str]:
    made: str = postgres_server.fresh_database()
    yield made
    postgres_server.drop_database(made)


def test_two_appliances_share_a_store_and_neither_writes_the_others_stream(
    url: str, tmp_path: Path
) -> None:
    user = KeyPair.generate()
    a_key, b_key = KeyPair.generate(), KeyPair.generate()
    a_signer, b_signer = Signer.generate(LOG_KEY_NAME), Signer.generate(LOG_KEY_NAME)
    with (
        Log(PostgresStore(url), a_signer, appliance_key=a_key) as a,
        Log(PostgresStore(url), b_signer, appliance_key=b_key) as b,
    ):
        a.open_stream("a-1", [user.recipient, a_key.recipient])
        b.open_stream("b-1", [user.recipient, b_key.recipient])
        a.append("a-1", _turn(0))
        b.append("b-1", _turn(0))
        with pytest.raises(NotOwner) as caught:
            b.append("a-1", _turn(1))
        assert caught.value.code == "not_owner"
        assert str(caught.value) == (
            f"stream 'a-1' was opened by the appliance whose log key is {a_signer.vkey()}; "
            f"this one ({b_signer.vkey()}) may not append to it: continue the session in a "
            "new stream"
        )
        with pytest.raises(NotOwner):
            b.checkpoint("a-1")  # a checkpoint is a write too
        a.append("a-1", _turn(1))  # the owner goes on, untouched by the attempt
    store = PostgresStore(url, readonly=True)
    try:
        assert store.size("a-1") == 3 and store.size("b-1") == 2
        assert store.get_meta("log_key") is None  # no one key for a shared store
    finally:
        store.close()

    # unpinned, each stream is checked against its own opener's key; pinned, only that one's
    report = verify_store(url, key=user)
    assert report.ok and report.entries == 5, [str(p) for p in report.problems]
    pinned = verify_store(url, log_key=a_signer.vkey())
    assert {p.stream for p in pinned.problems} == {"b-1"}
    assert any(p.code == "checkpoint_invalid" for p in pinned.problems)
    user.write(tmp_path / "user.key")
    for extra, code in (([], 0), (["--log-key", b_signer.vkey()], 1)):
        done = subprocess.run(
            [sys.executable, "-m", "affidavit", "log", "verify", url,
             "--key", str(tmp_path / "user.key"), *extra],
            cwd=REPO, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_restarted_appliance_takes_back_its_own_stream(url: str) -> None:
    """The same keys after a clean stop: the stream is its own again, no takeover to record."""
    user, key = KeyPair.generate(), KeyPair.generate()
    signer = Signer.generate(LOG_KEY_NAME)
    with Log(PostgresStore(url), signer, appliance_key=key) as log:
        log.open_stream("s", [user.recipient, key.recipient])
    with Log(PostgresStore(url), signer, appliance_key=key, lease_wait=0) as log:
        assert log.append("s", _turn(0)).seq == 1


class _CountedReads(PostgresStore):
    """Counts how much of each stream is read (the whole of it: ``stop`` None)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.whole: list[str] = []

    def entries(self, stream: str, start: int = 0, stop: int | None = None) -> Any:
        if stop is None:
            self.whole.append(stream)
        return super().entries(stream, start, stop)


def test_recovery_reads_only_its_own_streams_of_a_shared_store(url: str) -> None:
    """At each start a proxy answers its own unanswered requests; another appliance's
    streams cost it one entry each (their opening), never a read of the whole stream."""
    from egress_proxy.recovery import recover_unknown
    from tests.egress_proxy.test_limits import _request

    user = KeyPair.generate()
    a_key, b_key = KeyPair.generate(), KeyPair.generate()
    a_signer, b_signer = Signer.generate(LOG_KEY_NAME), Signer.generate(LOG_KEY_NAME)
    with Log(PostgresStore(url), a_signer, appliance_key=a_key) as a:
        a.open_stream("a-1", [user.recipient, a_key.recipient, b_key.recipient])
        a.append("a-1", _request())  # unanswered: A's own recovery answers it, B's must not
    counted = _CountedReads(url)
    with Log(counted, b_signer, appliance_key=b_key) as b:
        b.open_stream("b-1", [user.recipient, b_key.recipient])
        b.append("b-1", _request())
        recovered = recover_unknown(b)
    assert [(r.stream, r.request_seq) for r in recovered] == [("b-1", 1)]
    assert "a-1" not in counted.whole
    with Log(PostgresStore(url), a_signer, appliance_key=a_key) as a:
        assert [(r.stream, r.request_seq) for r in recover_unknown(a)] == [("a-1", 1)]
