"""Crash safety of the record's writer: SIGKILL at random moments, durability, group commit.

- ``test_sigkill_while_appending``: a forked writer is SIGKILLed at random moments, 200
  times, on one store that grows across rounds. After every kill the store verifies: ``seq``
  has no gap, no entry is torn, every checkpoint note is signed and matches the Merkle root,
  nothing verified before has changed, and every append acknowledged before the kill is
  there with the leaf hash its appender was given.
- ``test_writer_durability_pragmas_and_readers_never_block``: WAL + synchronous=FULL on the
  writer; a reader holding a read transaction does not stop a commit, nor a writer a reader.
- ``test_group_commit``: 16 concurrent appenders share commits; seqs are distinct, gapless.
- ``test_fsync_before_each_acknowledgement``: under ``strace``, an fsync of the WAL completes
  between consecutive acknowledgements.

The checks are done here, directly from the stored bytes; ``record.audit.verify_store`` is
called as well when that module is importable.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import random
import re
import select
import shutil
import signal
import sqlite3
import stat
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

from record import merkle
from record.checkpoint import Signer, Verifier, open_checkpoint
from record.digest import Domain, canonical_json, digest
from record.log import LOG_KEY_NAME, Appended, Log
from record.schema import (
    LeaseTaken,
    StreamOpened,
    TurnEnded,
    TurnStarted,
    parse_body,
    parse_entry,
)
from record.seal import KeyPair, open_sealed
from record.sqlite_store import DURABILITY_PRAGMAS, SQLiteStore
from record.store import StoredCheckpoint, StoredEntry

STREAM = "crash"
KILL_ROUNDS = 200
APPENDERS = 4
SEED = 0xAFF1DA71
FULL_CHECK_EVERY = 20  # every Nth round also re-verifies the whole store from scratch

# -- verification, from the stored bytes -----------------------------------------------------


@dataclass
class StoreChecker:
    """Verifies one stream of a store; incremental across calls, so 200 rounds stay fast.

    Every entry is fully checked the first time it is seen (leaf hash recomputed, line
    parsed and canonical, body opened with the stream key, digests recomputed); later calls
    require the stored leaf hashes of everything already verified to be unchanged, and
    ``full=True`` re-verifies every line from scratch.
    """

    stream: str
    key: KeyPair
    leaves: list[bytes] = field(default_factory=list)
    roots: list[bytes] = field(default_factory=lambda: [merkle.EMPTY_ROOT])  # roots[k]: k leaves
    checkpoints_seen: int = 0
    takeovers: int = 0  # lease.taken entries: a writer took over from a killed one
    data_key: bytes | None = None
    verifier: Verifier | None = None
    _tree: merkle.CompactRange = field(default_factory=merkle.CompactRange)

    def check(self, path: Path, *, full: bool = False) -> int:
        """Verify the store at ``path`` (read-only, closed on return); returns its size."""
        if full:
            fresh = StoreChecker(self.stream, self.key)
            fresh.check(path)
            assert fresh.leaves[: len(self.leaves)] == self.leaves, "verified entries changed"
            assert fresh.checkpoints_seen >= self.checkpoints_seen, "checkpoints disappeared"
        store = SQLiteStore(path, readonly=True)
        try:
            return self._check(store)
        finally:
            store.close()  # the parent must hold no connection across the next fork

    def _check(self, store: SQLiteStore) -> int:
        assert store.streams() == [self.stream]
        log_key = store.get_meta("log_key")
        assert log_key is not None, "the store has no log_key"
        self.verifier = Verifier.from_vkey(log_key)
        stored_leaves = store.leaf_hashes(self.stream)
        known = len(self.leaves)
        assert len(stored_leaves) >= known, (
            f"stream shrank from {known} to {len(stored_leaves)} entries"
        )
        assert stored_leaves[:known] == self.leaves, "an entry verified earlier has changed"
        expected_seq = known
        for entry in store.entries(self.stream, known):
            assert entry.seq == expected_seq, f"seq gap: expected {expected_seq}, got {entry.seq}"
            self._check_entry(entry)
            self.leaves.append(entry.leaf_hash)
            self._tree.append(entry.leaf_hash)
            self.roots.append(self._tree.root())
            expected_seq += 1
        size = len(self.leaves)
        assert size == len(stored_leaves) == store.size(self.stream), "seq column has a gap"
        checkpoints = store.checkpoints(self.stream)
        assert len(checkpoints) >= self.checkpoints_seen, "checkpoints disappeared"
        previous = checkpoints[self.checkpoints_seen - 1].size if self.checkpoints_seen else 0
        for cp in checkpoints[self.checkpoints_seen :]:
            self._check_checkpoint(cp, size)
            assert cp.size >= previous, f"checkpoint sizes go back: {previous} then {cp.size}"
            previous = cp.size
        if len(checkpoints) > self.checkpoints_seen:
            # the incremental roots against a tree built from scratch, once a round: at every
            # checkpoint that was quadratic, and most of the test's time
            newest = checkpoints[-1].size
            assert self.roots[newest] == merkle.root(self.leaves[:newest]), "roots disagree"
        self.checkpoints_seen = len(checkpoints)
        # Entries and their batch's checkpoint commit together: nothing durable is unsigned.
        signed = checkpoints[-1].size if checkpoints else 0
        assert signed == size, f"{size} entries, the last checkpoint covers {signed}"
        return size

    def _check_entry(self, entry: StoredEntry) -> None:
        where = f"{self.stream}/{entry.seq}"
        assert merkle.hash_leaf(entry.line) == entry.leaf_hash, f"{where}: leaf hash mismatch"
        parsed = parse_entry(entry.line)  # SchemaError on a torn or malformed line
        assert (parsed.stream, parsed.seq) == (self.stream, entry.seq), f"{where}: wrong envelope"
        assert canonical_json(json.loads(entry.line)) == entry.line, f"{where}: not canonical"
        if entry.seq == 0:
            assert parsed.kind == "stream.opened", f"{where}: first entry is {parsed.kind}"
            assert isinstance(parsed.body, dict)
            opened = parse_body(parsed.kind, parsed.body)
            assert isinstance(opened, StreamOpened) and opened.key_epoch == 0
            mine = self.key.recipient.text()
            wrapped = [w for w in opened.recipients if w.recipient == mine]
            assert len(wrapped) == 1, f"{where}: not sealed to the appliance key"
            self.data_key = self.key.unwrap(wrapped[0].sealed_key, self.stream, 0)
            return
        kinds = ("turn.started", "turn.ended", "lease.taken")
        assert parsed.kind in kinds, f"{where}: kind {parsed.kind}"
        assert isinstance(parsed.body, str), f"{where}: sealed body is not a string"
        assert self.data_key is not None
        ad = canonical_json(parsed.model_dump(mode="json", exclude={"body"}))
        plaintext = open_sealed(self.data_key, base64.b64decode(parsed.body, validate=True), ad)
        body = parse_body(parsed.kind, plaintext)
        if isinstance(body, LeaseTaken):
            assert body.previous_holder != body.holder, f"{where}: took the lease from itself"
            self.takeovers += 1
        elif isinstance(body, TurnStarted):
            assert digest(Domain.INPUT, body.input_bytes) == body.input_digest, where
        else:
            assert isinstance(body, TurnEnded) and body.answer_bytes is not None
            assert digest(Domain.RESPONSE, body.answer_bytes) == body.answer_digest, where

    def _check_checkpoint(self, cp: StoredCheckpoint, size: int) -> None:
        assert self.verifier is not None
        checkpoint, opened = open_checkpoint(cp.note, [self.verifier])
        assert opened.verified_by == (LOG_KEY_NAME,)
        assert checkpoint.size == cp.size, "checkpoint row and note disagree on the size"
        assert 0 < cp.size <= size, f"checkpoint of size {cp.size}; the stream has {size}"
        assert checkpoint.origin == f"{LOG_KEY_NAME}/{self.verifier.key_id.hex()}/{self.stream}"
        assert checkpoint.root_hash == self.roots[cp.size], f"checkpoint {cp.size}: wrong root"


def audit_if_available(path: Path, key: KeyPair, entries: int) -> bool:
    """``record.audit.verify_store`` must agree, once that module exists."""
    try:
        from record.audit import verify_store
    except ModuleNotFoundError as exc:
        if exc.name != "record.audit":
            raise
        return False
    report = verify_store(path, key=key)
    assert report.ok, [str(p) for p in report.problems]
    assert report.entries == entries
    return True


def make_body(rnd: random.Random, turn: int) -> TurnStarted | TurnEnded:
    """A body of random size: often empty, mostly small, now and then ~64 KiB; not UTF-8."""
    u = rnd.random()
    if u < 0.15:
        data = b""
    elif u < 0.17:
        data = rnd.randbytes(64 * 1024 - rnd.randrange(64))
    elif u < 0.30:
        data = rnd.randbytes(rnd.randrange(1, 4096))
    else:
        data = rnd.randbytes(rnd.randrange(1, 256))
    if data and rnd.random() < 0.5:
        data = b"\xff\xc3\x28" + data  # never valid UTF-8
    if rnd.random() < 0.1:  # a turn.ended now and then, as a session writes them
        return TurnEnded(
            turn=turn,
            outcome="ANSWERED",
            answer_bytes=data,
            answer_digest=digest(Domain.RESPONSE, data),
        )
    return TurnStarted(turn=turn, input_bytes=data, input_digest=digest(Domain.INPUT, data))


# -- 1. SIGKILL at random moments ------------------------------------------------------------

# What the child reports through its pipe, one atomic write (< PIPE_BUF) each:
# R ready (log open, stream recovered), B/E before/after a store commit, A seq leaf: an ack.
_RECORD = struct.Struct(">cQ32s")


def _send(fd: int, tag: bytes, seq: int = 0, leaf: bytes = bytes(32)) -> None:
    os.write(fd, _RECORD.pack(tag, seq, leaf))


def _child(path: Path, key: KeyPair, wfd: int, seed: int, errors: Path) -> NoReturn:
    """The forked writer: appends from several threads until it is killed. Never returns."""
    code = 0
    try:
        log = Log.open(path, appliance_key=key)
        commit = log.store.append

        def marked(*args: Any, **kwargs: Any) -> tuple[list[StoredEntry], list[StoredCheckpoint]]:
            _send(wfd, b"B")
            result = commit(*args, **kwargs)
            _send(wfd, b"E")
            return result

        log.store.append = marked  # type: ignore[method-assign]  # this child only
        if log.store.size(STREAM) == 0:
            log.open_stream(STREAM, [key.recipient])
        log.checkpoint(STREAM)  # recovers the stream's tree and data key, signs a checkpoint
        _send(wfd, b"R")

        def appender(index: int) -> None:
            rnd = random.Random(seed * 31 + index)
            try:
                for turn in range(1 << 62):
                    body = make_body(rnd, turn)
                    appended = log.append(STREAM, body)
                    _send(wfd, b"A", appended.seq, appended.leaf_hash)  # only after it returned
                    if rnd.random() < 0.5:
                        time.sleep(rnd.uniform(0, 0.003))  # an appender's own work between turns
            except BaseException:
                errors.write_text(traceback.format_exc())
                os._exit(4)

        threads = [threading.Thread(target=appender, args=(i,)) for i in range(APPENDERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()  # never: the appenders run until the SIGKILL
    except BaseException:
        errors.write_text(traceback.format_exc())
        code = 3
    finally:
        os._exit(code)  # never pytest's teardown, atexit or buffered output


def _read_records(rfd: int, buffer: bytearray, *, until_ready: bool) -> bool:
    """Read the child's pipe into ``buffer``: to EOF, or (``until_ready``) until its R.

    Returns whether R was seen (``until_ready``) or EOF was reached.
    """
    while True:
        if until_ready:
            ready, _, _ = select.select([rfd], [], [], 60.0)
            if not ready:
                raise AssertionError("the writer child neither got ready nor died in 60 s")
        chunk = os.read(rfd, 1 << 16)
        if not chunk:
            return not until_ready
        buffer += chunk
        if until_ready and any(
            buffer[i] == ord("R")
            for i in range(0, len(buffer) - len(buffer) % _RECORD.size, _RECORD.size)
        ):
            return True


@dataclass
class KillStats:
    before_ready: int = 0  # still opening the log / recovering the stream
    mid_commit: int = 0  # between B and E: a store transaction (build, insert, commit, fsync)
    idle: int = 0  # between commits
    grew: int = 0  # rounds after which the stream held more entries than before
    acked: int = 0
    audits: int = 0


def test_sigkill_while_appending(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    path = tmp_path / "store.db"
    errors = tmp_path / "child-error.txt"
    key = KeyPair.generate()
    # Created up front so that no round is killed while creating it (see the report).
    Signer.load_or_create(path.with_name(path.name + ".signing-key"), LOG_KEY_NAME)
    checker = StoreChecker(STREAM, key)
    stats = KillStats()
    size = 0
    for round_no in range(KILL_ROUNDS):
        # Round 0 always gets ready, so the store and stream exist from then on; one round in
        # five is killed at random while the child is still opening and recovering.
        wait_ready = round_no == 0 or rng.random() >= 0.2
        delay = rng.uniform(0.001, 0.040)
        child_seed = rng.getrandbits(32)
        rfd, wfd = os.pipe()
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(wfd, fcntl.F_SETPIPE_SZ, 1 << 20)  # room for every record of a round
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            os.close(rfd)
            _child(path, key, wfd, child_seed, errors)
        os.close(wfd)
        buffer = bytearray()
        status = None
        try:
            if wait_ready:
                _read_records(rfd, buffer, until_ready=True)
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            _read_records(rfd, buffer, until_ready=False)
        finally:
            if status is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            os.close(rfd)
        died_by = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        assert died_by == signal.SIGKILL, (
            f"round {round_no}: the writer exited by itself (status {status}):\n"
            + (errors.read_text() if errors.exists() else "")
        )

        assert len(buffer) % _RECORD.size == 0, "a torn record on the pipe"
        tags: list[bytes] = []
        acked: dict[int, bytes] = {}
        for offset in range(0, len(buffer), _RECORD.size):
            tag, seq, leaf = _RECORD.unpack_from(buffer, offset)
            tags.append(tag)
            if tag == b"A":
                assert seq not in acked, f"round {round_no}: seq {seq} acknowledged twice"
                acked[seq] = leaf
        if b"R" not in tags:
            stats.before_ready += 1
        elif tags.count(b"B") > tags.count(b"E"):
            stats.mid_commit += 1
        else:
            stats.idle += 1

        full = round_no % FULL_CHECK_EVERY == FULL_CHECK_EVERY - 1 or round_no == KILL_ROUNDS - 1
        previous = size
        size = checker.check(path, full=full)
        assert size >= previous
        stats.grew += size > previous
        for seq, leaf in sorted(acked.items()):
            assert seq < size, f"round {round_no}: acknowledged seq {seq} lost (size {size})"
            assert checker.leaves[seq] == leaf, f"round {round_no}: seq {seq} is not what was acked"
        assert all(seq >= previous for seq in acked), "acked a seq that existed before the round"
        stats.acked += len(acked)
        if full and audit_if_available(path, key, size):
            stats.audits += 1

    print(
        f"\nSIGKILL x{KILL_ROUNDS}: {stats.mid_commit} mid-commit, {stats.idle} between commits,"
        f" {stats.before_ready} while opening; {stats.acked} acknowledged appends, "
        f"store grew in {stats.grew} rounds to {size} entries, "
        f"{checker.checkpoints_seen} checkpoints; record.audit ran {stats.audits} times"
    )
    assert stats.grew >= KILL_ROUNDS // 2, f"appends happened in only {stats.grew} rounds"
    assert stats.mid_commit > 0, "no kill landed inside a commit: the test exercised nothing"
    assert stats.acked > 0
    # every writer that got as far as appending held the stream's lease, and died holding it:
    # the next one to write says so, once per such kill
    assert checker.takeovers >= KILL_ROUNDS - stats.before_ready - 1, checker.takeovers


# -- 2. durability pragmas; readers and the writer do not block each other -------------------


def _turn(turn: int, data: bytes = b"\x80\xff payload") -> TurnStarted:
    return TurnStarted(turn=turn, input_bytes=data, input_digest=digest(Domain.INPUT, data))


def test_writer_durability_pragmas_and_readers_never_block(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    key = KeyPair.generate()
    with Log.open(path, appliance_key=key) as log:
        store = log.store
        assert isinstance(store, SQLiteStore)
        assert DURABILITY_PRAGMAS == {"journal_mode": "wal", "synchronous": 2}  # 2 = FULL
        assert store.writer_pragmas() == {"journal_mode": "wal", "synchronous": 2}
        log.open_stream(STREAM, [key.recipient])

        reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        try:
            assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # in the file
            reader.execute("BEGIN")
            assert reader.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 1
            # A read transaction is open; the writer must still commit (not time out).
            appended = log.append(STREAM, _turn(0))
            assert appended.seq == 1
            assert reader.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 1  # snapshot
            reader.execute("COMMIT")
            assert reader.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 2
        finally:
            reader.close()

        # And the other way round: a writer holding the write lock does not block a reader.
        other = sqlite3.connect(path, isolation_level=None)
        readonly = SQLiteStore(path, readonly=True)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute(
                "INSERT INTO meta (key, value) VALUES ('crash-safety-test', 'uncommitted')"
            )
            assert readonly.size(STREAM) == 2
            assert [e.seq for e in readonly.entries(STREAM)] == [0, 1]
            assert readonly.get_meta("crash-safety-test") is None
            other.execute("ROLLBACK")
        finally:
            other.close()
            readonly.close()
        assert Path(f"{path}-wal").exists()

    checker = StoreChecker(STREAM, key)
    assert checker.check(path) == 2
    audit_if_available(path, key, 2)


# -- 3. group commit -------------------------------------------------------------------------


class CountingStore(SQLiteStore):
    """Counts transactions, and is a slow disk: appenders arriving meanwhile must queue."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.lock = threading.Lock()
        self.batches: list[int] = []
        self.committed: set[int] = set()

    def append(
        self,
        entries: Any,
        checkpoints: Any = (),
        on_built: Callable[[StoredEntry], None] | None = None,
        holder: str | None = None,
    ) -> tuple[list[StoredEntry], list[StoredCheckpoint]]:
        time.sleep(0.002)
        stored, signed = super().append(entries, checkpoints, on_built, holder)
        with self.lock:
            self.batches.append(len(stored))
            self.committed.update(e.seq for e in stored)
        return stored, signed


