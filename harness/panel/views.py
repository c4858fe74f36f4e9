"""What the pages show, read from a stream's record: sessions, turns, steps, tool calls.

Nothing here writes, and nothing is rendered: the templates escape every value (the record
holds model output and web pages, which are data, never markup).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from egress_proxy.sse import iter_events
from harness.panel.fields import no_tee
from harness.panel.source import (
    Health,
    Opened,
    Position,
    Source,
    StreamRecord,
    open_stream,
)
from record.audit import Problem
from record.limits import JsonRefused, load_json
from record.schema import (
    FetchRequest,
    FetchResponse,
    LeaseTaken,
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
    "TurnProblem",
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
#: Audit codes that name one entry (its ``seq``); the others name a checkpoint or the stream.
ENTRY_CODES = frozenset(
    {"malformed_entry", "stream_mismatch", "leaf_mismatch", "seq_order", "seq_duplicate"}
)
#: Problems that say an entry is not yet signed, not that anything was changed.
NOT_TAMPERING = frozenset({"unsigned_tail"})
SHOWN = 20_000  # characters of one body shown on a page (the rest is in the bundle)
FIRST_INPUT = 160  # characters of a session's first input in the sessions list


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
    for item in _list(result.get("content")):
        if isinstance(item, dict) and item.get("type") == "text":
            parts.append(str(item.get("text", "")))
        elif isinstance(item, dict):
            parts.append(f"[{item.get('type', 'content')}]")
    text = "\n".join(parts).encode("utf-8", "backslashreplace")  # a lone surrogate: its escape
    return text_of(text), bool(result.get("isError"))


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
    first_input: str | None = None  # what the session was first asked (None: no turn)
    replayed_by: list[SessionRow] = field(default_factory=list)  # its replay streams
    continues: str | None = None  # the other appliance's stream this one carries on
    continues_size: int | None = None  # how many of that stream's entries it took over

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
    link = first.continues if first else None
    turns = (
        sum(isinstance(b, TurnStarted) for _, b in opened.bodies) if opened is not None else None
    )
    first_input = next(
        (
            text_of(b.input_bytes, FIRST_INPUT)
            for _, b in (shown_bodies(opened) if opened else [])
            if isinstance(b, TurnStarted)
        ),
        None,
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
        first_input,
        continues=link.stream if link else None,
        continues_size=link.size if link else None,
    )


def session_rows(source: Source) -> list[SessionRow]:
    """The sessions, latest activity first, each replay stream listed under the session it
    replays (``affidavit/replays``) rather than beside it; a replay whose session the source
    does not hold stays a row of its own."""
    rows = [session_row(source, stream) for stream in source.streams()]
    rows.sort(key=lambda r: r.last_activity or "", reverse=True)
    by_stream = {r.stream: r for r in rows}
    top = []
    for row in rows:
        replayed = by_stream.get(row.replays) if row.replays else None
        if replayed is not None and replayed is not row:
            replayed.replayed_by.append(row)
        else:
            top.append(row)
    return top


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
    call_id: str | None = None

    @property
    def failed(self) -> bool:
        return self.outcome == "FAILED" or self.is_error

    @property
    def reason(self) -> str:
        """Why the call failed, as recorded (empty: it did not)."""
        if not self.failed:
            return ""
        return self.result.strip() or "the record holds no reason for it"


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
    problems: list[TurnProblem] = field(default_factory=list)  # what the audit found here
    no_tee: list[str] = field(default_factory=list)  # why its reply is not shown to be a TEE's

    @property
    def seqs(self) -> list[int]:
        """The entries this step shows, from its request to its last tool's answer."""
        found = [self.request_at.seq] + ([self.response_at.seq] if self.response_at else [])
        for tool in self.tools:
            if tool.kind != "unsent":
                found += [tool.call.seq] + ([tool.answer.seq] if tool.answer else [])
        return found

    def positions(self) -> list[Position]:
        found = [self.request_at] + ([self.response_at] if self.response_at else [])
        for tool in self.tools:
            if tool.kind != "unsent":
                found += [tool.call] + ([tool.answer] if tool.answer else [])
        return found


