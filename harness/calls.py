"""Replay for any client: a stream's recorded model calls, one by one, with no turns.

A stream that the official SDKs or an agent framework drove through a session's ``base_url``
has model calls, tool calls and fetches, but no ``turn.started``: there is no harness turn to
re-drive. Its calls are replayed as calls instead, reusing the machinery turns use:

- ``reconstruct_calls`` (no network, no writes): each recorded call's *input* (the bytes the
  client sent) goes through the proxy's own pipeline built in-process over the record
  (``egress_proxy.replay.reconstruct_pipeline``, with the annotation stage). Today's stages
  must regenerate the recorded request bytes (its ``content_key``), prompt digest, clock and
  pins; the record-backed transport serves the recorded reply, whose bytes must match their
  recorded digest; and the annotation a client is handed must name the recorded entries.
- ``reexecute_calls``: a new session, labelled with the stream it replays and armed with its
  whole replay plan (control plane ``ArmReplay``), is sent each recorded input byte for byte;
  the proxy gives each call the recorded pins and clock, sends it to the pinned engine and
  judges the reply (``ReplayPlan.verdict``: prompt, clock, request, reply). The new stream is
  the replay's record. Tool results need no serving here: each recorded request already holds
  them; a client that re-runs its own code uses ``session new --replay-of`` instead.

This module never builds a network transport for reconstruct, and re-execution reaches only
the proxy's data and control planes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from record.cli import counted
from record.digest import Domain, digest
from record.limits import JsonRefused, load_json
from record.schema import ModelRequest, ModelResponse, Strict, TurnStarted
from record.seal import KeyPair

__all__ = [
    "LABEL_REPLAYS_CALLS",
    "CallCheck",
    "CallVerdict",
    "CallsReexecuteReport",
    "CallsReport",
    "UnknownCall",
    "has_turns",
    "model_call_seqs",
    "open_replay_of",
    "reconstruct_calls",
    "reexecute_calls",
    "replay_verdicts",
    "route_of",
]

#: Beside ``affidavit/replays``: which calls of the stream a replay stream re-executes.
LABEL_REPLAYS_CALLS = "affidavit/replays-calls"


class UnknownCall(ValueError):
    """A SEQ that names no recorded ``model.request`` of the stream (a usage error)."""


def has_turns(bodies: Iterable[tuple[int, Strict]]) -> bool:
    return any(isinstance(body, TurnStarted) for _, body in bodies)


def model_call_seqs(bodies: Iterable[tuple[int, Strict]]) -> list[int]:
    """The seq of each recorded model call that was sent (refusals excluded), in order."""
    return [s for s, b in bodies if isinstance(b, ModelRequest) and b.request_bytes]


def _selected(recorded: list[int], seqs: Iterable[int] | None) -> set[int]:
    wanted = set(seqs or ())
    unknown = sorted(wanted - set(recorded))
    if unknown:
        raise UnknownCall(
            f"seq {', '.join(map(str, unknown))} is not a recorded model.request of this "
            f"stream (its model calls: {', '.join(map(str, recorded)) or 'none'})"
        )
    return wanted or set(recorded)


def _word(same: bool) -> str:
    return "identical" if same else "differs"


# -- reconstruct ---------------------------------------------------------------------------------


@dataclass
class CallCheck:
    """One recorded call rebuilt from the record: which of its facts matched."""

    seq: int  # its model.request
    reply_seq: int | None  # its model.response
    route: str
    streamed: bool
    outcome: str
    checks: dict[str, bool] = field(default_factory=dict)
    what: str = ""  # the first fact that differs, in words
    diff: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(self.checks.values())

    def line(self) -> str:
        facts = " · ".join(f"{name} {_word(same)}" for name, same in self.checks.items())
        kind = "streamed" if self.streamed else "json"
        text = f"Reconstruct call seq {self.seq} ({self.route}, {kind}, {self.outcome}): {facts}"
        return text + (f"\n    {self.what}" if self.what else "")

    def json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "reply_seq": self.reply_seq,
            "route": self.route,
            "streamed": self.streamed,
            "outcome": self.outcome,
            "checks": {name: _word(same) for name, same in self.checks.items()},
            "identical": self.ok,
            "what": self.what or None,
            "diff": self.diff or None,
        }


@dataclass
class CallsReport:
    stream: str
    calls: list[CallCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.calls) and all(call.ok for call in self.calls)

    @property
    def first_difference(self) -> CallCheck | None:
        return next((call for call in self.calls if not call.ok), None)

    def summary(self) -> str:
        same = sum(call.ok for call in self.calls)
        if self.ok:
            return (
                f"Calls of {self.stream}: reconstructed exactly: {same} of {len(self.calls)} "
                "calls, request identity and reply bytes, from the record alone"
            )
        first = self.first_difference
        where = f"call seq {first.seq}: {first.what}" if first else "the stream has no model call"
        return (
            f"Calls of {self.stream}: reconstruction FAILED: {same} of {len(self.calls)} calls "
            f"identical; first difference at {where}"
        )

    def json(self) -> dict[str, Any]:
        first = self.first_difference
        return {
            "stream": self.stream,
            "ok": self.ok,
            "calls": [call.json() for call in self.calls],
            "first_difference": None if first is None else first.seq,
            "summary": self.summary(),
        }


def reconstruct_calls(
    store: Path | str,
    stream: str,
    key: KeyPair,
    seqs: Iterable[int] | None = None,
    *,
    bodies: list[tuple[int, Strict]] | None = None,
) -> CallsReport:
    """Rebuild each recorded model call of ``stream`` (those named by ``seqs``, default all)
    from the record: no network, no writes. Every call is driven in record order (a repeated
    request is served its recorded replies in turn); the report holds the selected ones.
    ``UnknownCall`` if a seq names no recorded call."""
    from egress_proxy.replay import read_stream, reconstruct_pipeline

    opened = bodies if bodies is not None else read_stream(store, stream, key)
    selected = _selected(model_call_seqs(opened), seqs)
    rebuilt = reconstruct_pipeline(store, stream, key, bodies=opened, annotated=True)
    report = CallsReport(stream)
    loop = asyncio.new_event_loop()
    try:
        for recorded in list(rebuilt.plan):
            check = loop.run_until_complete(_rebuild_one(rebuilt, recorded))
            if recorded.seq in selected:
                report.calls.append(check)
    finally:
        loop.close()
    return report


async def _rebuild_one(rebuilt: Any, recorded: Any) -> CallCheck:
    from egress_proxy.errors import ReplayMiss, UpstreamError

    body = recorded.body
    assert isinstance(body, ModelRequest)
    reply = recorded.reply if isinstance(recorded.reply, ModelResponse) else None
    streamed = json.loads(body.request_bytes).get("stream") is True
    route = route_of(body.provider.endpoint)
    check = CallCheck(
        recorded.seq, recorded.reply_seq, route, streamed, reply.outcome if reply else "UNKNOWN"
    )
    call = rebuilt.next_call(body.input_bytes)
    try:
        answer = await rebuilt.handler(call)
        data = b"".join([chunk async for chunk in answer.body])
        committed = await answer.committed if answer.committed is not None else None
    except ReplayMiss as exc:
        check.checks["request"] = False
        check.what = f"the rebuilt request is not the recorded one: {exc}"
        check.diff = exc.diff or ""
        return check
    except UpstreamError as exc:  # the record holds no reply: rebuilt as it was, unanswered
        served = rebuilt.transport.last
        check.checks["request"] = served is not None and served.seq == recorded.seq
        check.checks.update(_request_facts(call, body))
        check.checks["reply"] = reply is None or reply.response_bytes is None
        check.what = "" if check.ok else f"{type(exc).__name__}: {exc}"
        return check
    served = rebuilt.transport.last
    check.checks["request"] = (
        served is not None and served.seq == recorded.seq and call.content_key == body.content_key
    )
    check.checks.update(_request_facts(call, body))
    check.checks["reply"] = _reply_matches(reply)
    note = _annotation(data, answer.is_sse)
    if not 200 <= answer.status < 300:  # the proxy annotates only a 2xx reply
        check.checks["annotation"] = note is None
    else:
        check.checks["annotation"] = note is not None and all(
            note.get(name) == want
            for name, want in (
                ("request_seq", recorded.seq),
                ("seq", recorded.reply_seq),
                ("content_key", body.content_key),
                ("prompt_digest", body.prompt_digest),
                ("clock", body.clock),
                ("outcome", reply.outcome if reply else None),
                ("response_digest", reply.response_digest if reply else None),
                ("response_digest", committed.response_digest if committed else None),
            )
        )
    check.what = _first_wrong(check, call, body, reply)
    return check


def _request_facts(call: Any, body: ModelRequest) -> dict[str, bool]:
    return {
        "prompt": call.prompt_digest == body.prompt_digest,
        "clock": call.clock == body.clock,
        "pins": (call.pins or None) == (body.pins or None),
    }


def _reply_matches(reply: ModelResponse | None) -> bool:
    """The recorded reply's bytes hash to their recorded digest (body, or error body)."""
    if reply is None:
        return False
    if reply.outcome == "FAILED":
        error = reply.error_bytes or b""
        return reply.error_digest is None or digest(Domain.ERROR, error) == reply.error_digest
    if reply.response_bytes is None:
        return reply.response_digest is None
    return digest(Domain.RESPONSE, reply.response_bytes) == reply.response_digest


