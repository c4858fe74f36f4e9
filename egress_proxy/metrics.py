"""Prometheus metrics of the data plane: calls, bytes, outcomes and added latency per upstream.

Every app has its own ``CollectorRegistry`` (never the process-global one), served at
``GET /metrics`` outside the session paths. Nothing here changes a byte or records anything:

- ``ProxyMetrics.stage`` wraps the whole pipeline (outside ``annotate``): it counts the call
  and the bytes the client sent and is delivered, and learns the recorded outcome from the
  reply's ``committed`` future (so a client that leaves still counts its outcome);
- ``ProxyMetrics.transport`` wraps the transport the pipeline dials: it times the upstream
  (send, first body byte, end of body) and counts the bytes sent and received.

Added latency is time in the proxy less the upstream's time, for the same call:
``(client's last byte − call start) − (upstream's time)``; added time to first byte likewise,
to the first body bytes. The upstream's time is what the call spent on its socket (connecting,
reading, writes that had to wait: ``transports.base.WIRE_TIME``, from the network transport), so the
proxy's own HTTP client counts as added, as a client sees it. A transport that sees no socket
falls back to the time its ``send`` and its body's reads took (the consumer's time between
reads stays out). A read's wait ends when its task runs again, not when the bytes arrived: time
the event loop spent on other calls meanwhile counts as the upstream's, so under load the
figure reads somewhat low. The call starts when the request's first bytes reach the HTTP server
(:class:`ArrivalStamped`, handed on by ``ProxyMetrics.arrivals``, the outermost middleware), so
parsing, routing, reading the body and finding the session count too; only the network before
it is outside. Both are observed only when the client reads its reply to the end. The parts
find each other through context variables: the pipeline runs in one task, the capture that
reads the upstream's body in a task it spawned (a copy of the context holding the same
``_Timing`` and ``WireTime``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from egress_proxy.errors import ProxyError, UpstreamUnavailable
from egress_proxy.transports.base import (
    WIRE_TIME,
    Transport,
    UpstreamRequest,
    UpstreamResponse,
    WireTime,
)

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from egress_proxy.pipeline import Call, Committed, Handler, Reply

__all__ = ["CONTENT_TYPE_LATEST", "ProxyMetrics"]

#: Added latency is expected in the low milliseconds (two durable commits); buckets in seconds.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


@dataclass
class _Timing:
    upstream: str
    start: float
    dial: float | None = None  # transport.send called
    upstream_end: float | None = None  # the upstream's body ended (whole, cut or failed)
    #: seconds the transport's ``send`` and each read of the body took (a stand-in for
    #: ``wire`` where the transport sees no socket); the consumer's time between reads is out
    waited: float = 0.0
    waited_first: float | None = None  # ``waited`` when the first body chunk came
    wire: WireTime = field(default_factory=WireTime)  # the upstream's socket time, if seen
    wire_first: float | None = None  # ``wire.seconds`` when the first body chunk came

    def upstream_s(self, *, first: bool) -> float:
        """Seconds of this call that were the upstream's: to its first body byte or its end."""
        if self.wire.measured:
            whole, at_first = self.wire.seconds, self.wire_first
        else:
            whole, at_first = self.waited, self.waited_first
        return whole if not first or at_first is None else at_first


_TIMING: ContextVar[_Timing | None] = ContextVar("affidavit_proxy_timing", default=None)
#: When the request being served reached the app (``ProxyMetrics.arrivals``).
_ARRIVED: ContextVar[float | None] = ContextVar("affidavit_proxy_arrived", default=None)


#: The scope key where :class:`ArrivalStamped` leaves when a request's first bytes came in.
ARRIVED_KEY = "affidavit.arrived"


class ArrivalStamped(H11Protocol):
    """uvicorn's h11 protocol, noting when each request's first bytes reached the server.

    The ASGI app sees a request only once its head is parsed and its task has had its turn
    on the loop; the client has been waiting since its first byte arrived. Stamped here, the
    added-latency figure counts that wait, the parsing and the scheduling too, as a client
    sees them (``bench/proxy_overhead.py`` compares the two)."""

    _first_bytes: float | None = None

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self._first_bytes is None and (self.cycle is None or self.cycle.response_complete):
            self._first_bytes = now  # bytes of a new request: its clock starts here
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle and self.cycle is not None:  # the head is whole: a request
            self.cycle.scope[ARRIVED_KEY] = self._first_bytes or now  # type: ignore[literal-required]
            self._first_bytes = None


