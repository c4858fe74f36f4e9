"""Where the panel's pages read from: a live appliance's store, or an exported bundle.

Both are read-only. The appliance's store is opened with SQLite's ``mode=ro`` while the
proxy keeps appending to it; a bundle is the directory ``affidavit log export`` wrote. Bodies
are opened only with a recipient key of the stream (the record's ``StreamKeys`` unwraps a
data key only for a recipient it lists): inside the appliance that is the appliance's own key
(``appliance.key``) or the user's (``user.key``, or ``--key``); for a bundle, the user's key.
A stream none of them can open is shown by its clear envelope alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from harness.state import Home, HomeMissing
from record import merkle
from record.audit import Problem, Row, audit_stream
from record.backends import (
    StoreLocation,
    open_store,
    store_exists,
    store_label,
    store_name,
)
from record.bundle import CHECKPOINTS, ENTRIES, INDEX, LOG_KEY
from record.checkpoint import Checkpoint, CheckpointError, Verifier, log_origin, open_checkpoint
from record.cli import home_log_key, home_store
from record.errors import CannotOpen, SchemaError, StoreMissing, UnknownStream
from record.reader import StreamKeys
from record.redact import RedactionRules
from record.schema import Entry, StreamOpened, Strict, parse_entry
from record.seal import KeyPair
from record.store import LogStore

__all__ = [
    "ApplianceSource",
    "BundleSource",
    "Health",
    "Opened",
    "Position",
    "Source",
    "StreamRecord",
    "check_inclusion",
]

Mode = Literal["appliance", "bundle"]
STREAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # the record's stream names

#: Problem codes that say the record is not what its checkpoints describe.
INCONSISTENT = frozenset(
    {
        "malformed_store",
        "malformed_bundle",
        "malformed_entry",
        "stream_mismatch",
        "leaf_mismatch",
        "seq_order",
        "seq_duplicate",
        "truncated",
        "root_mismatch",
        "checkpoint_invalid",
        "checkpoint_inconsistent",
        "evidence_missing",  # a bundle's evidence files (docs/record.md §11); a file that
        "evidence_unlisted",  # does not match its digest is a content problem, as a body's
    }
)


@dataclass
class Position:
    """Where an entry sits in its stream, and its inclusion proof against the latest
    checkpoint (verified here: the proof must lead to the signed root)."""

    stream: str
    seq: int
    index: int  # the leaf's index in the stream's tree
    leaf_hash: str
    checkpoint_size: int | None = None
    root: str | None = None
    proof: list[str] = field(default_factory=list)
    verified: bool = False
    detail: str = ""


@dataclass
class Health:
    """A stream's record health: its latest checkpoint, gaps and consistency."""

    entries: int
    checkpoints: int
    last_checkpoint: int | None  # the tree size the latest valid checkpoint covers
    last_checkpoint_at: str | None  # occurred_at of the last entry it covers
    gaps: int
    problems: list[Problem]

    @property
    def consistent(self) -> bool:
        return not any(p.code in INCONSISTENT for p in self.problems)

    @property
    def uncovered(self) -> int:
        return self.entries - (self.last_checkpoint or 0)


