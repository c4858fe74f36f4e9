"""A stand-in for AMD's Key Distribution Service on 127.0.0.1 (a test double: no KDS is
reachable here). A real HTTP server that serves ``documents[path]`` (path with its query)
and 404 otherwise, and keeps each path it was asked for, in order."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    """Joins its request threads when closed, so a slow answer cannot outlive its test and
    print into the next one; a client that hung up (its own timeout) is not an error here."""

    daemon_threads = False
    block_on_close = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class StandInKds:
    def __init__(self) -> None:
        self.documents: dict[str, bytes] = {}
        self.asked: list[str] = []
        kds = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                kds.asked.append(self.path)
                body = kds.documents.get(self.path)
                self.send_response(200 if body is not None else 404)
                pem = body is not None and body.startswith(b"-----BEGIN")
                kind = "application/x-pem-file" if pem else "application/octet-stream"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@contextmanager
def stand_in_kds() -> Iterator[StandInKds]:
    """The stand-in, serving until the block ends."""
    kds = StandInKds()
    thread = threading.Thread(target=kds.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield kds
    finally:
        kds.server.shutdown()
        kds.server.server_close()
        thread.join()
