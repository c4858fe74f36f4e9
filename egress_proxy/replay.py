"""Reconstruct: the proxy's request pipeline, in-process, over the record and no network.

``reconstruct_pipeline(store_path, stream, key)`` opens the store read-only, opens the
stream's bodies with a recipient key, and builds the proxy's own request stages
(``pins → clock → tool_ids``) in front of a ``RecordTransport``. No network transport
object exists, ``egress_proxy.transports.network`` is never imported, and nothing is
written: the ``identity`` and ``capture`` stages, which append, are replaced by
``keyed``, which computes the same content key and prompt digest and appends nothing.

Re-driven with the harness's inputs in their recorded order, each call gets the session
pins and the clock that were in force for the recorded call of the same ordinal
(``Clock.fixed`` of ``ModelRequest.clock``), so the current code must regenerate the
recorded request bytes exactly; the transport then serves the recorded reply for that
content key, and a pinned session's derived tool-call ids are derived again. Any request
the record does not hold raises ``ReplayMiss`` (409 ``replay_miss``) with the nearest
recorded call and a diff: the first difference stops the reconstruction.

What the record does not say is inferred: a provider's ``engine_extensions`` from the
recorded request bytes (a ``clock`` or ``strict_cache`` member), ``inject_clock`` from
whether a clock was recorded. Client headers are not recorded and do not reach the bytes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egress_proxy.clock import Clock
from egress_proxy.errors import ProxyError, ReplayMiss
from egress_proxy.fetch import parse_fetch, recorded_fetch
from egress_proxy.pipeline import (
    Call,
    Committed,
    Handler,
    Reply,
    Stage,
    Upstream,
    annotate,
    clock_stage,
    compose,
    dial,
    pins,
    tool_ids,
)
from egress_proxy.providers import DIALECTS, Dialect
from egress_proxy.replay_plan import turn_bodies
from egress_proxy.sessions import Session
from egress_proxy.tool_config import FetchConfig
from egress_proxy.transports.recorded import RecordedCall, RecordIndex, RecordTransport
from record.backends import open_store
from record.digest import Domain, digest, prompt_bytes
from record.log import Appended
from record.reader import StreamKeys
from record.schema import FetchResponse, ModelRequest, ModelResponse, Strict
from record.schema import parse_entry as parse_line
from record.seal import KeyPair

__all__ = ["Reconstruction", "read_stream", "reconstruct_pipeline"]


def read_stream(store_path: Path | str, stream: str, key: KeyPair) -> list[tuple[int, Strict]]:
    """Every body of ``stream`` in seq order, opened with ``key``; the store is opened read-only."""
    store = open_store(store_path, readonly=True)
    try:
        entries = [parse_line(stored.line) for stored in store.entries(stream)]
    finally:
        store.close()
    keys = StreamKeys.collect(stream, entries, key)
    return [(entry.seq, keys.open(entry)) for entry in entries]


@dataclass
class Reconstruction:
    """A reconstructed pipeline: drive it with ``run``, one harness input at a time."""

    stream: str
    session: Session
    transport: RecordTransport
    handler: Handler
    plan: list[RecordedCall]  # the recorded model calls, in record order
    position: int = 0  # the ordinal of the next model call
    upstream_by_seq: dict[int, Upstream] = field(default_factory=dict)

    def next_call(self, input_bytes: bytes) -> Call:
        """A ``Call`` for the next model call, set up as its recorded twin was."""
        if self.position >= len(self.plan):
            raise self.transport.index.miss("model", "", "", input_bytes)
        recorded = self.plan[self.position]
        self.position += 1
        body = recorded.body
        assert isinstance(body, ModelRequest)
        self.session.pins = recorded.pins
        self.session.clock = Clock.fixed(body.clock) if body.clock is not None else None
        upstream = self.upstream_by_seq[recorded.seq]
        request = json.loads(input_bytes)
        version = body.provider.api_version
        return Call(self.session, upstream, {}, input_bytes, request, input_bytes, version)

    async def run(self, input_bytes: bytes) -> tuple[Reply, bytes]:
        """Send one harness input through the pipeline; the reply and the bytes delivered."""
        reply = await self.handler(self.next_call(input_bytes))
        return reply, b"".join([chunk async for chunk in reply.body])

    def tool_result(self, server: str, tool: str, arguments: bytes) -> RecordedCall:
        """The recorded ``tool.call`` for these canonical arguments, with its result (or
        ``ReplayMiss``): the tools of a reconstruction are the record."""
        return self.transport.tool_result(server, tool, arguments)

    def fetch(self, raw: bytes) -> tuple[int, bytes]:
        """Answer a fetch body as the proxy's fetch endpoint answered it, from the record:
        the same exact request bytes must have been recorded (else ``ReplayMiss``)."""
        try:
            ask = parse_fetch(raw, FetchConfig().user_agent)
        except ProxyError as exc:  # refused before anything was recorded, as it was live
            return exc.status, exc.body()
        sent = ask.request_bytes()
        recorded = self.transport.fetch_result(ask.url, sent)
        reply = recorded.reply
        if not isinstance(reply, FetchResponse):
            raise ReplayMiss(f"the recorded fetch at seq {recorded.seq} got no response")
        return recorded_fetch(reply)

    def recorded_inputs(self) -> list[bytes]:
        """The inputs the harness sent, as recorded (what a re-drive of it must send again)."""
        return [call.body.input_bytes for call in self.plan if isinstance(call.body, ModelRequest)]


def reconstruct_pipeline(
    store_path: Path | str,
    stream: str,
    key: KeyPair,
    turn: int | None = None,
    *,
    bodies: list[tuple[int, Strict]] | None = None,
    annotated: bool = False,
) -> Reconstruction:
    """Build the pipeline for ``stream`` (only its turn ``turn`` when given) over its record:
    no network, no writes. ``bodies`` are the stream's opened bodies, when already read;
    ``annotated`` adds the proxy's annotation stage, so a client sees what it saw live."""
    opened = bodies if bodies is not None else read_stream(store_path, stream, key)
    if turn is not None:
        opened = turn_bodies(opened, turn)
    index = RecordIndex.from_bodies(opened)
    transport = RecordTransport(index)
    session = Session(stream, b"", {})
    plan = index.of_kind("model")
    upstreams = {call.seq: _upstream(call) for call in plan}
    stages = [pins, clock_stage(Clock.system()), tool_ids, keyed(transport)]
    if annotated:
        stages.insert(0, annotate)
    handler = compose(stages, dial(transport))
    return Reconstruction(stream, session, transport, handler, plan, 0, upstreams)


