"""The demo's replay: re-execute a recorded turn's model steps and judge each one.

Replay reads the turn back from the record with the user's key, re-sends each recorded
``model.request`` exactly as it was sent (``request_bytes``) to the engine directly (no
proxy, no live tool: a tool result reaches the model only inside the recorded request
bytes, and it is checked against the recorded ``tool.result``), and compares what comes
back with what was recorded. Three comparisons per step:

- **prompt**: the prompt digest recomputed from the replayed bytes (and the one the engine
  reports in its reproducibility block) equals the recorded ``prompt_digest``;
- **injected clock**: the clock the request carried is the one the engine says it used,
  on the recorded reply and on the replayed one;
- **reply**: the replayed reply bytes equal the recorded ``response_bytes``, whole. If they
  differ only in ``batch_peers_max``/``cached_tokens`` (facts of the run, not of the request:
  they change when batches differ) the verdict says so rather than calling it identical.

This is the demo's stand-in until the proxy's replay transport and verdicts land; it uses
only the record's public readers and plain HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from egress_proxy.providers import reply_facts
from record.digest import prompt_digest
from record.reader import StreamKeys
from record.schema import (
    Entry,
    ModelRequest,
    ModelResponse,
    Strict,
    ToolCall,
    ToolResult,
    TurnEnded,
    TurnStarted,
    parse_entry,
)
from record.seal import KeyPair
from record.sqlite_store import SQLiteStore

#: Reproducibility-block members that describe the run, not the request.
EXECUTION_FACTS = ("batch_peers_max", "cached_tokens")

#: ``send(request_bytes) -> (status, reply bytes)``: how a replayed request reaches a model.
Send = Callable[[bytes], tuple[int, bytes]]


class ReplayError(Exception):
    """The record does not hold a replayable turn (missing or unanswered steps)."""


@dataclass(frozen=True)
class RecordedTool:
    """A tool call and its result as recorded, matched by ``call_seq``."""

    call: ToolCall
    result: ToolResult


@dataclass(frozen=True)
class RecordedStep:
    """One model step of a turn: the request, its committed reply and the tools before it."""

    turn: int
    step: int
    request_seq: int
    request: ModelRequest
    response: ModelResponse
    tools: tuple[RecordedTool, ...] = ()  # every tool result recorded earlier in the turn


@dataclass(frozen=True)
class StepVerdict:
    turn: int
    step: int
    prompt: bool
    clock: bool
    reply: Literal["identical", "masked", "differs"]
    tool_results: int  # tool results in the request that match the record
    tool_results_unmatched: int  # tool messages the record does not hold
    live_calls: int = 0  # replay never runs a tool
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return (
            self.prompt
            and self.clock
            and self.reply != "differs"
            and not self.tool_results_unmatched
            and not self.live_calls
        )

    def line(self) -> str:
        """The one-line verdict the demo prints for this step."""
        reply = {
            "identical": "reply identical",
            "masked": "reply identical with " + "/".join(EXECUTION_FACTS) + " masked",
            "differs": "reply differs",
        }[self.reply]
        parts = [
            f"prompt {_same(self.prompt)}",
            f"injected clock {_same(self.clock)}",
            reply,
            f"{_count(self.tool_results, 'tool result')} replayed from the record",
        ]
        if self.tool_results_unmatched:
            parts.append(f"{_count(self.tool_results_unmatched, 'tool result')} not in the record")
        parts.append(_count(self.live_calls, "live call"))
        return f"Replay of turn {self.turn}, step {self.step}: " + " · ".join(parts)


def summary(verdicts: Sequence[StepVerdict]) -> str:
    """The turn's one-line outcome."""
    if not verdicts:
        return "Replay: no steps to replay"
    turn = verdicts[0].turn
    bad = [v for v in verdicts if not v.ok]
    exact = sum(v.ok and v.reply == "identical" for v in verdicts)
    if not bad:
        if exact == len(verdicts):
            how = "every reply byte for byte"
        else:
            how = f"{len(verdicts) - exact} with {'/'.join(EXECUTION_FACTS)} masked"
        return f"Replay of turn {turn}: ok, {len(verdicts)} of {len(verdicts)} steps replay ({how})"
    where = ", ".join(f"step {v.step}: {', '.join(_failures(v))}" for v in bad)
    return f"Replay of turn {turn}: FAILED, {len(bad)} of {len(verdicts)} steps differ ({where})"


