"""One set of limits on outside JSON (``record.limits``), and every reply recorded whatever it is.

A real proxy on loopback in front of a scripted upstream, over a real SQLite store:

- a client request past a limit (nesting, number length, message or tool count) gets a 400
  ``past_limit`` and is recorded as a refusal, never a 500; one at the limit goes upstream;
- an upstream reply is recorded byte for byte whatever it holds (nesting past every parser,
  a 5,000-digit integer, NaN, broken UTF-8, a cut-off document), JSON or SSE, with its facts
  left empty when they cannot be read;
- a property test sends deep, long and odd JSON both ways, then reads the store with every
  reader: recovery, the audit with a key, ``log show`` (function and CLI), the panel and
  reconstruct; none of them fails on anything the writer recorded;
- recovery that meets an entry an older writer recorded past today's limits reports it and
  starts anyway.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egress_proxy.recovery import Unreadable, recover_unknown
from egress_proxy.server import ProxyServer
from record.limits import MAX_DEPTH, MAX_MESSAGES, MAX_NUMBER_CHARS, MAX_TOOLS
from record.log import Log
from record.schema import ModelRequest, ModelResponse
from record.seal import KeyPair
from tests.egress_proxy.loopback import (
    ENV,
    FakeUpstream,
    LoopbackServer,
    Rig,
    Script,
    proxy_config,
)

CHAT = "/v1/chat/completions"


def nested(depth: int, leaf: str = "1") -> str:
    """``depth`` levels of arrays and objects, alternating, around ``leaf``."""
    text = leaf
    for level in range(depth):
        text = f'{{"k":{text}}}' if level % 2 else f"[{text}]"
    return text


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def raw_chat(member: str) -> bytes:
    """A chat request with one more top-level member given as raw JSON text."""
    return b'{"model":"m","messages":[{"role":"user","content":"hi"}],"x":' + member.encode() + b"}"


def sse(*datas: str) -> bytes:
    return b"".join(f"data: {d}\n\n".encode() for d in datas) + b"data: [DONE]\n\n"


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A proxy of this test's own, so its store can be closed and read by every reader."""
    store_path = tmp_path / "record.db"
    appliance = KeyPair.generate()
    log = Log.open(store_path, appliance_key=appliance)
    upstream = FakeUpstream()
    try:
        with LoopbackServer(upstream) as up, ProxyServer(proxy_config(up.url), log, env=ENV) as p:
            yield Rig(upstream, up.url, p, log, store_path, KeyPair.generate(), appliance)
    finally:
        log.close()


def post(rig: Rig, session: Any, body: bytes) -> httpx.Response:
    return httpx.post(
        session.openai_base_url + "/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {session.token}", "content-type": "application/json"},
        timeout=30,
    )


def last_pair(rig: Rig, stream: str) -> tuple[ModelRequest, ModelResponse]:
    bodies = rig.bodies(stream)
    requests = [b for _, b in bodies.values() if isinstance(b, ModelRequest)]
    replies = [b for _, b in bodies.values() if isinstance(b, ModelResponse)]
    return requests[-1], replies[-1]


PAST_LIMITS = {
    "nesting one past the limit": raw_chat(nested(MAX_DEPTH)),  # the body adds a level
    "nesting past the parser's recursion": raw_chat(nested(5000)),
    "a 5,000-digit integer": raw_chat("9" * 5000),
    "a number one character too long": raw_chat("1." + "0" * (MAX_NUMBER_CHARS - 1)),
    "a float of 400 digits": raw_chat("1" * 200 + "." + "1" * 200),
    "too many messages": json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)}
    ).encode(),
    "too many tools": json.dumps(
        chat(tools=[{"type": "function", "function": {"name": f"t{i}"}} for i in range(1025)])
    ).encode(),
}


