"""uvicorn's h11 protocol for the appliance's listeners that face the outside (the front,
``panel --tls``), where any peer may be hostile.

- **A silent client is dropped.** uvicorn times a connection out only after a reply, and only
  until the next byte arrives: a client that connected and sent nothing, or trickled a request
  head a byte at a time, held its socket for ever, and enough of them use up the open files
  the engine and the record share with it. Here every connection must deliver a whole
  request head within the keep-alive time, after connecting as after each reply, or it is
  aborted. The TLS handshake before it has ``HANDSHAKE_S`` (asyncio's default is 60 s):
  uvicorn sets no bound of its own, so the listener runs on :func:`handshake_bounded_loop`.
- **At most** ``max_connections`` **are open at once, and** ``max_per_peer`` **from one
  address.** Past either a new connection is dropped as soon as it is made, so one peer
  cannot take every place; :func:`allow_open_files` lets the process hold those sockets
  beside its own files (a service starts with 1,024).
- **Idle connections are aborted at shutdown.** Closing TLS sends ``close_notify`` and waits
  for the peer's (asyncio: up to 30 s); a client idle on a kept-alive connection reads
  nothing until its next request, so each held a stopping server for those 30 s. Between two
  requests there is no reply a missing ``close_notify`` could cut short; a connection in the
  middle of a request still finishes it first, as uvicorn does.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "BOUNDED_LOOP",
    "MAX_CONNECTIONS",
    "MAX_PER_PEER",
    "TlsH11Protocol",
    "allow_open_files",
    "handshake_bounded_loop",
]

#: Seconds a peer has to finish its TLS handshake (a slow link needs well under 2).
HANDSHAKE_S = 10.0
#: Connections one outside-facing listener keeps open at once.
MAX_CONNECTIONS = 1024
#: Of those, from one address: one peer cannot take every place (many users behind one NAT
#: still can share it, an SDK's pool holding up to 100 each).
MAX_PER_PEER = 256
#: Open files the process keeps for itself beside a listener's connections (the record's
#: database and journal, the engine's model, the control socket, pipes, logs).
OWN_FILES = 1024
#: Sockets one connection may hold in this process: a request the front relays holds the
#: client's, the relay's to the proxy, and the proxy's end of that one.
FILES_PER_CONNECTION = 3


class TlsH11Protocol(H11Protocol):
    """h11 with a deadline for each request head, a cap on open connections, and idle
    connections aborted rather than closed when the server stops."""

    max_connections = MAX_CONNECTIONS
    max_per_peer = MAX_PER_PEER
    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = self.client[0] if self.client else None
        addresses = [getattr(c, "client", None) for c in self.connections]
        from_peer = sum(1 for a in addresses if a and a[0] == peer)
        if len(self.connections) > self.max_connections or from_peer > self.max_per_peer:
            transport.abort()
            return
        self._await_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        """Abort the connection unless a request head arrives within the keep-alive time: a
        new request replaces ``cycle``, so the same one, answered (or none), means none came.
        A request under way (one pipelined behind the last) is left to finish."""
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        waiting_after = self.cycle

        def expire() -> None:
            idle = self.cycle is None or self.cycle.response_complete
            if self.cycle is waiting_after and idle and not self.transport.is_closing():
                self.transport.abort()

        self._head_deadline = self.loop.call_later(self.timeout_keep_alive, expire)

    def shutdown(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self.transport.abort()
        else:
            super().shutdown()


def allow_open_files(connections: int = MAX_CONNECTIONS) -> None:
    """Raise this process's soft limit on open files (toward the hard one) so that it can
    hold ``connections`` and what they relay beside its own files; never lowers it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections * FILES_PER_CONNECTION + OWN_FILES
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(hard, want), hard)
    )


class _HandshakeBoundedLoop(asyncio.SelectorEventLoop):
    """asyncio's loop, whose TLS servers give a handshake ``HANDSHAKE_S`` (a socket that
    never sends its ClientHello is counted by no cap above, so its time is kept short)."""

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", HANDSHAKE_S)
        return await super().create_server(*args, **kwargs)


def handshake_bounded_loop() -> asyncio.AbstractEventLoop:
    """The event loop of an outside-facing listener."""
    return _HandshakeBoundedLoop()


#: :func:`handshake_bounded_loop` as uvicorn's ``loop`` setting names it (an import string).
BOUNDED_LOOP = f"{__name__}:{handshake_bounded_loop.__name__}"
