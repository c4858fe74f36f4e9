"""A remote MCP server's reply is read to at most its ``max_reply_bytes`` (#20 hardening,
found by an adversarial review: a server whose JSON reply never ended grew the proxy by
gigabytes, since the SDK reads a JSON reply whole, until the machine ran out of memory).

A real remote server on loopback (a raw ASGI app under uvicorn) answers ``tools/call``
``endless`` with a JSON body that never ends, and ``ok`` with a small one. Through the real
proxy route: the endless call is answered at once past the limit (long before the server's
``timeout_s``) with an error naming ``reply_too_large``, recorded as that call's ``FAILED``
result (the tool answered: settled); the server's next call is served; the record verifies.
The proxy also asks for replies uncompressed, so the limit bounds what a reply costs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from egress_proxy.server import ProxyServer
from record.audit import verify_store
from record.log import Log
from record.schema import ToolCall, ToolResult
from record.seal import KeyPair
from tests.egress_proxy.loopback import (
    ENV,
    FakeUpstream,
    LoopbackServer,
    Rig,
    proxy_config,
    request_body,
)
from tests.egress_proxy.tool_rig import committed_reply, meta, rpc

LIMIT = 256 * 1024
CHUNK = b" " * 65536  # JSON whitespace: the reply is well-formed so far, and never ends


class EndlessServer:
    """A streamable-HTTP MCP server, raw ASGI: JSON replies, ``endless`` never finishing."""

    def __init__(self) -> None:
        self.encodings: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        self.encodings.append(headers.get(b"accept-encoding", b"").decode())
        body = await request_body(receive)
        request = json.loads(body or b"{}")
        if "id" not in request:  # a notification
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        head = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
        method = request["method"]
        if method == "tools/call" and request["params"]["name"] == "endless":
            gone = asyncio.Event()

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                gone.set()

            watching = asyncio.create_task(watch())
            while not gone.is_set():  # until the reader goes away
                await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
                await asyncio.sleep(0)
            await watching
            return
        if method == "initialize":
            reply["result"] = {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "endless", "version": "1"},
            }
        elif method == "tools/list":
            tools = [{"name": n, "inputSchema": {"type": "object"}} for n in ("endless", "ok")]
            reply["result"] = {"tools": tools}
        else:
            reply["result"] = {"content": [{"type": "text", "text": "fine"}]}
        await send({"type": "http.response.body", "body": json.dumps(reply).encode()})


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Rig, EndlessServer]]:
    tmp = tmp_path_factory.mktemp("reply-limit")
    remote, model = EndlessServer(), FakeUpstream()
    appliance = KeyPair.generate()
    log = Log.open(tmp / "record.db", appliance_key=appliance)
    with LoopbackServer(remote) as far, LoopbackServer(model) as up:
        server = {
            "transport": "streamable_http",
            "url": far.url + "/mcp",
            "max_reply_bytes": LIMIT,
            "timeout_s": 120.0,  # past the test's own wait (30 s): only the limit ends the call
        }
        config = proxy_config(up.url, mcp_servers={"far": server})
        with ProxyServer(config, log, env=ENV) as proxy:
            user = KeyPair.generate()
            yield Rig(model, up.url, proxy, log, tmp / "record.db", user, appliance), remote
    log.close()


def test_a_reply_past_its_limit_is_cut_answered_recorded_and_the_server_still_served(
    rig: tuple[Rig, EndlessServer],
) -> None:
    proxy, remote = rig
    session = proxy.open_session()
    seq = committed_reply(proxy, session, [("e", "far__endless", {}), ("k", "far__ok", {})])

    cut = rpc(session, "far", "tools/call", {"name": "endless", "_meta": meta(seq, "e")})
    assert cut.status_code == 200, cut.text
    error = cut.json()["error"]
    # answered: without the limit the body would still be arriving after the server's 120 s
    assert "reply_too_large" in error["message"] and str(LIMIT) in error["message"], error

    fine = rpc(session, "far", "tools/call", {"name": "ok", "_meta": meta(seq, "k")})
    assert fine.json()["result"]["content"][0]["text"] == "fine"
    assert set(remote.encodings) == {"identity"}  # a compressed reply would escape the bound

    bodies = proxy.bodies(session.session_id)
    calls = {s: b.call_id for s, (_, b) in bodies.items() if isinstance(b, ToolCall)}
    results = {calls[b.call_seq]: b for _, b in bodies.values() if isinstance(b, ToolResult)}
    assert results["e"].outcome == "FAILED"  # it answered: settled, never sent again
    assert results["e"].error_bytes is not None
    assert json.loads(results["e"].error_bytes) == error
    assert results["k"].outcome == "COMMITTED"
    report = verify_store(proxy.store_path, key=proxy.user)
    assert report.ok, report
