"""Anthropic Messages replies as the proxy reads them (``fuzz._reply``): JSON or SSE, whole.

No typed error: every reading of a reply returns, whatever the upstream sent.
"""

from __future__ import annotations

from fuzz._reply import reply_checks
from fuzz.common import dumps, nested, vector_bytes

ERRORS: tuple[type[BaseException], ...] = ()
JSON_PREFIX = 1  # the input's JSON starts here: the JSON-aware mutations apply
ROUTE = "/v1/messages"


def seeds() -> list[bytes]:
    deep = dumps({"reproducibility": {"seed": 1, "deep": nested(220)}})
    built = [
        b"\x00"
        + b'{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"x"},{"type":"tool_use","id":"toolu_1","name":"add","input":{"a":1}}],"stop_reason":"tool_use","reproducibility":{"seed":3}}',
        b"\x01"
        + b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"add","input":{}}}\n\nevent: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\\"a\\":1}"}}\n\nevent: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"tool_use"},"reproducibility":{"seed":3}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n',
        b"\x00" + deep,
    ]
    vectors = vector_bytes("provider-streams/anthropic", ".sse", ".txt")
    return built + [b"\x01" + v for v in vectors] + [b"\x00" + v for v in vectors]


def target(data: bytes) -> None:
    reply_checks(ROUTE, data)
