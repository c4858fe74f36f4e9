"""Inside the appliance, only the proxy talks to the engine: by uid on loopback, and by token.

In the guest, engine, proxy and harness are services under their own uids on one loopback
(``enclave_image.appliance``). Each test makes a network namespace of its own (nothing touches
the host's), loads the guest's ruleset into it with the guest's own loader
(``network_rules``, ``GuestLayout``'s uids and ports: proxy 1001 on 8700, engine 1002 on 8000,
harness 1003 with its API on 8600), and connects as those uids (children switched with
``subprocess``'s ``user=``, running the system ``/usr/bin/python3``, which any uid may execute).

- Listeners on the guest's ports: before the rules the harness's uid reaches the engine's port
  (what stops it after is the rules); after, it reaches the proxy's port and is refused,
  at once (a TCP reset: "Connection refused", not a timeout), everywhere else; the proxy's uid
  and root (PID 1's health checks) reach the engine's port; the engine's own uid does not.
- The real engine (``affidavit engine serve --token-file``, the tiny model) on the engine's
  port: the proxy's uid without the token, or with another, gets 401, with it 200; the
  harness's uid, token or not, never gets a connection; the guest's health check
  (``answers``) passes with the token and fails without.

Needs root, ``ip`` (iproute2), ``nft`` (nftables) and ``/usr/bin/python3``; skips, saying why,
without them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enclave_image.appliance import GuestLayout

REPO = Path(__file__).resolve().parents[2]
LAYOUT = GuestLayout()
PROXY, ENGINE, HARNESS = LAYOUT.proxy_uid, LAYOUT.engine_uid, LAYOUT.harness_uid
PROXY_PORT, ENGINE_PORT, API_PORT = LAYOUT.proxy_port, LAYOUT.engine_port, LAYOUT.harness_port
OTHER_PORT = 9999
SYSTEM_PYTHON = "/usr/bin/python3"
REFUSED = "Connection refused"  # ECONNREFUSED's text: a reset came back (a drop times out)

LISTEN = r"""
import json, select, socket, sys
socks = {socket.create_server(("127.0.0.1", port)): tag for tag, port in json.loads(sys.argv[1])}
print(json.dumps("ready"), flush=True)
while True:
    for s in select.select(list(socks), [], [])[0]:
        s.accept()[0].close()
        print(json.dumps(socks[s]), flush=True)
"""

# Run as root inside the namespace: probe as each uid, load the guest's rules, probe again.
DRIVE = r"""
import json, sys
from enclave_image.appliance import GuestLayout, network_rules, probe_connect
layout = GuestLayout(nft="nft", python=sys.argv[1])
before, after = json.loads(sys.argv[2]), json.loads(sys.argv[3])
def probe(plan):
    return [probe_connect("127.0.0.1", port, uid, python=layout.python) for uid, port in plan]
out = {"before": probe(before)}
said = []
network_rules(layout, None, said.append)
out["after"], out["said"] = probe(after), said
print(json.dumps(out))
"""

# As a uid: GET a URL (with a Bearer token, if one is given); print the status, or the error.
GET = r"""
import sys, urllib.error, urllib.request
url, token = sys.argv[1], sys.argv[2]
headers = {"Authorization": "Bearer " + token} if token else {}
try:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
except urllib.error.URLError as e:
    print(getattr(e.reason, "strerror", None) or type(e.reason).__name__)
