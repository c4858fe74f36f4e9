"""The audit: check a store or a bundle from its bytes alone, and name every problem.

Without a key it checks what anyone can: every line is a valid entry of its stream, ``seq``
runs 0, 1, 2 … with no gap, duplicate or reordering, the Merkle tree over the stored bytes
matches every checkpoint signed by the log key, checkpoints agree with each other, the log
still holds everything a checkpoint covered (or that a user kept, ``against``), and every
entry is covered by a signed checkpoint. Entries after the largest matching checkpoint are
an unsigned tail: anyone with the public keys alone could have written them (a whole forged
stream is all tail), so they are a problem unless the caller tolerates them
(``allow_unsigned_tail``; a store written before every batch was signed). With a recipient
key it also opens every body and recomputes every digest against its bytes. A stream that
continues another appliance's stream has its link checked against that stream when the store
holds it too (``record.continuation``); otherwise the report says the link was not checked.

Problem codes (stable; ``docs/record.md`` lists them):

==========================  ========================================================
``malformed_store``         the store file is not a readable record store
``malformed_bundle``        a bundle file is missing, cut short or malformed
``malformed_entry``         a stored line is not a valid entry (names the field), or a clear
                            body (``stream.opened``, ``key.rotated``) is not valid
``stream_mismatch``         an entry names another stream than the one holding it
``leaf_mismatch``           a stored leaf hash is not the hash of the stored line
``seq_gap``                 a ``seq`` is missing (a lost or deleted entry)
``seq_order``               entries are stored out of ``seq`` order
``seq_duplicate``           a ``seq`` appears twice
``truncated``               the log holds fewer entries than a checkpoint covers
``root_mismatch``           the tree at a checkpoint's size has another root
``checkpoint_invalid``      a checkpoint is malformed, for another origin, or not signed
                            by the log key
``checkpoint_inconsistent`` two checkpoints that cannot both describe this log
``unsigned_tail``           entries that no checkpoint signed by the log key covers (not
                            tolerated when no checkpoint matches at all)
``continuation_broken``     a stream continues another one (``stream.opened.continues``) that
                            is at hand, and the link does not hold against it
``cannot_open``             (with a key) a body does not open
``malformed_body``          (with a key) an opened body is not valid for its kind
``body_digest_mismatch``    (with a key) a digest does not match the bytes it covers
``evidence_missing``        (bundles) an evidence file that is named is not in ``evidence/``
``evidence_unlisted``       (bundles) a file in ``evidence/`` that nothing names
``evidence_digest_mismatch`` (bundles, with a key) an evidence file is not what its
                            ``evidence.archived`` entry's digest covers
==========================  ========================================================

This module never writes and never reads the clock.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from record import merkle
from record.backends import open_store, store_label
from record.checkpoint import (
    Checkpoint,
    CheckpointError,
    Verifier,
    log_origin,
    open_checkpoint,
    parse_checkpoint,
    parse_note,
)
from record.continuation import LinkBroken, check_link, opening_of
from record.digest import Domain, digest
from record.errors import CannotOpen, SchemaError
from record.reader import StreamKeys, digest_mismatches
from record.schema import (
    CLEAR_KINDS,
    Continuation,
    Entry,
    EntryHead,
    EvidenceArchived,
    KeyRotated,
    StreamOpened,
    head_of,
    parse_body,
    parse_entry,
    parse_head,
)
from record.seal import KeyPair
from record.store import LogStore, opened_by

#: At most this many problems of one code are listed per stream; the rest are counted.
_PER_CODE_LIMIT = 50

UNSIGNED_TAIL = "unsigned_tail"
CONTINUATION_BROKEN = "continuation_broken"

#: Checks a link against the stream it names, as the caller holds that stream: ``True`` when
#: it was checked and holds, ``False`` when the stream is not at hand (nothing was checked),
#: ``LinkBroken`` when it does not hold.
LinkCheck = Callable[[Continuation], bool]


@dataclass(frozen=True)
class Problem:
    code: str
    stream: str
    seq: int | None
    detail: str


@dataclass(frozen=True)
class Continues:
    """A stream's link to the stream it continues (``stream.opened.continues``), as audited.

    ``checked`` is whether the continued stream was at hand to check the link against (a
    bundle holds one stream only); ``holds`` is ``None`` when it was not.
    ``checkpoint_size`` is the size the link's note states (``None`` when the note does not
    parse); it is the continued log's word only when the link was checked and holds.
    """

    stream: str
    size: int
    checkpoint_size: int | None
    checked: bool
    holds: bool | None


@dataclass
class Report:
    """The audit's verdict: ``ok`` only when no problem was found.

    ``unsigned`` counts, per stream, the entries no signed checkpoint covers; it is filled
    whether or not the unsigned tail counts as a problem (``allow_unsigned_tail``).
    ``continues`` holds, per stream that continues another, what became of its link.
    """

    entries: int = 0
    streams: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    unsigned: dict[str, int] = field(default_factory=dict)
    allow_unsigned_tail: bool = False
    continues: dict[str, Continues] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def codes(self) -> set[str]:
        return {p.code for p in self.problems}

    def add_stream(self, audit: StreamAudit) -> None:
        """Take one stream's findings; its unsigned tail is a problem unless tolerated.

        A tail is tolerated only after a checkpoint that matches: a stream no checkpoint
        covers at all (none, or none that verifies) proves nothing, tolerated or not.
        """
        self.streams.append(audit.stream)
        self.unsigned[audit.stream] = audit.unsigned
        if audit.continues is not None:
            self.continues[audit.stream] = audit.continues
        tolerate = self.allow_unsigned_tail and audit.covered > 0
        self.problems += [p for p in audit.problems if not (tolerate and p.code == UNSIGNED_TAIL)]

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "ok": self.ok,
            "entries": self.entries,
            "problems": [asdict(p) for p in self.problems],
            "unsigned_tail": dict(sorted(self.unsigned.items())),
        }
        if self.continues:  # only where a stream continues another: other reports unchanged
            doc["continues"] = {s: asdict(c) for s, c in sorted(self.continues.items())}
        return doc

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=None, sort_keys=True)


@dataclass(frozen=True)
class Row:
    """One stored entry as the audit sees it; ``seq``/``leaf_hash`` are the store's own columns."""

    line: bytes
    seq: int | None = None
    leaf_hash: bytes | None = None
    where: str = ""  # "line 7 of entries.jsonl", for people


