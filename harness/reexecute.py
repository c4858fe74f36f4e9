"""Re-execute: run a recorded turn again against the pinned engine, tools from the record.

The harness opens a new session at the live proxy, labelled with the stream and turn it
replays, and arms it (control plane ``ArmReplay``) with that turn's replay plan. Then the
agent loop runs the recorded input against it: each model call goes to the engine with the
recorded pins and clock, and the proxy judges its reply against the recorded one (verdict
in the annotation and in the new stream's ``model.response``); every tool call and fetch is
served by the proxy from the plan, never live. On the first reply that differs the harness
stops before any tool call, and the verdict names the first differing byte and token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.agent import Agent, Completion, TurnPolicy, TurnStop
from harness.model_api import model_api
from harness.reconstruct import turn_setup
from harness.session import (
    LABEL_API,
    LABEL_MODEL,
    LABEL_POLICY,
    LABEL_SEARCH,
    append_event,
    control,
    read_bodies,
    read_linked,
    turn_states,
)
from harness.state import Home, HomeMissing, SessionState
from harness.tools import ProxyToolbox
from record.cli import counted
from record.digest import Domain, digest
from record.schema import (
    KeyRotated,
    ModelRequest,
    ModelResponse,
    PinsSet,
    StreamOpened,
    Strict,
    TurnEnded,
    TurnStarted,
)
from record.seal import KeyPair, RecipientKey

__all__ = [
    "LABEL_REPLAYS",
    "LABEL_REPLAYS_TURN",
    "ReexecuteReport",
    "StepVerdict",
    "pins_before",
    "reexecute_turn",
]

LABEL_REPLAYS = "affidavit/replays"  # the proxy's ``REPLAYS_LABEL``
LABEL_REPLAYS_TURN = "affidavit/replays-turn"


@dataclass
class StepVerdict:
    turn: int
    step: int
    prompt: bool
    clock: bool
    request: bool
    reply: bool
    tools_replayed: int = 0
    live_calls: int = 0
    first_difference: dict[str, Any] | None = None

    def line(self) -> str:
        def word(same: bool) -> str:
            return "identical" if same else "differs"

        text = (
            f"Replay of turn {self.turn}, step {self.step}: prompt {word(self.prompt)} · "
            f"injected clock {word(self.clock)} · request {word(self.request)} · "
            f"reply {word(self.reply)} · {counted(self.tools_replayed, 'tool result')} replayed "
            f"from the record · {counted(self.live_calls, 'live call')}"
        )
        if self.first_difference:
            d = self.first_difference
            text += (
                f"\n    first difference at byte {d['byte']}: recorded {d['recorded']!r}, "
                f"replayed {d['replayed']!r}; "
            )
            if d["token"] is None:
                text += "the generated tokens are identical (the bytes differ around them)"
            else:
                text += (
                    f"token {d['token']}: recorded {d['recorded_token']!r}, "
                    f"replayed {d['replayed_token']!r}"
                )
        return text

    def json(self) -> dict[str, Any]:
        def word(same: bool) -> str:
            return "identical" if same else "differs"

        return {
            "step": self.step,
            "prompt": word(self.prompt),
            "clock": word(self.clock),
            "request": word(self.request),
            "reply": word(self.reply),
            "tools_replayed": self.tools_replayed,
            "live_calls": self.live_calls,
            "first_difference": self.first_difference,
        }


@dataclass
class ReexecuteReport:
    stream: str
    turn: int
    replay_stream: str
    recorded_steps: int
    pinned: bool
    verdicts: list[StepVerdict] = field(default_factory=list)
    outcome: str = ""
    live_calls: int = 0
    stopped: str = ""

    @property
    def identical(self) -> bool:
        return (
            len(self.verdicts) == self.recorded_steps
            and all(v.prompt and v.clock and v.request and v.reply for v in self.verdicts)
            and self.live_calls == 0
        )

    def summary(self) -> str:
        same = sum(v.prompt and v.clock and v.request and v.reply for v in self.verdicts)
        replayed = sum(v.tools_replayed for v in self.verdicts)
        verdict = "identical" if self.identical else "DIFFERS"
        text = (
            f"Turn {self.turn} of {self.stream}: {verdict}: {same} of {self.recorded_steps} "
            f"steps identical, {counted(replayed, 'tool result')} replayed from the record, "
            f"{counted(self.live_calls, 'live call')} (replay recorded as stream "
            f"{self.replay_stream})"
        )
        return text + (f"; stopped: {self.stopped}" if self.stopped else "")

    def json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "turn": self.turn,
            "replay_stream": self.replay_stream,
            "pinned": self.pinned,
            "identical": self.identical,
            "recorded_steps": self.recorded_steps,
            "live_calls": self.live_calls,
            "stopped": self.stopped or None,
            "steps": [v.json() for v in self.verdicts],
            "summary": self.summary(),
        }


def reexecute_turn(
    home: Home,
    stream: str,
    turn: int,
    *,
    key: KeyPair,
    on_step: Callable[[StepVerdict], None] | None = None,
    pins_override: dict[str, Any] | None = None,
) -> ReexecuteReport:
    """Re-execute turn ``turn`` of ``stream`` through the running appliance. ``on_step`` gets
    each step's verdict once its tools have run; ``pins_override`` replaces the recorded pins
    (a negative control: its verdicts say what the pins change)."""
    appliance = home.appliance()
    view = read_linked(appliance.store, stream, key)
    bodies = view.bodies
    text, past, labels, catalogue, _, _ = turn_setup(bodies, turn)
    began = next(t.started_seq for t in turn_states(bodies) if t.turn == turn)
    if began < view.offset:  # this appliance's proxy cannot read the older stream's record
        raise HomeMissing(
            f"turn {turn} of {stream} began in {view.streams[-2]}, on another appliance: "
            "re-executing it needs that appliance's proxy; reconstruct it here with "
            f"`affidavit replay {stream} {turn} --reconstruct`"
        )
    recorded = _recorded_steps(bodies, turn)
    pins = pins_before(bodies, turn)
    with control(appliance) as client:
        opened = client.open_session(
            # whoever can read the stream the turn is in (not the older ones it continues)
            _recipients([(s, b) for s, b in bodies if s >= view.offset], key),
            {
                LABEL_REPLAYS: stream,
                LABEL_REPLAYS_TURN: str(turn),
                LABEL_API: labels.get(LABEL_API, appliance.api),
                LABEL_MODEL: labels.get(LABEL_MODEL, appliance.model),
                LABEL_POLICY: labels.get(LABEL_POLICY, TurnPolicy().to_json()),
                # the proxy admits a web_search fetch by the session's search endpoint
                **({LABEL_SEARCH: labels[LABEL_SEARCH]} if LABEL_SEARCH in labels else {}),
            },
            pins,
        )
        client.arm_replay(opened.session_id, stream, turn=turn, pins=pins_override)
    state = SessionState(opened.session_id, opened.token, opened.base_url, pins)
    replay = opened.session_id
    report = ReexecuteReport(
        stream, turn, replay, len(recorded), bool(pins and pins.get("strict_cache"))
    )
    data = text.encode("utf-8", "surrogateescape")
    append_event(
        home,
        replay,
        TurnStarted(turn=turn, input_bytes=data, input_digest=digest(Domain.INPUT, data)),
    )
    toolbox = ProxyToolbox(state.base_url, state.token, search_url=labels.get(LABEL_SEARCH))
    api = model_api(labels.get(LABEL_API, appliance.api), state.base_url, state.token)
    pending: list[StepVerdict] = []

    def judged(step: int, done: Completion) -> None:
        flush()
        note = (done.annotation or {}).get("replay") or {}
        verdict = StepVerdict(
            turn,
            step,
            bool(note.get("prompt_identical")),
            bool(note.get("clock_identical")),
            bool(note.get("request_identical")),
            bool(note.get("reply_identical")),
            live_calls=int(note.get("live_calls") or 0),
        )
        report.verdicts.append(verdict)
        pending.append(verdict)
        if not verdict.reply:
            now = _response_bytes(home, replay, key, int((done.annotation or {})["seq"]))
            was = recorded[step][1] if step < len(recorded) else b""
            verdict.first_difference = first_difference(was, now)
            flush()
            raise TurnStop(f"step {step}: the reply differs; no tool call is made on it")

    def flush() -> None:
        while pending:
            verdict = pending.pop(0)
            if on_step is not None:
                on_step(verdict)

    def phase(name: str) -> None:
        if name.startswith("tool_done") and report.verdicts:
            report.verdicts[-1].tools_replayed += 1  # served by the proxy from the plan

    agent = Agent(
        api,
        labels.get(LABEL_MODEL, appliance.model),
        toolbox,
        catalogue,
        TurnPolicy.from_json(labels.get(LABEL_POLICY)),
        after_reply=judged,
        on_phase=phase,
    )
    try:
        result = agent.run_turn(turn, past, text)
    finally:
        toolbox.close()
        api.close()
    flush()
    report.outcome = result.outcome
    if result.outcome == "STOPPED" or result.outcome == "FAILED":
        report.stopped = result.detail
    with control(appliance) as client:
        verdicts = client.get_verdicts(replay)
    report.live_calls = int(verdicts.live_calls)
    answer = result.answer.encode("utf-8", "surrogateescape")
    ended_outcome = (
        result.outcome
        if result.outcome in ("ANSWERED", "STEP_LIMIT", "FAILED", "STOPPED")
        else "STOPPED"
    )
    append_event(
        home,
        replay,
        TurnEnded(
            turn=turn,
            outcome=ended_outcome,
            answer_bytes=answer,
            answer_digest=digest(Domain.RESPONSE, answer),
        ),
    )
    return report


def _recipients(bodies: list[tuple[int, Strict]], key: KeyPair) -> list[RecipientKey]:
    """Whoever could read the replayed stream can read its replay (and the opener)."""
    keys = {key.recipient.text(): key.recipient}
    for _, body in bodies:
        if isinstance(body, StreamOpened | KeyRotated):
            for wrapped in body.recipients:
                keys.setdefault(wrapped.recipient, RecipientKey.from_text(wrapped.recipient))
    return list(keys.values())


def _recorded_steps(bodies: list[tuple[int, Strict]], turn: int) -> list[tuple[int, bytes]]:
    """(request seq, recorded response bytes) of each model step of the turn."""
    from egress_proxy.replay_plan import turn_bodies

    sliced = turn_bodies(bodies, turn)
    replies = {b.request_seq: b for _, b in sliced if isinstance(b, ModelResponse)}
    steps = []
    for seq, body in sliced:
        if isinstance(body, ModelRequest) and body.request_bytes:
            reply = replies.get(seq)
            steps.append((seq, (reply.response_bytes or b"") if reply else b""))
    return steps


def pins_before(bodies: list[tuple[int, Strict]], turn: int) -> dict[str, Any] | None:
    """The session's pins in force when turn ``turn`` started (None: unpinned)."""
    pins: dict[str, Any] | None = None
    for _, body in bodies:
        if isinstance(body, PinsSet):
            pins = dict(body.pins) or None
        elif isinstance(body, TurnStarted) and body.turn == turn:
            break
    return pins


