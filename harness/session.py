"""Sessions and live turns: open a session at the proxy, run a turn through it, record it.

Everything the harness writes goes through the proxy's control plane (``turn.started`` with
the input as received, ``turn.ended`` with the answer, ``turn.decided``); everything it reads
back comes from the record (read-only). What replays need to re-drive the harness is put in
the session's labels, which ``stream.opened`` keeps in clear: the model name, the turn policy
and the search endpoint. The record is the truth about turns: the next turn's number is the
number of ``turn.started`` entries, and a turn without ``turn.ended`` is one to resume.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from egress_proxy.fetch import SEARCH_LABEL
from harness.agent import Agent, TurnPolicy, TurnResult
from harness.continuation import Linked, linked, refreshed
from harness.model_api import model_api
from harness.state import (
    Appliance,
    ApplianceGone,
    Home,
    HomeMissing,
    KeyFileInvalid,
    PinsRefused,
    SessionState,
    SessionUnknown,
    TurnUnknown,
)
from harness.tools import ProxyToolbox, ToolSpec
from record.backends import store_exists
from record.digest import Domain, digest
from record.errors import CannotOpen
from record.schema import (
    Continuation,
    FetchRequest,
    FetchResponse,
    ModelRequest,
    ModelResponse,
    StreamOpened,
    Strict,
    ToolCall,
    ToolResult,
    TurnDecided,
    TurnEnded,
    TurnStarted,
    body_kind,
)
from record.seal import KeyPair, RecipientKey

__all__ = [
    "LABEL_API",
    "LABEL_MODEL",
    "LABEL_POLICY",
    "LABEL_SEARCH",
    "TurnState",
    "append_event",
    "has_stream",
    "history",
    "labels_at",
    "open_session",
    "read_bodies",
    "read_linked",
    "require_turn",
    "run_turn",
    "turn_states",
    "user_key",
    "wait_settled",
]

LABEL_API = "affidavit/api"  # the model API the session speaks: openai or anthropic
LABEL_MODEL = "affidavit/model"
LABEL_POLICY = "affidavit/policy"
LABEL_SEARCH = SEARCH_LABEL  # web_search's endpoint: the proxy admits its fetches by it


def user_key(home: Home, path: Path | str | None = None, *, create: bool = False) -> KeyPair:
    """The user's key: ``--key``, else the state folder's ``user.key`` (made only when
    ``create``: opening a session; a command that reads must not invent a key)."""
    if path is not None:
        if not Path(path).is_file():
            raise HomeMissing(f"key file {path} does not exist")
        return _read_key(Path(path))
    if not home.user_key_file.is_file():
        if not create:
            raise HomeMissing(f"no key: {home.user_key_file} does not exist (give --key FILE)")
        home.root.mkdir(parents=True, exist_ok=True)
        KeyPair.generate().write(home.user_key_file)
    return _read_key(home.user_key_file)


def _read_key(path: Path) -> KeyPair:
    try:
        return KeyPair.read(path)
    except ValueError as exc:  # not a key, or readable by others
        raise KeyFileInvalid(f"{exc} (give a key file `affidavit keys new` wrote)") from None


@contextmanager
def control(appliance: Appliance) -> Iterator[Any]:
    """The appliance's control plane; ``ApplianceGone`` when its socket does not answer (the
    ``up`` that wrote ``appliance.json`` is gone), ``PinsRefused`` when it refuses a pinned
    session (its check of its own evidence failed), never gRPC's own traceback."""
    import grpc

    from egress_proxy.control import ControlClient
    from egress_proxy.tee_status import REFUSAL

    if not Path(appliance.control_socket).exists():
        raise ApplianceGone(
            f"the proxy's control socket {appliance.control_socket} is not there: run `affidavit up`"
        )
    with ControlClient(appliance.control_socket) as client:
        try:
            yield client
        except grpc.RpcError as exc:
            details = exc.details() or ""
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(REFUSAL):
                raise PinsRefused(details) from None  # its self-check failed: one line, exit 1
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            by = f" (pid {appliance.pid})" if appliance.pid is not None else ""
            raise ApplianceGone(
                f"the appliance{by} does not answer on {appliance.control_socket}: "
                "run `affidavit up`"
            ) from None


def open_session(
    home: Home,
    pins: Mapping[str, JsonValue] | None,
    recipients: Sequence[RecipientKey] = (),
    *,
    policy: TurnPolicy | None = None,
    labels: Mapping[str, str] | None = None,
    continues: Continuation | None = None,
) -> SessionState:
    """Open a session (sealed to the user's key and ``recipients``) and keep its token;
    ``continues``: the other appliance's stream it carries on (``harness.continuation``)."""
    appliance = home.appliance()
    key = user_key(home, create=True)
    every = [key.recipient, *[r for r in recipients if r.text() != key.recipient.text()]]
    all_labels = {
        LABEL_API: appliance.api,
        LABEL_MODEL: appliance.model,
        LABEL_POLICY: (policy or TurnPolicy()).to_json(),
    }
    if appliance.search_url:
        all_labels[LABEL_SEARCH] = appliance.search_url
    all_labels.update(labels or {})
    with control(appliance) as client:
        opened = client.open_session(
            every, all_labels, dict(pins) if pins else None, continues=continues
        )
    state = SessionState(
        opened.session_id, opened.token, opened.base_url, dict(pins) if pins else None
    )
    state.labels = all_labels
    home.save_session(state)
    return state


