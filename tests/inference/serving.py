"""Serve an ASGI app on a free loopback port in a thread, for the engine's tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


def serve_in_thread(app: Any, *, timeout_s: float = 60) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port); yield its URL; stop it afterwards."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout_s)
