"""The engine's bearer token: the engine answers only whoever holds it (the proxy).

Inside the appliance the engine listens on loopback, where the network rules
(``egress_proxy.netrules``) let only the proxy's uid connect; the token is the second lock, so
a process that got past the rules still is not answered, and nothing reaches the engine
without going through the proxy, which records it.

The token travels as ``Authorization: Bearer <token>`` (what the proxy sends an OpenAI-style
provider) or ``x-api-key: <token>`` (an Anthropic-style one: the engine serves the Messages API
too), and is compared in constant time. It is kept in a file only its owner may read
(``read_token_file`` refuses one that group or others may read). This module never imports
torch: ``affidavit engine serve`` reads the file before loading a model.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import stat
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

__all__ = ["EngineTokenAuth", "TokenFileError", "new_token", "read_token_file", "write_token_file"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Shorter tokens are refused: a token is meant to be ``new_token()``'s 43 characters.
MIN_TOKEN_CHARS = 16


class TokenFileError(ValueError):
    """The token file is unusable: others may read it, or it holds no token."""


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path``, mode 0600 (made so before a byte is written)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode("ascii") + b"\n")
    finally:
        os.close(fd)
    return path


def read_token_file(path: Path) -> str:
    """The token in ``path``. ``FileNotFoundError`` if it is missing; ``TokenFileError`` if
    group or others may read it, or it holds no usable token."""
    mode = os.stat(path).st_mode
    if mode & 0o077:
        raise TokenFileError(
            f"{path}: mode {stat.S_IMODE(mode):04o}: group or others may read the engine's "
            "token (chmod 600)"
        )
    token = path.read_text(encoding="ascii", errors="replace").strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() or not c.isprintable() for c in token):
        raise TokenFileError(
            f"{path}: not a token (one line of at least {MIN_TOKEN_CHARS} printable characters)"
        )
    return token


def _presented(scope: Scope) -> str | None:
    """The token a request carries: the Bearer credential, else ``x-api-key``."""
    headers: dict[bytes, bytes] = dict(scope.get("headers") or ())
    auth = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, credential = auth.partition(" ")
    if scheme.lower() == "bearer" and credential.strip():
        return credential.strip()
    key = headers.get(b"x-api-key", b"").decode("latin-1").strip()
    return key or None


class EngineTokenAuth:
    """ASGI middleware: every HTTP request must carry the token, or it gets 401 and never
    reaches the routes (no request body is read)."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(f"the engine's token must be at least {MIN_TOKEN_CHARS} characters")
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        given = _presented(scope)
        if given is not None and hmac.compare_digest(given.encode(), self._token):
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # a websocket: the engine serves none
            await send({"type": "websocket.close", "code": 1008})
            return
        why = "this is not the engine's token" if given else "the engine needs its token"
        body = json.dumps(
            {
                "error": {
                    "message": f"{why} (Authorization: Bearer, or x-api-key)",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="affidavit-engine"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
