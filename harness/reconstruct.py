"""Reconstruct: re-drive today's harness code with a turn's recorded replies and tool results.

One process, no network, no writes. The agent loop runs unchanged, with the session's official
SDK (``openai`` or ``anthropic``) on an HTTP transport that hands each request to the proxy's
own pipeline
built in-process over the record (``egress_proxy.replay.reconstruct_pipeline``: pins, the
recorded clock, derived tool-call ids, a record-backed transport and no network transport
object), and with a toolbox that answers every tool call from the record. Each request the
harness generates must carry its recorded ``content_key``, each tool call must be one the
record holds, the harness must make every recorded model call, and the final answer must
equal the recorded one byte for byte. The first difference fails the reconstruction, naming
the step and the record entry.

What the harness reads from the record besides replies and results: the turn's input
(``turn.started``), the earlier turns' inputs and answers, the session's labels (API, model
name, turn policy, search endpoint) and the tool catalogue the turn's first request offered (MCP
``tools/list`` answers are not recorded; the request that used them is).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from harness.agent import Agent, TurnPolicy
from harness.model_api import model_api
from harness.session import (
    LABEL_API,
    LABEL_MODEL,
    LABEL_POLICY,
    LABEL_SEARCH,
    history,
    labels_at,
    read_bodies,
)
from harness.tools import (
    ReplayMissed,
    ToolCallFailed,
    ToolOutput,
    ToolSpec,
    catalogue_from_request,
    fetch_body,
    fetch_text,
    recorded_output,
)
from record.cli import counted
from record.schema import ModelRequest, Strict, ToolCall, ToolResult, TurnEnded, TurnStarted
from record.seal import KeyPair

__all__ = ["Difference", "ReconstructReport", "reconstruct_turn"]


@dataclass
class Difference:
    """Where a reconstruction first parted from the record."""

    step: int
    seq: int | None  # the record entry it was compared with (nearest, for a miss)
    what: str
    diff: str = ""


@dataclass
class ReconstructReport:
    stream: str
    turn: int
    ok: bool
    steps: list[dict[str, Any]] = field(default_factory=list)
    difference: Difference | None = None
    answer_identical: bool = False
    tool_results: int = 0  # tool calls the turn made, each answered from the record

    def summary(self) -> str:
        """``2 requests, 1 tool result and the final answer``: what an exact one rebuilt."""
        return (
            f"{counted(len(self.steps), 'request')}, {counted(self.tool_results, 'tool result')}"
            " and the final answer"
        )

    def json(self) -> dict[str, Any]:
        d = self.difference
        return {
            "stream": self.stream,
            "turn": self.turn,
            "ok": self.ok,
            "steps": self.steps,
            "answer_identical": self.answer_identical,
            "tool_results": self.tool_results,
            "difference": None
            if d is None
            else {"step": d.step, "seq": d.seq, "what": d.what, "diff": d.diff},
        }


class _PipelineTransport(httpx2.BaseTransport):
    """Hands each request to the in-process pipeline; a miss becomes the proxy's 409."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self.loop = asyncio.new_event_loop()
        self.miss: Exception | None = None
        self.served: list[tuple[int, str]] = []  # (recorded request seq, content key)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        from egress_proxy.errors import ReplayMiss, UpstreamCut, UpstreamError

        body = request.read()
        try:
            reply, data = self.loop.run_until_complete(self.pipeline.run(body))
        except ReplayMiss as exc:
            self.miss = exc
            return httpx2.Response(
                409, content=exc.body(), headers={"content-type": "application/json"}
            )
        except UpstreamCut as exc:  # the recorded reply stopped here: the client's stream broke
            served = self.pipeline.transport.last  # the request matched its recorded twin
            self.served.append((served.seq, served.digest))
            raise httpx2.ReadError(str(exc), request=request) from None
        except UpstreamError as exc:  # no reply was recorded: the client's call never got one
            raise httpx2.ConnectError(str(exc), request=request) from None
        served = self.pipeline.transport.last
        self.served.append((served.seq, served.digest))
        headers = {"content-type": "text/event-stream" if reply.is_sse else "application/json"}
        return httpx2.Response(reply.status, content=data, headers=headers)

    def close(self) -> None:
        self.loop.close()


class RecordToolbox:
    """Tool calls answered from the record: MCP results by (server, tool, arguments), web
    tools by the exact fetch request bytes. A call the record does not hold is a miss."""

    def __init__(self, pipeline: Any, search_url: Callable[[int], str | None]) -> None:
        self.pipeline = pipeline
        #: ``web_search``'s endpoint for a call asked by the reply at a seq: the label of the
        #: stream holding that reply (a continued session's appliances each have their own)
        self.search_url = search_url
        self.miss: Exception | None = None
        self.results: dict[int, tuple[int, ToolResult | None]] = {}

    def call(self, spec: ToolSpec, arguments: bytes, *, reply_seq: int, call_id: str) -> ToolOutput:
        from egress_proxy.errors import ReplayMiss
        from record.digest import canonical_json

        try:
            if spec.kind in ("fetch", "search"):
                status, answer = self.pipeline.fetch(
                    fetch_body(spec, json.loads(arguments), self.search_url(reply_seq))
                )
                return fetch_text(status, answer)
            canonical = canonical_json(json.loads(arguments))
            recorded = self.pipeline.tool_result(spec.server, spec.tool, canonical)
        except ReplayMiss as exc:
            self.miss = exc
            raise ReplayMissed(f"replay_miss: {exc}") from exc
        result = recorded.reply
        if not isinstance(result, ToolResult) or result.outcome == "UNKNOWN":
            raise ToolCallFailed(f"{spec.name}: the record holds no outcome (seq {recorded.seq})")
        return recorded_output(result)


