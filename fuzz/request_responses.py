"""OpenAI Responses requests: the proxy's strict reading, and the engine's
``parse_responses_request`` with its translation into a chat request, checked as one.

Typed errors: the proxy's ``MalformedBody`` and the engine's ``ApiError``.
"""

from __future__ import annotations

import contextlib

from egress_proxy.errors import MalformedBody
from fuzz._engine import chat_checks, translated
from fuzz._proxy import proxy_checks
from fuzz.common import dumps, nested
from inference.protocol import ApiError
from inference.responses_api import chat_request, parse_responses_request

ERRORS: tuple[type[BaseException], ...] = (MalformedBody, ApiError)
JSON_PREFIX = 0  # the input's JSON starts here: the JSON-aware mutations apply


def seeds() -> list[bytes]:
    tool = {"type": "function", "name": "add", "parameters": {"type": "object"}}
    return [
        dumps({"model": "m", "input": "hi"}),
        dumps(
            {
                "model": "m",
                "instructions": "be brief",
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "x"}],
                    },
                    {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "3"},
                ],
                "tools": [tool],
                "tool_choice": {"type": "function", "name": "add"},
                "max_output_tokens": 9,
                "seed": 1,
                "top_k": 2,
                "text": {
                    "format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}
                },
            }
        ),
        dumps({"model": "m", "input": "x", "store": False, "previous_response_id": None}),
        dumps({"model": "m", "input": [{"role": "user", "content": "x", "d": nested(130)}]}),
    ]


def target(data: bytes) -> None:
    with contextlib.suppress(MalformedBody):
        proxy_checks(data)
    try:
        request, _raw = parse_responses_request(data)
        chat_checks(translated(chat_request(request)))
    except ApiError:
        pass
