"""After a crash: give every model call whose reply was never recorded the outcome ``UNKNOWN``.

A ``model.request`` is durable before its call is dialed, and its ``model.response`` follows
once the reply has been read; a proxy that dies in between leaves a request with no answer.
On start, before serving, :func:`recover_unknown` appends ``model.response`` with outcome
``UNKNOWN`` for each one, so the record says what is known: the request left, and its
reply's fate is not known. Resume decides later whether to re-issue it.

Which request a response answers is sealed inside the response body, so this opens the
``model.response`` bodies with the appliance key (every session's stream is sealed to it).
It only appends; nothing recorded is touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from egress_proxy.errors import ConfigError
from record.errors import CannotOpen
from record.log import Log
from record.reader import StreamKeys
from record.schema import ModelResponse, parse_entry


@dataclass(frozen=True)
class Recovered:
    stream: str
    request_seq: int
    seq: int  # of the UNKNOWN response appended


def recover_unknown(log: Log) -> list[Recovered]:
    """Append ``UNKNOWN`` for every unanswered ``model.request`` in the store; run before
    serving, while nothing else writes. Streams not sealed to the appliance key are skipped:
    the writer could not append to them anyway."""
    if log.appliance_key is None:
        raise ConfigError("recovery needs the log opened with the appliance key")
    recovered: list[Recovered] = []
    for stream in log.store.streams():
        entries = [parse_entry(stored.line) for stored in log.store.entries(stream)]
        asked = [e.seq for e in entries if e.kind == "model.request"]
        if not asked:
            continue
        try:
            keys = StreamKeys.collect(stream, entries, log.appliance_key)
        except CannotOpen:
            continue
        answered: set[int] = set()
        for entry in entries:
            if entry.kind == "model.response":
                body = keys.open(entry)
                assert isinstance(body, ModelResponse)
                answered.add(body.request_seq)
        for seq in asked:
            if seq not in answered:
                appended = log.append(stream, ModelResponse(request_seq=seq, outcome="UNKNOWN"))
                recovered.append(Recovered(stream, seq, appended.seq))
    return recovered
