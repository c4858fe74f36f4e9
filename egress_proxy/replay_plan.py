"""Re-execute: a replay plan armed on a live session (``SessionRegistry.arm_replay``).

The plan is read from the recorded stream it replays, opened with the appliance key (a
recipient of every stream). Per model step it holds the recorded call (pins, clock, prompt
digest, request and reply); per tool call, the recorded result, served by a
``RecordTransport``. In an armed session tool calls are answered from the plan and never
reach a tool transport; model calls go to the engine, and each step gets a verdict
(``verdict``) recorded beside its reply. Nothing here dials or imports an HTTP client.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from egress_proxy.errors import ReplayMiss
from egress_proxy.transports.recorded import RecordedCall, RecordIndex, RecordTransport
from record.digest import Domain, digest
from record.log import Log
from record.reader import StreamKeys
from record.schema import (
    FetchResponse,
    ModelRequest,
    ModelResponse,
    PinsSet,
    Strict,
    ToolResult,
    TurnEnded,
    TurnStarted,
)
from record.schema import parse_entry as parse_line
from record.seal import KeyPair

__all__ = ["VERDICT_KEY", "ReplayPlan", "load_plan", "turn_bodies"]

#: Where a replayed step's verdict sits in its ``ModelResponse.reproducibility``.
VERDICT_KEY = "affidavit_replay_verdict"


@dataclass
class ReplayPlan:
    """What an armed session is served from, and the verdicts it has earned so far."""

    source: str  # the recorded stream this session replays
    transport: RecordTransport
    steps: list[RecordedCall]  # the recorded model calls, in record order
    result_seqs: dict[int, int]  # recorded tool.call seq -> its tool.result seq
    position: int = 0
    tools_replayed: int = 0
    live_calls: int = 0  # tool or fetch calls that went live under this plan: stays 0
    verdicts: list[dict[str, JsonValue]] = field(default_factory=list)
    pins_override: dict[str, JsonValue] | None = None  # replaces each step's recorded pins
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def next_step(self, url: str, model: str, input_bytes: bytes) -> tuple[int, RecordedCall]:
        """The next recorded model step (its ordinal and call); ``ReplayMiss`` past the end."""
        with self._lock:
            if self.position >= len(self.steps):
                raise self.transport.index.miss("model", url, model, input_bytes)
            ordinal = self.position
            self.position += 1
            return ordinal, self.steps[ordinal]

    def tool_result(self, server: str, tool: str, arguments: bytes) -> tuple[ToolResult, int]:
        """The recorded result of this tool call and its seq; ``ReplayMiss`` if not held."""
        with self._lock:
            recorded = self.transport.tool_result(server, tool, arguments)
            result = recorded.reply
            if not isinstance(result, ToolResult):
                raise ReplayMiss(
                    f"the recorded tool call at seq {recorded.seq} has no recorded result",
                    nearest=recorded,
                )
            self.tools_replayed += 1
            return result, self.result_seqs[recorded.seq]

    def fetch_result(self, url: str, request_bytes: bytes) -> tuple[FetchResponse, int]:
        """The recorded answer to this exact fetch and its seq; ``ReplayMiss`` if not held."""
        with self._lock:
            recorded = self.transport.fetch_result(url, request_bytes)
            result = recorded.reply
            if not isinstance(result, FetchResponse) or recorded.reply_seq is None:
                raise ReplayMiss(
                    f"the recorded fetch at seq {recorded.seq} has no recorded response",
                    nearest=recorded,
                )
            self.tools_replayed += 1
            return result, recorded.reply_seq

    def verdict(
        self,
        ordinal: int,
        step: RecordedCall,
        *,
        prompt_digest: str | None,
        clock: str | None,
        content_key: str | None,
        reply: bytes,
        status: int,
    ) -> dict[str, JsonValue]:
        """The step's verdict: what matched its recorded twin; kept in ``verdicts``."""
        body = step.body
        assert isinstance(body, ModelRequest)
        recorded = step.reply
        recorded_digest = recorded.response_digest if isinstance(recorded, ModelResponse) else None
        reply_digest = digest(Domain.RESPONSE, reply)
        with self._lock:
            result: dict[str, JsonValue] = {
                "replays": self.source,
                "step": ordinal,
                "recorded_request_seq": step.seq,
                "prompt_identical": prompt_digest == body.prompt_digest,
                "clock_identical": clock == body.clock,
                "request_identical": content_key == body.content_key,
                "reply_identical": recorded_digest is not None
                and 200 <= status < 300
                and reply_digest == recorded_digest,
                "recorded_response_digest": recorded_digest,
                "response_digest": reply_digest,
                "tools_replayed": self.tools_replayed,
                "live_calls": self.live_calls,
            }
            self.verdicts.append(result)
        return result

    def catch_up(self, bodies: Sequence[tuple[int, Strict]]) -> None:
        """After a restart: take up where the armed session's own stream shows the plan was.

        ``bodies`` are the session's opened entries (its ``model.request``, ``model.response``,
        ``tool.result`` and ``fetch.response`` at least): each model request sent under the
        plan took one step, each verdict is in its reply, and each tool result or fetch
        answer served from the plan names the recorded one (``replayed_from``)."""
        by_reply = {
            call.reply_seq: call
            for call in self.transport.index.calls
            if call.kind in ("tool", "fetch") and call.reply_seq is not None
        }
        with self._lock:
            for _, body in bodies:
                if isinstance(body, ModelRequest) and body.request_bytes:  # not a refusal
                    self.position = min(self.position + 1, len(self.steps))
                elif isinstance(body, ModelResponse):
                    verdict = (body.reproducibility or {}).get(VERDICT_KEY)
                    if isinstance(verdict, dict):
                        self.verdicts.append(verdict)
                elif (
                    isinstance(body, ToolResult | FetchResponse) and body.replayed_from is not None
                ):
                    served = by_reply.get(body.replayed_from)
                    if served is not None:
                        index = self.transport.index
                        index.take(
                            served.kind, served.server, served.name, served.digest, served.request
                        )
                        self.tools_replayed += 1

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {
                "replays": self.source,
                "model_steps": len(self.steps),
                "steps_run": self.position,
                "tools_replayed": self.tools_replayed,
                "live_calls": self.live_calls,
                "verdicts": list(self.verdicts),
            }


