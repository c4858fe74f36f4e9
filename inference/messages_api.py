"""Anthropic's Messages API (``POST /v1/messages``) on the embedded engine.

A Messages request is checked here, translated into the engine's own chat request
(:func:`chat_request`) and prepared by :meth:`~inference.server.Engine.prepare` like any chat
completion, so both APIs share one template, one tool grammar and one scheduler. What comes
back is put into Anthropic's shapes: one ``message`` object, or the SSE events
``message_start``, ``content_block_start`` / ``_delta`` (``text_delta``,
``input_json_delta``) / ``_stop``, ``message_delta`` and ``message_stop``.

Translation: ``system`` (a string or text blocks) is the first system message; ``text``
blocks are content, ``tool_use`` blocks an assistant's ``tool_calls``, ``tool_result``
blocks ``tool`` messages; ``tools[].input_schema`` is a function's ``parameters``;
``tool_choice`` ``auto``/``any``/``tool``/``none`` is ``auto``/``required``/named/``none``;
``stop_sequences`` is ``stop``; ``metadata.user_id`` is ``user`` (the prefix-cache scope).
The engine's extension members ``seed``, ``clock``, ``strict_cache`` and ``cache_salt`` pass
through as they are: the Messages API has none of them, and the proxy sends them only to an
engine. Anything else Anthropic defines that the engine cannot honour (images, documents,
thinking blocks, server tools) is refused with an error naming the field, never dropped.

**Determinism.** A pinned request's (``seed`` given) message id is ``msg_`` and 32 hex
digits of the request digest of the bytes received, and each ``tool_use`` id is
``record.digest.tool_call_id(prompt digest, seed, ordinal)`` over *this* request's prompt
(its ``model``, ``system``, ``messages``, ``tools``, ``tool_choice``): exactly the id the
proxy derives for a pinned session, so its mapping is the identity, and a pinned reply is
the same bytes on every run.

**Where the block goes.** The ``reproducibility`` block (and ``system_fingerprint``) is an
extra top-level member of the ``message`` object and, in a stream, of the ``message_delta``
event: SDKs keep unknown members aside, and the proxy reads top-level members of any JSON
object in a reply.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from inference.block import Reply, ReplyIdentity
from inference.delivery import finished, submit
from inference.protocol import SEED_MAX, SEED_MIN, ApiError, json_bytes, load_request
from inference.scheduler import Event, Finished, Job, Ticket, TokenEvent
from record.digest import Domain, digest_hex, prompt_digest

if TYPE_CHECKING:
    from inference.server import Engine

__all__ = [
    "MessagesRequest",
    "PreparedMessage",
    "chat_request",
    "error_body",
    "events",
    "handle",
    "message",
    "parse_messages_request",
    "prepare",
]

log = logging.getLogger("affidavit.engine")

#: Anthropic's ``stop_reason`` for each of the engine's finish reasons.
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn"}
#: Anthropic's error ``type`` for an HTTP status.
_ERROR_TYPES = {404: "not_found_error", 413: "request_too_large", 500: "api_error"}
#: Chat-request names in the engine's error messages, and what the Messages API calls them.
_RENAMED = (
    (".function.parameters", ".input_schema"),
    (".function.description", ".description"),
    (".function.name", ".name"),
    (".function", ""),
    ("max_completion_tokens", "max_tokens"),
)


class MessagesRequest(BaseModel):
    """A ``/v1/messages`` request; ``seed``, ``clock``, ``cache_salt`` and ``strict_cache``
    are the engine's own members (as in :class:`~inference.protocol.ChatRequest`)."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    clock: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    strict_cache: bool = False


def error_body(message: str, *, type: str = "invalid_request_error") -> dict[str, Any]:
    """Anthropic's error object."""
    return {"type": "error", "error": {"type": type, "message": message}}


