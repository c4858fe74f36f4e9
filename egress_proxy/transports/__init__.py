"""Upstream transports: ``base`` (the shape), ``network`` (the only module that dials out),
``mock`` (a function, for unit tests of single pipeline stages).

Importing this package imports no HTTP client and no network transport.
"""

from egress_proxy.transports.base import Transport, UpstreamRequest, UpstreamResponse

__all__ = ["Transport", "UpstreamRequest", "UpstreamResponse"]
