"""Server-sent events framing, read-only: where each event ends in the raw upstream bytes.

The proxy forwards upstream bytes as they are. It needs to know only where one event ends,
so that it can forward whole events as they arrive, hold back the stream's terminating event
until the reply is committed, and put its own annotation event on a boundary. Nothing here
rewrites, normalises or re-encodes a byte: every block a splitter returns, joined with its
tail, is exactly its input (a test holds this over every split point).

Framing follows WHATWG HTML "Parsing an event stream": lines end in CRLF, LF or CR, and an
event is dispatched at an empty line. A trailing CR is not judged until the next byte (or
the end) shows whether an LF follows it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from record.limits import JsonRefused, load_json

_TERMINATOR = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True)
class Event:
    """One event's raw bytes and the two fields the proxy reads from them."""

    raw: bytes
    name: str | None  # the last ``event:`` field, if any
    data: str | None  # ``data:`` lines joined by LF; None when there is none

    def json(self) -> dict[str, Any] | None:
        """The data as a JSON object, or None (``[DONE]``, a comment, not JSON, or JSON past
        ``record.limits``: whoever reads it gets no facts, and the bytes stay as they are)."""
        if self.data is None:
            return None
        try:
            value = load_json(self.data)
        except JsonRefused:
            return None
        return value if isinstance(value, dict) else None


def parse_event(raw: bytes) -> Event:
    """Read the ``event`` and ``data`` fields of one block (undecodable bytes are replaced)."""
    name: str | None = None
    data: list[str] = []
    for line in _TERMINATOR.split(raw):
        if not line or line.startswith(b":"):
            continue
        field, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if field == b"event":
            name = value.decode("utf-8", "replace")
        elif field == b"data":
            data.append(value.decode("utf-8", "replace"))
    return Event(raw, name, "\n".join(data) if data else None)


class EventSplitter:
    """Cut a byte stream into whole event blocks, as the bytes arrive.

    ``feed`` returns the blocks completed by a chunk, each ending with its blank line;
    ``tail`` is what has arrived after the last boundary (an event not yet ended).
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # where scanning resumes in ``_buf``
        self._line_start = True  # no byte of the current line seen yet

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buf += chunk
        buf, pos, line_start, start = self._buf, self._pos, self._line_start, 0
        blocks: list[bytes] = []
        while True:
            m = _TERMINATOR.search(buf, pos)
            if m is None:
                if pos < len(buf):
                    line_start = False
                pos = len(buf)
                break
            if m.start() > pos:
                line_start = False
            if m.end() == len(buf) and buf[m.start()] == 0x0D and m.end() - m.start() == 1:
                pos = m.start()  # a CR at the end: maybe the first half of a CRLF
                break
            pos = m.end()
            if line_start:  # an empty line: the event ends here
                blocks.append(bytes(buf[start:pos]))
                start = pos
            line_start = True
        del buf[:start]
        self._pos, self._line_start = pos - start, line_start
        return blocks

    @property
    def tail(self) -> bytes:
        return bytes(self._buf)


def iter_events(data: bytes) -> Iterator[Event]:
    """Every event of a whole body, the unterminated tail included, in order."""
    splitter = EventSplitter()
    for block in splitter.feed(data):
        yield parse_event(block)
    if splitter.tail:
        yield parse_event(splitter.tail)