def test_group_commit(tmp_path: Path) -> None:
    threads, per_thread = 16, 25
    path = tmp_path / "store.db"
    key = KeyPair.generate()
    store = CountingStore(path)
    signer = Signer.generate(LOG_KEY_NAME)
    log = Log(store, signer, appliance_key=key)
    results: list[Appended] = []
    failures: list[str] = []
    start = threading.Barrier(threads)
    try:
        log.open_stream(STREAM, [key.recipient])
        store.batches.clear()

        def appender(index: int) -> None:
            try:
                start.wait()
                for i in range(per_thread):
                    appended = log.append(STREAM, _turn(i, bytes([index, i, 0xFF]) * i))
                    with store.lock:
                        if appended.seq not in store.committed:
                            failures.append(f"seq {appended.seq} acknowledged before its commit")
                        results.append(appended)
            except BaseException:
                failures.append(traceback.format_exc())

        workers = [threading.Thread(target=appender, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        log.close()

    assert failures == []
    total = threads * per_thread
    assert sorted(a.seq for a in results) == list(range(1, total + 1)), "seqs not distinct/gapless"
    assert sum(store.batches) == total
    assert len(store.batches) < total, "every append had its own commit: no group commit"
    assert max(store.batches) > 1
    checker = StoreChecker(STREAM, key)
    assert checker.check(path) == total + 1
    for a in results:
        assert checker.leaves[a.seq] == a.leaf_hash
        assert a.tree_size == a.seq + 1
        assert a.root_hash == checker.roots[a.seq + 1], f"seq {a.seq}: wrong root acknowledged"
        # Acknowledged with the note its batch signed, which covers it.
        assert a.checkpoint is not None
        note, _ = open_checkpoint(a.checkpoint, [signer.verifier()])
        assert a.seq < note.size and note.root_hash == checker.roots[note.size]
    # One signature per batch, not per append.
    assert len({a.checkpoint for a in results}) == len(store.batches)
    audit_if_available(path, key, total + 1)
    print(f"\ngroup commit: {total} appends in {len(store.batches)} commits")


# -- 4. strace: an fsync of the WAL before each acknowledgement ------------------------------

_DRIVER = Path(__file__).with_name("_strace_driver.py")
_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<rest>.*)$")
_SYNC_DONE = re.compile(r"^(?:f(?:data)?sync)\((?P<fd>\d+)<(?P<path>[^>]*)>\)\s+=\s+(?P<rc>-?\d+)")
_SYNC_START = re.compile(r"^(?:f(?:data)?sync)\((?P<fd>\d+)<(?P<path>[^>]*)> <unfinished \.\.\.>")
_SYNC_RESUMED = re.compile(r"^<\.\.\. f(?:data)?sync resumed>\)\s+=\s+(?P<rc>-?\d+)")
_ACK = re.compile(r'^write\(1(?:<[^>]*>)?, "(?P<text>START|ACK (?P<seq>\d+))\\n"')


def _trace_events(trace: str, store: Path) -> Iterator[tuple[str, int | None]]:
    """("sync", None) when an fsync of the store or its WAL *completes*; ("ack", seq)/("start")."""
    mine = {store.name, store.name + "-wal"}
    pending: dict[str, str] = {}  # pid -> path of its unfinished fsync
    for raw in trace.splitlines():
        m = _LINE.match(raw)
        if m is None:
            continue
        pid, rest = m["pid"], m["rest"]
        if done := _SYNC_DONE.match(rest):
            if Path(done["path"]).name in mine and done["rc"] == "0":
                yield "sync", None
        elif started := _SYNC_START.match(rest):
            pending[pid] = started["path"]
        elif resumed := _SYNC_RESUMED.match(rest):
            synced = pending.pop(pid, "")
            if Path(synced).name in mine and resumed["rc"] == "0":
                yield "sync", None
        elif ack := _ACK.match(rest):
            yield ("start", None) if ack["seq"] is None else ("ack", int(ack["seq"]))


def test_fsync_before_each_acknowledgement(tmp_path: Path) -> None:
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (apt-get install strace; make test/CI installs it)")
    count = 20
    store = tmp_path / "store.db"
    trace_file = tmp_path / "trace.txt"
    repo = Path(__file__).resolve().parents[2]
    paths = [str(repo), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run(
        [strace, "-f", "-y", "-e", "trace=fsync,fdatasync,write", "-o", str(trace_file),
         sys.executable, str(_DRIVER), str(store), str(count)],
        cwd=repo, env=env, capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    stderr = proc.stderr.decode(errors="replace")
    if proc.returncode != 0 and "Operation not permitted" in stderr:
        pytest.skip(f"ptrace is not permitted here: {stderr.strip()[:300]}")
    assert proc.returncode == 0, stderr
    expected = ["START"] + [f"ACK {seq}" for seq in range(1, count + 1)]
    assert proc.stdout.decode().splitlines() == expected

    events = list(_trace_events(trace_file.read_text(errors="replace"), store))
    assert [e for e in events if e[0] != "sync"] == [("start", None)] + [
        ("ack", seq) for seq in range(1, count + 1)
    ], "the trace does not show every acknowledgement"
    synced = False
    for kind, seq in events:
        if kind == "sync":
            synced = True
        elif kind == "ack":
            assert synced, f"ACK {seq} was written with no fsync of the WAL since the last ACK"
            synced = False
        else:
            synced = False  # the stream's opening commit does not count for the first append


def test_interrupted_key_creation_leaves_no_half_written_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash while the signing key is created must not block the next start."""
    from record.checkpoint import Signer

    key_path = tmp_path / "store.db.signing-key"

    def crash(*args: object) -> None:
        raise KeyboardInterrupt("killed between write and link")

    with monkeypatch.context() as patched:
        patched.setattr(os, "link", crash)
        with pytest.raises(KeyboardInterrupt):
            Signer.load_or_create(key_path, "affidavit-log")
    assert not key_path.exists()
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone too
    signer = Signer.load_or_create(key_path, "affidavit-log")
    assert Signer.load_or_create(key_path, "affidavit-log").vkey() == signer.vkey()
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
