"""The one shape every upstream transport has: ``await send(request) -> response``.

A transport delivers a request's exact bytes to one upstream and hands back the status,
the headers and the body as an async iterator of the bytes as they arrive. It raises only
``UpstreamUnavailable`` (no response at all) from ``send``, and only ``UpstreamCut`` (the body
stopped early) while the body is read: each transport translates its library's exceptions
at this boundary, so the pipeline never learns which HTTP client, if any, was used.

A transport that sees its sockets also says how long each call waited on them (connecting,
reading the reply, writes that had to wait for the network) through :data:`WIRE_TIME`, so the
proxy's added-latency metric subtracts the upstream's time and none of its own HTTP client's
work.

This module dials nothing and imports no HTTP client.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
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


@dataclass
class WireTime:
    """Seconds one call spent waiting on its upstream's socket: connecting (TLS included),
    reading the reply, writes that had to wait for the network. ``measured`` stays False where
    the transport sees no socket (a recorded or in-process upstream)."""

    seconds: float = 0.0
    measured: bool = False


#: The current call's :class:`WireTime`, set by whoever measures it (``ProxyMetrics.stage``);
#: the task that reads the reply's body runs in a copy of the same context, so it adds to it.
WIRE_TIME: ContextVar[WireTime | None] = ContextVar("affidavit_wire_time", default=None)


@contextmanager
def on_the_wire() -> Iterator[None]:
    """Counts the time inside toward the current call's :class:`WireTime`, if one is set."""
    wire = WIRE_TIME.get()
    if wire is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        wire.seconds += time.perf_counter() - started
        wire.measured = True


def header(headers: tuple[tuple[str, str], ...], name: str) -> str | None:
    """The first value of a header by (lower-case) name."""
    for key, value in headers:
        if key == name:
            return value
    return None
