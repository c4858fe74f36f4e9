"""Tool calls in the record, and the order rule every tool route shares.

**No tool runs before the model reply that asked for it is committed.** A tool call answers
one call of that reply: ``reply_seq`` (the ``seq`` of a ``model.response`` of the same
session) and ``call_id`` (the id of one tool call in that reply). A client may name them in
``_meta`` (the harness does); a call without them is matched by tool name and canonical
arguments against the session's latest committed reply. Either way the call must have the
name and arguments the reply asked for and must not have been served (the rule, and its
refusals, are ``egress_proxy.admission``'s). A refused call is recorded (``tool.call``, then
``tool.result`` with outcome ``FAILED`` and the refusal body as ``error_bytes``) and answered
409 (``reply_not_committed``, ``tool_not_asked`` or ``tool_call_served``).

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
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from egress_proxy.admission import Admitted, AskedCall, Ledger, asked_calls, pick
from egress_proxy.errors import RecordUnavailable, ToolCallServed, ToolNotAsked
from egress_proxy.sessions import Session
from egress_proxy.sse import iter_events
from egress_proxy.tool_ids import RECORD_KEY
from record.digest import Domain, digest
from record.errors import CannotOpen
from record.limits import JsonRefused, load_json
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


#: No record holds a seq this high; a larger one (past SQLite's integers) names no reply.
MAX_SEQ = 2**53


def named_reply(meta: object) -> NamedReply | None:
    """The reply a request's ``_meta`` names, or None when it names none (or not clearly)."""
    if not isinstance(meta, Mapping):
        return None
    seq, call_id = meta.get(META_REPLY_SEQ), meta.get(META_CALL_ID)
    if type(seq) is not int or not 0 <= seq < MAX_SEQ or not isinstance(call_id, str):
        return None
    if not call_id:
        return None
    return NamedReply(seq, call_id)


@dataclass(frozen=True)
class ToolAsk:
    """One tool call as a client asked for it, ready to be recorded."""

    server: str
    tool: str
    arguments: bytes  # canonical JSON (RFC 8785) of the arguments object
    named: NamedReply | None  # None: no ``_meta``; matched against the latest committed reply
    idempotent: bool


def tool_call_ids(body: bytes) -> list[str]:
    """The tool-call ids a model reply asked for, in order, from its bytes as received.

    Reads OpenAI ``tool_calls[].id`` (a message, or stream deltas) and Anthropic
    ``tool_use`` blocks (``content``, or ``content_block_start`` events), JSON or SSE.
    """
    try:
        objects: list[Any] = [load_json(body)]
    except JsonRefused:
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
    """What each committed model reply asked for, read from the record once each: the ids
    that name its tool calls, and each call's name and canonical arguments."""

    def __init__(self, log: Log) -> None:
        if log.appliance_key is None:
            raise RecordUnavailable("tool calls need the log opened with the appliance key")
        self.log = log
        self._known: dict[tuple[str, int], _Reply | None] = {}
        self._keys: dict[str, StreamKeys] = {}
        self._lock = threading.Lock()

    async def call_ids(self, stream: str, seq: int) -> frozenset[str] | None:
        """The ids reply ``seq`` asked for; None if it is not a committed ``model.response``."""
        reply = await asyncio.to_thread(self.reply, stream, seq)
        return reply.ids if reply is not None else None

    def reply(self, stream: str, seq: int) -> _Reply | None:
        """Reply ``seq``'s ids and calls; None if it is not a committed ``model.response``."""
        with self._lock:
            if (stream, seq) in self._known:
                return self._known[(stream, seq)]
            body = self.open(stream, seq)
            if body is None:
                return None  # not written yet (or not readable): asked again later
            reply = _reply(body)
            self._known[(stream, seq)] = reply  # an entry that exists never changes
            return reply

    def open(self, stream: str, seq: int) -> Strict | None:
        """The body of entry ``seq``, or None when it is not written or not sealed."""
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


@dataclass(frozen=True)
class _Reply:
    ids: frozenset[str]
    calls: tuple[AskedCall, ...]


def _reply(body: Strict) -> _Reply | None:
    if not isinstance(body, ModelResponse) or body.outcome != "COMMITTED":
        return None
    ids = set(tool_call_ids(body.response_bytes or b""))
    mapping: dict[str, str] = {}
    pairs = (body.reproducibility or {}).get(RECORD_KEY)
    for pair in pairs if isinstance(pairs, list) else []:
        if not isinstance(pair, dict):
            continue
        upstream, derived = pair.get("upstream"), pair.get("derived")
        if isinstance(derived, str):
            ids.add(derived)  # what a pinned session's client was handed
            if isinstance(upstream, str):
                mapping[upstream] = derived
    return _Reply(frozenset(ids), asked_calls(body, mapping))


#: The kinds a session's ledger folds in (``egress_proxy.admission.Ledger``).
_FOLDED = frozenset(
    {"model.response", "tool.call", "tool.result", "turn.decided", "fetch.request",
     "fetch.response"}
)  # fmt: skip


