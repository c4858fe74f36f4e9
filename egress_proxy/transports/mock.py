"""A transport that calls a function: for unit tests of single pipeline stages only.

Every acceptance line is proven against real servers on loopback; this exists so one stage
can be driven without one. It records every request it is sent (``calls``), so a test can
assert what went upstream, or that nothing did.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from egress_proxy.errors import UpstreamCut
from egress_proxy.transports.base import UpstreamRequest, UpstreamResponse


@dataclass
class MockResponse:
    """A canned reply: ``chunks`` arrive in order; ``cut`` set means the body stops there."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),)
    chunks: Sequence[bytes] = ()
    cut: bool = False
    closed: bool = field(default=False, init=False)

    async def body(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.cut:
            raise UpstreamCut("mock: the body was cut")

    async def aclose(self) -> None:
        self.closed = True


Handler = Callable[[UpstreamRequest], Awaitable[UpstreamResponse] | UpstreamResponse]


class MockTransport:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.calls: list[UpstreamRequest] = []

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        self.calls.append(request)
        result = self.handler(request)
        if isinstance(result, Awaitable):
            return await result
        return result

    async def aclose(self) -> None:
        return None
