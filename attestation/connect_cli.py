"""``affidavit connect URL``: attest an appliance's TLS endpoint, and (``--listen``) forward
to it through the pinned key.

It asks ``GET /attestation`` with a fresh nonce over one connection and checks the reply
(``attestation.channel_client.attest``): every piece of evidence with its verifier, the
policy and the signed published measurements, then ``channel.nonce``, ``channel.tls_key``
and ``channel.binding``. It prints one line per check, the verdict and the pinned key
(``pinned TLS key sha256:HEX``), or ``--json`` one object. Exit codes: 0 attested, 1 not
(the first failing check named), 2 usage (not an https URL, a policy or published file that
cannot be read), 3 an input file is missing or the endpoint does not answer.

``--listen PORT``: once attested, serve plain HTTP on 127.0.0.1:PORT (loopback only) and
forward every request (method, path, query, headers but the hop-by-hop ones, body streamed)
to the attested URL through a client pinned to the attested key, streaming each response
back as it comes (server-sent events included), until SIGINT or SIGTERM (exit 0). Tools that
cannot be given an ``http_client`` point their base URL at it. A connection upstream that
presents another key fails its TLS handshake, before a byte of the request is written, and
the request is answered 502 ``{"error": {"code": "not_attested", …}}``: never retried
elsewhere, never sent without the pin.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from attestation.channel_client import Attested

__all__ = ["connect", "register"]

EXIT_ACCEPT, EXIT_REJECT, EXIT_USAGE, EXIT_MISSING = 0, 1, 2, 3

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _print(found: Attested, as_json: bool) -> None:
    refusal = found.refusal()
    spki = "sha256:" + found.spki_sha256.hex()
    if as_json:
        doc = {
            "url": found.url,
            "ok": found.ok,
            "verdict": "accept" if found.ok else "reject",
            "failed": None if found.ok else refusal,
            "spki_sha256": found.spki_sha256.hex(),
            "pinned": spki if found.ok else None,
            "release": found.release,
            "claimed_release": found.reply.release,
            "nonce": found.reply.nonce,
            "checks": [
                {**c.json(), "evidence": i, "kind": v.kind}
                for i, v in enumerate(found.verdicts)
                for c in v.checks
            ],
            "evidence": [v.json() for v in found.verdicts],
        }
        print(json.dumps(doc, indent=2, default=str))
        return
    for index, verdict in enumerate(found.verdicts):
        if len(found.verdicts) > 1:
            print(f"evidence {index}: {verdict.kind}")
        for check in verdict.checks:
            print(check.line())
    if found.ok:
        print(f"verdict: attested ({found.url}, release {found.release})")
        print(f"pinned TLS key {spki}")
    else:
        print(f"verdict: REJECT ({refusal})")


def _serve(found: Attested, port: int) -> None:
    """``--listen``: the forwarder on 127.0.0.1:``port`` until SIGINT or SIGTERM."""
    import socket

    import uvicorn

    from attestation.channel_client import pinned_async_client

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        print(f"affidavit: error: 127.0.0.1:{port}: {exc.strerror or exc}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None
    bound = sock.getsockname()[1]
    from attestation.relay import Relay

    def say(line: str) -> None:
        print(f"affidavit: {line}", file=sys.stderr, flush=True)

    app = Relay(found.url, pinned_async_client(found), say=say)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    )
    # uvicorn re-raises the signal that stopped it once it has shut down; a handler that
    # does nothing makes that a clean exit 0
    quiet = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    print(
        f"forwarding http://127.0.0.1:{bound} -> {found.url} "
        f"(pinned sha256:{found.spki_sha256.hex()})",
        flush=True,
    )
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in quiet.items():
            signal.signal(sig, handler)
        sock.close()


def connect(
    url: Annotated[str, typer.Argument(help="the appliance's https URL")],
    published: Annotated[
        Path, typer.Option(help="the signed published measurements (its .sig beside it)")
    ],
    policy: Annotated[Path | None, typer.Option(help="a policy file (JSON)")] = None,
    release_key: Annotated[
        Path | None, typer.Option(help="the pinned release key (default: measurements/release.pub)")
    ] = None,
    trusted_root: Annotated[
        Path | None,
        typer.Option(
            "--trusted-root",
            help="SEV-SNP: trust the ARK(s) in this PEM INSTEAD of AMD's pinned roots "
            "(a test chain; the verdict says so)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    listen: Annotated[
        int | None,
        typer.Option(
            "--listen",
            metavar="PORT",
            min=0,
            max=65535,
            help="once attested, forward http://127.0.0.1:PORT to URL through the pinned key "
            "until SIGINT/SIGTERM",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=0.1, help="seconds to wait for the attestation reply")
    ] = 10.0,
) -> None:
    """Attest an appliance's TLS endpoint: fresh evidence, its binding to this connection's
    key; then pin that key (and, with --listen, forward to it)."""
    from attestation.channel import ReplyError
    from attestation.channel_client import Unreachable, attest, check_url
    from attestation.evidence import Missing, read_trusted_roots
    from attestation.policy import PolicyError
    from attestation.published import PublishedError

    try:
        check_url(url)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="URL") from None
    try:
        try:
            trusted = read_trusted_roots(trusted_root) if trusted_root is not None else None
        except Missing:
            raise
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--trusted-root") from None
        found = attest(
            url, published, policy, release_key=release_key, trusted=trusted, timeout=timeout
        )
    except Missing as exc:
        print(f"affidavit: missing: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_MISSING) from None
    except Unreachable as exc:
        print(f"affidavit: missing: no answer: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_MISSING) from None
    except (PolicyError, PublishedError) as exc:
        print(f"affidavit: error: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None
    except ReplyError as exc:
        if as_json:
            print(json.dumps({"url": url, "ok": False, "verdict": "reject", "failed": str(exc)}))
        print(f"affidavit: not attested: the reply: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_REJECT) from None
    _print(found, as_json)
    if not found.ok:
        print(f"affidavit: not attested: {found.refusal()}", file=sys.stderr)
        raise typer.Exit(EXIT_REJECT)
    if listen is not None:
        _serve(found, listen)
    raise typer.Exit(EXIT_ACCEPT)


def register(app: typer.Typer) -> None:
    """Add ``connect`` to ``app``."""
    app.command("connect")(connect)
