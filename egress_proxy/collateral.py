"""Attestation collateral, fetched by the proxy and recorded: the control plane's
``FetchCollateral``.

Why: the appliance must keep its boot report's certificate chain, and when the host hands the
guest no certificate table the chain has to come from AMD's KDS. Only the proxy reaches the
network, and everything it fetches is recorded; so the appliance asks the proxy, which GETs
one path under ``[collateral] base_url`` (KDS, or a mirror the operator names), appends
``fetch.request`` (the exact request bytes, before dialing) and ``fetch.response`` (status
line, headers and body as received, or the failure) to the stream it is asked for, and hands
back status and body.

It is not the model's fetch endpoint: no model call admits it and nobody but a holder of the
control socket can ask. So it is narrow instead: GET only, a path under ``/vcek/v1/`` or
``/vlek/v1/`` (KDS's certificate and CRL documents) in the plain characters those use, no
query beyond KDS's SPL parameters' characters, an answer of at most ``max_response_bytes``.
A session armed for replay never fetches: its calls are served from the record.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network

from egress_proxy.config import CollateralConfig
from egress_proxy.errors import (
    EgressRefused,
    MalformedFetch,
    ReplayMiss,
    ResponseTooLarge,
    UpstreamCut,
    UpstreamUnavailable,
    UpstreamUnreachable,
)
from egress_proxy.fetch import (
    ExactTransport,
    parse_fetch,
    record_failed,
    record_received,
    response_head,
)
from egress_proxy.fetch_guard import EgressRule
from egress_proxy.sessions import Session
from egress_proxy.tools import append
from egress_proxy.transports.base import UpstreamRequest
from record.digest import Domain, digest
from record.log import Log
from record.schema import FetchRequest

__all__ = ["COLLATERAL_PATH", "Collateral", "CollateralFetcher"]

#: The paths a collateral fetch may ask for: KDS's documents (``attestation.amd_kds``).
COLLATERAL_PATH = re.compile(
    r"/v[cl]ek/v1/[A-Za-z0-9_-]{1,32}/[A-Za-z0-9_]{1,256}(\?[A-Za-z0-9=&]{1,256})?"
)
#: The base is the operator's (like a provider's base_url): no default refusal applies to it.
_ANYWHERE = EgressRule(allow=(IPv4Network("0.0.0.0/0"), IPv6Network("::/0")))
_USER_AGENT = "affidavit-proxy"


@dataclass(frozen=True)
class Collateral:
    """What a collateral fetch got: the status and body as received, and where it is kept."""

    status: int
    body: bytes
    request_seq: int
    response_seq: int


class CollateralFetcher:
    """GETs collateral through the proxy's one network transport, recording both ends."""

    def __init__(self, log: Log, transport: ExactTransport, config: CollateralConfig) -> None:
        self.log, self.transport, self.config = log, transport, config

    async def fetch(self, session: Session, path: str) -> Collateral:
        """Record, dial, read, record. ``MalformedFetch`` for a path it may not ask for and
        ``ReplayMiss`` for a replayed session, both before anything is recorded; a fetch
        that fails once recorded raises the ``ProxyError`` recorded as its outcome."""
        if not COLLATERAL_PATH.fullmatch(path):
            raise MalformedFetch(
                f"collateral: path {path!r} is not a KDS document path (/vcek/v1/… or /vlek/v1/…)"
            )
        if session.replay is not None:
            raise ReplayMiss("collateral: a replayed session is served from the record only")
        url = self.config.base_url + path
        ask = parse_fetch(json.dumps({"method": "GET", "url": url}).encode(), _USER_AGENT)
        sent = ask.request_bytes()
        request = FetchRequest(
            method="GET",
            url=url,
            request_bytes=sent,
            content_key=digest(Domain.FETCH_REQUEST, sent),
        )
        first = await append(self.log, session, request)
        upstream = UpstreamRequest(
            "GET",
            url,
            ask.headers,
            b"",
            timeout_s=self.config.timeout_s,
            connect_timeout_s=self.config.connect_timeout_s,
        )
        try:
            pinned = await _ANYWHERE.pin(ask.host, ask.port, self.config.connect_timeout_s)
            response = await self.transport.send_exact(upstream, str(pinned))
        except UpstreamUnreachable as exc:  # not a byte went out: the GET surely did not happen
            unreachable = UpstreamUnreachable(f"collateral: {url}: {exc}")
            await record_failed(self.log, session, first.seq, unreachable)
            raise unreachable from None
        except (EgressRefused, UpstreamUnavailable) as exc:
            await record_received(self.log, session, first.seq, "UNKNOWN")
            raise UpstreamUnavailable(f"collateral: {url}: {exc}") from None
        head = response_head(response)
        received = bytearray()
        try:
            async for chunk in response.body():
                received += chunk
                if len(received) > self.config.max_response_bytes:
                    limit = self.config.max_response_bytes
                    error = ResponseTooLarge(f"collateral: {url}: the answer exceeds {limit} bytes")
                    await record_failed(self.log, session, first.seq, error, response.status)
                    raise error
        except UpstreamCut as exc:
            await record_received(
                self.log, session, first.seq, "UNKNOWN", response.status, head + received
            )
            raise UpstreamCut(f"collateral: {url}: {exc}") from None
        finally:
            await response.aclose()
        whole = head + bytes(received)
        entry = await record_received(
            self.log, session, first.seq, "COMMITTED", response.status, whole
        )
        return Collateral(response.status, bytes(received), first.seq, entry.seq)