class ToolCalls:
    """Admit, refuse and record tool calls: ``tool.call`` before the call, ``tool.result`` after.

    The rule is ``egress_proxy.admission``'s; this class reads the record for it, keeps one
    ``Ledger`` per session, and writes the entries.
    """

    def __init__(self, log: Log, index: ReplyIndex | None = None) -> None:
        self.log = log
        self.index = index if index is not None else ReplyIndex(log)
        self._ledgers: dict[str, Ledger] = {}
        self._lock = threading.Lock()

    async def check(self, session: Session, ask: ToolAsk) -> None:
        """Raise the refusal ``admit`` would (``ReplyNotCommitted`` or a subclass), claiming
        nothing: lets a route answer 409 before it hands the call on."""
        await asyncio.to_thread(self._decide, session.id, ask, False)

    async def claim(self, session: Session, ask: ToolAsk) -> Admitted:
        """Check the rule and claim the call, recording nothing: the caller records the call
        (a fetch's ``fetch.request``), or ``release``s the claim if it cannot."""
        admitted = await asyncio.to_thread(self._decide, session.id, ask, True)
        assert admitted is not None
        return admitted

    async def release(self, session: Session, ask: ToolAsk, admitted: Admitted) -> None:
        """Undo a ``claim`` whose call could not be recorded."""
        await asyncio.to_thread(self._release, session.id, ask, admitted)

    async def latest_reply(self, session: Session) -> int | None:
        """The seq of the session's latest committed model reply, if any."""
        ledger = await asyncio.to_thread(self._refreshed, session.id)
        return ledger.latest_reply

    async def admit(self, session: Session, ask: ToolAsk) -> int:
        """Check the rule and claim the call, then append ``tool.call`` and wait until it is
        durable: its seq. The entry names the reply and call the ask was admitted as."""
        admitted = await self.claim(session, ask)
        try:
            appended = await self._append(session, self._call(ask, admitted))
        except BaseException:
            await self.release(session, ask, admitted)
            raise
        return appended.seq

    async def refuse(
        self,
        session: Session,
        ask: ToolAsk,
        error_body: bytes,
        refusal: Exception | None = None,
    ) -> Appended | None:
        """Record a refused call: its ``tool.call`` and a ``FAILED`` result with the body sent.

        The ``tool.call`` names the call the ask named, unless that is a call the reply did
        ask for (``ToolNotAsked``, ``ToolCallServed``): then ``call_id`` is empty, so the
        refusal answers none of the reply's calls (resume matches calls by id). An ask without
        ``_meta`` names the session's latest committed reply; with none, nothing is recorded.
        """
        named: NamedReply | Admitted
        if ask.named is not None:
            named = ask.named
            if isinstance(refusal, ToolNotAsked | ToolCallServed):
                named = Admitted(named.reply_seq, "")
        else:
            ledger = await asyncio.to_thread(self._refreshed, session.id)
            if ledger.latest_reply is None:
                return None
            named = Admitted(ledger.latest_reply, "")
        call = await self._append(session, self._call(ask, named))
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

    # -- the ledger (run in a worker thread: it reads the record) -------------------------------

    def _refreshed(self, stream: str) -> Ledger:
        with self._lock:
            ledger = self._ledgers.setdefault(stream, Ledger())
        with ledger.lock:
            self._fold(stream, ledger)
        return ledger

    def _fold(self, stream: str, ledger: Ledger) -> None:
        """Fold the entries appended since the last look (the caller holds ``ledger.lock``)."""
        size = self.log.store.size(stream)
        for stored in self.log.store.entries(stream, ledger.read_to, size):
            if parse_line(stored.line).kind in _FOLDED:
                body = self.index.open(stream, stored.seq)
                if body is None:
                    break  # not readable yet: look again next time, from here
                ledger.fold(stored.seq, body, self._calls_of(stream))
            ledger.read_to = stored.seq + 1

    def _calls_of(self, stream: str) -> Callable[[int], tuple[AskedCall, ...]]:
        def calls(seq: int) -> tuple[AskedCall, ...]:
            reply = self.index.reply(stream, seq)
            return reply.calls if reply is not None else ()

        return calls

    def _decide(self, stream: str, ask: ToolAsk, claim: bool) -> Admitted | None:
        with self._lock:
            ledger = self._ledgers.setdefault(stream, Ledger())
        with ledger.lock:
            self._fold(stream, ledger)
            reply_seq = ask.named.reply_seq if ask.named is not None else ledger.latest_reply
            reply = self.index.reply(stream, reply_seq) if reply_seq is not None else None
            found = (
                None if reply is not None or reply_seq is None else self._found(stream, reply_seq)
            )
            return pick(
                reply.calls if reply is not None else None,
                reply_seq,
                server=ask.server,
                tool=ask.tool,
                arguments=ask.arguments,
                call_id=ask.named.call_id if ask.named is not None else None,
                ledger=ledger,
                claim=claim,
                found=found,
            )

    def _found(self, stream: str, seq: int) -> str:
        """What entry ``seq`` is, for a refusal: why it is no committed reply."""
        body = self.index.open(stream, seq)
        if isinstance(body, ModelResponse):
            return f"a model reply recorded {body.outcome}"
        return "no sealed entry" if body is None else f"a {getattr(body, 'kind', '?')} entry"

    def _release(self, stream: str, ask: ToolAsk, admitted: Admitted) -> None:
        ledger = self._refreshed(stream)
        reply = self.index.reply(stream, admitted.reply_seq)
        with ledger.lock:
            for call in reply.calls if reply is not None else ():
                if call.call_id == admitted.call_id:
                    ledger.release(admitted.reply_seq, call)

    @staticmethod
    def _call(ask: ToolAsk, admitted: NamedReply | Admitted) -> ToolCall:
        return ToolCall(
            reply_seq=admitted.reply_seq,
            call_id=admitted.call_id,
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
