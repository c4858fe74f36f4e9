"""The network transport: the one module of the proxy that dials out.

It alone imports an HTTP client (``httpx``), and only inside its functions, so importing the
pipeline, or building it for reconstruct with a record-backed transport, never loads one (a
test asserts both: no other module imports ``httpx``, and a fresh interpreter that imports
the pipeline has neither this module nor ``httpx`` in ``sys.modules``).

``httpx`` exceptions are translated here: no response becomes ``UpstreamUnavailable``, a
body that stops early becomes ``UpstreamCut``. Environment proxy settings are ignored
(``trust_env=False``): where a request goes is the config's business alone. Redirects are
not followed: a redirect is a reply, recorded and relayed like any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from egress_proxy.errors import UpstreamCut, UpstreamUnavailable
from egress_proxy.transports.base import UpstreamRequest, UpstreamResponse

if TYPE_CHECKING:
    import httpx


class NetworkTransport:
    """Dial upstreams over HTTP(S) with one connection pool, created on first use.

    The pool belongs to the event loop that first sends through it; ``aclose`` it there.
    """

    def __init__(self, *, max_connections: int = 64) -> None:
        self._max_connections = max_connections
        self._client: httpx.AsyncClient | None = None

    def _pool(self) -> httpx.AsyncClient:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(
                trust_env=False,
                follow_redirects=False,
                timeout=None,
                limits=httpx.Limits(max_connections=self._max_connections),
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

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


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
