"""The egress proxy alone, as the appliance's proxy service: ``python -m enclave_image.appliance_proxy``.

``harness.up.running_appliance`` starts engine and proxy in one process; in the guest each is
its own service under its own uid, so this runs only the proxy (data plane, control socket,
fetch endpoint) over the record on the state disk, with the engine as its one provider. The
keys are not made here: the appliance made them at first boot (``appliance.key`` and
``record.db.signing-key`` in ``--record``), and a missing key is an error, never a new key.

The engine answers only its token (``--engine-token-file``: the proxy's copy, which the
appliance writes at each boot); the proxy sends it as the provider's key (``api_key_file``),
on both mounted APIs.

With ``--tee-status FILE`` the control plane refuses pinned sessions until PID 1's check of
its own evidence (``attestation.self_check``), written to that file, says the appliance is
attested or that unattested operation is allowed (``egress_proxy.tee_status``).

With ``--store-file FILE`` the record is the PostgreSQL database that file's connection
string names (the operator's config disk, ``enclave_image.appliance_config``); PID 1 writes
it 0600 for this uid, so the password never appears on a command line. The keys stay on the
state disk.

The control socket is made group-writable (0660): the harness's uid, in the record folder's
group, must reach it; no one else can (the folder is 0750).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

__all__ = ["main", "proxy_config"]

ROUTE = "/v1/chat/completions"


def proxy_config(
    port: int,
    engine_url: str,
    token_file: Path | None = None,
    kds_url: str | None = None,
    tee_status: Path | None = None,
) -> dict[str, object]:
    """The proxy's config: loopback data plane, the engine behind it (its token read from
    ``token_file``), fetch on, boot evidence's collateral from ``kds_url`` (default: AMD's),
    pinned sessions refused unless ``tee_status`` (PID 1's self-check) allows them."""
    model: dict[str, object] = {"api": "openai", "base_url": engine_url, "engine_extensions": True}
    if token_file is not None:
        model["api_key_file"] = str(token_file)
    config: dict[str, object] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "providers": {"model": model},
        "mounts": {ROUTE: "model"},
        "fetch": {"enabled": True, "max_response_bytes": 1 << 20},
    }
    if kds_url is not None:
        config["collateral"] = {"base_url": kds_url}
    if tee_status is not None:
        config["tee_status"] = str(tee_status)
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m enclave_image.appliance_proxy")
    parser.add_argument("--record", type=Path, required=True, help="folder of the record and keys")
    parser.add_argument("--control", type=Path, required=True, help="the control socket")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--engine", default="http://127.0.0.1:8000", help="the provider's URL")
    parser.add_argument(
        "--engine-token-file", type=Path, help="the engine's token (a file of mode 0600)"
    )
    parser.add_argument(
        "--kds", help="AMD's KDS, or a mirror: where a missing SNP chain is fetched from"
    )
    parser.add_argument(
        "--tee-status",
        type=Path,
        help="the appliance's self-check (written by PID 1): pinned sessions are refused"
        " until it says attested, or unattested operation allowed",
    )
    parser.add_argument(
        "--store-file",
        type=Path,
        help="a file holding the record store's postgresql:// connection string (default:"
        " record.db in --record)",
    )
    args = parser.parse_args(argv)

    from egress_proxy.config import api_keys, parse_config
    from egress_proxy.errors import ConfigError
    from egress_proxy.server import ProxyServer
    from record.log import Log
    from record.seal import KeyPair

    key_file = args.record / "appliance.key"
    signing = args.record / "record.db.signing-key"
    for path in (key_file, signing):
        if not path.is_file():
            print(f"proxy: missing: {path} (the appliance makes it at first boot)", flush=True)
            return 3
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    store: Path | str = args.record / "record.db"
    if args.store_file is not None:
        try:
            store = args.store_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"proxy: cannot read the store file {args.store_file}: {exc}", flush=True)
            return 3
    args.control.unlink(missing_ok=True)  # a socket left by a killed run
    config = parse_config(
        proxy_config(args.port, args.engine, args.engine_token_file, args.kds, args.tee_status)
    )
    try:
        api_keys(config)  # the engine's token: readable, and only by this uid
    except ConfigError as exc:
        print(f"proxy: {exc}", flush=True)
        return exc.exit_code
    from record.backends import store_name
    from record.errors import RecordError

    try:
        log = Log.open(store, signing_key=signing, appliance_key=KeyPair.read(key_file))
    except RecordError as exc:  # a database that does not answer: exit 3, said in one line
        print(f"proxy: {exc}", flush=True)
        return exc.exit_code
    with (
        log,
        ProxyServer(config, log, control_socket=args.control) as proxy,
    ):
        os.chmod(args.control, 0o660)
        print(
            f"proxy: serving {proxy.url}, control {args.control}, record {store_name(store)}",
            flush=True,
        )
        stop.wait()
    print("proxy: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
