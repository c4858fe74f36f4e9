"""Resume: finish a turn that was interrupted, without repeating anything already done.

The harness runs the turn's loop again from its recorded input. Model steps whose reply is
committed in the record are served from it through the proxy's in-process record-backed
pipeline (the harness must still generate the recorded request: a change is a loud failure,
never a silent re-send); the first step without a committed reply goes live, and so does
every step after it. Tool calls are matched by their derived call id: a committed or failed
result is served from the record; an unknown outcome is re-sent only if the recorded call
says the tool is idempotent (with the same idempotency key, the call id), or a person decided
``retry``; otherwise the turn stops as ``needs_decision`` until ``resume --decide``. Web
fetches are served from the record when their URL was fetched and answered in this turn.

Before anything, resume waits until every request in the stream has its answer recorded:
the proxy finishes a call whose client was killed, so a reply still streaming is not lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx2

from egress_proxy.fetch import recorded_fetch
from harness.agent import Agent, NeedsDecision, TurnPolicy, TurnResult
from harness.continuation import CannotContinue
from harness.model_api import model_api
from harness.reconstruct import turn_setup
from harness.session import (
    LABEL_API,
    LABEL_MODEL,
    LABEL_POLICY,
    append_event,
    finish_turn,
    has_stream,
    keep_annotation_checkpoints,
    turn_states,
    user_key,
    wait_settled,
)
from harness.state import Home, HomeMissing, SessionUnknown
from harness.tools import (
    ProxyToolbox,
    ReplayMissed,
    ToolOutput,
    ToolSpec,
    fetch_body,
    fetch_text,
    recorded_output,
)
from record.schema import (
    FetchRequest,
    FetchResponse,
    ModelRequest,
    ModelResponse,
    Strict,
    ToolCall,
    ToolResult,
    TurnDecided,
)
from record.seal import KeyPair

__all__ = [
    "NotWaiting",
    "ResumeOutcome",
    "UnsendableCall",
    "decide",
    "resume_session",
    "stopped_at",
]

Decision = Literal["retry", "skip", "abort"]


class UnsendableCall(CannotContinue):
    """A call of a reply served from an older stream, with no answer there: this appliance's
    proxy admits only calls its own stream's replies asked for (exit 1)."""

    def __init__(self, message: str, tool: str, call_id: str) -> None:
        super().__init__(message)
        self.tool, self.call_id = tool, call_id


class NotWaiting(ValueError):
    """``--decide`` for a session that waits for no decision (a usage error)."""


@dataclass
class ResumeOutcome:
    turn: int | None  # None: nothing to resume
    result: TurnResult | None
    served_steps: int = 0  # model steps served from the record
    live_steps: int = 0
    served_tools: int = 0
    live_tools: int = 0


class _ResumeTransport(httpx2.BaseTransport):
    """Recorded committed steps from the in-process pipeline; the rest through the proxy."""

    def __init__(self, pipeline: Any, base_url: str, token: str) -> None:
        import asyncio

        self.pipeline = pipeline
        self.loop = asyncio.new_event_loop()
        self.live_http = httpx2.Client(timeout=600, trust_env=False)
        self.base_url, self.token = base_url.rstrip("/"), token
        self.position = 0
        self.live = False
        self.served = 0
        self.sent_live = 0

    def _committed(self, k: int) -> bool:
        plan = self.pipeline.plan
        if k >= len(plan):
            return False
        reply = plan[k].reply
        return isinstance(reply, ModelResponse) and reply.outcome == "COMMITTED"

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        from egress_proxy.errors import ReplayMiss

        body = request.read()
        k = self.position
        self.position += 1
        if not self.live and self._committed(k):
            try:
                reply, data = self.loop.run_until_complete(self.pipeline.run(body))
            except ReplayMiss as exc:
                return httpx2.Response(409, content=exc.body())
            self.served += 1
            kind = "text/event-stream" if reply.is_sse else "application/json"
            return httpx2.Response(reply.status, content=data, headers={"content-type": kind})
        self.live = True
        self.sent_live += 1
        headers = {
            "authorization": f"Bearer {self.token}",
            "content-type": "application/json",
            **{k: v for k, v in request.headers.items() if k.startswith("x-affidavit-")},
        }
        url = self.base_url + request.url.path[request.url.path.index("/v1/") :]
        answer = self.live_http.post(url, content=body, headers=headers)
        return httpx2.Response(
            answer.status_code,
            content=answer.content,
            headers={"content-type": answer.headers.get("content-type", "application/json")},
        )

    def close(self) -> None:
        self.loop.close()
        self.live_http.close()