def _first_wrong(
    check: CallCheck, call: Any, body: ModelRequest, reply: ModelResponse | None
) -> str:
    for name, same in check.checks.items():
        if same:
            continue
        if name == "request":
            return f"content_key {call.content_key} is not the recorded {body.content_key}"
        if name == "prompt":
            return f"prompt digest {call.prompt_digest} is not the recorded {body.prompt_digest}"
        if name == "clock":
            return f"clock {call.clock!r} is not the recorded {body.clock!r}"
        if name == "pins":
            return f"pins {call.pins!r} are not the recorded {body.pins!r}"
        if name == "reply":
            return "the recorded reply bytes do not match their recorded digest"
        return "the annotation does not name the recorded entries and digests"
    return ""


def _annotation(data: bytes, streamed: bool) -> dict[str, Any] | None:
    """The proxy's annotation in a delivered reply: a JSON member, an OpenAI chunk with
    ``choices: []``, or an Anthropic / Responses ``event: affidavit``."""
    if not streamed:
        try:
            doc = load_json(data)
        except JsonRefused:  # past the limits: the proxy spliced no annotation into it
            return None
        note = doc.get("affidavit") if isinstance(doc, dict) else None
        return note if isinstance(note, dict) else None
    from egress_proxy.sse import iter_events

    for event in iter_events(data):
        value = event.json()
        if value is None:
            continue
        note = value.get("affidavit") if isinstance(value, dict) else None
        if isinstance(note, dict):  # an OpenAI chunk's member, or the affidavit event's
            return note
    return None


