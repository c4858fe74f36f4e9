"""Pre-call identity: ``model.request`` is durable before the upstream sees a byte.

- The loopback upstream, on arrival of each request and before it answers, opens the store
  read-only in its own connection and finds the ``model.request`` whose content key is the
  digest of the very bytes it received, with no response yet: the entry was durable first.
- The entry's digests: ``content_key`` over the bytes sent, ``input_digest`` over the bytes
  as the client sent them, ``prompt_digest`` over ``record.digest.prompt_bytes`` of the
  request sent; ``params`` are the non-prompt members as sent; no pins, no clock.
- A pinned session: the upstream gets the request with the pins set (canonical JSON), the
  record keeps both the client's bytes and the bytes sent, and names the pins applied.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai

from record.digest import Domain, canonical_json, digest, prompt_digest
from record.schema import ModelRequest, ModelResponse, PinsSet
from tests.egress_proxy.loopback import Received, Rig, Script, read_bodies


def test_the_request_entry_is_durable_before_the_upstream_sees_the_request(fresh: Rig) -> None:
    rig = fresh
    session = rig.open_session()
    checked: list[int] = []

    def inspect_store(received: Received) -> None:
        bodies = read_bodies(rig.store_path, session.session_id, rig.user)  # read-only, fresh
        requests = {s: b for s, (_, b) in bodies.items() if isinstance(b, ModelRequest)}
        answered = {b.request_seq for _, b in bodies.values() if isinstance(b, ModelResponse)}
        seq = max(requests)
        assert requests[seq].content_key == digest(Domain.REQUEST, received.body)
        assert requests[seq].request_bytes == received.body
        assert seq not in answered
        checked.append(seq)

    rig.upstream.on_request = inspect_store
    rig.upstream.script = Script(
        chunks=[b'data: {"id":"a","choices":[]}\n\n', b"data: [DONE]\n\n"],
        content_type="text/event-stream",
    )
    client = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    for _ in client.chat.completions.create(model="m", messages=[], stream=True):
        pass
    rig.upstream.script = Script(chunks=[b'{"id":"m","type":"message","content":[]}'])
    claude = anthropic.Anthropic(
        base_url=session.anthropic_base_url, api_key=session.token, max_retries=0
    )
    claude.messages.create(model="m", max_tokens=3, messages=[])
    assert checked == [1, 3]  # seq 0 is stream.opened; each request's reply follows it


def test_the_request_entry_names_the_exact_bytes(fresh: Rig) -> None:
    rig = fresh
    session = rig.open_session()
    sent = (
        b'{"messages": [{"role": "user", "content": "caf\xc3\xa9"}],  "model":"m-1",\n'
        b' "temperature": 0.5, "max_tokens": 9, "stop": ["x"], "n": 2, "seed": 3,'
        b' "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}'
    )
    response = httpx.post(
        f"{session.openai_base_url}/chat/completions",
        content=sent,
        headers={"authorization": f"Bearer {session.token}"},
    )
    assert response.status_code == 200
    assert rig.upstream.received[-1].body == sent  # unpinned: the client's bytes, unchanged
    seq = int(response.headers["affidavit-request-seq"])
    _, request = rig.bodies(session.session_id)[seq]
    assert isinstance(request, ModelRequest)
    assert request.input_bytes == request.request_bytes == sent
    assert request.content_key == digest(Domain.REQUEST, sent)
    assert request.input_digest == digest(Domain.INPUT, sent)
    assert request.prompt_digest == prompt_digest(json.loads(sent))
    assert request.params == {"temperature": 0.5, "max_tokens": 9, "stop": ["x"], "n": 2, "seed": 3}
    assert request.model_id == "m-1"
    assert (request.pins, request.clock, request.turn, request.step) == (None, None, None, None)
    assert request.provider.name == "openai"
    assert request.provider.endpoint == rig.upstream_url + "/v1/chat/completions"
    annotation = response.json()["affidavit"]
    assert annotation["content_key"] == request.content_key
    assert annotation["prompt_digest"] == request.prompt_digest
    assert annotation["request_seq"] == seq


def test_a_pinned_session_records_both_the_input_and_the_bytes_sent(fresh: Rig) -> None:
    rig = fresh
    session = rig.open_session(pins={"seed": 11, "temperature": 0})
    bodies = rig.bodies(session.session_id)
    assert isinstance(bodies[1][1], PinsSet) and bodies[1][1].pins == {"seed": 11, "temperature": 0}
    sent = b'{"model": "m", "messages": [], "temperature": 0.9}'
    response = httpx.post(
        f"{session.openai_base_url}/chat/completions",
        content=sent,
        headers={"authorization": f"Bearer {session.token}"},
    )
    upstream_got = rig.upstream.received[-1].body
    expected = {"model": "m", "messages": [], "temperature": 0, "seed": 11}
    assert upstream_got == canonical_json(expected)
    _, request = rig.bodies(session.session_id)[int(response.headers["affidavit-request-seq"])]
    assert isinstance(request, ModelRequest)
    assert request.input_bytes == sent
    assert request.request_bytes == upstream_got
    assert request.content_key == digest(Domain.REQUEST, upstream_got)
    assert request.input_digest == digest(Domain.INPUT, sent)
    assert request.prompt_digest == prompt_digest(expected)
    assert request.params == {"temperature": 0, "seed": 11}
    assert request.pins == {"seed": 11, "temperature": 0}
    assert response.json()["affidavit"]["pins"] == {"seed": 11, "temperature": 0}
