"""Tool calls in the record, and the order rule every tool route shares.

**No tool runs before the model reply that asked for it is committed.** A tool call names
that reply: ``reply_seq`` (the ``seq`` of a ``model.response`` of the same session) and
``call_id`` (the id of one tool call in that reply). The proxy admits the call only if
that entry is a ``COMMITTED`` ``model.response`` whose reply bytes hold a tool call with
that id; otherwise it records the refusal (``tool.call``, then ``tool.result`` with outcome
``FAILED`` and the refusal body as ``error_bytes``) and answers 409 ``reply_not_committed``.

Which ids a reply asked for is read from the record itself, with the appliance key the
proxy holds (every session's stream is sealed to it), and kept per ``(stream, seq)``: an
entry never changes, so each reply is opened at most once. The record, not what some
client was shown, is the authority; it also holds after a restart. In a pinned session the
client was handed derived ids in place of the upstream's (``egress_proxy.tool_ids``); the
record keeps that mapping beside the reply, and a derived id names its call too.

An admitted call appends ``tool.call`` and waits until it is durable; only then may the
caller reach the tool. This module dials nothing and imports no web framework.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from egress_proxy.errors import RecordUnavailable, ReplyNotCommitted
from egress_proxy.sessions import Session
from egress_proxy.sse import iter_events
from egress_proxy.tool_ids import RECORD_KEY
from record.digest import Domain, digest
from record.errors import CannotOpen
from record.log import Appended, Log
from record.reader import StreamKeys
from record.schema import CLEAR_KINDS, ModelResponse, Strict, ToolCall, ToolResult
from record.schema import parse_entry as parse_line

#: The ``_meta`` members of an MCP ``tools/call`` request that name the asking reply.
META_REPLY_SEQ = "affidavit/reply_seq"
META_CALL_ID = "affidavit/call_id"

Outcome = Literal["COMMITTED", "FAILED", "UNKNOWN"]


@dataclass(frozen=True)
class NamedReply:
    """The committed model reply a tool call says it answers."""

    reply_seq: int
    call_id: str


def named_reply(meta: object) -> NamedReply | None:
    """The reply a request's ``_meta`` names, or None when it names none (or not clearly)."""
    if not isinstance(meta, Mapping):
        return None
    seq, call_id = meta.get(META_REPLY_SEQ), meta.get(META_CALL_ID)
    if type(seq) is not int or seq < 0 or not isinstance(call_id, str) or not call_id:
        return None
    return NamedReply(seq, call_id)


@dataclass(frozen=True)
class ToolAsk:
    """One tool call as a client asked for it, ready to be recorded."""

    server: str
    tool: str
    arguments: bytes  # canonical JSON (RFC 8785) of the arguments object
    named: NamedReply
    idempotent: bool


def tool_call_ids(body: bytes) -> list[str]:
    """The tool-call ids a model reply asked for, in order, from its bytes as received.

    Reads OpenAI ``tool_calls[].id`` (a message, or stream deltas) and Anthropic
    ``tool_use`` blocks (``content``, or ``content_block_start`` events), JSON or SSE.
    """
    try:
        objects: list[Any] = [json.loads(body)]
    except ValueError:
        objects = [event.json() for event in iter_events(body)]
    ids: list[str] = []
    for obj in objects:
        _collect(obj, ids, listed=False)
    return list(dict.fromkeys(ids))


def _collect(value: Any, ids: list[str], *, listed: bool) -> None:
    if isinstance(value, dict):
        if (listed or value.get("type") == "tool_use") and isinstance(value.get("id"), str):
            ids.append(value["id"])
        for key, child in value.items():
            if key == "tool_calls" and isinstance(child, list):
                for item in child:
                    _collect(item, ids, listed=True)
            else:
                _collect(child, ids, listed=False)
    elif isinstance(value, list):
        for item in value:
            _collect(item, ids, listed=False)