def route_of(endpoint: str) -> str:
    from egress_proxy.providers import DIALECTS

    return next((route for route in DIALECTS if endpoint.endswith(route)), endpoint)


# -- re-execute ----------------------------------------------------------------------------------


@dataclass
class CallVerdict:
    """One recorded call re-sent to the pinned engine, as the proxy judged it."""

    seq: int
    step: int  # its ordinal among the stream's model calls
    prompt: bool
    clock: bool
    request: bool
    reply: bool
    live_calls: int = 0
    first_difference: dict[str, Any] | None = None

    @property
    def identical(self) -> bool:
        return self.prompt and self.clock and self.request and self.reply

    def line(self) -> str:
        text = (
            f"Replay of call seq {self.seq}: prompt {_word(self.prompt)} · injected clock "
            f"{_word(self.clock)} · request {_word(self.request)} · reply {_word(self.reply)} · "
            f"{counted(self.live_calls, 'live call')}"
        )
        d = self.first_difference
        if d:
            text += (
                f"\n    first difference at byte {d['byte']}: recorded {d['recorded']!r}, "
                f"replayed {d['replayed']!r}"
            )
        return text

    def json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "step": self.step,
            "prompt": _word(self.prompt),
            "clock": _word(self.clock),
            "request": _word(self.request),
            "reply": _word(self.reply),
            "live_calls": self.live_calls,
            "first_difference": self.first_difference,
        }