def _response_bytes(home: Home, stream: str, key: KeyPair, seq: int) -> bytes:
    for at, body in read_bodies(home.appliance().store, stream, key):
        if at == seq and isinstance(body, ModelResponse):
            return body.response_bytes or b""
    return b""


def _pieces(data: bytes) -> list[str]:
    """The reply's tokens as streamed: each content or tool-argument delta, in order."""
    from egress_proxy.sse import iter_events

    pieces: list[str] = []
    for raw in iter_events(data):
        event = raw.json()
        if event is None:
            continue
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                pieces.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                if function.get("arguments"):
                    pieces.append(function["arguments"])
    return pieces


def first_difference(recorded: bytes, replayed: bytes) -> dict[str, Any]:
    """Where two replies part: the first differing byte, and the first differing token."""
    at = next(
        (i for i, (a, b) in enumerate(zip(recorded, replayed, strict=False)) if a != b),
        min(len(recorded), len(replayed)),
    )
    was, now = _pieces(recorded), _pieces(replayed)
    token: int | None = next(
        (i for i, (a, b) in enumerate(zip(was, now, strict=False)) if a != b),
        None if len(was) == len(now) else min(len(was), len(now)),
    )  # None: the generated text is the same; the bytes differ elsewhere (ids, usage)
    return {
        "byte": at,
        "recorded": recorded[max(0, at - 8) : at + 24].decode("utf-8", "replace"),
        "replayed": replayed[max(0, at - 8) : at + 24].decode("utf-8", "replace"),
        "token": token,
        "recorded_token": was[token] if token is not None and token < len(was) else None,
        "replayed_token": now[token] if token is not None and token < len(now) else None,
    }