def append_event(home: Home, session_id: str, body: Strict) -> int:
    """Append a harness event through the control plane; keep the checkpoint it produced."""
    appliance = home.appliance()
    data = body.model_dump_json().encode()
    kind = body_kind(body)
    with control(appliance) as client:
        response = client.append_event(session_id, kind, data)
    if response.checkpoint:
        home.keep_checkpoint(session_id, response.checkpoint)
    seq: int = response.seq
    return seq


# -- reading the record back --------------------------------------------------------------------


def read_bodies(store: Path | str, stream: str, key: KeyPair) -> list[tuple[int, Strict]]:
    """The session's bodies, across the streams it continues (``harness.continuation``)."""
    return read_linked(store, stream, key).bodies


def read_linked(store: Path | str, stream: str, key: KeyPair) -> Linked:
    if not store_exists(store):
        raise HomeMissing(f"record store {store} does not exist")
    try:
        return linked(store, stream, key)
    except CannotOpen:
        if not has_stream(store, stream):  # a mistyped id, not a stream sealed to others
            raise SessionUnknown(f"no session {stream!r} in the record {store}") from None
        raise


def has_stream(store: Path | str, stream: str) -> bool:
    """Whether the store holds any entry of ``stream`` (to tell a mistyped id from a stream
    sealed to other keys)."""
    from record.backends import open_store

    opened = open_store(store, readonly=True)
    try:
        return opened.size(stream) > 0
    finally:
        opened.close()


def require_turn(bodies: Sequence[tuple[int, Strict]], stream: str, turn: int) -> None:
    """``TurnUnknown`` unless the stream holds turn ``turn`` (the line says what it has)."""
    turns = [t.turn for t in turn_states(bodies)]
    if turn in turns:
        return
    if not turns:
        raise TurnUnknown(
            f"session {stream!r} has no turns: if a client drove it, its recorded calls "
            f"replay with `affidavit replay {stream} --calls`"
        )
    raise TurnUnknown(f"session {stream!r} has no turn {turn} (its turns: {turns[0]}..{turns[-1]})")


def labels_of(bodies: Sequence[tuple[int, Strict]]) -> dict[str, str]:
    for _, body in bodies:
        if isinstance(body, StreamOpened):
            return dict(body.labels)
    return {}


def labels_at(bodies: Sequence[tuple[int, Strict]], seq: int) -> dict[str, str]:
    """The labels of the stream that holds ``seq`` in a session's view: a continued session
    has one ``stream.opened`` per stream, and each appliance's own labels (its search
    endpoint) held for what it sent."""
    found: dict[str, str] = {}
    for at, body in bodies:
        if at > seq:
            break
        if isinstance(body, StreamOpened):
            found = dict(body.labels)
    return found


def history(bodies: Sequence[tuple[int, Strict]], before: int) -> list[tuple[str, str]]:
    """The (input, answer) of every turn before ``before`` that ended with an answer."""
    asked: dict[int, str] = {}
    pairs: list[tuple[str, str]] = []
    for _, body in bodies:
        if isinstance(body, TurnStarted) and body.turn < before:
            asked[body.turn] = body.input_bytes.decode("utf-8", "replace")
        elif isinstance(body, TurnEnded) and body.turn in asked and body.answer_bytes is not None:
            pairs.append((asked[body.turn], body.answer_bytes.decode("utf-8", "replace")))
    return pairs


@dataclass
class TurnState:
    """A turn as the record tells it."""

    turn: int
    started_seq: int
    input: bytes
    ended: TurnEnded | None = None
    ended_seq: int | None = None
    model_steps: int = 0
    tool_calls: int = 0
    decisions: int = 0


def turn_states(bodies: Sequence[tuple[int, Strict]]) -> list[TurnState]:
    turns: dict[int, TurnState] = {}
    current: TurnState | None = None
    for seq, body in bodies:
        if isinstance(body, TurnStarted):
            current = turns[body.turn] = TurnState(body.turn, seq, body.input_bytes)
        elif current is not None:
            if isinstance(body, TurnEnded) and body.turn == current.turn:
                current.ended, current.ended_seq = body, seq
            elif isinstance(body, ModelRequest):
                current.model_steps += 1
            elif isinstance(body, ToolCall | FetchRequest):
                current.tool_calls += 1
            elif isinstance(body, TurnDecided):
                current.decisions += 1
    return [turns[t] for t in sorted(turns)]


def pending_calls(bodies: Sequence[tuple[int, Strict]]) -> list[int]:
    """Seqs of requests (model, tool, fetch) that have no answer yet."""
    asked: dict[int, str] = {}
    for seq, body in bodies:
        if isinstance(body, ModelRequest | ToolCall | FetchRequest):
            asked[seq] = body.kind
        elif isinstance(body, ModelResponse | FetchResponse):
            asked.pop(body.request_seq, None)
        elif isinstance(body, ToolResult):
            asked.pop(body.call_seq, None)
    return sorted(asked)


