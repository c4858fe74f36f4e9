"""The external TLS port in the network rules (``HarnessRules.tls_port``): the full image's
guest serves its attested front (``harness.front``) there, to any IPv4 source.

The namespace test uses ``test_netrules``'s two namespaces (root, ``ip``, ``nft``; skipped,
saying why, without them): after the rules the world reaches the harness's TLS port and API
port, and no other port of the harness."""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest

from egress_proxy.netrules import APPLIANCE, HarnessRules, appliance_ruleset, render
from tests.egress_proxy.test_netrules import (  # noqa: F401 (namespaces: a fixture)
    API_PORT,
    HARNESS_IP,
    PROXY_IP,
    PROXY_PORT,
    _events,
    _probe,
    _serve,
    _sh,
    namespaces,
)

TLS_PORT, CLOSED_PORT = 8443, 9001
RULE = "meta nfproto ipv4 tcp dport $tls_port ct state new accept"


def _rules(tls_port: int | None) -> HarnessRules:
    return HarnessRules(IPv4Address(PROXY_IP), (PROXY_PORT,), API_PORT, tls_port=tls_port)


def test_the_tls_port_is_let_in_from_anywhere() -> None:
    text = render(_rules(TLS_PORT))
    assert "define tls_port = 8443" in text
    chain = text[text.index("\tchain input {") :]
    chain = chain[: chain.index("\t}")]
    rules = [line.strip().split(" comment ")[0] for line in chain.splitlines()[2:]]
    assert rules == [
        'iif "lo" accept',
        "ct state invalid drop",
        "ct state established,related accept",
        "meta nfproto ipv4 ip saddr $api_sources tcp dport $api_port ct state new accept",
        RULE,  # no source restriction: the front is for users outside
    ]
    assert "in: TCP to the API and TLS ports only" in text
    # without one (the harness's own namespace, the shipped file): no such rule
    plain = render(_rules(None))
    assert "tls_port" not in plain and "in: TCP to the API port only" in plain
    assert "tls_port" not in appliance_ruleset() and appliance_ruleset() == render(APPLIANCE)


def test_the_guest_s_rules_name_its_tls_port() -> None:
    from enclave_image.appliance import GuestLayout, guest_rules

    assert guest_rules(GuestLayout()).tls_port == 8443
    assert guest_rules(GuestLayout(tls_port=9443)).tls_port == 9443
    assert "define tls_port = 9443" in render(guest_rules(GuestLayout(tls_port=9443)))


@pytest.mark.parametrize("port", [0, 65536, -1])
def test_a_tls_port_that_is_not_a_port_is_refused(port: int) -> None:
    with pytest.raises(ValueError, match="not a TCP port"):
        _rules(port)


def test_the_world_reaches_the_tls_port(namespaces: tuple[str, str]) -> None:  # noqa: F811
    hns, wns = namespaces
    harness = _serve(
        hns,
        [
            ["tcp", HARNESS_IP, TLS_PORT, "tls"],
            ["tcp", HARNESS_IP, API_PORT, "api"],
            ["tcp", HARNESS_IP, CLOSED_PORT, "closed"],
        ],
    )
    try:
        _sh("nft", "-f", "-", ns=hns, stdin=render(_rules(TLS_PORT)))
        outcomes = _probe(
            wns,
            [["tcp", HARNESS_IP, TLS_PORT], ["tcp", HARNESS_IP, API_PORT],
             ["tcp", HARNESS_IP, CLOSED_PORT]],
        )  # fmt: skip
        assert outcomes[:2] == ["ok:tls", "ok:api"], outcomes
        assert outcomes[2].startswith("fail:"), outcomes
        # the same rules without the TLS port: the front is not reachable
        _sh("nft", "-f", "-", ns=hns, stdin=render(_rules(None)))
        assert _probe(wns, [["tcp", HARNESS_IP, TLS_PORT]])[0].startswith("fail:")
    finally:
        seen = _events(harness)
    assert [tag for _, tag, _ in seen] == ["tls", "api"], seen