@dataclass
class StreamRecord:
    """One stream as stored: every stored line (the tree's leaves, in order), the entries
    they parse to, and the stream's checkpoints."""

    stream: str
    rows: list[Row]  # every stored line, as the audit reads it
    notes: list[bytes]  # signed checkpoint notes, in the order the log signed them
    log_key: str | None
    kept: list[bytes] = field(default_factory=list)  # checkpoints the user kept (home)

    def __post_init__(self) -> None:
        self.leaves = [merkle.hash_leaf(row.line) for row in self.rows]
        self.entries: list[Entry] = []
        self.leaf_index: list[int] = []  # the leaf of each entry (a malformed line has none)
        for i, row in enumerate(self.rows):
            try:
                self.entries.append(parse_entry(row.line))
            except SchemaError:
                continue  # the audit names it (malformed_entry)
            self.leaf_index.append(i)
        self._signed: list[tuple[Checkpoint, str]] | None = None
        self._anchor: tuple[Checkpoint, str] | Literal[False] | None = None  # False: none

    @property
    def last_activity(self) -> str | None:
        return self.entries[-1].occurred_at if self.entries else None

    def stream_opened(self) -> StreamOpened | None:
        """The stream's clear opening entry: its labels and recipients."""
        for entry in self.entries:
            if entry.kind == "stream.opened" and isinstance(entry.body, dict):
                try:
                    body = StreamOpened.model_validate(entry.body, strict=True)
                except ValueError:
                    return None
                return body
        return None

    def signed(self) -> list[tuple[Checkpoint, str]]:
        """Every checkpoint whose signature the log key verifies, for this stream's origin,
        largest first, each with who signed it. Nothing here compares it with the stored tree:
        that is what the proofs and the audit are for."""
        if self._signed is not None:
            return self._signed
        found: list[tuple[Checkpoint, str]] = []
        if self.log_key:
            try:
                verifier = Verifier.from_vkey(self.log_key)
            except CheckpointError:
                verifier = None
            if verifier is not None:
                origin = log_origin(verifier.name, verifier.key_id, self.stream)
                signer = f"signed by {verifier.name} ({verifier.key_id.hex()})"
                for note in self.notes:
                    try:
                        cp = open_checkpoint(note, [verifier])[0]
                    except CheckpointError:
                        continue
                    if cp.origin == origin and cp.size > 0:
                        found.append((cp, signer))
        self._signed = sorted(found, key=lambda f: f[0].size, reverse=True)
        return self._signed

    def anchor(self) -> tuple[Checkpoint, str] | None:
        """The latest signed checkpoint whose root is the root of the stored tree at its size:
        how far the record health calls the stream covered."""
        if self._anchor is None:
            self._anchor = next(
                (
                    (cp, signer)
                    for cp, signer in self.signed()
                    if cp.size <= len(self.leaves)
                    and merkle.root(self.leaves[: cp.size]) == cp.root_hash
                ),
                False,
            )
        return self._anchor or None

    def position(self, entry_index: int) -> Position:
        """Where the ``entry_index``-th entry sits, with its inclusion proof against the latest
        signed checkpoint the record reaches (never the latest one whose root the stored tree
        matches: a changed entry must show as a proof that fails, not fall back to an older
        checkpoint; a checkpoint beyond the stored entries is the audit's ``truncated``)."""
        entry = self.entries[entry_index]
        index = self.leaf_index[entry_index]
        pos = Position(self.stream, entry.seq, index, self.leaves[index].hex())
        reached = [(cp, signer) for cp, signer in self.signed() if cp.size <= len(self.leaves)]
        if not reached:
            pos.detail = "no checkpoint signed by the log key covers this stream yet"
            return pos
        cp, signer = reached[0]
        pos.checkpoint_size, pos.root = cp.size, cp.root_hash.hex()
        if index >= cp.size:
            pos.detail = (
                f"not yet covered: the latest checkpoint covers {cp.size} entries "
                f"(seq 0 to {cp.size - 1})"
            )
            return pos
        proof = merkle.inclusion_proof(index, self.leaves[: cp.size])
        return check_inclusion(pos, self.rows[index].line, proof, cp, signer)

    def health(self) -> Health:
        labelled = [(f"checkpoint #{i}", note) for i, note in enumerate(self.notes)]
        kept = [(f"kept checkpoint #{i}", note) for i, note in enumerate(self.kept)]
        problems = audit_stream(self.stream, self.rows, labelled, self.log_key, kept=kept)
        anchor = self.anchor()
        size = anchor[0].size if anchor else None
        at = None
        if size:
            covered = [i for i, leaf in enumerate(self.leaf_index) if leaf < size]
            at = self.entries[covered[-1]].occurred_at if covered else None
        gaps = sum(1 for p in problems if p.code == "seq_gap" and p.seq is not None)
        return Health(len(self.rows), len(self.notes), size, at, gaps, problems)


