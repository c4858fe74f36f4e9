"""A small runner: the data plane on a loopback socket, in a thread, for tests and embedding.

It binds the socket first (port 0 picks a free one), so the session registry knows the
proxy's URL before the first session opens; recovers calls a previous run left without a
reply (``recover_unknown``) and, with a session book (``sessions``), restores the sessions a
previous run opened (``SessionRegistry.restore``) before it serves; and on ``stop`` lets
uvicorn's shutdown drain replies still being read, so they are committed. Bound to the port
the previous run had, a restarted proxy serves every restored session at its old
``base_url`` with its old token. With ``control_socket`` it also serves the
gRPC control plane (``control.ControlPlane``) on that Unix socket while it runs, its
``FetchCollateral`` run on the data plane's loop. The CLI
(``affidavit proxy serve``) will wrap this later.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import uvicorn

from egress_proxy.app import create_app
from egress_proxy.clock import Clock
from egress_proxy.collateral import Collateral, CollateralFetcher
from egress_proxy.config import ProxyConfig
from egress_proxy.control import ControlPlane
from egress_proxy.errors import UpstreamUnavailable
from egress_proxy.metrics import ArrivalStamped
from egress_proxy.recovery import Recovered, recover_unknown
from egress_proxy.session_book import SessionBook
from egress_proxy.sessions import Restored, Session, SessionRegistry
from egress_proxy.transports.base import Transport
from record.log import Log

#: How long an idle client connection is kept open. Longer than clients keep theirs
#: (httpx, httpx2 and so the official SDKs: 5 s), so a client always lets go first: were it
#: uvicorn's default (5 s, the same), a client could send a request on a connection at the
#: very moment the server closes it, and the call would die with no answer (a ReadError the
#: proxy's bench once saw at 32 clients).
KEEP_ALIVE_S = 30


class ProxyServer:
    def __init__(
        self,
        config: ProxyConfig,
        log: Log,
        *,
        transport: Transport | None = None,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        clock: Clock | None = None,
        control_socket: Path | str | None = None,
        sessions: Path | str | None = None,
    ) -> None:
        host = config.listen.host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit this: without it Nagle's algorithm holds small replies
        # back ~40 ms on loopback, dwarfing the two durable commits that are our real floor.
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._sock.bind((host, config.listen.port if port is None else port))
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"
        self.log = log
        self.book = SessionBook(sessions) if sessions is not None else None
        self.registry = SessionRegistry(log, self.url, self.book)
        self.app = create_app(
            config, log, registry=self.registry, transport=transport, env=env, clock=clock
        )
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                log_level="warning",
                access_log=False,
                lifespan="on",
                timeout_keep_alive=KEEP_ALIVE_S,
                http=ArrivalStamped,  # h11, as uvicorn's default here, plus the arrival stamp
            )
        )
        self._thread: threading.Thread | None = None
        self.recovered: list[Recovered] = []
        self.restored = Restored([], {})
        self.control = None
        if control_socket:
            collateral = self._collateral if self.app.state.collateral is not None else None
            self.control = ControlPlane(
                self.registry, control_socket, collateral=collateral, tee_status=config.tee_status
            )

    def _collateral(self, session: Session, path: str) -> Collateral:
        """A control-plane thread's collateral fetch, run on the data plane's loop (where the
        transport's connections live) as a task of its own, so it is recorded to its end and
        drained at shutdown like any call, even if the caller goes away."""
        state = self.app.state
        fetcher: CollateralFetcher = state.collateral
        loop: asyncio.AbstractEventLoop | None = state.loop
        if loop is None or not self._server.started:
            raise UpstreamUnavailable("collateral: the proxy is not serving yet")

        async def run() -> Collateral:
            task: asyncio.Task[Collateral] = state.tasks.spawn(fetcher.fetch(session, path))
            return await asyncio.shield(task)

        timeout = fetcher.config.connect_timeout_s + fetcher.config.timeout_s + 30.0
        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout)

    def start(self, timeout: float = 10.0) -> ProxyServer:
        self.recovered = recover_unknown(self.log)
        self.restored = self.registry.restore()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the proxy did not start")
            time.sleep(0.01)
        if self.control is not None:
            self.control.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        if self.control is not None:
            self.control.stop()
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout)
            self._thread = None
        self._sock.close()
        if self.book is not None:
            self.book.close()

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
