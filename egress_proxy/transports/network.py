"""The network transport: the one module of the proxy that dials out.

It alone imports an HTTP client (``httpx``), and only inside its functions, so importing the
pipeline, or building it for reconstruct with a record-backed transport, never loads one (a
test asserts both: no other module imports ``httpx``, and a fresh interpreter that imports
the pipeline has neither this module nor ``httpx`` in ``sys.modules``).

``httpx`` exceptions are translated here: no response becomes ``UpstreamUnavailable`` (for an
exact fetch, ``UpstreamUnreachable`` when no connection opened, so nothing was sent), a
body that stops early becomes ``UpstreamCut``. Environment proxy settings are ignored
(``trust_env=False``): where a request goes is the config's business alone. Redirects are
not followed: a redirect is a reply, recorded and relayed like any other.

Two additions serve the tool routes: ``send_exact`` (the fetch endpoint: exactly the headers
given, in order, and the body's bytes as received, content-coding not undone; the connection
goes to the address the fetch rule checked and pinned, with ``Host`` and the TLS server name
still the URL's host, and is never reused for another fetch) and
``mcp_http_client`` (the ``httpx2`` client the MCP SDK dials remote tool servers with, set up
with the same rules: no environment proxies, no redirects followed by the client).

Model calls go through ``httpx`` over a transport of ours (``_wire_timed_transport_type``):
the same ``httpcore`` pool ``httpx`` builds, with a network backend that times each socket
connect, read and any write that can wait for the network (``transports.base.WIRE_TIME``),
which ``httpx`` has no hook for.
The proxy's added-latency metric then subtracts only that time: the HTTP client's own work
counts as added, as a client sees it.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from egress_proxy.errors import UpstreamCut, UpstreamUnavailable, UpstreamUnreachable
from egress_proxy.transports.base import UpstreamRequest, UpstreamResponse, on_the_wire

if TYPE_CHECKING:
    import httpx
    import httpx2


#: Bytes asyncio's socket transport takes without pausing its writer (its default high-water
#: mark): a smaller write never waits for the network.
WRITE_AT_ONCE = 64 * 1024

#: Seconds an idle upstream connection is kept for reuse (see ``NetworkTransport._pool``).
KEEPALIVE_EXPIRY_S = 1.0


class NetworkTransport:
    """Dial upstreams over HTTP(S) with one connection pool, created on first use.

    The pool belongs to the event loop that first sends through it; ``aclose`` it there.
    """

    def __init__(self, *, max_connections: int = 64) -> None:
        self._max_connections = max_connections
        self._client: httpx.AsyncClient | None = None
        self._exact: httpx.AsyncClient | None = None  # fetches: its own pool and cookie jar

    def _pool(self) -> httpx.AsyncClient:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(
                trust_env=False,
                follow_redirects=False,
                timeout=None,
                # an idle connection is let go after 1 s, before any server closes it (uvicorn
                # and Node: 5 s, gunicorn: 2 s), so no request goes out on a connection the
                # upstream is closing: it would be recorded UNKNOWN, though never answered
                transport=_wire_timed_transport_type()(self._max_connections, KEEPALIVE_EXPIRY_S),
            )
        return self._client

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        import httpx

        client = self._pool()
        built = client.build_request(
            request.method,
            request.url,
            headers=list(request.headers),
            content=request.body,
            timeout=httpx.Timeout(request.timeout_s, connect=request.connect_timeout_s),
        )
        try:
            response = await client.send(built, stream=True)
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"{request.url}: {type(exc).__name__}: {exc}") from None
        return _NetworkResponse(response, request.url)

    async def send_exact(self, request: UpstreamRequest, address: str) -> ExactResponse:
        """Send ``request`` as it is: its headers only, in order (``host`` among them), its
        body, and the URL's target unchanged, over a connection to ``address`` (an IP address:
        no name is resolved here) whose TLS server name is the URL's host. ``ValueError``
        (nothing sent) if the client would add or change a header; the body is read raw
        (content-coding is not undone)."""
        import httpx

        parts = urlsplit(request.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        dialed = f"[{address}]" if ":" in address else address
        target = (parts.path or "/") + (f"?{parts.query}" if "?" in request.url else "")
        built = httpx.Request(
            request.method,
            f"{parts.scheme}://{dialed}:{port}{target}",
            headers=list(request.headers),
            content=request.body or None,
            extensions={
                "timeout": httpx.Timeout(
                    request.timeout_s, connect=request.connect_timeout_s
                ).as_dict(),
                "sni_hostname": parts.hostname or "",
            },
        )
        sent = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in built.headers.raw]
        if sent != list(request.headers):
            raise ValueError(f"the request would go out with other headers: {sent}")
        if built.url.raw_path != target.encode("ascii", "replace"):
            raise ValueError(f"the request would go out for {built.url.raw_path!r}, not {target!r}")
        if self._exact is None:
            self._exact = httpx.AsyncClient(  # no keep-alive: a connection is one pinned fetch's
                trust_env=False,
                follow_redirects=False,
                timeout=None,
                limits=httpx.Limits(max_keepalive_connections=0),
            )
        try:
            response = await self._exact.send(built, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # before any request byte
            raise UpstreamUnreachable(f"{request.url}: {type(exc).__name__}: {exc}") from None
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"{request.url}: {type(exc).__name__}: {exc}") from None
        return ExactResponse(response, request.url)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._exact is not None:
            await self._exact.aclose()
            self._exact = None


class _NetworkResponse:
    def __init__(self, response: httpx.Response, url: str) -> None:
        self._response = response
        self._url = url
        self.status = response.status_code
        self.headers = tuple(
            (k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in response.headers.raw
        )

    async def body(self) -> AsyncIterator[bytes]:
        import httpx

        try:
            async for chunk in self._response.aiter_bytes():
                yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamCut(f"{self._url}: {type(exc).__name__}: {exc}") from None

    async def aclose(self) -> None:
        await self._response.aclose()


class ExactResponse(_NetworkResponse):
    """A fetched response: raw header names, reason and version, and the body undecoded."""

    def __init__(self, response: httpx.Response, url: str) -> None:
        super().__init__(response, url)
        self.reason = response.reason_phrase
        self.http_version = response.http_version
        self.raw_headers = tuple(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw
        )

    async def body(self) -> AsyncIterator[bytes]:
        import httpx

        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamCut(f"{self._url}: {type(exc).__name__}: {exc}") from None


def mcp_http_client(
    headers: dict[str, str], timeout_s: float, connect_timeout_s: float, max_reply_bytes: int
) -> httpx2.AsyncClient:
    """The client the MCP SDK reaches a remote tool server with (the SDK speaks ``httpx2``).

    A reply is read to at most ``max_reply_bytes`` and asked for uncompressed, so what it
    costs in memory is bounded by what it sent: the SDK reads a JSON reply whole, and a
    server that never stopped sending grew the proxy until the machine ran out. Past the
    limit the read fails with a stream error (``reply_too_large``), which the SDK answers the
    waiting call with at once (a JSON-RPC error naming the limit): the call is recorded
    ``FAILED``."""
    import httpx2

    return httpx2.AsyncClient(
        trust_env=False,
        follow_redirects=False,
        headers={**headers, "accept-encoding": "identity"},
        timeout=httpx2.Timeout(timeout_s, connect=connect_timeout_s),
        transport=_capped_transport_type()(max_reply_bytes),
    )


@functools.cache
def _capped_transport_type() -> Any:
    """The ``httpx2`` transport that bounds each reply (made once ``httpx2`` is loaded: this
    module imports its clients only inside functions)."""
    import httpx2

    class ReplyTooLarge(httpx2.StreamError):
        """A reply past ``max_reply_bytes``: a stream error, the kind the MCP SDK answers
        the call that waited on it with."""

    class CappedStream(httpx2.AsyncByteStream):
        def __init__(self, inner: httpx2.AsyncByteStream, limit: int, url: str) -> None:
            self._inner, self._limit, self._url = inner, limit, url

        async def __aiter__(self) -> AsyncIterator[bytes]:
            seen = 0
            async for chunk in self._inner:
                seen += len(chunk)
                if seen > self._limit:
                    raise ReplyTooLarge(
                        f"reply_too_large: {self._url} sent more than {self._limit} bytes "
                        "(max_reply_bytes); the rest was not read"
                    )
                yield chunk

        async def aclose(self) -> None:
            await self._inner.aclose()

    class CappedTransport(httpx2.AsyncBaseTransport):
        def __init__(self, limit: int) -> None:
            self._inner, self._limit = httpx2.AsyncHTTPTransport(trust_env=False), limit

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            response = await self._inner.handle_async_request(request)
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            return httpx2.Response(
                status_code=response.status_code,
                headers=response.headers,
                stream=CappedStream(response.stream, self._limit, str(request.url)),
                extensions=response.extensions,
            )

        async def aclose(self) -> None:
            await self._inner.aclose()

    return CappedTransport


@functools.cache
def _wire_timed_transport_type() -> Any:
    """The ``httpx`` transport of model calls: ``httpx``'s own mapping onto an ``httpcore``
    pool whose network backend times every connect and read, and each write that can wait
    for the network (``on_the_wire``).
    ``httpx.AsyncHTTPTransport`` takes no network backend, so this is its request and reply
    mapping again, over public ``httpcore`` API; its exceptions keep their ``httpx`` names."""
    import httpcore
    import httpx

    def translated(exc: Exception) -> httpx.HTTPError:
        """``httpcore``'s exception as the ``httpx`` one of the same name (both libraries
        name them alike), so messages and ``except httpx.…`` clauses read as before."""
        kind = getattr(httpx, type(exc).__name__, None)
        if not (isinstance(kind, type) and issubclass(kind, httpx.TransportError)):
            kind = httpx.TransportError
        return kind(str(exc))

    failures = (  # every exception httpcore raises for a request, as httpx maps them
        httpcore.TimeoutException,
        httpcore.NetworkError,
        httpcore.ProtocolError,
        httpcore.UnsupportedProtocol,
        httpcore.ProxyError,
    )

    class TimedStream(httpcore.AsyncNetworkStream):
        """Times reads (waiting for the upstream's bytes) and writes that can wait for the
        network. asyncio's socket transport takes a write at once until it holds more than
        its high-water mark (64 KiB); below that a write's time is the proxy's own work
        (anyio's turn on the loop), not the network's, and is left out."""

        def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
            self._inner = inner
            self._backlog = False  # a write past the high-water mark may still be draining

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            self._backlog = False  # the upstream answers: what was written has gone
            with on_the_wire():
                return await self._inner.read(max_bytes, timeout)

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._backlog = self._backlog or len(buffer) > WRITE_AT_ONCE
            if not self._backlog:
                await self._inner.write(buffer, timeout)
                return
            with on_the_wire():
                await self._inner.write(buffer, timeout)

        async def aclose(self) -> None:
            await self._inner.aclose()

        async def start_tls(
            self,
            ssl_context: Any,
            server_hostname: str | None = None,
            timeout: float | None = None,
        ) -> httpcore.AsyncNetworkStream:
            with on_the_wire():
                return TimedStream(
                    await self._inner.start_tls(ssl_context, server_hostname, timeout)
                )

        def get_extra_info(self, info: str) -> Any:
            return self._inner.get_extra_info(info)

    class TimedBackend(httpcore.AsyncNetworkBackend):
        def __init__(self) -> None:
            self._inner = httpcore.AnyIOBackend()

        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Any = None,
        ) -> httpcore.AsyncNetworkStream:
            with on_the_wire():
                return TimedStream(
                    await self._inner.connect_tcp(
                        host, port, timeout, local_address, socket_options
                    )
                )

        async def connect_unix_socket(
            self, path: str, timeout: float | None = None, socket_options: Any = None
        ) -> httpcore.AsyncNetworkStream:
            with on_the_wire():
                return TimedStream(
                    await self._inner.connect_unix_socket(path, timeout, socket_options)
                )

        async def sleep(self, seconds: float) -> None:
            await self._inner.sleep(seconds)

    class Body(httpx.AsyncByteStream):
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        async def __aiter__(self) -> AsyncIterator[bytes]:
            try:
                async for chunk in self._inner:
                    yield chunk
            except failures as exc:
                raise translated(exc) from exc

        async def aclose(self) -> None:
            if hasattr(self._inner, "aclose"):
                await self._inner.aclose()

    class WireTimedTransport(httpx.AsyncBaseTransport):
        def __init__(self, max_connections: int, keepalive_expiry: float) -> None:
            self._pool = httpcore.AsyncConnectionPool(
                ssl_context=httpx.create_ssl_context(trust_env=False),
                max_connections=max_connections,
                keepalive_expiry=keepalive_expiry,
                http1=True,
                http2=False,
                network_backend=TimedBackend(),
            )

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            assert isinstance(request.stream, httpx.AsyncByteStream)
            sent = httpcore.Request(
                method=request.method,
                url=httpcore.URL(
                    scheme=request.url.raw_scheme,
                    host=request.url.raw_host,
                    port=request.url.port,
                    target=request.url.raw_path,
                ),
                headers=request.headers.raw,
                content=request.stream,
                extensions=request.extensions,
            )
            try:
                reply = await self._pool.handle_async_request(sent)
            except failures as exc:
                raise translated(exc) from exc
            return httpx.Response(
                status_code=reply.status,
                headers=reply.headers,
                stream=Body(reply.stream),
                extensions=reply.extensions,
            )

        async def aclose(self) -> None:
            await self._pool.aclose()

    return WireTimedTransport