@dataclass(frozen=True)
class _Signed:
    checkpoint: Checkpoint
    label: str
    kept: bool


class _Problems:
    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.items: list[Problem] = []
        self._counts: dict[str, int] = {}

    def add(self, code: str, seq: int | None, detail: str) -> None:
        n = self._counts.get(code, 0) + 1
        self._counts[code] = n
        if n <= _PER_CODE_LIMIT:
            self.items.append(Problem(code, self.stream, seq, detail))

    def finish(self) -> list[Problem]:
        for code, n in self._counts.items():
            if n > _PER_CODE_LIMIT:
                more = n - _PER_CODE_LIMIT
                self.items.append(Problem(code, self.stream, None, f"… and {more} more"))
        return self.items


@dataclass(frozen=True)
class StreamAudit:
    """One stream's findings: its problems (an unsigned tail among them), how many of its
    ``entries`` the largest checkpoint that matches the log covers, and its link to the stream
    it continues, if it continues one."""

    stream: str
    problems: list[Problem]
    entries: int
    covered: int
    continues: Continues | None = None

    @property
    def unsigned(self) -> int:
        return self.entries - self.covered


def audit_stream(
    stream: str,
    rows: Iterable[Row],
    checkpoints: Sequence[tuple[str, bytes]],
    log_key: str | None,
    *,
    key: KeyPair | None = None,
    kept: Sequence[tuple[str, bytes]] = (),
    evidence: Callable[[str], bytes | None] | None = None,
    evidence_names: Collection[str] | None = None,
    links: LinkCheck | None = None,
) -> list[Problem]:
    """Every problem of one stream (see :func:`check_stream`)."""
    return check_stream(
        stream,
        rows,
        checkpoints,
        log_key,
        key=key,
        kept=kept,
        evidence=evidence,
        evidence_names=evidence_names,
        links=links,
    ).problems


