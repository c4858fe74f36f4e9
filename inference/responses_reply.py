"""The engine's ``POST /v1/responses``: a chat job underneath, a Responses reply on top.

:mod:`inference.responses_api` translates the request; the engine prepares and runs it as a
chat request; this module gives the finished sequence the Responses API's shapes: one
``response`` object, or the stream of ``response.*`` events (``sequence_number`` from 0),
whose framing, like the chat stream's, depends on the tokens alone.

**Identity.** Everything a pinned reply names is derived from the Responses request bytes
and the clock they carry, never drawn at random: ``resp_<h>`` with ``h`` the first 32 hex
digits of the request's content key (domain 0x00), the block's ``request_id`` ``req_<h>``,
``created_at`` the request's ``clock`` (0 without one), the message item ``msg_<h>``, and
each function call's ``call_id`` ``record.digest.tool_call_id(prompt digest, seed,
ordinal)`` with item id ``fc_`` and the same 24 digits. The prompt digest is the Responses
request's own (``record.digest.prompt_bytes`` covers ``instructions``, ``input`` …), so the
engine's block and the proxy's record name one prompt.

**The block** travels where the proxy reads it and SDKs pass over it: a top-level
``reproducibility`` member (beside ``system_fingerprint``) of the ``response`` object, and of
the stream's last event (``response.completed``, ``response.incomplete`` when
``max_output_tokens`` cut the reply, ``response.failed`` on an engine error).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from inference.block import Reply, ReplyIdentity, reply_identity
from inference.delivery import finished, submit
from inference.protocol import ApiError, json_bytes, parse_clock
from inference.responses_api import ResponsesRequest, chat_request, parse_responses_request
from inference.scheduler import Event, Finished, Ticket, TokenEvent
from record.digest import prompt_digest

if TYPE_CHECKING:
    from inference.server import Engine

__all__ = ["ResponsesReply", "prepare_responses", "serve_responses"]


@dataclass
class ResponsesReply:
    """A prepared chat :class:`Reply` and what the Responses shapes add to it."""

    reply: Reply
    request: ResponsesRequest
    h: str  # the hex shared by the response, block and message ids
    sequence: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"resp_{self.h}"

    def base(self, status: str) -> dict[str, Any]:
        """The ``response`` object without output and usage, members in a fixed order."""
        request = self.request
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.reply.identity.created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "model": self.reply.model,
            "output": [],
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "temperature": self.reply.block["temperature"],
            "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
            "tools": request.tools or [],
            "top_p": self.reply.block["top_p"],
            "text": request.text if request.text is not None else {"format": {"type": "text"}},
            "store": False,
            "usage": None,
        }

    def final(self, done: Finished, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The finished ``response`` object, with the block and fingerprint beside it."""
        _, _, reason = self.reply.outcome(done)
        status = "incomplete" if reason == "length" else "completed"
        response = self.base(status)
        if reason == "length":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        response["output"] = output
        usage = self.reply.usage(done)
        response["usage"] = {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.prompt_tokens_details.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total_tokens,
        }
        return response

    def facts(self, done: Finished) -> dict[str, Any]:
        """The members the proxy reads and SDKs ignore."""
        return {
            "system_fingerprint": self.reply.fingerprint,
            "reproducibility": self.reply.final_block(done),
        }

    def output_items(self, done: Finished) -> list[dict[str, Any]]:
        """The output of a non-streamed reply: the message (if any text), then the calls."""
        content, tool_calls, _ = self.reply.outcome(done)
        items = []
        if content:
            items.append(self.message(content, "completed"))
        items += [
            self.function_call(c.id, c.function.name, c.function.arguments) for c in tool_calls
        ]
        return items

    def message(self, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [_text_part(text)]
        return {
            "id": f"msg_{self.h}",
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def function_call(
        self, call_id: str, name: str, arguments: str, status: str = "completed"
    ) -> dict[str, Any]:
        return {
            "id": "fc_" + call_id.removeprefix("call_"),
            "type": "function_call",
            "status": status,
            "arguments": arguments,
            "call_id": call_id,
            "name": name,
        }

    def event(self, kind: str, body: dict[str, Any]) -> bytes:
        """One SSE event, named as its ``type``, numbered in order."""
        data = {"type": kind, "sequence_number": self.sequence, **body}
        self.sequence += 1
        return b"event: " + kind.encode("ascii") + b"\ndata: " + json_bytes(data) + b"\n\n"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def prepare_responses(engine: Engine, body: bytes, headers: Any) -> tuple[Any, ResponsesReply]:
    """Validate and translate the request; the engine's job and the reply's frame."""
    request, raw = parse_responses_request(body)
    job, reply = engine.prepare(json_bytes(chat_request(request)), headers)
    clock = parse_clock(request.clock) if request.clock is not None else None
    identity = reply_identity(body, pinned=request.seed is not None, clock=clock)
    h = identity.request_id.removeprefix("req_")
    digest = prompt_digest(raw)
    reply.identity = ReplyIdentity(f"resp_{h}", identity.request_id, identity.created)
    reply.prompt_digest = digest
    reply.block = {**reply.block, "request_id": identity.request_id, "prompt_digest": digest}
    return job, ResponsesReply(reply, request, h)


async def serve_responses(engine: Engine, request: Request) -> Response:
    """The route's body: prepare off the event loop, run, answer as JSON or SSE."""
    body = await request.body()
    try:
        job, shaped = await run_in_threadpool(prepare_responses, engine, body, request.headers)
    except ApiError as exc:
        return Response(json_bytes(exc.body()), exc.status, media_type="application/json")
    events, ticket = submit(engine.scheduler, job)
    if shaped.request.stream:
        return StreamingResponse(_stream(shaped, events, ticket), media_type="text/event-stream")
    try:
        done = await finished(events, request.is_disconnected)
    finally:
        ticket.cancel()
    if done is None:
        return Response(b"", 499)
    if done.reason in ("error", "cancelled"):
        failure = _failure(done)
        return Response(json_bytes(failure.body()), failure.status, media_type="application/json")
    response = {**shaped.final(done, shaped.output_items(done)), **shaped.facts(done)}
    return Response(json_bytes(response), 200, media_type="application/json")


def _failure(done: Finished) -> ApiError:
    return ApiError(
        done.error or "generation failed", status=500, code="engine_error", type="server_error"
    )


async def _stream(
    shaped: ResponsesReply, events: asyncio.Queue[Event], ticket: Ticket
) -> AsyncIterator[bytes]:
    try:
        async for chunk in _events(shaped, events):
            yield chunk
    finally:
        ticket.cancel()


async def _events(shaped: ResponsesReply, events: asyncio.Queue[Event]) -> AsyncIterator[bytes]:
    """``response.created``, ``response.in_progress``, the text as it is sampled, the
    function calls once the reply is finished, then the terminal event with the block."""
    yield shaped.event("response.created", {"response": shaped.base("in_progress")})
    yield shaped.event("response.in_progress", {"response": shaped.base("in_progress")})
    text = _Text(shaped)
    while True:
        event = await events.get()
        if isinstance(event, TokenEvent):
            if event.text and shaped.reply.grammar is None:
                yield text.delta(event.text)
            continue
        break
    if event.reason in ("error", "cancelled"):
        failed = shaped.base("failed")
        failed["error"] = {"code": "server_error", "message": event.error or "generation failed"}
        yield shaped.event("response.failed", {"response": failed})
        return
    if event.tail and shaped.reply.grammar is None:
        yield text.delta(event.tail)
    content, tool_calls, _ = shaped.reply.outcome(event)
    if content and content.startswith(text.sent) and len(content) > len(text.sent):
        yield text.delta(content[len(text.sent) :])
    output: list[dict[str, Any]] = []
    if text.opened:
        yield text.close()
        output.append(shaped.message(text.sent, "completed"))
    for call in tool_calls:
        index = len(output)
        item = shaped.function_call(call.id, call.function.name, call.function.arguments)
        added = {**item, "status": "in_progress", "arguments": ""}
        at = {"item_id": item["id"], "output_index": index}
        yield shaped.event("response.output_item.added", {"output_index": index, "item": added})
        yield shaped.event(
            "response.function_call_arguments.delta", {**at, "delta": item["arguments"]}
        )
        yield shaped.event(
            "response.function_call_arguments.done",
            {**at, "name": item["name"], "arguments": item["arguments"]},
        )
        yield shaped.event("response.output_item.done", {"output_index": index, "item": item})
        output.append(item)
    response = shaped.final(event, output)
    kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield shaped.event(kind, {"response": response, **shaped.facts(event)})


@dataclass
class _Text:
    """The message item of a stream: opened at its first text, closed once."""

    shaped: ResponsesReply
    sent: str = ""
    opened: bool = False

    def delta(self, piece: str) -> bytes:
        shaped = self.shaped
        out = b""
        at = {"item_id": f"msg_{shaped.h}", "output_index": 0, "content_index": 0}
        if not self.opened:
            self.opened = True
            item = shaped.message(None, "in_progress")
            out += shaped.event("response.output_item.added", {"output_index": 0, "item": item})
            out += shaped.event("response.content_part.added", {**at, "part": _text_part("")})
        self.sent += piece
        return out + shaped.event(
            "response.output_text.delta", {**at, "delta": piece, "logprobs": []}
        )

    def close(self) -> bytes:
        shaped = self.shaped
        at = {"item_id": f"msg_{shaped.h}", "output_index": 0, "content_index": 0}
        return (
            shaped.event("response.output_text.done", {**at, "text": self.sent, "logprobs": []})
            + shaped.event("response.content_part.done", {**at, "part": _text_part(self.sent)})
            + shaped.event(
                "response.output_item.done",
                {"output_index": 0, "item": shaped.message(self.sent, "completed")},
            )
        )
