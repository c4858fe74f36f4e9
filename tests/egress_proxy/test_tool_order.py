"""The order rule: no tool runs before the model reply that asked for it is committed.

- The ids a reply asked for are read from its bytes in every shape: OpenAI and Anthropic,
  JSON and SSE.
- A ``tools/call`` whose ``_meta`` names a seq of its session that is not a ``COMMITTED``
  ``model.response`` asking for that ``call_id`` (the stream's opening entry, a request, a
  seq not yet written, a ``FAILED`` reply, a reply without that id, another session's
  reply) is answered 409 with ``reply_not_committed``, recorded as ``tool.call`` plus a
  ``FAILED`` ``tool.result`` whose ``error_bytes`` are the body sent, and the upstream never
  sees it. A ``_meta`` that names a reply only in part (or not as an int and an id) is
  refused the same way, unrecorded. (A call with no naming ``_meta`` at all is matched by name
  and arguments: ``test_tool_admission.py``.)
- The SDK client gets the refusal as an MCP error carrying the code.
- In a pinned session the derived id the client was handed names the call.
- The check reads the record: a fresh index over the same log agrees.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from mcp.shared.exceptions import MCPError

from egress_proxy.tools import ReplyIndex, tool_call_ids
from record.digest import Domain, digest
from record.schema import ModelResponse, ToolCall, ToolResult
from tests.egress_proxy.loopback import Script
from tests.egress_proxy.tool_rig import (
    ToolRig,
    build_tool_rig,
    committed_reply,
    mcp_client,
    mcp_url,
    meta,
    rpc,
)


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolRig]:
    with build_tool_rig(tmp_path_factory.mktemp("order")) as rig:
        yield rig


OPENAI_JSON = (
    b'{"choices":[{"message":{"tool_calls":[{"id":"call_a","type":"function",'
    b'"function":{"name":"f","arguments":"{}"}},{"id":"call_b","type":"function"}]}}]}'
)
OPENAI_SSE = (
    b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{}}]}}]}\n\n'
    b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}\n\n'
    b'data: {"choices":[{"delta":{"tool_calls":[{"index":1,"id":"call_b"}]}}]}\n\ndata: [DONE]\n\n'
)
ANTHROPIC_JSON = (
    b'{"id":"msg_1","content":[{"type":"text","text":"x"},{"type":"tool_use","id":"toolu_a",'
    b'"name":"f","input":{}},{"type":"tool_use","id":"toolu_b","name":"g","input":{}}]}'
)
ANTHROPIC_SSE = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","content":[]}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"tool_use","id":"toolu_a","name":"f","input":{}}}\n\n'
    b'event: content_block_start\r\ndata: {"type":"content_block_start","index":1,'
    b'"content_block":{"type":"tool_use","id":"toolu_b","name":"g","input":{}}}\r\n\r\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


@pytest.mark.parametrize(
    ("body", "ids"),
    [
        (OPENAI_JSON, ["call_a", "call_b"]),
        (OPENAI_SSE, ["call_a", "call_b"]),
        (ANTHROPIC_JSON, ["toolu_a", "toolu_b"]),
        (ANTHROPIC_SSE, ["toolu_a", "toolu_b"]),
        (b'{"id":"chatcmpl-1","choices":[{"message":{"content":"no tools"}}]}', []),
        (b"not json, not events", []),
    ],
)
def test_the_ids_a_reply_asked_for_are_read_from_every_shape(body: bytes, ids: list[str]) -> None:
    assert tool_call_ids(body) == ids


def _failed_reply(tools: ToolRig, session: Any) -> int:
    rig = tools.rig
    rig.upstream.script = Script(chunks=[b'{"error":{"message":"down"}}'], status=500)
    response = httpx.post(
        f"{session.openai_base_url}/chat/completions",
        content=b'{"model":"m","messages":[]}',
        headers={"authorization": f"Bearer {session.token}"},
    )
    assert response.status_code == 500
    bodies = rig.bodies(session.session_id)
    return max(s for s, (_, b) in bodies.items() if isinstance(b, ModelResponse))


CASES = [
    "opening entry",
    "a request",
    "not yet written",
    "failed reply",
    "other id",
    "other session",
]


@pytest.mark.parametrize("case", CASES)
def test_a_call_naming_no_committed_reply_is_refused_and_recorded(
    tools: ToolRig, case: str
) -> None:
    rig, remote = tools.rig, tools.remote
    session = rig.open_session()
    seq = committed_reply(rig, session, ["call_ok"])
    named = {
        "opening entry": (0, "call_ok"),
        "a request": (seq - 1, "call_ok"),
        "not yet written": (seq + 50, "call_ok"),
        "failed reply": (-1, "call_ok"),
        "other id": (seq, "call_other"),
        "other session": (-2, "call_elsewhere"),
    }[case]
    reply_seq, call_id = named
    if case == "failed reply":
        reply_seq = _failed_reply(tools, session)
    if case == "other session":
        elsewhere = rig.open_session()
        reply_seq = committed_reply(rig, elsewhere, ["call_elsewhere"])
        assert reply_seq == seq  # the same seq, in another stream: not this session's reply
    calls_before = len(remote.calls)
    params = {"name": "peek", "arguments": {"a": 1}, "_meta": meta(reply_seq, call_id)}
    response = rpc(session, "remote", "tools/call", params)
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["data"]["code"] == "reply_not_committed"
    assert response.json()["id"] == 7 and response.json()["jsonrpc"] == "2.0"
    assert len(remote.calls) == calls_before  # the upstream never saw it
    bodies = rig.bodies(session.session_id)
    last = max(bodies)
    call, result = bodies[last - 1][1], bodies[last][1]
    assert isinstance(call, ToolCall) and isinstance(result, ToolResult)
    assert (call.reply_seq, call.call_id, call.server, call.tool) == (
        reply_seq,
        call_id,
        "remote",
        "peek",
    )
    assert result.call_seq == last - 1 and result.outcome == "FAILED"
    assert result.error_bytes == response.content
    assert result.error_digest == digest(Domain.ERROR, response.content)
    assert result.result_bytes is None


@pytest.mark.parametrize(
    "named",
    [
        {"affidavit/reply_seq": 2},
        {"affidavit/call_id": "call_ok"},
        {"affidavit/reply_seq": "2", "affidavit/call_id": "call_ok"},
        {"affidavit/reply_seq": True, "affidavit/call_id": "call_ok"},
        {"affidavit/reply_seq": 2, "affidavit/call_id": ""},
    ],
)
def test_a_call_that_names_no_reply_is_refused_unrecorded(
    tools: ToolRig, named: dict[str, Any] | None
) -> None:
    rig, remote = tools.rig, tools.remote
    session = rig.open_session()
    committed_reply(rig, session, ["call_ok"])
    before, calls_before = len(rig.bodies(session.session_id)), len(remote.calls)
    params: dict[str, Any] = {"name": "peek", "arguments": {}}
    if named is not None:
        params["_meta"] = named
    response = rpc(session, "remote", "tools/call", params)
    assert response.status_code == 409
    assert response.json()["error"]["data"]["code"] == "reply_not_committed"
    assert len(rig.bodies(session.session_id)) == before  # nothing it names can be recorded
    assert len(remote.calls) == calls_before


def test_the_sdk_client_gets_the_refusal_as_an_mcp_error(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    seq = committed_reply(rig, session, ["call_ok"])

    async def go() -> None:
        async with mcp_client(mcp_url(session, "ours"), session.token) as client:
            await client.call_tool("echo", {"text": "x"}, meta=meta(seq, "call_nope"))

    with pytest.raises(BaseException) as caught:
        anyio.run(go)
    leaves = list(_leaves([caught.value]))
    refusals = [e for e in leaves if isinstance(e, MCPError)]
    assert refusals and refusals[0].data["code"] == "reply_not_committed"


def _leaves(errors: list[BaseException]) -> Iterator[BaseException]:
    for error in errors:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(list(error.exceptions))
        else:
            yield error


def test_a_pinned_session_names_its_calls_by_the_derived_ids(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session(pins={"seed": 5})
    seq = committed_reply(rig, session, [("call_random_upstream", "ours__echo", {"text": "d"})])
    bodies = rig.bodies(session.session_id)
    response = bodies[seq][1]
    assert isinstance(response, ModelResponse) and response.reproducibility is not None
    [pair] = json.loads(json.dumps(response.reproducibility["affidavit_tool_call_ids"]))
    derived = pair["derived"]
    assert derived != "call_random_upstream"
    params = {"name": "echo", "arguments": {"text": "d"}, "_meta": meta(seq, derived)}
    assert rpc(session, "ours", "tools/call", params).status_code == 200


def test_the_check_reads_the_record_not_a_memory_of_the_reply(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    seq = committed_reply(rig, session, ["call_r1", "call_r2"])
    fresh = ReplyIndex(rig.log)  # knows nothing but the record

    async def ids(at: int) -> frozenset[str] | None:
        return await fresh.call_ids(session.session_id, at)

    assert anyio.run(ids, seq) == frozenset({"call_r1", "call_r2"})
    assert anyio.run(ids, seq - 1) is None  # the request
    assert anyio.run(ids, seq + 100) is None  # not written yet: asked again later, not cached
