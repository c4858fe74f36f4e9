"""A TEE double for the attested channel, and the servers its tests talk to.

``SyntheticSnp`` is a test double of a SEV-SNP guest's TEE (named so: nothing here is AMD's
or a real TEE): it answers ``collect`` with a synthetic version-5 report (``snp_double``)
carrying the ``report_data`` it is asked for and a fixed measurement, signed by a throwaway
ARK → ASK → VCEK chain that verifiers accept only when told to trust its root
(``--trusted-root``). Everything else is real: the TLS key (``attestation.tls_identity``),
the reply (``attestation.channel.answer``), uvicorn serving TLS on loopback.

``Appliance`` is a tiny appliance: ``GET /attestation`` answers with that double, and
``POST /v1/chat/completions`` and ``POST /v1/messages`` record every request they receive
(so a test can say that not a byte of a prompt arrived) and answer a minimal OpenAI or
Anthropic reply (a streamed SSE one for ``"stream": true`` chat completions). ``RelayMitm``
is a stand-in man in the middle with its own key that relays ``/attestation`` to the genuine
appliance and records anything else; ``RawTlsRecorder`` a TLS server with its own key that
records every byte it receives after its handshake.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from attestation.channel import ChannelIdentity, Piece, answer, parse_nonce
from attestation.published import FORMAT, sign_published
from attestation.tls_identity import TlsIdentity, tls_identity
from tests.attestation.snp_double import TURIN_TCB, FakeAmd, fake_amd, v5_report

MEASUREMENT = bytes(range(0x30, 0x60))  # the double's launch measurement (48 bytes)
OTHER_MEASUREMENT = bytes(range(0x90, 0xC0))
CHIP = bytes(range(0xA0, 0xA8))
LOG_KEY = "affidavit-test+2b0f8a1c+AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA="
SEALING = bytes(range(0x40, 0x60))


class SyntheticSnp:
    """A TEE double (SEV-SNP): synthetic v5 reports over a throwaway chain, one fixed
    measurement; ``chain`` another double's chain (one trusted root for both); ``report``
    options (``policy``, ``tcbs``…) change the reports it signs."""

    def __init__(
        self, measurement: bytes = MEASUREMENT, chain: FakeAmd | None = None, **report: Any
    ) -> None:
        self.chain: FakeAmd = chain or fake_amd("Turin", TURIN_TCB, CHIP)
        self.measurement = measurement
        self.report = report
        self.asked: list[bytes] = []  # the report_data of every collect

    @property
    def certs_pem(self) -> str:
        vek = x509.load_der_x509_certificate(self.chain.vek).public_bytes(Encoding.PEM)
        return (vek + self.chain.chain).decode("ascii")

    def collect(self, report_data: bytes, nonce: bytes) -> list[Piece]:
        self.asked.append(report_data)
        report = v5_report(
            self.chain.vek_key,
            measurement=self.measurement,
            report_data=report_data,
            **self.report,
        )
        evidence = base64.b64encode(report).decode("ascii")
        return [Piece(kind="snp", evidence=evidence, certs=self.certs_pem)]


@dataclass(frozen=True)
class Inputs:
    """What a client is given: the signed published file, its release key, the test root."""

    published: Path
    release_key: Path
    trusted_root: Path
    policy: Path


def write_published(
    folder: Path,
    measurements: list[bytes],
    name: str = "0.0.0-test",
    gpu: dict[str, list[str]] | None = None,
) -> Path:
    """A published file listing ``measurements`` (and ``gpu``: the GPU state it promises),
    signed by a throwaway release key kept as ``release.pub`` beside it (overwritten by each
    call in the folder)."""
    key = Ed25519PrivateKey.generate()
    path = folder / f"{name}.json"
    doc = {
        "format": FORMAT,
        "version": name,
        "image_digest": "sha256:" + "a" * 64,
        "model_weights_digest": "sha256:" + "b" * 64,
        "kernel_cmdline": "console=ttyS0",
        "guest_policy": "0x30000",
        "snp": [{"vcpus": 4, "vcpu_type": "EPYC-v4", "measurement": m.hex()} for m in measurements],
        **({"gpu": gpu} if gpu is not None else {}),
    }
    path.write_text(json.dumps(doc))
    path.with_name(path.name + ".sig").write_text(sign_published(path.read_bytes(), key))
    (folder / "release.pub").write_text(
        base64.b64encode(key.public_key().public_bytes_raw()).decode("ascii")
    )
    return path


def write_policy(folder: Path, name: str = "policy.json", **members: Any) -> Path:
    """A policy file; with no members, the defaults (which the double's reports pass)."""
    path = folder / name
    path.write_text(json.dumps(members))
    return path


def inputs(folder: Path, tee: SyntheticSnp, measurements: list[bytes] | None = None) -> Inputs:
    """Published (listing the double's measurement unless told otherwise), release key,
    trusted root and an empty policy, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    published = write_published(folder, measurements or [tee.measurement])
    root = folder / "ark.pem"
    root.write_bytes(tee.chain.ark)
    return Inputs(published, folder / "release.pub", root, write_policy(folder))


# --- servers -------------------------------------------------------------------------------


class TlsServer:
    """uvicorn serving ``app`` over TLS with ``identity`` on 127.0.0.1 (port 0: a free one,
    or the one given), in a thread; the socket is bound first."""

    def __init__(self, app: Any, identity: TlsIdentity, port: int = 0) -> None:
        self.identity = identity
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self.port: int = self._sock.getsockname()[1]
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="off",
                ssl_keyfile=str(identity.key_file),
                ssl_certfile=str(identity.cert_file),
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> TlsServer:
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop; connections a client left open (TLS waits for its close_notify) are not
        waited for past a second."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(1)
            self._server.force_exit = True
            self._thread.join(10)
        self._sock.close()


@contextmanager
def serving(app: Any, identity: TlsIdentity, port: int = 0) -> Iterator[TlsServer]:
    server = TlsServer(app, identity, port).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Seen:
    """One request a server received: method, path, body, query, headers."""

    method: str
    path: str
    body: bytes
    query: str = ""
    headers: dict[str, str] = field(default_factory=dict)


def _chat(model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-double",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello from the appliance"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }


def _chunk(model: str, text: str, finish: str | None = None) -> bytes:
    delta = {"content": text} if text else {}
    doc = {
        "id": "chatcmpl-double",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def _message(model: str) -> dict[str, Any]:
    return {
        "id": "msg_double",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "hello from the appliance"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }


@dataclass
class Appliance:
    """The tiny appliance: its TLS key, its TEE double and what it received."""

    folder: Path
    tee: SyntheticSnp = field(default_factory=SyntheticSnp)
    seen: list[Seen] = field(default_factory=list)
    #: When set, ``/attestation`` answers this body (status 200) whatever the nonce.
    canned: bytes | Callable[[Request], Response] | None = None
    #: Streaming chat completions wait for this after their first chunk (5 s at most), and
    #: ``released`` says whether it was set in time: a client that saw the first chunk sets it.
    release: threading.Event = field(default_factory=threading.Event)
    released: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.identity = tls_identity(self.folder)
        self.channel = ChannelIdentity(LOG_KEY, SEALING, self.identity.spki_sha256)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/attestation", self._attestation, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
            ]
        )

    async def _attestation(self, request: Request) -> Response:
        if callable(self.canned):
            return self.canned(request)
        if self.canned is not None:
            return Response(self.canned, media_type="application/json")
        try:
            nonce = parse_nonce(request.query_params.get("nonce", ""))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        reply = answer(nonce, self.channel, self.tee, release="0.0.0-test")
        return Response(reply.model_dump_json(), media_type="application/json")

    async def _record(self, request: Request) -> dict[str, Any]:
        body = await request.body()
        seen = Seen(request.method, request.url.path, body, request.url.query)
        seen.headers.update(request.headers)
        self.seen.append(seen)
        doc = json.loads(body)
        assert isinstance(doc, dict)
        return doc

    async def _chat(self, request: Request) -> Response:
        doc = await self._record(request)
        model = str(doc.get("model", "m"))
        if not doc.get("stream"):
            return JSONResponse(_chat(model))

        async def chunks() -> AsyncIterator[bytes]:
            yield _chunk(model, "first")
            self.released.append(await asyncio.to_thread(self.release.wait, 5.0))
            for word in (" second", " third"):
                yield _chunk(model, word)
            yield _chunk(model, "", "stop")
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def _messages(self, request: Request) -> Response:
        doc = await self._record(request)
        return JSONResponse(_message(str(doc.get("model", "m"))))

    @contextmanager
    def serve(self, port: int = 0) -> Iterator[TlsServer]:
        with serving(self.app(), self.identity, port) as server:
            yield server


@dataclass
class RelayMitm:
    """A man in the middle with its own TLS key: relays ``/attestation`` (the genuine
    evidence, unchanged; ``rewrite``: naming its own TLS key in the reply instead) to
    ``upstream`` and records any other request it receives."""

    folder: Path
    upstream: str
    rewrite: bool = False
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.identity = tls_identity(self.folder)

    async def _relay(self, request: Request) -> Response:
        import httpx

        with httpx.Client(verify=False, trust_env=False) as http:  # the MITM checks nothing
            got = await asyncio.to_thread(
                http.get, self.upstream + "/attestation", params=dict(request.query_params)
            )
        body = got.content
        if self.rewrite:
            doc = json.loads(body)
            doc["binding"]["tls_spki_sha256"] = self.identity.spki_sha256.hex()
            body = json.dumps(doc).encode()
        return Response(body, status_code=got.status_code, media_type="application/json")

    async def _other(self, request: Request) -> Response:
        self.seen.append(Seen(request.method, request.url.path, await request.body()))
        return JSONResponse({"error": "a man in the middle"}, status_code=418)

    @contextmanager
    def serve(self) -> Iterator[TlsServer]:
        app = Starlette(
            routes=[
                Route("/attestation", self._relay, methods=["GET"]),
                Route("/{path:path}", self._other, methods=["GET", "POST", "PUT", "DELETE"]),
            ]
        )
        with serving(app, self.identity) as server:
            yield server


class RawTlsRecorder:
    """A TLS server with its own key on 127.0.0.1 (port 0: a free one, or the one given): for
    each connection, whether its handshake completed and every byte received after it."""

    def __init__(self, folder: Path, port: int = 0) -> None:
        self.identity = tls_identity(folder)
        self.handshakes: list[bool] = []
        self.received: list[bytes] = []
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(self.identity.cert_file, self.identity.key_file)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen()
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            raw.settimeout(5)
            try:
                tls = self._context.wrap_socket(raw, server_side=True)
            except (OSError, ssl.SSLError):
                self.handshakes.append(False)
                raw.close()
                continue
            self.handshakes.append(True)
            data = b""
            try:
                while chunk := tls.recv(65536):
                    data += chunk
            except (OSError, ssl.SSLError):
                pass
            self.received.append(data)
            tls.close()

    def wait(self, connections: int, timeout: float = 5.0) -> None:
        """Until ``connections`` connections were handled (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while len(self.handshakes) < connections and time.monotonic() < deadline:
            time.sleep(0.02)

    @contextmanager
    def serve(self) -> Iterator[RawTlsRecorder]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(5)
            self._sock.close()
