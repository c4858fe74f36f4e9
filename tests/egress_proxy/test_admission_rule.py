"""The admission rule as pure functions (``egress_proxy.admission``): what a reply asked for,
which call an ask is admitted as, and what a session has served, folded from record bodies.

``test_tool_admission.py`` and ``test_fetch_admission.py`` prove the rule end to end through
a real proxy; these tests pin each branch of it one at a time (the mutation check's targets:
a break of any line here must fail a test in a second, not wait on a proxy).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest

from egress_proxy.admission import (
    WEB,
    Admitted,
    AskedCall,
    Ledger,
    asked_calls,
    is_refusal,
    model_names,
    pick,
    reply_calls,
)
from egress_proxy.errors import ReplyNotCommitted, ToolCallServed, ToolNotAsked
from record.digest import Domain, canonical_json, digest
from record.schema import (
    FetchRequest,
    FetchResponse,
    ModelResponse,
    ToolCall,
    ToolResult,
    TurnDecided,
)

ARGS = canonical_json({"word": "x"})
Outcome = Literal["COMMITTED", "FAILED", "UNKNOWN"]


def _chat(*calls: tuple[str, str, str]) -> bytes:
    listed = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls
    ]
    message = {"role": "assistant", "content": None, "tool_calls": listed}
    return json.dumps({"choices": [{"index": 0, "message": message}]}).encode()


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


# -- what a reply asked for --------------------------------------------------------------------


def test_chat_calls_in_order_with_canonical_arguments() -> None:
    body = _chat(("a", "S__t", '{"word": "x"}'), ("b", "other", "{}"))
    assert reply_calls(body) == [("a", "S__t", ARGS), ("b", "other", b"{}")]


def test_chat_stream_deltas_join_their_arguments() -> None:
    def delta(call: dict[str, Any]) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}

    body = _sse(
        delta({"index": 0, "id": "a", "function": {"name": "S__t", "arguments": '{"wo'}}),
        delta({"index": 0, "function": {"arguments": 'rd": "x"}'}}),
        delta({"index": 1, "id": "b", "function": {"name": "u", "arguments": ""}}),
    )
    assert reply_calls(body) == [("a", "S__t", ARGS), ("b", "u", b"{}")]


def test_anthropic_blocks_and_stream_events() -> None:
    message = {
        "content": [
            {"type": "text", "text": "hi"},
            {"type": "tool_use", "id": "t1", "name": "S__t", "input": {"word": "x"}},
        ]
    }
    assert reply_calls(json.dumps(message).encode()) == [("t1", "S__t", ARGS)]
    start = {"type": "tool_use", "id": "t2", "name": "S__t", "input": {}}
    body = _sse(
        {"type": "content_block_start", "index": 1, "content_block": start},
        {"type": "content_block_delta", "index": 1, "delta": {"partial_json": '{"word":'}},
        {"type": "content_block_delta", "index": 1, "delta": {"partial_json": '"x"}'}},
        {"type": "content_block_delta", "index": 7, "delta": {"partial_json": "junk"}},
    )
    assert reply_calls(body) == [("t2", "S__t", ARGS)]


def test_responses_function_call_items() -> None:
    item = {"type": "function_call", "call_id": "r1", "name": "S__t", "arguments": '{"word":"x"}'}
    body = json.dumps({"output": [item, {**item, "call_id": "r2", "arguments": ""}]}).encode()
    assert reply_calls(body) == [("r1", "S__t", ARGS), ("r2", "S__t", b"{}")]


def test_odd_calls_are_read_as_no_call_or_unmatchable_arguments() -> None:
    body = _chat(("a", "S__t", "not json"), ("", "S__t", "{}"), ("a", "again", "{}"))
    assert reply_calls(body) == [("a", "S__t", None)]  # no id: none; a repeated id: once
    assert reply_calls(_chat(("a", "S__t", '{"n": 1E999}'))) == [("a", "S__t", b'{"n":null}')]
    assert reply_calls(b'{"choices": 1}') == [] and reply_calls(b"[]") == []
    nameless = {"choices": [{"message": {"tool_calls": [{"id": "a", "function": {}}]}}]}
    assert reply_calls(json.dumps(nameless).encode()) == [("a", "", b"{}")]


def test_a_call_is_read_whatever_came_before_it() -> None:
    """An id-less call, a choice that is no object or a function that is no object, before
    a good call, is skipped, not the end of the reading."""
    body = _chat(("", "S__t", "{}"), ("a", "S__t", '{"word": "x"}'))
    assert reply_calls(body) == [("a", "S__t", ARGS)]
    odd = {"choices": [1, {"message": {"tool_calls": [{"id": 5}, {"id": "b", "function": "f"}]}}]}
    assert reply_calls(json.dumps(odd).encode()) == [("b", "", b"{}")]
    blocks = {"content": ["text", {"type": "tool_use", "id": "t", "name": "n", "input": {}}]}
    assert reply_calls(json.dumps(blocks).encode()) == [("t", "n", b"{}")]
    item = {"type": "function_call", "call_id": "r", "name": "n"}  # no arguments member
    assert reply_calls(json.dumps({"output": [item]}).encode()) == [("r", "n", b"{}")]


def test_choices_and_blocks_keep_their_calls_apart() -> None:
    """Each choice (by its index, else its place) and each content block has its own calls:
    two calls at the same call index in two choices are two calls."""

    def choice(index: int | None, call_id: str) -> dict[str, Any]:
        call = {"index": 0, "id": call_id, "function": {"name": "n", "arguments": "{}"}}
        found: dict[str, Any] = {"message": {"tool_calls": [call]}}
        return found if index is None else {"index": index, **found}

    placed = {"choices": [choice(None, "a"), choice(None, "b")]}
    assert [c[0] for c in reply_calls(json.dumps(placed).encode())] == ["a", "b"]
    indexed = _sse({"choices": [choice(0, "a")]}, {"choices": [choice(1, "b")]})
    assert [c[0] for c in reply_calls(indexed)] == ["a", "b"]  # both at place 0 of their event
    use: list[Any] = [{"type": "tool_use", "id": i, "name": "n", "input": {}} for i in ("t1", "t2")]
    assert [c[0] for c in reply_calls(json.dumps({"content": use}).encode())] == ["t1", "t2"]


def test_the_first_id_and_name_of_a_call_stay() -> None:
    def delta(call: dict[str, Any]) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}

    body = _sse(
        delta({"index": 0, "id": "a", "function": {"name": "n", "arguments": "{}"}}),
        delta({"index": 0, "id": "b", "function": {"name": "other"}}),
        delta({"index": 0, "id": "", "function": {"name": ""}}),
    )
    assert reply_calls(body) == [("a", "n", b"{}")]


def test_what_a_call_carries_never_becomes_a_call() -> None:
    """Only the places a provider puts calls are read: a call's own arguments, a block or a
    delta that merely looks like a call, an event of another type, a tool's output, and a
    Chat message's content parts are not calls."""
    smuggled = {"type": "function_call", "call_id": "evil", "name": "S__t", "arguments": "{}"}
    tool = {"type": "tool_use", "id": "t", "name": "n", "input": {"nested": smuggled}}
    assert [c[0] for c in reply_calls(json.dumps({"content": [tool]}).encode())] == ["t"]
    events = _sse(
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": tool,
            "content": [{**tool, "id": "t2"}],  # an event's own members: not message blocks
        },
        {"type": "content_block_delta", "index": 3, "delta": smuggled},
        {"type": "message_delta", "index": 3, "delta": {"partial_json": "junk"}},
        {"type": "message", "content_block": {**tool, "id": "u"}},
    )
    assert reply_calls(events) == [("t", "n", canonical_json({"nested": smuggled}))]
    output = {"type": "function_call_output", "call_id": "o", "output": "x"}
    assert reply_calls(json.dumps({"output": [output]}).encode()) == []
    parts = {"role": "assistant", "content": [tool]}
    assert reply_calls(json.dumps({"choices": [{"index": 0, "message": parts}]}).encode()) == []
    later = {"content": [], "output": [smuggled]}  # a skipped member first: the walk goes on
    assert [c[0] for c in reply_calls(json.dumps(later).encode())] == ["evil"]


