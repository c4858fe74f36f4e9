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
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from egress_proxy.errors import ReplayMiss
from egress_proxy.transports.recorded import RecordedCall, RecordIndex, RecordTransport
from record.digest import Domain, digest
from record.log import Log
from record.reader import StreamKeys
from record.schema import ModelRequest, ModelResponse, ToolResult
from record.schema import parse_entry as parse_line
from record.seal import KeyPair

__all__ = ["VERDICT_KEY", "ReplayPlan", "load_plan"]

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


def load_plan(log: Log, source: str, key: KeyPair) -> ReplayPlan:
    """The plan for ``source``, read from ``log``'s store and opened with ``key``."""
    entries = [parse_line(stored.line) for stored in log.store.entries(source, 0, None)]
    if not entries:
        raise KeyError(f"no stream {source!r}")
    keys = StreamKeys.collect(source, entries, key)
    bodies = [(entry.seq, keys.open(entry)) for entry in entries]
    result_seqs = {body.call_seq: seq for seq, body in bodies if isinstance(body, ToolResult)}
    index = RecordIndex.from_bodies(bodies)
    return ReplayPlan(source, RecordTransport(index), index.of_kind("model"), result_seqs)
