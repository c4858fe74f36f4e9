"""What the pages show, read from a stream's record: sessions, turns, steps, tool calls.

Nothing here writes, and nothing is rendered: the templates escape every value (the record
holds model output and web pages, which are data, never markup).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from egress_proxy.sse import iter_events
from harness.panel.source import (
    Health,
    Opened,
    Position,
    Source,
    StreamRecord,
    open_stream,
)
from record.limits import JsonRefused, load_json
from record.schema import (
    FetchRequest,
    FetchResponse,
    ModelRequest,
    ModelResponse,
    PinsSet,
    Strict,
    ToolCall,
    ToolResult,
    TurnDecided,
    TurnEnded,
    TurnStarted,
    body_kind,
)

__all__ = [
    "SessionRow",
    "SessionView",
    "StepView",
    "ToolView",
    "TurnRow",
    "TurnView",
    "read_stream",
    "reply_parts",
    "session_rows",
    "session_view",
    "turn_view",
]

LABEL_REPLAYS = "affidavit/replays"
LABEL_REPLAYS_TURN = "affidavit/replays-turn"
PROXY_PREFIX = "affidavit_"  # the proxy's own members of a reproducibility block
SHOWN = 20_000  # characters of one body shown on a page (the rest is in the bundle)


def text_of(data: bytes | None, limit: int = SHOWN) -> str:
    if data is None:
        return ""
    text = data.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def pretty_bytes(data: bytes | None) -> str:
    """JSON bytes, indented; anything else as text."""
    if data is None:
        return ""
    try:
        # a lone surrogate (a legal JSON escape) is shown as its escape, not an error
        return text_of(pretty(load_json(data)).encode("utf-8", "backslashreplace"))
    except JsonRefused:  # not JSON, or past record.limits: shown as text
        return text_of(data)


# -- replies --------------------------------------------------------------------------------


def reply_parts(data: bytes | None) -> tuple[str, list[tuple[str, str]]]:
    """The reply's text and its tool calls ``(name, arguments)``, from the bytes as recorded:
    an OpenAI or Anthropic stream (SSE) or a whole JSON reply."""
    if not data:
        return "", []
    stripped = data.lstrip()
    if stripped.startswith(b"{"):
        try:
            return _whole_reply(load_json(stripped))
        except JsonRefused:
            return text_of(data), []
    text: list[str] = []
    calls: dict[int, list[str]] = {}
    for raw in iter_events(data):
        event = raw.json()
        if event is None:
            continue
        for choice in _list(event.get("choices")):  # OpenAI chunks
            delta = _dict(choice.get("delta")) if isinstance(choice, dict) else {}
            if isinstance(delta.get("content"), str):
                text.append(delta["content"])
            for call in _list(delta.get("tool_calls")):
                call = _dict(call)
                slot = calls.setdefault(_index(call, len(calls)), ["", ""])
                function = _dict(call.get("function"))
                slot[0] += str(function.get("name") or "")
                slot[1] += str(function.get("arguments") or "")
        kind = event.get("type")  # Anthropic events
        if kind == "content_block_start":
            block = _dict(event.get("content_block"))
            if block.get("type") == "tool_use":
                calls[_index(event, len(calls))] = [str(block.get("name", "")), ""]
            elif block.get("type") == "text" and block.get("text"):
                text.append(str(block["text"]))
        elif kind == "content_block_delta":
            delta = _dict(event.get("delta"))
            if delta.get("type") == "text_delta":
                text.append(str(delta.get("text", "")))
            elif delta.get("type") == "input_json_delta":
                slot = calls.setdefault(_index(event, len(calls)), ["", ""])
                slot[1] += str(delta.get("partial_json", ""))
    return "".join(text), [(name, args) for _, (name, args) in sorted(calls.items())]


def _whole_reply(reply: Any) -> tuple[str, list[tuple[str, str]]]:
    if not isinstance(reply, dict):
        return "", []
    text, calls = [], []
    for choice in _list(reply.get("choices")):
        message = _dict(choice.get("message")) if isinstance(choice, dict) else {}
        if isinstance(message.get("content"), str):
            text.append(message["content"])
        for call in _list(message.get("tool_calls")):
            function = _dict(call.get("function")) if isinstance(call, dict) else {}
            calls.append((str(function.get("name", "")), str(function.get("arguments", ""))))
    for block in _list(reply.get("content")):
        if isinstance(block, dict) and block.get("type") == "text":
            text.append(str(block.get("text", "")))
        elif isinstance(block, dict) and block.get("type") == "tool_use":
            calls.append((str(block.get("name", "")), json.dumps(block.get("input", {}))))
    return "".join(text), calls


def _list(value: Any) -> list[Any]:
    """A reply's member read as a list: whatever else an upstream sent there reads as none."""
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _index(holder: dict[str, Any], default: int) -> int:
    index = holder.get("index")
    return index if isinstance(index, int) and not isinstance(index, bool) else default