def test_asked_calls_hand_out_the_derived_ids() -> None:
    reply = ModelResponse(
        request_seq=1, outcome="COMMITTED", response_bytes=_chat(("up", "S__t", "{}"))
    )
    (call,) = asked_calls(reply, {"up": "derived"})
    assert (call.index, call.call_id, call.ids, call.name) == (
        0,
        "derived",
        frozenset({"up", "derived"}),
        "S__t",
    )
    (plain,) = asked_calls(reply, {})
    assert plain.call_id == "up" and plain.ids == frozenset({"up"})
    assert asked_calls(ModelResponse(request_seq=1, outcome="COMMITTED"), {}) == ()


def test_the_names_a_model_may_call_a_tool_by() -> None:
    assert model_names("S", "t") == {"S__t", "mcp__S__t", "t"}
    assert "web_fetch" in model_names(WEB, "web_fetch")


# -- refusals the proxy recorded serve nothing -------------------------------------------------


def _error(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("outcome", "error", "refusal"),
    [
        ("FAILED", {"error": {"code": -32600, "data": {"code": "tool_not_asked"}}}, True),
        ("FAILED", {"code": -32600, "data": {"code": "replay_miss"}}, True),
        ("FAILED", {"error": {"code": -32600, "data": {"code": "other"}}}, False),
        ("FAILED", {"error": {"code": "tool_not_asked"}}, False),  # not where MCP puts it
        ("FAILED", {"error": {"code": -32600, "data": {"code": ["tool_not_asked"]}}}, False),
        ("FAILED", [1], False),
        ("COMMITTED", {"error": {"code": -32600, "data": {"code": "tool_not_asked"}}}, False),
    ],
)
def test_a_tool_result_is_a_refusal_only_by_its_data_code(
    outcome: Outcome, error: Any, refusal: bool
) -> None:
    body = _error(error)
    result = ToolResult(
        call_seq=1, outcome=outcome, error_bytes=body, error_digest=digest(Domain.ERROR, body)
    )
    assert is_refusal(result) is refusal


