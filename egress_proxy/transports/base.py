"""The one shape every upstream transport has: ``await send(request) -> response``.

A transport delivers a request's exact bytes to one upstream and hands back the status,
the headers and the body as an async iterator of the bytes as they arrive. It raises only
``UpstreamUnavailable`` (no response at all) from ``send``, and only ``UpstreamCut`` (the body
stopped early) while the body is read: each transport translates its library's exceptions
at this boundary, so the pipeline never learns which HTTP client, if any, was used.

This module dials nothing and imports no HTTP client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class UpstreamRequest:
    """What goes upstream, exactly: ``body`` is the bytes the record's content key covers."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0


class UpstreamResponse(Protocol):
    """A reply whose headers have arrived; its body is read once, as it arrives."""

    status: int
    headers: tuple[tuple[str, str], ...]  # lower-case names, in arrival order

    def body(self) -> AsyncIterator[bytes]:
        """The body's bytes as received; raises ``UpstreamCut`` if it stops early."""
        ...

    async def aclose(self) -> None: ...


class Transport(Protocol):
    async def send(self, request: UpstreamRequest) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


def header(headers: tuple[tuple[str, str], ...], name: str) -> str | None:
    """The first value of a header by (lower-case) name."""
    for key, value in headers:
        if key == name:
            return value
    return None
