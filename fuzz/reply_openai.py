"""OpenAI Chat Completions replies as the proxy reads them (``fuzz._reply``): JSON or SSE, whole.

No typed error: every reading of a reply returns, whatever the upstream sent.
"""

from __future__ import annotations

from fuzz._reply import reply_checks
from fuzz.common import dumps, nested, vector_bytes

ERRORS: tuple[type[BaseException], ...] = ()
JSON_PREFIX = 1  # the input's JSON starts here: the JSON-aware mutations apply
ROUTE = "/v1/chat/completions"


def seeds() -> list[bytes]:
    deep = dumps({"reproducibility": {"seed": 1, "deep": nested(220)}})
    built = [
        b"\x00"
        + b'{"id":"c","object":"chat.completion","created":1,"model":"m","system_fingerprint":"fp","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"add","arguments":"{\\"a\\":1}"}}]},"finish_reason":"tool_calls"}],"reproducibility":{"seed":1,"deep":[[[0]]]}}',
        b"\x01"
        + b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"add","arguments":"{\\"a\\""}}]}}]}\n\ndata: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}],"system_fingerprint":"fp"}\n\ndata: {"choices":[],"reproducibility":{"seed":1}}\n\ndata: [DONE]\n\n',
        b"\x00" + deep,
    ]
    vectors = vector_bytes("provider-streams/openai", ".bin")
    return built + [b"\x01" + v for v in vectors] + [b"\x00" + v for v in vectors]


def target(data: bytes) -> None:
    reply_checks(ROUTE, data)
