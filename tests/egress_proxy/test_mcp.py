"""MCP tool servers at the proxy, with real parts on every side.

- The official SDK client, with the session token, lists and calls tools at
  ``/s/{session}/mcp/{server}`` for each kind of upstream: a stdio server of ours the proxy
  spawns, the third-party ``mcp-server-time`` from PyPI (spawned the same way), and a remote
  streamable-HTTP server of ours on loopback.
- ``tool.call`` is durable before the upstream sees the call: the stdio tool reads the store
  file itself when it runs; the remote one opens the bodies. It holds the server, the tool,
  the canonical arguments and their digest, ``call_id``, ``reply_seq`` and ``idempotent``;
  ``tool.result`` holds the JSON-RPC ``result`` as received (RFC 8785), ``COMMITTED``.
- An upstream's JSON-RPC error reaches the client and is recorded ``FAILED``, verbatim.
- A spawned server has no network: it cannot reach a loopback listener, while the same
  server with ``network = "host"`` can (so the check is not vacuous).
- The remote upstream gets the configured bearer token and never the session's.
- Bad input: unknown server 404, missing or wrong token 401, a JSON-RPC batch 400, a body
  past ``record.limits`` 400 ``past_limit``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest

from record.digest import Domain, canonical_json, digest
from record.schema import ToolCall, ToolResult
from tests.egress_proxy.loopback import Rig, read_bodies
from tests.egress_proxy.tool_rig import (
    REMOTE_TOKEN,
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
    with build_tool_rig(tmp_path_factory.mktemp("mcp")) as rig:
        yield rig


def _tool_entries(rig: Rig, stream: str) -> list[tuple[int, ToolCall | ToolResult]]:
    bodies = rig.bodies(stream)
    return [(s, b) for s, (_, b) in bodies.items() if isinstance(b, ToolCall | ToolResult)]


def _call(url: str, token: str, tool: str, args: dict[str, Any], m: types.RequestParamsMeta) -> Any:
    async def go() -> tuple[types.ListToolsResult, Any]:
        async with mcp_client(url, token) as client:
            listed = await client.list_tools()
            return listed, await client.call_tool(tool, args, meta=m)

    return anyio.run(go)


def test_a_spawned_stdio_server_is_served_and_recorded(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    args = {"store": str(rig.store_path), "stream": session.session_id}
    seq = committed_reply(rig, session, [("call_1", "ours__kinds", args)])
    listed, result = _call(
        mcp_url(session, "ours"), session.token, "kinds", args, meta(seq, "call_1")
    )
    assert {t.name for t in listed.tools} == {"echo", "dial", "kinds", "fail", "exit"}
    seen = json.loads(result.content[0].text)  # what the store held while the tool ran
    [(call_seq, call), (result_seq, done)] = _tool_entries(rig, session.session_id)
    assert seen[-1] == [call_seq, "tool.call"]  # durable before the call, nothing after it yet
    assert isinstance(call, ToolCall) and isinstance(done, ToolResult)
    assert (call.server, call.tool, call.reply_seq, call.call_id) == (
        "ours",
        "kinds",
        seq,
        "call_1",
    )
    assert call.arguments == canonical_json(args)
    assert call.arguments_digest == digest(Domain.TOOL_ARGUMENTS, call.arguments)
    assert call.idempotent is False
    assert (done.call_seq, done.outcome, result_seq) == (call_seq, "COMMITTED", call_seq + 1)
    assert done.result_bytes is not None
    assert done.result_digest == digest(Domain.TOOL_RESULT, done.result_bytes)
    assert json.loads(done.result_bytes)["content"][0]["text"] == result.content[0].text


def test_the_result_recorded_is_the_json_rpc_result_as_received(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    seq = committed_reply(rig, session, [("call_e", "ours__echo", {"text": "é", "n": 1})])
    response = rpc(
        session, "ours", "tools/call", _params("echo", {"text": "é", "n": 1}, meta(seq, "call_e"))
    )
    assert response.status_code == 200
    assert response.json()["result"]["content"][0]["text"] == "é"
    [(_, call), (_, done)] = _tool_entries(rig, session.session_id)
    assert isinstance(call, ToolCall) and isinstance(done, ToolResult)
    assert call.idempotent is True  # the config names echo idempotent for this server
    assert call.arguments == '{"n":1,"text":"é"}'.encode()
    assert done.result_bytes == canonical_json(response.json()["result"])


def test_the_third_party_time_server_runs_offline_under_the_proxy(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    seq = committed_reply(rig, session, [("call_t", "time__get_current_time", {"timezone": "UTC"})])
    url = mcp_url(session, "time")
    listed, result = _call(
        url, session.token, "get_current_time", {"timezone": "UTC"}, meta(seq, "call_t")
    )
    assert "get_current_time" in {t.name for t in listed.tools}
    assert result.is_error is False
    assert json.loads(result.content[0].text)["timezone"] == "UTC"
    [(_, call), (_, done)] = _tool_entries(rig, session.session_id)
    assert isinstance(call, ToolCall) and isinstance(done, ToolResult)
    assert (call.server, call.tool, done.outcome) == ("time", "get_current_time", "COMMITTED")
    assert done.result_bytes is not None
    assert json.loads(done.result_bytes)["structuredContent"]["timezone"] == "UTC"


def test_a_remote_streamable_http_server_sees_the_call_only_once_it_is_durable(
    tools: ToolRig,
) -> None:
    rig, remote = tools.rig, tools.remote
    session = rig.open_session()
    seq = committed_reply(rig, session, [("call_r", "remote__peek", {"q": [1, 2]})])
    checked: list[int] = []

    def inspect_store(name: str, arguments: dict[str, Any], headers: dict[str, str]) -> str:
        bodies = read_bodies(rig.store_path, session.session_id, rig.user)  # its own connection
        calls = {s: b for s, (_, b) in bodies.items() if isinstance(b, ToolCall)}
        done = {b.call_seq for _, b in bodies.values() if isinstance(b, ToolResult)}
        last = max(calls)
        assert calls[last].arguments == canonical_json(arguments) and last not in done
        checked.append(last)
        return "seen"

    remote.on_call = inspect_store
    try:
        _, result = _call(
            mcp_url(session, "remote"), session.token, "peek", {"q": [1, 2]}, meta(seq, "call_r")
        )
    finally:
        remote.on_call = None
    assert result.content[0].text == "seen"
    assert len(checked) == 1
    headers = remote.calls[-1][2]
    assert headers["authorization"] == f"Bearer {REMOTE_TOKEN}"
    assert session.token not in json.dumps(headers)
    [(call_seq, _), (_, done)] = _tool_entries(rig, session.session_id)
    assert call_seq == checked[0]
    assert isinstance(done, ToolResult) and done.result_bytes is not None
    assert json.loads(done.result_bytes)["structuredContent"] == {"n": 1.5}


def test_an_upstream_error_is_relayed_and_recorded_failed(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    seq = committed_reply(rig, session, [("call_f", "ours__fail", {})])
    with pytest.raises(Exception) as caught:
        _call(mcp_url(session, "ours"), session.token, "fail", {}, meta(seq, "call_f"))
    errors = caught.value.exceptions if isinstance(caught.value, ExceptionGroup) else [caught.value]
    assert any("fail: as asked" in str(e) for e in _leaves(errors))
    [(_, _), (_, done)] = _tool_entries(rig, session.session_id)
    assert isinstance(done, ToolResult) and done.outcome == "FAILED"
    expected = {"code": types.INVALID_PARAMS, "message": "fail: as asked", "data": {"why": "test"}}
    assert done.error_bytes == canonical_json(expected)
    assert done.error_digest == digest(Domain.ERROR, done.error_bytes)


def _leaves(errors: Any) -> Iterator[BaseException]:
    for error in errors:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error.exceptions)
        else:
            yield error


def test_a_spawned_server_has_no_network_of_its_own(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        asked = [
            ("call_n", "ours__dial", {"port": port}),
            ("call_h", "ours-net__dial", {"port": port}),
        ]
        seq = committed_reply(rig, session, list(asked))
        isolated = rpc(
            session, "ours", "tools/call", _params("dial", {"port": port}, meta(seq, "call_n"))
        )
        text = isolated.json()["result"]["content"][0]["text"]
        assert text.startswith("no connection"), text
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing reached the listener
        hosted = rpc(
            session, "ours-net", "tools/call", _params("dial", {"port": port}, meta(seq, "call_h"))
        )
        assert hosted.json()["result"]["content"][0]["text"] == "connected"
        listener.accept()[0].close()


def test_bad_requests_are_refused_before_the_sdk(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    other = rig.open_session()
    before = len(rig.bodies(session.session_id))
    unknown = rpc(session, "nope", "tools/list", {})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    wrong = rpc(session, "ours", "tools/list", {}, token=other.token)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
    missing = rpc(session, "ours", "tools/list", {}, token="")
    assert missing.status_code == 401
    response = httpx.post(
        mcp_url(session, "ours"),
        json=[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}],
        headers={"authorization": f"Bearer {session.token}", "accept": "application/json"},
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "malformed_json"
    call = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"x":'
    for past in ("[" * 5000 + "]" * 5000, "9" * 5000):  # record.limits: nesting, number length
        response = httpx.post(
            mcp_url(session, "ours"),
            content=(call + past + "}}}").encode(),
            headers={"authorization": f"Bearer {session.token}", "accept": "application/json",
                     "content-type": "application/json"},
        )  # fmt: skip
        assert response.status_code == 400 and response.json()["error"]["code"] == "past_limit"
    assert len(rig.bodies(session.session_id)) == before  # none of these is recorded


def test_a_server_that_dies_mid_call_leaves_unknown_and_is_respawned(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    seq = committed_reply(
        rig, session, [("call_x", "ours__exit", {}), ("call_y", "ours__echo", {"text": "b"})]
    )
    died = rpc(session, "ours", "tools/call", _params("exit", {}, meta(seq, "call_x")))
    assert died.status_code == 200 and "error" in died.json()
    again = rpc(session, "ours", "tools/call", _params("echo", {"text": "b"}, meta(seq, "call_y")))
    assert again.json()["result"]["content"][0]["text"] == "b"
    results = [b for _, b in _tool_entries(rig, session.session_id) if isinstance(b, ToolResult)]
    assert [r.outcome for r in results] == ["UNKNOWN", "COMMITTED"]  # no answer: fate unknown


def _params(name: str, arguments: dict[str, Any], m: types.RequestParamsMeta) -> dict[str, Any]:
    return {"name": name, "arguments": arguments, "_meta": m}


def test_a_host_that_cannot_unshare_the_network_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from egress_proxy.errors import ConfigError
    from egress_proxy.mcp_gateway import check_netns

    check_netns()  # here it can
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="network = 'host'"):
        check_netns()


@pytest.mark.parametrize(
    ("servers", "named"),
    [
        ({"Bad Name": {"transport": "stdio", "command": "x"}}, "must match"),
        ({"s": {"transport": "pipe", "command": "x"}}, "mcp_servers.s"),
        ({"s": {"transport": "stdio"}}, "mcp_servers.s.stdio.command"),
        ({"s": {"transport": "stdio", "command": "x", "network": "lan"}}, "network"),
        ({"s": {"transport": "streamable_http", "url": "ftp://x"}}, "url"),
        ({"s": {"transport": "stdio", "command": "x", "shell": True}}, "shell"),
    ],
)
def test_bad_tool_server_config_names_the_key(servers: dict[str, Any], named: str) -> None:
    from egress_proxy.errors import ConfigError
    from tests.egress_proxy.loopback import proxy_config

    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        proxy_config("http://127.0.0.1:1", mcp_servers=servers)


def test_an_unset_bearer_token_variable_fails_at_start() -> None:
    from egress_proxy.errors import ConfigMissing
    from egress_proxy.tool_config import bearer_tokens
    from tests.egress_proxy.loopback import proxy_config

    remote = {"transport": "streamable_http", "url": "http://x/mcp", "bearer_token_env": "NOPE"}
    config = proxy_config("http://127.0.0.1:1", mcp_servers={"r": remote})
    with pytest.raises(ConfigMissing, match="NOPE"):
        bearer_tokens(config.mcp_servers, {})


def test_a_client_that_leaves_does_not_stop_the_call_or_its_recording(tools: ToolRig) -> None:
    rig, remote = tools.rig, tools.remote
    session = rig.open_session()
    seq = committed_reply(rig, session, [("call_slow", "remote__peek", {})])
    gate = threading.Event()

    def slow(name: str, arguments: dict[str, Any], headers: dict[str, str]) -> str:
        gate.wait(10)
        return "late"

    remote.on_call = slow
    try:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and goes away
            httpx.post(
                mcp_url(session, "remote"),
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": _params("peek", {}, meta(seq, "call_slow"))},
                headers={"authorization": f"Bearer {session.token}",
                         "accept": "application/json, text/event-stream"},
                timeout=0.5,
            )  # fmt: skip
        gate.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            results = [
                b for _, b in _tool_entries(rig, session.session_id) if isinstance(b, ToolResult)
            ]
            if results:
                break
            time.sleep(0.05)
    finally:
        remote.on_call = None
        gate.set()
    [done] = results
    assert done.outcome == "COMMITTED" and done.result_bytes is not None
    assert json.loads(done.result_bytes)["content"][0]["text"] == "late"