def mcp_result_text(data: bytes | None) -> tuple[str, bool]:
    """An MCP ``tools/call`` result's text items, and whether it says it is an error."""
    try:
        result = load_json(data or b"")
    except JsonRefused:
        return text_of(data), False
    if not isinstance(result, dict):
        return text_of(data), False
    parts = []
    for item in result.get("content") or []:
        if isinstance(item, dict) and item.get("type") == "text":
            parts.append(str(item.get("text", "")))
        elif isinstance(item, dict):
            parts.append(f"[{item.get('type', 'content')}]")
    return text_of("\n".join(parts).encode()), bool(result.get("isError"))


# -- the sessions list -------------------------------------------------------------------------


@dataclass
class SessionRow:
    stream: str
    pins: dict[str, Any] | None
    turns: int | None  # None: sealed to none of the panel's keys
    last_activity: str | None
    health: Health
    replays: str | None = None
    replays_turn: str | None = None
    opened_with: str | None = None
    model: str | None = None

    @property
    def pinned(self) -> bool:
        return bool(self.pins)

    @property
    def strict(self) -> bool:
        return bool(self.pins and self.pins.get("strict_cache") is True)


def _pins(opened: Opened | None) -> dict[str, Any] | None:
    pins: dict[str, Any] | None = None
    for _, body in opened.bodies if opened else []:
        if isinstance(body, PinsSet):
            pins = dict(body.pins) or None
    return pins


def session_row(
    source: Source, stream: str, read: tuple[StreamRecord, Opened | None] | None = None
) -> SessionRow:
    """The stream's row in the sessions list (``read``: the stream, when already read)."""
    record, opened = read if read is not None else read_stream(source, stream)
    first = record.stream_opened()
    labels = dict(first.labels) if first else {}
    turns = (
        sum(isinstance(b, TurnStarted) for _, b in opened.bodies) if opened is not None else None
    )
    return SessionRow(
        stream,
        _pins(opened),
        turns,
        record.last_activity,
        record.health(),
        labels.get(LABEL_REPLAYS),
        labels.get(LABEL_REPLAYS_TURN),
        opened.key_name if opened else None,
        labels.get("affidavit/model"),
    )


def session_rows(source: Source) -> list[SessionRow]:
    rows = [session_row(source, stream) for stream in source.streams()]
    return sorted(rows, key=lambda r: r.last_activity or "", reverse=True)


# -- a session ------------------------------------------------------------------------------


@dataclass
class TurnRow:
    turn: int
    input: str
    started_at: str
    outcome: str  # ANSWERED … or "open"
    model_steps: int
    tool_calls: int
    pins: dict[str, Any] | None


@dataclass
class SessionView:
    row: SessionRow
    record: StreamRecord
    opened: Opened | None
    labels: dict[str, str]
    recipients: list[str]
    turns: list[TurnRow]
    checkpoints: list[tuple[int, str]] = field(default_factory=list)  # (size, covered to)
    known: dict[str, str] = field(default_factory=dict)  # recipient -> the panel's name for it


def read_stream(source: Source, stream: str) -> tuple[StreamRecord, Opened | None]:
    """The stream's record, and its bodies opened with the first of the source's keys that
    is a recipient of it (None: none is)."""
    record = source.record(stream)
    opened = open_stream(record, source.keys())
    if opened is not None:
        opened.redaction = source.redaction
    return record, opened


