"""The log store contract: what any backend (SQLite now, PostgreSQL next) must guarantee.

- ``append`` runs one transaction for a whole batch: for each pending entry it reads the
  stream's next ``seq`` (0, 1, 2 … with no gap) *inside* that transaction, asks the entry to
  build its bytes for that ``seq``, and inserts them. Either every entry of the batch is
  durable when it returns, or none is written.
- Nothing is ever updated or deleted.
- Readers never block the writer.
- One writer per stream: a writer first takes the stream's lease (``take_lease``), which only
  one live process holds at a time, and every batch it writes checks, inside its transaction,
  that the lease is still its own. A holder that ends without letting go (a crash) loses the
  lease when its process does (its session, its lock); the next taker learns who that was.

This module holds only the contract and its plain data types; it never touches a database.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from record.errors import LeaseHeld, LeaseLost, RecordError
from record.schema import parse_entry


@dataclass(frozen=True)
class StoredEntry:
    stream: str
    seq: int
    line: bytes  # the entry's exact stored bytes (canonical JSON, no trailing newline)
    leaf_hash: bytes  # RFC 9162 leaf hash of ``line``


@dataclass(frozen=True)
class StoredCheckpoint:
    stream: str
    size: int
    note: bytes  # the complete signed note


@dataclass
class PendingEntry:
    """An entry waiting for its ``seq``: ``build(seq)`` returns ``(line, leaf_hash)``.

    ``evidence``: the ``(name, data)`` of the file an ``evidence.archived`` entry names, kept
    in the same transaction as the entry, so a crash never leaves a file no entry names (a
    bundle would then fail with ``evidence_unlisted``) nor an entry naming no file."""

    stream: str
    build: Callable[[int], tuple[bytes, bytes]]
    evidence: tuple[str, bytes] | None = None


def check_evidence_name(name: str) -> None:
    """A bundle writes each evidence file under ``evidence/`` by this name: a plain one."""
    if "/" in name or name.startswith(".") or not name:
        raise ValueError(f"evidence name {name!r} must be a plain file name")


@dataclass
class PendingCheckpoint:
    """A checkpoint to sign once the batch's entries are in: ``sign(size)`` gives the note."""

    stream: str
    sign: Callable[[int], bytes]


#: How long ``take_lease`` waits for a live holder to let go before refusing: a crashed
#: holder's database session can take a moment to end after its process did.
LEASE_WAIT_S = 10.0


@dataclass(frozen=True)
class Lease:
    """A stream's writer lease, as its row says: who took it, when, and whether they let go."""

    stream: str
    holder: str
    since: str  # RFC 3339 UTC, the taker's clock
    released: bool


def claim(stream: str, row: Lease | None, holder: str, now: str) -> tuple[Lease, Lease | None]:
    """The lease ``holder`` writes once it holds the stream's lock, and the one it replaces
    when that holder never let go (a crash: the caller records it); ``None`` otherwise."""
    orphaned = row if row is not None and not row.released and row.holder != holder else None
    return Lease(stream, holder, now, released=False), orphaned


class BatchTarget(Protocol):
    """One open write transaction of a backend, as :func:`write_batch` uses it."""

    def size(self, stream: str) -> int:
        """The stream's next ``seq``, as this transaction sees it (its own inserts too)."""
        ...

    def insert_evidence(self, stream: str, name: str, data: bytes) -> None: ...

    def insert_entry(self, entry: StoredEntry) -> None: ...

    def insert_checkpoint(self, checkpoint: StoredCheckpoint) -> None: ...

    def leases(self, streams: Sequence[str]) -> dict[str, Lease]:
        """The lease rows of ``streams`` (those that have one), as this transaction sees
        them: one read for the whole batch."""
        ...


def write_batch(
    target: BatchTarget,
    entries: Sequence[PendingEntry],
    checkpoints: Sequence[PendingCheckpoint],
    on_built: Callable[[StoredEntry], None] | None,
    holder: str | None = None,
) -> tuple[list[StoredEntry], list[StoredCheckpoint]]:
    """The contract's one way to write a batch, inside the backend's open transaction.

    With ``holder``, every stream the batch touches must be leased to it (else
    ``LeaseLost``, and the backend rolls the whole batch back). Each entry gets the next
    ``seq`` of its stream (read once from the transaction, then counted here), is built for
    it, and is inserted with its evidence, if any; each checkpoint is then signed over its
    stream's size after the batch. Every backend calls this, so ``seq`` is assigned the same
    way whatever holds the rows.
    """
    if holder is not None:
        touched = sorted({p.stream for p in entries} | {cp.stream for cp in checkpoints})
        held = target.leases(touched)
        for stream in touched:
            check_lease(stream, held.get(stream), holder)
    next_seq: dict[str, int] = {}
    stored: list[StoredEntry] = []
    signed: list[StoredCheckpoint] = []
    for pending in entries:
        seq = next_seq.get(pending.stream)
        if seq is None:
            seq = target.size(pending.stream)
        line, leaf = pending.build(seq)
        if pending.evidence is not None:
            name, data = pending.evidence
            check_evidence_name(name)
            target.insert_evidence(pending.stream, name, data)
        entry = StoredEntry(pending.stream, seq, line, leaf)
        target.insert_entry(entry)
        next_seq[pending.stream] = seq + 1
        stored.append(entry)
        if on_built is not None:
            on_built(entry)
    for cp in checkpoints:
        size = next_seq.get(cp.stream)
        if size is None:
            size = target.size(cp.stream)
        checkpoint = StoredCheckpoint(cp.stream, size, cp.sign(size))
        target.insert_checkpoint(checkpoint)
        signed.append(checkpoint)
    return stored, signed