@pytest.mark.parametrize(
    ("error", "refusal"),
    [
        ({"error": {"code": "tool_call_served", "message": "m"}}, True),
        ({"error": {"code": "egress_refused", "message": "m"}}, False),  # served, and failed
        ({"error": {"data": {"code": "tool_call_served"}}}, False),
    ],
)
def test_a_fetch_response_is_a_refusal_by_its_error_code(error: Any, refusal: bool) -> None:
    body = _error(error)
    answer = FetchResponse(
        request_seq=1, outcome="FAILED", error_bytes=body, error_digest=digest(Domain.ERROR, body)
    )
    assert is_refusal(answer) is refusal
    assert not is_refusal(FetchResponse(request_seq=1, outcome="FAILED"))
    bad = FetchResponse(
        request_seq=1, outcome="FAILED", error_bytes=b"{", error_digest=digest(Domain.ERROR, b"{")
    )
    assert not is_refusal(bad)


# -- the ledger --------------------------------------------------------------------------------


CALLS = (
    AskedCall(0, "c0", frozenset({"u0", "c0"}), "S__t", ARGS),
    AskedCall(1, "c1", frozenset({"u1", "c1"}), "S__t", ARGS),
    AskedCall(2, "c2", frozenset({"c2"}), "web_fetch", canonical_json({"url": "http://a/"})),
)


def _replies(seq: int) -> tuple[AskedCall, ...]:
    return CALLS if seq == 5 else ()


def _reply(outcome: Outcome = "COMMITTED") -> ModelResponse:
    return ModelResponse(request_seq=4, outcome=outcome)


def _call(call_id: str, idempotent: bool = False, reply_seq: int = 5) -> ToolCall:
    return ToolCall(
        reply_seq=reply_seq,
        call_id=call_id,
        server="S",
        tool="t",
        arguments=ARGS,
        arguments_digest=digest(Domain.TOOL_ARGUMENTS, ARGS),
        idempotent=idempotent,
    )


def _result(call_seq: int, outcome: Outcome, error: bytes | None = None) -> ToolResult:
    return ToolResult(
        call_seq=call_seq,
        outcome=outcome,
        error_bytes=error,
        error_digest=digest(Domain.ERROR, error) if error is not None else None,
    )


def _fold(ledger: Ledger, *bodies: tuple[int, Any]) -> Ledger:
    for seq, body in bodies:
        ledger.fold(seq, body, _replies)
    return ledger


def _pick(ledger: Ledger, call_id: str | None = None, **kw: Any) -> Admitted:
    args = kw.pop("arguments", ARGS)
    return pick(
        CALLS, 5, server="S", tool="t", arguments=args, call_id=call_id, ledger=ledger, **kw
    )


def test_the_latest_committed_reply_is_the_one_folded_last() -> None:
    ledger = _fold(Ledger(), (5, _reply()), (7, _reply("FAILED")), (8, _reply("UNKNOWN")))
    assert ledger.latest_reply == 5
    assert _fold(ledger, (9, _reply())).latest_reply == 9