def check_inclusion(
    pos: Position, line: bytes, proof: list[bytes], cp: Checkpoint, signer: str
) -> Position:
    """Mark ``pos`` verified only if ``proof`` leads from the leaf of ``line`` (the entry as
    stored) to the checkpoint's signed root; otherwise say why not."""
    leaf = merkle.hash_leaf(line)
    pos.leaf_hash = leaf.hex()
    pos.checkpoint_size, pos.root = cp.size, cp.root_hash.hex()
    pos.proof = [h.hex() for h in proof]
    pos.verified = False
    try:
        merkle.verify_inclusion(pos.index, cp.size, leaf, proof, cp.root_hash)
    except merkle.MerkleError as exc:
        pos.detail = f"the proof does not verify against the signed root: {exc}"
        return pos
    pos.verified = True
    pos.detail = (
        f"included in the checkpoint of {cp.size} entries {signer}: "
        f"{len(proof)} hashes lead from the leaf to its root"
    )
    return pos


@dataclass
class Opened:
    """A stream's bodies as one recipient key opens them (``None`` where one does not)."""

    key: KeyPair
    key_name: str
    bodies: list[tuple[int, Strict | None]]
    errors: dict[int, str]
    redaction: RedactionRules | None = None  # pages show these bodies redacted (--redact)

    def strict(self) -> list[tuple[int, Strict]]:
        return [(seq, body) for seq, body in self.bodies if body is not None]


def open_stream(record: StreamRecord, keys: list[tuple[str, KeyPair]]) -> Opened | None:
    """Open the stream's bodies with the first of ``keys`` it is sealed to; None if none."""
    for name, key in keys:
        try:
            stream_keys = StreamKeys.collect(record.stream, record.entries, key)
        except (CannotOpen, SchemaError):
            continue
        bodies: list[tuple[int, Strict | None]] = []
        errors: dict[int, str] = {}
        for entry in record.entries:
            try:
                bodies.append((entry.seq, stream_keys.open(entry)))
            except (CannotOpen, SchemaError) as exc:
                bodies.append((entry.seq, None))
                errors[entry.seq] = str(exc)
        return Opened(key, name, bodies, errors)
    return None


class Source:
    """What every page reads: the streams, each one's record, the keys that may open it."""

    mode: Mode
    home: Home | None = None
    redaction: RedactionRules | None = None  # ``affidavit panel --redact``: every page redacted

    def streams(self) -> list[str]:
        raise NotImplementedError

    def record(self, stream: str) -> StreamRecord:
        raise NotImplementedError

    def keys(self) -> list[tuple[str, KeyPair]]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def describe_safe(self) -> str:
        try:
            return self.describe()
        except HomeMissing as exc:
            return f"no record to read: {exc}"

    def replay_refusal(self) -> str | None:
        """Why no replay can run from this panel at all (None: it can)."""
        raise NotImplementedError

    def store_path(self) -> StoreLocation:
        """The store ``reconstruct_turn`` is handed (with the bodies read here)."""
        raise NotImplementedError

    def export_to(self, stream: str, out: Path) -> Path:
        """Write the stream's auditor bundle under ``out``; returns the bundle directory."""
        raise NotImplementedError


