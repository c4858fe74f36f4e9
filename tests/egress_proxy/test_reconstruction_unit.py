"""Reconstruct's tools as a unit (``egress_proxy.replay.Reconstruction``): a recorded tool
result and a recorded fetch are served by their exact arguments or request bytes, once each,
and anything else is a miss; a fetch is answered as the proxy answered it live.

``test_replay.py`` drives model calls through the whole pipeline; the harness's reconstruct
tests drive these methods on the engine. These pin each branch without one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from egress_proxy.errors import EgressRefused, ReplayMiss
from egress_proxy.fetch import answer_json, parse_fetch
from egress_proxy.replay import reconstruct_pipeline
from egress_proxy.tool_config import FetchConfig
from record.digest import Domain, canonical_json, digest, prompt_bytes
from record.schema import (
    FetchRequest,
    FetchResponse,
    ModelRequest,
    PinsSet,
    Provider,
    Strict,
    ToolCall,
    ToolResult,
)
from record.seal import KeyPair
from tests.egress_proxy.test_replay_plan_unit import URL, _reply, _request

ARGS = b'{"word":"x"}'
PAGE = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


def _fetch_body(url: str) -> bytes:
    return json.dumps({"method": "GET", "url": url}).encode()


def _fetched(url: str, answer: FetchResponse, at: int) -> list[tuple[int, Strict]]:
    sent = parse_fetch(_fetch_body(url), FetchConfig().user_agent).request_bytes()
    request = FetchRequest(
        method="GET",
        url=url,
        request_bytes=sent,
        content_key=digest(Domain.FETCH_REQUEST, sent),
    )
    return [(at, request), (at + 1, answer.model_copy(update={"request_seq": at}))]


def _bodies() -> list[tuple[int, Strict]]:
    refused = EgressRefused("10.0.0.1 is private").body()
    return [
        (1, _request("one")),
        (2, _reply(1)),
        (
            3,
            ToolCall(
                reply_seq=2,
                call_id="c1",
                server="S",
                tool="t",
                arguments=ARGS,
                arguments_digest=digest(Domain.TOOL_ARGUMENTS, ARGS),
                idempotent=False,
            ),
        ),
        (4, ToolResult(call_seq=3, outcome="COMMITTED", result_bytes=b"{}")),
        *_fetched(
            "http://a/",
            FetchResponse(request_seq=0, outcome="COMMITTED", status=200, response_bytes=PAGE),
            5,
        ),
        *_fetched(
            "http://10.0.0.1/",
            FetchResponse(
                request_seq=0,
                outcome="FAILED",
                error_bytes=refused,
                error_digest=digest(Domain.ERROR, refused),
            ),
            7,
        ),
        *_fetched("http://b/", FetchResponse(request_seq=0, outcome="UNKNOWN"), 9),
    ]


def _rebuilt() -> Any:
    return reconstruct_pipeline("unused.db", "src", KeyPair.generate(), bodies=_bodies())


def test_a_recorded_tool_result_is_served_once_by_its_arguments() -> None:
    rebuilt = _rebuilt()
    served = rebuilt.tool_result("S", "t", ARGS)
    assert (served.seq, served.reply_seq, served.reply.outcome) == (3, 4, "COMMITTED")
    with pytest.raises(ReplayMiss, match="tool call 't' on 'S'"):
        rebuilt.tool_result("S", "t", ARGS)
    with pytest.raises(ReplayMiss):
        _rebuilt().tool_result("S", "t", b'{"word":"y"}')


def test_a_recorded_fetch_answers_as_it_did_live() -> None:
    rebuilt = _rebuilt()
    assert rebuilt.fetch(_fetch_body("http://a/")) == (200, answer_json(PAGE))
    status, body = rebuilt.fetch(_fetch_body("http://10.0.0.1/"))
    assert (status, json.loads(body)["error"]["code"]) == (403, "egress_refused")
    status, body = rebuilt.fetch(_fetch_body("http://b/"))  # no answer: as the proxy said
    assert (status, json.loads(body)["error"]["code"]) == (502, "upstream_unavailable")
    with pytest.raises(ReplayMiss, match="fetch call 'http://a/'"):
        rebuilt.fetch(_fetch_body("http://a/"))  # served once


def test_a_fetch_refused_before_it_was_recorded_is_refused_again() -> None:
    status, body = _rebuilt().fetch(b'{"method": "GET"}')
    assert (status, json.loads(body)["error"]["code"]) == (400, "malformed_fetch")


def test_a_fetch_with_no_recorded_answer_is_a_miss() -> None:
    bodies = [pair for pair in _bodies() if pair[0] != 6]  # http://a/'s answer is gone
    rebuilt = reconstruct_pipeline("unused.db", "src", KeyPair.generate(), bodies=bodies)
    with pytest.raises(ReplayMiss, match="seq 5 got no response"):
        rebuilt.fetch(_fetch_body("http://a/"))


def test_the_inputs_and_a_call_past_the_plan() -> None:
    rebuilt = _rebuilt()
    assert rebuilt.recorded_inputs() == [
        json.dumps({"messages": [{"role": "user", "content": "one"}]}).encode()
    ]
    rebuilt.next_call(rebuilt.recorded_inputs()[0])
    with pytest.raises(ReplayMiss):
        rebuilt.next_call(b"{}")


def test_a_rebuilt_call_is_annotated_with_its_recorded_reply() -> None:
    """With the annotation stage, the client sees the note it saw live: the recorded reply's
    seq, outcome and digest (reconstruct commits nothing of its own)."""
    bodies = _bodies()
    data = json.dumps({"model": "m", "messages": [{"role": "user", "content": "one"}]}).encode()
    keys = {"content_key": digest(Domain.REQUEST, data), "request_bytes": data}
    request = _request("one").model_copy(
        update={**keys, "input_bytes": data, "clock": None}  # sent as the client wrote it
    )
    bodies[0] = (1, request)
    rebuilt = reconstruct_pipeline(
        "unused.db", "src", KeyPair.generate(), bodies=bodies, annotated=True
    )
    reply, data = asyncio.run(rebuilt.run(request.input_bytes))
    note = json.loads(data)["affidavit"]
    assert (reply.status, note["seq"], note["outcome"]) == (200, 2, "COMMITTED")
    assert note["response_digest"] == digest(Domain.RESPONSE, b'{"ok":1}')
    assert note["stream"] == "src" and note["request_seq"] == 1


def _two_steps() -> list[tuple[int, Strict]]:
    """Two model calls the client sent as they were recorded (no clock injected)."""
    bodies: list[tuple[int, Strict]] = []
    for seq, text in ((1, "one"), (3, "two")):
        data = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
        raw = data.encode()
        request = _request(text).model_copy(
            update={
                "content_key": digest(Domain.REQUEST, raw),
                "request_bytes": raw,
                "input_bytes": raw,
                "clock": None,
            }
        )
        bodies += [(seq, request), (seq + 1, _reply(seq))]
    return bodies


def test_each_input_takes_the_next_recorded_step_and_no_more() -> None:
    bodies = _two_steps()
    rebuilt = reconstruct_pipeline("unused.db", "src", KeyPair.generate(), bodies=bodies)
    assert rebuilt.stream == "src"
    first, second = rebuilt.recorded_inputs()
    reply, data = asyncio.run(rebuilt.run(first))
    assert (reply.status, data) == (200, b'{"ok":1}')  # not annotated unless asked: verbatim
    asyncio.run(rebuilt.run(second))
    with pytest.raises(ReplayMiss) as miss:
        rebuilt.next_call(first)
    assert str(miss.value) == "the record does not hold this model call '' on ''; nearest is seq 1"


def test_a_turn_is_rebuilt_from_its_own_steps() -> None:
    from tests.egress_proxy.test_replay_plan_unit import _bodies as turns

    rebuilt = reconstruct_pipeline("unused.db", "src", KeyPair.generate(), bodies=turns(), turn=1)
    assert [call.seq for call in rebuilt.plan] == [15]


def _model_call(
    asked: dict[str, Any],
    sent: dict[str, Any] | None = None,
    *,
    provider: Provider | None = None,
    **recorded: Any,
) -> ModelRequest:
    """A recorded model call: the client's ``asked`` request and, when a stage changed it,
    the ``sent`` one (re-serialised as the pipeline does); else the client's bytes went up."""
    raw = json.dumps(asked).encode()
    data = raw if sent is None else canonical_json(sent)
    prompt = prompt_bytes(json.loads(data))
    return ModelRequest(
        content_key=digest(Domain.REQUEST, data),
        input_digest=digest(Domain.INPUT, raw),
        prompt_digest=digest(Domain.PROMPT, prompt),
        request_bytes=data,
        input_bytes=raw,
        prompt_bytes=prompt,
        provider=provider or Provider(name="openai", endpoint=URL),
        model_id=str(asked.get("model", "")),
        params={},
        **recorded,
    )


