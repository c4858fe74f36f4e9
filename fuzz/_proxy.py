"""The proxy's reading of a request body (``egress_proxy.providers``), for the request
targets: what the data plane does before it records the call."""

from __future__ import annotations

from egress_proxy.providers import params_of, parse_request
from record.digest import prompt_bytes


def proxy_checks(body: bytes) -> None:
    """Read a request as the proxy does; ``MalformedBody`` when it refuses it."""
    request = parse_request(body)
    params_of(request)
    prompt_bytes(request)
