"""The attested channel's relay: every HTTP request to an upstream, and its reply back, both
bodies streamed unchanged.

Two ends of the channel relay: the appliance's front (``harness.front``) hands every request
but ``/attestation`` to the egress proxy on loopback, and ``affidavit connect --listen``
hands a local tool's requests to the appliance through a client pinned to its attested key.
Server-sent events pass as they arrive (nothing is buffered), so the proxy's annotation,
which says a reply is committed, reaches the client with the reply. A connection the
upstream's TLS key fails (the pinned client's handshake) is answered 502 ``not_attested``,
any other that cannot be made 502 ``upstream_unreachable``: never retried elsewhere.

Raw ASGI rather than a framework app: one route, and both bodies must stream.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import httpx2

__all__ = ["HOP_BY_HOP", "Relay", "error_reply", "forwardable"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Headers that belong to one connection, never forwarded (RFC 9110 7.6.1), and ``host``,
#: which the upstream request sets from the attested URL.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)


def forwardable(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    return [
        (name, value)
        for name, value in headers
        if name.lower().decode("latin-1") not in HOP_BY_HOP and name.lower() not in named
    ]


def _not_attested_cause(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate failure under a transport error, if that is what it was."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


async def error_reply(send: Send, status: int, code: str, message: str) -> None:
    """The channel's error answer: ``{"error": {"code", "message"}}``, the proxy's shape."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _within(path: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``path`` (decoded) is under one of ``prefixes``, with no ``.`` or ``..``
    segment that would take it elsewhere once a client or server resolves it."""
    segments = path.split("/")
    return path.startswith(prefixes) and "." not in segments and ".." not in segments


class Relay:
    """The ASGI app: every request to ``upstream`` through ``client`` (made at start-up when
    none is given: a plain one, no proxy from the environment, no read timeout, since a
    model may think for minutes between two chunks, or at the first request behind another
    app), every response streamed back.
    ``only``: the path prefixes relayed (the appliance's front: the sessions' routes, ``/s/``,
    never the proxy's ``/metrics``, which would tell outsiders about every session); any other
    path is 404 ``not_found``. ``say`` hears each failure (``connect --listen`` prints it).
    ``forwarded``: the upstream is a web app behind this one (the appliance's panel): it gets
    the client's ``Host`` and ``X-Forwarded-Proto``/``-For`` (any the client sent dropped),
    so the links, cookies and same-origin checks it makes are the ones the browser sees."""

    def __init__(
        self,
        upstream: str,
        client: httpx2.AsyncClient | None = None,
        *,
        only: tuple[str, ...] | None = None,
        say: Callable[[str], None] | None = None,
        forwarded: bool = False,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.client = client
        self.only = only
        self.say = say or (lambda _: None)
        self.forwarded = forwarded

    def _client(self) -> httpx2.AsyncClient:
        """The client, made on the server's loop at start-up, or at the first request when
        the relay runs behind another app that keeps the lifespan to itself."""
        if self.client is None:
            self.client = httpx2.AsyncClient(
                timeout=httpx2.Timeout(None, connect=30.0), trust_env=False
            )
        return self.client

    def _headers(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        headers = forwardable(list(scope["headers"]))
        if not self.forwarded:
            return headers
        mine = {b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"forwarded"}
        kept = [(name, value) for name, value in headers if name.lower() not in mine]
        host = [(name, value) for name, value in scope["headers"] if name.lower() == b"host"]
        client = scope.get("client")
        return [
            *host[:1],
            *kept,
            (b"x-forwarded-proto", scope.get("scheme", "http").encode()),
            *([(b"x-forwarded-for", client[0].encode())] if client else []),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self._client()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if self.client is not None:
                        await self.client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        client = self._client()
        if self.only is not None and not _within(scope["path"], self.only):
            await error_reply(send, 404, "not_found", f"{scope['path']} is not served here")
            return
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        target = self.upstream + path.decode("latin-1") + ("?" + query.decode() if query else "")

        async def body() -> AsyncIterator[bytes]:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return
                yield message.get("body", b"")
                if not message.get("more_body", False):
                    return

        request = client.build_request(
            scope["method"],
            target,
            headers=self._headers(scope),
            content=body(),
            timeout=httpx2.Timeout(None, connect=30.0),
        )
        try:
            response = await client.send(request, stream=True)
        except httpx2.TransportError as exc:
            refused = _not_attested_cause(exc)
            if refused is not None:
                self.say(f"not attested: {self.upstream}: {refused}")
                await error_reply(
                    send,
                    502,
                    "not_attested",
                    f"the upstream presented a TLS key other than the attested one ({refused})",
                )
            else:
                await error_reply(send, 502, "upstream_unreachable", f"{self.upstream}: {exc}")
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": forwardable(list(response.headers.raw)),
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except httpx2.TransportError as exc:  # cut mid-reply: end the connection, not the body
            self.say(f"forward: {self.upstream}: {exc}")
        except OSError:  # the local client went away
            pass
        finally:
            await response.aclose()
