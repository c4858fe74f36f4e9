"""Where a fetch may go: its host is resolved, every address checked, and one address pinned.

Why: the fetch endpoint dials what a model asked for. Unchecked, a URL reaches what sits
beside the proxy: its own ``/metrics`` on loopback, the inference engine, a cloud's metadata
service (``169.254.169.254``, ``fd00:ec2::254``). So, before anything is dialed:

- A host written as a number other than a dotted quad or a bracketed IPv6 literal is refused
  whatever the lists say: decimal (``2130706433``), octal (``0177.0.0.1``), hex
  (``0x7f000001``) and short (``127.1``) forms, which resolvers read as addresses.
- The host is resolved (``getaddrinfo``, in a worker thread, bounded by the connect timeout).
  Every address it resolves to is checked; one refused address refuses the fetch, naming it.
- An address is refused by default when it is IPv4-mapped IPv6, unspecified, loopback,
  link-local, multicast, in the shared (CGNAT) space ``100.64.0.0/10``, private, reserved,
  otherwise not globally routable, or a 6to4 address around a refused IPv4 address.
- ``fetch.allow`` networks are let through in spite of those defaults (a test's or the demo's
  loopback web); ``fetch.deny`` networks are refused whatever else holds. Deny wins.
- The first address is *pinned*: the transport connects to it, and to nothing else, while the
  ``Host`` header and the TLS server name stay the URL's host. A name that resolves elsewhere
  a moment later (DNS rebinding) changes nothing.

Redirects are never followed, so there is no second hop to check: a 3xx is the answer.
This module imports no HTTP client and dials nothing.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

from egress_proxy.errors import EgressRefused, UpstreamUnreachable

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

_SHARED = IPv4Network("100.64.0.0/10")  # RFC 6598: carrier-grade NAT
#: Each label of a host a resolver may read as a number (``inet_aton``: decimal, 0-octal, 0x-hex).
_NUMERIC_LABEL = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")
_DOTTED_QUAD = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
                          r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])")  # fmt: skip


def default_refusal(address: Address) -> str | None:
    """Why the default rule refuses ``address`` (a few words), or None when it is public."""
    if isinstance(address, IPv6Address):
        if address.ipv4_mapped is not None:
            return "an IPv4-mapped IPv6 address"
        if address.sixtofour is not None and default_refusal(address.sixtofour) is not None:
            return "a 6to4 address around a refused IPv4 address"
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if isinstance(address, IPv4Address) and address in _SHARED:
        return "shared address space (CGNAT)"
    if address.is_private:
        return "private"
    if address.is_reserved:
        return "reserved"
    if not address.is_global:
        return "not globally routable"
    return None


def numeric_host_form(host: str) -> bool:
    """Whether ``host`` is a number a resolver would read as an address, written other than as
    a plain dotted quad: ``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``."""
    labels = host.rstrip(".").split(".")
    if not all(_NUMERIC_LABEL.fullmatch(label) for label in labels):
        return False
    return not _DOTTED_QUAD.fullmatch(host)


@dataclass(frozen=True)
class EgressRule:
    """The default refusals, opened by ``allow`` and closed again by ``deny``."""

    allow: Sequence[Network] = ()
    deny: Sequence[Network] = ()

    def refusal(self, address: Address) -> str | None:
        """Why ``address`` may not be dialed, or None."""
        if any(address in network for network in self.deny if network.version == address.version):
            return "in fetch.deny"
        if any(address in network for network in self.allow if network.version == address.version):
            return None
        reason = default_refusal(address)
        return None if reason is None else f"{reason} (refused unless in fetch.allow)"

    def check_host(self, host: str) -> Address | None:
        """The literal address ``host`` is (checked), or None when it is a name to resolve.
        ``EgressRefused`` for a numeric form or a refused literal."""
        literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            address = ip_address(literal)
        except ValueError:
            if numeric_host_form(literal):
                raise EgressRefused(
                    f"fetch: host {host!r} is a number in decimal, octal, hex or short form; "
                    "write an address as a dotted quad or a bracketed IPv6 literal"
                ) from None
            return None
        self._check(host, address)
        return address

    async def pin(self, host: str, port: int, timeout_s: float) -> Address:
        """The checked address to dial for ``host``: ``EgressRefused`` naming the refused
        address, or ``UpstreamUnreachable`` when the name does not resolve in time."""
        literal = self.check_host(host)
        if literal is not None:
            return literal
        try:
            found = await asyncio.wait_for(
                asyncio.to_thread(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM),
                timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise UpstreamUnreachable(f"fetch: {host}: does not resolve: {exc}") from None
        addresses = list(dict.fromkeys(ip_address(str(info[4][0]).split("%")[0]) for info in found))
        if not addresses:
            raise UpstreamUnreachable(f"fetch: {host}: resolves to no address")
        for address in addresses:
            self._check(host, address)
        return addresses[0]

    def _check(self, host: str, address: Address) -> None:
        reason = self.refusal(address)
        if reason is not None:
            shown = host if host.strip("[]") == str(address) else f"{host} ({address})"
            raise EgressRefused(f"fetch: {shown} is {reason}")