def read_turn(
    store_path: Path | str, stream: str, key: KeyPair, turn: int = 0
) -> list[RecordedStep]:
    """The model steps of ``turn``, read back from the store and opened with ``key``."""
    store = SQLiteStore(store_path, readonly=True)
    try:
        entries: list[Entry] = [parse_entry(e.line) for e in store.entries(stream)]
    finally:
        store.close()
    keys = StreamKeys.collect(stream, entries, key)
    bodies: list[tuple[int, Strict]] = [(e.seq, keys.open(e)) for e in entries]
    inside = False
    requests: list[tuple[int, ModelRequest, tuple[RecordedTool, ...]]] = []
    responses: dict[int, ModelResponse] = {}
    calls: dict[int, ToolCall] = {}
    tools: list[RecordedTool] = []
    for seq, body in bodies:
        if isinstance(body, TurnStarted) and body.turn == turn:
            inside = True
        elif isinstance(body, TurnEnded) and body.turn == turn:
            break
        elif not inside:
            continue
        elif isinstance(body, ModelRequest):
            requests.append((seq, body, tuple(tools)))
        elif isinstance(body, ModelResponse):
            responses[body.request_seq] = body
        elif isinstance(body, ToolCall):
            calls[seq] = body
        elif isinstance(body, ToolResult) and body.call_seq in calls:
            tools.append(RecordedTool(calls[body.call_seq], body))
    if not inside:
        raise ReplayError(f"stream {stream} holds no turn {turn}")
    steps = []
    for step, (seq, request, before) in enumerate(requests):
        response = responses.get(seq)
        if response is None or response.outcome != "COMMITTED":
            raise ReplayError(
                f"turn {turn}, step {step}: the request at seq {seq} has no committed reply"
            )
        steps.append(RecordedStep(turn, step, seq, request, response, before))
    return steps


def http_send(engine_url: str, timeout_s: float = 120.0) -> Send:
    """Post request bytes, unchanged, to the engine's chat-completions route."""

    def send(body: bytes) -> tuple[int, bytes]:
        reply = httpx.post(
            engine_url.rstrip("/") + "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json", "accept-encoding": "identity"},
            timeout=timeout_s,
        )
        return reply.status_code, reply.content

    return send


def judge_step(recorded: RecordedStep, status: int, replayed: bytes) -> StepVerdict:
    """Compare one replayed reply with the record."""
    request = json.loads(recorded.request.request_bytes)
    recorded_bytes = recorded.response.response_bytes or b""
    streamed = bool(request.get("stream"))
    _, old_block = reply_facts(recorded_bytes, streamed)
    _, new_block = reply_facts(replayed, streamed) if status == 200 else (None, None)
    old_block, new_block = old_block or {}, new_block or {}

    digest = recorded.request.prompt_digest
    engine_saw = new_block.get("prompt_digest")
    prompt = prompt_digest(request) == digest and engine_saw in (None, digest)

    injected = request.get("clock")
    clocks = {injected, old_block.get("clock"), new_block.get("clock")}
    if recorded.request.clock is not None:  # the clock the proxy injected and recorded
        clocks.add(recorded.request.clock)
    clock = injected is not None and len(clocks) == 1

    reply: Literal["identical", "masked", "differs"] = "differs"
    notes: list[str] = []
    if status != 200:
        notes.append(f"the engine answered {status}")
    elif replayed == recorded_bytes:
        reply = "identical"
    elif _masked(replayed, streamed) == _masked(recorded_bytes, streamed):
        reply = "masked"

    matched, unmatched = _tool_results(request, recorded.tools)
    return StepVerdict(
        turn=recorded.turn,
        step=recorded.step,
        prompt=prompt,
        clock=clock,
        reply=reply,
        tool_results=matched,
        tool_results_unmatched=unmatched,
        notes=tuple(notes),
    )


def replay_turn(
    store_path: Path | str,
    stream: str,
    key: KeyPair,
    engine_url: str,
    *,
    turn: int = 0,
    send: Send | None = None,
) -> list[StepVerdict]:
    """Re-send each recorded request of ``turn`` to the engine and judge its reply."""
    send = send or http_send(engine_url)
    verdicts = []
    for recorded in read_turn(store_path, stream, key, turn):
        status, replayed = send(recorded.request.request_bytes)
        verdicts.append(judge_step(recorded, status, replayed))
    return verdicts


def _tool_results(request: dict[str, Any], tools: Sequence[RecordedTool]) -> tuple[int, int]:
    """How many ``tool`` messages quote a recorded result (same call id, same bytes), and not."""
    recorded = {(t.call.call_id, t.result.result_bytes) for t in tools}
    matched = unmatched = 0
    for message in request.get("messages", []):
        if not isinstance(message, dict) or message.get("role") != "tool":
            continue
        content = message.get("content")
        quoted = (
            message.get("tool_call_id"),
            content.encode() if isinstance(content, str) else None,
        )
        if quoted in recorded:
            matched += 1
        else:
            unmatched += 1
    return matched, unmatched


def _masked(body: bytes, streamed: bool) -> list[Any]:
    """The reply's JSON values with the execution facts of every block set to null."""
    values: list[Any] = []
    if streamed:
        for event in body.split(b"\n\n"):
            try:
                values.append(json.loads(event.removeprefix(b"data: ")))
            except ValueError:
                values.append(event)
    else:
        try:
            values.append(json.loads(body))
        except ValueError:
            values.append(body)
    for value in values:
        facts = value.get("reproducibility") if isinstance(value, dict) else None
        if isinstance(facts, dict):
            for name in EXECUTION_FACTS:
                if name in facts:
                    facts[name] = None
    return values


def _same(flag: bool) -> str:
    return "identical" if flag else "differs"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _failures(verdict: StepVerdict) -> list[str]:
    found = [name for name, ok in (("prompt", verdict.prompt), ("clock", verdict.clock)) if not ok]
    if verdict.reply == "differs":
        found.append("reply")
    if verdict.tool_results_unmatched:
        found.append("tool results")
    return found + list(verdict.notes)
