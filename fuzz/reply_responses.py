"""OpenAI Responses replies as the proxy reads them (``fuzz._reply``): JSON or SSE, whole.

No typed error: every reading of a reply returns, whatever the upstream sent.
"""

from __future__ import annotations

from fuzz._reply import reply_checks
from fuzz.common import dumps, nested, vector_bytes

ERRORS: tuple[type[BaseException], ...] = ()
JSON_PREFIX = 1  # the input's JSON starts here: the JSON-aware mutations apply
ROUTE = "/v1/responses"


def seeds() -> list[bytes]:
    deep = dumps({"reproducibility": {"seed": 1, "deep": nested(220)}})
    built = [
        b"\x00"
        + b'{"id":"resp_1","object":"response","output":[{"type":"function_call","id":"fc_1","call_id":"call_1","name":"add","arguments":"{}"}],"reproducibility":{"seed":2}}',
        b"\x01"
        + b'event: response.output_item.done\ndata: {"type":"response.output_item.done","item":{"type":"function_call","call_id":"call_1","name":"add","arguments":"{\\"a\\":1}"}}\n\nevent: response.completed\ndata: {"type":"response.completed","response":{"id":"r","output":[]},"reproducibility":{"seed":2}}\n\n',
        b"\x00" + deep,
    ]
    vectors = vector_bytes("provider-streams/openai", ".sse")
    return built + [b"\x01" + v for v in vectors] + [b"\x00" + v for v in vectors]


def target(data: bytes) -> None:
    reply_checks(ROUTE, data)