@pytest.mark.parametrize("body", PAST_LIMITS.values(), ids=PAST_LIMITS.keys())
def test_a_request_past_a_limit_is_a_recorded_400(rig: Rig, body: bytes) -> None:
    session = rig.open_session()
    reply = post(rig, session, body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["code"] == "past_limit"
    assert "limit" in reply.json()["error"]["message"]
    assert rig.upstream.received == []  # nothing went upstream
    request, answer = last_pair(rig, session.session_id)
    assert request.input_bytes == body and request.request_bytes == b""
    assert answer.outcome == "FAILED" and answer.status == 400
    assert answer.error_bytes == reply.content


def test_a_request_at_the_limits_goes_upstream(rig: Rig) -> None:
    assert MAX_TOOLS == 1024
    session = rig.open_session()
    at_limit = raw_chat(nested(MAX_DEPTH - 1))  # the body's own object is the last level
    reply = post(rig, session, at_limit)
    assert reply.status_code == 200, reply.text
    assert rig.upstream.received[-1].body == at_limit  # untouched: no stage changed it


ODD_REPLIES = {
    "reproducibility nested 220 deep": '{"id":"r","reproducibility":' + nested(220) + "}",
    "nested past the parser's recursion": nested(5000),
    "a 5,000-digit integer": '{"id":"r","usage":{"n":' + "9" * 5000 + "}}",
    "NaN": '{"id":"r","x":NaN}',
    "a cut-off document": '{"id":"r","choices":[{"message":',
    "a lone surrogate escape": '{"id":"r","x":"\\ud800"}',
}


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("text", ODD_REPLIES.values(), ids=ODD_REPLIES.keys())
def test_every_reply_is_recorded_with_its_bytes(rig: Rig, text: str, streamed: bool) -> None:
    body = sse(text) if streamed else text.encode()
    rig.upstream.script = Script(
        chunks=[body], content_type="text/event-stream" if streamed else "application/json"
    )
    session = rig.open_session()
    reply = post(rig, session, json.dumps(chat(stream=streamed)).encode())
    assert reply.status_code == 200
    assert text.encode()[:20] in reply.content  # the client got the reply
    _, answer = last_pair(rig, session.session_id)
    assert answer.outcome == "COMMITTED"
    assert answer.response_bytes == body  # every byte, whatever it holds
    assert answer.reproducibility is None  # facts past the limits are not embedded


def test_a_broken_utf8_reply_is_recorded(rig: Rig) -> None:
    body = b'{"id":"r","x":"\xff\xfe"}'
    rig.upstream.script = Script(chunks=[body])
    session = rig.open_session()
    assert post(rig, session, json.dumps(chat()).encode()).status_code == 200
    _, answer = last_pair(rig, session.session_id)
    assert answer.outcome == "COMMITTED" and answer.response_bytes == body


# -- the property: whatever the writer records, every reader reads ------------------------------

_scalars = st.one_of(
    st.integers(-(2**60), 2**60).map(str),
    st.integers(1, 6000).map(lambda n: "9" * n),  # long integers, past int()'s limit too
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["NaN", "Infinity", "-0", "1e400", "true", "null", '"\\ud800"', '"\\u0000"']),
    st.text(max_size=20).map(json.dumps),
)


@st.composite
def odd_json(draw: st.DrawFn) -> str:
    leaf = draw(_scalars)
    depth = draw(st.one_of(st.integers(0, 8), st.integers(100, 260), st.integers(900, 2000)))
    text = nested(depth, leaf)
    if draw(st.booleans()):
        text = '{"id":"r","a":1,"a":2,"reproducibility":' + text + "}"  # duplicate member
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]  # cut anywhere
    return text