def turn_setup(
    bodies: list[tuple[int, Strict]], turn: int
) -> tuple[
    str, list[tuple[str, str]], dict[str, str], list[ToolSpec], TurnEnded | None, int | None
]:
    """What re-driving turn ``turn`` needs from the record: its input, the history, the
    session labels, the tool catalogue, and its ``turn.ended`` (with seq) if any."""
    from egress_proxy.replay_plan import turn_bodies

    sliced = turn_bodies(bodies, turn)
    began, started = next((s, b) for s, b in sliced if isinstance(b, TurnStarted))
    ended = next(((s, b) for s, b in sliced if isinstance(b, TurnEnded)), None)
    first = next((b for _, b in sliced if isinstance(b, ModelRequest) and b.request_bytes), None)
    idempotent = {
        f"{b.server}__{b.tool}": b.idempotent for _, b in sliced if isinstance(b, ToolCall)
    }
    catalogue = catalogue_from_request(json.loads(first.input_bytes), idempotent) if first else []
    return (
        started.input_bytes.decode("utf-8", "surrogateescape"),
        history(bodies, turn),
        labels_at(bodies, began),  # the labels of the stream the turn began in
        catalogue,
        ended[1] if ended else None,
        ended[0] if ended else None,
    )


def reconstruct_turn(
    store: Path | str,
    stream: str,
    turn: int,
    key: KeyPair,
    *,
    bodies: list[tuple[int, Strict]] | None = None,
) -> ReconstructReport:
    """Reconstruct turn ``turn`` of ``stream``; the report says where it differed, if it did.
    ``bodies``: the stream's bodies, already opened (an exported bundle's); else read from
    ``store``."""
    from egress_proxy.replay import reconstruct_pipeline

    if bodies is None:
        bodies = read_bodies(store, stream, key)
    try:
        text, past, labels, catalogue, ended, ended_seq = turn_setup(bodies, turn)
    except (KeyError, StopIteration):
        report = ReconstructReport(stream, turn, False)
        report.difference = Difference(0, None, f"the stream has no turn {turn}")
        return report
    pipeline = reconstruct_pipeline(store, stream, key, turn, bodies=bodies, annotated=True)
    transport = _PipelineTransport(pipeline)
    toolbox = RecordToolbox(pipeline, lambda seq: labels_at(bodies, seq).get(LABEL_SEARCH))
    api = model_api(
        labels.get(LABEL_API, "openai"),
        f"http://reconstruct.invalid/s/{stream}",
        "reconstruct",
        http_client=httpx2.Client(transport=transport),
    )
    policy = TurnPolicy.from_json(labels.get(LABEL_POLICY))
    agent = Agent(api, labels.get(LABEL_MODEL, ""), toolbox, catalogue, policy)
    try:
        result = agent.run_turn(turn, past, text)
    finally:
        api.close()
        transport.close()
    report = ReconstructReport(stream, turn, False)
    report.tool_results = sum(len(step.tool_outputs) for step in result.steps)
    for index, (seq, key_) in enumerate(transport.served):
        report.steps.append(
            {"step": index, "request_seq": seq, "content_key": key_, "identical": True}
        )
    miss = transport.miss or toolbox.miss
    if miss is not None:
        nearest = getattr(miss, "nearest", None)
        step = len(transport.served)
        what = "request differs" if transport.miss is not None else "tool call differs"
        if toolbox.miss is not None:
            step = max(0, len(transport.served) - 1)
        report.steps.append(
            {"step": step, "request_seq": getattr(nearest, "seq", None), "identical": False}
        )
        report.difference = Difference(
            step, getattr(nearest, "seq", None), f"{what}: {miss}", getattr(miss, "diff", "")
        )
        return report
    recorded_steps = [c for c in pipeline.plan]
    if len(transport.served) < len(recorded_steps):
        missing = recorded_steps[len(transport.served)]
        report.difference = Difference(
            len(transport.served),
            missing.seq,
            f"the harness stopped ({result.outcome}) before the recorded step at seq {missing.seq}",
        )
        return report
    if ended is None:
        report.difference = Difference(len(transport.served), None, "the turn has no turn.ended")
        return report
    answer = result.answer.encode("utf-8", "surrogateescape")
    report.answer_identical = (
        answer == (ended.answer_bytes or b"") and result.outcome == ended.outcome
    )
    if not report.answer_identical:
        report.difference = Difference(
            max(0, len(transport.served) - 1),
            ended_seq,
            f"the final answer differs from turn.ended ({result.outcome} vs {ended.outcome})",
            _first_difference(ended.answer_bytes or b"", answer),
        )
        return report
    report.ok = True
    return report


def _first_difference(recorded: bytes, now: bytes) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(recorded, now, strict=False)) if a != b),
        min(len(recorded), len(now)),
    )
    return f"first differing byte at offset {at}: recorded {recorded[at : at + 24]!r}, now {now[at : at + 24]!r}"
