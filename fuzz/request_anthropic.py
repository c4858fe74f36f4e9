"""Anthropic Messages requests: the proxy's strict reading, and the engine's
``parse_messages_request`` with its translation into a chat request, checked as one.

Typed errors: the proxy's ``MalformedBody`` and the engine's ``ApiError``.
"""

from __future__ import annotations

import contextlib

from egress_proxy.errors import MalformedBody
from fuzz._engine import chat_checks, translated
from fuzz._proxy import proxy_checks
from fuzz.common import dumps, nested
from inference.messages_api import chat_request, parse_messages_request
from inference.protocol import ApiError

ERRORS: tuple[type[BaseException], ...] = (MalformedBody, ApiError)
JSON_PREFIX = 0  # the input's JSON starts here: the JSON-aware mutations apply


def seeds() -> list[bytes]:
    tool = {"name": "add", "description": "adds", "input_schema": {"type": "object"}}
    return [
        dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
        dumps(
            {
                "model": "m",
                "max_tokens": 5,
                "system": [{"type": "text", "text": "brief"}],
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "x"}]},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}}
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t1",
                                "content": [{"type": "text", "text": "2"}],
                            }
                        ],
                    },
                ],
                "tools": [tool],
                "tool_choice": {"type": "tool", "name": "add"},
                "stop_sequences": ["\n"],
                "metadata": {"user_id": "u"},
                "seed": 3,
                "clock": "2026-01-01T00:00:00Z",
            }
        ),
        dumps(
            {
                "model": "m",
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "x", "d": nested(130)}],
            }
        ),
    ]


def target(data: bytes) -> None:
    with contextlib.suppress(MalformedBody):
        proxy_checks(data)
    try:
        request, _raw = parse_messages_request(data)
        chat_checks(translated(chat_request(request)))
    except ApiError:
        pass
