"""A proxy to kill under load, for ``test_load_faults`` (not a test module).

``python -m tests.long._load_proxy STORE KEY_PEM UPSTREAM_URL PORT SESSIONS_DB [USER N]``
runs the proxy over ``STORE`` (a SQLite file or a ``postgresql://`` URL; the appliance key read
from ``KEY_PEM``, the log's signing key kept beside it) on ``PORT`` with its session book at
``SESSIONS_DB``. Given ``USER`` (a public key) and ``N``, it first opens
``N`` sessions sealed to it and prints them as one JSON line; every start then prints
``{"ready": <sessions restored>}`` and serves until killed, or until standard input closes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from egress_proxy.server import ProxyServer
from record.backends import location
from record.log import Log
from record.seal import KeyPair, RecipientKey
from tests.egress_proxy.loopback import ENV, proxy_config


def main(argv: list[str]) -> int:
    store, key, upstream, port, book = (
        location(argv[1]),
        Path(argv[2]),
        argv[3],
        int(argv[4]),
        argv[5],
    )
    signing_key = key.with_name("record.signing-key")
    with Log.open(store, signing_key=signing_key, appliance_key=KeyPair.read(key)) as log:
        proxy = ProxyServer(proxy_config(upstream), log, env=ENV, port=port, sessions=book)
        with proxy:
            if len(argv) > 7:
                user = RecipientKey.from_text(argv[6])
                opened = [
                    proxy.registry.open_session([user])._asdict() for _ in range(int(argv[7]))
                ]
                print(json.dumps(opened), flush=True)
            print(json.dumps({"ready": len(proxy.restored.sessions)}), flush=True)
            sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
