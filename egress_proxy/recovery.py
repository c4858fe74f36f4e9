"""After a crash: give every call whose reply was never recorded the outcome ``UNKNOWN``.

A ``model.request`` (``tool.call``, ``fetch.request``) is durable before its call is dialed,
and its ``model.response`` (``tool.result``, ``fetch.response``) follows once the reply has
been read; a proxy that dies in between leaves a request with no answer. On start, before
serving, :func:`recover_unknown` appends the answer with outcome ``UNKNOWN`` for each one, so
the record says what is known: the request left, and its reply's fate is not known. Resume
decides later whether to re-issue it (a tool call only if the tool is idempotent).

Which request an answer belongs to is sealed inside its body, so this opens the answers with
the appliance key (every session's stream is sealed to it). It only appends; nothing
recorded is touched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from egress_proxy.errors import ConfigError
from record.errors import CannotOpen, LeaseHeld, NotOwner, RecordError
from record.log import Log
from record.reader import StreamKeys
from record.schema import Entry, FetchResponse, ModelResponse, Strict, ToolResult, parse_entry
from record.store import opened_by

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovered:
    stream: str
    request_seq: int
    seq: int  # of the UNKNOWN answer appended
    kind: str = "model.request"  # the kind of the unanswered request


def _unknown(kind: str, seq: int) -> Strict:
    if kind == "model.request":
        return ModelResponse(request_seq=seq, outcome="UNKNOWN")
    if kind == "tool.call":
        return ToolResult(call_seq=seq, outcome="UNKNOWN")
    return FetchResponse(request_seq=seq, outcome="UNKNOWN")


def _answered_seq(body: Strict) -> int | None:
    if isinstance(body, ModelResponse | FetchResponse):
        return body.request_seq
    if isinstance(body, ToolResult):
        return body.call_seq
    return None


_REQUESTS = ("model.request", "tool.call", "fetch.request")
_ANSWERS = ("model.response", "tool.result", "fetch.response")


@dataclass(frozen=True)
class Unreadable:
    """An entry recovery could not read (written by an older proxy past today's limits, or
    damaged): reported, left as it is, and never a reason not to start."""

    stream: str
    seq: int | None  # None: the stream's keys could not be collected at all
    reason: str


def _opened_by(log: Log, stream: str) -> bool:
    """Whether the stream's opening names this log's key, or cannot say (then the stream is
    read whole, as before): one entry read, so a shared store's other streams cost nothing
    at each start."""
    owner = opened_by(log.store, stream)
    return owner is None or owner == log.log_key()


def recover_unknown(log: Log, unreadable: list[Unreadable] | None = None) -> list[Recovered]:
    """Append ``UNKNOWN`` for every unanswered request in the store; run before serving,
    while nothing else writes. Streams not sealed to the appliance key are skipped: the
    writer could not append to them anyway.

    An entry that cannot be read is reported (logged, and added to ``unreadable`` when
    given) and skipped. An unreadable *answer* may be the answer to any request before it,
    so those requests get no ``UNKNOWN`` of their own; requests after it still do.
    """
    if log.appliance_key is None:
        raise ConfigError("recovery needs the log opened with the appliance key")
    found: list[Unreadable] = [] if unreadable is None else unreadable
    recovered: list[Recovered] = []
    for stream in log.store.streams():
        recovered += _recover_stream(log, stream, found)
    for problem in found:
        at = f"/{problem.seq}" if problem.seq is not None else ""
        logger.warning("recovery skipped %s%s: %s", problem.stream, at, problem.reason)
    return recovered


def _recover_stream(log: Log, stream: str, unreadable: list[Unreadable]) -> list[Recovered]:
    assert log.appliance_key is not None
    if not _opened_by(log, stream):
        return []  # another appliance's (a shared store): never this writer's to answer
    entries: list[Entry] = []
    for stored in log.store.entries(stream):
        try:
            entries.append(parse_entry(stored.line))
        except (RecordError, ValueError) as exc:
            unreadable.append(Unreadable(stream, stored.seq, f"entry: {exc}"))
    asked = [(e.seq, e.kind) for e in entries if e.kind in _REQUESTS]
    if not asked:
        return []
    try:
        keys = StreamKeys.collect(stream, entries, log.appliance_key)
    except CannotOpen:
        return []  # not sealed to the appliance key: not this writer's to answer
    except (RecordError, ValueError) as exc:
        unreadable.append(Unreadable(stream, None, f"keys: {exc}"))
        return []
    answered: set[int] = set()
    unread_answers = [s.seq for s in unreadable if s.stream == stream and s.seq is not None]
    for entry in entries:
        if entry.kind in _ANSWERS:
            try:
                seq = _answered_seq(keys.open(entry))
            except (RecordError, ValueError) as exc:
                unreadable.append(Unreadable(stream, entry.seq, f"{entry.kind}: {exc}"))
                unread_answers.append(entry.seq)
                continue
            if seq is not None:
                answered.add(seq)
    horizon = max(unread_answers, default=-1)  # an unreadable entry may answer any before it
    recovered: list[Recovered] = []
    for seq, kind in asked:
        if seq not in answered and seq > horizon:
            try:
                appended = log.append(stream, _unknown(kind, seq))
            except (LeaseHeld, NotOwner) as exc:
                # another live writer has it (its requests may be in flight, not lost), or
                # another appliance opened it: not this proxy's to answer
                unreadable.append(Unreadable(stream, None, f"not answered: {exc.diagnostics()}"))
                return recovered
            recovered.append(Recovered(stream, seq, appended.seq, kind))
    return recovered