def _drive(rebuilt: Any) -> tuple[Any, Any, bytes]:
    """The rebuilt call, its reply and the bytes delivered, for the first recorded input."""

    async def drive() -> tuple[Any, Any, bytes]:
        call = rebuilt.next_call(rebuilt.recorded_inputs()[0])
        reply = await rebuilt.handler(call)
        return call, reply, b"".join([chunk async for chunk in reply.body])

    return asyncio.run(drive())


ASKED = {"model": "m", "messages": [{"role": "user", "content": "one"}]}


def test_a_rebuilt_note_names_the_recorded_keys_and_no_tree_head_of_its_own() -> None:
    """The note carries the recorded content key; reconstruct appends nothing, so it claims no
    tree size, root or checkpoint (a live note's come from the reply's own commit)."""
    request = _model_call(ASKED)
    bodies: list[tuple[int, Strict]] = [(1, request), (2, _reply(1))]
    rebuilt = reconstruct_pipeline(
        "unused.db", "src", KeyPair.generate(), bodies=bodies, annotated=True
    )
    call, _, data = _drive(rebuilt)
    note = json.loads(data)["affidavit"]
    assert note["content_key"] == request.content_key == call.content_key
    assert note["prompt_digest"] == request.prompt_digest
    assert (note["tree_size"], note["root_hash"], note["checkpoint"]) == (0, "", None)


