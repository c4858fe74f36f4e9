"""A proxy in a process of its own, for ``test_reply_limits``'s memory check (not a test module).

``python -m tests.egress_proxy._limited_proxy STORE USER_PUBLIC UPSTREAM_URL OVERRIDES_JSON``
runs the proxy over ``STORE`` (a fresh appliance key) with the config overrides given, opens
one session sealed to ``USER_PUBLIC``, prints ``{"base_url", "token", "session_id"}`` as one
JSON line, and serves until its standard input closes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from egress_proxy.server import ProxyServer
from record.log import Log
from record.seal import KeyPair, RecipientKey
from tests.egress_proxy.loopback import ENV, proxy_config


def main(argv: list[str]) -> int:
    store, user, upstream, overrides = Path(argv[1]), argv[2], argv[3], json.loads(argv[4])
    config = proxy_config(upstream, **overrides)
    with (
        Log.open(store, appliance_key=KeyPair.generate()) as log,
        ProxyServer(config, log, env=ENV) as proxy,
    ):
        opened = proxy.registry.open_session([RecipientKey.from_text(user)])
        print(json.dumps(opened._asdict()), flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