def turn_bodies(bodies: list[tuple[int, Strict]], turn: int) -> list[tuple[int, Strict]]:
    """The entries of one turn: from its ``turn.started`` to its ``turn.ended`` (or the end
    of the stream), preceded by the ``pins.set`` entries in force when it started.
    ``KeyError`` if the stream has no such turn."""
    start = next(
        (i for i, (_, b) in enumerate(bodies) if isinstance(b, TurnStarted) and b.turn == turn),
        None,
    )
    if start is None:
        raise KeyError(f"the stream has no turn {turn}")
    end = next(
        (
            i + 1
            for i in range(start, len(bodies))
            if isinstance(bodies[i][1], TurnEnded) and bodies[i][1].turn == turn  # type: ignore[attr-defined]
        ),
        len(bodies),
    )
    pins = [pair for pair in bodies[:start] if isinstance(pair[1], PinsSet)]
    return pins + bodies[start:end]


def load_plan(log: Log, source: str, key: KeyPair, turn: int | None = None) -> ReplayPlan:
    """The plan for ``source`` (only its turn ``turn`` when given), read from ``log``'s store
    and opened with ``key``."""
    entries = [parse_line(stored.line) for stored in log.store.entries(source, 0, None)]
    if not entries:
        raise KeyError(f"no stream {source!r}")
    keys = StreamKeys.collect(source, entries, key)
    bodies = [(entry.seq, keys.open(entry)) for entry in entries]
    if turn is not None:
        bodies = turn_bodies(bodies, turn)
    result_seqs = {body.call_seq: seq for seq, body in bodies if isinstance(body, ToolResult)}
    index = RecordIndex.from_bodies(bodies)
    return ReplayPlan(source, RecordTransport(index), index.of_kind("model"), result_seqs)
