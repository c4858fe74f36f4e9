"""A proxy to kill, for ``test_capture``'s crash check (not a test module).

``python _crash_proxy.py STORE APPLIANCE_KEY USER_PUBLIC UPSTREAM_URL`` runs the proxy over
``STORE`` with the appliance key from its PEM file, opens one session sealed to
``USER_PUBLIC``, prints ``{"base_url", "token", "session_id"}`` as one JSON line, and serves
until it is killed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from egress_proxy.server import ProxyServer
from record.log import Log
from record.seal import KeyPair, RecipientKey
from tests.egress_proxy.loopback import ENV, proxy_config


def main(argv: list[str]) -> int:
    store, key_path, user, upstream = Path(argv[1]), Path(argv[2]), argv[3], argv[4]
    log = Log.open(store, appliance_key=KeyPair.read(key_path))
    proxy = ProxyServer(proxy_config(upstream), log, env=ENV).start()
    opened = proxy.registry.open_session([RecipientKey.from_text(user)])
    print(json.dumps(opened._asdict()), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