def check_stream(
    stream: str,
    rows: Iterable[Row],
    checkpoints: Sequence[tuple[str, bytes]],
    log_key: str | None,
    *,
    key: KeyPair | None = None,
    kept: Sequence[tuple[str, bytes]] = (),
    evidence: Callable[[str], bytes | None] | None = None,
    evidence_names: Collection[str] | None = None,
    links: LinkCheck | None = None,
) -> StreamAudit:
    """Audit one stream. ``checkpoints`` and ``kept`` are ``(label, note)`` pairs.

    ``evidence`` reads an archived evidence file by name (``None`` when it is missing); with
    a key, each ``evidence.archived`` entry's file is checked against its digest.
    ``evidence_names``: every file the bundle's ``evidence/`` holds; with a key, one that no
    ``evidence.archived`` entry names is a problem (nothing vouches for it).
    ``links`` checks the stream's ``continues`` link, if it has one, against the stream it
    names (without it, or where that stream is not at hand, the link is reported unchecked).

    One streaming pass over ``rows``: only leaf hashes and ``seq`` numbers are kept, so
    memory grows with the number of entries, not their bytes (bodies are kept only when a
    key asks for them to be opened).
    """
    out = _Problems(stream)
    # The notes' signatures need nothing from the entries, and verifying one releases the
    # GIL: when there are many (one per commit batch), a thread of its own checks them while
    # this one reads the entries.
    if len(checkpoints) + len(kept) < _NOTES_IN_A_THREAD:
        scan = _scan_entries(stream, rows, out, keep_bodies=key is not None)
        notes_opened = _open_notes(checkpoints, kept, log_key)
    else:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-notes") as notes:
            opening = notes.submit(_open_notes, checkpoints, kept, log_key)
            scan = _scan_entries(stream, rows, out, keep_bodies=key is not None)
            notes_opened = opening.result()
    origin = _expected_origin(stream, log_key)
    valid_clear, opened = _check_opening(scan, log_key, origin, out)
    continues = None
    if opened is not None and opened[1].continues is not None:  # only a continuation pays
        continues = _check_continuation(opened[0], opened[1].continues, links, out)
    signed = _check_signatures(notes_opened, log_key, origin, out)
    covered = _check_tree(scan.leaves, signed, out)
    n = len(scan.leaves)
    if covered < n:
        out.add(
            "unsigned_tail",
            covered,
            f"{n - covered} of {n} entries (from position {covered}) are covered by no "
            "checkpoint signed by the log key: anyone holding only public keys could have "
            "written them",
        )
    if key is not None:
        _check_bodies(stream, scan.kept, valid_clear, key, out, evidence, evidence_names)
    return StreamAudit(stream, out.finish(), n, covered, continues)


@dataclass
class _Scan:
    leaves: list[bytes] = field(default_factory=list)
    clear: list[Entry] = field(default_factory=list)  # stream.opened / key.rotated, in order
    kept: list[Entry] = field(default_factory=list)  # every entry, when bodies will be opened
    first_kind: str | None = None
    count: int = 0


_CHUNK = 256
#: From how many notes a stream's are verified in a thread beside the entries' scan.
_NOTES_IN_A_THREAD = 32


def _leaf_hashes(lines: list[bytes]) -> list[bytes]:
    return [merkle.hash_leaf(line) for line in lines]