class _ResumeToolbox:
    """Recorded outcomes first (by call id, or URL for fetches); only the rest goes live."""

    def __init__(
        self,
        live: ProxyToolbox,
        sliced: list[tuple[int, Strict]],
        search_url: str | None,
        *,
        refuse_live: Callable[[], bool] | None = None,
        older: str | None = None,
    ) -> None:
        self.live = live
        self.search_url = search_url
        self.refuse_live = refuse_live  # True while the replies come from an older stream
        self.older = older
        results = {b.call_seq: b for _, b in sliced if isinstance(b, ToolResult)}
        self.calls = {
            b.call_id: (seq, b, results.get(seq)) for seq, b in sliced if isinstance(b, ToolCall)
        }
        answers = {b.request_seq: b for _, b in sliced if isinstance(b, FetchResponse)}
        #: fetches admitted as a call (``fetch.request`` names it), by call id
        self.fetched = {
            b.call_id: answers.get(seq)
            for seq, b in sliced
            if isinstance(b, FetchRequest) and b.call_id
        }
        #: fetches recorded before fetches named their call: matched by URL
        self.fetches = [
            (b.url, answers.get(seq))
            for seq, b in sliced
            if isinstance(b, FetchRequest) and b.reply_seq is None and b.call_id is None
        ]
        self.decisions = {b.call_seq: b.decision for _, b in sliced if isinstance(b, TurnDecided)}
        self.served = 0
        self.sent_live = 0

    def call(self, spec: ToolSpec, arguments: bytes, *, reply_seq: int, call_id: str) -> ToolOutput:
        if spec.kind in ("fetch", "search"):
            answered = self.fetched.get(call_id)
            if answered is not None and answered.outcome != "UNKNOWN":
                self.served += 1  # served once, whatever its outcome: the proxy sends no more
                return fetch_text(*recorded_fetch(answered))
            url = json.loads(fetch_body(spec, json.loads(arguments), self.search_url))["url"]
            for index, (seen, answer) in enumerate(self.fetches):
                if seen == url and answer is not None and answer.outcome == "COMMITTED":
                    del self.fetches[index]
                    self.served += 1
                    return fetch_text(*recorded_fetch(answer))
            return self._live(spec, arguments, reply_seq, call_id)
        recorded = self.calls.get(call_id)
        if recorded is None:
            return self._live(spec, arguments, reply_seq, call_id)
        seq, call, result = recorded
        if call.tool != spec.tool or call.server != spec.server:
            raise ReplayMissed(
                f"call {call_id} was recorded as {call.server}/{call.tool} (seq {seq}), "
                f"the harness now calls {spec.server}/{spec.tool}"
            )
        if result is not None and result.outcome != "UNKNOWN":
            self.served += 1
            return recorded_output(result)
        decision = self.decisions.get(seq)
        if decision == "skip":
            return ToolOutput(
                "this call was skipped by a person's decision; its outcome is unknown", "FAILED"
            )
        if decision == "retry" or call.idempotent:
            return self._live(spec, arguments, reply_seq, call_id)
        raise NeedsDecision(
            f"{spec.name}: call {call_id} (seq {seq}) has no known outcome and the tool is "
            "not idempotent",
            {"call_seq": seq},
        )

    def _live(self, spec: ToolSpec, arguments: bytes, reply_seq: int, call_id: str) -> ToolOutput:
        if self.refuse_live is not None and self.refuse_live():
            raise UnsendableCall(
                f"{spec.name}: call {call_id} was asked by a reply recorded in {self.older} "
                "and has no answer there; this appliance can only send calls its own stream's "
                "replies asked for. Nothing was sent or recorded; the turn can only be given up",
                spec.name,
                call_id,
            )
        self.sent_live += 1
        return self.live.call(spec, arguments, reply_seq=reply_seq, call_id=call_id)


