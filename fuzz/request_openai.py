"""OpenAI Chat Completions requests: the proxy's strict reading and the engine's checks.

Typed errors: the proxy's ``MalformedBody`` and the engine's ``ApiError``.
"""

from __future__ import annotations

import contextlib

from egress_proxy.errors import MalformedBody
from fuzz._engine import chat_checks
from fuzz._proxy import proxy_checks
from fuzz.common import dumps, nested
from inference.protocol import ApiError

ERRORS: tuple[type[BaseException], ...] = (MalformedBody, ApiError)
JSON_PREFIX = 0  # the input's JSON starts here: the JSON-aware mutations apply

_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "adds",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}


def seeds() -> list[bytes]:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    return [
        dumps({"model": "m", "messages": messages}),
        dumps(
            {
                "model": "m",
                "messages": messages,
                "seed": 7,
                "temperature": 0,
                "top_k": 1,
                "max_tokens": 5,
                "stop": ["\n"],
                "logprobs": True,
                "top_logprobs": 2,
                "clock": "2026-01-01T00:00:00Z",
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ),
        dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
                "tools": [_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "add"}},
            }
        ),
        dumps(
            {
                "model": "m",
                "messages": messages,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": {"type": "object"}},
                },
            }
        ),
        dumps({"model": "m", "messages": [{"role": "user", "content": "x", "n": nested(140)}]}),
    ]


def target(data: bytes) -> None:
    with contextlib.suppress(MalformedBody):
        proxy_checks(data)
    with contextlib.suppress(ApiError):
        chat_checks(data)
