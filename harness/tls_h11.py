"""uvicorn's h11 protocol for the appliance's TLS listeners (the front, ``panel --tls``).

Closing a TLS connection sends ``close_notify`` and waits for the peer's (asyncio waits up
to 30 s). A client idle on a kept-alive connection reads nothing until its next request, so
at shutdown each such client held the stopping server for those 30 s: ``up`` stopped late,
and a caller that waited less left the server's thread running. Between two requests there
is no reply a missing ``close_notify`` could cut short, so an idle connection is dropped at
once; a connection in the middle of a request still finishes it first, as uvicorn does.
"""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["TlsH11Protocol"]


class TlsH11Protocol(H11Protocol):
    """h11, with idle connections aborted rather than closed when the server stops."""

    def shutdown(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self.transport.abort()
        else:
            super().shutdown()
