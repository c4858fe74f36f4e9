"""Derived tool-call ids for pinned sessions whose upstream hands out random ones.

The next request quotes a reply's tool-call ids back (``tool_call_id``, ``tool_use_id``), so a
random id makes that request's prompt, and every prompt after it, impossible to replay. In
a pinned session the proxy therefore delivers derived ids instead: the ``ordinal``-th
distinct id of a reply, in order of first appearance, becomes
``record.digest.tool_call_id(prompt_digest, seed, ordinal)``, where ``prompt_digest`` is the
request's (as sent) and ``seed`` the request's ``seed`` as sent, else the session's ``seed``
pin, else null. The embedded engine derives its ids the same way, so for it the mapping is
the identity.

- **On delivery** (:class:`Deriver`): each id is rewritten in the bytes the client gets, as
  a whole JSON string token, nothing else moved; in a stream, in the event that first
  carries it. The record keeps the upstream's bytes verbatim and the mapping beside them
  (``ModelResponse.reproducibility["affidavit_tool_call_ids"]``).
- **On the next request** (:func:`map_back`): derived ids the client sends back are turned
  into the upstream's own ids (:class:`ToolIdTable`, one per session), so the upstream sees
  the ids it issued.

Which ids: OpenAI ``choices[].message.tool_calls[].id`` and ``choices[].delta.tool_calls[].id``;
Anthropic ``tool_use`` blocks (``content[]``, ``content_block_start.content_block``); OpenAI
Responses: the ``call_id`` of ``function_call`` items (a response's ``output[]``, an event's
``item`` or ``response.output[]``; the ``call_id`` quoted back by ``function_call`` and
``function_call_output`` input items), the item's own ``id`` being left as it is.
Server-side tools (``server_tool_use``) are left as they are. Nothing here does I/O.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from egress_proxy.sse import EventSplitter, iter_events, parse_event
from record.digest import tool_call_id
from record.limits import JsonRefused, load_json

#: The ``reproducibility`` key of ``model.response`` that holds a reply's mapping.
RECORD_KEY = "affidavit_tool_call_ids"

DialectName = Literal["openai", "anthropic", "responses"]
Pairs = list[tuple[str, str]]  # (upstream id, derived id), in ordinal order


def ids_in(dialect: DialectName, obj: Any) -> list[str]:
    """The tool-call ids in one JSON object (a whole reply, or one stream event), in order."""
    if not isinstance(obj, dict):
        return []
    found: list[str] = []
    if dialect == "openai":
        for choice in _dicts(obj.get("choices")):
            for part in ("message", "delta"):
                holder = choice.get(part)
                if isinstance(holder, dict):
                    found += [c["id"] for c in _dicts(holder.get("tool_calls")) if _id(c)]
        return found
    if dialect == "responses":
        return [item["call_id"] for item in _function_calls(obj) if _id(item, "call_id")]
    blocks = [*_dicts(obj.get("content"))]
    message = obj.get("message")
    if isinstance(message, dict):
        blocks += _dicts(message.get("content"))
    if isinstance(obj.get("content_block"), dict):
        blocks.append(obj["content_block"])
    return [b["id"] for b in blocks if b.get("type") == "tool_use" and _id(b)]


def _dicts(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, list):
        yield from (v for v in value if isinstance(v, dict))


def _id(holder: dict[str, Any], key: str = "id") -> bool:
    return isinstance(holder.get(key), str) and holder[key] != ""


def _function_calls(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``function_call`` items of a Responses reply or stream event, in order."""
    items = [*_dicts(obj.get("output"))]
    if isinstance(obj.get("item"), dict):
        items.append(obj["item"])
    if isinstance(obj.get("response"), dict):
        items += _dicts(obj["response"].get("output"))
    return [item for item in items if item.get("type") == "function_call"]


def _id_key(dialect: DialectName) -> bytes:
    """The member that holds a tool-call id, as a JSON string token."""
    return b'"call_id"' if dialect == "responses" else b'"id"'