def shown_bodies(opened: Opened) -> list[tuple[int, Strict]]:
    """The opened bodies as pages show them: with ``--redact``, redacted copies (for display
    only: ``record.redact``); replay and verify jobs get ``opened`` itself."""
    bodies = opened.strict()
    if not opened.redaction:
        return bodies
    redacted = opened.redaction.stream((body_kind(b), b) for _, b in bodies)
    shown = [redacted.shown_body(i) for i in range(len(bodies))]
    return [(seq, b) for (seq, _), b in zip(bodies, shown, strict=True) if isinstance(b, Strict)]


def session_view(source: Source, stream: str) -> SessionView:
    record, opened = read_stream(source, stream)
    row = session_row(source, stream, (record, opened))
    first = record.stream_opened()
    turns: list[TurnRow] = []
    at = {e.seq: e.occurred_at for e in record.entries}
    pins: dict[str, Any] | None = None
    current: TurnRow | None = None
    for seq, body in shown_bodies(opened) if opened else []:
        if isinstance(body, PinsSet):
            pins = dict(body.pins) or None
        elif isinstance(body, TurnStarted):
            current = TurnRow(
                body.turn, text_of(body.input_bytes, 400), at[seq], "open", 0, 0, pins
            )
            turns.append(current)
        elif current is not None:
            if isinstance(body, TurnEnded) and body.turn == current.turn:
                current.outcome = body.outcome
            elif isinstance(body, ModelRequest):
                current.model_steps += 1
            elif isinstance(body, ToolCall | FetchRequest):
                current.tool_calls += 1
    anchor = record.anchor()
    checkpoints = [(anchor[0].size, at.get(anchor[0].size - 1, ""))] if anchor else []
    return SessionView(
        row,
        record,
        opened,
        dict(first.labels) if first else {},
        [w.recipient for w in first.recipients] if first else [],
        turns,
        checkpoints,
        {key.recipient.text(): name for name, key in reversed(source.keys())},
    )


# -- a turn ---------------------------------------------------------------------------------


@dataclass
class ToolView:
    kind: str  # "mcp" or "fetch"
    server: str
    tool: str
    arguments: str
    result: str
    outcome: str
    call: Position
    answer: Position | None
    idempotent: bool | None = None
    is_error: bool = False
    replayed_from: int | None = None
    url: str | None = None
    raw: str = ""  # the result as recorded (MCP JSON, or the HTTP response)
    at: str = ""


@dataclass
class StepView:
    step: int
    request: ModelRequest
    request_at: Position
    occurred_at: str
    response: ModelResponse | None = None
    response_at: Position | None = None
    reply_text: str = ""
    reply_calls: list[tuple[str, str]] = field(default_factory=list)
    engine_block: dict[str, Any] = field(default_factory=dict)
    proxy_block: dict[str, Any] = field(default_factory=dict)
    tools: list[ToolView] = field(default_factory=list)
    request_text: str = ""


@dataclass
class TurnView:
    stream: str
    turn: int
    input: str
    started_at: str
    started: Position
    pins: dict[str, Any] | None
    cache_mode: str | None
    steps: list[StepView]
    ended: TurnEnded | None = None
    ended_at: Position | None = None
    ended_time: str = ""
    answer: str = ""
    decisions: list[TurnDecided] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def strict(self) -> bool:
        return bool(self.pins and self.pins.get("strict_cache") is True)


class NoTurn(LookupError):
    """The stream has no such turn (404)."""