def test_whatever_the_writer_records_every_reader_reads(tmp_path: Path) -> None:
    store_path = tmp_path / "record.db"
    appliance, user = KeyPair.generate(), KeyPair.generate()
    log = Log.open(store_path, appliance_key=appliance)
    upstream = FakeUpstream()
    streams: list[str] = []
    with LoopbackServer(upstream) as up, ProxyServer(proxy_config(up.url), log, env=ENV) as proxy:
        rig = Rig(upstream, up.url, proxy, log, store_path, user, appliance)
        session = proxy.registry.open_session([user.recipient], {"test": "odd"}, None)
        streams.append(session.session_id)

        @settings(
            max_examples=40,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(request=odd_json(), reply=odd_json(), streamed=st.booleans())
        def send(request: str, reply: str, streamed: bool) -> None:
            body = sse(reply) if streamed else reply.encode("utf-8", "surrogatepass")
            upstream.script = Script(
                chunks=[body], content_type="text/event-stream" if streamed else "text/plain"
            )
            for sent in (raw_chat(request), json.dumps(chat(stream=streamed)).encode()):
                answer = post(rig, session, sent)
                assert answer.status_code in (200, 400), answer.text

        send()
    log.close()

    # Recovery: nothing was left unanswered, and nothing it met stopped it.
    unreadable: list[Unreadable] = []
    log = Log.open(store_path, appliance_key=appliance)
    try:
        assert recover_unknown(log, unreadable) == [] and unreadable == []
    finally:
        log.close()

    from record.audit import verify_store
    from record.show import show_stream

    report = verify_store(store_path, key=user, allow_unsigned_tail=True)
    assert not report.problems, report.problems
    for stream in streams:
        assert len(list(show_stream(store_path, stream, key=user))) > 80
        assert len(list(show_stream(store_path, stream, key=user, as_json=True))) > 80
    key_file = tmp_path / "user.key"
    user.write(key_file)
    shown = subprocess.run(
        [sys.executable, "-m", "affidavit", "log", "show", "--store", str(store_path),
         streams[0], "--key", str(key_file)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr

    from harness.calls import reconstruct_calls

    rebuilt = reconstruct_calls(store_path, streams[0], user)
    assert len(rebuilt.calls) > 40

    from harness.panel.server import running_panel
    from harness.panel.source import ApplianceSource
    from harness.state import Home

    home = Home(tmp_path)
    with running_panel(ApplianceSource(home, user), token="t") as panel:
        auth = {"authorization": "Bearer t"}
        for page in (f"/s/{streams[0]}", f"/s/{streams[0]}/calls"):
            got = httpx.get(panel.base + page, headers=auth, timeout=60)
            assert got.status_code == 200, (page, got.text[-2000:])


def test_recovery_reports_an_unreadable_entry_and_goes_on(tmp_path: Path) -> None:
    """An older writer put facts nested past pydantic-core's parser into an entry; recovery
    reports it, answers the request after it, and the proxy starts."""
    store_path = tmp_path / "record.db"
    appliance, user = KeyPair.generate(), KeyPair.generate()
    log = Log.open(store_path, appliance_key=appliance)
    try:
        stream = "old"
        log.open_stream(stream, [user.recipient, appliance.recipient])
        first = log.append(stream, _request()).seq
        deep = json.loads(nested(250))
        log.append(stream, ModelResponse(request_seq=first, outcome="COMMITTED",
                                         reproducibility={"x": deep}))  # fmt: skip
        second = log.append(stream, _request()).seq
        unreadable: list[Unreadable] = []
        recovered = recover_unknown(log, unreadable)
        assert [u.seq for u in unreadable] == [first + 1]
        assert "recursion limit" in unreadable[0].reason
        assert [(r.request_seq, r.kind) for r in recovered] == [(second, "model.request")]
        assert recover_unknown(log) == []  # and it stays answered
    finally:
        log.close()
    log = Log.open(store_path, appliance_key=appliance)
    with ProxyServer(proxy_config("http://127.0.0.1:9"), log, env=ENV) as proxy:
        assert proxy.recovered == []
        assert httpx.get(proxy.url + "/metrics", timeout=10).status_code == 200
    log.close()


def test_recovery_leaves_a_stream_another_live_writer_holds(tmp_path: Path) -> None:
    """Its unanswered request may be in flight in that writer, not lost: recovery says why it
    left the stream alone, answers nothing there, and the proxy starts."""
    store_path = tmp_path / "record.db"
    appliance, user = KeyPair.generate(), KeyPair.generate()
    with Log.open(store_path, appliance_key=appliance) as live:
        live.open_stream("busy", [user.recipient, appliance.recipient])
        asked = live.append("busy", _request()).seq  # its reply still on its way
        with Log.open(store_path, appliance_key=appliance, lease_wait=0.1) as second:
            unreadable: list[Unreadable] = []
            assert recover_unknown(second, unreadable) == []
        assert [(u.stream, u.seq) for u in unreadable] == [("busy", None)]
        assert unreadable[0].reason.startswith("not answered: lease_held: stream 'busy' is ")
        answered = live.append("busy", ModelResponse(request_seq=asked, outcome="COMMITTED"))
        assert answered.seq == asked + 1  # nothing came in between


def _request() -> ModelRequest:
    from record.digest import Domain, digest, prompt_bytes

    prompt = prompt_bytes({})
    return ModelRequest(
        content_key=digest(Domain.REQUEST, b"{}"),
        input_digest=digest(Domain.INPUT, b"{}"),
        prompt_digest=digest(Domain.PROMPT, prompt),
        request_bytes=b"{}",
        input_bytes=b"{}",
        prompt_bytes=prompt,
        provider={"name": "p", "endpoint": "http://127.0.0.1:9/v1/chat/completions"},
        model_id="m",
        params={},
    )


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=odd_json(), streamed=st.booleans())
def test_the_readers_of_recorded_bytes_take_anything(text: str, streamed: bool) -> None:
    """The functions that turn recorded bytes into what people and replays see, one stage
    each, on hostile bytes: they answer, never raise."""
    from harness.calls import _annotation
    from harness.panel.views import mcp_result_text, pretty_bytes, reply_parts
    from harness.tools import fetch_text, recorded_output
    from record.schema import ToolResult

    data = sse(text) if streamed else text.encode("utf-8", "surrogatepass")
    reply_parts(data)
    pretty_bytes(data)
    mcp_result_text(data)
    fetch_text(200, data)
    _annotation(data, streamed)
    recorded_output(ToolResult(call_seq=1, outcome="COMMITTED", result_bytes=data))
    recorded_output(ToolResult(call_seq=1, outcome="FAILED", error_bytes=data))