def _error(exc: ApiError) -> Response:
    message = exc.message
    for old, new in _RENAMED:
        message = message.replace(old, new)
    kind = _ERROR_TYPES.get(exc.status, "invalid_request_error")
    body = json_bytes(error_body(message, type=kind))
    return Response(body, status_code=exc.status, media_type="application/json")


def parse_messages_request(body: bytes) -> tuple[MessagesRequest, dict[str, Any]]:
    """The validated request and its raw JSON object; :class:`ApiError` naming the field."""
    raw = load_request(body)
    try:
        request = MessagesRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise ApiError(f"{param}: {first['msg']}", param=param) from None
    return request, raw


def chat_request(request: MessagesRequest) -> dict[str, Any]:
    """The engine's chat request for a Messages request (module docstring)."""
    chat: dict[str, Any] = {
        "model": request.model,
        "messages": _messages(request.system, request.messages),
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
    }
    if request.tools is not None:
        chat["tools"] = [_tool(i, tool) for i, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(request.tool_choice)
    if request.stop_sequences:
        chat["stop"] = _stops(request.stop_sequences)
    user = (request.metadata or {}).get("user_id")
    if isinstance(user, str):
        chat["user"] = user
    for name in ("seed", "clock", "cache_salt"):
        value = getattr(request, name)
        if value is not None:
            chat[name] = value
    if request.strict_cache:
        chat["strict_cache"] = True
    return chat


def _messages(
    system: str | list[dict[str, Any]] | None, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if system is not None:
        text = system if isinstance(system, str) else _texts(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise ApiError(f"{where}.role must be 'user' or 'assistant'", param=f"{where}.role")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out += _assistant(content, where) if role == "assistant" else _user(content, where)
        else:
            raise ApiError(
                f"{where}.content must be a string or a list of content blocks",
                param=f"{where}.content",
            )
    return out


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise ApiError(f"{where} must be a content block with a type", param=where)
    kind: str = block["type"]
    return kind


def _unsupported(kind: str, where: str, allowed: str) -> ApiError:
    return ApiError(
        f"{where}.type: {kind!r} blocks are not supported by this engine ({allowed})",
        param=f"{where}.type",
    )


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise ApiError(f"{where}.text must be a string", param=f"{where}.text")
    return text


def _texts(blocks: list[dict[str, Any]], where: str) -> str:
    """Text blocks joined as the engine joins content parts (no separator)."""
    parts = []
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = _block_type(block, at)
        if kind != "text":
            raise _unsupported(kind, at, "text")
        parts.append(_text(block, at))
    return "".join(parts)


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn: its ``tool_result`` blocks become ``tool`` messages, text runs user ones."""
    out: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = _block_type(block, at)
        if kind == "text":
            text = _text(block, at)
            if out and out[-1]["role"] == "user":
                out[-1]["content"] += text
            else:
                out.append({"role": "user", "content": text})
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise ApiError(f"{at}.tool_use_id must be a string", param=f"{at}.tool_use_id")
            content = block.get("content", "")
            if isinstance(content, list):
                content = _texts(content, f"{at}.content")
            elif not isinstance(content, str):
                raise ApiError(
                    f"{at}.content must be a string or text blocks", param=f"{at}.content"
                )
            out.append({"role": "tool", "tool_call_id": call_id, "content": content})
        else:
            raise _unsupported(kind, at, "a user turn takes text and tool_result")
    return out


def _assistant(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """An assistant turn: text and its ``tool_use`` blocks as ``tool_calls``."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = _block_type(block, at)
        if kind == "text":
            text.append(_text(block, at))
        elif kind == "tool_use":
            call_id, name, given = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise ApiError(f"{at} needs a string id and name", param=at)
            if not isinstance(given, dict):
                raise ApiError(f"{at}.input must be an object", param=f"{at}.input")
            arguments = json.dumps(given, ensure_ascii=False)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        else:
            raise _unsupported(kind, at, "an assistant turn takes text and tool_use")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return [message]


_TOOL_KEYS = frozenset({"name", "description", "input_schema", "cache_control", "type"})


def _tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    where = f"tools[{i}]"
    kind = tool.get("type", "custom")
    if kind != "custom":
        raise ApiError(
            f"{where}.type: {kind!r} is a server tool, which this engine does not run; "
            "declare client tools with name and input_schema",
            param=f"{where}.type",
        )
    extra = sorted(set(tool) - _TOOL_KEYS)
    if extra:
        raise ApiError(f"{where} has unsupported members {extra}", param=where)
    if "input_schema" not in tool:
        raise ApiError(f"{where}.input_schema is missing", param=f"{where}.input_schema")
    function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
    if "description" in tool:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any]) -> Any:
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise ApiError("tool_choice.name must name a tool", param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    raise ApiError(
        f"tool_choice.type {kind!r}: one of 'auto', 'any', 'tool' or 'none'",
        param="tool_choice.type",
    )


def _stops(stops: list[str]) -> list[str]:
    if len(stops) > 4 or any(not s for s in stops):
        raise ApiError(
            "stop_sequences: this engine takes up to 4 non-empty strings", param="stop_sequences"
        )
    return stops


@dataclass
class PreparedMessage:
    """A scheduler job and everything its Anthropic-shaped reply needs."""

    job: Job
    reply: Reply
    stream: bool
    stops: tuple[str, ...]
    decode: Callable[[tuple[int, ...]], str]


def prepare(engine: Engine, body: bytes, headers: Mapping[str, str]) -> PreparedMessage:
    """Validate and translate a Messages request and prepare it on ``engine``.

    The reply's identity and prompt digest are this request's own (module docstring), not
    those of the chat request it became.
    """
    request, raw = parse_messages_request(body)
    if request.model_extra:
        log.debug("ignoring Messages fields this engine does not implement: %s",
                  sorted(request.model_extra))  # fmt: skip
    chat = chat_request(request)
    job, reply = engine.prepare(json_bytes(chat), headers)
    digest = prompt_digest(raw)
    pinned = request.seed is not None
    h = digest_hex(Domain.REQUEST, body)[:32] if pinned else uuid.uuid4().hex
    identity = ReplyIdentity(f"msg_{h}", f"req_{h}", reply.identity.created)
    block = dict(reply.block, request_id=identity.request_id, prompt_digest=digest)
    reply = replace(reply, identity=identity, prompt_digest=digest, block=block)
    return PreparedMessage(
        job=job,
        reply=reply,
        stream=request.stream,
        stops=tuple(chat.get("stop", ())),
        decode=lambda ids: engine.tokenizer.decode(ids, skip_special_tokens=True),
    )


def _stop(prepared: PreparedMessage, done: Finished, reason: str) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)``: which stop sequence, if one cut the text."""
    if reason == "stop" and prepared.stops:
        full = prepared.decode(done.token_ids)
        for s in prepared.stops:
            if full.startswith(s, len(done.text)):
                return "stop_sequence", s
    return _STOP_REASONS[reason], None


def _blocks(content: str | None, calls: list[Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if content:
        blocks.append({"type": "text", "text": content})
    for call in calls:
        try:
            given = json.loads(call.function.arguments)
        except ValueError:
            given = {}
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.function.name, "input": given}
        )
    return blocks


def message(prepared: PreparedMessage, done: Finished) -> dict[str, Any]:
    """The non-streaming ``message`` object."""
    reply = prepared.reply
    content, calls, reason = reply.outcome(done)
    stop_reason, stop_sequence = _stop(prepared, done, reason)
    return {
        "id": reply.identity.id,
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": _blocks(content, calls),
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": done.prompt_tokens,
            "output_tokens": len(done.token_ids),
            "cache_read_input_tokens": done.cached_tokens,
        },
        "system_fingerprint": reply.fingerprint,
        "reproducibility": reply.final_block(done),
    }


def _sse(data: dict[str, Any]) -> bytes:
    """One named SSE event: ``event: <type>`` and its data, as Anthropic frames them."""
    kind: str = data["type"]
    return b"event: " + kind.encode() + b"\ndata: " + json_bytes(data) + b"\n\n"


def _failure(done: Finished) -> dict[str, Any]:
    return error_body(done.error or "generation failed", type="api_error")


async def events(
    prepared: PreparedMessage, queue: asyncio.Queue[Event], ticket: Ticket
) -> AsyncIterator[bytes]:
    """The SSE events of a reply, ``message_stop`` last; frees the slot however it ends."""
    try:
        async for chunk in _events(prepared, queue):
            yield chunk
    finally:
        ticket.cancel()


async def _events(prepared: PreparedMessage, queue: asyncio.Queue[Event]) -> AsyncIterator[bytes]:
    reply = prepared.reply
    start: dict[str, Any] = {
        "id": reply.identity.id,
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": len(prepared.job.prompt_ids), "output_tokens": 0},
    }
    yield _sse({"type": "message_start", "message": start})
    text = _TextBlock()
    while True:
        event = await queue.get()
        if isinstance(event, TokenEvent):
            for chunk in text.add(event.text):
                yield chunk
            continue
        break
    if event.reason in ("error", "cancelled"):
        yield _sse(_failure(event))
        return
    for chunk in text.add(event.tail):
        yield chunk
    content, calls, reason = reply.outcome(event)
    if content and content.startswith(text.sent):
        for chunk in text.add(content[len(text.sent) :]):
            yield chunk
    index = 0
    if text.open:
        yield _sse({"type": "content_block_stop", "index": 0})
        index = 1
    for call in calls:
        tool_use = {"type": "tool_use", "id": call.id, "name": call.function.name, "input": {}}
        yield _sse({"type": "content_block_start", "index": index, "content_block": tool_use})
        delta = {"type": "input_json_delta", "partial_json": call.function.arguments}
        yield _sse({"type": "content_block_delta", "index": index, "delta": delta})
        yield _sse({"type": "content_block_stop", "index": index})
        index += 1
    stop_reason, stop_sequence = _stop(prepared, event, reason)
    yield _sse(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"output_tokens": len(event.token_ids)},
            "system_fingerprint": reply.fingerprint,
            "reproducibility": reply.final_block(event),
        }
    )
    yield _sse({"type": "message_stop"})


class _TextBlock:
    """The stream's text block (index 0), opened at its first character."""

    def __init__(self) -> None:
        self.open = False
        self.sent = ""

    def add(self, text: str) -> list[bytes]:
        if not text:
            return []
        out = []
        if not self.open:
            self.open = True
            block = {"type": "text", "text": ""}
            out.append(_sse({"type": "content_block_start", "index": 0, "content_block": block}))
        self.sent += text
        delta = {"type": "text_delta", "text": text}
        out.append(_sse({"type": "content_block_delta", "index": 0, "delta": delta}))
        return out


async def handle(engine: Engine, request: Request) -> Response:
    """``POST /v1/messages``: a ``message`` object, or its SSE events."""
    body = await request.body()
    try:  # off the event loop: rendering, tokenizing and grammar set-up take a while
        prepared = await run_in_threadpool(prepare, engine, body, request.headers)
    except ApiError as exc:
        return _error(exc)
    queue, ticket = submit(engine.scheduler, prepared.job)
    if prepared.stream:
        return StreamingResponse(events(prepared, queue, ticket), media_type="text/event-stream")
    try:
        done = await finished(queue, request.is_disconnected)
    finally:
        ticket.cancel()
    if done is None:
        return Response(b"", status_code=499)
    if done.reason in ("error", "cancelled"):
        failure = json_bytes(_failure(done))
        return Response(failure, status_code=500, media_type="application/json")
    return Response(json_bytes(message(prepared, done)), media_type="application/json")