def test_served_calls_are_skipped_in_order_and_a_done_call_is_refused() -> None:
    ledger = _fold(Ledger(), (5, _reply()), (6, _call("c0")), (7, _result(6, "COMMITTED")))
    assert _pick(ledger) == Admitted(5, "c1")  # c0 is served: the next identical call
    with pytest.raises(
        ToolCallServed, match=r"^call 'c0' \(S__t\) of the reply at seq 5 was served already$"
    ):
        _pick(ledger)  # c1 is now claimed too: the first refusal is said
    with pytest.raises(ToolCallServed, match="'c0'"):
        _pick(ledger, "u0")  # named by its upstream id
    ledger.release(5, CALLS[0])  # c0 is done, not claimed: a release keeps it served
    ledger.release(5, CALLS[2])  # never claimed: nothing to release
    with pytest.raises(ToolCallServed, match="'c0'"):
        _pick(ledger, "c0", claim=False)
    ledger.release(5, CALLS[1])
    assert _pick(ledger, "c1", claim=False) == Admitted(5, "c1")  # released: free again
    assert _pick(ledger, "c1", claim=False) == Admitted(5, "c1")  # checking claims nothing


def test_a_refusal_and_a_call_of_no_reply_serve_nothing() -> None:
    refusal = json.dumps({"error": {"code": 1, "data": {"code": "tool_call_served"}}}).encode()
    ledger = _fold(
        Ledger(),
        (5, _reply()),
        (6, _call("")),  # a refusal's tool.call names no call
        (7, _result(6, "FAILED", refusal)),
        (8, _call("c0")),
        (9, _result(8, "FAILED", refusal)),  # a refusal for c0 serves nothing either
        (10, _call("c1", reply_seq=3)),  # a reply that asked for nothing
        (11, _result(10, "COMMITTED")),
    )
    assert ledger.served == {}
    assert _pick(ledger) == Admitted(5, "c0")


def test_a_claim_by_default_marks_the_call_served() -> None:
    ledger = Ledger()
    ledger.claim(5, CALLS[1])
    with pytest.raises(ToolCallServed):
        ledger.claim(5, CALLS[1], claim=False)
    assert _pick(Ledger(), "c1") == Admitted(5, "c1")
    named = Ledger()
    _pick(named, "c1")  # a named call is claimed too
    with pytest.raises(ToolCallServed):
        _pick(named, "c1")


def test_unknown_may_go_again_only_if_idempotent_or_a_person_said_retry() -> None:
    ledger = _fold(
        Ledger(),
        (5, _reply()),
        (6, _call("c0", idempotent=True)),
        (7, _result(6, "UNKNOWN")),
        (8, _call("c1")),
        (9, _result(8, "UNKNOWN")),
    )
    assert _pick(ledger, "c0") == Admitted(5, "c0")
    with pytest.raises(ToolCallServed, match=r"not idempotent.*retry"):
        _pick(ledger, "c1")
    _fold(ledger, (10, TurnDecided(turn=0, call_seq=8, decision="skip")))
    with pytest.raises(ToolCallServed):
        _pick(ledger, "c1")
    _fold(ledger, (11, TurnDecided(turn=0, call_seq=8, decision="retry")))
    assert _pick(ledger, "c1") == Admitted(5, "c1")


def test_an_admitted_fetch_serves_its_call_and_a_refused_one_does_not() -> None:
    url = canonical_json({"url": "http://a/"})
    sent = b"GET / HTTP/1.1\r\n\r\n"
    key = digest(Domain.FETCH_REQUEST, sent)

    def fetch(call_id: str | None, reply_seq: int | None = 5) -> FetchRequest:
        return FetchRequest(
            method="GET",
            url="http://a/",
            request_bytes=sent,
            content_key=key,
            reply_seq=reply_seq,
            call_id=call_id,
        )

    served = json.dumps({"error": {"code": "tool_call_served"}}).encode()
    ledger = _fold(
        Ledger(),
        (5, _reply()),
        (6, fetch(None)),  # refused: names no call
        (7, FetchResponse(request_seq=6, outcome="FAILED")),
        (8, fetch("c2")),
        (9, FetchResponse(request_seq=8, outcome="UNKNOWN")),
    )
    web: dict[str, Any] = {"server": WEB, "tool": "web_fetch", "arguments": url, "ledger": ledger}
    assert pick(CALLS, 5, call_id=None, **web) == Admitted(5, "c2")  # unknown: a GET may go again
    ledger.release(5, CALLS[2])
    refused_body = FetchResponse(
        request_seq=10,
        outcome="FAILED",
        error_bytes=served,
        error_digest=digest(Domain.ERROR, served),
    )
    _fold(ledger, (10, fetch("c2")), (11, refused_body))  # a refusal recorded: still unknown
    assert pick(CALLS, 5, call_id="c2", claim=False, **web) == Admitted(5, "c2")
    _fold(ledger, (12, fetch("c2")), (13, FetchResponse(request_seq=12, outcome="FAILED")))
    with pytest.raises(ToolCallServed):  # failed: served
        pick(CALLS, 5, call_id=None, **web)