def wait_settled(
    store: Path | str,
    stream: str,
    key: KeyPair,
    *,
    timeout: float = 120.0,
    progress: Callable[[str], None] | None = None,
) -> Linked:
    """The session once every request in it has its answer recorded (the proxy finishes a
    call a killed client left), or as it stands after ``timeout``: what is still open then
    stays open (the proxy's recovery answers it ``UNKNOWN`` when it restarts)."""
    deadline = time.monotonic() + timeout
    said = False
    view = read_linked(store, stream, key)
    while True:
        open_ = pending_calls(view.bodies)
        if not open_ or time.monotonic() > deadline:
            return view
        if progress is not None and not said:
            progress(f"waiting for the proxy to record the answers to seq {open_}")
            said = True
        time.sleep(0.1)
        view = refreshed(view, store, key)  # only the newest stream can still be written


# -- a live turn ------------------------------------------------------------------------------


def live_agent(
    home: Home, state: SessionState, appliance: Appliance, *, on_phase: Callable[[str], None]
) -> tuple[Agent, ProxyToolbox]:
    toolbox = ProxyToolbox(state.base_url, state.token, search_url=appliance.search_url)
    catalogue: list[ToolSpec] = toolbox.catalogue(appliance.mcp_servers)
    api = model_api(state.labels.get(LABEL_API, appliance.api), state.base_url, state.token)
    policy = TurnPolicy.from_json(state.labels.get(LABEL_POLICY))
    model = state.labels.get(LABEL_MODEL, appliance.model)
    agent = Agent(api, model, toolbox, catalogue, policy, on_phase=on_phase)
    return agent, toolbox


def run_turn(
    home: Home,
    session_id: str,
    text: str,
    *,
    key: KeyPair | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> TurnResult:
    """Run one turn of a session live, through the proxy, and record its ends."""
    phase = on_phase or (lambda _: None)
    state = home.session(session_id)
    if state.status == "needs_decision":
        raise HomeMissing(
            f"session {session_id} waits for a decision: affidavit resume {session_id} --decide"
        )
    appliance = home.appliance()
    opener = key or user_key(home)
    bodies = read_bodies(appliance.store, session_id, opener)
    states = turn_states(bodies)
    if states and states[-1].ended is None:
        raise HomeMissing(
            f"turn {states[-1].turn} of session {session_id} did not end: "
            f"affidavit resume {session_id}"
        )
    turn = len(states)
    try:  # the tools first: a turn that cannot start leaves no turn.started behind
        agent, toolbox = live_agent(home, state, appliance, on_phase=phase)
    except Exception as exc:
        raise HomeMissing(f"the proxy could not list the session's tools: {exc}") from exc
    data = text.encode("utf-8", "surrogateescape")
    append_event(
        home,
        session_id,
        TurnStarted(turn=turn, input_bytes=data, input_digest=digest(Domain.INPUT, data)),
    )
    phase(f"turn_started turn={turn}")
    state.status = "running"
    home.save_session(state)
    try:
        result = agent.run_turn(turn, history(bodies, turn), text)
    finally:
        toolbox.close()
        agent.api.close()
    keep_annotation_checkpoints(home, session_id, result)
    return finish_turn(home, state, result)


def keep_annotation_checkpoints(home: Home, session_id: str, result: TurnResult) -> None:
    for step in result.steps:
        note = (step.completion.annotation or {}).get("checkpoint")
        if isinstance(note, str):
            home.keep_checkpoint(session_id, note)


def finish_turn(home: Home, state: SessionState, result: TurnResult) -> TurnResult:
    """Record ``turn.ended`` (unless a person must decide first) and save the session state."""
    if result.outcome == "NEEDS_DECISION":
        state.status, state.pending = "needs_decision", result.pending
        home.save_session(state)
        return result
    answer = result.answer.encode("utf-8", "surrogateescape")
    outcome = result.outcome
    ended = TurnEnded(
        turn=result.turn,
        outcome=outcome,
        answer_bytes=answer,
        answer_digest=digest(Domain.RESPONSE, answer),
    )
    append_event(home, state.session_id, ended)
    state.status, state.pending = "idle", None
    home.save_session(state)
    return result


def summary_json(result: TurnResult) -> dict[str, Any]:
    return {
        "turn": result.turn,
        "outcome": result.outcome,
        "answer": result.answer,
        "detail": result.detail,
        "pending": result.pending,
        "steps": [
            {
                "step": s.step,
                "seq": (s.completion.annotation or {}).get("seq"),
                "tool_calls": [
                    {"id": i, "name": n, "arguments": a} for i, n, a in s.completion.tool_calls
                ],
                "tool_outcomes": [o.outcome for o in s.tool_outputs],
                # why each FAILED call failed (null for the others), in the same order
                "tool_errors": [o.why() if o.outcome == "FAILED" else None for o in s.tool_outputs],
            }
            for s in result.steps
        ],
    }


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
