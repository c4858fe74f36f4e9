"""The engine's request checks that need no model: what ``Engine.prepare`` runs on a chat
request before it renders a template (``inference.server``), shared by the three request
targets (the Responses and Messages routes translate into a chat request first)."""

from __future__ import annotations

from inference.protocol import (
    ApiError,
    json_bytes,
    parse_clock,
    parse_request,
    plain_messages,
    response_schema,
    tool_mode,
)
from inference.tool_calls import validate_tools


def chat_checks(body: bytes) -> None:
    """Parse and check a chat request body as the engine does; ``ApiError`` when refused."""
    request, _raw = parse_request(body)
    tools = None
    if request.tools:
        try:
            tools = validate_tools(request.tools)
        except ValueError as exc:
            raise ApiError(f"invalid tools: {exc}", param="tools") from None
    tool_mode(request.tool_choice, tools)
    if request.clock is not None:
        parse_clock(request.clock)
    plain_messages(request.messages)
    response_schema(request.response_format)
    request.stop_strings()
    request.requested_max_tokens()


def translated(chat: dict[str, object]) -> bytes:
    """The bytes of a translated chat request, as the route hands them to the engine."""
    return json_bytes(chat)
