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
from typing import Any

from harness.panel.source import Source

__all__ = ["RunningPanel", "bind", "running_panel", "serve_forever"]

LOOPBACK = "127.0.0.1"


@dataclass
class RunningPanel:
    url: str  # with the token: what a browser opens first
    base: str  # without it
    token: str
    app: Any


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections wait in the backlog until the server takes them
    return sock


def _base(host: str, sock: socket.socket) -> str:
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _server(app: Any) -> Any:
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))


def serve_forever(
    source: Source, host: str = LOOPBACK, port: int = 0, *, ready: Callable[[RunningPanel], None]
) -> None:
    """Serve until SIGINT or SIGTERM; ``ready`` gets the URL once the panel answers."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with running_panel(source, host, port) as panel:
        ready(panel)
        stop.wait()


@contextmanager
def running_panel(
    source: Source, host: str = LOOPBACK, port: int = 0, *, token: str | None = None
) -> Iterator[RunningPanel]:
    """The panel served in a thread until the block ends."""
    from harness.panel.app import create_app

    app = create_app(source, token=token)
    sock = bind(host, port)
    base = _base(host, sock)
    server = _server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the panel did not start")
            time.sleep(0.01)
        yield RunningPanel(f"{base}/?token={app.state.token}", base, app.state.token, app)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