def _committed_only(bodies: list[tuple[int, Strict]]) -> list[tuple[int, Strict]]:
    """The record less every model call whose reply is not ``COMMITTED`` (and that reply)."""
    committed = {
        b.request_seq
        for _, b in bodies
        if isinstance(b, ModelResponse) and b.outcome == "COMMITTED"
    }
    dropped = {s for s, b in bodies if isinstance(b, ModelRequest) and s not in committed}
    return [
        (s, b)
        for s, b in bodies
        if s not in dropped and not (isinstance(b, ModelResponse) and b.request_seq in dropped)
    ]


def stopped_at(bodies: list[tuple[int, Strict]]) -> tuple[int, str] | None:
    """The last turn, if it did not end, and where it stopped as the record tells it
    (``after step 0 (model reply committed, nothing after it)``); printed after Ctrl-C."""
    states = turn_states(bodies)
    if not states or states[-1].ended is not None:
        return None
    turn = states[-1]
    step, where = -1, "before its first model call"
    names: dict[int, str] = {}
    for seq, body in bodies:
        if seq <= turn.started_seq:
            continue
        if isinstance(body, ModelRequest):
            step += 1
            where = f"at step {step} (model request sent, reply not recorded)"
        elif isinstance(body, ModelResponse):
            where = f"after step {step} (model reply {body.outcome.lower()}, nothing after it)"
        elif isinstance(body, ToolCall):
            names[seq] = body.tool
            where = f"at step {step} (tool call {body.tool} made, result not recorded)"
        elif isinstance(body, ToolResult):
            tool = names.get(body.call_seq, "a tool")
            where = f"after step {step} (tool call {tool} {body.outcome.lower()})"
        elif isinstance(body, FetchRequest):
            where = f"at step {step} (web fetch sent, answer not recorded)"
        elif isinstance(body, FetchResponse):
            where = f"after step {step} (web fetch {body.outcome.lower()})"
    return turn.turn, where


def decide(
    home: Home, session_id: str, decision: Decision, *, key: KeyPair | None = None
) -> int | None:
    """Record a person's decision on the call a ``needs_decision`` turn waits on; its seq
    (``None`` for a call this appliance may not send: giving it up records nothing)."""
    state = home.session(session_id)
    if state.status != "needs_decision" or not state.pending:
        raise NotWaiting(f"session {session_id} is not waiting for a decision")
    appliance = home.appliance()
    opener = key or user_key(home)
    if state.pending.get("unsendable"):  # a call this appliance may not send: nothing to record
        if decision != "abort":
            raise NotWaiting(
                f"session {session_id}: the call it stopped on can only be given up: "
                f"affidavit resume {session_id} --decide abort"
            )
        return None
    view = wait_settled(appliance.store, session_id, opener, timeout=5)
    bodies = view.bodies
    turn = turn_states(bodies)[-1].turn
    call_id = state.pending.get("call_id")
    call_seq = state.pending.get("call_seq")
    if view.offset:  # a continuation: find the call in the view, append its own seq
        found = next(
            (s for s, b in reversed(bodies) if isinstance(b, ToolCall) and b.call_id == call_id),
            None,
        )
        call_seq = view.own_seq(found) if found is not None else None
    elif not isinstance(call_seq, int):
        call_seq = next(
            (s for s, b in reversed(bodies) if isinstance(b, ToolCall) and b.call_id == call_id),
            None,
        )
    if call_seq is None:
        raise HomeMissing(f"the record holds no tool.call {call_id!r} to decide on")
    return append_event(
        home, session_id, TurnDecided(turn=turn, call_seq=call_seq, decision=decision)
    )


