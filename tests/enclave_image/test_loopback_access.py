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
  and root (PID 1's health checks) reach the engine's port; the engine's own uid does not. The
  proxy's uid reaches nothing else on loopback, nor on an address of the guest's own (a
  listener on every address, reached through a veth's address), where root does.
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
#: An address of the guest's own, on an interface that is not loopback (the guest's eth0, in
#: miniature): connections to it go over ``lo`` all the same, and are ruled as loopback.
OWN_ADDRESS, WIDE_PORT = "10.78.0.5", 9998
LO = "127.0.0.1"
SYSTEM_PYTHON = "/usr/bin/python3"
REFUSED = "Connection refused"  # ECONNREFUSED's text: a reset came back (a drop times out)

LISTEN = r"""
import json, select, socket, sys
socks = {socket.create_server((host, port)): tag for tag, port, host in json.loads(sys.argv[1])}
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
    return [probe_connect(host, port, uid, python=layout.python) for uid, port, host in plan]
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
    _sh("ip", "link", "add", "aff0", "type", "veth", "peer", "name", "aff1", ns=guest_ns)
    _sh("ip", "addr", "add", f"{OWN_ADDRESS}/32", "dev", "aff0", ns=guest_ns)
    _sh("ip", "link", "set", "aff0", "up", ns=guest_ns)
    _sh("ip", "link", "set", "aff1", "up", ns=guest_ns)
    ports = [["proxy", PROXY_PORT, LO], ["engine", ENGINE_PORT, LO], ["api", API_PORT, LO]]
    listen = [
        sys.executable,
        "-c",
        LISTEN,
        json.dumps(
            [
                *ports,
                ["other", OTHER_PORT, LO],
                ["wide", WIDE_PORT, "0.0.0.0"],
                ["own-engine", ENGINE_PORT, OWN_ADDRESS],  # the engine's port, another address
            ]
        ),
    ]
    listener = _start(guest_ns, listen, '"ready"')
    before = [
        [HARNESS, ENGINE_PORT, LO],
        [PROXY, OTHER_PORT, LO],
        [PROXY, WIDE_PORT, OWN_ADDRESS],
        [PROXY, ENGINE_PORT, OWN_ADDRESS],
    ]
    after = [
        [HARNESS, PROXY_PORT, LO],
        [HARNESS, ENGINE_PORT, LO],
        [HARNESS, API_PORT, LO],
        [HARNESS, OTHER_PORT, LO],
        [ENGINE, ENGINE_PORT, LO],
        [ENGINE, PROXY_PORT, LO],
        [PROXY, ENGINE_PORT, LO],
        # The proxy reaches the engine alone: a store URL whose name the host's DNS points at
        # loopback, or at the guest itself, would hand the database password to whatever
        # other uid listens there.
        [PROXY, OTHER_PORT, LO],
        [PROXY, API_PORT, LO],
        [PROXY, WIDE_PORT, OWN_ADDRESS],
        [PROXY, ENGINE_PORT, OWN_ADDRESS],
        [0, ENGINE_PORT, LO],
        [0, API_PORT, LO],
        [0, WIDE_PORT, OWN_ADDRESS],
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
    # Without the rules these connect: the rules are what stop them.
    assert out["before"] == [None, None, None, None]
    assert out["said"][0] == (
        f"netrules: loaded table inet affidavit_harness: only uid {PROXY} may leave the machine"
    )
    assert out["said"][1] == (
        f"netrules: loopback: uid 0 reaches every port, uid {PROXY} only {ENGINE_PORT} (the"
        f" engine), any other uid only {PROXY_PORT} (the rest refused)"
    )
    verdicts = dict(
        zip((f"{uid}->{host}:{port}" for uid, port, host in after), out["after"], strict=True)
    )
    assert verdicts == {
        f"{HARNESS}->{LO}:{PROXY_PORT}": None,  # connected
        f"{HARNESS}->{LO}:{ENGINE_PORT}": REFUSED,
        f"{HARNESS}->{LO}:{API_PORT}": REFUSED,
        f"{HARNESS}->{LO}:{OTHER_PORT}": REFUSED,
        f"{ENGINE}->{LO}:{ENGINE_PORT}": REFUSED,
        f"{ENGINE}->{LO}:{PROXY_PORT}": None,
        f"{PROXY}->{LO}:{ENGINE_PORT}": None,
        f"{PROXY}->{LO}:{OTHER_PORT}": REFUSED,
        f"{PROXY}->{LO}:{API_PORT}": REFUSED,
        f"{PROXY}->{OWN_ADDRESS}:{WIDE_PORT}": REFUSED,
        f"{PROXY}->{OWN_ADDRESS}:{ENGINE_PORT}": REFUSED,
        f"0->{LO}:{ENGINE_PORT}": None,
        f"0->{LO}:{API_PORT}": None,
        f"0->{OWN_ADDRESS}:{WIDE_PORT}": None,
    }, verdicts
    # The listeners saw the probes before the rules, then exactly the connections let through.
    assert accepted == [
        "engine",
        "other",
        "wide",
        "own-engine",
        "proxy",
        "proxy",
        "engine",
        "engine",
        "api",
        "wide",
    ]


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
