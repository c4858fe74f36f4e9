"""Transports: one module dials out, and it translates its library's errors at the boundary.

- Reading the source: ``egress_proxy.transports.network`` is the only module of the proxy
  that imports ``httpx`` (and ``httpx2``, for the MCP SDK), and no module imports another
  HTTP client.
- A fresh interpreter that imports the pipeline, the app and the runner has neither the
  network transport nor ``httpx`` loaded (the app imports the transport only when built
  without one), so reconstruct can build the pipeline with no network code present.
- Against a real server on loopback: the body arrives byte for byte, in order; a refused
  connection is ``UpstreamUnavailable``; a body cut mid-way is ``UpstreamCut``.
- The network transport tells a call's ``WireTime`` how long it waited on its socket: the
  upstream's pauses count, the reader's own time between chunks does not, and a large body
  the upstream is slow to take counts too.
"""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import egress_proxy
from egress_proxy.errors import UpstreamCut, UpstreamUnavailable
from egress_proxy.transports.base import WIRE_TIME, UpstreamRequest, WireTime, header
from egress_proxy.transports.mock import MockResponse, MockTransport
from egress_proxy.transports.network import NetworkTransport
from tests.egress_proxy.loopback import FakeUpstream, LoopbackServer, Script, request_body

PACKAGE = Path(egress_proxy.__file__).resolve().parent
HTTP_CLIENTS = re.compile(
    r"^\s*(?:import|from)\s+(httpx\w*|httpcore\w*|aiohttp|requests|urllib3|urllib\.request|http\.client)\b",
    re.MULTILINE,
)


def test_only_the_network_transport_imports_an_http_client() -> None:
    importers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = HTTP_CLIENTS.findall(path.read_text("utf-8"))
        if found:
            importers[path.relative_to(PACKAGE).as_posix()] = sorted(set(found))
    # httpx2 is the MCP SDK's client: network.py builds it for remote tool servers.
    assert importers == {"transports/network.py": ["httpcore", "httpx", "httpx2"]}
    # ... and there only inside functions (or for type checking), never at import time.
    source = (PACKAGE / "transports" / "network.py").read_text("utf-8")
    assert not re.search(r"^(?:import|from)\s+(?:httpx|httpcore)", source, re.MULTILINE)


def test_importing_the_pipeline_loads_no_network_code() -> None:
    probe = (
        "import sys\n"
        "import egress_proxy.pipeline, egress_proxy.app, egress_proxy.server\n"
        "import egress_proxy.transports, egress_proxy.transports.mock, egress_proxy.recovery\n"
        "bad = sorted(m for m in sys.modules if m == 'egress_proxy.transports.network'"
        " or m.split('.')[0] in ('httpx', 'httpx2', 'httpcore', 'httpcore2'))\n"
        "print(bad)\n"
    )
    root = PACKAGE.parent
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=root, check=True
    )
    assert out.stdout.strip() == "[]"


def request(url: str, body: bytes = b"{}") -> UpstreamRequest:
    return UpstreamRequest("POST", url, (("content-type", "application/json"),), body, 5.0, 2.0)


async def fetch(transport: NetworkTransport, req: UpstreamRequest) -> tuple[int, bytes, str | None]:
    response = await transport.send(req)
    try:
        body = b"".join([chunk async for chunk in response.body()])
    finally:
        await response.aclose()
    return response.status, body, header(response.headers, "content-type")


def test_network_transport_against_a_loopback_server() -> None:
    stream = b'data: {"a":1}\r\n\r\n' * 50 + b"data: [DONE]\n\n"
    upstream = FakeUpstream(
        Script(chunks=[stream[i : i + 13] for i in range(0, len(stream), 13)], status=201)
    )
    upstream.script.content_type = "text/event-stream"

    async def run(url: str) -> None:
        transport = NetworkTransport()
        try:
            status, body, ctype = await fetch(transport, request(url + "/v1/x", b'{"k": 1}'))
            assert (status, body, ctype) == (201, stream, "text/event-stream")
            assert upstream.received[-1].body == b'{"k": 1}'
            upstream.script = Script(chunks=[b"data: partial"], cut=True)
            with pytest.raises(UpstreamCut):
                await fetch(transport, request(url + "/v1/x"))
        finally:
            await transport.aclose()

    with LoopbackServer(upstream) as server:
        asyncio.run(run(server.url))


