"""#20 line 6: no call dies on a connection its server is closing.

An idle keep-alive connection is closed by whichever side's timer runs out first. When a
client's timer and the server's are the same (httpx's and uvicorn's are both 5 s), the client
can send a request at the very moment the server closes the connection: the call dies with no
answer (the bench's ``httpx.ReadError`` at 32 clients), and for the proxy's own upstream call
the record then holds a request whose reply never came (``UNKNOWN``). So each side lets go
first where it is the client, and last where it is the server:

- the proxy's data plane (and the engine, and the TLS front) keeps an idle connection 30 s,
  longer than any SDK keeps one (httpx and httpx2: 5 s);
- the proxy's upstream pool lets an idle connection go after 1 s, sooner than servers close
  theirs (uvicorn and Node 5 s, gunicorn 2 s).

Both are shown on real sockets: a request after 6 s idle on one connection is still answered
by the proxy, and the pool dials anew after 1.5 s idle against a server that closes at 2 s."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import httpx
import httpx2

from egress_proxy.config import parse_config
from egress_proxy.server import KEEP_ALIVE_S, ProxyServer
from egress_proxy.transports.base import UpstreamRequest
from egress_proxy.transports.network import KEEPALIVE_EXPIRY_S, NetworkTransport
from record.log import Log
from record.seal import KeyPair


def test_the_timers_leave_the_client_letting_go_first() -> None:
    clients = (httpx.Limits().keepalive_expiry, httpx2.Limits().keepalive_expiry)
    assert all(c is not None and c < KEEP_ALIVE_S for c in clients), clients
    assert KEEPALIVE_EXPIRY_S < 2.0  # gunicorn's default keep-alive, the shortest in use


def _get(sock: socket.socket, path: str) -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: proxy\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection without an answer")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head.split(b"\r\n", 1)[0]


def test_the_proxy_answers_on_a_connection_idle_past_clients_timers(tmp_path: Path) -> None:
    config = parse_config(
        {
            "listen": {"host": "127.0.0.1", "port": 0},
            "providers": {"m": {"api": "openai", "base_url": "http://127.0.0.1:9"}},
            "mounts": {"/v1/chat/completions": "m"},
        }
    )
    with (
        Log.open(tmp_path / "record.db", appliance_key=KeyPair.generate()) as log,
        ProxyServer(config, log) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock,
    ):
        assert _get(sock, "/metrics") == b"HTTP/1.1 200 OK"
        time.sleep(6)  # past the 5 s of uvicorn's default and of the SDKs' pools
        assert _get(sock, "/metrics") == b"HTTP/1.1 200 OK"  # the same connection, answered


async def _upstream(scope: dict[str, object], receive: object, send: object) -> None:
    """Answers every request with the client's port: which connection carried it."""
    if scope["type"] != "http":
        return
    client = scope["client"]
    assert isinstance(client, tuple)
    body = str(client[1]).encode()
    await send(  # type: ignore[operator]
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})  # type: ignore[operator]


def test_the_upstream_pool_lets_go_before_a_server_closes() -> None:
    import threading

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    # a server that closes idle connections after 2 s, as gunicorn does by default
    server = uvicorn.Server(
        uvicorn.Config(_upstream, log_level="warning", lifespan="off", timeout_keep_alive=2)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)

    async def port_of(transport: NetworkTransport) -> str:
        response = await transport.send(UpstreamRequest("GET", url, (), b""))
        try:
            return b"".join([chunk async for chunk in response.body()]).decode()
        finally:
            await response.aclose()

    async def run() -> list[str]:
        transport = NetworkTransport()
        try:
            ports = [await port_of(transport), await port_of(transport)]
            await asyncio.sleep(1.5)  # idle past the pool's 1 s, short of the server's 2 s
            ports.append(await port_of(transport))
            return ports
        finally:
            await transport.aclose()

    try:
        first, again, after_idle = asyncio.run(run())
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    assert first == again  # back to back: the connection is reused
    assert after_idle != first  # idle 1.5 s: let go by the pool, a new connection dialled
