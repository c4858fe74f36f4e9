"""Tool-call admission: a call runs only as an unserved call of a committed model reply.

The rule (#15 line 5, #16 line 6): a tool call is admitted only when its tool's name and its
canonical arguments (RFC 8785) equal a call the session's committed reply asked for, and that
call has not been served. How the reply is found depends on the client:

- a call whose ``_meta`` names ``affidavit/reply_seq`` and ``affidavit/call_id`` (the
  harness) is checked against that call of that reply;
- a call without them (any MCP client) is matched against the session's *latest* committed
  ``model.response``: the first unserved call, in the reply's order, with that name and
  those arguments. It is recorded as that call, exactly as the harness's would be.

A tool ``T`` of the proxy's server ``S`` answers to the names a client may have offered it to
the model as: ``S__T`` (the harness's), ``mcp__S__T`` (Claude Code's convention) and ``T``
(clients that pass MCP tool names through unchanged). The model's arguments are a JSON text
(OpenAI, Responses) or an object (Anthropic); both are compared as canonical JSON, a number
past a double's range in the model's text taken as the ``null`` a client sends for it.

A call is *served* once it is admitted: while it runs, and after, whatever its result, a
second call for it is refused (409 ``tool_call_served``). Only a call whose recorded outcome
is ``UNKNOWN`` may be admitted again, and only as resume would send it: when its ``tool.call``
says the tool is idempotent, or a person recorded ``turn.decided`` ``retry`` for it.

The built-in web tools follow the same rule: a fetch (``egress_proxy.fetch``) is admitted only
as a ``web_fetch {"url"}`` or ``web_search {"query"}`` call the reply asked for, recorded as
``fetch.request`` naming that reply and call, its ``fetch.response`` the result.

What was served is read from the record (``tool.call``, ``tool.result``, ``turn.decided``,
``fetch.request``, ``fetch.response``),
so it holds after a restart; a claim taken in memory, under a lock, covers the moment between
the decision and the durable ``tool.call``, so two identical calls at once admit one. A
refusal the proxy recorded (a ``FAILED`` result whose error carries one of its refusal codes)
serves nothing. This module dials nothing and imports no web framework.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from egress_proxy.errors import ReplyNotCommitted, ToolCallServed, ToolNotAsked
from egress_proxy.sse import iter_events
from record.digest import canonical_json
from record.limits import JsonRefused, load_json
from record.schema import (
    FetchRequest,
    FetchResponse,
    ModelResponse,
    ToolCall,
    ToolResult,
    TurnDecided,
)

#: The codes of the proxy's own refusals: a ``FAILED`` result carrying one served nothing.
REFUSAL_CODES = frozenset(
    {"reply_not_committed", "tool_not_asked", "tool_call_served", "replay_miss"}
)
#: The server name of the built-in web tools (``web_fetch``, ``web_search``), which the fetch
#: endpoint serves: a model asks for them by their bare names (``model_names``).
WEB = "web"


@dataclass(frozen=True)
class AskedCall:
    """One tool call a committed reply asked for."""

    index: int  # its place in the reply
    call_id: str  # the id the client was handed (the derived one, in a pinned session)
    ids: frozenset[str]  # every id that names it (upstream and derived)
    name: str  # the function name as the model wrote it
    arguments: bytes | None  # canonical JSON; None when the model's text is not JSON


@dataclass(frozen=True)
class Admitted:
    """The call an ask was admitted as: what its ``tool.call`` names."""

    reply_seq: int
    call_id: str


def model_names(server: str, tool: str) -> frozenset[str]:
    """The function names under which a model may have asked for ``tool`` of ``server``."""
    return frozenset({f"{server}__{tool}", f"mcp__{server}__{tool}", tool})


# -- the calls a reply asked for ----------------------------------------------------------------


def reply_calls(body: bytes) -> list[tuple[str, str, bytes | None]]:
    """``(id, name, canonical arguments)`` of each tool call in a reply, in order, from its
    bytes as received: OpenAI Chat (message or stream deltas), Anthropic Messages (blocks or
    stream events, ``input_json_delta`` joined) and Responses (``function_call`` items)."""
    try:
        objects: list[Any] = [load_json(body)]
    except JsonRefused:  # a stream, or a reply past record.limits (its calls read as none)
        objects = [event.json() for event in iter_events(body)]
    slots: dict[str, dict[str, Any]] = {}
    for obj in objects:
        _gather(obj, slots)
    calls: list[tuple[str, str, bytes | None]] = []
    seen: set[str] = set()
    for slot in slots.values():
        call_id, name = slot.get("id"), slot.get("name")
        if not isinstance(call_id, str) or not call_id or call_id in seen:
            continue
        seen.add(call_id)
        calls.append((call_id, name if isinstance(name, str) else "", _arguments(slot)))
    return calls


def _arguments(slot: dict[str, Any]) -> bytes | None:
    text = slot.get("text", "")
    try:
        value = load_json(text) if text.strip() else slot.get("input", {})
        return canonical_json(_finite(value))
    except ValueError:  # JsonRefused among them: arguments no call can match
        return None


def _finite(value: Any) -> Any:
    """A number past a double's range (``1E999``) as every JSON client sends it on: ``null``
    (JavaScript's ``JSON.stringify``, pydantic, the ``mcp`` SDK)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def _gather(value: Any, slots: dict[str, dict[str, Any]]) -> None:
    """Fold one JSON object (a reply, or one stream event) into ``slots``, walking it whole."""
    if isinstance(value, list):
        for item in value:
            _gather(item, slots)
        return
    if not isinstance(value, dict):
        return
    choices = value.get("choices")
    for position, choice in enumerate(choices if isinstance(choices, list) else []):  # Chat
        if not isinstance(choice, dict):
            continue
        at = choice.get("index", position)
        for part in ("message", "delta"):
            message = choice.get(part)
            calls = message.get("tool_calls") if isinstance(message, dict) else None
            for i, call in enumerate(calls if isinstance(calls, list) else []):
                if isinstance(call, dict):
                    slot = slots.setdefault(f"o:{at}:{call.get('index', i)}", {"text": ""})
                    given = call.get("function")
                    function: dict[str, Any] = given if isinstance(given, dict) else {}
                    _set(slot, "id", call.get("id"))
                    _set(slot, "name", function.get("name"))
                    if isinstance(function.get("arguments"), str):
                        slot["text"] += function["arguments"]
    kind = value.get("type")
    if kind == "content_block_start" and isinstance(value.get("content_block"), dict):
        _tool_use(value["content_block"], f"a:{value.get('index')}", slots)
    elif kind == "content_block_delta" and isinstance(value.get("delta"), dict):
        delta, block = value["delta"], slots.get(f"a:{value.get('index')}")
        if block is not None and isinstance(delta.get("partial_json"), str):
            block["text"] += delta["partial_json"]
    elif kind == "function_call" and isinstance(value.get("call_id"), str):  # Responses
        slot = slots.setdefault(f"r:{value['call_id']}", {"text": ""})
        _set(slot, "id", value["call_id"])
        _set(slot, "name", value.get("name"))
        if isinstance(value.get("arguments"), str) and value["arguments"]:
            slot["text"] = value["arguments"]  # each whole item repeats them in full
    content = value.get("content")
    if isinstance(content, list) and kind != "content_block_start":  # Anthropic message
        for i, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "tool_use":
                _tool_use(block, f"a:{i}", slots)
    for key, child in value.items():  # nested: a message_start, a response, output items
        if key in ("choices", "content", "content_block", "delta"):
            continue
        if isinstance(child, dict | list):
            _gather(child, slots)


def _tool_use(block: dict[str, Any], key: str, slots: dict[str, dict[str, Any]]) -> None:
    if block.get("type") != "tool_use":
        return
    slot = slots.setdefault(key, {"text": ""})
    _set(slot, "id", block.get("id"))
    _set(slot, "name", block.get("name"))
    if isinstance(block.get("input"), dict):
        slot["input"] = block["input"]


def _set(slot: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, str) and value and not slot.get(key):
        slot[key] = value


def asked_calls(body: ModelResponse, mapping: dict[str, str]) -> tuple[AskedCall, ...]:
    """The calls a committed reply asked for; ``mapping`` takes an upstream id to the id the
    client was handed (a pinned session's derived ids)."""
    calls = []
    for index, (upstream, name, arguments) in enumerate(reply_calls(body.response_bytes or b"")):
        handed = mapping.get(upstream, upstream)
        calls.append(AskedCall(index, handed, frozenset({upstream, handed}), name, arguments))
    return tuple(calls)


def is_refusal(result: ToolResult | FetchResponse) -> bool:
    """Whether a ``FAILED`` result is one of the proxy's refusals (it served nothing).

    A tool result's refusal is a JSON-RPC error whose ``data.code`` names it; a fetch's is
    the data plane's ``{"error": {"code"}}`` (only the proxy writes a fetch's error bytes)."""
    if result.outcome != "FAILED" or not result.error_bytes:
        return False
    try:
        error = load_json(result.error_bytes)
    except JsonRefused:
        return False
    if isinstance(error, dict) and isinstance(error.get("error"), dict):
        error = error["error"]  # a whole JSON-RPC answer, or the data plane's error body
    if not isinstance(error, dict):
        return False
    data = error if isinstance(result, FetchResponse) else error.get("data")
    code = data.get("code") if isinstance(data, dict) else None
    return isinstance(code, str) and code in REFUSAL_CODES


# -- what a session has served ------------------------------------------------------------------


@dataclass
class _Served:
    state: str  # "claimed" (admitted, no result yet), "done", "unknown"
    call_seq: int | None = None
    idempotent: bool = False


@dataclass
class Ledger:
    """One stream's replies and served calls, folded from its record entries in order."""

    read_to: int = 0  # entries before this seq are folded in
    latest_reply: int | None = None  # the latest COMMITTED model.response
    calls: dict[int, tuple[tuple[int, int] | None, bool]] = field(default_factory=dict)
    served: dict[tuple[int, int], _Served] = field(default_factory=dict)
    retry: set[int] = field(default_factory=set)  # tool.call seqs a person said to re-send
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fold(self, seq: int, body: object, replies: Callable[[int], tuple[AskedCall, ...]]) -> None:
        """Take in entry ``seq``; ``replies(seq)`` gives the calls a committed reply asked for."""
        if isinstance(body, ModelResponse) and body.outcome == "COMMITTED":
            self.latest_reply = seq
        elif isinstance(body, ToolCall):
            key = _key(replies(body.reply_seq), body.reply_seq, body.call_id)
            self.calls[seq] = (key, body.idempotent)
        elif isinstance(body, FetchRequest) and body.reply_seq is not None and body.call_id:
            key = _key(replies(body.reply_seq), body.reply_seq, body.call_id)
            self.calls[seq] = (key, True)  # a web tool's call is a GET: idempotent
        elif isinstance(body, ToolResult | FetchResponse):
            call_seq = body.call_seq if isinstance(body, ToolResult) else body.request_seq
            key, idempotent = self.calls.get(call_seq, (None, False))
            if key is None or is_refusal(body):
                return
            state = "unknown" if body.outcome == "UNKNOWN" else "done"
            self.served[key] = _Served(state, call_seq, idempotent)
        elif isinstance(body, TurnDecided) and body.decision == "retry":
            self.retry.add(body.call_seq)

    def claim(self, reply_seq: int, call: AskedCall, *, claim: bool = True) -> None:
        """Mark ``call`` served (the caller holds ``lock``), or refuse: ``ToolCallServed``.
        ``claim`` False only checks."""
        key = (reply_seq, call.index)
        served = self.served.get(key)
        if served is not None:
            if served.state != "unknown":
                raise ToolCallServed(
                    f"call {call.call_id!r} ({call.name}) of the reply at seq {reply_seq} "
                    "was served already"
                )
            if not served.idempotent and served.call_seq not in self.retry:
                raise ToolCallServed(
                    f"call {call.call_id!r} ({call.name}) of the reply at seq {reply_seq} has "
                    f"an unknown outcome (tool.call seq {served.call_seq}); the tool is not "
                    "idempotent, so it is sent again only after a person decides retry"
                )
        if claim:
            self.served[key] = _Served("claimed")

    def release(self, reply_seq: int, call: AskedCall) -> None:
        """Undo a claim whose ``tool.call`` could not be recorded (the caller holds ``lock``)."""
        key = (reply_seq, call.index)
        if (served := self.served.get(key)) is not None and served.state == "claimed":
            del self.served[key]


def _key(calls: tuple[AskedCall, ...], reply_seq: int, call_id: str) -> tuple[int, int] | None:
    for call in calls:
        if call_id in call.ids:
            return (reply_seq, call.index)
    return None


def pick(
    calls: tuple[AskedCall, ...] | None,
    reply_seq: int | None,
    *,
    server: str,
    tool: str,
    arguments: bytes,
    call_id: str | None,
    ledger: Ledger,
    claim: bool = True,
    found: str | None = None,
) -> Admitted:
    """Choose and claim the call an ask is admitted as (the caller holds ``ledger.lock``).

    ``call_id`` None: the first unserved call of the reply with this name and these
    arguments. Otherwise that call, which must have this name and these arguments.
    Raises ``ReplyNotCommitted`` (or its ``ToolNotAsked``/``ToolCallServed``), naming why.
    ``claim`` False checks only: nothing is marked served. ``found`` says what the record
    holds at ``reply_seq`` when that is no committed reply (a ``FAILED`` or ``UNKNOWN`` one
    asked for nothing a tool may run, whatever its bytes hold).
    """
    if calls is None or reply_seq is None:
        where = (
            "this session has no committed model reply"
            if reply_seq is None
            else f"seq {reply_seq} of this session is not a committed model reply"
        )
        raise ReplyNotCommitted(where + (f": it is {found}" if found else ""))
    names = model_names(server, tool)
    if call_id is not None:
        named = next((c for c in calls if call_id in c.ids), None)
        if named is None:
            raise ReplyNotCommitted(
                f"the reply at seq {reply_seq} asked for no tool call {call_id!r}"
            )
        if named.name not in names:
            raise ToolNotAsked(
                f"call {call_id!r} of the reply at seq {reply_seq} asked for {named.name!r}, "
                f"not {server}/{tool}"
            )
        if named.arguments != arguments:
            raise ToolNotAsked(
                f"call {call_id!r} of the reply at seq {reply_seq} asked for {named.name} "
                f"with other arguments: {_show(named.arguments)} here {_show(arguments)}"
            )
        ledger.claim(reply_seq, named, claim=claim)
        return Admitted(reply_seq, named.call_id)
    same_name = [c for c in calls if c.name in names]
    matching = [c for c in same_name if c.arguments == arguments]
    if not same_name:
        asked = ", ".join(sorted({c.name for c in calls})) or "no tools"
        raise ToolNotAsked(
            f"the latest committed reply (seq {reply_seq}) asked for no call of {server}/{tool} "
            f"(it asked for {asked})"
        )
    if not matching:
        raise ToolNotAsked(
            f"the latest committed reply (seq {reply_seq}) asked for {same_name[0].name} with "
            f"other arguments: {_show(same_name[0].arguments)} here {_show(arguments)}"
        )
    refusal: ToolCallServed | None = None
    for call in matching:
        try:
            ledger.claim(reply_seq, call, claim=claim)
        except ToolCallServed as exc:
            refusal = refusal or exc
            continue
        return Admitted(reply_seq, call.call_id)
    assert refusal is not None
    raise refusal


def _show(arguments: bytes | None, limit: int = 120) -> str:
    text = "(not JSON)" if arguments is None else arguments.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "…"
