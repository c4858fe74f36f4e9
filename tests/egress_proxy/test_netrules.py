"""The harness's only way out (``egress_proxy.netrules``).

The rendering tests need nothing. The namespace test needs root, ``ip netns`` and ``nft``
(Debian ``iproute2`` and ``nftables``) and skips, saying why, without them. It builds two
namespaces of its own joined by one veth, private 10.77.0.0/24 addresses existing only between
them (nothing touches the host's namespace or leaves the machine):

- ``aff-h-<rand>`` (the harness, 10.77.0.2): the rendered rules, and the harness's API listener;
- ``aff-w-<rand>`` (the world, 10.77.0.1 and 10.77.0.3): an "internet" TCP listener on
  10.77.0.1 and on fd77::1 (IPv6), a UDP "DNS server" on 10.77.0.1:53, the proxy stand-in on
  10.77.0.3:3128 and another listener on the proxy's address at a port that is not the proxy's.

Before the rules, the harness reaches the internet listener (IPv4 and IPv6) (so what the rules stop, routing
would not have); after, a child in the harness's namespace reaches the proxy and nothing else,
and the world reaches the harness's API port.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest

from egress_proxy.netrules import APPLIANCE, TABLE, HarnessRules, appliance_ruleset, render

HARNESS_IP, WORLD_IP, PROXY_IP = "10.77.0.2", "10.77.0.1", "10.77.0.3"
HARNESS_IP6, WORLD_IP6 = "fd77::2", "fd77::1"  # unique-local, between the two namespaces only
PROXY_PORT, OTHER_PORT, WORLD_PORT, API_PORT, DNS_PORT = 3128, 8080, 8080, 8600, 53
RULES = HarnessRules(
    proxy_address=IPv4Address(PROXY_IP), proxy_ports=(PROXY_PORT,), api_port=API_PORT
)

# One helper run in a namespace. "serve": TCP listeners that answer their tag and log each
# accept, UDP sockets that log each datagram (one JSON line per event, "ready" first). "probe":
# try each target, print one JSON list of outcomes.
AGENT = r"""
import json, select, socket, sys
mode, spec = sys.argv[1], json.loads(sys.argv[2])
def say(obj):
    print(json.dumps(obj), flush=True)
if mode == "serve":
    socks = {}
    for proto, host, port, tag in spec:
        kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, kind)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        if proto == "tcp":
            s.listen(8)
        socks[s] = (proto, tag)
    say("ready")
    while True:
        for s in select.select(list(socks), [], [])[0]:
            proto, tag = socks[s]
            if proto == "tcp":
                conn, peer = s.accept()
                conn.sendall(tag.encode())
                conn.close()
            else:
                _, peer = s.recvfrom(2048)
            say([proto, tag, peer[0]])
else:
    out = []
    for proto, host, port in spec:
        if proto == "tcp":
            try:
                with socket.create_connection((host, port), timeout=1.5) as s:
                    s.settimeout(1.5)
                    out.append("ok:" + s.recv(64).decode())
            except OSError as e:
                out.append("fail:" + type(e).__name__)
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(1.0)
            query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"
            try:
                s.sendto(query, (host, port))
                s.recvfrom(2048)
                out.append("ok:reply")
            except OSError as e:
                out.append("fail:" + type(e).__name__)
            finally:
                s.close()
    say(out)