def _scan_entries(stream: str, rows: Iterable[Row], out: _Problems, *, keep_bodies: bool) -> _Scan:
    """Read and parse every row once, while a second thread hashes the same chunk.

    ``hashlib`` releases the GIL on large inputs, so the hashing (the cost a bare SHA-256 pass
    pays too) overlaps the reading and parsing: an audit uses two cores.
    """
    scan = _Scan()
    seen: set[int] = set()
    highest = -1
    it = iter(rows)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-hash") as hasher:
        # one chunk ahead: the next chunk is read and parsed while the hasher still works on
        # this one, so its thread is never left idle while this one reads
        chunk = list(itertools.islice(it, _CHUNK))
        hashed = hasher.submit(_leaf_hashes, [row.line for row in chunk]) if chunk else None
        heads = [_parse_row(row, out, scan, keep_bodies) for row in chunk]
        while chunk and hashed is not None:
            following = list(itertools.islice(it, _CHUNK))
            ahead = (
                hasher.submit(_leaf_hashes, [row.line for row in following]) if following else None
            )
            for row, leaf, head in zip(chunk, hashed.result(), heads, strict=True):
                scan.leaves.append(leaf)
                if row.leaf_hash is not None and row.leaf_hash != leaf:
                    out.add(
                        "leaf_mismatch",
                        row.seq,
                        f"{_where(row)}: stored leaf hash is not the line's",
                    )
                if head is None:
                    continue
                if head.stream != stream:
                    out.add(
                        "stream_mismatch", head.seq, f"{_where(row)}: entry names {head.stream!r}"
                    )
                if row.seq is not None and row.seq != head.seq:
                    out.add("seq_order", head.seq, f"{_where(row)}: the entry says seq {head.seq}")
                if head.seq in seen:
                    out.add(
                        "seq_duplicate", head.seq, f"{_where(row)}: seq {head.seq} appears again"
                    )
                elif head.seq < highest:
                    out.add("seq_order", head.seq, f"{_where(row)}: seq {head.seq} after {highest}")
                seen.add(head.seq)
                highest = max(highest, head.seq)
            chunk, hashed = following, ahead
            heads = [_parse_row(row, out, scan, keep_bodies) for row in chunk]
    _report_gaps(seen, highest, out)
    return scan


def _report_gaps(seen: set[int], highest: int, out: _Problems) -> None:
    """Name the first missing ``seq`` numbers and count the rest.

    Never walks the whole range: a tampered entry may claim a seq of 10**15.
    """
    missing_total = highest + 1 - len(seen)
    listed = 0
    candidate = 0
    while listed < min(missing_total, _PER_CODE_LIMIT):
        if candidate not in seen:
            out.add("seq_gap", candidate, f"seq {candidate} is missing")
            listed += 1
        candidate += 1
    if missing_total > listed:
        more = missing_total - listed
        out.items.append(Problem("seq_gap", out.stream, None, f"… and {more} more"))


def _where(row: Row) -> str:
    return row.where if row.seq is None else f"{row.where} seq {row.seq}"  # only on a problem


def _parse_row(row: Row, out: _Problems, scan: _Scan, keep_bodies: bool) -> EntryHead | None:
    scan.count += 1
    try:
        if keep_bodies:  # the whole entry is needed: parsed once, its head taken from it
            entry = parse_entry(row.line)
            head = head_of(entry)
            scan.kept.append(entry)
            if head.kind in CLEAR_KINDS:
                scan.clear.append(entry)
        else:
            head = parse_head(row.line)
            if head.kind in CLEAR_KINDS:
                scan.clear.append(parse_entry(row.line))
    except SchemaError as exc:
        out.add("malformed_entry", row.seq, f"{_where(row)}: {exc}")
        return None
    if scan.count == 1:
        scan.first_kind = head.kind
    return head


def _expected_origin(stream: str, log_key: str | None) -> str | None:
    """Derived from the log key and the stream name, never from the (checkable) log itself."""
    if log_key is None:
        return None
    try:
        verifier = Verifier.from_vkey(log_key)
    except CheckpointError:
        return None  # reported by the signature check
    return log_origin(verifier.name, verifier.key_id, stream)


