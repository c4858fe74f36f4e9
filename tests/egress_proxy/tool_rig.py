"""Helpers for the tool routes' tests: real MCP servers, a raw HTTP server, an SDK client.

- ``build_tool_rig``: a scripted model upstream, a remote streamable-HTTP MCP server of ours
  (the SDK's low-level ``Server``) on loopback, and the proxy configured with three stdio
  servers it spawns (ours in its own network namespace, ours with the host's network, and
  the third-party ``mcp-server-time`` from PyPI) plus that remote one, and fetch enabled.
- ``RawHttpServer``: a loopback TCP server that keeps the exact bytes it receives and
  answers with scripted bytes, so a test can compare the wire with the record.
- ``mcp_client``: the official SDK client talking to the proxy's endpoint with a token.
- ``committed_reply``: a model call through the proxy whose committed reply asks for tools.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import httpx2
import mcp_types as types
import openai
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel.server import Server

from egress_proxy.server import ProxyServer
from record.log import Log
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, FakeUpstream, LoopbackServer, Rig, Script, proxy_config

STDIO_SERVER = Path(__file__).with_name("_mcp_stdio_server.py")
REMOTE_TOKEN = "remote-mcp-token-0123"


@dataclass
class Remote:
    """Our remote MCP server: ``on_call(name, arguments, headers)`` answers its tool calls."""

    on_call: Callable[[str, dict[str, Any], dict[str, str]], str] | None = None
    calls: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)

    def app(self) -> Any:
        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(
                tools=[types.Tool(name="peek", input_schema={"type": "object"})]
            )

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            headers = {k.lower(): v for k, v in ctx.request.headers.items()}
            arguments = params.arguments or {}
            self.calls.append((params.name, arguments, headers))
            text = self.on_call(params.name, arguments, headers) if self.on_call else "ok"
            content = [types.TextContent(type="text", text=text)]
            return types.CallToolResult(content=content, structured_content={"n": 1.5})

        server = Server("test-remote", on_list_tools=list_tools, on_call_tool=call_tool)
        return server.streamable_http_app(json_response=True, host="127.0.0.1")


class Sentinel:
    """A listening socket standing in for a tool upstream: it only counts connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/mcp"
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._count, daemon=True)
        self._thread.start()

    def _count(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@dataclass
class ToolRig:
    rig: Rig
    remote: Remote
    sentinel: Sentinel


@contextmanager
def build_tool_rig(tmp: Path) -> Iterator[ToolRig]:
    store_path = tmp / "record.db"
    appliance = KeyPair.generate()
    log = Log.open(store_path, appliance_key=appliance)
    upstream, remote = FakeUpstream(), Remote()
    ours = {"transport": "stdio", "command": sys.executable, "args": [str(STDIO_SERVER)]}
    servers = {
        "ours": {**ours, "idempotent_tools": ["echo"]},
        "ours-net": {**ours, "network": "host"},
        "time": {
            "transport": "stdio",
            "command": sys.executable,
            "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
        },
    }
    env = {**ENV, "TEST_REMOTE_MCP_TOKEN": REMOTE_TOKEN}
    sentinel = Sentinel()
    servers["sentinel"] = {"transport": "streamable_http", "url": sentinel.url}
    with LoopbackServer(upstream) as up, LoopbackServer(remote.app()) as far:
        servers["remote"] = {
            "transport": "streamable_http",
            "url": far.url + "/mcp",
            "bearer_token_env": "TEST_REMOTE_MCP_TOKEN",
        }
        # the raw servers the fetch tests dial are on loopback: allow-listed, explicitly
        fetch = {"enabled": True, "max_response_bytes": 64 * 1024, "allow": ["127.0.0.1/32"]}
        config = proxy_config(up.url, mcp_servers=servers, fetch=fetch)
        with ProxyServer(config, log, env=env) as proxy:
            rig = Rig(upstream, up.url, proxy, log, store_path, KeyPair.generate(), appliance)
            yield ToolRig(rig, remote, sentinel)
    sentinel.close()
    log.close()


@asynccontextmanager
async def mcp_client(url: str, token: str) -> AsyncIterator[ClientSession]:
    """The SDK's client on the proxy's endpoint, the session token as its bearer token."""
    headers = {"authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def meta(reply_seq: int, call_id: str) -> types.RequestParamsMeta:
    """The ``_meta`` that names the reply a tool call answers."""
    named: Any = {"affidavit/reply_seq": reply_seq, "affidavit/call_id": call_id}
    return cast(types.RequestParamsMeta, named)


Asked = str | tuple[str, str, dict[str, Any]]  # an id (asks for ``echo {}``), or id, name, args


def committed_reply(rig: Rig, session: Any, call_ids: list[Asked]) -> int:
    """Ask the model through the proxy; its committed reply asks for ``call_ids``: its seq.

    Each is an id (a call of ``echo`` with ``{}``) or ``(id, function name, arguments)``: a
    call the proxy admits only with that tool and those arguments (``egress_proxy.admission``).
    """
    asked = [(c, "echo", {}) if isinstance(c, str) else c for c in call_ids]
    calls = ",".join(
        json.dumps(
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        )
        for cid, name, args in asked
    )
    body = (
        '{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":'
        '[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant",'
        f'"content":null,"tool_calls":[{calls}]}}}}]}}'
    )
    rig.upstream.script = Script(chunks=[body.encode()])
    client = openai.OpenAI(base_url=session.openai_base_url, api_key=session.token, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[])
    seq: int = raw.http_response.json()["affidavit"]["seq"]
    return seq


class RawHttpServer:
    """Loopback TCP: keeps each request's exact bytes, runs ``on_request``, then answers."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.received: list[bytes] = []
        self.on_request: Callable[[bytes], None] | None = None
        self.errors: list[BaseException] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> RawHttpServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = _read_request(conn)
                self.received.append(data)
                try:
                    if self.on_request is not None:
                        self.on_request(data)
                except BaseException as exc:
                    self.errors.append(exc)
                conn.sendall(self.reply)


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    length = 0
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name == "content-length":
            length = int(value)
    while len(data) < len(head) + 4 + length:
        data += conn.recv(65536)
    return data


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists; a zombie would still answer, so a proxy that reports
    its server stopped must have waited for it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def mcp_url(session: Any, server: str) -> str:
    return f"{session.base_url}/mcp/{server}"


def rpc(
    session: Any, server: str, method: str, params: dict[str, Any], *, token: str | None = None
) -> httpx.Response:
    """One raw JSON-RPC request to the proxy's MCP endpoint (the stateless server needs no
    handshake), so a test sees the exact status and body."""
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2025-11-25",
    }
    token = session.token if token is None else token
    if token:  # "": no token at all
        headers["authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    return httpx.post(mcp_url(session, server), json=body, headers=headers, timeout=30)
