"""The data plane's gate, against a real proxy and upstream on loopback.

- Outside ``/s/{session}/…`` every request is 404 with a JSON error; an unknown session, a
  missing token, a wrong token and another session's token all get the same 401. None of
  them records anything or reaches the upstream.
- Inside a session: an unmounted path is 404, a GET on a mounted one 405.
- A body over the limit is 413, declared or chunked, and never reaches the upstream.
- A body that is not one I-JSON object is 400 ``malformed_json``, recorded as a refused call
  (input bytes and digest, outcome ``FAILED``, the error body the client got) and not sent.
- Nothing recorded before any of these refusals changes.
- Credentials: the upstream gets the proxy's configured key, never the session token or a
  client cookie; neither the token nor any API key appears in the store, opened or not.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from egress_proxy.providers import CREDENTIAL_HEADERS
from record.digest import Domain, digest
from record.schema import ModelRequest, ModelResponse
from record.sqlite_store import SQLiteStore
from tests.egress_proxy.loopback import ANTHROPIC_KEY, OPENAI_KEY, Rig, Script

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


def lines_by_stream(rig: Rig) -> dict[str, list[bytes]]:
    store = SQLiteStore(rig.store_path, readonly=True)
    try:
        return {s: [e.line for e in store.entries(s)] for s in store.streams()}
    finally:
        store.close()


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code
    return body


def test_refusals_touch_nothing_and_reach_no_upstream(fresh: Rig) -> None:
    rig = fresh
    mine, other = rig.open_session(), rig.open_session()
    before = lines_by_stream(rig)
    url = rig.proxy.url
    bearer = {"authorization": f"Bearer {mine.token}"}
    with httpx.Client(timeout=10) as client:
        for path in ("/", "/v1/chat/completions", "/s/", f"/s/{mine.session_id}", "/docs"):
            assert_error(client.post(url + path, content=CHAT, headers=bearer), 404, "not_found")
        target = f"{mine.base_url}/v1/chat/completions"
        answers = [
            client.post(target, content=CHAT),
            client.post(target, content=CHAT, headers={"authorization": "Bearer wrong"}),
            client.post(target, content=CHAT, headers={"x-api-key": other.token}),
            client.post(f"{url}/s/nosuchsession/v1/chat/completions", content=CHAT, headers=bearer),
            client.post(target, content=CHAT, headers={"authorization": mine.token}),  # no scheme
        ]
        bodies = [assert_error(a, 401, "unauthorized") for a in answers]
        assert all(b == bodies[0] for b in bodies)  # one answer: no oracle for session ids
        assert_error(
            client.post(f"{mine.base_url}/v1/embeddings", headers=bearer), 404, "not_found"
        )
        assert_error(client.get(target, headers=bearer), 405, "method_not_allowed")
        limit = rig.proxy.app.state.config.max_body_bytes
        big = b'{"model":"m","messages":[],"pad":"' + b"x" * limit + b'"}'
        assert_error(client.post(target, content=big, headers=bearer), 413, "body_too_large")

        def chunks() -> Any:
            step = 1 << 16
            for i in range(0, len(big), step):
                yield big[i : i + step]

        assert_error(client.post(target, content=chunks(), headers=bearer), 413, "body_too_large")
    assert rig.upstream.received == []
    assert lines_by_stream(rig) == before


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"",
        b"[1, 2]",
        b'{"model": "m", "model": "n"}',
        b'{"temperature": NaN}',
        b'{"seed": 123456789012345678901234567890}',
        b'{"x": 1e400}',
        b'{"x": "\xff"}',
    ],
)
def test_a_malformed_body_is_400_and_recorded_as_failed(fresh: Rig, body: bytes) -> None:
    rig = fresh
    session = rig.open_session()
    before = lines_by_stream(rig)
    response = httpx.post(
        f"{session.base_url}/v1/messages", content=body, headers={"x-api-key": session.token}
    )
    assert_error(response, 400, "malformed_json")
    assert rig.upstream.received == []
    after = lines_by_stream(rig)
    for stream, lines in before.items():
        assert after[stream][: len(lines)] == lines
    bodies = rig.bodies(session.session_id)
    request_seq = int(response.headers["affidavit-request-seq"])
    _, request = bodies[request_seq]
    _, reply = bodies[request_seq + 1]
    assert len(after[session.session_id]) == len(before[session.session_id]) + 2
    assert isinstance(request, ModelRequest) and isinstance(reply, ModelResponse)
    assert request.input_bytes == body
    assert request.input_digest == digest(Domain.INPUT, body)
    assert request.request_bytes == b""  # nothing was sent
    assert (reply.request_seq, reply.outcome, reply.status) == (request_seq, "FAILED", 400)
    assert reply.error_bytes == response.content


def test_credentials_never_go_upstream_nor_into_the_record(fresh: Rig) -> None:
    rig = fresh
    session = rig.open_session()
    cookie = {"cookie": "session=secret-cookie", "proxy-authorization": "Basic c2VjcmV0"}
    rig.upstream.script = Script(chunks=[b'{"id":"x","object":"chat.completion","choices":[]}'])
    client = openai.OpenAI(
        base_url=session.openai_base_url,
        api_key=session.token,
        max_retries=0,
        default_headers=cookie,
    )
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    rig.upstream.script = Script(
        chunks=[b'{"id":"m","type":"message","role":"assistant","content":[],"model":"m"}']
    )
    claude = anthropic.Anthropic(
        base_url=session.anthropic_base_url,
        api_key=session.token,
        max_retries=0,
        default_headers=cookie,
    )
    claude.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])

    to_openai, to_anthropic = rig.upstream.received
    assert to_openai.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert "x-api-key" not in to_openai.headers
    assert to_anthropic.headers["x-api-key"] == ANTHROPIC_KEY
    sent_version = to_anthropic.headers["anthropic-version"]  # the SDK's, passed on
    assert "authorization" not in to_anthropic.headers
    for received in (to_openai, to_anthropic):
        assert not set(received.headers) & (CREDENTIAL_HEADERS - {"authorization", "x-api-key"})
        assert session.token not in json.dumps(received.headers)
        assert b"secret" not in received.body

    secrets = [session.token, OPENAI_KEY, ANTHROPIC_KEY, "secret-cookie", "c2VjcmV0"]
    opened = "".join(
        json.dumps(body.model_dump(mode="python"), default=lambda b: b.decode("latin-1"))
        for _, body in rig.bodies(session.session_id).values()
    )
    assert "model.response" in opened  # the bodies were opened and read
    requests = [
        b for _, b in rig.bodies(session.session_id).values() if isinstance(b, ModelRequest)
    ]
    assert [r.provider.api_version for r in requests] == [None, sent_version]
    raw = rig.store_path.read_bytes() + rig.store_path.with_name("record.db-wal").read_bytes()
    for secret in secrets:
        assert secret not in opened
        assert secret.encode() not in raw
