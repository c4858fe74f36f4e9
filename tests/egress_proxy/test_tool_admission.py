"""Tool-call admission (#15 line 5, #16 line 6): a call runs only as an unserved call of the
session's committed reply, with that call's name and canonical arguments.

- A third-party MCP client (the official SDK, no ``_meta``) is admitted when its tool and
  arguments match a call of the latest committed reply; the ``tool.call`` names that reply and
  call exactly as the harness's would. A second identical call is refused (served already);
  other arguments, another tool, an older reply or no reply at all are refused 409, and every
  refusal that has a reply to name is recorded.
- Several identical calls in one reply are served in the reply's order, one each.
- Concurrent identical calls admit one.
- With ``_meta``: the named call's name and arguments must match, and it is served once.
- An unknown outcome may be sent again only as resume would: idempotent, or a person's retry.
- A ``FAILED`` or ``UNKNOWN`` reply admits nothing, though its bytes hold the very call: named
  in ``_meta`` it is 409 ``reply_not_committed`` *because* it is no committed reply (the
  message says what the record holds there), and without ``_meta`` it is never the reply a
  call is matched against.
- The calls a reply asked for are read from every shape (OpenAI Chat, Anthropic Messages,
  Responses; JSON and SSE, arguments joined from deltas).
- End to end: the real embedded engine asks for a tool through a pinned session; the SDK
  client, with no ``_meta``, runs exactly that call once, under the engine's derived id.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from mcp.shared.exceptions import MCPError

from egress_proxy.admission import reply_calls
from egress_proxy.server import ProxyServer
from record.digest import Domain, canonical_json, digest
from record.log import Log
from record.schema import ModelResponse, ToolCall, ToolResult, TurnDecided
from record.seal import KeyPair
from tests.egress_proxy.loopback import (
    ENV,
    LoopbackServer,
    Rig,
    Script,
    proxy_config,
    read_bodies,
)
from tests.egress_proxy.tool_rig import (
    Remote,
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
    with build_tool_rig(tmp_path_factory.mktemp("admission")) as rig:
        yield rig


def _sdk_call(url: str, token: str, tool: str, args: dict[str, Any]) -> Any:
    """A third-party client's call: the SDK's ``call_tool``, no ``_meta``. The result, or the
    ``MCPError`` the SDK raised."""

    async def go() -> Any:
        async with mcp_client(url, token) as client:
            return await client.call_tool(tool, args)

    try:
        return anyio.run(go)
    except BaseException as caught:
        errors = [e for e in _leaves([caught]) if isinstance(e, MCPError)]
        if not errors:
            raise
        return errors[0]


def _leaves(errors: list[BaseException]) -> Iterator[BaseException]:
    for error in errors:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(list(error.exceptions))
        else:
            yield error


def _tool_entries(rig: Rig, stream: str) -> list[tuple[int, ToolCall | ToolResult]]:
    bodies = rig.bodies(stream)
    return [(s, b) for s, (_, b) in sorted(bodies.items()) if isinstance(b, ToolCall | ToolResult)]


def _last_pair(rig: Rig, stream: str) -> tuple[ToolCall, ToolResult]:
    entries = _tool_entries(rig, stream)
    (call_seq, call), (_, result) = entries[-2], entries[-1]
    assert isinstance(call, ToolCall) and isinstance(result, ToolResult)
    assert result.call_seq == call_seq
    return call, result


def _raw(session: Any, server: str, tool: str, args: dict[str, Any]) -> httpx.Response:
    return rpc(session, server, "tools/call", {"name": tool, "arguments": args})


def test_a_third_party_client_is_admitted_once_as_the_call_the_reply_asked_for(
    tools: ToolRig,
) -> None:
    rig, remote = tools.rig, tools.remote
    session = rig.open_session()
    args = {"q": [1, 2], "lang": "é"}
    seq = committed_reply(rig, session, [("call_p", "remote__peek", args)])
    before = len(remote.calls)
    url = mcp_url(session, "remote")
    # the same object, its members in another order: equal as canonical JSON
    result = _sdk_call(url, session.token, "peek", {"lang": "é", "q": [1, 2]})
    assert not isinstance(result, MCPError), result
    assert result.content[0].text == "ok"
    assert len(remote.calls) == before + 1 and remote.calls[-1][1] == args
    call, outcome = _last_pair(rig, session.session_id)
    assert (call.reply_seq, call.call_id, call.server, call.tool) == (
        seq,
        "call_p",
        "remote",
        "peek",
    )
    assert call.arguments == canonical_json(args)
    assert call.arguments_digest == digest(Domain.TOOL_ARGUMENTS, canonical_json(args))
    assert outcome.outcome == "COMMITTED"

    again = _sdk_call(url, session.token, "peek", args)
    assert isinstance(again, MCPError) and again.error.data["code"] == "tool_call_served"
    assert "call_p" in again.error.message and "served already" in again.error.message
    assert len(remote.calls) == before + 1  # the tool never saw it
    raw = _raw(session, "remote", "peek", args)
    assert raw.status_code == 409
    assert raw.json()["error"]["data"]["code"] == "tool_call_served"
    refused, failed = _last_pair(rig, session.session_id)
    assert (refused.reply_seq, refused.call_id) == (seq, "")  # answers none of its calls
    assert failed.outcome == "FAILED" and failed.error_bytes == raw.content


@pytest.mark.parametrize(
    ("tool", "args", "code", "says"),
    [
        ("peek", {"q": 2}, "tool_not_asked", "other arguments"),
        ("peek", {}, "tool_not_asked", "other arguments"),
        ("peek", {"q": 1, "extra": None}, "tool_not_asked", "other arguments"),
        ("other", {"q": 1}, "tool_not_asked", "asked for no call of remote/other"),
    ],
)
def test_a_call_the_reply_did_not_ask_for_is_refused_409_and_recorded(
    tools: ToolRig, tool: str, args: dict[str, Any], code: str, says: str
) -> None:
    rig, remote = tools.rig, tools.remote
    session = rig.open_session()
    seq = committed_reply(rig, session, [("call_p", "remote__peek", {"q": 1})])
    before = len(remote.calls)
    response = _raw(session, "remote", tool, args)
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["data"]["code"] == code and says in error["message"], error
    assert len(remote.calls) == before
    call, result = _last_pair(rig, session.session_id)
    assert (call.reply_seq, call.call_id, call.tool) == (seq, "", tool)
    assert call.arguments == canonical_json(args)
    assert result.outcome == "FAILED" and result.error_bytes == response.content
    # the refusal served nothing: the call the reply asked for is still admitted
    assert _raw(session, "remote", "peek", {"q": 1}).status_code == 200
    assert len(remote.calls) == before + 1


def test_no_committed_reply_is_refused_409_unrecorded(tools: ToolRig) -> None:
    rig, remote = tools.rig, tools.remote
    session = rig.open_session()
    entries = len(rig.bodies(session.session_id))
    before = len(remote.calls)
    response = _raw(session, "remote", "peek", {})
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["data"]["code"] == "reply_not_committed"
    assert "no committed model reply" in error["message"]
    refused = _sdk_call(mcp_url(session, "remote"), session.token, "peek", {})
    assert isinstance(refused, MCPError) and refused.error.data["code"] == "reply_not_committed"
    assert len(remote.calls) == before
    assert len(rig.bodies(session.session_id)) == entries  # no reply to name: nothing recorded


def test_only_the_latest_committed_reply_admits(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    committed_reply(rig, session, [("call_old", "remote__peek", {"q": "old"})])
    latest = committed_reply(rig, session, [("call_new", "remote__peek", {"q": "new"})])
    stale = _raw(session, "remote", "peek", {"q": "old"})
    assert stale.status_code == 409 and stale.json()["error"]["data"]["code"] == "tool_not_asked"
    assert f"seq {latest}" in stale.json()["error"]["message"]
    assert _raw(session, "remote", "peek", {"q": "new"}).status_code == 200
    call, _ = _last_pair(rig, session.session_id)
    assert (call.reply_seq, call.call_id) == (latest, "call_new")


def test_identical_calls_of_one_reply_are_served_in_its_order_one_each(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    same = {"text": "twice"}
    asked: list[Any] = [
        ("call_1", "ours__echo", same),
        ("call_2", "ours__echo", {"text": "other"}),
        ("call_3", "ours__echo", same),
    ]
    seq = committed_reply(rig, session, asked)
    for expected in ("call_1", "call_3"):
        assert _raw(session, "ours", "echo", same).status_code == 200
        call, result = _last_pair(rig, session.session_id)
        assert (call.reply_seq, call.call_id) == (seq, expected) and result.outcome == "COMMITTED"
    third = _raw(session, "ours", "echo", same)
    assert third.status_code == 409
    assert third.json()["error"]["data"]["code"] == "tool_call_served"


@pytest.mark.parametrize("name", ["remote__peek", "mcp__remote__peek", "peek"])
def test_the_names_a_client_may_have_offered_the_tool_under(tools: ToolRig, name: str) -> None:
    rig = tools.rig
    session = rig.open_session()
    committed_reply(rig, session, [("call_n", name, {})])
    assert _raw(session, "remote", "peek", {}).status_code == 200
    other = rig.open_session()
    committed_reply(rig, other, [("call_n", "sentinel__peek", {})])  # another server's tool
    refused = _raw(other, "remote", "peek", {})
    assert refused.status_code == 409
    assert refused.json()["error"]["data"]["code"] == "tool_not_asked"


def test_concurrent_identical_calls_admit_one(tools: ToolRig) -> None:
    rig, remote = tools.rig, tools.remote
    session = rig.open_session()
    seq = committed_reply(rig, session, [("call_c", "remote__peek", {"n": 1})])
    before = len(remote.calls)
    gate = threading.Event()
    remote.on_call = lambda name, arguments, headers: "ok" if gate.wait(10) else "late"
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def one() -> None:
        response = _raw(session, "remote", "peek", {"n": 1})
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=one) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(0.5)  # the refused answer at once; the admitted one waits at the gate
        gate.set()
        for thread in threads:
            thread.join(30)
    finally:
        remote.on_call = None
    admitted = [a for a in answers if a.status_code == 200 and "result" in a.json()]
    refused = [a for a in answers if "error" in a.json()]
    assert len(answers) == 6 and len(admitted) == 1 and len(refused) == 5
    assert {a.json()["error"]["data"]["code"] for a in refused} == {"tool_call_served"}
    assert len(remote.calls) == before + 1
    calls = [b for _, b in _tool_entries(rig, session.session_id) if isinstance(b, ToolCall)]
    assert [(c.reply_seq, c.call_id) for c in calls if c.call_id] == [(seq, "call_c")]


def test_a_meta_call_must_match_the_named_call_and_is_served_once(tools: ToolRig) -> None:
    rig, remote = tools.rig, tools.remote
    session = rig.open_session()
    seq = committed_reply(rig, session, [("call_m", "remote__peek", {"q": 1})])
    before = len(remote.calls)

    def named(args: dict[str, Any], tool: str = "peek") -> httpx.Response:
        params = {"name": tool, "arguments": args, "_meta": meta(seq, "call_m")}
        return rpc(session, "remote", "tools/call", params)

    differ = named({"q": 2})
    assert differ.status_code == 409
    assert differ.json()["error"]["data"]["code"] == "tool_not_asked"
    assert "call_m" in differ.json()["error"]["message"]
    call, result = _last_pair(rig, session.session_id)
    assert (call.reply_seq, call.call_id) == (seq, "") and result.error_bytes == differ.content
    other_tool = rpc(
        session,
        "ours",
        "tools/call",
        {"name": "echo", "arguments": {"q": 1}, "_meta": meta(seq, "call_m")},
    )
    assert other_tool.status_code == 409
    assert other_tool.json()["error"]["data"]["code"] == "tool_not_asked"
    assert len(remote.calls) == before
    assert named({"q": 1}).status_code == 200
    call, result = _last_pair(rig, session.session_id)
    assert (call.reply_seq, call.call_id, result.outcome) == (seq, "call_m", "COMMITTED")
    twice = named({"q": 1})
    assert twice.status_code == 409
    assert twice.json()["error"]["data"]["code"] == "tool_call_served"
    assert len(remote.calls) == before + 1
    # the third-party route sees the same ledger
    assert _raw(session, "remote", "peek", {"q": 1}).status_code == 409


def test_an_unknown_outcome_is_sent_again_only_as_resume_would(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    seq = committed_reply(
        rig, session, [("call_x", "ours__exit", {}), ("call_e", "ours__echo", {"text": "i"})]
    )

    def named(tool: str, args: dict[str, Any], call_id: str) -> httpx.Response:
        params = {"name": tool, "arguments": args, "_meta": meta(seq, call_id)}
        return rpc(session, "ours", "tools/call", params)

    def last_outcome() -> str:
        return _last_pair(rig, session.session_id)[1].outcome

    named("exit", {}, "call_x")  # the server dies mid-call: no answer ever comes
    assert last_outcome() == "UNKNOWN"
    again = named("exit", {}, "call_x")  # not idempotent, nobody decided: refused
    assert again.status_code == 409
    assert again.json()["error"]["data"]["code"] == "tool_call_served"
    assert "unknown outcome" in again.json()["error"]["message"]
    calls = [(s, b) for s, b in _tool_entries(rig, session.session_id) if isinstance(b, ToolCall)]
    first_seq = next(s for s, b in calls if b.call_id == "call_x")
    rig.log.append(session.session_id, TurnDecided(turn=0, call_seq=first_seq, decision="retry"))
    named("exit", {}, "call_x")  # a person said retry: sent again (and dies again)
    call, result = _last_pair(rig, session.session_id)
    assert call.call_id == "call_x" and result.outcome == "UNKNOWN"
    assert named("exit", {}, "call_x").status_code == 409  # that retry was for the first send

    # echo is declared idempotent: its unknown outcome may be re-sent without a decision
    rig.log.append(session.session_id, _unknown_echo(rig, session, seq))
    assert last_outcome() == "UNKNOWN"
    assert named("echo", {"text": "i"}, "call_e").status_code == 200
    assert last_outcome() == "COMMITTED"
    assert named("echo", {"text": "i"}, "call_e").status_code == 409  # known now: served


def _unknown_echo(rig: Rig, session: Any, seq: int) -> ToolResult:
    """Record an admitted echo whose reply never came, as recovery would after a crash."""
    arguments = canonical_json({"text": "i"})
    call = ToolCall(
        reply_seq=seq,
        call_id="call_e",
        server="ours",
        tool="echo",
        arguments=arguments,
        arguments_digest=digest(Domain.TOOL_ARGUMENTS, arguments),
        idempotent=True,
    )
    appended = rig.log.append(session.session_id, call)
    return ToolResult(call_seq=appended.seq, outcome="UNKNOWN")


ASKED_JSON = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"finish_reason":"tool_calls","message":{"role":"assistant","content":null,"tool_calls":'
    b'[{"id":"call_z","type":"function","function":{"name":"remote__peek",'
    b'"arguments":"{\\"q\\": 9}"}}]}}]}'
)
ASKED_SSE = (
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_z",'
    b'"type":"function","function":{"name":"remote__peek","arguments":"{\\"q\\": 9}"}}]}}]}\n\n'
)


def _uncommitted_reply(rig: Rig, session: Any, outcome: str) -> int:
    """A model reply recorded ``FAILED`` (the upstream's 500) or ``UNKNOWN`` (the stream cut
    after the call arrived) whose bytes ask for ``call_z``: ``remote__peek {"q": 9}``."""
    if outcome == "FAILED":
        rig.upstream.script = Script(chunks=[ASKED_JSON], status=500)
        body = b'{"model":"m","messages":[]}'
    else:
        rig.upstream.script = Script(chunks=[ASKED_SSE], content_type="text/event-stream", cut=True)
        body = b'{"model":"m","messages":[],"stream":true}'
    headers = {"authorization": f"Bearer {session.token}"}
    with contextlib.suppress(httpx.HTTPError):  # the cut reaches the client too
        httpx.post(f"{session.openai_base_url}/chat/completions", content=body, headers=headers)
    bodies = rig.bodies(session.session_id)
    seq = max(s for s, (_, b) in bodies.items() if isinstance(b, ModelResponse))
    reply = bodies[seq][1]
    assert isinstance(reply, ModelResponse) and reply.outcome == outcome
    held = reply.response_bytes if outcome == "UNKNOWN" else reply.error_bytes
    assert held is not None and b"call_z" in held  # the call is right there in its bytes
    return seq


@pytest.mark.parametrize("outcome", ["FAILED", "UNKNOWN"])
def test_a_failed_or_unknown_reply_admits_nothing(tools: ToolRig, outcome: str) -> None:
    rig, remote = tools.rig, tools.remote
    session = rig.open_session()
    seq = _uncommitted_reply(rig, session, outcome)
    before = len(remote.calls)
    asked = {"name": "peek", "arguments": {"q": 9}}
    named = rpc(session, "remote", "tools/call", {**asked, "_meta": meta(seq, "call_z")})
    assert named.status_code == 409
    error = named.json()["error"]
    assert error["data"]["code"] == "reply_not_committed"  # not tool_not_asked, not admitted
    assert error["message"].endswith(
        f"seq {seq} of this session is not a committed model reply: "
        f"it is a model reply recorded {outcome}"
    ), error
    call, result = _last_pair(rig, session.session_id)
    assert (call.reply_seq, call.call_id, result.outcome) == (seq, "call_z", "FAILED")
    # without _meta: an uncommitted reply is never the one a call is matched against
    unnamed = _raw(session, "remote", "peek", {"q": 9})
    assert unnamed.status_code == 409
    assert unnamed.json()["error"]["data"]["code"] == "reply_not_committed"
    assert "this session has no committed model reply" in unnamed.json()["error"]["message"]
    assert len(remote.calls) == before
    # after a committed reply, the uncommitted one later still asks for nothing
    other = rig.open_session()
    committed = committed_reply(rig, other, [("call_c", "remote__peek", {"q": 1})])
    _uncommitted_reply(rig, other, outcome)
    stale = _raw(other, "remote", "peek", {"q": 9})
    assert stale.status_code == 409 and stale.json()["error"]["data"]["code"] == "tool_not_asked"
    assert f"latest committed reply (seq {committed})" in stale.json()["error"]["message"]
    assert len(remote.calls) == before


OPENAI_SSE = (
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a",'
    b'"type":"function","function":{"name":"remote__peek","arguments":""}}]}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
    b'"function":{"arguments":"{\\"b\\": 2, "}}]}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
    b'"function":{"arguments":"\\"a\\": 1}"}}]}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b",'
    b'"function":{"name":"web_fetch","arguments":"{\\"url\\":\\"x\\"}"}}]}}]}\n\n'
    b"data: [DONE]\n\n"
)
ANTHROPIC_SSE = (
    b'event: message_start\ndata: {"type":"message_start","message":{"content":[]}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":1,'
    b'"content_block":{"type":"tool_use","id":"toolu_a","name":"peek","input":{}}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":1,'
    b'"delta":{"type":"input_json_delta","partial_json":"{\\"b\\": 2,"}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":1,'
    b'"delta":{"type":"input_json_delta","partial_json":" \\"a\\": 1}"}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":2,'
    b'"content_block":{"type":"tool_use","id":"toolu_b","name":"noargs","input":{}}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
ANTHROPIC_JSON = json.dumps(
    {"content": [{"type": "tool_use", "id": "toolu_a", "name": "peek", "input": {"b": 2, "a": 1}}]}
).encode()
RESPONSES_SSE = (
    b'event: response.output_item.added\ndata: {"type":"response.output_item.added",'
    b'"item":{"type":"function_call","id":"fc_1","call_id":"call_a","name":"peek",'
    b'"arguments":""}}\n\n'
    b'event: response.function_call_arguments.delta\ndata: {"type":'
    b'"response.function_call_arguments.delta","item_id":"fc_1","delta":"{\\"b\\":2,"}\n\n'
    b'event: response.output_item.done\ndata: {"type":"response.output_item.done",'
    b'"item":{"type":"function_call","id":"fc_1","call_id":"call_a","name":"peek",'
    b'"arguments":"{\\"b\\":2,\\"a\\":1}"}}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed","response":{"output":['
    b'{"type":"function_call","id":"fc_1","call_id":"call_a","name":"peek",'
    b'"arguments":"{\\"b\\":2,\\"a\\":1}"}]}}\n\n'
)
AB = canonical_json({"a": 1, "b": 2})


@pytest.mark.parametrize(
    ("body", "calls"),
    [
        (OPENAI_SSE, [("call_a", "remote__peek", AB), ("call_b", "web_fetch", b'{"url":"x"}')]),
        (ANTHROPIC_SSE, [("toolu_a", "peek", AB), ("toolu_b", "noargs", b"{}")]),
        (ANTHROPIC_JSON, [("toolu_a", "peek", AB)]),
        (RESPONSES_SSE, [("call_a", "peek", AB)]),
        (b'{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"f",'
         b'"arguments":"{not json"}}]}}]}', [("c", "f", None)]),
        (b'{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"f",'
         b'"arguments":"{\\"big\\": 2E999, \\"n\\": [-1e400, 1.5]}"}}]}}]}',
         [("c", "f", b'{"big":null,"n":[null,1.5]}')]),
        (b'{"choices":[{"message":{"content":"no tools"}}]}', []),
    ],
)  # fmt: skip
def test_the_calls_a_reply_asked_for_are_read_from_every_shape(
    body: bytes, calls: list[tuple[str, str, bytes | None]]
) -> None:
    assert reply_calls(body) == calls


# -- end to end: the real embedded engine asks, the official SDK client calls ------------------

#: Offered to the tiny model under the harness's naming; its grammar makes the arguments valid.
PEEK_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "remote__peek",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string", "maxLength": 6}},
            "required": ["q"],
            "additionalProperties": False,
        },
    },
}


def test_a_third_party_client_runs_the_call_the_engine_asked_for(
    engine_url: str, tmp_path: Path
) -> None:
    user = KeyPair.generate()
    remote = Remote(on_call=lambda name, args, headers: f"peeked {args.get('q')!r}")
    with LoopbackServer(remote.app()) as far:
        servers = {"remote": {"transport": "streamable_http", "url": far.url + "/mcp"}}
        config = proxy_config(engine_url, engine_extensions=True, mcp_servers=servers)
        with (
            Log.open(tmp_path / "r.db", appliance_key=KeyPair.generate()) as log,
            ProxyServer(config, log, env=ENV) as proxy,
        ):
            session = proxy.registry.open_session([user.recipient], pins={"seed": 11})
            url = mcp_url(session, "remote")
            before = _sdk_call(url, session.token, "peek", {"q": "x"})
            assert isinstance(before, MCPError)  # nothing asked for yet
            assert before.error.data["code"] == "reply_not_committed"

            gpt = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token)
            raw = gpt.chat.completions.with_raw_response.create(
                model="tiny",
                messages=[{"role": "user", "content": "peek"}],
                tools=[PEEK_TOOL],
                tool_choice="required",
            )
            reply_seq = raw.http_response.json()["affidavit"]["seq"]
            (asked,) = raw.parse().choices[0].message.tool_calls or []
            assert asked.type == "function" and asked.function.name == "remote__peek"
            args = json.loads(asked.function.arguments)

            other = {"q": args["q"] + "!"}
            wrong = _sdk_call(url, session.token, "peek", other)
            assert isinstance(wrong, MCPError) and wrong.error.data["code"] == "tool_not_asked"
            result = _sdk_call(url, session.token, "peek", args)
            assert not isinstance(result, MCPError), result
            assert result.content[0].text == f"peeked {args['q']!r}"
            again = _sdk_call(url, session.token, "peek", args)
            assert isinstance(again, MCPError) and again.error.data["code"] == "tool_call_served"
            assert [c[1] for c in remote.calls] == [args]  # the tool ran once

    bodies = read_bodies(tmp_path / "r.db", session.session_id, user)
    tool = [(s, b) for s, (_, b) in sorted(bodies.items()) if isinstance(b, ToolCall | ToolResult)]
    calls = [b for _, b in tool if isinstance(b, ToolCall)]
    results = [b.outcome for _, b in tool if isinstance(b, ToolResult)]
    # the refused wrong arguments, the admitted call (the engine's derived id), the second try
    assert [(c.reply_seq, c.call_id) for c in calls] == [
        (reply_seq, ""),
        (reply_seq, asked.id),
        (reply_seq, ""),
    ]
    assert calls[1].arguments == canonical_json(args) and calls[1].tool == "peek"
    assert results == ["FAILED", "COMMITTED", "FAILED"]