def test_a_rebuilt_stream_gets_its_note_before_the_terminating_event() -> None:
    """A streamed reply is delivered event by event, the note as an event of its own just
    before ``[DONE]``, as the proxy sent it live."""
    asked = {**ASKED, "stream": True}
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "hi"}}]}  # fmt: skip
    event, done = b"data: " + json.dumps(chunk).encode() + b"\n\n", b"data: [DONE]\n\n"
    bodies: list[tuple[int, Strict]] = [(1, _model_call(asked)), (2, _reply(1, event + done))]
    rebuilt = reconstruct_pipeline(
        "unused.db", "src", KeyPair.generate(), bodies=bodies, annotated=True
    )
    reply, data = asyncio.run(rebuilt.run(rebuilt.recorded_inputs()[0]))  # as chunks come
    assert reply.is_sse and data.startswith(event + b"data: ") and data.endswith(b"\n\n" + done)
    (note,) = data[len(event) : -len(done)].split(b"\n\n")[:-1]
    annotation = json.loads(note.removeprefix(b"data: "))
    assert (annotation["id"], annotation["choices"]) == ("c", [])
    assert (annotation["affidavit"]["seq"], annotation["affidavit"]["request_seq"]) == (2, 1)


def test_a_pin_the_record_shows_an_engine_took_is_set_again() -> None:
    """``strict_cache`` in the recorded bytes says the provider set ``engine_extensions``: the
    session's ``strict_cache`` pin is applied again, so the request bytes are the recorded ones."""
    sent = {**ASKED, "strict_cache": True}
    bodies: list[tuple[int, Strict]] = [
        (0, PinsSet(pins={"strict_cache": True})),
        (1, _model_call(ASKED, sent, pins={"strict_cache": True})),
        (2, _reply(1)),
    ]
    rebuilt = reconstruct_pipeline(
        "unused.db", "src", KeyPair.generate(), bodies=bodies, annotated=True
    )
    _, reply, data = _drive(rebuilt)
    assert (reply.status, rebuilt.transport.calls[0].body) == (200, canonical_json(sent))
    note = json.loads(data)["affidavit"]
    assert (note["pins_applied"], note["pins_not_applied"]) == ({"strict_cache": True}, {})


