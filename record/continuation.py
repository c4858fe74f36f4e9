"""A stream that carries on another appliance's session: making the link, and checking it.

A stream is written only by the appliance whose log key opened it, for life. When that
appliance is gone, another one carries the session on in a stream of its own whose
``stream.opened`` names the old stream (``StreamOpened.continues``, ``docs/record.md``
§5.3): the old stream's last signed checkpoint, verbatim, and the old stream's size and
Merkle root as the continuing appliance read them. The checkpoint is the old appliance's
word on the old stream; the size and root past it are the new appliance's, signed with
every checkpoint of the new stream. Anyone holding both streams can check both against the
old stream's entries, and nobody can splice the new stream onto another history.

The checks here need no key that opens a body: only the old stream's clear opening, its
leaf hashes and the note. The continuing proxy runs them before it opens the new stream, and
``log verify`` runs them again, from the entries alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from record import merkle
from record.checkpoint import CheckpointError, Verifier, log_origin, open_checkpoint
from record.errors import SchemaError
from record.schema import Continuation, StreamOpened, parse_entry
from record.store import LogStore

__all__ = [
    "LinkBroken",
    "check_link",
    "check_link_in",
    "continued_by",
    "link_to",
    "opening_of",
    "root_digest",
]


class LinkBroken(ValueError):
    """A continuation that does not hold against the stream it names (what is wrong, said)."""


def root_digest(leaf_hashes: Sequence[bytes]) -> str:
    """A Merkle root in the record's digest form (``sha256:<hex>``)."""
    return "sha256:" + merkle.root(leaf_hashes).hex()


def opening_of(store: LogStore, stream: str) -> StreamOpened:
    """The clear ``stream.opened`` of ``stream`` (``LinkBroken`` when there is none)."""
    first = next(iter(store.entries(stream, 0, 1)), None)
    if first is None:
        raise LinkBroken(f"stream {stream!r} is not in this store")
    try:
        entry = parse_entry(first.line)
        return StreamOpened.model_validate(entry.body, strict=True)
    except (SchemaError, ValueError) as exc:
        raise LinkBroken(f"stream {stream!r} does not open with a stream.opened: {exc}") from None


def continued_by(store: LogStore, stream: str) -> list[str]:
    """The streams of ``store`` whose opening continues ``stream``. One read of every
    stream's first entry: a command's question, not a hot path."""
    found = []
    for other in store.streams():
        first = next(iter(store.entries(other, 0, 1)), None)
        if first is None or b'"continues":' not in first.line:
            continue  # most openings: no need to parse
        try:
            opened = StreamOpened.model_validate(parse_entry(first.line).body, strict=True)
        except (SchemaError, ValueError):
            continue  # not a readable opening: the audit names it
        if opened.continues is not None and opened.continues.stream == stream:
            found.append(other)
    return found


def link_to(store: LogStore, stream: str) -> Continuation:
    """The link a new stream makes to ``stream`` as the store holds it now: its last signed
    checkpoint, and its whole size and root (checked with :func:`check_link` first)."""
    opened = opening_of(store, stream)
    signed = store.checkpoints(stream)
    if not signed:
        raise LinkBroken(f"stream {stream!r} has no signed checkpoint to continue from")
    leaves = store.leaf_hashes(stream)
    link = Continuation(
        stream=stream,
        checkpoint=signed[-1].note.decode("utf-8"),
        size=len(leaves),
        root=root_digest(leaves),
    )
    check_link(link, opened, leaves)
    return link


def check_link(link: Continuation, opened: StreamOpened, leaves: Sequence[bytes]) -> None:
    """``LinkBroken`` unless ``link`` holds against the named stream: ``opened`` is its
    clear opening, ``leaves`` its leaf hashes (all the store has, at least ``link.size``).

    The note must be a checkpoint of that stream (its origin, from the log key and the
    stream's name), signed by that stream's log key; the stream's first ``checkpoint.size``
    entries must have the note's root, and its first ``link.size`` entries the link's root.
    ``link.size`` may be below the note's: a link that leaves the last step behind."""
    try:
        verifier = Verifier.from_vkey(opened.log_key)
        checkpoint, _ = open_checkpoint(link.checkpoint.encode("utf-8"), [verifier])
    except (CheckpointError, ValueError) as exc:
        raise LinkBroken(
            f"the checkpoint named for {link.stream!r} is not one its log key signed: {exc}"
        ) from None
    # The origin comes from the log key and the stream's name, never from the log itself
    # (docs/record.md §10.4): an opening that states another origin cannot widen what passes.
    origin = log_origin(verifier.name, verifier.key_id, link.stream)
    if checkpoint.origin != origin:
        raise LinkBroken(
            f"the checkpoint named for {link.stream!r} is of {checkpoint.origin!r}, "
            f"not of that stream ({origin!r})"
        )
    for what, size in (("the link takes", link.size), ("its checkpoint covers", checkpoint.size)):
        if len(leaves) < size:
            raise LinkBroken(f"{what} {size} entries of {link.stream!r}; it has {len(leaves)}")
    if merkle.root(leaves[: checkpoint.size]) != checkpoint.root_hash:
        raise LinkBroken(
            f"{link.stream!r} does not match its own checkpoint at size {checkpoint.size}"
        )
    if root_digest(leaves[: link.size]) != link.root:
        raise LinkBroken(
            f"{link.stream!r} at size {link.size} has another root than the link names"
        )


def check_link_in(store: LogStore, link: Continuation) -> StreamOpened:
    """:func:`check_link` against the named stream as ``store`` holds it; that stream's
    opening, once the link holds."""
    opened = opening_of(store, link.stream)
    check_link(link, opened, store.leaf_hashes(link.stream))
    return opened
