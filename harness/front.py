"""The appliance's external address: TLS with the attested key, and ``/attestation``.

The egress proxy serves its data plane on loopback, where only this machine reaches it. A
user outside talks to the front instead: it terminates TLS with the appliance's own key
(``attestation.tls_identity``, made where the appliance runs and never leaving it), answers
``GET /attestation?nonce=HEX`` with fresh evidence bound to that nonce, to the record's keys
and to this TLS key (``attestation.channel``), and relays every other request, byte for byte
and streamed both ways, to the proxy on loopback. So a client that checked the evidence and
pinned the key (``attestation.channel_client``, ``affidavit connect``) knows that the
process it sends its prompt to holds the key the evidence vouches for.

The panel is served at the same address under ``/panel`` (its own pages use ``/s/…`` too,
which here is the data plane's), so one pinned key covers both; ``affidavit panel --tls``
serves it alone with the same key and the same ``/attestation``.

Raw ASGI rather than a framework app: one route of its own in front of the relay
(``attestation.relay``), which streams both bodies unchanged.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs

import anyio
import uvicorn

from attestation.channel import ChannelIdentity, EvidenceSource, NoEvidence, answer, parse_nonce
from attestation.relay import error_reply
from attestation.tls_identity import TlsIdentity
from harness.panel.prefix import PANEL_ROOT, under
from harness.state import Home, HomeMissing
from harness.tls_h11 import BOUNDED_LOOP, TlsH11Protocol, allow_open_files

__all__ = ["PANEL_ROOT", "SESSION_ROUTES", "Attested", "Front", "NoTee", "home_identity"]

#: What the front relays to the proxy: the sessions' routes (``/s/{session}/…``: the model
#: APIs, MCP, fetch), never the proxy's other routes (``/metrics`` counts every session's calls).
SESSION_ROUTES = ("/s/",)
#: How long a client may stay silent on a connection: past clients' own 5 s, so a client
#: lets go of an idle connection first (as ``egress_proxy.server`` explains).
KEEP_ALIVE_S = 30

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class NoTee:
    """The evidence source of a machine with no TEE: ``/attestation`` answers 503
    ``no_tee``, and a client that checks (``affidavit connect``) refuses to go on."""

    def collect(self, report_data: bytes, nonce: bytes) -> list[Any]:
        raise NoEvidence("this appliance runs in no TEE: it has no evidence to give")


def home_identity(home: Home, tls: TlsIdentity) -> ChannelIdentity:
    """What a home's appliance binds: its log key (the store's, or for a store several
    appliances share, the home's own signing key), its sealing key and ``tls``.

    Raises:
        HomeMissing: no appliance has run in this home yet (no keys, no store).
    """
    from record.backends import open_store
    from record.checkpoint import Signer
    from record.cli import SIGNING_KEY_FILE, home_store
    from record.errors import RecordError
    from record.log import LOG_KEY_NAME
    from record.seal import KeyPair

    sealing_file = home.root / "appliance.key"
    if not sealing_file.is_file():
        raise HomeMissing(f"{sealing_file} does not exist: run `affidavit up` here first")
    try:
        store = open_store(home_store(home.root), readonly=True)
    except (RecordError, OSError) as exc:
        raise HomeMissing(f"the home's store: {exc}") from None
    try:
        log_key = store.get_meta("log_key")
    finally:
        store.close()
    own = home.root / SIGNING_KEY_FILE
    if log_key is None and own.is_file():
        log_key = Signer.load_or_create(own, LOG_KEY_NAME).vkey()
    if log_key is None:
        raise HomeMissing(f"the store of {home.root} has no log key yet: run `affidavit up`")
    sealing = KeyPair.read(sealing_file).recipient.public.public_bytes_raw()
    return ChannelIdentity(log_key, sealing, tls.spki_sha256)


class Attested:
    """An ASGI app behind the attested key: ``/attestation`` answered here, ``/panel/…``
    handed to ``panel`` (the panel under that root: in this process, or a relay to the
    panel's own process), every other request to ``inner`` (the relay to the proxy, or the
    panel itself when it is served alone). The lifespan is ``inner``'s."""

    def __init__(
        self,
        inner: Any,
        identity: ChannelIdentity,
        source: EvidenceSource,
        release: str | None = None,
        *,
        panel: Any = None,
    ) -> None:
        self.inner = inner
        self.identity = identity
        self.source = source
        self.release = release
        self.panel = panel
        # one report at a time: the TEE's interface serialises them anyway, and a flood of
        # /attestation requests then waits here instead of filling the thread pool
        self._one_at_a_time: anyio.CapacityLimiter | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/attestation":
            await self._attestation(scope, send)
        elif (
            self.panel is not None
            and scope["type"] in ("http", "websocket")
            and under(scope["path"], PANEL_ROOT)
        ):
            await self.panel(scope, receive, send)
        else:
            await self.inner(scope, receive, send)

    async def _attestation(self, scope: Scope, send: Send) -> None:
        if scope["method"] != "GET":
            await error_reply(send, 405, "method_not_allowed", "GET /attestation?nonce=HEX")
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        try:
            nonce = parse_nonce((query.get("nonce") or [""])[0])
        except ValueError as exc:
            await error_reply(send, 400, "bad_nonce", str(exc))
            return
        if self._one_at_a_time is None:  # made on the server's loop
            self._one_at_a_time = anyio.CapacityLimiter(1)
        try:  # the TEE's interfaces block: off the loop
            reply = await anyio.to_thread.run_sync(
                answer,
                nonce,
                self.identity,
                self.source,
                self.release,
                limiter=self._one_at_a_time,
            )
        except NoEvidence as exc:
            await error_reply(send, 503, "no_tee", str(exc))
            return
        except Exception as exc:  # the TEE's driver failed: said, never a 500 with a trace
            message = f"the TEE gave no evidence: {type(exc).__name__}: {exc}"
            await error_reply(send, 503, "evidence_failed", message)
            return
        body = reply.model_dump_json().encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class Front:
    """A TLS listener with the attested key serving ``app``, run in a thread while the
    appliance (or the panel) runs."""

    def __init__(
        self,
        host: str,
        port: int,
        tls: TlsIdentity,
        app: Attested,
        *,
        keep_alive_s: int = KEEP_ALIVE_S,
    ) -> None:
        """``keep_alive_s``: how long a client may stay silent on a connection, before its
        first request as after a reply (``harness.tls_h11``)."""
        if app.identity.tls_spki_sha256 != tls.spki_sha256:
            raise ValueError("the identity binds another TLS key than the one served")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.tls = tls
        self.port: int = self._sock.getsockname()[1]
        self.url = f"https://{'[' + host + ']' if ':' in host else host}:{self.port}"
        self.app = app
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                log_level="warning",
                access_log=False,
                lifespan="on",
                timeout_keep_alive=keep_alive_s,
                ssl_keyfile=str(tls.key_file),
                ssl_certfile=str(tls.cert_file),
                http=TlsH11Protocol,  # a hostile peer holds no socket for long (its notes)
                loop=BOUNDED_LOOP,  # a TLS handshake bounded in time
            )
        )
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 10.0) -> Front:
        allow_open_files()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the external TLS listener did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving; requests under way may take ``timeout`` seconds to finish."""
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout)
        self._sock.close()

    @property
    def running(self) -> bool:
        """Whether the listener's thread still runs (after ``stop``: it outlived ``timeout``)."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Front:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