@dataclass
class CallsReexecuteReport:
    stream: str
    replay_stream: str
    pinned: bool
    selected: int = 0
    verdicts: list[CallVerdict] = field(default_factory=list)
    live_calls: int = 0

    @property
    def identical(self) -> bool:
        return (
            len(self.verdicts) == self.selected > 0
            and all(v.identical for v in self.verdicts)
            and self.live_calls == 0
        )

    def summary(self) -> str:
        same = sum(v.identical for v in self.verdicts)
        verdict = "identical" if self.identical else "DIFFERS"
        return (
            f"Calls of {self.stream}: {verdict}: {same} of {counted(self.selected, 'call')} "
            f"identical, {counted(self.live_calls, 'live call')} (replay recorded as stream "
            f"{self.replay_stream})"
        )

    def json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "replay_stream": self.replay_stream,
            "pinned": self.pinned,
            "identical": self.identical,
            "live_calls": self.live_calls,
            "calls": [v.json() for v in self.verdicts],
            "summary": self.summary(),
        }


def reexecute_calls(
    home: Any,
    stream: str,
    *,
    key: KeyPair,
    seqs: Iterable[int] | None = None,
    on_call: Callable[[CallVerdict], None] | None = None,
) -> CallsReexecuteReport:
    """Re-send each recorded model call of ``stream`` (``seqs``, default all) to the pinned
    engine through a new session armed with the stream's plan. Calls before the last
    selected one are re-sent too (the plan is followed in order), but only the selected ones
    are reported. ``UnknownCall`` if a seq names no recorded call."""
    import httpx

    from egress_proxy.sessions import REPLAYS_LABEL
    from harness.reexecute import _recipients, first_difference
    from harness.session import LABEL_API, LABEL_MODEL, control, labels_of, read_bodies

    appliance = home.appliance()
    bodies = read_bodies(appliance.store, stream, key)
    recorded = {s: b for s, b in bodies if isinstance(b, ModelRequest) and b.request_bytes}
    order = model_call_seqs(bodies)
    selected = _selected(order, seqs)
    replies = {b.request_seq: b for _, b in bodies if isinstance(b, ModelResponse)}
    last = max(order.index(s) for s in selected)
    first_pins = _pins_in_force(bodies, order[0])
    labels = labels_of(bodies)
    named = "all" if selected == set(order) else ",".join(map(str, sorted(selected)))
    with control(appliance) as client:
        opened = client.open_session(
            _recipients(bodies, key),
            {
                REPLAYS_LABEL: stream,
                LABEL_REPLAYS_CALLS: named,
                LABEL_API: labels.get(LABEL_API, appliance.api),
                LABEL_MODEL: labels.get(LABEL_MODEL, appliance.model),
            },
            first_pins,
        )
        client.arm_replay(opened.session_id, stream)
    replay = opened.session_id
    report = CallsReexecuteReport(
        stream, replay, all(bool((recorded[s].pins or {}).get("strict_cache")) for s in selected)
    )
    report.selected = len(selected)
    base = opened.base_url.rstrip("/")
    sent: list[tuple[int, int | None]] = []  # (recorded seq, the replay's reply seq)
    with httpx.Client(timeout=600, trust_env=False) as http:
        for seq in order[: last + 1]:
            body = recorded[seq]
            headers = {
                "authorization": f"Bearer {opened.token}",
                "content-type": "application/json",
            }
            if body.provider.api_version:
                headers["anthropic-version"] = body.provider.api_version
            answer = http.post(
                base + route_of(body.provider.endpoint), content=body.input_bytes, headers=headers
            )
            streamed = json.loads(body.request_bytes).get("stream") is True
            note = _annotation(answer.content, streamed)
            sent.append((seq, note.get("seq") if note else None))
    with control(appliance) as client:
        judged = client.get_verdicts(replay)
    verdicts = [json.loads(v) for v in judged.verdicts_json]
    by_step = {int(v["step"]): v for v in verdicts}
    report.live_calls = int(judged.live_calls)
    now: dict[int, ModelResponse] | None = None
    for step, (seq, reply_seq) in enumerate(sent):
        if seq not in selected:
            continue
        v = by_step.get(step)
        if v is None:
            verdict = CallVerdict(seq, step, False, False, False, False)
        else:
            verdict = CallVerdict(
                seq,
                step,
                bool(v.get("prompt_identical")),
                bool(v.get("clock_identical")),
                bool(v.get("request_identical")),
                bool(v.get("reply_identical")),
                int(v.get("live_calls") or 0),
            )
        if not verdict.reply:
            if now is None:
                now = {
                    s: b
                    for s, b in read_bodies(appliance.store, replay, key)
                    if isinstance(b, ModelResponse)
                }
            was = replies.get(seq)
            got = now.get(reply_seq) if reply_seq is not None else None
            verdict.first_difference = first_difference(
                (was.response_bytes or b"") if was else b"",
                (got.response_bytes or b"") if got else b"",
            )
        report.verdicts.append(verdict)
        if on_call is not None:
            on_call(verdict)
    return report


