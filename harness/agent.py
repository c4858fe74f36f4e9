"""The agent loop: model → tool calls → results → model … until an answer or the step limit.

The loop talks to the model through its provider's official SDK (``harness.model_api``:
``openai`` or ``anthropic``), at whatever ``base_url`` and HTTP transport it is handed: the
proxy's session path (a live turn, a re-execution), or the proxy's in-process record-backed
pipeline (a reconstruction, the recorded part of a resume).
It never decides how a call is recorded; it does insist that the proxy's annotation says the
reply is committed before it runs any tool the reply asked for.

Steps are numbered from 0 and sent to the proxy in ``x-affidavit-turn``/``x-affidavit-step``
(recorded in the ``model.request``, not part of the request bytes). A ``TurnPolicy`` may fix
``tool_choice`` per step (the demo names ``web_search`` on its first step).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.model_api import ApiError, Completion, ModelApi
from harness.prompt import opening_messages
from harness.tools import ReplayMissed, Toolbox, ToolCallFailed, ToolOutput, ToolSpec
from record.limits import JsonRefused, load_json

__all__ = [
    "Agent",
    "Completion",
    "NeedsDecision",
    "StepRecord",
    "TurnPolicy",
    "TurnResult",
    "TurnStop",
]

TurnOutcome = Literal["ANSWERED", "STEP_LIMIT", "FAILED", "STOPPED", "NEEDS_DECISION"]
ToolChoice = str | dict[str, Any]


@dataclass(frozen=True)
class TurnPolicy:
    """How a turn runs: its step limit and, per step, a fixed ``tool_choice`` (else auto)."""

    max_steps: int = 8
    tool_choice: tuple[ToolChoice, ...] = ()

    def choice(self, step: int) -> ToolChoice:
        return self.tool_choice[step] if step < len(self.tool_choice) else "auto"

    def to_json(self) -> str:
        return json.dumps(
            {"max_steps": self.max_steps, "tool_choice": list(self.tool_choice)},
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | None) -> TurnPolicy:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(int(data.get("max_steps", 8)), tuple(data.get("tool_choice", ())))


@dataclass
class StepRecord:
    step: int
    completion: Completion
    tool_outputs: list[ToolOutput] = field(default_factory=list)


@dataclass
class TurnResult:
    turn: int
    outcome: TurnOutcome
    answer: str
    steps: list[StepRecord]
    detail: str = ""
    pending: dict[str, Any] | None = None  # NEEDS_DECISION: the call that waits


class TurnStop(Exception):
    """Raised by a hook to stop the turn before its next tool call (outcome ``STOPPED``)."""


class NeedsDecision(Exception):
    """A tool call's outcome is unknown and it may not be repeated: a person must decide."""

    def __init__(self, message: str, pending: dict[str, Any]) -> None:
        super().__init__(message)
        self.pending = pending


class StepFailed(Exception):
    """A model step that got no committed reply (the SDK's error is the cause)."""


Phase = Callable[[str], None]


def _no_phase(_: str) -> None:
    return None


