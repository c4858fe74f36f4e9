"""The log writer: seals, orders, hashes and durably commits entries, one writer per store.

Every append goes through one writer thread. Appenders that arrive while a commit is in
flight queue up and are written together in the next transaction (group commit), so 16
concurrent appenders cost one fsync per batch rather than sixteen. After a batch of four or
more, the next one waits up to 1 ms for as many again (the appenders just answered are on
their way back), so batches stay whole instead of halving; a lone appender never waits. An
append returns only once its transaction is durable.

Inside the transaction each entry gets its ``seq``; only then can it be built, because the
envelope (``seq`` included) is the AEAD associated data and the Merkle leaf covers the whole
line. At the end of every batch, in the same transaction, one checkpoint is signed for each
stream the batch touched, so every entry is covered by a signed checkpoint by the time its
appender hears it is durable: the signing delay is bounded by one group commit, and its cost is
one Ed25519 signature per stream per batch, not per entry. ``checkpoint(stream)`` signs one on
demand (a stream with no new entries, or an old store's unsigned tail).

One writer per stream, for life: a stream is written only by the appliance whose log key its
``stream.opened`` names (``NotOwner`` otherwise), and only by one live process of it at a
time, which takes the stream's lease (``record.store``) before its first write to it. A
process that takes the lease from one that never let go (a crash) first writes
``lease.taken``, naming the writer before it.

This module never verifies: ``record.audit`` does, from the bytes alone.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import uuid6
from pydantic import TypeAdapter

from record import merkle
from record.backends import is_url, open_store
from record.checkpoint import Checkpoint, Signer, log_origin, sign_checkpoint
from record.digest import Domain, canonical_json, digest
from record.errors import CannotOpen, NotOwner, RecordError, UnknownStream
from record.schema import (
    CLEAR_KINDS,
    SCHEMA_VERSION,
    Continuation,
    EvidenceArchived,
    KeyRotated,
    LeaseTaken,
    StreamName,
    StreamOpened,
    Strict,
    WrappedKey,
    body_kind,
    canonical_body,
    envelope_json,
    parse_entry,
    utc_timestamp,
)
from record.seal import KeyPair, RecipientKey, new_data_key, seal_buffer
from record.store import (
    LEASE_WAIT_S,
    Lease,
    LogStore,
    PendingCheckpoint,
    PendingEntry,
    StoredCheckpoint,
    StoredEntry,
    opened_by,
)

LOG_KEY_NAME = "affidavit-log"
_STREAM_NAME: TypeAdapter[str] = TypeAdapter(StreamName)
_MAX_BATCH = 256
#: At most how long a batch waits for the appenders the batch before it had (``Log._run``).
_LINGER_S = 0.001
#: The last batch's size from which the next one lingers (below it: a lone caller or two).
_LINGER_FROM = 4


def origin_for(signer: Signer, stream: str) -> str:
    """One checkpoint origin per stream, unique to the log key that signs it."""
    return log_origin(signer.name, signer.key_id, stream)


def entry_line(envelope: dict[str, Any], body: str | dict[str, Any]) -> tuple[bytes, bytes]:
    """``(line, associated_data)``: the RFC 8785 bytes of the entry and of its envelope.

    JCS sorts members by name and ``body`` sorts before every envelope member, so the line is
    ``{"body":<body>,`` followed by the envelope's own canonical bytes after its ``{``.
    """
    ad = envelope_json(envelope)
    return _splice(canonical_json(body), ad), ad


def _splice(body_json: bytes, ad: bytes) -> bytes:
    return b'{"body":' + body_json + b"," + ad[1:]


#: Bytes of a sealed body base64-encoded at a time (a multiple of 3: no padding in between).
_BASE64_SLICE = 3 * 256 * 1024


def _sealed_line(sealed: bytearray, ad: bytes) -> bytes:
    """``{"body":"<base64 of sealed>",<the envelope's members>}``, the base64 written in
    slices straight into the line (it needs no JSON escaping): for a large body the line is
    the only copy made, not a base64 string and then a line holding it."""
    head, tail = b'{"body":"', b'",' + ad[1:]
    line = bytearray(len(head) + 4 * ((len(sealed) + 2) // 3) + len(tail))
    line[: len(head)] = head
    at, view = len(head), memoryview(sealed)
    for start in range(0, len(sealed), _BASE64_SLICE):
        piece = binascii.b2a_base64(view[start : start + _BASE64_SLICE], newline=False)
        line[at : at + len(piece)] = piece
        at += len(piece)
    line[at:] = tail
    # Kept a bytearray (bytes() would copy it once more): it is only hashed and bound as a
    # BLOB, never changed, and the store reads lines back as bytes.
    return cast(bytes, line)


@dataclass(frozen=True)
class Appended:
    """What an appender learns once its entry is durable."""

    stream: str
    seq: int
    event_id: str
    kind: str
    occurred_at: str
    leaf_hash: bytes
    tree_size: int
    root_hash: bytes
    checkpoint: bytes | None = None  # the note signed at the end of this append's batch


@dataclass
class _StreamState:
    tree: merkle.CompactRange
    epoch: int
    data_key: bytes | None  # None until opened with a recipient key (after a restart)


@dataclass
class _Request:
    stream: str
    kind: str
    payload: bytes | dict[str, Any]  # sealed kinds: body plaintext; clear kinds: body object
    future: Future[Appended] = field(default_factory=Future)
    new_key: tuple[int, bytes] | None = None  # (epoch, data key) a clear entry brings in
    envelope: dict[str, Any] | None = None  # set once the entry is built
    evidence: tuple[str, bytes] | None = None  # the file an evidence.archived entry names


class Log:
    """The single writer of one store. Thread-safe; ``append_async`` for asyncio callers."""

    def __init__(
        self,
        store: LogStore,
        signer: Signer,
        *,
        appliance_key: KeyPair | None = None,
        lease_wait: float = LEASE_WAIT_S,
    ) -> None:
        """``lease_wait``: how long the first write to a stream waits for another live writer
        of it to let go before it is refused (``LeaseHeld``)."""
        self.store = store
        self.signer = signer
        self.appliance_key = appliance_key
        _check_store_key(store, signer, claim=True)
        #: this process's name on the leases it takes: host, process id, a random tag
        self.holder = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
        self._leased: set[str] = set()  # written by the writer thread only
        self._lease_wait = lease_wait
        self._streams: dict[str, _StreamState] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # the store's writer connection is not shareable
        self._evidence_lock = threading.Lock()  # one evidence archive at a time
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="record-writer", daemon=True)
        self._thread.start()

    @classmethod
    def open(
        cls,
        location: Path | str,
        *,
        signing_key: Path | None = None,
        appliance_key: KeyPair | None = None,
        lease_wait: float = LEASE_WAIT_S,
    ) -> Log:
        """Open (or create) a store and its log signing key (0600, created at first start).

        ``location``: a SQLite file, whose key defaults to ``<file>.signing-key`` beside it, or
        a PostgreSQL URL, which needs ``signing_key``: the key is this appliance's, kept on
        its own disk, never in the shared database.
        """
        key_file = signing_key_file(location, signing_key)
        store = open_store(location)  # first: a store it cannot write leaves no new key behind
        try:
            signer = Signer.load_or_create(key_file, LOG_KEY_NAME)
        except BaseException:
            store.close()
            raise
        return cls(store, signer, appliance_key=appliance_key, lease_wait=lease_wait)

    # -- public API ------------------------------------------------------------------------------

    def log_key(self) -> str:
        """The C2SP verifier key of checkpoint signatures, for attestation binding."""
        return self.signer.vkey()

    def open_stream(
        self,
        stream: str,
        recipients: Sequence[RecipientKey],
        labels: dict[str, str] | None = None,
        continues: Continuation | None = None,
    ) -> Appended:
        """Append the stream's opening entry, sealing a fresh data key to every recipient;
        ``continues`` names the other appliance's stream this one carries on."""
        if not recipients:
            raise ValueError("a stream needs at least one recipient key")
        _STREAM_NAME.validate_python(stream)
        if self.store.size(stream):
            raise ValueError(f"stream {stream!r} already exists")
        data_key = new_data_key()
        body = StreamOpened(
            origin=origin_for(self.signer, stream),
            log_key=self.signer.vkey(),
            key_epoch=0,
            recipients=_wrap_all(recipients, data_key, stream, 0),
            labels=labels or {},
            continues=continues,
        )
        return self._submit(stream, body, new_key=(0, data_key)).result()

    def rotate_key(self, stream: str, recipients: Sequence[RecipientKey]) -> Appended:
        """Start a new key epoch: later bodies are sealed under a fresh data key."""
        state = self._state(stream)
        epoch = state.epoch + 1
        data_key = new_data_key()
        body = KeyRotated(
            key_epoch=epoch, recipients=_wrap_all(recipients, data_key, stream, epoch)
        )
        return self._submit(stream, body, new_key=(epoch, data_key)).result()

    def append(self, stream: str, body: Strict) -> Appended:
        """Seal and durably append ``body``; blocks until its commit (and the checkpoint that
        covers it) is on disk."""
        return self._submit(stream, body).result()

    async def append_async(self, stream: str, body: Strict) -> Appended:
        return await asyncio.wrap_future(self._submit(stream, body))

    def archive_evidence(self, stream: str, evidence_kind: str, name: str, data: bytes) -> Appended:
        """Keep attestation evidence for the stream's bundle and record its digest: the file
        and its ``evidence.archived`` entry in one transaction (both, or neither)."""
        body = EvidenceArchived.model_validate(
            {
                "evidence_kind": evidence_kind,
                "file": name,
                "evidence_digest": digest(Domain.EVIDENCE, data),
            }
        )
        self._state(stream)
        # checked here, one archive at a time: a refused insert would sink its whole batch
        with self._evidence_lock:
            if any(kept == name for kept, _ in self.store.evidence(stream)):
                raise ValueError(f"evidence {name!r} is already kept for stream {stream!r}")
            return self._submit(stream, body, evidence=(name, data)).result()

    def checkpoint(self, stream: str) -> StoredCheckpoint:
        """Sign a checkpoint of the stream's current tree now, on demand."""
        if self._closed:  # no writer thread is left to answer the request
            raise RecordError("the log is closed")
        self._state(stream)
        request = _Request(stream, "", b"")
        self._queue.put(request)
        appended = request.future.result()
        assert appended.checkpoint is not None
        return StoredCheckpoint(stream, appended.tree_size, appended.checkpoint)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()
            try:
                if self._leased:  # a clean stop: the next writer takes over, no takeover
                    self.store.release_leases(self.holder)
            except Exception:  # a store that cannot be reached now
                # The locks still go with the connection or file closed below; the rows stay
                # "not let go", so the next writer records a takeover: true enough of a stop
                # that could not say it was clean.
                pass
            finally:
                self.store.close()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------

    def _submit(
        self,
        stream: str,
        body: Strict,
        *,
        new_key: tuple[int, bytes] | None = None,
        evidence: tuple[str, bytes] | None = None,
    ) -> Future[Appended]:
        if self._closed:
            raise RecordError("the log is closed")
        kind = body_kind(body)
        if new_key is None:
            if kind in CLEAR_KINDS:
                raise ValueError(f"{kind} entries are written by open_stream/rotate_key")
            self._state(stream)  # refuse unknown streams before queueing
        # A clear body leaves out a member it does not have (``StreamOpened.continues``): a
        # stream without one is byte for byte what it was before the member existed.
        payload: bytes | dict[str, Any]
        if kind in CLEAR_KINDS:
            payload = body.model_dump(mode="json", exclude_none=True)
        else:
            payload = canonical_body(body)
        request = _Request(stream, kind, payload, new_key=new_key, evidence=evidence)
        self._queue.put(request)
        return request.future

    def _with_leases(self, batch: list[_Request]) -> list[_Request]:
        """The batch, each stream leased to this writer first (on the writer's thread, which
        owns the store's writer connection): a request for a stream another appliance opened,
        or that another live process writes, fails alone. A takeover from a writer that never
        let go (a crash) puts ``lease.taken`` before the stream's first entry here."""
        ready: list[_Request] = []
        refused: dict[str, BaseException] = {}  # one wait per stream per batch, not per request
        for request in batch:
            if request.stream in refused:
                request.future.set_exception(refused[request.stream])
                continue
            if request.stream not in self._leased:
                try:
                    orphaned = self._take_lease(request)
                    if orphaned is not None:  # a row from the database: checked like any input
                        body = LeaseTaken(
                            holder=self.holder,
                            previous_holder=orphaned.holder,
                            previous_since=orphaned.since,
                        )
                        ready.append(_Request(request.stream, body.kind, canonical_body(body)))
                except BaseException as exc:
                    refused[request.stream] = exc
                    request.future.set_exception(exc)
                    continue
            ready.append(request)
        return ready

    def _take_lease(self, request: _Request) -> Lease | None:
        opening = request.kind == "stream.opened"
        if not opening:
            _check_owner(self.store, self.signer, request.stream, "append to it")
        with self._write_lock:
            orphaned = self.store.take_lease(request.stream, self.holder, wait=self._lease_wait)
        self._leased.add(request.stream)
        # what was read of the stream before it was ours is stale if the writer it waited for
        # appended since (entries are only ever added: the same size is the same stream)
        size = self.store.size(request.stream)
        with self._lock:
            state = self._streams.get(request.stream)
            if state is not None and state.tree.size != size:
                del self._streams[request.stream]
        # a stream's first entry is its opening: an opening that crashed before its commit
        # left a lease and nothing else, and there is nothing to record it in
        return None if opening else orphaned

    def _state(self, stream: str) -> _StreamState:
        with self._lock:
            state = self._streams.get(stream)
        if state is not None:
            return state
        leaves = self.store.leaf_hashes(stream)
        if not leaves:
            raise UnknownStream(f"stream {stream!r} has not been opened")
        tree = merkle.CompactRange()
        for leaf in leaves:
            tree.append(leaf)
        epoch, data_key = self._recover_key(stream)
        state = _StreamState(tree, epoch, data_key)
        with self._lock:
            return self._streams.setdefault(stream, state)

    def _recover_key(self, stream: str) -> tuple[int, bytes | None]:
        """The latest data key after a restart, unwrapped with the appliance's own key."""
        epoch, wrapped = 0, None
        for stored in self.store.entries(stream):
            if not stored.line.startswith(b'{"body":{'):
                continue  # a sealed body: only clear (key-distribution) entries matter here
            entry = parse_entry(stored.line)
            if entry.kind in CLEAR_KINDS and isinstance(entry.body, dict):
                epoch = int(entry.body["key_epoch"])  # type: ignore[arg-type]
                wrapped = entry.body["recipients"]
        if self.appliance_key is None or not isinstance(wrapped, list):
            return epoch, None
        mine = self.appliance_key.recipient.text()
        for item in wrapped:
            if isinstance(item, dict) and item.get("recipient") == mine:
                sealed_key = base64.b64decode(str(item["sealed_key"]))
                return epoch, self.appliance_key.unwrap(sealed_key, stream, epoch)
        return epoch, None

    def _run(self) -> None:
        crowd = 1  # how many appenders are waiting on us, as far as the last batch showed
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            # Group commit that waits for the crowd it saw: when the last batch had many
            # appenders, those just answered are still on their way back with their next
            # entry; a short wait for them makes one commit (and one signature) of what
            # would be two. One caller, or a proxy call's couple of entries, never waits.
            linger = time.monotonic() + _LINGER_S if crowd >= _LINGER_FROM else 0.0
            while len(batch) < _MAX_BATCH:
                wait = linger - time.monotonic() if len(batch) < crowd else 0.0
                try:
                    item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            try:
                self._commit(batch)
            except BaseException as exc:  # a fault no one request owns: fail the batch, go on
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
            # The crowd: this batch's appenders, on their way back now, and those who came
            # meanwhile (others: this batch's were waiting on it). Counting only the batch
            # would let two halves of one crowd take turns, each paying a whole commit.
            crowd = min(len(batch) + self._queue.qsize(), _MAX_BATCH)
            if stop:
                return

    def _commit(self, batch: list[_Request]) -> None:
        batch = self._with_leases(batch)
        trees: dict[str, merkle.CompactRange] = {}
        keys: dict[str, tuple[int, bytes | None]] = {}
        pending: list[PendingEntry] = []
        wanted: dict[str, PendingCheckpoint] = {}
        live: list[_Request] = []
        opened: set[str] = set()
        for request in batch:
            try:
                self._prepare(request, trees, keys, opened)
            except BaseException as exc:  # a bad request must not sink the batch
                request.future.set_exception(exc)
                continue
            live.append(request)
            if request.kind:
                pending.append(
                    PendingEntry(
                        request.stream, self._builder(request, keys), evidence=request.evidence
                    )
                )
            if request.stream not in wanted:  # one signature per stream per batch
                wanted[request.stream] = PendingCheckpoint(
                    request.stream, self._checkpoint_signer(request.stream, trees)
                )
        roots: dict[tuple[str, int], bytes] = {}

        def on_built(entry: StoredEntry) -> None:
            tree = trees[entry.stream]
            tree.append(entry.leaf_hash)
            roots[(entry.stream, entry.seq)] = tree.root()

        try:
            with self._write_lock:
                stored, signed = self.store.append(
                    pending, list(wanted.values()), on_built, holder=self.holder
                )
        except BaseException as exc:
            for request in live:
                request.future.set_exception(exc)
            return
        for stream, tree in trees.items():
            epoch, key = keys[stream]
            self._streams[stream] = _StreamState(tree, epoch, key)
        notes = {cp.stream: cp for cp in signed}
        entries = iter(stored)
        for request in live:
            note = notes[request.stream]
            if not request.kind:
                root = trees[request.stream].root()
                request.future.set_result(
                    Appended(
                        request.stream, note.size - 1, "", "", "", b"", note.size, root, note.note
                    )
                )
                continue
            entry = next(entries)
            assert request.envelope is not None
            request.future.set_result(
                Appended(
                    stream=entry.stream,
                    seq=entry.seq,
                    event_id=request.envelope["event_id"],
                    kind=request.kind,
                    occurred_at=request.envelope["occurred_at"],
                    leaf_hash=entry.leaf_hash,
                    tree_size=entry.seq + 1,
                    root_hash=roots[(entry.stream, entry.seq)],
                    checkpoint=note.note,
                )
            )

    def _prepare(
        self,
        request: _Request,
        trees: dict[str, merkle.CompactRange],
        keys: dict[str, tuple[int, bytes | None]],
        opened: set[str],
    ) -> None:
        if request.stream not in trees:
            state = self._streams.get(request.stream)
            if state is None and request.kind != "stream.opened":
                state = self._state(request.stream)
            if state is None:
                trees[request.stream] = merkle.CompactRange()
                keys[request.stream] = (0, None)
            else:
                trees[request.stream] = merkle.CompactRange(state.tree.size, state.tree.hashes)
                keys[request.stream] = (state.epoch, state.data_key)
        if request.kind == "stream.opened" and (
            trees[request.stream].size
            or request.stream in self._streams
            or request.stream in opened
        ):
            raise ValueError(f"stream {request.stream!r} already exists")
        if request.kind == "stream.opened":
            opened.add(request.stream)
        if request.new_key is not None:
            keys[request.stream] = request.new_key
        elif request.kind and request.kind not in CLEAR_KINDS and keys[request.stream][1] is None:
            raise CannotOpen(
                f"stream {request.stream!r}: no data key in memory; open the log with a "
                "recipient key of the stream (the appliance key) to keep appending"
            )

    def _builder(
        self, request: _Request, keys: dict[str, tuple[int, bytes | None]]
    ) -> Callable[[int], tuple[bytes, bytes]]:
        epoch, data_key = keys[request.stream]

        def build(seq: int) -> tuple[bytes, bytes]:
            envelope: dict[str, Any] = {
                "schema_version": SCHEMA_VERSION,
                "stream": request.stream,
                "seq": seq,
                "event_id": str(uuid6.uuid7()),
                "kind": request.kind,
                "occurred_at": utc_timestamp(),
                "key_epoch": epoch,
            }
            request.envelope = envelope
            ad = envelope_json(envelope)
            if isinstance(request.payload, dict):
                line = _splice(canonical_json(request.payload), ad)
            else:
                assert data_key is not None
                sealed = seal_buffer(data_key, request.payload, ad)
                request.payload = b""  # sealed now: a large body is not held twice more
                line = _sealed_line(sealed, ad)
            return line, merkle.hash_leaf(line)

        return build

    def _checkpoint_signer(
        self, stream: str, trees: dict[str, merkle.CompactRange]
    ) -> Callable[[int], bytes]:
        def sign(size: int) -> bytes:
            tree = trees[stream]
            if tree.size != size:
                raise RecordError(f"tree of {stream} has {tree.size} leaves, store has {size}")
            cp = Checkpoint(origin_for(self.signer, stream), size, tree.root())
            return sign_checkpoint(self.signer, cp)

        return sign


def _check_store_key(store: LogStore, signer: Signer, *, claim: bool) -> None:
    """One appliance's own file has one log key for all of it (a shared store has none):
    another key is refused; ``claim`` records this one in a store that has none yet."""
    if store.shared:
        return
    kept = store.get_meta("log_key")
    if kept is None and claim:
        store.set_meta("log_key", signer.vkey())
    elif kept is not None and kept != signer.vkey():
        raise RecordError(f"this store's checkpoints are signed by {kept}, not this key")


def _check_owner(store: LogStore, signer: Signer, stream: str, what: str) -> None:
    """A stream is its opener's for life: another appliance's log key may not ``what``."""
    owner = opened_by(store, stream)
    if owner is not None and owner != signer.vkey():
        raise NotOwner(
            f"stream {stream!r} was opened by the appliance whose log key is {owner}; this "
            f"one ({signer.vkey()}) may not {what}: continue the session in a new stream"
        )


def signing_key_file(location: Path | str, given: Path | None = None) -> Path:
    """Where a store's log signing key is: ``given``, else ``<file>.signing-key`` beside a
    SQLite file; a PostgreSQL store has none beside it (the key is the appliance's)."""
    if given is not None:
        return given
    if is_url(location):
        raise ValueError("a PostgreSQL store needs signing_key: the log key's file")
    path = Path(location)
    return path.with_name(path.name + ".signing-key")


def sign_stored(store: LogStore, signer: Signer, stream: str) -> StoredCheckpoint:
    """A checkpoint of ``stream`` as stored, signed by a process that is not its writer
    (``affidavit log checkpoint`` beside a running appliance, which holds the stream's lease).

    It adds no entry, so it needs no lease: its size is the one its transaction sees (which,
    holding the stream's lock, no batch can change) and its root is computed from the stored
    leaves up to that size, which are never rewritten. Only the stream's own log key signs:
    another key is refused, as a writer with it would be.
    """
    if not store.size(stream):
        raise UnknownStream(f"stream {stream!r} has not been opened")
    _check_store_key(store, signer, claim=False)
    _check_owner(store, signer, stream, "sign its checkpoints")

    def sign(size: int) -> bytes:
        tree = merkle.CompactRange()
        for leaf in store.leaf_hashes(stream, size):
            tree.append(leaf)
        if tree.size != size:
            raise RecordError(f"tree of {stream} has {tree.size} leaves, store has {size}")
        return sign_checkpoint(signer, Checkpoint(origin_for(signer, stream), size, tree.root()))

    _, signed = store.append([], [PendingCheckpoint(stream, sign)])
    return signed[0]


def _wrap_all(
    recipients: Iterable[RecipientKey], data_key: bytes, stream: str, epoch: int
) -> list[WrappedKey]:
    return [
        WrappedKey(recipient=r.text(), sealed_key=r.wrap(data_key, stream, epoch))
        for r in recipients
    ]
