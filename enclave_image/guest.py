"""What the reduced image runs: ``python3 -m enclave_image.guest`` (from ``/init``).

It reads the verity model disk end to end (a block that fails its hash reads as EIO), starts
the real :class:`~egress_proxy.server.ProxyServer` on loopback over a record store in
``/run``, asks the running proxy for its own ``/metrics`` and prints one line::

    affidavit-proxy healthy http://127.0.0.1:8700 metrics=<n> model=<sha256>|none

The line exists only when the proxy answered ``/metrics`` with 200: ``n`` counts the metric
families (``# TYPE`` lines) it served.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from egress_proxy.config import parse_config
from egress_proxy.server import ProxyServer
from enclave_image.lock import file_sha256
from record.log import Log
from record.seal import KeyPair

__all__ = ["main"]

CONFIG = {
    "listen": {"host": "127.0.0.1", "port": 8700},
    "providers": {"engine": {"api": "openai", "base_url": "http://127.0.0.1:8000"}},
}


def _model(spec_path: Path) -> str:
    """The sha256 of the verity device, checked against what the build recorded."""
    if not spec_path.is_file():
        return "none"
    spec = json.loads(spec_path.read_text())
    got = file_sha256(Path(spec["device"]))  # a block that fails verity reads as EIO
    if got != spec["sha256"]:
        raise RuntimeError(f"model disk {spec['device']}: sha256 {got}, built {spec['sha256']}")
    return got


def main(
    state: Path = Path("/run/affidavit"), spec: Path = Path("/etc/affidavit/model.json")
) -> int:
    model = _model(spec)
    print(f"guest: model disk verified: {model}", flush=True)
    state.mkdir(parents=True, exist_ok=True)
    # The appliance key is made fresh in the guest (the full profile keeps it on the
    # encrypted state disk); the proxy's crash recovery needs it to open the log.
    log = Log.open(state / "records.sqlite", appliance_key=KeyPair.generate())
    with ProxyServer(parse_config(CONFIG), log) as proxy:
        with urllib.request.urlopen(proxy.url + "/metrics", timeout=30) as reply:
            body = reply.read().decode()
            status = reply.status
        families = [line for line in body.splitlines() if line.startswith("# TYPE ")]
        if status != 200 or not families:
            print(f"affidavit-proxy unhealthy {proxy.url} status={status}", flush=True)
            return 1
        print(f"affidavit-proxy healthy {proxy.url} metrics={len(families)} model={model}",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
