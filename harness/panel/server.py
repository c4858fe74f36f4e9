"""Serving the panel: on a loopback socket, until interrupted (the command) or until a
block ends (tests)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.panel.source import Source

if TYPE_CHECKING:
    from attestation.channel import ChannelIdentity
    from attestation.tls_identity import TlsIdentity

    #: ``--tls``: what the evidence binds, and the key it binds
    Attestable = tuple[ChannelIdentity, TlsIdentity]

__all__ = ["RunningPanel", "bind", "running_panel", "serve_forever"]

LOOPBACK = "127.0.0.1"


@dataclass
class RunningPanel:
    url: str  # with the token: what a browser opens first
    base: str  # the server, without the token or the root path
    token: str
    app: Any
    root: str = ""  # the path the panel is served under ("": the server's root)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections wait in the backlog until the server takes them
    return sock


def _base(host: str, sock: socket.socket, scheme: str = "http") -> str:
    port = sock.getsockname()[1]
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _server(app: Any, tls: TlsIdentity | None = None) -> Any:
    import uvicorn

    from harness.tls_h11 import BOUNDED_LOOP, TlsH11Protocol, allow_open_files

    if tls is not None:
        allow_open_files()
    return uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            ssl_keyfile=str(tls.key_file) if tls is not None else None,
            ssl_certfile=str(tls.cert_file) if tls is not None else None,
            http=TlsH11Protocol if tls is not None else "auto",
            loop=BOUNDED_LOOP if tls is not None else "auto",
        )
    )


def serve_forever(
    source: Source,
    host: str = LOOPBACK,
    port: int = 0,
    *,
    ready: Callable[[RunningPanel], None],
    tls: Attestable | None = None,
    root: str = "",
) -> None:
    """Serve until SIGINT or SIGTERM; ``ready`` gets the URL once the panel answers."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with running_panel(source, host, port, tls=tls, root=root) as panel:
        ready(panel)
        stop.wait()


@contextmanager
def running_panel(
    source: Source,
    host: str = LOOPBACK,
    port: int = 0,
    *,
    token: str | None = None,
    tls: Attestable | None = None,
    root: str = "",
) -> Iterator[RunningPanel]:
    """The panel served in a thread until the block ends; with ``tls``, over TLS with the
    appliance's attested key, answering ``/attestation`` as the data plane's front does.
    ``root``: serve it under that path (``/panel``: behind the appliance's front, which
    relays that path here)."""
    from harness.panel.app import create_app
    from harness.panel.prefix import Prefixed

    app = create_app(source, token=token, root=root)
    sock = bind(host, port)
    served: Any = Prefixed(app, root) if root else app
    if tls is not None:
        from harness.front import Attested, NoTee

        served = Attested(app, tls[0], NoTee())
    base = _base(host, sock, "https" if tls is not None else "http")
    server = _server(served, tls[1] if tls is not None else None)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the panel did not start")
            time.sleep(0.01)
        url = f"{base}{root}/?token={app.state.token}"
        yield RunningPanel(url, base, app.state.token, app, root)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
