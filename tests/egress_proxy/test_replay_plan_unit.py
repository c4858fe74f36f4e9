"""The replay plan as a unit (``egress_proxy.replay_plan``): what an armed session is served
from and how each step is judged, over record bodies built here and a real store.

``test_reexecute.py`` and ``test_session_restore.py`` prove re-execute end to end through a
real proxy and engine; these pin each branch of the plan (the mutation check's targets).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from egress_proxy.errors import ReplayMiss
from egress_proxy.replay_plan import VERDICT_KEY, ReplayPlan, load_plan, turn_bodies
from egress_proxy.transports.recorded import RecordIndex, RecordTransport
from record.digest import Domain, digest
from record.log import Log
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
    TurnEnded,
    TurnStarted,
)
from record.seal import KeyPair

URL = "http://engine/v1/chat/completions"
ARGS = b'{"word":"x"}'
SENT = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n"


def _request(text: str, *, turn: int | None = 0, step: int | None = 0) -> ModelRequest:
    data = json.dumps({"messages": [{"role": "user", "content": text}]}).encode()
    return ModelRequest(
        content_key=digest(Domain.REQUEST, data),
        input_digest=digest(Domain.INPUT, data),
        prompt_digest=digest(Domain.PROMPT, data),
        request_bytes=data,
        input_bytes=data,
        prompt_bytes=data,
        provider=Provider(name="openai", endpoint=URL),
        model_id="m",
        params={},
        clock="2026-12-01T00:00:00Z",
        turn=turn,
        step=step,
    )


def _reply(request_seq: int, data: bytes = b'{"ok":1}', **extra: Any) -> ModelResponse:
    return ModelResponse(
        request_seq=request_seq,
        outcome="COMMITTED",
        status=200,
        response_bytes=data,
        response_digest=digest(Domain.RESPONSE, data),
        **extra,
    )


def _tool(reply_seq: int) -> ToolCall:
    return ToolCall(
        reply_seq=reply_seq,
        call_id="c1",
        server="S",
        tool="t",
        arguments=ARGS,
        arguments_digest=digest(Domain.TOOL_ARGUMENTS, ARGS),
        idempotent=False,
    )


def _fetch() -> FetchRequest:
    return FetchRequest(
        method="GET",
        url="http://a/",
        request_bytes=SENT,
        content_key=digest(Domain.FETCH_REQUEST, SENT),
        reply_seq=3,
        call_id="c2",
    )


def _bodies() -> list[tuple[int, Strict]]:
    """One turn: a pinned step asking for a tool, a step asking for a fetch, a last step."""
    return [
        (1, PinsSet(pins={"seed": 7})),
        (2, TurnStarted(turn=0, input_bytes=b"hi", input_digest=digest(Domain.INPUT, b"hi"))),
        (3, _request("one")),
        (4, _reply(3)),
        (5, _tool(4)),
        (6, ToolResult(call_seq=5, outcome="COMMITTED", result_bytes=b"{}")),
        (7, _request("two", step=1)),
        (8, _reply(7)),
        (9, _fetch()),
        (10, FetchResponse(request_seq=9, outcome="COMMITTED", status=200, response_bytes=b"x")),
        (11, _request("three", step=2)),
        (12, _reply(11)),
        (13, TurnEnded(turn=0, outcome="ANSWERED")),
        (14, TurnStarted(turn=1, input_bytes=b"yo", input_digest=digest(Domain.INPUT, b"yo"))),
        (15, _request("four", turn=1)),
    ]


def _plan(bodies: list[tuple[int, Strict]] | None = None) -> ReplayPlan:
    bodies = bodies if bodies is not None else _bodies()
    results = {b.call_seq: s for s, b in bodies if isinstance(b, ToolResult)}
    index = RecordIndex.from_bodies(bodies)
    return ReplayPlan("src", RecordTransport(index), index.of_kind("model"), results)


def test_steps_are_served_in_order_and_a_step_past_the_plan_is_a_miss() -> None:
    plan = _plan()
    served = [plan.next_step(URL, "m", b"{}") for _ in range(4)]
    assert [(ordinal, call.seq) for ordinal, call in served] == [(0, 3), (1, 7), (2, 11), (3, 15)]
    assert served[0][1].pins == {"seed": 7}
    with pytest.raises(
        ReplayMiss, match=f"this model call 'm' on '{URL}'; nearest is seq "
    ) as miss:
        plan.next_step(URL, "m", b"{}")
    nearest: Any = miss.value.nearest
    assert nearest is not None and nearest.kind == "model"
    assert plan.summary() == {
        "replays": "src",
        "model_steps": 4,
        "steps_run": 4,
        "tools_replayed": 0,
        "live_calls": 0,
        "verdicts": [],
    }


def test_a_tool_result_and_a_fetch_are_served_once_with_their_seqs() -> None:
    plan = _plan()
    result, seq = plan.tool_result("S", "t", ARGS)
    assert (result.outcome, seq) == ("COMMITTED", 6)
    answer, at = plan.fetch_result("http://a/", SENT)
    assert (answer.status, at) == (200, 10)
    assert plan.tools_replayed == 2 and plan.summary()["tools_replayed"] == 2
    with pytest.raises(ReplayMiss):
        plan.tool_result("S", "t", ARGS)  # served already
    with pytest.raises(ReplayMiss):
        plan.fetch_result("http://a/", SENT)
    with pytest.raises(ReplayMiss):
        plan.tool_result("S", "t", b'{"word":"y"}')
    assert plan.tools_replayed == 2


def test_a_recorded_call_with_no_answer_is_a_miss_naming_it() -> None:
    bodies = [(s, b) for s, b in _bodies() if s not in (6, 10)]  # no result, no response
    plan = _plan(bodies)
    with pytest.raises(ReplayMiss, match="seq 5 has no recorded result") as tool:
        plan.tool_result("S", "t", ARGS)
    nearest: Any = tool.value.nearest
    assert nearest is not None and nearest.seq == 5
    with pytest.raises(ReplayMiss, match="seq 9 has no recorded response") as fetch:
        plan.fetch_result("http://a/", SENT)
    nearest = fetch.value.nearest
    assert nearest is not None and nearest.seq == 9
    assert plan.tools_replayed == 0


def test_a_verdict_says_what_matched_its_recorded_twin() -> None:
    plan = _plan()
    ordinal, step = plan.next_step(URL, "m", b"{}")
    body = step.body
    assert isinstance(body, ModelRequest)
    same = plan.verdict(
        ordinal,
        step,
        prompt_digest=body.prompt_digest,
        clock=body.clock,
        content_key=body.content_key,
        reply=b'{"ok":1}',
        status=200,
    )
    assert same == {
        "replays": "src",
        "step": 0,
        "recorded_request_seq": 3,
        "prompt_identical": True,
        "clock_identical": True,
        "request_identical": True,
        "reply_identical": True,
        "recorded_response_digest": digest(Domain.RESPONSE, b'{"ok":1}'),
        "response_digest": digest(Domain.RESPONSE, b'{"ok":1}'),
        "tools_replayed": 0,
        "live_calls": 0,
    }
    other = plan.verdict(
        ordinal,
        step,
        prompt_digest="sha256:" + "0" * 64,
        clock=None,
        content_key="sha256:" + "1" * 64,
        reply=b'{"ok":2}',
        status=200,
    )
    assert not any(other[k] for k in ("prompt_identical", "clock_identical", "request_identical"))
    assert other["reply_identical"] is False
    failed = plan.verdict(
        ordinal,
        step,
        prompt_digest=body.prompt_digest,
        clock=body.clock,
        content_key=body.content_key,
        reply=b'{"ok":1}',
        status=500,
    )
    assert failed["reply_identical"] is False  # the same bytes, but not a success
    assert plan.verdicts == [same, other, failed]
    assert plan.summary()["verdicts"] == [same, other, failed]


def test_a_step_whose_recorded_reply_failed_or_never_came_is_never_identical() -> None:
    bodies = _bodies()
    bodies[3] = (4, ModelResponse(request_seq=3, outcome="FAILED", status=500))
    plan = _plan(bodies)
    ordinal, step = plan.next_step(URL, "m", b"{}")
    verdict = plan.verdict(
        ordinal, step, prompt_digest=None, clock=None, content_key=None, reply=b"", status=200
    )
    assert verdict["recorded_response_digest"] is None and verdict["reply_identical"] is False
    unanswered = _plan([pair for pair in _bodies() if pair[0] != 4])  # no reply recorded
    ordinal, step = unanswered.next_step(URL, "m", b"{}")
    verdict = unanswered.verdict(
        ordinal, step, prompt_digest=None, clock=None, content_key=None, reply=b"", status=200
    )
    assert verdict["recorded_response_digest"] is None and verdict["reply_identical"] is False


@pytest.mark.parametrize(("status", "identical"), [(200, True), (299, True), (300, False)])
def test_only_a_success_status_can_be_identical(status: int, identical: bool) -> None:
    plan = _plan()
    ordinal, step = plan.next_step(URL, "m", b"{}")
    verdict = plan.verdict(
        ordinal,
        step,
        prompt_digest=None,
        clock=None,
        content_key=None,
        reply=b'{"ok":1}',
        status=status,
    )
    assert verdict["reply_identical"] is identical


def test_catch_up_takes_up_where_the_armed_stream_was() -> None:
    plan = _plan()
    verdict = {"step": 0, "reply_identical": True}
    armed: list[tuple[int, Strict]] = [
        (1, _request("one")),
        (2, _reply(1, reproducibility={VERDICT_KEY: verdict})),
        (3, _request("refused").model_copy(update={"request_bytes": b""})),  # not a step
        (4, ToolResult(call_seq=9, outcome="COMMITTED", replayed_from=6)),
        (5, FetchResponse(request_seq=9, outcome="COMMITTED", replayed_from=10)),
        (6, ToolResult(call_seq=9, outcome="COMMITTED")),  # live: served nothing
        (7, ToolResult(call_seq=9, outcome="COMMITTED", replayed_from=99)),  # names nothing
        (8, ToolResult(call_seq=9, outcome="COMMITTED", replayed_from=4)),  # a model reply
        (9, _reply(1)),  # no verdict
    ]
    plan.catch_up(armed)
    assert plan.position == 1 and plan.verdicts == [verdict] and plan.tools_replayed == 2
    assert plan.next_step(URL, "m", b"{}")[0] == 1  # the model step at seq 4 was not taken
    with pytest.raises(ReplayMiss):
        plan.tool_result("S", "t", ARGS)  # taken by catch-up: not served twice
    with pytest.raises(ReplayMiss):
        plan.fetch_result("http://a/", SENT)
    plan.catch_up([(s, _request(str(s))) for s in range(10)])
    assert plan.position == 4  # never past the plan
    twice = _plan()
    again = ToolResult(call_seq=9, outcome="COMMITTED", replayed_from=6)
    with pytest.raises(ReplayMiss, match="tool call 't' on 'S'"):
        twice.catch_up([(1, again), (2, again)])  # one recorded answer served twice: refused


def test_turn_bodies_are_one_turn_with_the_pins_in_force() -> None:
    bodies = _bodies()
    first = turn_bodies(bodies, 0)
    assert [s for s, _ in first] == [1, *range(2, 14)]
    second = turn_bodies(bodies, 1)
    assert [s for s, _ in second] == [1, 14, 15]  # no turn.ended yet: to the end
    with pytest.raises(KeyError, match="no turn 2"):
        turn_bodies(bodies, 2)
    early_end = [(0, TurnEnded(turn=1, outcome="STOPPED")), *bodies]  # out of order: ignored
    assert [s for s, _ in turn_bodies(early_end, 1)] == [1, 14, 15]


def test_load_plan_reads_a_stream_from_a_real_store(tmp_path: Path) -> None:
    appliance = KeyPair.generate()
    with Log.open(tmp_path / "record.db", appliance_key=appliance) as log:
        log.open_stream("src", [appliance.recipient], {})
        for _, body in _bodies():
            log.append("src", body)
        whole = load_plan(log, "src", appliance)
        one = load_plan(log, "src", appliance, turn=1)
        with pytest.raises(KeyError, match="no stream 'nope'"):
            load_plan(log, "nope", appliance)
    assert whole.source == "src" and len(whole.steps) == 4 and len(one.steps) == 1
    assert whole.result_seqs == {5: 6}  # the stream's seqs: stream.opened is seq 0
    assert one.result_seqs == {}
    result, seq = whole.tool_result("S", "t", ARGS)
    assert (result.outcome, seq) == ("COMMITTED", 6)
