"""A transport that serves recorded bytes: what reconstruct and re-execute stand on.

Every recorded call is keyed by ``(kind, server, name, digest, order)``:

- a model call: ``("model", provider endpoint, model id, content_key, n)``;
- a tool call: ``("tool", MCP server, tool name, arguments_digest, n)``;
- a fetch: ``("fetch", "", URL, content_key of the exact request bytes, n)``;

where ``n`` counts earlier calls with the same first four parts, so the same request sent
twice is served its two recorded replies in turn. ``RecordTransport.send`` computes the
content key over the exact bytes it is handed and serves the reply recorded for it: the
status and the bytes as received (a cut reply is cut again, a call with no recorded reply
is ``UpstreamUnavailable`` again). A call the record does not hold raises ``ReplayMiss``
with the nearest recorded call of its kind and a line diff; it never falls through.

This module dials nothing, imports no HTTP client and never writes to the record.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from egress_proxy.errors import ReplayMiss, UpstreamCut, UpstreamUnavailable
from egress_proxy.transports.base import UpstreamRequest
from record.digest import Domain, digest
from record.schema import (
    FetchRequest,
    FetchResponse,
    ModelRequest,
    ModelResponse,
    PinsSet,
    Strict,
    ToolCall,
    ToolResult,
)

Kind = Literal["model", "tool", "fetch"]
Key = tuple[Kind, str, str, str, int]


@dataclass(frozen=True)
class RecordedCall:
    """One recorded call and what answered it (None: no reply was ever recorded)."""

    kind: Kind
    server: str
    name: str
    digest: str
    order: int
    seq: int  # of the ``model.request``, ``tool.call`` or ``fetch.request`` entry
    request: bytes  # the request bytes sent, or the canonical arguments
    reply: ModelResponse | ToolResult | FetchResponse | None = field(repr=False)
    body: ModelRequest | ToolCall | FetchRequest = field(repr=False)
    pins: dict[str, Any] | None = field(default=None, repr=False)  # the session's, in force
    reply_seq: int | None = None  # the seq of ``reply``

    @property
    def key(self) -> Key:
        return (self.kind, self.server, self.name, self.digest, self.order)

    def describe(self) -> dict[str, Any]:
        """The call as a miss reports it (JSON-ready)."""
        return {
            "kind": self.kind,
            "server": self.server,
            "name": self.name,
            "digest": self.digest,
            "order": self.order,
            "seq": self.seq,
        }


class RecordIndex:
    """A stream's recorded calls, in record order, each served at most once."""

    def __init__(self, calls: Iterable[RecordedCall]) -> None:
        self.calls = list(calls)
        self._by_key = {call.key: call for call in self.calls}
        self._served: set[Key] = set()
        self._next_order: dict[tuple[Kind, str, str, str], int] = {}

    @classmethod
    def from_bodies(cls, bodies: Iterable[tuple[int, Strict]]) -> RecordIndex:
        """Index opened bodies given in seq order (``replay.read_stream``)."""
        ordered = sorted(bodies, key=lambda pair: pair[0])
        Answer = tuple[int | None, ModelResponse | ToolResult | FetchResponse | None]
        replies: dict[tuple[str, int], Answer] = {}
        for at, body in ordered:
            if isinstance(body, ModelResponse):
                replies[("model", body.request_seq)] = (at, body)
            elif isinstance(body, ToolResult):
                replies[("tool", body.call_seq)] = (at, body)
            elif isinstance(body, FetchResponse):
                replies[("fetch", body.request_seq)] = (at, body)
        counts: dict[tuple[Kind, str, str, str], int] = {}
        calls: list[RecordedCall] = []
        pins: dict[str, Any] | None = None
        for seq, body in ordered:
            if isinstance(body, PinsSet):
                pins = dict(body.pins) or None
            elif isinstance(body, ModelRequest) and body.request_bytes:  # not a refusal
                base: tuple[Kind, str, str, str] = (
                    "model",
                    body.provider.endpoint,
                    body.model_id,
                    body.content_key,
                )
                order = counts.get(base, 0)
                counts[base] = order + 1
                answered, reply = replies.get(("model", seq), (None, None))
                calls.append(
                    RecordedCall(*base, order, seq, body.request_bytes, reply, body, pins, answered)
                )
            elif isinstance(body, ToolCall):
                base = ("tool", body.server, body.tool, body.arguments_digest)
                order = counts.get(base, 0)
                counts[base] = order + 1
                answered, reply = replies.get(("tool", seq), (None, None))
                calls.append(
                    RecordedCall(*base, order, seq, body.arguments, reply, body, pins, answered)
                )
            elif isinstance(body, FetchRequest):
                base = ("fetch", "", body.url, body.content_key)
                order = counts.get(base, 0)
                counts[base] = order + 1
                answered, reply = replies.get(("fetch", seq), (None, None))
                calls.append(
                    RecordedCall(*base, order, seq, body.request_bytes, reply, body, pins, answered)
                )
        return cls(calls)

    def of_kind(self, kind: Kind) -> list[RecordedCall]:
        return [call for call in self.calls if call.kind == kind]

    @property
    def served(self) -> int:
        return len(self._served)

    def take(self, kind: Kind, server: str, name: str, key: str, request: bytes) -> RecordedCall:
        """The next recorded call with this key, marked served; else ``ReplayMiss``."""
        base = (kind, server, name, key)
        order = self._next_order.get(base, 0)
        call = self._by_key.get((*base, order))
        if call is None:
            raise self.miss(kind, server, name, request)
        self._next_order[base] = order + 1
        self._served.add(call.key)
        return call

    def miss(self, kind: Kind, server: str, name: str, request: bytes) -> ReplayMiss:
        """A ``ReplayMiss`` naming the nearest recorded call of ``kind`` and a diff to it."""
        nearest = self.nearest(kind, server, name, request)
        what = f"{kind} call {name!r} on {server!r}"
        if nearest is None:
            return ReplayMiss(f"the record holds no {kind} call left to serve the {what}")
        diff = "".join(
            difflib.unified_diff(
                _lines(nearest.request),
                _lines(request),
                f"recorded seq {nearest.seq}",
                "presented",
            )
        )
        if not diff:  # the same bytes: every recorded answer to them is already served
            answers = nearest.order + 1
            diff = (
                f"the same bytes; its {answers} recorded "
                f"{'answer is served already' if answers == 1 else 'answers are all served'}\n"
            )
        message = f"the record does not hold this {what}; nearest is seq {nearest.seq}"
        return ReplayMiss(message, nearest=nearest, diff=diff)

    def nearest(self, kind: Kind, server: str, name: str, request: bytes) -> RecordedCall | None:
        """Unserved calls first, then the same server and name, then the most similar bytes."""
        candidates = self.of_kind(kind)
        if not candidates:
            return None
        text = "".join(_lines(request))

        def rank(call: RecordedCall) -> tuple[bool, bool, float]:
            ratio = difflib.SequenceMatcher(None, "".join(_lines(call.request)), text).ratio()
            same = call.server == server and call.name == name
            return (call.key not in self._served, same, ratio)

        return max(candidates, key=rank)


