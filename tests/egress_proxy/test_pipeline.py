"""Single pipeline stages, driven through a MockTransport over a real SQLite store.

These are the unit tests style.md allows a mock for; every acceptance line is proven again
against real servers in the other files. Each proves one stage's rule:

- ``identity`` has made ``model.request`` durable (another connection reads it) before the
  next stage runs; if the record refuses it, nothing is dialed (``RecordUnavailable``).
- ``pins`` leaves an unpinned request's bytes alone, and sets only the pins the dialect has.
- ``annotate`` puts exactly one annotation event on an event boundary before the stream's
  terminating event, whatever the framing (CRLF, no ``[DONE]``, an unterminated last event,
  bytes after ``message_stop``); the client's bytes minus that event are the upstream's,
  and so are the record's. A provider error passes through untouched.
- ``capture`` records a body cut mid-way as ``UNKNOWN`` with the bytes that did arrive, and
  the client's stream fails rather than ending as if complete.
- the splice of a non-streamed annotation and the reading of fingerprint and
  reproducibility block.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egress_proxy.errors import RecordUnavailable, UpstreamCut
from egress_proxy.pipeline import Call, Reply, TaskSet, Upstream, build_pipeline, identity, pins
from egress_proxy.providers import ANTHROPIC, OPENAI, Dialect, reply_facts, splice_member
from egress_proxy.sessions import Session, SessionRegistry
from egress_proxy.sse import EventSplitter, parse_event
from egress_proxy.transports.base import UpstreamRequest
from egress_proxy.transports.mock import MockResponse, MockTransport
from record.digest import Domain, canonical_json, digest
from record.log import Log
from record.schema import ModelRequest, ModelResponse
from record.seal import KeyPair
from tests.egress_proxy.loopback import read_bodies, split_annotation

SSE = (("content-type", "text/event-stream"),)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[Log, Path, KeyPair]]:
    user = KeyPair.generate()
    path = tmp_path / "record.db"
    log = Log.open(path, appliance_key=KeyPair.generate())
    yield log, path, user
    log.close()


def make_call(
    session: Session, dialect: Dialect, raw: bytes, headers: dict[str, str] | None = None
) -> Call:
    upstream = Upstream("mock", dialect, "http://upstream.invalid" + dialect.route, "key")
    request = json.loads(raw)
    version = dialect.api_version(headers or {}, None)
    return Call(session, upstream, headers or {}, raw, request, raw, api_version=version)


def open_session(log: Log, user: KeyPair, pins: dict[str, Any] | None = None) -> Session:
    registry = SessionRegistry(log, "http://127.0.0.1:1")
    opened = registry.open_session([user.recipient], pins=pins)
    session = registry.get(opened.session_id)
    assert session is not None
    return session


async def drive(transport: MockTransport, call: Call, log: Log) -> tuple[Reply, bytes]:
    handler = build_pipeline(log, transport, TaskSet())
    reply = await handler(call)
    body = b"".join([chunk async for chunk in reply.body])
    return reply, body


def test_identity_is_durable_before_the_next_stage(env: tuple[Log, Path, KeyPair]) -> None:
    log, path, user = env
    session = open_session(log, user)
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 1}'
    call = make_call(session, OPENAI, raw)
    seen: list[ModelRequest] = []

    async def next_stage(c: Call) -> Reply:
        bodies = read_bodies(path, session.id, user)  # a separate, read-only connection
        _, body = bodies[max(bodies)]
        assert isinstance(body, ModelRequest)
        seen.append(body)
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        asyncio.run(identity(log)(call, next_stage))
    (body,) = seen
    assert body.content_key == digest(Domain.REQUEST, raw) == call.content_key
    assert body.request_bytes == body.input_bytes == raw
    assert body.params == {"seed": 1}
    assert body.provider.endpoint == "http://upstream.invalid/v1/chat/completions"


def test_nothing_is_dialed_when_the_record_refuses(env: tuple[Log, Path, KeyPair]) -> None:
    log, _, user = env
    session = open_session(log, user)
    call = make_call(session, OPENAI, b'{"model":"m","messages":[]}')
    mock = MockTransport(lambda req: MockResponse())
    log.close()
    with pytest.raises(RecordUnavailable):
        asyncio.run(drive(mock, call, log))
    assert mock.calls == []


def test_pins_apply_only_what_the_dialect_has(env: tuple[Log, Path, KeyPair]) -> None:
    log, _, user = env
    raw = b'{"model":"m", "messages":[], "temperature":1.0}'
    sent: list[UpstreamRequest] = []

    async def run(call: Call) -> None:
        async def next_stage(c: Call) -> Reply:
            sent.append(UpstreamRequest("POST", "", (), c.request_bytes))
            raise RuntimeError("stop")

        with pytest.raises(RuntimeError):
            await pins(call, next_stage)

    unpinned = make_call(open_session(log, user), OPENAI, raw)
    asyncio.run(run(unpinned))
    assert sent[-1].body == raw and unpinned.pins is None  # not re-serialised

    pinned_session = open_session(log, user, {"seed": 7, "temperature": 0, "top_k": 3})
    anthropic = make_call(pinned_session, ANTHROPIC, raw)
    asyncio.run(run(anthropic))
    assert anthropic.pins == {"temperature": 0, "top_k": 3}  # Anthropic has no seed
    assert sent[-1].body == canonical_json(
        {"model": "m", "messages": [], "temperature": 0, "top_k": 3}
    )
    openai = make_call(pinned_session, OPENAI, raw)
    asyncio.run(run(openai))
    assert openai.pins == {"seed": 7, "temperature": 0, "top_k": 3}


OPENAI_CRLF = b'data: {"id":"c1","created":5,"model":"m","choices":[{"index":0,"delta":{"content":"hi"}}]}\r\n\r\ndata: {"id":"c1","created":5,"model":"m","choices":[],"usage":{"total_tokens":3}}\r\n\r\ndata: [DONE]\r\n\r\n'
OPENAI_NO_DONE = b'data: {"id":"c2","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
OPENAI_PARTIAL_TAIL = b'data: {"id":"c3","choices":[]}\n\ndata: {"id":"c3","cho'
ANTHROPIC_UNTERMINATED = b'event: message_start\ndata: {"type":"message_start"}\n\nevent: message_stop\ndata: {"type":"message_stop"}'
ANTHROPIC_AFTER_STOP = (
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n: trailing comment\n\n'
)


@pytest.mark.parametrize(
    ("dialect", "stream", "index"),
    [
        (OPENAI, OPENAI_CRLF, 2),  # before [DONE]
        (OPENAI, OPENAI_NO_DONE, 1),  # at the end
        (OPENAI, OPENAI_PARTIAL_TAIL, 1),  # before the unterminated tail, never inside it
        (ANTHROPIC, ANTHROPIC_UNTERMINATED, 1),  # before the held-back message_stop
        (ANTHROPIC, ANTHROPIC_AFTER_STOP, 0),  # message_stop and what follows it held back
    ],
)
def test_annotation_sits_before_the_terminating_event(
    env: tuple[Log, Path, KeyPair], dialect: Dialect, stream: bytes, index: int
) -> None:
    log, path, user = env
    session = open_session(log, user)
    call = make_call(session, dialect, b'{"model":"m","messages":[],"stream":true}')
    chunks = [stream[i : i + 5] for i in range(0, len(stream), 5)]
    mock = MockTransport(lambda r: MockResponse(200, SSE, chunks))
    _, delivered = asyncio.run(drive(mock, call, log))
    rest, note, at = split_annotation(delivered)
    assert rest == stream
    assert at == index
    bodies = read_bodies(path, session.id, user)
    _, response = bodies[note["seq"]]
    assert isinstance(response, ModelResponse)
    assert response.response_bytes == stream and response.outcome == "COMMITTED"
    assert note["request_seq"] == response.request_seq == call.request_seq
    assert note["content_key"] == call.content_key
    if dialect is OPENAI and stream is OPENAI_CRLF:  # SDK accumulators keep these
        chunk = parse_event(EventSplitter().feed(delivered)[2]).json()
        assert chunk is not None
        assert (chunk["id"], chunk["created"], chunk["usage"]) == ("c1", 5, {"total_tokens": 3})


def test_a_provider_error_passes_through_untouched(env: tuple[Log, Path, KeyPair]) -> None:
    log, path, user = env
    session = open_session(log, user)
    error = b'{"error": {"type": "rate_limit", "message": "slow down"}}\n'
    mock = MockTransport(lambda r: MockResponse(429, chunks=[error]))
    call = make_call(session, ANTHROPIC, b'{"model":"m","messages":[]}')
    reply, delivered = asyncio.run(drive(mock, call, log))
    assert (reply.status, delivered) == (429, error)
    _, response = read_bodies(path, session.id, user)[call.request_seq + 1]  # type: ignore[operator]
    assert isinstance(response, ModelResponse)
    assert (response.outcome, response.status, response.error_bytes) == ("FAILED", 429, error)
    assert response.error_digest == digest(Domain.ERROR, error)
    assert response.response_bytes is None


def test_a_cut_body_is_unknown_and_the_client_sees_the_cut(env: tuple[Log, Path, KeyPair]) -> None:
    log, path, user = env
    session = open_session(log, user)
    mock = MockTransport(lambda r: MockResponse(200, SSE, [b"data: {}\n\n", b"data: {"], cut=True))
    call = make_call(session, OPENAI, b'{"model":"m","messages":[],"stream":true}')
    with pytest.raises(UpstreamCut):
        asyncio.run(drive(mock, call, log))
    _, response = read_bodies(path, session.id, user)[call.request_seq + 1]  # type: ignore[operator]
    assert isinstance(response, ModelResponse)
    assert response.outcome == "UNKNOWN"
    assert response.response_bytes == b"data: {}\n\ndata: {"


def test_splice_member_adds_one_member_and_moves_no_byte() -> None:
    assert splice_member(b'{"a": 1}  \n', "x", {"k": 1}) == b'{"a": 1,"x":{"k":1}}  \n'
    assert splice_member(b"{ }", "x", 2) == b'{ "x":2}'
    assert splice_member(b"[1]", "x", 2) is None
    assert splice_member(b"{oops}", "x", 2) is None
    assert splice_member(b"", "x", 2) is None


def test_reply_facts_read_fingerprint_and_reproducibility() -> None:
    block = {"prompt_digest": "sha256:" + "0" * 64, "weights": "w"}
    body = json.dumps({"system_fingerprint": "fp_1", "reproducibility": block}).encode()
    assert reply_facts(body, streamed=False) == ("fp_1", block)
    stream = (
        b'data: {"system_fingerprint":"fp_a","choices":[]}\n\n'
        + b"data: "
        + json.dumps({"choices": [], "reproducibility": block}).encode()
        + b"\n\ndata: [DONE]\n\n"
    )
    assert reply_facts(stream, streamed=True) == ("fp_a", block)
    assert reply_facts(b'{"reproducibility": {"x": NaN}}', streamed=False) == (None, None)
    assert reply_facts(b"not json", streamed=False) == (None, None)
