"""Verbatim capture and its three outcomes, against real servers on loopback.

- Replies stream as they arrive: the client holds the first event while the upstream is
  still waiting to send the rest (a proxy that buffered would deadlock on the gate).
- A client that disconnects mid-stream does not stop the recording: the reply is read to
  its end and committed, every byte.
- ``FAILED``: a provider error reaches the client with the same status and the same bytes,
  and the record keeps them verbatim in ``error_bytes``; the SDK raises its status error.
- ``UNKNOWN``: an upstream that cuts the stream is recorded with the bytes that did arrive,
  and the client's connection is cut too (no annotation: nothing was committed); an
  unreachable upstream is 502 ``upstream_unavailable`` with the request recorded UNKNOWN.
- A non-streamed reply reaches the client with a top-level ``affidavit`` member (the SDK
  parses it) while the record keeps the upstream bytes; ``fingerprint`` takes
  ``system_fingerprint`` and the engine's ``reproducibility`` block is kept, streamed or not.
- Crash: a proxy killed with SIGKILL between request and reply leaves the request without
  an answer; the next start (``ProxyServer.start`` runs ``recover_unknown``) appends
  ``UNKNOWN`` for it, and only for it. ``recover_unknown`` is idempotent.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from egress_proxy.recovery import Recovered, recover_unknown
from egress_proxy.server import ProxyServer
from egress_proxy.sse import EventSplitter, parse_event
from record import merkle
from record.checkpoint import open_checkpoint
from record.digest import Domain, canonical_json, digest
from record.log import Log
from record.schema import (
    FetchRequest,
    FetchResponse,
    LeaseTaken,
    ModelRequest,
    ModelResponse,
    Provider,
    ToolCall,
    ToolResult,
)
from record.seal import KeyPair
from tests.egress_proxy.loopback import (
    ENV,
    FakeUpstream,
    LoopbackServer,
    Received,
    Rig,
    Script,
    proxy_config,
    read_bodies,
    split_annotation,
)

EVENTS = [
    b'data: {"id":"s","choices":[{"index":0,"delta":{"content":"%d"}}]}\n\n' % i for i in range(5)
]
STREAM = b"".join(EVENTS) + b"data: [DONE]\n\n"


def response_for(rig: Rig, stream: str, request_seq: int, wait: float = 10.0) -> ModelResponse:
    deadline = time.monotonic() + wait
    while True:
        for _, body in rig.bodies(stream).values():
            if isinstance(body, ModelResponse) and body.request_seq == request_seq:
                return body
        assert time.monotonic() <= deadline, "no response entry"
        time.sleep(0.05)


def stream_request(rig: Rig, session: object, client: httpx.Client) -> httpx.Response:
    base, token = session.openai_base_url, session.token  # type: ignore[attr-defined]
    request = client.build_request(
        "POST",
        f"{base}/chat/completions",
        content=b'{"model":"m","messages":[],"stream":true}',
        headers={"authorization": f"Bearer {token}"},
    )
    return client.send(request, stream=True)


def test_events_reach_the_client_before_the_upstream_has_finished(fresh: Rig) -> None:
    rig = fresh
    gate = threading.Event()
    script = Script(
        chunks=[*EVENTS, b"data: [DONE]\n\n"],
        content_type="text/event-stream",
        gate=gate,
        pause_after=2,
    )
    rig.upstream.script = script
    session = rig.open_session()
    with httpx.Client(timeout=20) as client:
        response = stream_request(rig, session, client)
        got = b""
        chunks = response.iter_raw()
        while got.count(b"\n\n") < 2:
            got += next(chunks)
        assert script.waiting.wait(10)  # the upstream is holding the rest back (until the gate)
        assert got == EVENTS[0] + EVENTS[1]
        gate.set()
        splitter, committed = EventSplitter(), None
        for chunk in chunks:
            got += chunk
            for block in splitter.feed(chunk):
                data = parse_event(block).json() or {}
                if "affidavit" in data and committed is None:  # durable before it is announced
                    committed = response_for(
                        rig, session.session_id, data["affidavit"]["request_seq"], wait=0
                    )
    assert split_annotation(got)[0] == STREAM
    assert committed is not None and committed.response_bytes == STREAM


def test_a_client_that_leaves_mid_stream_does_not_stop_the_recording(fresh: Rig) -> None:
    rig = fresh
    gate = threading.Event()
    rig.upstream.script = Script(
        chunks=[*EVENTS, b"data: [DONE]\n\n"],
        content_type="text/event-stream",
        gate=gate,
        pause_after=1,
    )
    session = rig.open_session()
    with httpx.Client(timeout=20) as client:
        response = stream_request(rig, session, client)
        first = next(response.iter_raw())
        request_seq = int(response.headers["affidavit-request-seq"])
        response.close()  # the client goes away with one event
    assert first == EVENTS[0]
    time.sleep(0.5)  # the proxy sees the disconnect (and drops the response) before more comes
    gate.set()
    reply = response_for(rig, session.session_id, request_seq)
    assert (reply.outcome, reply.response_bytes) == ("COMMITTED", STREAM)


@pytest.mark.parametrize("status", [429, 500])
def test_a_provider_error_is_failed_verbatim_with_the_same_status(fresh: Rig, status: int) -> None:
    rig = fresh
    error = b'{"type":"error","error":{"type":"overloaded_error","message":"try later"}}  \n'
    rig.upstream.script = Script(chunks=[error[:20], error[20:]], status=status)
    session = rig.open_session()
    raw = httpx.post(
        f"{session.base_url}/v1/messages",
        content=b'{"model":"m","messages":[],"max_tokens":1}',
        headers={"x-api-key": session.token},
    )
    assert (raw.status_code, raw.content) == (status, error)
    claude = anthropic.Anthropic(
        base_url=session.anthropic_base_url, api_key=session.token, max_retries=0
    )
    with pytest.raises(anthropic.APIStatusError) as caught:
        claude.messages.create(model="m", max_tokens=1, messages=[])
    assert caught.value.status_code == status
    for seq in (int(raw.headers["affidavit-request-seq"]), 3):
        reply = response_for(rig, session.session_id, seq)
        assert (reply.outcome, reply.status, reply.error_bytes) == ("FAILED", status, error)
        assert reply.error_digest == digest(Domain.ERROR, error)
        assert reply.response_bytes is None


def test_an_upstream_cut_is_unknown_and_cuts_the_client(fresh: Rig) -> None:
    rig = fresh
    rig.upstream.script = Script(
        chunks=[EVENTS[0], EVENTS[1][:10]], content_type="text/event-stream", cut=True
    )
    session = rig.open_session()
    got = b""
    with httpx.Client(timeout=20) as client, pytest.raises(httpx.HTTPError):
        response = stream_request(rig, session, client)
        request_seq = int(response.headers["affidavit-request-seq"])
        for chunk in response.iter_raw():
            got += chunk
    assert b"affidavit" not in got  # nothing committed, so no annotation
    reply = response_for(rig, session.session_id, request_seq)
    assert reply.outcome == "UNKNOWN"
    assert reply.response_bytes == EVENTS[0] + EVENTS[1][:10]  # what arrived, as evidence
    gpt = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    with pytest.raises(openai.APIConnectionError):
        for _ in gpt.chat.completions.create(model="m", messages=[], stream=True):
            pass


def test_an_unreachable_upstream_is_502_and_unknown(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    user = KeyPair.generate()
    with Log.open(tmp_path / "r.db", appliance_key=KeyPair.generate()) as log:
        with ProxyServer(proxy_config(dead), log, env=ENV) as proxy:
            session = proxy.registry.open_session([user.recipient])
            response = httpx.post(
                f"{session.openai_base_url}/chat/completions",
                content=b'{"model":"m","messages":[]}',
                headers={"authorization": f"Bearer {session.token}"},
            )
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_unavailable"
        bodies = read_bodies(tmp_path / "r.db", session.session_id, user)
        _, reply = bodies[int(response.headers["affidavit-request-seq"]) + 1]
        assert isinstance(reply, ModelResponse)
        assert (reply.outcome, reply.status, reply.response_bytes) == ("UNKNOWN", None, None)


def test_a_non_streamed_reply_carries_the_annotation_and_the_facts(fresh: Rig) -> None:
    rig = fresh
    block = {"engine": "affidavit-embedded", "prompt_digest": "sha256:" + "1" * 64}
    upstream_body = json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "system_fingerprint": "fp_x",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "reproducibility": block,
        },
        indent=1,
    ).encode()
    rig.upstream.script = Script(chunks=[upstream_body])
    session = rig.open_session()
    client = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[])
    completion = raw.parse()
    assert completion.choices[0].message.content == "ok"
    note = completion.model_extra["affidavit"]  # type: ignore[index]
    delivered = raw.http_response.content
    assert delivered.startswith(upstream_body[:-1]) and delivered.endswith(b"}")
    reply = response_for(rig, session.session_id, note["request_seq"])
    assert reply.response_bytes == upstream_body
    assert (reply.outcome, reply.fingerprint, reply.reproducibility) == ("COMMITTED", "fp_x", block)
    assert note["seq"] == note["request_seq"] + 1
    assert (
        note["response_digest"] == reply.response_digest == digest(Domain.RESPONSE, upstream_body)
    )
    assert note["checkpoint"].startswith("affidavit-log/")
    # The annotation's checkpoint covers the reply it annotates (signed in its commit).
    signed, _ = open_checkpoint(note["checkpoint"].encode(), [rig.log.signer.verifier()])
    assert signed.size > note["seq"]
    leaves = rig.log.store.leaf_hashes(session.session_id, signed.size)
    assert merkle.root(leaves) == signed.root_hash

    streamed = (
        b'data: {"id":"c","system_fingerprint":"fp_s","choices":[]}\n\n'
        + b"data: "
        + json.dumps({"id": "c", "choices": [], "reproducibility": block}).encode()
        + b"\n\ndata: [DONE]\n\n"
    )
    rig.upstream.script = Script(chunks=[streamed], content_type="text/event-stream")
    for _ in client.chat.completions.create(model="m", messages=[], stream=True):
        pass
    reply = response_for(rig, session.session_id, note["seq"] + 1)
    assert (reply.fingerprint, reply.reproducibility) == ("fp_s", block)


def _model_request(tag: bytes) -> ModelRequest:
    raw = canonical_json({"model": "m", "messages": [], "tag": tag.decode()})
    prompt = canonical_json({"model": "m", "messages": []})
    return ModelRequest(
        content_key=digest(Domain.REQUEST, raw),
        input_digest=digest(Domain.INPUT, raw),
        prompt_digest=digest(Domain.PROMPT, prompt),
        request_bytes=raw,
        input_bytes=raw,
        prompt_bytes=prompt,
        provider=Provider(name="p", endpoint="http://127.0.0.1:9/v1/chat/completions"),
        model_id="m",
        params={},
    )


def test_recover_unknown_answers_each_unanswered_request_once(tmp_path: Path) -> None:
    appliance, user = KeyPair.generate(), KeyPair.generate()
    with Log.open(tmp_path / "r.db", appliance_key=appliance) as log:
        log.open_stream("a", [user.recipient, appliance.recipient])
        log.open_stream("b", [user.recipient])  # not sealed to the appliance: skipped
        first = log.append("a", _model_request(b"1"))
        second = log.append("a", _model_request(b"2"))
        log.append("a", ModelResponse(request_seq=first.seq, outcome="COMMITTED"))
        third = log.append("a", _model_request(b"3"))
        before = [e.line for e in log.store.entries("a")]
        assert recover_unknown(log) == [Recovered("a", second.seq, 5), Recovered("a", third.seq, 6)]
        assert recover_unknown(log) == []
        after = [e.line for e in log.store.entries("a")]
    assert after[: len(before)] == before
    bodies = read_bodies(tmp_path / "r.db", "a", user)
    assert [(b.request_seq, b.outcome) for _, b in list(bodies.values())[5:]] == [  # type: ignore[attr-defined]
        (second.seq, "UNKNOWN"),
        (third.seq, "UNKNOWN"),
    ]


def test_recover_unknown_also_answers_open_tool_calls_and_fetches(tmp_path: Path) -> None:
    """A crash between a tool call (or a fetch) and its result leaves the result UNKNOWN."""
    appliance = KeyPair.generate()
    args = b'{"q":1}'
    with Log.open(tmp_path / "r.db", appliance_key=appliance) as log:
        log.open_stream("a", [appliance.recipient])
        reply = log.append("a", ModelResponse(request_seq=0, outcome="COMMITTED"))
        call = ToolCall(
            reply_seq=reply.seq,
            call_id="call_1",
            server="s",
            tool="t",
            arguments=args,
            arguments_digest=digest(Domain.TOOL_ARGUMENTS, args),
            idempotent=False,
        )
        answered = log.append("a", call)
        log.append("a", ToolResult(call_seq=answered.seq, outcome="COMMITTED"))
        open_call = log.append("a", call)
        raw = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
        fetch = FetchRequest(
            method="GET",
            url="http://x/",
            request_bytes=raw,
            content_key=digest(Domain.FETCH_REQUEST, raw),
        )
        open_fetch = log.append("a", fetch)
        recovered = recover_unknown(log)
        assert [(r.kind, r.request_seq) for r in recovered] == [
            ("tool.call", open_call.seq),
            ("fetch.request", open_fetch.seq),
        ]
        assert recover_unknown(log) == []
    bodies = [b for _, b in read_bodies(tmp_path / "r.db", "a", appliance).values()]
    assert isinstance(bodies[-2], ToolResult) and bodies[-2].call_seq == open_call.seq
    assert bodies[-2].outcome == "UNKNOWN"
    assert isinstance(bodies[-1], FetchResponse) and bodies[-1].request_seq == open_fetch.seq
    assert bodies[-1].outcome == "UNKNOWN"


def test_a_killed_proxy_leaves_unknown_on_the_next_start(tmp_path: Path) -> None:
    store, key_path = tmp_path / "r.db", tmp_path / "appliance.key"
    appliance, user = KeyPair.generate(), KeyPair.generate()
    appliance.write(key_path)
    arrived, release = threading.Event(), threading.Event()
    upstream = FakeUpstream(Script(chunks=[b"{}"], gate=release, pause_after=0))

    def on_request(received: Received) -> None:
        arrived.set()

    upstream.on_request = on_request
    root = Path(__file__).resolve().parents[2]
    with LoopbackServer(upstream) as up:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.egress_proxy._crash_proxy",
                str(store),
                str(key_path),
                user.recipient.text(),
                up.url,
            ],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        try:
            assert child.stdout is not None
            session = json.loads(child.stdout.readline())
            errors: list[BaseException] = []

            def call() -> None:
                try:
                    httpx.post(
                        session["base_url"] + "/v1/chat/completions",
                        content=b'{"model":"m","messages":[]}',
                        headers={"authorization": f"Bearer {session['token']}"},
                        timeout=20,
                    )
                except httpx.HTTPError as exc:
                    errors.append(exc)

            caller = threading.Thread(target=call)
            caller.start()
            assert arrived.wait(20), "the request never reached the upstream"
            child.send_signal(signal.SIGKILL)  # between the request entry and the reply
            child.wait(10)
        finally:
            child.kill()
            release.set()
        caller.join(20)
        assert errors  # the client saw its connection die with the proxy
        with Log.open(store, appliance_key=appliance) as log:
            proxy = ProxyServer(proxy_config(up.url), log, env=ENV)
            proxy.start()
            proxy.stop()
            assert proxy.recovered == [Recovered(session["session_id"], 1, 3)]
    bodies = read_bodies(store, session["session_id"], user)
    assert [e.kind for e, _ in bodies.values()] == [
        "stream.opened",
        "model.request",
        "lease.taken",  # the new proxy took the stream from the killed one, and says so
        "model.response",
    ]
    taken = bodies[2][1]
    assert isinstance(taken, LeaseTaken) and f" pid {child.pid} " in taken.previous_holder
    reply = bodies[3][1]
    assert isinstance(reply, ModelResponse)
    assert (reply.request_seq, reply.outcome, reply.response_bytes) == (1, "UNKNOWN", None)
