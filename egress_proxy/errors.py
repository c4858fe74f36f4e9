"""Errors of the egress proxy, sorted by who is at fault.

::

    ProxyError                  base: stable ``code``, HTTP ``status``, ``exit_code``, diagnostics()
    ├── ConfigError             the config file is wrong; the message names the key (exit 2)
    │   └── ConfigMissing       the config file or an environment variable it names is absent (exit 3)
    ├── Refused                 the client's request is refused; nothing goes upstream
    │   ├── NotFound            404 not_found: no such route
    │   ├── MethodNotAllowed    405 method_not_allowed
    │   ├── Unauthorized        401 unauthorized: unknown session or wrong token (one answer for both)
    │   ├── BodyTooLarge        413 body_too_large: over ``max_body_bytes``; never read to the end
    │   ├── MalformedBody       400 malformed_json: not one I-JSON object; recorded as FAILED
    │   │   ├── PastLimit       400 past_limit: JSON past ``record.limits`` (nesting, number
    │   │   │                   length, message or tool count); recorded as FAILED
    │   │   └── MalformedFetch  400 malformed_fetch: JSON, but not a fetch request the proxy sends
    │   ├── EgressRefused       403 egress_refused: a fetch to an address the fetch rule refuses
    │   │                       (``egress_proxy.fetch_guard``); recorded as FAILED, never dialed
    │   └── ReplyNotCommitted   409 reply_not_committed: a tool call naming no committed model
    │       │                   reply of its session; recorded as a FAILED tool call
    │       ├── ToolNotAsked    409 tool_not_asked: the reply asked for no call of this name
    │       │                   and canonical arguments (``egress_proxy.admission``)
    │       └── ToolCallServed  409 tool_call_served: that call of the reply was served already
    │                           (or its outcome is unknown and it may not be sent again)
    ├── ReplayMiss              409 replay_miss: a replayed call the record does not hold; carries
    │                           the nearest recorded call and a diff; never goes live (exit 1)
    ├── RecordUnavailable       503 record_unavailable: the request could not be made durable, so
    │                           it was not sent (the record comes first, always)
    └── UpstreamError           the upstream gave no whole reply (exit 3); recorded as UNKNOWN
        ├── UpstreamUnavailable 502 upstream_unavailable: no response (connect, TLS, timeout)
        │   └── UpstreamUnreachable 502 upstream_unreachable: nothing was sent (the name did
        │                       not resolve, no connection or TLS session opened); a fetch
        │                       records it FAILED: the tool call surely did not happen
        ├── UpstreamCut         502 upstream_cut: the response stopped before its end
        └── ResponseTooLarge    502 response_too_large: a model reply over ``max_reply_bytes``
                                (recorded as UNKNOWN with what arrived) or a fetched body over
                                ``fetch.max_response_bytes`` (recorded as FAILED)

A provider's own error reply (a 4xx or 5xx with a body) is *not* a ``ProxyError``: the proxy
relays it verbatim with the same status and records it as ``FAILED``. Transports translate
their library's exceptions into ``UpstreamError`` at the boundary, so nothing above the
transport layer knows which HTTP client dialed.
"""

from __future__ import annotations

import json


class ProxyError(Exception):
    """Base of every proxy error; ``code`` is stable, the message is for people."""

    code = "proxy_error"
    status = 500
    exit_code = 1

    def diagnostics(self) -> str:
        return f"{self.code}: {self}"

    def body(self) -> bytes:
        """The data plane's JSON error body: ``{"error": {"code", "message"}}``."""
        return json.dumps(
            {"error": {"code": self.code, "message": str(self)}}, separators=(",", ":")
        ).encode()


class ConfigError(ProxyError):
    code = "config"
    exit_code = 2


class ConfigMissing(ConfigError):
    code = "config_missing"
    exit_code = 3


class Refused(ProxyError):
    code = "refused"
    status = 400


class NotFound(Refused):
    code = "not_found"
    status = 404


class MethodNotAllowed(Refused):
    code = "method_not_allowed"
    status = 405


class Unauthorized(Refused):
    code = "unauthorized"
    status = 401


class BodyTooLarge(Refused):
    code = "body_too_large"
    status = 413


class MalformedBody(Refused):
    code = "malformed_json"
    status = 400


class PastLimit(MalformedBody):
    code = "past_limit"


class MalformedFetch(MalformedBody):
    code = "malformed_fetch"


class EgressRefused(Refused):
    code = "egress_refused"
    status = 403


class ReplyNotCommitted(Refused):
    code = "reply_not_committed"
    status = 409


class ToolNotAsked(ReplyNotCommitted):
    code = "tool_not_asked"


class ToolCallServed(ReplyNotCommitted):
    code = "tool_call_served"


class ReplayMiss(ProxyError):
    """A call under replay that the record does not hold: it is refused, never sent live.

    ``nearest`` is the closest recorded call (``transports.recorded.RecordedCall``), or None
    when the record holds nothing of its kind; ``diff`` compares it with the call presented.
    """

    code = "replay_miss"
    status = 409

    def __init__(self, message: str, *, nearest: object | None = None, diff: str = "") -> None:
        super().__init__(message)
        self.nearest = nearest
        self.diff = diff

    def diagnostics(self) -> str:
        return f"{self.code}: {self}\n{self.diff}" if self.diff else super().diagnostics()

    def body(self) -> bytes:
        describe = getattr(self.nearest, "describe", None)
        nearest = describe() if callable(describe) else None
        error = {"code": self.code, "message": str(self), "nearest": nearest, "diff": self.diff}
        return json.dumps({"error": error}, separators=(",", ":")).encode()


class RecordUnavailable(ProxyError):
    code = "record_unavailable"
    status = 503
    exit_code = 3


class UpstreamError(ProxyError):
    code = "upstream_error"
    status = 502
    exit_code = 3


class UpstreamUnavailable(UpstreamError):
    code = "upstream_unavailable"


class UpstreamUnreachable(UpstreamUnavailable):
    """No byte of the request left: a fetch that never connected did not happen, so it is
    ``FAILED`` (with this reason), not ``UNKNOWN`` (which asks the user whether to retry)."""

    code = "upstream_unreachable"


class UpstreamCut(UpstreamError):
    code = "upstream_cut"


class ResponseTooLarge(UpstreamError):
    code = "response_too_large"


def answered_status(error_body: bytes | None, default: int = 502) -> int:
    """The status the proxy answered with an error body it wrote, from its ``error.code``:
    what a replayed or reconstructed fetch answers again (a recorded ``status`` is the
    upstream's, when one answered). ``default`` when the body names no code of the proxy's."""
    try:
        body = json.loads(error_body) if error_body else None
    except (ValueError, RecursionError):
        return default
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if not isinstance(code, str):
        return default
    found: list[type[ProxyError]] = [ProxyError]
    while found:
        kind = found.pop()
        if kind.code == code:
            return kind.status
        found.extend(kind.__subclasses__())
    return default