@dataclass
class Agent:
    api: ModelApi  # the SDK the provider speaks (``harness.model_api``)
    model: str
    tools: Toolbox
    catalogue: Sequence[ToolSpec]
    policy: TurnPolicy = field(default_factory=TurnPolicy)
    #: Called with each committed reply; may raise ``TurnStop`` (re-execute on divergence).
    after_reply: Callable[[int, Completion], None] | None = None
    on_phase: Phase = _no_phase

    def run_turn(
        self, turn: int, history: Sequence[tuple[str, str]], user_input: str
    ) -> TurnResult:
        messages = opening_messages(history, user_input)
        by_name = {spec.name: spec for spec in self.catalogue}
        steps: list[StepRecord] = []
        content = ""
        for step in range(self.policy.max_steps):
            self.on_phase(f"model_call step={step}")
            try:
                done = self._complete(turn, step, messages)
            except StepFailed as exc:
                return TurnResult(turn, "FAILED", content, steps, f"step {step}: {exc}")
            record = StepRecord(step, done)
            steps.append(record)
            self.on_phase(f"model_committed step={step}")
            content = done.content
            if self.after_reply is not None:
                try:
                    self.after_reply(step, done)
                except TurnStop as exc:
                    return TurnResult(turn, "STOPPED", content, steps, str(exc))
            if not done.tool_calls:
                choice = self.policy.choice(step) if self.catalogue else "none"
                if done.finish_reason == "length" and choice not in ("auto", "none"):
                    cut = f"step {step}: max_tokens cut the reply before its tool call was whole"
                    return TurnResult(turn, "FAILED", content, steps, cut)
                return TurnResult(turn, "ANSWERED", content, steps)
            reply_seq = int((done.annotation or {})["seq"])
            results: list[tuple[str, ToolOutput]] = []
            for index, (call_id, name, arguments) in enumerate(done.tool_calls):
                self.on_phase(f"tool_call step={step} call={index}")
                try:
                    output = self._tool(by_name.get(name), name, arguments, reply_seq, call_id)
                except NeedsDecision as exc:
                    pending = {**exc.pending, "step": step, "call_id": call_id, "tool": name}
                    return TurnResult(turn, "NEEDS_DECISION", content, steps, str(exc), pending)
                except (TurnStop, ReplayMissed) as exc:
                    return TurnResult(turn, "STOPPED", content, steps, str(exc))
                record.tool_outputs.append(output)
                self.on_phase(f"tool_done step={step} call={index}")
                results.append((call_id, output))
            messages += self.api.reply_messages(done, results)
        return TurnResult(turn, "STEP_LIMIT", content, steps, f"{self.policy.max_steps} steps")

    # -- one model step --------------------------------------------------------------------

    def _complete(self, turn: int, step: int, messages: list[dict[str, Any]]) -> Completion:
        headers = {"x-affidavit-turn": str(turn), "x-affidavit-step": str(step)}
        try:
            done = self.api.complete(
                self.model, messages, self.catalogue, self.policy.choice(step), headers
            )
        except ApiError as exc:
            raise StepFailed(str(exc)) from exc
        note = done.annotation
        if (
            note is None
            or note.get("outcome") != "COMMITTED"
            or not isinstance(note.get("seq"), int)
        ):
            # Without the proxy's word that the reply is durable no tool may run on it.
            raise StepFailed("the proxy did not confirm the reply was committed")
        return done

    # -- one tool call ---------------------------------------------------------------------

    def _tool(
        self, spec: ToolSpec | None, name: str, arguments: str, reply_seq: int, call_id: str
    ) -> ToolOutput:
        if spec is None:
            return ToolOutput(f"there is no tool named {name!r}", "FAILED")
        try:
            parsed = load_json(arguments or "{}")
        except JsonRefused:
            return ToolOutput(f"the arguments are not JSON: {arguments[:80]!r}", "FAILED")
        if not isinstance(parsed, dict):
            return ToolOutput("the arguments must be a JSON object", "FAILED")
        data = json.dumps(parsed, separators=(",", ":"), sort_keys=True).encode()
        try:
            return self.tools.call(spec, data, reply_seq=reply_seq, call_id=call_id)
        except ToolCallFailed as exc:
            if exc.outcome != "UNKNOWN":
                return ToolOutput(str(exc), "FAILED")
            if not spec.idempotent:
                raise NeedsDecision(
                    f"{name}: the outcome is unknown and the tool is not idempotent",
                    {"reason": str(exc)},
                ) from exc
        # Idempotent and unknown: once more, with the same idempotency key (the call id).
        try:
            return self.tools.call(spec, data, reply_seq=reply_seq, call_id=call_id)
        except ToolCallFailed as exc:
            raise NeedsDecision(f"{name}: no outcome after a retry", {"reason": str(exc)}) from exc