def test_a_refused_connection_is_upstream_unavailable() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now

    async def run() -> None:
        transport = NetworkTransport()
        try:
            with pytest.raises(UpstreamUnavailable) as caught:
                await transport.send(request(f"http://127.0.0.1:{port}/v1/x"))
            assert caught.value.code == "upstream_unavailable"
            assert caught.value.status == 502
        finally:
            await transport.aclose()

    asyncio.run(run())


def test_the_network_transport_times_its_socket() -> None:
    """The upstream waits 0.2 s before its reply and 0.2 s between its two chunks: that is
    wire time. The reader then sleeps 0.4 s after the first chunk, by which time the second
    has arrived: that is the reader's time, not the wire's."""
    upstream = FakeUpstream(Script(chunks=[b"first ", b"second"], delay_s=0.2))
    upstream.on_request = lambda _received: time.sleep(0.2)

    async def run(url: str) -> tuple[WireTime, float]:
        transport = NetworkTransport()
        wire = WireTime()
        WIRE_TIME.set(wire)
        try:
            started = time.perf_counter()
            response = await transport.send(request(url + "/v1/x"))
            got = []
            async for chunk in response.body():
                got.append(chunk)
                await asyncio.sleep(0.4)
            await response.aclose()
            assert b"".join(got) == b"first second"
            return wire, time.perf_counter() - started
        finally:
            await transport.aclose()

    with LoopbackServer(upstream) as server:
        wire, took = asyncio.run(run(server.url))
    assert wire.measured
    assert 0.2 <= wire.seconds <= took - 0.7, (wire, took)  # the 0.8 s asleep stayed out


def test_a_large_body_the_upstream_is_slow_to_take_is_wire_time() -> None:
    """8 MiB sent to an upstream that reads nothing for 0.5 s: the write waits on the network
    (past asyncio's 64 KiB high-water mark), and that wait is the upstream's time."""
    body = b"x" * (8 << 20)

    async def slow_reader(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": message["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await asyncio.sleep(0.5)
        await request_body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run(url: str) -> WireTime:
        transport = NetworkTransport()
        wire = WireTime()
        WIRE_TIME.set(wire)
        try:
            assert (await fetch(transport, request(url + "/v1/x", body)))[:2] == (200, b"ok")
        finally:
            await transport.aclose()
        return wire

    with LoopbackServer(slow_reader) as server:
        wire = asyncio.run(run(server.url))
    assert wire.measured and wire.seconds >= 0.45, wire


def test_without_a_wire_time_nothing_is_counted() -> None:
    """A call nobody measures (no ``WireTime`` in its context) goes out all the same."""
    upstream = FakeUpstream(Script(chunks=[b"{}"]))

    async def run(url: str) -> tuple[int, bytes, str | None]:
        assert WIRE_TIME.get() is None
        transport = NetworkTransport()
        try:
            return await fetch(transport, request(url + "/v1/x"))
        finally:
            await transport.aclose()

    with LoopbackServer(upstream) as server:
        assert asyncio.run(run(server.url))[:2] == (200, b"{}")


def test_mock_transport_records_its_calls() -> None:
    mock = MockTransport(lambda req: MockResponse(chunks=[b"a", b"b"], cut=True))

    async def run() -> list[bytes]:
        response = await mock.send(request("http://upstream/v1/x", b"body"))
        got = []
        with pytest.raises(UpstreamCut):
            async for chunk in response.body():
                got.append(chunk)
        return got

    assert asyncio.run(run()) == [b"a", b"b"]
    assert [c.body for c in mock.calls] == [b"body"]