@dataclass(frozen=True)
class TurnProblem:
    """One thing the audit, the keys or a proof says is wrong with the turn's record."""

    code: str
    seq: int | None
    detail: str
    step: int | None = None  # the step it falls in (None: the turn or the stream as a whole)


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
    #: (when, entry) of each writer that took the stream over mid-turn from one that crashed
    takeovers: list[tuple[str, LeaseTaken]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    problems: list[TurnProblem] = field(default_factory=list)  # every one, the turn's first

    @property
    def strict(self) -> bool:
        return bool(self.pins and self.pins.get("strict_cache") is True)

    @property
    def untrusted(self) -> bool:
        """Whether the record of this turn has a problem worse than an unsigned tail."""
        return any(p.code not in NOT_TAMPERING for p in self.problems)

    @property
    def no_tee(self) -> list[str]:
        """Why the turn's replies are not shown to come from a TEE (empty: they are)."""
        return list(dict.fromkeys(why for step in self.steps for why in step.no_tee))


class NoTurn(LookupError):
    """The stream has no such turn (404)."""


def turn_view(
    record: StreamRecord, opened: Opened, turn: int, problems: list[Problem] | None = None
) -> TurnView:
    """Turn ``turn`` of the stream, step by step, every entry with its position and proof;
    with the stream's audit ``problems``, what is wrong with it, each on its step."""
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
        elif isinstance(body, LeaseTaken):
            view.takeovers.append((at[seq], body))
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
                step.no_tee = no_tee(block)
            web_calls = [(n, a) for n, a in step.reply_calls if "__" not in n]
        elif step is not None and isinstance(body, ToolCall):
            step.tools.append(_mcp_tool(record, index, at, seq, body, answers.get(seq)))
        elif step is not None and isinstance(body, FetchRequest):
            name, arguments = web_calls.pop(0) if web_calls else ("fetch", "")
            step.tools.append(
                _fetch_tool(record, index, at, seq, body, answers.get(seq), name, arguments)
            )
    for i, step in enumerate(view.steps):
        following = view.steps[i + 1].request.request_bytes if i + 1 < len(view.steps) else None
        step.tools += _unsent_tools(step, following)
    if problems is not None:
        view.problems = turn_problems(view, opened, problems)
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
        call_id=call.call_id,
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
    shown = arguments.encode("utf-8", "backslashreplace")  # a lone surrogate: its escape
    args = pretty_bytes(shown) if arguments else pretty({"url": request.url})
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
        call_id=request.call_id,
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


# -- tool calls that never reached the proxy ------------------------------------------------------


def _sent_results(request_bytes: bytes | None) -> list[tuple[str, str, str, str]]:
    """The tool results a model request sends back for the previous reply's calls:
    ``(call id, tool, arguments, text)``, from OpenAI's ``tool`` messages or Anthropic's
    ``tool_result`` blocks."""
    try:
        sent = load_json(request_bytes or b"")
    except JsonRefused:
        return []
    messages = _list(_dict(sent).get("messages"))
    asked: dict[str, tuple[str, str]] = {}
    results: list[tuple[str, str]] = []
    for message in messages:
        message = _dict(message)
        if message.get("role") == "assistant":
            asked, results = {}, []  # only the last reply's calls are answered here
            for call in _list(message.get("tool_calls")):
                function = _dict(_dict(call).get("function"))
                asked[str(_dict(call).get("id", ""))] = (
                    str(function.get("name", "")),
                    str(function.get("arguments", "")),
                )
            for block in _list(message.get("content")):
                block = _dict(block)
                if block.get("type") == "tool_use":
                    arguments = json.dumps(block.get("input", {}), sort_keys=True)
                    asked[str(block.get("id", ""))] = (str(block.get("name", "")), arguments)
        elif message.get("role") == "tool":
            results.append((str(message.get("tool_call_id", "")), _text(message.get("content"))))
        elif message.get("role") == "user":
            for block in _list(message.get("content")):
                block = _dict(block)
                if block.get("type") == "tool_result":
                    results.append((str(block.get("tool_use_id", "")), _text(block.get("content"))))
    return [(cid, *asked.get(cid, ("", "")), text) for cid, text in results]


def _text(content: Any) -> str:
    """A tool message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    return "".join(str(_dict(part).get("text", "")) for part in _list(content))


def _unsent_tools(step: StepView, following: bytes | None) -> list[ToolView]:
    """The calls the step's reply asked for that left no tool or fetch entry: each failed
    before it reached the proxy (unknown tool, arguments refused). Their reason is the text
    the harness sent back to the model, which the next model request records."""
    if step.response_at is None or not step.reply_calls:
        return []
    recorded = {tool.call_id for tool in step.tools if tool.call_id}
    anonymous = sum(1 for tool in step.tools if not tool.call_id)  # refused fetches
    if following is not None:
        missing = [r for r in _sent_results(following) if r[0] not in recorded][anonymous:]
    else:
        left = max(0, len(step.reply_calls) - len(step.tools))
        missing = [
            ("", name, args, "the record holds no result: the turn ended before it was answered")
            for name, args in step.reply_calls[len(step.reply_calls) - left :]
        ]
    views = []
    for call_id, name, arguments, text in missing:
        server, _, tool = name.rpartition("__")
        views.append(
            ToolView(
                "unsent",
                server or "web (the proxy's fetch)",
                tool or name,
                pretty_bytes(arguments.encode("utf-8", "backslashreplace")) if arguments else "",
                text_of(text.encode("utf-8", "backslashreplace")) or "the record holds no reason",
                "FAILED",
                step.response_at,
                None,
                is_error=True,
                call_id=call_id or None,
            )
        )
    return views


# -- what is wrong with a turn's record -----------------------------------------------------


def turn_problems(view: TurnView, opened: Opened, problems: list[Problem]) -> list[TurnProblem]:
    """Every problem of the stream, those inside the turn first, each on the step it falls
    in: audit problems that name an entry, bodies that do not open (they are never dropped
    silently), and entries whose inclusion proof fails against the signed checkpoint."""
    last = view.ended_at.seq if view.ended_at else None
    later = [seq for seq, body in opened.bodies if isinstance(body, TurnStarted)]
    end = (
        last if last is not None else min((s for s in later if s > view.started.seq), default=None)
    )

    def inside(seq: int | None) -> bool:
        return seq is not None and seq >= view.started.seq and (end is None or seq <= end)

    def step_of(seq: int) -> StepView | None:
        before = [s for s in view.steps if s.request_at.seq <= seq]
        return before[-1] if before else None

    found: list[tuple[int | None, str, str]] = []
    for p in problems:
        found.append((p.seq if p.code in ENTRY_CODES else None, p.code, p.detail))
    for seq, why in sorted(opened.errors.items()):
        found.append((seq, "cannot_open", f"its body does not open: {why}"))
    shown = [view.started] + [p for s in view.steps for p in s.positions()]
    shown += [view.ended_at] if view.ended_at else []
    failing = [
        pos
        for pos in shown
        if not pos.verified and pos.checkpoint_size is not None and pos.index < pos.checkpoint_size
    ]
    if any(seq is not None for seq, _, _ in found):
        # one changed entry fails every proof against the signed root: the entries named
        # above are the changed ones, so the failing proofs are said once, not on every step
        if failing:
            seqs = ", ".join(str(pos.seq) for pos in failing)
            found.append(
                (
                    None,
                    "proof_fails",
                    f"the inclusion proofs of {len(failing)} entries shown here (seq {seqs}) "
                    "do not verify against the signed checkpoint: the stored tree is not the "
                    "one that was signed",
                )
            )
    else:
        why = "its inclusion proof fails against the signed checkpoint (open its position)"
        found += [(pos.seq, "proof_fails", why) for pos in failing]
    ours, theirs = [], []
    for where, code, detail in found:
        if where is not None and inside(where):
            step = step_of(where)
            item = TurnProblem(code, where, detail, step.step if step else None)
            if step is not None and item not in step.problems:
                step.problems.append(item)
            ours.append(item)
        else:
            theirs.append(TurnProblem(code, where, detail))
    return list(dict.fromkeys(ours + theirs))