def opened_by(store: LogStore, stream: str) -> str | None:
    """The log key a stream's ``stream.opened`` names: its owner, one entry read. None when
    the stream is empty or its first entry is not a readable opening (an audit names that)."""
    first = next(iter(store.entries(stream, 0, 1)), None)
    if first is None:
        return None
    try:
        entry = parse_entry(first.line)
    except (RecordError, ValueError):
        return None
    key = entry.body.get("log_key") if isinstance(entry.body, dict) else None
    return key if entry.kind == "stream.opened" and isinstance(key, str) else None


def lease_held(stream: str, lease: Lease | None) -> LeaseHeld:
    """The refusal of a second writer, naming who holds the stream as its lease row says."""
    who = f"{lease.holder}, since {lease.since}" if lease is not None else "another writer"
    return LeaseHeld(
        f"stream {stream!r} is being written by another live process ({who}): one writer per "
        "stream; stop that one first, or continue the session in a new stream"
    )


def check_lease(stream: str, lease: Lease | None, holder: str) -> None:
    """Refuse a write by ``holder`` to a stream whose lease is not (or no longer) its own."""
    if lease is None or lease.holder != holder or lease.released:
        now = "nobody" if lease is None or lease.released else lease.holder
        raise LeaseLost(
            f"stream {stream!r}: this writer ({holder}) does not hold its lease ({now} does); "
            "nothing of this batch was written"
        )


class LogStore(ABC):
    """A durable, append-only home for entries and checkpoints."""

    #: Whether several appliances may share it (a database server, not a local file): then
    #: each stream's log key is its own, named by its ``stream.opened``, not one per store.
    shared = False

    @abstractmethod
    def append(
        self,
        entries: Sequence[PendingEntry],
        checkpoints: Sequence[PendingCheckpoint] = (),
        on_built: Callable[[StoredEntry], None] | None = None,
        holder: str | None = None,
    ) -> tuple[list[StoredEntry], list[StoredCheckpoint]]:
        """Write ``entries`` then ``checkpoints`` in one durable transaction.

        ``on_built`` sees each entry as it is built, so checkpoint signers can cover it.
        ``holder``: the writer's lease name; each stream touched must be leased to it.
        """

    @abstractmethod
    def take_lease(self, stream: str, holder: str, *, wait: float = LEASE_WAIT_S) -> Lease | None:
        """Become ``stream``'s one writer, until ``release_leases`` or this process ends.

        Returns the lease it replaced when that holder never let go (it crashed), else None.
        Raises ``LeaseHeld`` when another live writer still holds it after ``wait`` seconds.
        """

    @abstractmethod
    def release_leases(self, holder: str) -> None:
        """Let go of every lease ``holder`` took (a clean stop: the next taker is no takeover)."""

    @abstractmethod
    def lease(self, stream: str) -> Lease | None:
        """The stream's lease row, if it ever had a writer that took one."""

    @abstractmethod
    def writer_alive(self, stream: str) -> bool:
        """Whether a live process holds the stream's lease right now (its lock, not its
        row: a crashed writer's row stays, its lock does not). Takes nothing: a lock free at
        the look is let go at once."""

    @abstractmethod
    def entries(
        self, stream: str, start: int = 0, stop: int | None = None
    ) -> Iterator[StoredEntry]:
        """Entries of ``stream`` in ``seq`` order, from ``start`` up to (not incl.) ``stop``."""

    @abstractmethod
    def streams(self) -> list[str]: ...

    @abstractmethod
    def size(self, stream: str) -> int:
        """How many entries ``stream`` holds (its next ``seq``)."""

    @abstractmethod
    def leaf_hashes(self, stream: str, stop: int | None = None) -> list[bytes]: ...

    @abstractmethod
    def checkpoints(self, stream: str) -> list[StoredCheckpoint]:
        """Checkpoints of ``stream`` in the order they were written."""

    @abstractmethod
    def archive_evidence(self, stream: str, name: str, data: bytes) -> None:
        """Keep an attestation evidence file for the stream's bundle (write once)."""

    @abstractmethod
    def evidence(self, stream: str) -> list[tuple[str, bytes]]: ...

    @abstractmethod
    def get_meta(self, key: str) -> str | None: ...

    @abstractmethod
    def set_meta(self, key: str, value: str) -> None:
        """Set a store-wide value once; an existing different value is refused."""

    @abstractmethod
    def close(self) -> None: ...