def turn_view(record: StreamRecord, opened: Opened, turn: int) -> TurnView:
    """Turn ``turn`` of the stream, step by step, every entry with its position and proof."""
    at = {e.seq: e.occurred_at for e in record.entries}
    index = {e.seq: i for i, e in enumerate(record.entries)}
    bodies = shown_bodies(opened)
    start = next(
        (i for i, (_, b) in enumerate(bodies) if isinstance(b, TurnStarted) and b.turn == turn),
        None,
    )
    if start is None:
        raise NoTurn(f"stream {record.stream} has no turn {turn}")
    pins: dict[str, Any] | None = None
    cache_mode: str | None = None
    for _, body in bodies[:start]:
        if isinstance(body, PinsSet):
            pins, cache_mode = dict(body.pins) or None, body.cache_mode
    seq0, started = bodies[start]
    assert isinstance(started, TurnStarted)
    first = record.stream_opened()
    view = TurnView(
        record.stream,
        turn,
        text_of(started.input_bytes),
        at[seq0],
        record.position(index[seq0]),
        pins,
        cache_mode,
        [],
        labels=dict(first.labels) if first else {},
    )
    answers: dict[int, tuple[int, Strict]] = {}
    for seq, body in bodies[start:]:
        if isinstance(body, ModelResponse | FetchResponse):
            answers.setdefault(body.request_seq, (seq, body))
        elif isinstance(body, ToolResult):
            answers.setdefault(body.call_seq, (seq, body))
    step: StepView | None = None
    web_calls: list[tuple[str, str]] = []
    for seq, body in bodies[start + 1 :]:
        if isinstance(body, TurnEnded) and body.turn == turn:
            view.ended, view.ended_at = body, record.position(index[seq])
            view.ended_time, view.answer = at[seq], text_of(body.answer_bytes)
            break
        if isinstance(body, TurnStarted):
            break
        if isinstance(body, TurnDecided):
            view.decisions.append(body)
        elif isinstance(body, ModelRequest):
            step = StepView(
                body.step if body.step is not None else len(view.steps),
                body,
                record.position(index[seq]),
                at[seq],
                request_text=pretty_bytes(body.request_bytes),
            )
            view.steps.append(step)
            answer = answers.get(seq)
            if answer is not None and isinstance(answer[1], ModelResponse):
                response = answer[1]
                step.response, step.response_at = response, record.position(index[answer[0]])
                step.reply_text, step.reply_calls = reply_parts(
                    response.response_bytes or response.error_bytes
                )
                block = dict(response.reproducibility or {})
                step.engine_block = {
                    k: v for k, v in block.items() if not k.startswith(PROXY_PREFIX)
                }
                step.proxy_block = {k: v for k, v in block.items() if k.startswith(PROXY_PREFIX)}
                if response.fingerprint:
                    step.engine_block.setdefault("system_fingerprint", response.fingerprint)
            web_calls = [(n, a) for n, a in step.reply_calls if "__" not in n]
        elif step is not None and isinstance(body, ToolCall):
            step.tools.append(_mcp_tool(record, index, at, seq, body, answers.get(seq)))
        elif step is not None and isinstance(body, FetchRequest):
            name, arguments = web_calls.pop(0) if web_calls else ("fetch", "")
            step.tools.append(
                _fetch_tool(record, index, at, seq, body, answers.get(seq), name, arguments)
            )
    return view


def _mcp_tool(
    record: StreamRecord,
    index: dict[int, int],
    at: dict[int, str],
    seq: int,
    call: ToolCall,
    answer: tuple[int, Strict] | None,
) -> ToolView:
    view = ToolView(
        "mcp",
        call.server,
        call.tool,
        pretty_bytes(call.arguments),
        "",
        "no result recorded",
        record.position(index[seq]),
        None,
        idempotent=call.idempotent,
        at=at[seq],
    )
    if answer is not None and isinstance(answer[1], ToolResult):
        result = answer[1]
        view.answer, view.outcome = record.position(index[answer[0]]), result.outcome
        view.replayed_from = result.replayed_from
        if result.result_bytes is not None:
            view.result, view.is_error = mcp_result_text(result.result_bytes)
            view.raw = pretty_bytes(result.result_bytes)
        else:
            view.result = pretty_bytes(result.error_bytes)
            view.is_error = True
    return view


def _fetch_tool(
    record: StreamRecord,
    index: dict[int, int],
    at: dict[int, str],
    seq: int,
    request: FetchRequest,
    answer: tuple[int, Strict] | None,
    name: str,
    arguments: str,
) -> ToolView:
    args = pretty_bytes(arguments.encode()) if arguments else pretty({"url": request.url})
    view = ToolView(
        "fetch",
        "web (the proxy's fetch)",
        name,
        args,
        "",
        "no response recorded",
        record.position(index[seq]),
        None,
        idempotent=True,
        url=f"{request.method} {request.url}",
        at=at[seq],
    )
    if answer is not None and isinstance(answer[1], FetchResponse):
        response = answer[1]
        view.answer, view.outcome = record.position(index[answer[0]]), response.outcome
        view.replayed_from = response.replayed_from
        data = response.response_bytes
        if data is not None:
            body = data.partition(b"\r\n\r\n")[2]
            view.result = text_of(body)
            view.raw = text_of(data)
        else:
            view.result, view.is_error = pretty_bytes(response.error_bytes), True
    return view
