"""Recorded bytes as a reader means them: JSON parsed, a stream reassembled, HTTP split open.

A reply streamed as server-sent events holds its text in pieces (``"sec"``, ``"ret"``), and a
JSON body may spell a letter as ``\\u0073``: a rule that looks for a string in the raw bytes
misses both. ``decode`` turns bytes into the JSON value they stand for, so that redaction
(``record.redact``) judges what a person would read:

- a JSON document: its parsed value;
- an event stream: the reply it streams, reassembled into the shape of the same reply sent
  whole (Chat Completions, Messages, Responses), with the count of events and any event it
  did not fold in;
- an HTTP message (a fetch's request or response): its head as text and its body decoded
  (chunked transfer coding undone);
- other UTF-8: the text; anything else: None.

Inside a decoded value, a string that is itself a JSON object or array (tool-call arguments)
is parsed too. This module only reads bytes it is handed; it imports nothing else of ours
and never touches a store.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Decoded", "Form", "decode", "decode_event_stream", "decode_http", "read"]

#: What a body turned out to be.
Form = Literal["json", "http", "event-stream", "text", "binary"]

_LINE = re.compile(r"\r\n|\r|\n")
_SSE_START = re.compile(rb"\A(?:\xef\xbb\xbf)?(?:data|event|id|retry)?:")
_HTTP_START = re.compile(rb"\A(?:HTTP/\d(?:\.\d)? \d{3}[^\r\n]*|[A-Z]+ \S+ HTTP/\d(?:\.\d)?)\r?\n")
_NESTED_DEPTH = 8  # how deep JSON inside JSON strings is opened


@dataclass(frozen=True)
class Decoded:
    """Bytes read: what they turned out to be, and the JSON value they stand for."""

    form: Form
    value: Any  # None for binary


def read(data: bytes) -> Decoded:
    """``data`` decoded (see the module docstring)."""
    stripped = data.lstrip()
    try:
        if stripped[:1] in (b"{", b"["):
            try:
                return Decoded("json", _open_nested(json.loads(stripped), 0))
            except ValueError:
                pass
        if _HTTP_START.match(data):
            return Decoded("http", decode_http(data))
        if _SSE_START.match(stripped):
            return Decoded("event-stream", decode_event_stream(data))
    except RecursionError:  # nested past what a reader follows: shown as the text it is
        pass
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Decoded("binary", None)
    return Decoded("text", text)


def decode(data: bytes) -> Any:
    """The value ``data`` stands for; None when it is not text."""
    return read(data).value


def _open_nested(value: Any, depth: int) -> Any:
    """Parse strings that are JSON objects or arrays, inside ``value``, to a bounded depth."""
    if depth >= _NESTED_DEPTH:
        return value
    if isinstance(value, str):
        head = value.lstrip()[:1]
        if head in ("{", "["):
            try:
                return _open_nested(json.loads(value), depth + 1)
            except ValueError:
                return value
        return value
    if isinstance(value, dict):
        return {k: _open_nested(v, depth) for k, v in value.items()}
    if isinstance(value, list):
        return [_open_nested(v, depth) for v in value]
    return value


# -- HTTP messages --------------------------------------------------------------------------


def decode_http(data: bytes) -> dict[str, Any]:
    """``{"head": …, "body": …}``: the start line and headers as text, the body decoded."""
    head, _, body = data.partition(b"\r\n\r\n")
    head_text = head.decode("utf-8", "replace")
    if re.search(r"(?im)^transfer-encoding:.*\bchunked\b", head_text):
        body = _dechunk(body)
    return {"head": head_text, "body": decode(body) if body else ""}


def _dechunk(body: bytes) -> bytes:
    """The payload of a chunked body (RFC 9112 §7.1); what does not parse is kept as it is."""
    out = bytearray()
    rest = body
    while rest:
        size_line, sep, after = rest.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0].strip(), 16)
        except ValueError:
            return body
        if not sep or size < 0:
            return body
        if size == 0:
            return bytes(out)
        out += after[:size]
        rest = after[size + 2 :]
    return bytes(out)


# -- event streams --------------------------------------------------------------------------


def _events(text: str) -> list[tuple[str | None, str | None]]:
    """``(event name, data)`` of each event (WHATWG "Parsing an event stream")."""
    events: list[tuple[str | None, str | None]] = []
    name: str | None = None
    data: list[str] = []
    for line in [*_LINE.split(text), ""]:
        if line == "":
            if name is not None or data:
                events.append((name, "\n".join(data) if data else None))
            name, data = None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    return events


def decode_event_stream(data: bytes) -> dict[str, Any]:
    """The reply an event stream carries, reassembled: ``{"events", "reply", "other"}``.

    ``reply`` has the shape of the same reply sent whole: a ``chat.completion`` for Chat
    Completions chunks, a ``message`` for Messages events, the ``response`` of a Responses
    stream. ``other`` lists the events folded into none of these, decoded.
    """
    events = _events(data.decode("utf-8", "replace"))
    chat = _ChatReply()
    messages = _MessagesReply()
    responses = _ResponsesReply()
    other: list[Any] = []
    for name, raw in events:
        if raw is None or raw.strip() == "[DONE]":
            continue
        try:
            event = json.loads(raw)
        except ValueError:
            other.append(_open_nested(raw, 0) if name is None else {"event": name, "data": raw})
            continue
        if not isinstance(event, dict):
            other.append(_open_nested(event, 0))
            continue
        kind = event.get("type")
        if "choices" in event and chat.fold(event):
            continue
        if isinstance(kind, str) and kind.startswith("response.") and responses.fold(event):
            continue
        if isinstance(kind, str) and messages.fold(event):
            continue
        other.append(_open_nested(event, 0))
    reply = chat.reply() or messages.reply() or responses.reply()
    return {"events": len(events), "reply": _open_nested(reply, 0), "other": other}


class _ChatReply:
    """Chat Completions chunks folded into one ``chat.completion``."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.seen = False

    def fold(self, event: dict[str, Any]) -> bool:
        choices = event.get("choices")
        if not isinstance(choices, list):
            return False
        self.seen = True
        for key, value in event.items():
            if key not in ("choices", "object"):
                self.head[key] = value
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            slot = self.choices.setdefault(
                index if isinstance(index, int) else 0, {"message": {}, "finish_reason": None}
            )
            for key, value in choice.items():
                if key not in ("delta", "index", "message") and value is not None:
                    slot[key] = value
            delta = choice.get("delta")
            if isinstance(delta, dict):
                _fold_delta(slot["message"], delta)
        return True

    def reply(self) -> dict[str, Any] | None:
        if not self.seen:
            return None
        choices = [{"index": i, **slot} for i, slot in sorted(self.choices.items())]
        for choice in choices:
            calls = choice["message"].get("tool_calls")
            if isinstance(calls, dict):
                choice["message"]["tool_calls"] = [calls[i] for i in sorted(calls)]
        return {**self.head, "object": "chat.completion", "choices": choices}


