"""egress_proxy.sse: event boundaries found in raw bytes, never a byte changed.

- Joining the blocks and the tail gives the input back, for every way of cutting it into
  chunks (every pair of split points), with LF, CRLF and CR line ends and a CR that is only
  resolved by the next chunk.
- Over every provider capture in ``../shared/vectors/provider-streams``, the splitter finds
  exactly the events the manifests count (a strict parser's dispatched events), and the
  unterminated final event of the Anthropic ``.txt`` captures stays in the tail.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from egress_proxy.sse import EventSplitter, iter_events, parse_event

CASES = [
    b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\n",
    b"\n\nevent: x\ndata: y\r\n\r\n: comment\n\n",
    b"data: a\r\n\rdata: b\r",
    b"event: message_stop\ndata: {}",
    b"data:no-space\ndata:  two spaces\n\n",
]


def split_all(data: bytes, cuts: list[int]) -> tuple[list[bytes], bytes]:
    splitter = EventSplitter()
    blocks: list[bytes] = []
    edges = [0, *cuts, len(data)]
    for a, b in itertools.pairwise(edges):
        blocks += splitter.feed(data[a:b])
    return blocks, splitter.tail


@pytest.mark.parametrize("data", CASES)
def test_every_split_gives_the_same_blocks_and_loses_no_byte(data: bytes) -> None:
    whole = split_all(data, [])
    assert b"".join(whole[0]) + whole[1] == data
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1):
            assert split_all(data, [i, j]) == whole, (i, j)


def test_boundaries_and_tail() -> None:
    blocks, tail = split_all(CASES[0], [])
    assert blocks == [b"data: a\n\n", b"data: b\r\n\r\n", b"data: c\r\r"]
    assert tail == b"data: d\n"
    # A CR at the very end might be the first half of a CRLF: not yet a boundary.
    assert split_all(b"data: a\n\r", []) == ([], b"data: a\n\r")
    assert split_all(b"data: a\n\r\n", []) == ([b"data: a\n\r\n"], b"")


def test_parse_event_reads_fields_like_a_browser() -> None:
    event = parse_event(b'event: message_stop\r\ndata: {"type":\ndata:  "x"}\n: note\n\n')
    assert event.name == "message_stop"
    assert event.data == '{"type":\n "x"}'
    assert parse_event(b"data: [DONE]\n\n").json() is None
    assert parse_event(b": only a comment\n\n").data is None
    assert parse_event(b'data: {"a": 1}      \n\n').json() == {"a": 1}


def _captures(vectors: Path) -> list[tuple[str, dict[str, object], bytes]]:
    root = vectors / "provider-streams"
    found = []
    for provider in ("openai", "anthropic"):
        manifest = json.loads((root / provider / "manifest.json").read_text("utf-8"))["files"]
        for name, facts in sorted(manifest.items()):
            found.append((f"{provider}/{name}", facts, (root / provider / name).read_bytes()))
    return found


def test_provider_captures_split_into_the_events_their_manifests_count(vectors: Path) -> None:
    captures = _captures(vectors)
    assert len(captures) == 22
    for name, facts, data in captures:
        splitter = EventSplitter()
        blocks = [b for i in range(0, len(data), 7) for b in splitter.feed(data[i : i + 7])]
        assert b"".join(blocks) + splitter.tail == data, name
        if name.startswith("openai/"):
            assert len(blocks) == facts["sse_events"], name
            assert splitter.tail == b"", name
            assert parse_event(blocks[-1]).data == "[DONE]", name
        else:
            assert len(blocks) == facts["sse_events_dispatched_by_strict_parser"], name
            events = list(iter_events(data))
            assert len(events) == facts["sse_events_total"], name
            assert events[-1].name == "message_stop", name
            assert (splitter.tail != b"") != facts["final_message_stop_dispatched_by_strict_parser"]