def _check_opening(
    scan: _Scan, log_key: str | None, origin: str | None, out: _Problems
) -> tuple[set[int], tuple[int, StreamOpened] | None]:
    """The stream opens with ``stream.opened`` naming our origin; key epochs count up by one.

    Every clear body is checked here, key or not: a bad one is ``malformed_entry`` (and never
    also ``malformed_body``). Returns the ids of the clear entries whose body is valid, and
    the first valid ``stream.opened`` (its ``seq`` and body), if there is one.
    """
    valid: set[int] = set()
    opened: tuple[int, StreamOpened] | None = None
    seen_opened = False
    if scan.first_kind is not None and scan.first_kind != "stream.opened":
        out.add(
            "malformed_entry", 0, f"the stream starts with {scan.first_kind}, not stream.opened"
        )
    # The n-th clear entry (from 0, valid or not) brings epoch n (docs/record.md §12 step 5).
    for epoch, entry in enumerate(scan.clear):
        second = entry.kind == "stream.opened" and seen_opened
        seen_opened |= entry.kind == "stream.opened"
        try:
            body = parse_body(
                entry.kind, entry.body if isinstance(entry.body, dict) else {}, stored=True
            )
        except SchemaError as exc:
            out.add("malformed_entry", entry.seq, str(exc))
            continue
        assert isinstance(body, StreamOpened | KeyRotated)
        valid.add(id(entry))
        if body.key_epoch != entry.key_epoch or body.key_epoch != epoch:
            out.add(
                "malformed_entry",
                entry.seq,
                f"{entry.kind} brings key epoch {body.key_epoch} (envelope {entry.key_epoch}); "
                f"expected {epoch}",
            )
        if isinstance(body, StreamOpened):
            if second:
                out.add("malformed_entry", entry.seq, "a second stream.opened")
                continue
            opened = (entry.seq, body)
            if log_key is not None and body.log_key != log_key:
                out.add(
                    "checkpoint_invalid",
                    entry.seq,
                    f"the stream names log key {body.log_key}, not {log_key}, the key it is checked against",
                )
            elif origin is not None and body.origin != origin:
                out.add(
                    "malformed_entry",
                    entry.seq,
                    f"stream.opened names origin {body.origin!r}; the log key's is {origin!r}",
                )
    return valid, opened


def _check_continuation(
    seq: int, link: Continuation, links: LinkCheck | None, out: _Problems
) -> Continues:
    """The link of a stream that continues another (docs/record.md §5.3, Continuation): checked
    by ``links`` against the stream it names where that stream is at hand."""
    checked, holds = False, None
    if links is not None:
        try:
            checked = links(link)
        except LinkBroken as exc:
            out.add("continuation_broken", seq, f"continues {link.stream!r}: {exc}")
            checked, holds = True, False
        else:
            holds = True if checked else None
    return Continues(link.stream, link.size, _stated_size(link.checkpoint), checked, holds)


def _stated_size(note: str) -> int | None:
    """The tree size a note's text states, unverified (for people: which checkpoint)."""
    try:
        return parse_checkpoint(parse_note(note.encode("utf-8")).text).size
    except (CheckpointError, ValueError):
        return None


def links_in(store: LogStore, streams: Collection[str] | None = None) -> LinkCheck:
    """Check links against the streams ``store`` holds (``streams``, when the caller listed
    them already): each named stream's clear opening and the leaf hashes of its stored lines
    (the link may take fewer than its checkpoint covers), hashed here from the lines (an
    altered line breaks the link even where the store's leaf hash column was left as it was)."""
    held = set(store.streams() if streams is None else streams)

    def check(link: Continuation) -> bool:
        if link.stream not in held:
            return False
        lines = store.entries(link.stream)
        check_link(link, opening_of(store, link.stream), [merkle.hash_leaf(e.line) for e in lines])
        return True

    return check


@dataclass(frozen=True)
class _OpenedNotes:
    """Every note opened against the log key: the key's own fault, if any, then for each
    note (checkpoints first, then those kept) its checkpoint or why it failed."""

    key_fault: str | None
    notes: list[tuple[bool, str, Checkpoint | CheckpointError]]


def _open_notes(
    checkpoints: Sequence[tuple[str, bytes]], kept: Sequence[tuple[str, bytes]], log_key: str | None
) -> _OpenedNotes:
    verifiers: list[Verifier] = []
    key_fault = None
    if log_key is not None:
        try:
            verifiers.append(Verifier.from_vkey(log_key))
        except CheckpointError as exc:
            key_fault = f"log key {log_key!r} is malformed: {exc}"
    elif checkpoints or kept:
        key_fault = "no log key to check checkpoint signatures with"
    opened: list[tuple[bool, str, Checkpoint | CheckpointError]] = []
    for is_kept, items in ((False, checkpoints), (True, kept)):
        for label, note in items:
            try:
                opened.append((is_kept, label, open_checkpoint(note, verifiers)[0]))
            except CheckpointError as exc:
                opened.append((is_kept, label, exc))
    return _OpenedNotes(key_fault, opened)