def _fold_delta(message: dict[str, Any], delta: dict[str, Any]) -> None:
    for key, value in delta.items():
        if key == "tool_calls" and isinstance(value, list):
            calls: dict[int, dict[str, Any]] = message.setdefault("tool_calls", {})
            for call in value:
                if not isinstance(call, dict):
                    continue
                index = call.get("index", len(calls))
                slot = calls.setdefault(index if isinstance(index, int) else len(calls), {})
                for k, v in call.items():
                    if k == "function" and isinstance(v, dict):
                        function = slot.setdefault("function", {})
                        for fk, fv in v.items():
                            _append(function, fk, fv)
                    elif k != "index":
                        _append(slot, k, v)
        else:
            _append(message, key, value)


def _append(into: dict[str, Any], key: str, value: Any) -> None:
    """Strings arriving in pieces are joined; anything else replaces what came before."""
    if value is None:
        into.setdefault(key, None)
    elif isinstance(value, str) and isinstance(into.get(key), str):
        into[key] += value
    else:
        into[key] = value


class _MessagesReply:
    """Messages events folded into one ``message``."""

    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, str] = {}

    def fold(self, event: dict[str, Any]) -> bool:
        kind = event["type"]
        index = event.get("index", 0)
        index = index if isinstance(index, int) else 0
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = dict(event["message"])
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self.blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            block = self.blocks.setdefault(index, {})
            for key, value in event["delta"].items():
                if key == "type":
                    continue
                if key == "partial_json" and isinstance(value, str):
                    self.partial[index] = self.partial.get(index, "") + value
                else:
                    _append(block, key, value)
        elif kind == "content_block_stop":
            pass
        elif kind == "message_delta":
            message = self.message if self.message is not None else {}
            self.message = message
            delta = event.get("delta")
            for key, value in (delta if isinstance(delta, dict) else {}).items():
                message[key] = value
            if isinstance(event.get("usage"), dict):
                usage = message.get("usage")
                message["usage"] = {**(usage if isinstance(usage, dict) else {}), **event["usage"]}
        elif kind not in ("message_stop", "ping"):
            return False
        return True

    def reply(self) -> dict[str, Any] | None:
        if self.message is None and not self.blocks:
            return None
        for index, text in self.partial.items():
            block = self.blocks.setdefault(index, {})
            try:
                block["input"] = json.loads(text)
            except ValueError:
                block["input"] = text
        message = dict(self.message or {"type": "message"})
        content = message.get("content")
        message["content"] = [
            *(content if isinstance(content, list) else []),
            *(self.blocks[i] for i in sorted(self.blocks)),
        ]
        return message


class _ResponsesReply:
    """A Responses stream: the final ``response`` when it came, else its deltas joined."""

    def __init__(self) -> None:
        self.response: dict[str, Any] | None = None
        self.pieces: dict[tuple[int, str], str] = {}

    def fold(self, event: dict[str, Any]) -> bool:
        kind = event["type"]
        if isinstance(event.get("response"), dict):
            self.response = event["response"]  # created, in_progress, completed: the last wins
            return True
        if kind.endswith(".delta") and isinstance(event.get("delta"), str):
            where = event.get("output_index", 0)
            key = (where if isinstance(where, int) else 0, kind.removesuffix(".delta"))
            self.pieces[key] = self.pieces.get(key, "") + event["delta"]
            return True
        if kind.endswith(".done") or kind.endswith(".added"):
            return False  # whole items and parts: kept as they are, their text is whole
        return False

    def reply(self) -> dict[str, Any] | None:
        if self.response is None and not self.pieces:
            return None
        reply = dict(self.response or {"object": "response"})
        if self.pieces:
            reply["streamed"] = [
                {"output_index": i, "type": t, "text": text}
                for (i, t), text in sorted(self.pieces.items())
            ]
        return reply