class _Arrivals:
    """Raw ASGI: stamps each HTTP request's arrival for the call it becomes (the server's
    stamp of its first bytes when :class:`ArrivalStamped` serves it, else now)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            stamped = scope.get(ARRIVED_KEY)
            _ARRIVED.set(stamped if isinstance(stamped, float) else time.perf_counter())
        await self.app(scope, receive, send)


class ProxyMetrics:
    """The data plane's metrics, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter(
            "affidavit_proxy_calls",
            "Model calls that reached a provider route.",
            ["upstream"],
            registry=r,
        )
        self.outcomes = Counter(
            "affidavit_proxy_outcomes",
            "Calls by recorded outcome (COMMITTED, FAILED, UNKNOWN), or the error code of a "
            "call whose reply was not recorded.",
            ["upstream", "outcome"],
            registry=r,
        )
        self.bytes = Counter(
            "affidavit_proxy_bytes",
            "Body bytes: request_in from the client, request_out to the upstream, response_in "
            "from the upstream, response_out to the client.",
            ["upstream", "direction"],
            registry=r,
        )
        self.added_latency = Histogram(
            "affidavit_proxy_added_latency_seconds",
            "Time in the proxy less time in the upstream, to the reply's last byte.",
            ["upstream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.added_ttfb = Histogram(
            "affidavit_proxy_added_ttfb_seconds",
            "Time in the proxy less time in the upstream, to the reply's first byte.",
            ["upstream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (``CONTENT_TYPE_LATEST``)."""
        return generate_latest(self.registry)

    # -- hooks ---------------------------------------------------------------------------------

    def refused(self, call: Call) -> None:
        """A call refused after its body was read (malformed): recorded ``FAILED``, not sent."""
        name = call.upstream.name
        self.calls.labels(name).inc()
        self.bytes.labels(name, "request_in").inc(len(call.input_bytes))
        self.outcomes.labels(name, "FAILED").inc()

    arrivals = _Arrivals  # the app's outermost middleware: ``app.add_middleware(arrivals)``

    def stage(self, pipeline: Handler) -> Handler:
        """``pipeline`` wrapped: counts, outcomes and the proxy's side of the timing."""

        async def metered(call: Call) -> Reply:
            name = call.upstream.name
            timing = _Timing(name, _ARRIVED.get() or time.perf_counter())
            # This call's alone: the capture that reads the body was spawned with a copy, and
            # nothing after this call in the same task adds to it.
            timed, wired = _TIMING.set(timing), WIRE_TIME.set(timing.wire)
            self.calls.labels(name).inc()
            self.bytes.labels(name, "request_in").inc(len(call.input_bytes))
            try:
                reply = await pipeline(call)
            except ProxyError as exc:  # ``capture`` recorded an unreachable upstream UNKNOWN
                unknown = isinstance(exc, UpstreamUnavailable)
                self.outcomes.labels(name, "UNKNOWN" if unknown else exc.code).inc()
                raise
            finally:
                WIRE_TIME.reset(wired)
                _TIMING.reset(timed)
            if reply.committed is None:  # not recorded here: counted by its status
                self.outcomes.labels(name, f"status_{reply.status}").inc()
            else:
                reply.committed.add_done_callback(self._outcome(name))
            return replace(reply, body=self._delivered(name, timing, reply.body))

        return metered

    def transport(self, inner: Transport) -> Transport:
        """``inner`` wrapped: the upstream's side of the timing, bytes sent and received."""
        return _MeteredTransport(inner, self)

    # -- internals -----------------------------------------------------------------------------

    def _outcome(self, name: str) -> Callable[[asyncio.Future[Committed]], None]:
        def done(future: asyncio.Future[Committed]) -> None:
            if future.cancelled():
                outcome = "cancelled"
            elif (exc := future.exception()) is not None:
                outcome = exc.code if isinstance(exc, ProxyError) else "error"
            else:
                outcome = future.result().outcome
            self.outcomes.labels(name, outcome).inc()

        return done

    async def _delivered(
        self, name: str, timing: _Timing, body: AsyncIterator[bytes]
    ) -> AsyncIterator[bytes]:
        first: float | None = None
        sent = 0
        async for chunk in body:
            if first is None:
                first = time.perf_counter()
            sent += len(chunk)
            yield chunk
        end = time.perf_counter()
        first = end if first is None else first
        self.bytes.labels(name, "response_out").inc(sent)
        if timing.dial is None or timing.upstream_end is None:
            return  # never dialed, or the upstream is still being read: nothing to compare
        self.added_ttfb.labels(name).observe(
            max(0.0, (first - timing.start) - timing.upstream_s(first=True))
        )
        self.added_latency.labels(name).observe(
            max(0.0, (end - timing.start) - timing.upstream_s(first=False))
        )


class _MeteredTransport:
    def __init__(self, inner: Transport, metrics: ProxyMetrics) -> None:
        self.inner, self.metrics = inner, metrics

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        timing = _TIMING.get()
        if timing is None:  # not a metered call: pass through
            return await self.inner.send(request)
        timing.dial = time.perf_counter()
        self.metrics.bytes.labels(timing.upstream, "request_out").inc(len(request.body))
        try:
            response = await self.inner.send(request)
        finally:
            timing.waited += time.perf_counter() - timing.dial
        return _MeteredResponse(response, timing, self.metrics)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _MeteredResponse:
    def __init__(self, inner: UpstreamResponse, timing: _Timing, metrics: ProxyMetrics) -> None:
        self.inner, self.timing, self.metrics = inner, timing, metrics
        self.status = inner.status
        self.headers = inner.headers

    async def body(self) -> AsyncIterator[bytes]:
        timing = self.timing
        received = 0
        chunks = aiter(self.inner.body())
        try:
            while True:
                asked = time.perf_counter()
                try:
                    chunk = await anext(chunks)
                finally:
                    now = time.perf_counter()
                    timing.waited += now - asked
                if timing.waited_first is None:  # the first body chunk
                    timing.waited_first, timing.wire_first = timing.waited, timing.wire.seconds
                received += len(chunk)
                yield chunk
        except StopAsyncIteration:
            pass
        finally:
            timing.upstream_end = time.perf_counter()
            self.metrics.bytes.labels(timing.upstream, "response_in").inc(received)

    async def aclose(self) -> None:
        await self.inner.aclose()