"""


def test_render_names_only_the_proxy_and_the_api() -> None:
    text = render(
        HarnessRules(
            proxy_address=IPv4Address("10.9.0.1"),
            proxy_ports=(8701, 8700, 8700),
            api_port=9000,
            api_sources=(IPv4Network("10.9.0.0/30"),),
            proxy_uid=1234,
        )
    )
    assert "define proxy_address = 10.9.0.1" in text
    assert "define proxy_ports = { 8700, 8701 }" in text
    assert "define api_port = 9000" in text
    assert "define api_sources = { 10.9.0.0/30 }" in text
    assert "meta skuid 1234 accept" in text
    assert text.count("policy drop;") == 3  # input, output, forward
    assert f"delete table inet {TABLE}" in text
    assert "ip6" not in text and "udp" not in text  # IPv6 and UDP: dropped by the policies
    assert "define api_sources = { 0.0.0.0/0 }" in render(RULES)
    assert "skuid" not in render(RULES)


def test_loopback_is_ruled_by_uid_where_the_proxy_shares_the_namespace() -> None:
    shared = render(
        HarnessRules(IPv4Address("127.0.0.1"), (8700,), 8600, proxy_uid=1001, loopback_uids=(0,))
    )
    assert "define loopback_uids = { 0, 1001 }" in shared
    assert '\t\toif "lo" jump loopback\n' in shared and 'oif "lo" accept' not in shared
    chain = shared[shared.index("\tchain loopback {") :]
    chain = chain[: chain.index("\t}")]
    rules = [line.strip().split(" comment ")[0] for line in chain.splitlines()[1:]]
    assert rules == [
        "ct state established,related accept",  # replies of connections let through
        "meta skuid $loopback_uids accept",  # the proxy (and root): every loopback port
        "tcp dport $proxy_ports accept",  # any other uid: the proxy's port only
        "meta l4proto tcp reject with tcp reset",  # and refused at once elsewhere
        "reject",
    ]
    # The guest's rules: the proxy's uid reaches only the engine's port on loopback, root
    # (loopback_uids) every port.
    engine_only = render(
        HarnessRules(
            IPv4Address("127.0.0.1"),
            (8700,),
            8600,
            proxy_uid=1001,
            loopback_uids=(0,),
            proxy_loopback_ports=(8000,),
        )
    )
    assert "define loopback_uids = { 0 }" in engine_only
    assert "define proxy_loopback_ports = { 8000 }" in engine_only
    chain = engine_only[engine_only.index("\tchain loopback {") :]
    chain = chain[: chain.index("\t}")]
    assert [line.strip().split(" comment ")[0] for line in chain.splitlines()[1:]] == [
        "ct state established,related accept",
        "meta skuid $loopback_uids accept",  # root: every loopback port
        "meta skuid 1001 ip daddr 127.0.0.1 tcp dport $proxy_loopback_ports accept",  # engine
        "tcp dport $proxy_ports accept",
        "meta l4proto tcp reject with tcp reset",
        "reject",
    ]
    # With no loopback_uids, no empty set is written (nft would refuse it).
    alone = render(
        HarnessRules(
            IPv4Address("127.0.0.1"),
            (8700,),
            8600,
            proxy_uid=1001,
            loopback_uids=(),
            proxy_loopback_ports=(8000,),
        )
    )
    assert "define loopback_uids" not in alone and "$loopback_uids" not in alone
    assert "{ }" not in alone
    # Its own namespace (APPLIANCE): loopback holds only the harness, and stays open.
    assert 'oif "lo" accept' in render(RULES) and "reject" not in render(RULES)


def test_rules_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        HarnessRules(IPv4Address("10.0.0.1"), (), 8600)
    with pytest.raises(ValueError):
        HarnessRules(IPv4Address("10.0.0.1"), (70000,), 8600)
    with pytest.raises(ValueError):
        HarnessRules(IPv4Address("10.0.0.1"), (8700,), 0)
    with pytest.raises(ValueError):
        HarnessRules(IPv4Address("10.0.0.1"), (8700,), 8600, proxy_uid=-1)
    with pytest.raises(ValueError):
        HarnessRules(IPv4Address("10.0.0.1"), (8700,), 8600, proxy_uid=1, loopback_uids=(-1,))
    with pytest.raises(ValueError, match="proxy_loopback_ports needs proxy_uid"):
        HarnessRules(IPv4Address("10.0.0.1"), (8700,), 8600, proxy_loopback_ports=(8000,))
    with pytest.raises(ValueError, match="proxy_loopback_ports needs proxy_uid"):
        HarnessRules(IPv4Address("10.0.0.1"), (8700,), 8600, proxy_uid=1, proxy_loopback_ports=())
    with pytest.raises(ValueError, match="not a TCP port"):
        HarnessRules(IPv4Address("10.0.0.1"), (8700,), 8600, proxy_uid=1, proxy_loopback_ports=(0,))
    with pytest.raises(TypeError):
        HarnessRules("10.0.0.1", (8700,), 8600)  # type: ignore[arg-type]


def test_the_shipped_file_is_the_appliance_rendering() -> None:
    # Regenerate with: .venv/bin/python -m egress_proxy.netrules > egress_proxy/netrules/appliance.nft
    assert appliance_ruleset() == render(APPLIANCE)


def _sh(*args: str, ns: str | None = None, stdin: str | None = None) -> str:
    cmd = ["ip", "netns", "exec", ns, *args] if ns else list(args)
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=10)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done.stdout


def _skip(reason: str) -> None:
    print(f"test_netrules: skipped: {reason}", file=sys.stderr)
    pytest.skip(reason)


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    if sys.platform != "linux":
        _skip("network namespaces are Linux only")
    if shutil.which("ip") is None or shutil.which("nft") is None:
        _skip("needs `ip` and `nft` (Debian packages iproute2 and nftables)")
    tag = secrets.token_hex(3)
    hns, wns = f"aff-h-{tag}", f"aff-w-{tag}"
    made: list[str] = []
    try:
        for ns in (hns, wns):
            try:
                _sh("ip", "netns", "add", ns)
            except (RuntimeError, OSError) as e:
                _skip(f"`ip netns add` is not permitted here: {e}")
            made.append(ns)
        try:
            _sh("nft", "list", "ruleset", ns=hns)
        except RuntimeError as e:
            _skip(f"`nft` is not permitted in a namespace here: {e}")
        # The veth is created inside the harness's namespace, its peer moved straight into the
        # world's: no interface ever exists in the host's namespace.
        _sh("ip", "link", "add", "h0", "type", "veth", "peer", "name", "w0", "netns", wns, ns=hns)
        _sh("ip", "addr", "add", f"{HARNESS_IP}/24", "dev", "h0", ns=hns)
        _sh("ip", "addr", "add", f"{WORLD_IP}/24", "dev", "w0", ns=wns)
        _sh("ip", "addr", "add", f"{PROXY_IP}/24", "dev", "w0", ns=wns)
        _sh("ip", "addr", "add", f"{HARNESS_IP6}/64", "dev", "h0", "nodad", ns=hns)
        _sh("ip", "addr", "add", f"{WORLD_IP6}/64", "dev", "w0", "nodad", ns=wns)
        for ns, dev in ((hns, "h0"), (wns, "w0")):
            _sh("ip", "link", "set", "lo", "up", ns=ns)
            _sh("ip", "link", "set", dev, "up", ns=ns)
        yield hns, wns
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _serve(ns: str, spec: list[list[Any]]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", AGENT, "serve", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert json.loads(line) == "ready", proc.stderr.read() if proc.stderr else line
    return proc


def _probe(ns: str, spec: list[list[Any]]) -> list[str]:
    out = _sh(sys.executable, "-c", AGENT, "probe", json.dumps(spec), ns=ns)
    result: list[str] = json.loads(out)
    return result


def _events(proc: subprocess.Popen[str]) -> list[list[str]]:
    proc.terminate()
    out, _ = proc.communicate(timeout=5)
    return [json.loads(line) for line in out.splitlines()]


def test_the_harness_reaches_the_proxy_and_nothing_else(namespaces: tuple[str, str]) -> None:
    hns, wns = namespaces
    world = _serve(
        wns,
        [
            ["tcp", WORLD_IP, WORLD_PORT, "world"],
            ["tcp", PROXY_IP, PROXY_PORT, "proxy"],
            ["tcp", PROXY_IP, OTHER_PORT, "proxy-other-port"],
            ["udp", WORLD_IP, DNS_PORT, "dns"],
            ["tcp", WORLD_IP6, WORLD_PORT, "world6"],
        ],
    )
    api = _serve(hns, [["tcp", HARNESS_IP, API_PORT, "api"]])
    try:
        # Without the rules the world is reachable: what follows is the rules' doing.
        assert _probe(hns, [["tcp", WORLD_IP, WORLD_PORT], ["tcp", WORLD_IP6, WORLD_PORT]]) == [
            "ok:world",
            "ok:world6",
        ]

        _sh("nft", "-f", "-", ns=hns, stdin=render(RULES))
        assert f"table inet {TABLE}" in _sh("nft", "list", "ruleset", ns=hns)

        outcomes = _probe(
            hns,
            [
                ["tcp", PROXY_IP, PROXY_PORT],
                ["tcp", WORLD_IP, WORLD_PORT],
                ["tcp", PROXY_IP, OTHER_PORT],
                ["udp", WORLD_IP, DNS_PORT],
                ["tcp", WORLD_IP6, WORLD_PORT],
            ],
        )
        assert outcomes[0] == "ok:proxy", outcomes
        assert all(o.startswith("fail:") for o in outcomes[1:]), outcomes

        # Inbound to the harness's API is allowed.
        assert _probe(wns, [["tcp", HARNESS_IP, API_PORT]]) == ["ok:api"]
    finally:
        seen = _events(world)
        api_seen = _events(api)
    # The world saw the control connection and the proxy's: the dropped packets never arrived.
    assert seen == [
        ["tcp", "world", HARNESS_IP],
        ["tcp", "world6", HARNESS_IP6],
        ["tcp", "proxy", HARNESS_IP],
    ], seen
    assert api_seen == [["tcp", "api", WORLD_IP]], api_seen