def _lines(data: bytes) -> list[str]:
    """JSON pretty-printed one member a line, so a diff points at the member that differs."""
    try:
        text = json.dumps(json.loads(data), indent=1, sort_keys=True, ensure_ascii=False)
    except ValueError:
        text = data.decode("utf-8", "replace")
    return [line + "\n" for line in text.splitlines()]


@dataclass
class RecordedResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    data: bytes
    cut: bool = False

    async def body(self) -> AsyncIterator[bytes]:
        if self.data:
            yield self.data
        if self.cut:
            raise UpstreamCut("the recorded reply was cut here")

    async def aclose(self) -> None:
        return None


class RecordTransport:
    """Serves model calls from a ``RecordIndex``; ``calls`` lists what it was sent."""

    def __init__(self, index: RecordIndex) -> None:
        self.index = index
        self.calls: list[UpstreamRequest] = []
        self.last: RecordedCall | None = None

    async def send(self, request: UpstreamRequest) -> RecordedResponse:
        self.calls.append(request)
        key = digest(Domain.REQUEST, request.body)
        try:
            parsed = json.loads(request.body)
        except ValueError:
            parsed = None
        model = parsed.get("model") if isinstance(parsed, dict) else None
        name = model if isinstance(model, str) else ""
        call = self.index.take("model", request.url, name, key, request.body)
        self.last = call
        reply = call.reply
        if not isinstance(reply, ModelResponse):
            raise UpstreamUnavailable(f"the record holds no reply to seq {call.seq}")
        streamed = isinstance(parsed, dict) and parsed.get("stream") is True
        if reply.outcome == "FAILED":
            error = reply.error_bytes or b""
            return RecordedResponse(reply.status or 502, _JSON, error)
        if reply.outcome == "UNKNOWN" and reply.response_bytes is None:
            raise UpstreamUnavailable(f"the recorded call at seq {call.seq} got no reply")
        kind = _SSE if streamed else _JSON
        data = reply.response_bytes or b""
        return RecordedResponse(reply.status or 200, kind, data, reply.outcome == "UNKNOWN")

    def tool_result(self, server: str, tool: str, arguments: bytes) -> RecordedCall:
        """The recorded call (with its ``tool.result``) for these canonical arguments."""
        key = digest(Domain.TOOL_ARGUMENTS, arguments)
        call = self.index.take("tool", server, tool, key, arguments)
        self.last = call
        return call

    def fetch_result(self, url: str, request_bytes: bytes) -> RecordedCall:
        """The recorded fetch (with its ``fetch.response``) of these exact request bytes."""
        key = digest(Domain.FETCH_REQUEST, request_bytes)
        call = self.index.take("fetch", "", url, key, request_bytes)
        self.last = call
        return call

    async def aclose(self) -> None:
        return None


_JSON = (("content-type", "application/json"),)
_SSE = (("content-type", "text/event-stream"),)
