"""The SSE splitter (``egress_proxy.sse``): it never raises, and never loses or adds a byte.

The first byte of an input picks the chunk size the rest is fed in; the blocks and the tail
must join back to the input, and be the same blocks whole-body splitting gives.
"""

from __future__ import annotations

from egress_proxy.providers import DIALECTS
from egress_proxy.sse import EventSplitter, iter_events
from fuzz.common import InvariantBroken, vector_bytes

#: The splitter has no typed error: every byte sequence is a stream.
ERRORS: tuple[type[BaseException], ...] = ()
JSON_PREFIX = 1  # the input's JSON starts here: the JSON-aware mutations apply
MAX_LEN = 2048  # the longest input the fuzzer makes (longer seeds are cut)


def seeds() -> list[bytes]:
    built = [
        b'\x03data: {"a":1}\n\ndata: [DONE]\n\n',
        b'\x01event: message_stop\r\ndata: {"type":"message_stop"}\r\n\r\n',
        b"\x05: comment\rdata: x\r\rdata:y\ndata: z\n\nretry: 10\n\n",
        b'\x02event: response.completed\ndata: {"type": "response.completed"}\n\ntail',
    ]
    return built + [b"\x07" + v for v in vector_bytes("provider-streams", ".sse", ".txt", ".bin")]


def target(data: bytes) -> None:
    step = data[0] % 17 + 1 if data else 1
    body = data[1:]
    splitter = EventSplitter()
    blocks: list[bytes] = []
    for i in range(0, len(body), step):
        blocks += splitter.feed(body[i : i + step])
    if b"".join(blocks) + splitter.tail != body:
        raise InvariantBroken("the blocks and the tail do not join back to the input")
    whole = EventSplitter()
    if whole.feed(body) != blocks or whole.tail != splitter.tail:
        raise InvariantBroken(f"feeding {step}-byte chunks cuts other blocks than the whole body")
    for event in iter_events(body):
        event.json()
        for dialect in DIALECTS.values():
            dialect.is_terminal(event)
