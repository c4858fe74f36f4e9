"""#21 line 4: writers of a PostgreSQL store SIGKILLed at random.

Three writer processes (``tests/record/pg_writer.py``, each a real ``Log`` on the private
cluster of ``tests/pg_server.py``, one stream each, the same appliance's keys) append while a
reader thread reads every stream over and over. One of them is SIGKILLed at a random moment,
100 times, and started again, when it recovers its stream from the database and goes on.
Then: every append a writer acknowledged is there with the leaf hash it was given, no stream
has a gap (nor did the reader ever see one), and ``verify_store`` with the user's key finds
no problem. A batch cut by the kill is a transaction the server rolls back: never half there.
Each restarted writer takes its stream's lease over from the one killed holding it, and says
so: one ``lease.taken`` per kill.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from record.audit import verify_store
from record.postgres_store import PostgresStore
from record.schema import parse_entry
from record.seal import KeyPair

pytestmark = pytest.mark.long

REPO = Path(__file__).resolve().parents[2]
WRITERS = 3
KILLS = 100
SEED = 0x5EC0D


class Writer:
    """One writer process and what it acknowledged (seq → leaf), kept across its restarts."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.acked: dict[int, bytes] = {}
        self.proc: subprocess.Popen[str] | None = None
        self.ready = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.ready.clear()
        self.proc = subprocess.Popen(
            self.argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line == "R\n":
                self.ready.set()
            elif line.startswith("A "):
                _, seq, leaf = line.split()
                self.acked[int(seq)] = bytes.fromhex(leaf)

    def error(self) -> str:
        """What a writer that exited by itself printed on its way out."""
        if self.proc is None or self.proc.poll() is None or self.proc.stderr is None:
            return "(still running)"
        return f"exited {self.proc.returncode}: {self.proc.stderr.read()[-2000:]}"

    def kill(self) -> None:
        assert self.proc is not None and self._reader is not None
        if self.proc.poll() is not None:  # it died by itself: that is a failure
            raise AssertionError(f"a writer {self.error()}")
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._reader.join(30)  # every ack it printed before it died is counted


def writer_keys(folder: Path) -> tuple[KeyPair, KeyPair, list[str]]:
    """A user's and an appliance's keys, written in ``folder``, and the key-file arguments
    ``tests/record/pg_writer.py`` takes (the log's signing key, made by the first writer)."""
    user, appliance = KeyPair.generate(), KeyPair.generate()
    user.write(folder / "user.key")
    appliance.write(folder / "appliance.key")
    return (
        user,
        appliance,
        [str(folder / n) for n in ("log.signing-key", "appliance.key", "user.key")],
    )


def _reading(url: str, streams: list[str], stop: threading.Event, seen: list[str]) -> None:
    """Read every stream over and over: the seqs it sees are always 0, 1, 2 … with no gap."""
    store = PostgresStore(url, readonly=True)
    try:
        while not stop.is_set():
            for stream in streams:
                seqs = [e.seq for e in store.entries(stream)]
                if seqs != list(range(len(seqs))):
                    seen.append(f"{stream}: a reader saw seqs {seqs[:5]}… with a gap")
            time.sleep(0.01)
    finally:
        store.close()


@pytest.mark.timeout(900)
def test_writers_killed_a_hundred_times_lose_no_acknowledged_entry(
    postgres_server: Any, tmp_path: Path
) -> None:
    url: str = postgres_server.fresh_database()
    user, _, keys = writer_keys(tmp_path)
    streams = [f"w{i}" for i in range(WRITERS)]
    writers = [
        Writer([sys.executable, "-m", "tests.record.pg_writer", url, *keys, s, str(SEED + i)])
        for i, s in enumerate(streams)
    ]
    rnd = random.Random(SEED)
    stop, seen = threading.Event(), list[str]()
    reader = threading.Thread(target=_reading, args=(url, streams, stop, seen), daemon=True)
    try:
        for writer in writers:
            writer.start()
            assert writer.ready.wait(60), "a writer never got ready"
        reader.start()
        for _ in range(KILLS):
            writer = rnd.choice(writers)
            assert writer.ready.wait(60), "a restarted writer never got ready"
            time.sleep(rnd.uniform(0, 0.25))  # anywhere: mid-batch, mid-commit, between
            writer.kill()
            writer.start()
        for writer in writers:
            assert writer.ready.wait(60)
            time.sleep(0.1)
            writer.kill()
    finally:
        stop.set()
        for writer in writers:
            if writer.proc is not None and writer.proc.poll() is None:
                writer.proc.kill()
        reader.join(30)

    assert not seen, seen[:5]
    store = PostgresStore(url, readonly=True)
    try:
        for writer, stream in zip(writers, streams, strict=True):
            stored = {e.seq: e.leaf_hash for e in store.entries(stream)}
            assert sorted(stored) == list(range(len(stored))), f"{stream} has a gap"
            lost = [seq for seq, leaf in writer.acked.items() if stored.get(seq) != leaf]
            assert not lost, f"{stream}: acknowledged and not there as given: {lost[:10]}"
            assert len(writer.acked) > KILLS // WRITERS, f"{stream}: too few appends to judge"
    finally:
        store.close()
    report = verify_store(url, key=user)
    assert report.ok, [str(p) for p in report.problems][:10]
    assert report.entries >= sum(len(w.acked) for w in writers)
    store = PostgresStore(url, readonly=True)
    try:
        kinds = [parse_entry(e.line).kind for s in streams for e in store.entries(s)]
    finally:
        store.close()
    assert kinds.count("lease.taken") == KILLS  # every kill was of a writer holding its lease
    postgres_server.drop_database(url)