def test_a_pin_the_provider_did_not_take_is_refused_in_its_name_again() -> None:
    """No ``strict_cache`` in the recorded bytes: the provider did not set
    ``engine_extensions``, and the note says so naming the recorded provider, as it did live."""
    provider = Provider(name="vendor-a", endpoint=URL)
    bodies: list[tuple[int, Strict]] = [
        (0, PinsSet(pins={"strict_cache": True})),
        (1, _model_call(ASKED, provider=provider)),
        (2, _reply(1)),
    ]
    rebuilt = reconstruct_pipeline(
        "unused.db", "src", KeyPair.generate(), bodies=bodies, annotated=True
    )
    _, _, data = _drive(rebuilt)
    note = json.loads(data)["affidavit"]
    assert (note["pins"], note["pins_applied"]) == ({"strict_cache": True}, {})
    assert note["pins_not_applied"] == {
        "strict_cache": "strict_cache is an engine extension; "
        "provider 'vendor-a' does not set engine_extensions"
    }


def test_a_messages_call_is_sent_with_its_recorded_api_version_and_no_credential() -> None:
    asked = {"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    provider = Provider(
        name="anthropic", endpoint="http://engine/v1/messages", api_version="2023-01-01"
    )
    bodies: list[tuple[int, Strict]] = [(1, _model_call(asked, provider=provider)), (2, _reply(1))]
    rebuilt = reconstruct_pipeline("unused.db", "src", KeyPair.generate(), bodies=bodies)
    _drive(rebuilt)
    (sent,) = rebuilt.transport.calls
    assert sent.url == "http://engine/v1/messages"
    headers = dict(sent.headers)
    assert headers["anthropic-version"] == "2023-01-01"  # not today's default
    assert "x-api-key" not in headers and "authorization" not in headers


def test_a_clock_recorded_before_its_rule_was_is_prepended_again() -> None:
    """A record without ``clock_rule`` was written under ``prepend``: the clock is a system
    message of its own before the client's, and the rebuilt call says that rule."""
    clock = "2026-12-01T00:00:00Z"
    asked = {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": "hi"}]}  # fmt: skip
    line = {"role": "system", "content": f"Current date and time: {clock} (UTC)"}
    sent = {**asked, "messages": [line, *asked["messages"]]}
    bodies: list[tuple[int, Strict]] = [(1, _model_call(asked, sent, clock=clock)), (2, _reply(1))]
    rebuilt = reconstruct_pipeline("unused.db", "src", KeyPair.generate(), bodies=bodies)
    call, reply, _ = _drive(rebuilt)
    assert rebuilt.transport.calls[0].body == canonical_json(sent)
    assert (call.clock, call.clock_rule, reply.status) == (clock, "prepend", 200)


def test_a_call_to_an_endpoint_no_dialect_is_mounted_on_is_a_miss() -> None:
    provider = Provider(name="openai", endpoint="http://engine/v1/embeddings")
    bodies: list[tuple[int, Strict]] = [(1, _model_call(ASKED, provider=provider))]
    with pytest.raises(ReplayMiss) as miss:
        reconstruct_pipeline("unused.db", "src", KeyPair.generate(), bodies=bodies)
    assert str(miss.value) == (
        "no dialect is mounted on the recorded endpoint 'http://engine/v1/embeddings'"
    )