class ApplianceSource(Source):
    """The live appliance's store (``appliance.json`` names it), read-only."""

    mode: Mode = "appliance"

    def __init__(self, home: Home, key: KeyPair | None = None) -> None:
        self.home = self.state = home
        self._key = key

    def store_path(self) -> StoreLocation:
        found = home_store(self.state.root)  # appliance.json's, else `up --store`'s, else record.db
        if not store_exists(found):
            self.state.appliance()  # nothing to read: HomeMissing says no appliance runs here
        return found

    def describe(self) -> str:
        return f"the appliance's record {store_name(self.store_path())} (read-only)"

    def _store(self) -> LogStore:
        try:
            return open_store(self.store_path(), readonly=True)
        except StoreMissing as exc:
            raise HomeMissing(str(exc)) from None

    def streams(self) -> list[str]:
        store = self._store()
        try:
            return store.streams()
        finally:
            store.close()

    def record(self, stream: str) -> StreamRecord:
        if not STREAM_NAME.fullmatch(stream):
            raise UnknownStream(f"{stream!r} is not a stream name")
        store = self._store()
        try:
            name = store_label(self.store_path())
            rows = [Row(e.line, e.seq, e.leaf_hash, name) for e in store.entries(stream)]
            notes = [c.note for c in store.checkpoints(stream)]
            if not rows and not notes:
                raise UnknownStream(f"the record holds no stream {stream!r}")
            log_key = store.get_meta("log_key")
            if log_key is None and store.shared:  # several appliances' streams: this one's key
                log_key = home_log_key(self.state.root)
        finally:
            store.close()
        kept = [p.read_bytes() for p in self.state.checkpoints(stream)]
        return StreamRecord(stream, rows, notes, log_key, kept)

    def keys(self) -> list[tuple[str, KeyPair]]:
        found: list[tuple[str, KeyPair]] = []
        if self._key is not None:
            found.append(("your key (--key)", self._key))
        root = self.state.root
        for name, path in (
            ("the appliance's key", root / "appliance.key"),
            ("your key", root / "user.key"),
        ):
            if path.is_file():
                try:
                    found.append((name, KeyPair.read(path)))
                except ValueError:
                    continue
        return found

    def replay_refusal(self) -> str | None:
        try:
            appliance = self.state.appliance()
        except HomeMissing:
            return (
                f"no appliance is running for {self.state.root}: start one with "
                "`affidavit up` to replay"
            )
        if not Path(appliance.control_socket).exists():
            return f"the appliance's control socket {appliance.control_socket} is not there"
        return None

    def export_to(self, stream: str, out: Path) -> Path:
        from record.bundle import export_stream

        target = out / f"{stream}-bundle"
        export_stream(self.store_path(), stream, target)
        return target


class BundleSource(Source):
    """An exported auditor bundle, opened with the user's key; never written."""

    mode: Mode = "bundle"

    def __init__(self, root: Path, key: KeyPair) -> None:
        if not (root / ENTRIES).is_file():
            raise HomeMissing(f"{root} is not an auditor bundle (no {ENTRIES})")
        self.root = root
        self._key = key

    def describe(self) -> str:
        return f"the exported bundle {self.root} (read-only)"

    def store_path(self) -> Path:
        return self.root

    def _stream(self) -> str | None:
        import json

        try:
            index = json.loads((self.root / INDEX).read_bytes())
        except (OSError, ValueError):
            index = None
        named = index.get("stream") if isinstance(index, dict) else None
        if not isinstance(named, str):
            named = None
            for line in (self.root / ENTRIES).read_bytes().split(b"\n"):
                try:
                    named = parse_entry(line).stream
                    break
                except SchemaError:
                    continue
        # A bundle is outside input: a name no record could hold (it reaches URLs and the
        # export's file name) is no stream here, as an appliance's would not be.
        return named if named is not None and STREAM_NAME.fullmatch(named) else None

    def streams(self) -> list[str]:
        stream = self._stream()
        return [stream] if stream else []

    def record(self, stream: str) -> StreamRecord:
        if stream != self._stream():
            raise UnknownStream(f"the bundle holds no stream {stream!r}")
        data = (self.root / ENTRIES).read_bytes()
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        rows = [Row(line, None, None, f"{ENTRIES} line {i + 1}") for i, line in enumerate(lines)]
        folder = self.root / CHECKPOINTS
        notes = (
            [
                p.read_bytes()
                for p in sorted(folder.iterdir())
                if p.suffix == ".note" and p.is_file()
            ]
            if folder.is_dir()
            else []
        )
        try:
            log_key: str | None = (self.root / LOG_KEY).read_text("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            log_key = None
        return StreamRecord(stream, rows, notes, log_key)

    def keys(self) -> list[tuple[str, KeyPair]]:
        return [("your key", self._key)]

    def replay_refusal(self) -> str | None:
        return (
            "this panel reads an exported bundle, read-only: a replay runs the turn again on "
            "the appliance's pinned engine (run `affidavit panel` there)"
        )

    def export_to(self, stream: str, out: Path) -> Path:
        return self.root
