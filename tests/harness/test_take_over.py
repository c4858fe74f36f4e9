"""How much of another appliance's stream a continuation takes over (``take_over``), and the
resume toolbox's refusal to send a call asked by a reply of the older stream.

Unit tests of one stage over bodies built here; ``test_continue.py`` proves the whole with
two real appliances. Each rule: a finished last turn is taken whole; an unfinished one up to
the request of its last step, unless every call recorded after that step's committed reply
has an answer (then whole); a call there with no known outcome refuses, unless a person
skipped it; ``--abandon-turn`` stops before the turn.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.continuation import CannotContinue, take_over
from harness.resume import UnsendableCall, _ResumeToolbox
from harness.tools import ToolSpec
from record.digest import Domain, digest
from record.schema import (
    FetchRequest,
    FetchResponse,
    ModelRequest,
    ModelResponse,
    PinsSet,
    Provider,
    Strict,
    ToolCall,
    ToolResult,
    TurnDecided,
    TurnEnded,
    TurnStarted,
)

B = b"x"
D = digest(Domain.REQUEST, B)


def _request(turn: int = 0, step: int = 0) -> ModelRequest:
    return ModelRequest(
        content_key=D,
        input_digest=D,
        prompt_digest=D,
        request_bytes=B,
        input_bytes=B,
        prompt_bytes=B,
        provider=Provider(name="p", endpoint="http://p/v1/chat/completions"),
        model_id="m",
        params={},
        turn=turn,
        step=step,
    )


def _reply(seq: int, outcome: str = "COMMITTED") -> ModelResponse:
    return ModelResponse(request_seq=seq, outcome=outcome)  # type: ignore[arg-type]


def _call(reply: int, tool: str = "append_note") -> ToolCall:
    return ToolCall(
        reply_seq=reply,
        call_id=f"call-{reply}-{tool}",
        server="ledger",
        tool=tool,
        arguments=b"{}",
        arguments_digest=digest(Domain.TOOL_ARGUMENTS, b"{}"),
        idempotent=False,
    )


def _result(call: int, outcome: str = "COMMITTED") -> ToolResult:
    return ToolResult(call_seq=call, outcome=outcome, result_bytes=b"ok")  # type: ignore[arg-type]


def _fetch(reply: int) -> FetchRequest:
    return FetchRequest(
        method="GET",
        url="http://web/page",
        request_bytes=B,
        content_key=digest(Domain.FETCH_REQUEST, B),
        reply_seq=reply,
        call_id="call-fetch",
    )


def _bodies(*tail: Strict) -> list[tuple[int, Strict]]:
    """seq 0 sets pins (where the stream opened), then a turn 0 that started at seq 1."""
    head: list[Strict] = [PinsSet(pins={}), TurnStarted(turn=0, input_bytes=B, input_digest=D)]
    return list(enumerate([*head, *tail]))


def test_a_finished_turn_is_taken_whole() -> None:
    bodies = _bodies(_request(), _reply(2), TurnEnded(turn=0, outcome="ANSWERED"))
    assert take_over(bodies, len(bodies)) == len(bodies)
    assert take_over(bodies[:1], 1) == 1  # no turn at all


def test_a_turn_that_asked_nothing_yet_is_taken_whole() -> None:
    bodies = _bodies()
    assert take_over(bodies, len(bodies)) == len(bodies)


@pytest.mark.parametrize("outcome", ["COMMITTED", "FAILED", "UNKNOWN", None])
def test_a_last_step_none_of_whose_calls_started_is_sent_again(outcome: str | None) -> None:
    tail: list[Strict] = [_request(step=0), _reply(2), _call(3), _result(4), _request(step=1)]
    if outcome is not None:
        tail.append(_reply(6, outcome))
    bodies = _bodies(*tail)
    assert take_over(bodies, len(bodies)) == 6  # the seq of step 1's request


def test_a_last_step_whose_recorded_calls_all_answered_is_taken_whole() -> None:
    bodies = _bodies(_request(), _reply(2), _call(3), _result(4), _fetch(3))
    bodies.append((7, FetchResponse(request_seq=6, outcome="FAILED", status=None)))
    assert take_over(bodies, len(bodies)) == len(bodies)


@pytest.mark.parametrize(
    ("tail", "said"),
    [
        ([_call(3)], "was never recorded"),
        ([_call(3), _result(4, "UNKNOWN")], "is unknown"),
        ([_fetch(3)], "web fetch http://web/page"),
        (
            [_call(3), _result(4, "UNKNOWN"), TurnDecided(turn=0, call_seq=4, decision="retry")],
            "is unknown",
        ),
    ],
)
def test_a_call_that_may_have_had_its_effect_refuses(tail: list[Strict], said: str) -> None:
    bodies = _bodies(_request(), _reply(2), *tail)
    with pytest.raises(CannotContinue) as info:
        take_over(bodies, len(bodies))
    assert said in str(info.value) and "--abandon-turn" in str(info.value)
    assert take_over(bodies, len(bodies), abandon_turn=True) == 1  # before turn 0


def test_a_call_a_person_skipped_is_settled() -> None:
    bodies = _bodies(
        _request(),
        _reply(2),
        _call(3),
        _result(4, "UNKNOWN"),
        TurnDecided(turn=0, call_seq=4, decision="skip"),
    )
    assert take_over(bodies, len(bodies)) == len(bodies)


class _NeverLive:
    """Stands in for the proxy's toolbox: reaching it is the failure."""

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a call asked by an older stream's reply reached the proxy")


def test_resume_refuses_to_send_a_call_an_older_streams_reply_asked() -> None:
    spec = ToolSpec("ledger__append_note", "", {}, False, "mcp", "ledger", "append_note")
    served_phase = True
    toolbox = _ResumeToolbox(
        _NeverLive(),  # type: ignore[arg-type]
        [],
        None,
        refuse_live=lambda: served_phase,
        older="old-stream",
    )
    with pytest.raises(UnsendableCall) as info:
        toolbox.call(spec, b"{}", reply_seq=2, call_id="call-x")
    assert "old-stream" in str(info.value) and "Nothing was sent" in str(info.value)
    assert (info.value.tool, info.value.call_id) == ("ledger__append_note", "call-x")
    assert toolbox.sent_live == 0