def _check_signatures(
    opened: _OpenedNotes, log_key: str | None, origin: str | None, out: _Problems
) -> list[_Signed]:
    if opened.key_fault is not None:
        out.add("checkpoint_invalid", None, opened.key_fault)
    signed: list[_Signed] = []
    for is_kept, label, checkpoint in opened.notes:
        if isinstance(checkpoint, CheckpointError):
            out.add("checkpoint_invalid", None, f"{label}: {checkpoint}")
            continue
        if origin is not None and checkpoint.origin != origin:
            out.add(
                "checkpoint_invalid",
                None,
                f"{label}: origin {checkpoint.origin!r} is not this stream's ({origin!r})",
            )
            continue
        signed.append(_Signed(checkpoint, label, is_kept))
    return signed


def _check_tree(leaves: Sequence[bytes], signed: Sequence[_Signed], out: _Problems) -> int:
    """Check every checkpoint against the tree; return how many leaves the largest matching
    one covers (every smaller prefix is covered by it too)."""
    n = len(leaves)
    roots = _roots_at(leaves, {s.checkpoint.size for s in signed if s.checkpoint.size <= n})
    by_size: dict[int, _Signed] = {}
    for s in signed:
        other = by_size.setdefault(s.checkpoint.size, s)
        if other.checkpoint.root_hash != s.checkpoint.root_hash:
            out.add(
                "checkpoint_inconsistent",
                s.checkpoint.size - 1,
                f"{other.label} and {s.label} give tree size {s.checkpoint.size} two roots",
            )
    matching = [
        s
        for s in signed
        if s.checkpoint.size <= n and roots[s.checkpoint.size] == s.checkpoint.root_hash
    ]
    # The largest checkpoint the log matches proves what its tree held at every smaller size.
    anchor = max(matching, key=lambda s: s.checkpoint.size, default=None)
    for s in signed:
        cp = s.checkpoint
        if cp.size > n:
            what = "you kept" if s.kept else "the log holds"
            out.add(
                "truncated",
                n,
                f"{s.label}: a checkpoint {what} covers {cp.size} entries; the log has {n}"
                + (" (rolled back)" if s.kept else ""),
            )
        elif roots[cp.size] != cp.root_hash:
            if anchor is not None and cp.size < anchor.checkpoint.size:
                out.add(
                    "checkpoint_inconsistent",
                    cp.size - 1,
                    f"{s.label} (size {cp.size}) is not consistent with {anchor.label} "
                    f"(size {anchor.checkpoint.size}), which the log matches"
                    + (": the log was forked" if s.kept else ""),
                )
            else:
                out.add(
                    "root_mismatch",
                    cp.size - 1,
                    f"{s.label}: tree of {cp.size} entries has root "
                    f"{roots[cp.size].hex()}, the checkpoint says {cp.root_hash.hex()}",
                )
    return anchor.checkpoint.size if anchor is not None else 0


def _roots_at(leaves: Sequence[bytes], sizes: set[int]) -> dict[int, bytes]:
    """Roots of the tree at each of ``sizes`` in one pass over the leaves."""
    roots: dict[int, bytes] = {}
    if 0 in sizes:
        roots[0] = merkle.EMPTY_ROOT
    tree = merkle.CompactRange()
    for leaf in leaves:
        tree.append(leaf)
        if tree.size in sizes:
            roots[tree.size] = tree.root()
    return roots