def keyed(transport: RecordTransport) -> Stage:
    """``identity`` without the append: the keys of the bytes that will be sent."""

    async def stage(call: Call, next: Handler) -> Reply:
        call.content_key = digest(Domain.REQUEST, call.request_bytes)
        call.prompt_digest = digest(Domain.PROMPT, prompt_bytes(call.request))
        reply = await next(call)
        served = transport.last
        assert served is not None, "the transport served this call"
        call.request_seq = served.seq
        return Reply(reply.status, reply.headers, reply.body, _committed(call, served))

    return stage


def _committed(call: Call, served: RecordedCall) -> asyncio.Future[Committed]:
    """The recorded outcome, already known: reconstruct commits nothing of its own."""
    reply, seq = served.reply, served.reply_seq
    assert isinstance(reply, ModelResponse)  # else ``RecordTransport.send`` raised
    assert seq is not None  # set with ``reply`` (``RecordIndex.from_bodies``)
    appended = Appended(call.session.id, seq, "", "model.response", "", b"", 0, b"")
    future: asyncio.Future[Committed] = asyncio.get_running_loop().create_future()
    future.set_result(Committed(appended, reply.outcome, reply.response_digest))
    return future


def _upstream(call: RecordedCall) -> Upstream:
    body = call.body
    assert isinstance(body, ModelRequest)
    sent: Mapping[str, Any] = json.loads(body.request_bytes)
    engine = "strict_cache" in sent or (body.clock is not None and sent.get("clock") == body.clock)
    return Upstream(
        name=body.provider.name,
        dialect=_dialect(body.provider.endpoint),
        url=body.provider.endpoint,
        api_key=None,
        api_version=body.provider.api_version,
        engine_extensions=engine,
        inject_clock=body.clock is not None,
        clock_rule=body.clock_rule or "prepend",  # records before the rule was recorded
    )


def _dialect(endpoint: str) -> Dialect:
    for route, dialect in DIALECTS.items():
        if endpoint.endswith(route):
            return dialect
    raise ReplayMiss(f"no dialect is mounted on the recorded endpoint {endpoint!r}")