class Deriver:
    """Derives the ids of one reply, in order of first appearance, and rewrites its bytes."""

    def __init__(
        self,
        dialect: DialectName,
        prompt_digest: str,
        seed: int | None,
        on_new: Callable[[str, str], None] | None = None,
    ) -> None:
        self.dialect, self.prompt_digest, self.seed = dialect, prompt_digest, seed
        self.on_new = on_new
        self.pairs: Pairs = []
        self._derived: dict[str, str] = {}

    def derive(self, upstream: str) -> str:
        derived = self._derived.get(upstream)
        if derived is None:
            derived = tool_call_id(self.prompt_digest, self.seed, len(self.pairs))
            self._derived[upstream] = derived
            self.pairs.append((upstream, derived))
            if self.on_new is not None:
                self.on_new(derived, upstream)
        return derived

    def scan(self, body: bytes, streamed: bool) -> Pairs:
        """Derive every id of a whole reply (what the record keeps): the same rule, the same
        order, as delivery, whatever the client read."""
        for obj in _objects(body, streamed):
            for upstream in ids_in(self.dialect, obj):
                self.derive(upstream)
        return self.pairs

    def rewrite_json(self, body: bytes) -> bytes:
        """A non-streamed reply with its ids replaced."""
        try:
            obj = load_json(body)
        except JsonRefused:  # not JSON, or past the limits: relayed as it came
            return body
        table, wanted = self._table(obj)
        if not table:
            return body
        candidate = replace_id_tokens(body, table, _id_key(self.dialect))
        if _json_ids(self.dialect, candidate) == wanted:
            return candidate
        return _reencoded_json(_replaced(self.dialect, obj, table))

    def rewrite_event(self, block: bytes) -> bytes:
        """One SSE event block with its ids replaced in its ``data:`` line."""
        obj = parse_event(block).json()
        table, wanted = self._table(obj)
        if not table:
            return block
        lines = _LINE.findall(block)
        data = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
        if len(data) == 1:
            i = data[0]
            line = replace_id_tokens(lines[i], table, _id_key(self.dialect))
            candidate = b"".join([*lines[:i], line, *lines[i + 1 :]])
            if ids_in(self.dialect, parse_event(candidate).json()) == wanted:
                return candidate
        return _reencoded_event(block, _replaced(self.dialect, obj, table))

    def _table(self, obj: Any) -> tuple[dict[str, str], list[str]]:
        """The ids of ``obj`` derived (upstream -> derived), and the ids it must end up with."""
        ids = ids_in(self.dialect, obj)
        table = {upstream: self.derive(upstream) for upstream in ids}
        return table, [table[upstream] for upstream in ids]

    async def rewrite_stream(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The stream's bytes with ids replaced, event by event, as the events complete."""
        splitter = EventSplitter()
        try:
            async for chunk in body:
                ready = b"".join(self.rewrite_event(block) for block in splitter.feed(chunk))
                if ready:
                    yield ready
        finally:
            await _close(body)
        if splitter.tail:
            yield self.rewrite_event(splitter.tail)

    async def rewrite_whole(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """A non-streamed reply, read whole, with its ids replaced."""
        try:
            whole = b"".join([chunk async for chunk in body])
        finally:
            await _close(body)
        yield self.rewrite_json(whole)


async def _close(body: AsyncIterator[bytes]) -> None:
    """Close the reader under us now, not when it is collected (the capture learns the
    client has gone and stops queueing for it)."""
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        await aclose()


def _objects(body: bytes, streamed: bool) -> Iterable[Any]:
    if streamed:
        return (event.json() for event in iter_events(body))
    try:
        return [load_json(body)]
    except JsonRefused:
        return []


_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_SPACE = b" \t\r\n"


def replace_id_tokens(raw: bytes, table: Mapping[str, str], key_token: bytes = b'"id"') -> bytes:
    """``raw`` with each JSON string *token* that is the value of an ``id`` member (or of the
    member ``key_token`` names) and names a key of ``table`` replaced by its value; every
    other byte stays where it was.

    Works on a JSON text, or an SSE ``data:`` line holding one: outside strings JSON has no
    quote characters, so scanning string tokens from the first quote finds them all.
    """
    out = bytearray()
    last = 0
    key: bytes | None = None
    for match in _STRING.finditer(raw):
        token = match.group()
        if _next_byte(raw, match.end()) == ord(":"):
            key = token
            continue
        if key == key_token and _previous_byte(raw, match.start()) == ord(":"):
            try:
                value = json.loads(token)
            except ValueError:  # an escape JSON does not have: not a value we issued
                value = None
            if isinstance(value, str) and value in table:
                out += raw[last : match.start()] + json.dumps(table[value]).encode("ascii")
                last = match.end()
        key = None
    return raw if last == 0 else bytes(out + raw[last:])


def _next_byte(raw: bytes, at: int) -> int | None:
    while at < len(raw) and raw[at] in _SPACE:
        at += 1
    return raw[at] if at < len(raw) else None


def _previous_byte(raw: bytes, at: int) -> int | None:
    at -= 1
    while at >= 0 and raw[at] in _SPACE:
        at -= 1
    return raw[at] if at >= 0 else None


def _json_ids(dialect: DialectName, raw: bytes) -> list[str] | None:
    try:
        return ids_in(dialect, load_json(raw))
    except JsonRefused:
        return None


def _replaced(dialect: DialectName, obj: Any, table: Mapping[str, str]) -> Any:
    """A copy of ``obj`` with the tool-call ids replaced (the fallback path)."""
    copy = json.loads(json.dumps(obj))
    holders: list[dict[str, Any]] = []
    if dialect == "responses":
        for item in _function_calls(copy):
            if isinstance(item.get("call_id"), str) and item["call_id"] in table:
                item["call_id"] = table[item["call_id"]]
        return copy
    if dialect == "openai":
        for choice in _dicts(copy.get("choices")):
            for part in ("message", "delta"):
                if isinstance(choice.get(part), dict):
                    holders += _dicts(choice[part].get("tool_calls"))
    else:
        holders += _dicts(copy.get("content"))
        if isinstance(copy.get("message"), dict):
            holders += _dicts(copy["message"].get("content"))
        if isinstance(copy.get("content_block"), dict):
            holders.append(copy["content_block"])
        holders = [h for h in holders if h.get("type") == "tool_use"]
    for holder in holders:
        if isinstance(holder.get("id"), str) and holder["id"] in table:
            holder["id"] = table[holder["id"]]
    return copy


def _reencoded_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _reencoded_event(block: bytes, obj: Any) -> bytes:
    """The event's other lines as they were, its data as one line, then a blank line."""
    kept = [line for line in _LINE.findall(block) if line.strip() and not line.startswith(b"data:")]
    return b"".join(kept) + b"data: " + _reencoded_json(obj) + b"\n\n"


class ToolIdTable:
    """One session's derived ids and the upstream ids they stand for (thread-safe).

    The same derived id can name two upstream ids (the same prompt sent twice, answered
    with new random ids each time); the latest wins, as the client continues from it.
    """

    def __init__(self) -> None:
        self._upstream: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, derived: str, upstream: str) -> None:
        if derived != upstream:
            with self._lock:
                self._upstream[derived] = upstream

    def upstream_of(self, derived: str) -> str | None:
        with self._lock:
            return self._upstream.get(derived)

    def __len__(self) -> int:
        with self._lock:
            return len(self._upstream)


def map_back(
    dialect: DialectName, request: Mapping[str, Any], table: ToolIdTable
) -> dict[str, Any] | None:
    """``request`` with the derived ids it quotes turned back into upstream ids (a new dict),
    or None when it quotes none. OpenAI: ``messages[].tool_calls[].id`` and
    ``messages[].tool_call_id``; Anthropic: ``tool_use.id`` and ``tool_result.tool_use_id``;
    Responses: the ``call_id`` of ``function_call`` and ``function_call_output`` items."""
    if dialect == "responses":
        return _map_back_items(request, table)
    messages = request.get("messages")
    if not isinstance(messages, list) or not len(table):
        return None
    changed = False

    def swap(holder: dict[str, Any], key: str) -> dict[str, Any]:
        nonlocal changed
        value = holder.get(key)
        upstream = table.upstream_of(value) if isinstance(value, str) else None
        if upstream is None:
            return holder
        changed = True
        return {**holder, key: upstream}

    result: list[Any] = []
    for message in messages:
        if not isinstance(message, dict):
            result.append(message)
            continue
        if dialect == "openai":
            message = swap(message, "tool_call_id")
            if isinstance(message.get("tool_calls"), list):
                calls = [swap(c, "id") if isinstance(c, dict) else c for c in message["tool_calls"]]
                message = {**message, "tool_calls": calls}
        elif isinstance(message.get("content"), list):
            blocks = [_swap_block(b, swap) for b in message["content"]]
            message = {**message, "content": blocks}
        result.append(message)
    return {**request, "messages": result} if changed else None


def _swap_block(block: Any, swap: Callable[[dict[str, Any], str], dict[str, Any]]) -> Any:
    if not isinstance(block, dict):
        return block
    if block.get("type") == "tool_use":
        return swap(block, "id")
    if block.get("type") == "tool_result":
        return swap(block, "tool_use_id")
    return block


def _map_back_items(request: Mapping[str, Any], table: ToolIdTable) -> dict[str, Any] | None:
    items = request.get("input")
    if not isinstance(items, list) or not len(table):
        return None
    changed = False
    result: list[Any] = []
    for item in items:
        kinds = ("function_call", "function_call_output")
        if isinstance(item, dict) and item.get("type") in kinds:
            value = item.get("call_id")
            upstream = table.upstream_of(value) if isinstance(value, str) else None
            if upstream is not None:
                item, changed = {**item, "call_id": upstream}, True
        result.append(item)
    return {**request, "input": result} if changed else None
