"""The panel served under a path: ``/panel`` on the appliance's external address.

The appliance's front answers the data plane at ``/s/{session}/…``, a path the panel's own
pages also use. So behind the front the panel lives under ``/panel``: this wrapper hands it
each request under that prefix with the prefix as the ASGI ``root_path`` (the path itself
kept whole, as the ASGI spec and Starlette's routing expect), and the app
(``create_app(root=…)``) starts every link and redirect with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["PANEL_ROOT", "Prefixed", "check_root", "under"]

#: Where the panel is served on the appliance's external address.
PANEL_ROOT = "/panel"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def check_root(root: str) -> str:
    """``root`` if it is a path to serve under (``/panel``); ``ValueError`` naming it if not."""
    if not root.startswith("/") or root.endswith("/"):
        raise ValueError(f"the root path {root!r} must start with / and not end with /")
    return root


def under(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` itself or below it."""
    return path == root or path.startswith(root + "/")


class Prefixed:
    """``app`` under ``root``: ``root`` alone is redirected to ``root/`` (keeping the query:
    the sign-in URL carries the token there), a path outside it is 404."""

    def __init__(self, app: Any, root: str = PANEL_ROOT) -> None:
        self.app = app
        self.root = check_root(root)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan: the app's own
            return
        path: str = scope["path"]
        root = scope.get("root_path", "") + self.root  # under a server's own root_path too
        if scope["type"] == "http" and path == root:
            query = scope.get("query_string", b"")
            where = (root + "/").encode() + (b"?" + query if query else b"")
            await _reply(send, 307, b"", [(b"location", where)])
            return
        if not path.startswith(root + "/"):
            await _reply(send, 404, b"not found", [(b"content-type", b"text/plain")])
            return
        await self.app({**scope, "root_path": root}, receive, send)


async def _reply(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