class ReplyIndex:
    """The tool-call ids of each committed model reply, read from the record once each."""

    def __init__(self, log: Log) -> None:
        if log.appliance_key is None:
            raise RecordUnavailable("tool calls need the log opened with the appliance key")
        self.log = log
        self._known: dict[tuple[str, int], frozenset[str] | None] = {}
        self._keys: dict[str, StreamKeys] = {}

    async def call_ids(self, stream: str, seq: int) -> frozenset[str] | None:
        """The ids reply ``seq`` asked for; None if it is not a committed ``model.response``."""
        if (stream, seq) in self._known:
            return self._known[(stream, seq)]
        ids, final = await asyncio.to_thread(self._read, stream, seq)
        if final:  # an entry that exists never changes; one not yet written may come
            self._known[(stream, seq)] = ids
        return ids

    def _read(self, stream: str, seq: int) -> tuple[frozenset[str] | None, bool]:
        body = self._open(stream, seq)
        if body is None:
            return None, False
        if not isinstance(body, ModelResponse) or body.outcome != "COMMITTED":
            return None, True
        ids = set(tool_call_ids(body.response_bytes or b""))
        mapping = (body.reproducibility or {}).get(RECORD_KEY)
        for pair in mapping if isinstance(mapping, list) else []:
            derived = pair.get("derived") if isinstance(pair, dict) else None
            if isinstance(derived, str):
                ids.add(derived)  # what a pinned session's client was handed
        return frozenset(ids), True

    def _open(self, stream: str, seq: int) -> Strict | None:
        stored = list(self.log.store.entries(stream, seq, seq + 1))
        if not stored:
            return None
        entry = parse_line(stored[0].line)
        if entry.kind in CLEAR_KINDS:
            return None
        keys = self._keys.get(stream)
        if keys is None or entry.key_epoch not in keys.keys:
            clear = [parse_line(e.line) for e in self.log.store.entries(stream, 0, seq + 1)]
            assert self.log.appliance_key is not None
            try:
                keys = StreamKeys.collect(stream, clear, self.log.appliance_key)
            except CannotOpen:
                return None
            self._keys[stream] = keys
        return keys.open(entry)


class ToolCalls:
    """Admit, refuse and record tool calls: ``tool.call`` before the call, ``tool.result`` after."""

    def __init__(self, log: Log, index: ReplyIndex | None = None) -> None:
        self.log = log
        self.index = index if index is not None else ReplyIndex(log)

    async def check(self, session: Session, ask: ToolAsk) -> None:
        """``ReplyNotCommitted`` unless the named reply is committed and asked for this call."""
        named = ask.named
        ids = await self.index.call_ids(session.id, named.reply_seq)
        if ids is None:
            raise ReplyNotCommitted(
                f"seq {named.reply_seq} of this session is not a committed model reply"
            )
        if named.call_id not in ids:
            raise ReplyNotCommitted(
                f"the reply at seq {named.reply_seq} asked for no tool call {named.call_id!r}"
            )

    async def admit(self, session: Session, ask: ToolAsk) -> int:
        """Check the order, then append ``tool.call`` and wait until it is durable: its seq."""
        await self.check(session, ask)
        return (await self._append(session, self._call(ask))).seq

    async def refuse(self, session: Session, ask: ToolAsk, error_body: bytes) -> Appended:
        """Record a refused call: its ``tool.call`` and a ``FAILED`` result with the body sent."""
        call = await self._append(session, self._call(ask))
        return await self.result(session, call.seq, "FAILED", error_bytes=error_body)

    async def result(
        self,
        session: Session,
        call_seq: int,
        outcome: Outcome,
        *,
        result_bytes: bytes | None = None,
        error_bytes: bytes | None = None,
        replayed_from: int | None = None,
    ) -> Appended:
        body = ToolResult(
            call_seq=call_seq,
            outcome=outcome,
            result_bytes=result_bytes,
            result_digest=_digest(Domain.TOOL_RESULT, result_bytes),
            error_bytes=error_bytes,
            error_digest=_digest(Domain.ERROR, error_bytes),
            replayed_from=replayed_from,
        )
        return await self._append(session, body)

    @staticmethod
    def _call(ask: ToolAsk) -> ToolCall:
        return ToolCall(
            reply_seq=ask.named.reply_seq,
            call_id=ask.named.call_id,
            server=ask.server,
            tool=ask.tool,
            arguments=ask.arguments,
            arguments_digest=digest(Domain.TOOL_ARGUMENTS, ask.arguments),
            idempotent=ask.idempotent,
        )

    async def _append(self, session: Session, body: Strict) -> Appended:
        return await append(self.log, session, body)


async def append(log: Log, session: Session, body: Strict) -> Appended:
    """Append and wait until durable; a record that refuses is ``RecordUnavailable`` (503)."""
    try:
        appended = await log.append_async(session.id, body)
    except Exception as exc:
        kind = getattr(body, "kind", type(body).__name__)
        raise RecordUnavailable(f"the record refused the {kind} entry: {exc}") from exc
    session.noted(appended)
    return appended


def _digest(domain: Domain, data: bytes | None) -> str | None:
    return digest(domain, data) if data is not None else None