def _pins_in_force(bodies: list[tuple[int, Strict]], seq: int) -> dict[str, Any] | None:
    from record.schema import PinsSet

    pins: dict[str, Any] | None = None
    for at, body in bodies:
        if at >= seq:
            break
        if isinstance(body, PinsSet):
            pins = dict(body.pins) or None
    return pins


def open_replay_of(
    home: Any, source: str, recipients: Iterable[Any] = (), *, policy: Any = None
) -> Any:
    """``session new --replay-of SOURCE``: a new session, labelled with the stream it replays
    and armed with that stream's whole plan. A client's own code then re-runs against it:
    MCP tool results and fetches come from the record (a call it does not hold is refused,
    ``replay_miss``), and each model call goes to the pinned engine with the recorded pins and
    clock and is judged against its recorded twin (the verdict is in the annotation's
    ``replay`` member and in the new stream's ``model.response``). ``KeyError`` when the
    appliance holds no stream ``source``."""
    import grpc

    from egress_proxy.sessions import REPLAYS_LABEL
    from harness.session import control, has_stream, open_session
    from harness.state import SessionUnknown

    store = home.appliance().store
    if not has_stream(store, source):  # before opening: a mistyped id leaves no session
        raise SessionUnknown(f"no session {source!r} to replay in the record {store}")
    state = open_session(
        home, None, list(recipients), policy=policy, labels={REPLAYS_LABEL: source}
    )
    try:
        with control(home.appliance()) as client:
            client.arm_replay(state.session_id, source)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            raise KeyError(f"no stream {source!r} to replay") from None
        raise
    return state


def replay_verdicts(bodies: Iterable[tuple[int, Strict]]) -> list[dict[str, Any]]:
    """The verdicts a replay stream's ``model.response`` entries hold, in order."""
    from egress_proxy.replay_plan import VERDICT_KEY

    found = []
    for seq, body in bodies:
        if isinstance(body, ModelResponse) and body.reproducibility:
            verdict = body.reproducibility.get(VERDICT_KEY)
            if isinstance(verdict, dict):
                found.append({"reply_seq": seq, **verdict})
    return found