def _check_bodies(
    stream: str,
    entries: Sequence[Entry],
    valid_clear: set[int],
    key: KeyPair,
    out: _Problems,
    evidence: Callable[[str], bytes | None] | None,
    evidence_names: Collection[str] | None,
) -> None:
    # A clear body that is not valid was reported (malformed_entry) and brings no data key.
    clear = [e for e in entries if e.kind in CLEAR_KINDS and id(e) in valid_clear]
    failed: list[tuple[int, CannotOpen]] = []
    try:
        keys = StreamKeys.collect(stream, clear, key, failed=failed)
    except CannotOpen as exc:
        out.add("cannot_open", None, str(exc))
        return
    for seq, error in failed:  # its epoch's bodies are each cannot_open below
        out.add("cannot_open", seq, f"wrapped data key: {error}")
    named: set[str] = set()
    opened_all = True
    for entry in entries:
        if entry.kind in CLEAR_KINDS:
            opened_all &= id(entry) in valid_clear
            continue  # checked, key or not, by _check_opening
        try:
            body = keys.open(entry)
        except CannotOpen as exc:
            out.add("cannot_open", entry.seq, f"{entry.kind}: {exc}")
            opened_all = False
            continue
        except SchemaError as exc:
            out.add("malformed_body", entry.seq, str(exc))
            opened_all = False
            continue
        for problem in digest_mismatches(body):
            out.add("body_digest_mismatch", entry.seq, f"{entry.kind}: {problem}")
        if evidence is not None and isinstance(body, EvidenceArchived):
            named.add(body.file)
            data = evidence(body.file)
            if data is None:
                out.add("evidence_missing", entry.seq, f"evidence/{body.file} is missing")
            elif digest(Domain.EVIDENCE, data) != body.evidence_digest:
                detail = f"evidence/{body.file} does not match its evidence_digest"
                out.add("evidence_digest_mismatch", entry.seq, detail)
    if not opened_all:
        return  # a body that did not open may be the entry that vouches for a file
    for name in sorted(set(evidence_names or ()) - named):
        detail = f"evidence/{name} is named by no evidence.archived entry: nothing vouches for it"
        out.add("evidence_unlisted", None, detail)


def verify_store(
    path: Path | str,
    *,
    key: KeyPair | None = None,
    kept: Sequence[bytes] = (),
    log_key: str | None = None,
    allow_unsigned_tail: bool = False,
) -> Report:
    """Audit every stream of a store (a SQLite file or a PostgreSQL URL). ``kept``: checkpoint
    notes a user saved earlier.

    ``allow_unsigned_tail``: entries after a stream's last checkpoint are counted in
    ``Report.unsigned`` but not reported as problems (a store from before every commit batch
    was signed). A stream that continues another one the store holds has its link checked
    against it (``Report.continues`` says so, or that the link was not checked).
    """
    store = open_store(path, readonly=True)
    try:
        # One key for the whole store: the one pinned, else the store's own. A shared store
        # (several appliances) has none: each stream is checked against the key its opening
        # names, which only an independent pin (the appliance's attestation) makes trusted.
        pinned = log_key or store.get_meta("log_key")
        report = Report(allow_unsigned_tail=allow_unsigned_tail)
        streams = store.streams()
        routed = _route_kept(kept, streams)
        name = store_label(path)
        links = links_in(store, streams)
        for stream in streams:
            log_key = pinned or opened_by(store, stream)
            count = store.size(stream)
            rows = (Row(e.line, e.seq, e.leaf_hash, name) for e in store.entries(stream))
            notes = [
                (f"checkpoint #{i} (size {c.size})", c.note)
                for i, c in enumerate(store.checkpoints(stream))
            ]
            report.entries += count
            report.add_stream(
                check_stream(
                    stream,
                    rows,
                    notes,
                    log_key,
                    key=key,
                    kept=routed.get(stream, []),
                    links=links,
                )
            )
        report.problems += _unrouted(routed, streams)
        return report
    finally:
        store.close()


def _route_kept(
    kept: Sequence[bytes], streams: Sequence[str]
) -> dict[str, list[tuple[str, bytes]]]:
    """Send each kept checkpoint to the stream named by its origin's last part."""
    routed: dict[str, list[tuple[str, bytes]]] = {}
    for i, note in enumerate(kept):
        first = note.split(b"\n", 1)[0].decode("utf-8", "replace")
        stream = first.rsplit("/", 1)[-1]
        routed.setdefault(stream, []).append((f"kept checkpoint #{i} ({first})", note))
    return routed


def _unrouted(routed: dict[str, list[tuple[str, bytes]]], streams: Sequence[str]) -> list[Problem]:
    return [
        Problem("truncated", stream, None, f"{label}: the log holds no stream {stream!r}")
        for stream, items in routed.items()
        if stream not in streams
        for label, _ in items
    ]
