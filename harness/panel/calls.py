"""The panel's view of a stream with no turns (one that another client drove): its recorded
model calls, and Replay and Verify jobs over them (``harness.calls``), as for turns.

A calls job is a ``Job`` whose ``turn`` is ``CALLS`` (-1): Replay re-executes every call
through the running appliance (``reexecute_calls``), Verify rebuilds every call from the
bodies the panel read (``reconstruct_calls``: no network, no writes)."""

from __future__ import annotations

import json
from typing import Any

from harness.panel.jobs import Job
from harness.panel.source import Opened, Source
from record.schema import FetchRequest, ModelRequest, ModelResponse, ToolCall

__all__ = ["CALLS", "call_rows", "calls_refusal", "run_calls_replay", "run_calls_verify"]

CALLS = -1  # the ``turn`` of a job over a stream's calls


def call_rows(opened: Opened) -> list[dict[str, Any]]:
    """One row per recorded model call that was sent: what the calls page lists."""
    from harness.calls import route_of

    bodies = opened.strict()
    replies = {b.request_seq: (s, b) for s, b in bodies if isinstance(b, ModelResponse)}
    tools: dict[int, int] = {}
    for _, body in bodies:  # the calls each reply asked for that went out: tools and fetches
        if isinstance(body, FetchRequest) and not body.call_id:
            continue  # a refused fetch answers none of the reply's calls
        if isinstance(body, ToolCall | FetchRequest) and body.reply_seq is not None:
            tools[body.reply_seq] = tools.get(body.reply_seq, 0) + 1
    rows = []
    for seq, body in bodies:
        if not isinstance(body, ModelRequest) or not body.request_bytes:
            continue
        reply_seq, reply = replies.get(seq, (None, None))
        sent = json.loads(body.request_bytes)
        rows.append(
            {
                "seq": seq,
                "reply_seq": reply_seq,
                "route": route_of(body.provider.endpoint),
                "streamed": sent.get("stream") is True,
                "outcome": reply.outcome if reply is not None else "UNKNOWN",
                "pins": body.pins,
                "strict": bool((body.pins or {}).get("strict_cache")),
                "clock": body.clock,
                "content_key": body.content_key,
                "tool_calls": tools.get(reply_seq, 0) if reply_seq is not None else 0,
            }
        )
    return rows


def calls_refusal(source: Source, rows: list[dict[str, Any]]) -> str | None:
    """Why Replay is off for these calls (None: it is on)."""
    refusal = source.replay_refusal()
    if refusal:
        return refusal
    if not rows:
        return "the stream holds no model call"
    if not all(row["strict"] for row in rows):
        return (
            "not every call was pinned in strict cache mode: a replay is not expected to match; "
            "open a pinned session with `affidavit session new --pin …`"
        )
    return None


def run_calls_replay(job: Job, source: Source, opened: Opened) -> None:
    """Re-execute every recorded call through the running appliance, verdict by verdict."""
    from harness.calls import CallVerdict, reexecute_calls

    assert source.home is not None, "a replay needs the appliance's state folder"

    def on_call(verdict: CallVerdict) -> None:
        with job.lock:
            job.lines.append(verdict.line())
            job.marks.append("same" if verdict.identical else "differs")
            job.steps[verdict.step] = {
                **verdict.json(),
                "line": verdict.line(),
                "identical": verdict.identical,
            }

    report = reexecute_calls(source.home, job.stream, key=opened.key, on_call=on_call)
    with job.lock:
        job.summary = report.summary()
        job.ok = report.identical
        job.result = report.json()


def run_calls_verify(job: Job, source: Source, opened: Opened) -> None:
    """Rebuild every recorded call from the bodies the panel read: no network, no writes."""
    from harness.calls import reconstruct_calls

    with job.lock:
        job.lines.append(
            f"Reconstructing the calls of {job.stream}: each rebuilt through the proxy's "
            "pipeline over the record (no network)"
        )
        job.marks.append("")
    report = reconstruct_calls(source.store_path(), job.stream, opened.key, bodies=opened.strict())
    with job.lock:
        for index, call in enumerate(report.calls):
            job.lines.append(call.line())
            job.marks.append("same" if call.ok else "differs")
            job.steps[index] = {**call.json(), "line": call.line()}
        job.summary = report.summary()
        job.ok = report.ok
        job.result = report.json()
