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

from dataclasses import dataclass

from egress_proxy.errors import ConfigError
from record.errors import CannotOpen
from record.log import Log
from record.reader import StreamKeys
from record.schema import FetchResponse, ModelResponse, Strict, ToolResult, parse_entry


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


def recover_unknown(log: Log) -> list[Recovered]:
    """Append ``UNKNOWN`` for every unanswered request in the store; run before serving,
    while nothing else writes. Streams not sealed to the appliance key are skipped: the
    writer could not append to them anyway."""
    if log.appliance_key is None:
        raise ConfigError("recovery needs the log opened with the appliance key")
    recovered: list[Recovered] = []
    for stream in log.store.streams():
        entries = [parse_entry(stored.line) for stored in log.store.entries(stream)]
        asked = [(e.seq, e.kind) for e in entries if e.kind in _REQUESTS]
        if not asked:
            continue
        try:
            keys = StreamKeys.collect(stream, entries, log.appliance_key)
        except CannotOpen:
            continue
        answered: set[int] = set()
        for entry in entries:
            if entry.kind in _ANSWERS:
                seq = _answered_seq(keys.open(entry))
                if seq is not None:
                    answered.add(seq)
        for seq, kind in asked:
            if seq not in answered:
                appended = log.append(stream, _unknown(kind, seq))
                recovered.append(Recovered(stream, seq, appended.seq, kind))
    return recovered
