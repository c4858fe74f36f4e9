"""``affidavit panel``: serve the reproducibility panel until interrupted.

Registered on the ``affidavit`` app by ``harness.commands``; nothing heavy is imported until
the command runs. Exit codes: 0 stopped, 2 usage error (``--bundle`` without ``--key``), 3
something it needs is missing (no store, no bundle, no key file, an extra not installed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["register"]


def _attested(home: Any) -> Any:
    """``--tls``: the home's TLS key (made the first time) and what the evidence binds.

    Raises:
        HomeMissing: no appliance ran here yet.
        typer.BadParameter: the kept TLS key is unusable (2).
    """
    from attestation.tls_identity import TlsIdentityError, tls_identity
    from harness.front import home_identity

    try:
        key = tls_identity(home.root)
    except TlsIdentityError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tls") from None
    return home_identity(home, key), key


def register(app: typer.Typer) -> None:
    """Add ``affidavit panel`` to ``app``."""

    @app.command("panel")
    def panel(
        home: Annotated[
            Path | None,
            typer.Option(
                "--home", help="the state folder (default: $AFFIDAVIT_HOME or ./.affidavit)"
            ),
        ] = None,
        bundle: Annotated[
            Path | None,
            typer.Option(help="serve an exported bundle instead, read-only (needs --key)"),
        ] = None,
        key: Annotated[
            Path | None,
            typer.Option(
                "--key",
                help="a recipient private key (with --bundle: required; else added to the "
                "appliance's and your key)",
            ),
        ] = None,
        port: Annotated[int, typer.Option(help="the port (default: a free one)")] = 0,
        host: Annotated[
            str, typer.Option(help="the address to bind (default: loopback only)")
        ] = "127.0.0.1",
        as_json: Annotated[
            bool, typer.Option("--json", help="print one JSON document with the URL")
        ] = False,
        redact: Annotated[
            str | None,
            typer.Option(
                metavar="RULES",
                help="show every page redacted: FIELD, KIND:FIELD or re:PATTERN, comma-separated",
            ),
        ] = None,
        tls: Annotated[
            bool,
            typer.Option(
                "--tls",
                help="serve over TLS with the home's attested key (tls.key, as `up --external`), "
                "answering /attestation; check it with `affidavit connect`",
            ),
        ] = False,
        root_path: Annotated[
            str,
            typer.Option(
                "--root-path",
                metavar="PATH",
                help="serve the panel under PATH (the appliance's front relays /panel here)",
            ),
        ] = "",
    ) -> None:
        """Serve the reproducibility panel (sessions, turns, replay, verify, export)."""
        from harness.state import Home, HomeMissing
        from record.redact import RedactionRules
        from record.seal import KeyPair

        if bundle is not None and key is None:
            raise typer.BadParameter("--bundle needs --key FILE (your key)", param_hint="--key")
        if root_path:
            from harness.panel.prefix import check_root

            try:
                check_root(root_path)
            except ValueError as exc:
                raise typer.BadParameter(
                    f"{exc}, such as /panel", param_hint="--root-path"
                ) from None
        if bundle is not None and tls:
            raise typer.BadParameter(
                "a bundle is read on your own machine: no appliance to attest", param_hint="--tls"
            )
        try:
            rules = RedactionRules.parse(redact or "")
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--redact") from None
        try:
            from harness.panel.server import RunningPanel, serve_forever
            from harness.panel.source import ApplianceSource, BundleSource, Source
        except ImportError as exc:  # pragma: no cover - an extra not installed
            print(f"affidavit: missing: {exc}", file=sys.stderr)
            raise typer.Exit(3) from None
        try:
            opener: KeyPair | None = None
            if key is not None:
                if not key.is_file():
                    raise HomeMissing(f"key file {key} does not exist")
                try:
                    opener = KeyPair.read(key)
                except ValueError as exc:
                    raise typer.BadParameter(str(exc), param_hint="--key") from None
            source: Source
            attested: Any = None
            if bundle is not None:
                assert opener is not None
                if not bundle.is_dir():
                    raise HomeMissing(f"bundle directory {bundle} does not exist")
                source = BundleSource(bundle, opener)
            else:
                source = ApplianceSource(Home.at(home), opener)
                source.store_path()  # the record must be there
                if tls:
                    attested = _attested(Home.at(home))
        except HomeMissing as exc:
            print(f"affidavit: missing: {exc}", file=sys.stderr)
            raise typer.Exit(3) from None
        source.redaction = rules or None

        def ready(up: RunningPanel) -> None:
            if as_json:
                doc = {"url": up.url, "base": up.base, "mode": source.mode}
                print(json.dumps(doc), flush=True)
            else:
                print(f"affidavit panel: {up.url}", flush=True)
                print(f"serving {source.describe_safe()}; Ctrl-C stops it.", flush=True)
            if host not in ("127.0.0.1", "::1", "localhost"):
                print(
                    f"affidavit panel: warning: bound to {host}, not loopback only",
                    file=sys.stderr,
                    flush=True,
                )

        serve_forever(source, host, port, ready=ready, tls=attested, root=root_path)