# -- pick's refusals name why ------------------------------------------------------------------


def test_no_committed_reply_names_what_the_record_holds() -> None:
    with pytest.raises(ReplyNotCommitted, match=r"^this session has no committed model reply$"):
        pick(None, None, server="S", tool="t", arguments=ARGS, call_id=None, ledger=Ledger())
    with pytest.raises(ReplyNotCommitted, match=r"seq 4 .*: it is a model reply recorded FAILED"):
        pick(
            None,
            4,
            server="S",
            tool="t",
            arguments=ARGS,
            call_id="c0",
            ledger=Ledger(),
            found="a model reply recorded FAILED",
        )
    with pytest.raises(ReplyNotCommitted) as caught:
        pick(None, 4, server="S", tool="t", arguments=ARGS, call_id=None, ledger=Ledger())
    assert str(caught.value) == "seq 4 of this session is not a committed model reply"
    assert type(caught.value) is ReplyNotCommitted


def test_a_named_call_must_exist_with_this_name_and_these_arguments() -> None:
    ledger = Ledger()
    with pytest.raises(ReplyNotCommitted, match="asked for no tool call 'zz'") as caught:
        _pick(ledger, "zz")
    assert type(caught.value) is ReplyNotCommitted
    with pytest.raises(ToolNotAsked, match=r"'c2' .* asked for 'web_fetch', not S/t"):
        _pick(ledger, "c2")
    other = canonical_json({"word": "y"})
    with pytest.raises(ToolNotAsked, match=r'other arguments: \{"word":"x"\} here \{"word":"y"\}'):
        _pick(ledger, "c0", arguments=other)
    assert ledger.served == {}


def test_an_unnamed_call_is_matched_by_name_then_arguments() -> None:
    ledger = Ledger()
    with pytest.raises(ToolNotAsked, match=r"no call of S/u \(it asked for S__t, web_fetch\)"):
        pick(CALLS, 5, server="S", tool="u", arguments=ARGS, call_id=None, ledger=ledger)
    with pytest.raises(ToolNotAsked) as none:
        pick((), 5, server="S", tool="t", arguments=ARGS, call_id=None, ledger=ledger)
    assert str(none.value) == (
        "the latest committed reply (seq 5) asked for no call of S/t (it asked for no tools)"
    )
    other = canonical_json({"word": "y"})
    with pytest.raises(ToolNotAsked) as caught:
        _pick(ledger, arguments=other)
    assert str(caught.value) == (
        "the latest committed reply (seq 5) asked for S__t with other arguments: "
        '{"word":"x"} here {"word":"y"}'
    )
    with pytest.raises(ToolNotAsked, match=r"other arguments: \(not JSON\) here "):
        pick(
            (AskedCall(0, "n", frozenset({"n"}), "S__t", None),),
            5,
            server="S",
            tool="t",
            arguments=ARGS,
            call_id=None,
            ledger=ledger,
        )


@pytest.mark.parametrize(
    ("arguments", "shown"),
    [
        (b"a" * 120, "a" * 120),  # at the limit: whole
        (b"a" * 121, "a" * 120 + "…"),  # past it: cut
        (b"\xff{}", "\ufffd{}"),  # not UTF-8: shown, with a replacement character
    ],
)
def test_arguments_are_shown_whole_up_to_a_limit(arguments: bytes, shown: str) -> None:
    asked = (AskedCall(0, "n", frozenset({"n"}), "S__t", b"{}"),)
    with pytest.raises(ToolNotAsked) as caught:
        pick(asked, 5, server="S", tool="t", arguments=arguments, call_id="n", ledger=Ledger())
    assert str(caught.value).endswith(f"other arguments: {{}} here {shown}")