def resume_session(
    home: Home,
    session_id: str,
    *,
    decision: Decision | None = None,
    key: KeyPair | None = None,
    on_phase: Callable[[str], None] | None = None,
    progress: Callable[[str], None] | None = None,
    settle_timeout: float = 120.0,
) -> ResumeOutcome:
    """Complete the session's interrupted turn (``decision`` settles a waiting call first)."""
    from egress_proxy.replay import reconstruct_pipeline
    from egress_proxy.replay_plan import turn_bodies

    appliance = home.appliance()
    try:
        state = home.session(session_id)
    except SessionUnknown as exc:
        if not has_stream(appliance.store, session_id):
            raise
        raise SessionUnknown(
            f"{exc}; the store holds it, written by another appliance: if that one is gone, "
            f"carry the session on here with `affidavit session continue {session_id}`"
        ) from None
    opener = key or user_key(home)
    if decision is not None:
        decide(home, session_id, decision, key=opener)
    view = wait_settled(
        appliance.store, session_id, opener, timeout=settle_timeout, progress=progress
    )
    bodies = view.bodies
    states = turn_states(bodies)
    if not states or states[-1].ended is not None:
        if state.status != "idle":
            state.status, state.pending = "idle", None
            home.save_session(state)
        return ResumeOutcome(None, None)
    turn = states[-1].turn
    if decision == "abort":
        result = TurnResult(turn, "STOPPED", "", [], "aborted by a person's decision")
        return ResumeOutcome(turn, finish_turn(home, state, result))
    text, past, labels, catalogue, _, _ = turn_setup(bodies, turn)
    sliced = turn_bodies(bodies, turn)
    # Only committed model calls are served: a step sent again after a FAILED or UNKNOWN
    # reply has two requests in the record, and the plan must not be shifted by the first.
    pipeline = reconstruct_pipeline(
        appliance.store, session_id, opener, turn, bodies=_committed_only(bodies), annotated=True
    )
    transport = _ResumeTransport(pipeline, state.base_url, state.token)
    live_tools = ProxyToolbox(state.base_url, state.token, search_url=appliance.search_url)
    # In a continuation, a call asked by a reply served from an older stream cannot go live:
    # this appliance's proxy admits calls against the replies of its own stream only.
    older = view.streams[-2] if view.offset else None
    toolbox = _ResumeToolbox(
        live_tools,
        sliced,
        appliance.search_url,
        refuse_live=(lambda: not transport.live) if older is not None else None,
        older=older,
    )
    api = model_api(
        labels.get(LABEL_API, appliance.api),
        state.base_url,
        state.token,
        http_client=httpx2.Client(transport=transport, timeout=600),
    )
    # The catalogue the turn's first request offered, whatever became of that request; if
    # nothing was asked yet, today's.
    if not any(isinstance(b, ModelRequest) and b.request_bytes for _, b in sliced):
        catalogue = live_tools.catalogue(appliance.mcp_servers)
    state.status = "running"
    home.save_session(state)
    agent = Agent(
        api,
        labels.get(LABEL_MODEL, appliance.model),
        toolbox,
        catalogue,
        TurnPolicy.from_json(labels.get(LABEL_POLICY)),
        on_phase=on_phase or (lambda _: None),
    )
    try:
        result = agent.run_turn(turn, past, text)
    except UnsendableCall as exc:  # nothing was sent or recorded; only giving up is left
        state.status = "needs_decision"
        state.pending = {"unsendable": True, "tool": exc.tool, "call_id": exc.call_id}
        home.save_session(state)
        raise CannotContinue(f"{exc}: affidavit resume {session_id} --decide abort") from None
    finally:
        api.close()
        transport.close()
        live_tools.close()
    keep_annotation_checkpoints(home, session_id, result)
    outcome = ResumeOutcome(
        turn,
        finish_turn(home, state, result),
        transport.served,
        transport.sent_live,
        toolbox.served,
        toolbox.sent_live,
    )
    return outcome