"""

# Root inside the namespace: load the rules, then GET as each uid and run the health check.
CALL = r"""
import json, subprocess, sys
from enclave_image.appliance import GuestLayout, answers, network_rules
layout = GuestLayout(nft="nft", python=sys.argv[1])
get, url, token, plan = sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
network_rules(layout, None, lambda _: None)
def as_uid(uid, sent):
    done = subprocess.run([layout.python, "-c", get, url, sent], user=uid, group=uid,
                          extra_groups=[], capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or done.stderr.strip()
out = {"calls": [as_uid(uid, sent) for uid, sent in plan],
       "health": [answers(url, token=token), answers(url), answers(url, token=token[::-1])]}
print(json.dumps(out))
"""


def _skip(reason: str) -> None:
    print(f"test_loopback_access: skipped: {reason}", file=sys.stderr)
    pytest.skip(reason)


def _sh(*argv: str, ns: str | None = None, timeout: float = 30) -> str:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    done = subprocess.run(
        [*prefix, *argv], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}: {done.stderr.strip()}")
    return done.stdout


@pytest.fixture
def guest_ns() -> Iterator[str]:
    """A network namespace with only loopback, up: the guest's loopback, in miniature."""
    if sys.platform != "linux" or os.geteuid() != 0:
        _skip("needs root on Linux (network namespaces, nft, switching uids)")
    if shutil.which("ip") is None or shutil.which("nft") is None:
        _skip("needs `ip` and `nft` (Debian packages iproute2 and nftables)")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        _skip(f"the probes run as uids {PROXY}/{ENGINE}/{HARNESS}: needs {SYSTEM_PYTHON}")
    ns = f"aff-lo-{secrets.token_hex(3)}"
    try:
        _sh("ip", "netns", "add", ns)
    except RuntimeError as exc:
        _skip(f"`ip netns add` is not permitted here: {exc}")
    try:
        _sh("ip", "link", "set", "lo", "up", ns=ns)
        try:
            _sh("nft", "list", "ruleset", ns=ns)
        except RuntimeError as exc:
            _skip(f"`nft` is not permitted in a namespace here: {exc}")
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _start(ns: str, argv: list[str], ready: str) -> subprocess.Popen[str]:
    """A process in ``ns``, once it printed a line starting with ``ready``."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        if line.startswith(ready):
            return proc
        seen.append(line)
    proc.wait()
    raise AssertionError(f"{argv[:4]} did not start: {''.join(seen)[-2000:]}")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    return out


def test_on_loopback_the_harness_reaches_only_the_proxy(guest_ns: str) -> None:
    ports = [["proxy", PROXY_PORT], ["engine", ENGINE_PORT], ["api", API_PORT]]
    listen = [sys.executable, "-c", LISTEN, json.dumps([*ports, ["other", OTHER_PORT]])]
    listener = _start(guest_ns, listen, '"ready"')
    before = [[HARNESS, ENGINE_PORT]]
    after = [
        [HARNESS, PROXY_PORT],
        [HARNESS, ENGINE_PORT],
        [HARNESS, API_PORT],
        [HARNESS, OTHER_PORT],
        [ENGINE, ENGINE_PORT],
        [ENGINE, PROXY_PORT],
        [PROXY, ENGINE_PORT],
        [PROXY, OTHER_PORT],
        [0, ENGINE_PORT],
        [0, API_PORT],
    ]
    try:
        out: dict[str, Any] = json.loads(
            _sh(
                sys.executable,
                "-c",
                DRIVE,
                SYSTEM_PYTHON,
                json.dumps(before),
                json.dumps(after),
                ns=guest_ns,
                timeout=120,
            )
        )
    finally:
        accepted = [json.loads(line) for line in _stop(listener).splitlines()]
    # Without the rules the harness's uid reaches the engine: the rules are what stop it.
    assert out["before"] == [None]
    assert out["said"][0] == (
        f"netrules: loaded table inet affidavit_harness: only uid {PROXY} may leave the machine"
    )
    verdicts = dict(zip((f"{uid}->{port}" for uid, port in after), out["after"], strict=True))
    assert verdicts == {
        f"{HARNESS}->{PROXY_PORT}": None,  # connected
        f"{HARNESS}->{ENGINE_PORT}": REFUSED,
        f"{HARNESS}->{API_PORT}": REFUSED,
        f"{HARNESS}->{OTHER_PORT}": REFUSED,
        f"{ENGINE}->{ENGINE_PORT}": REFUSED,
        f"{ENGINE}->{PROXY_PORT}": None,
        f"{PROXY}->{ENGINE_PORT}": None,
        f"{PROXY}->{OTHER_PORT}": None,
        f"0->{ENGINE_PORT}": None,
        f"0->{API_PORT}": None,
    }, verdicts
    # The listeners saw the probe before the rules, then exactly the connections let through.
    assert accepted == ["engine", "proxy", "proxy", "engine", "other", "engine", "api"]


def test_the_engine_answers_only_the_proxy_uid_with_its_token(
    guest_ns: str, tmp_path: Path
) -> None:
    pytest.importorskip("torch", reason="the engine needs the `engine` extra")
    from inference.engine_token import new_token, write_token_file
    from inference.make_model import make_model

    model = make_model(tmp_path / "model").path
    token = new_token()
    token_file = write_token_file(tmp_path / "engine.token", token)
    engine = _start(
        guest_ns,
        [sys.executable, "-m", "affidavit", "engine", "serve", "--model", str(model),
         "--model-name", "tiny", "--port", str(ENGINE_PORT), "--token-file", str(token_file),
         "--no-batch-invariance", "--log-level", "warning"],
        "affidavit engine serving",
    )  # fmt: skip
    url = f"http://127.0.0.1:{ENGINE_PORT}/v1/models"
    plan = [
        [PROXY, ""],
        [PROXY, "not-" + token],
        [PROXY, token],
        [HARNESS, token],
        [HARNESS, ""],
        [ENGINE, token],
    ]
    try:
        out: dict[str, Any] = json.loads(
            _sh(
                sys.executable,
                "-c",
                CALL,
                SYSTEM_PYTHON,
                GET,
                url,
                token,
                json.dumps(plan),
                ns=guest_ns,
                timeout=240,
            )
        )
    finally:
        _stop(engine)
    assert out["calls"] == ["401", "401", "200", REFUSED, REFUSED, REFUSED], out
    # PID 1's health check: root passes the rules, and is answered only with the token.
    assert out["health"] == [True, False, False]
