"""The harness's only way out: the nftables ruleset for its network namespace.

In the appliance the harness (and everything it runs) lives in its own network namespace whose
one interface is a veth to the proxy's namespace; that namespace has no default route, so the
proxy's address is the only one it can name. This ruleset is the belt and braces on top:
loaded into the harness's namespace, it lets out only new TCP connections to the proxy's
address and port(s), lets in only new TCP connections to the harness's API port, passes
loopback and the replies of allowed connections, and drops everything else, IPv6 and every
UDP datagram (DNS included) among it. Nothing is forwarded. Where the appliance serves its
external TLS port (``tls_port``: the full image's guest, ``harness.front``), new TCP
connections to it are let in from any IPv4 source too.

Where the proxy shares the harness's namespace (``proxy_uid`` set: the full image's guest, where
engine, proxy and harness are services under their own uids on one loopback), loopback is
ruled by uid too: a new connection over loopback is accepted from the proxy's uid (it alone
reaches the engine: only its port on 127.0.0.1 where ``proxy_loopback_ports`` names it) and
from ``loopback_uids`` (root: PID 1's health checks); any other uid, the harness's among them,
reaches only the proxy's port(s), and is answered everywhere else with a reject (a TCP reset,
so a probe fails at once with "connection refused" rather than waiting out a timeout). The
engine's token (``inference.engine_token``) is the second lock. Loopback here is every
address of the machine itself: a connection to the guest's own external address goes over
``lo`` too, so a name the host's DNS points at the guest itself cannot take the proxy to a
listener of another uid (the database password in the store's URL would go to it).

``render`` writes the ruleset from a ``HarnessRules``; ``APPLIANCE`` is the appliance's
addressing, and ``netrules/appliance.nft`` (shipped in this package) is ``render(APPLIANCE)``.
Load it with ``ip netns exec <harness-ns> nft -f appliance.nft``: it replaces only its own
table (``inet affidavit_harness``), atomically. See ``docs/proxy.md``, "Network rules".
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from ipaddress import IPv4Address, IPv4Network

TABLE = "affidavit_harness"


@dataclass(frozen=True)
class HarnessRules:
    """What the harness's namespace may do; everything not named here is dropped.

    ``proxy_uid``: for a layout where the proxy shares the harness's namespace (the full
    image's guest), the uid whose sockets may leave the machine; loopback is then ruled by uid
    (``loopback_uids`` may reach every loopback port, the proxy's uid those in
    ``proxy_loopback_ports`` (every one where that is None), every other uid only the proxy's).
    ``None`` (a harness namespace of its own: ``APPLIANCE``) lets no process out but to the
    proxy, and leaves loopback, which holds only the harness, open.
    """

    proxy_address: IPv4Address
    proxy_ports: tuple[int, ...]
    api_port: int
    api_sources: tuple[IPv4Network, ...] = ()  # who may call the API; empty: any IPv4 source
    proxy_uid: int | None = None
    loopback_uids: tuple[int, ...] = (0,)  # with proxy_uid: also reach every loopback port
    #: With proxy_uid: the ports on 127.0.0.1 the proxy's uid may reach (the engine's), and no
    #: other local address or port; None: every one.
    proxy_loopback_ports: tuple[int, ...] | None = None
    #: The external TLS port (the attested front, ``harness.front``): new TCP connections to
    #: it are accepted from any IPv4 source. None: no such port (the harness's own namespace).
    tls_port: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.proxy_address, IPv4Address):
            raise TypeError("proxy_address must be an IPv4Address")
        if not self.proxy_ports:
            raise ValueError("proxy_ports must name at least one port")
        tls = (self.tls_port,) if self.tls_port is not None else ()
        if self.proxy_loopback_ports is not None and (
            self.proxy_uid is None or not self.proxy_loopback_ports
        ):
            raise ValueError("proxy_loopback_ports needs proxy_uid and at least one port")
        for port in (*self.proxy_ports, self.api_port, *tls, *(self.proxy_loopback_ports or ())):
            if not isinstance(port, int) or not 1 <= port <= 65535:
                raise ValueError(f"not a TCP port: {port!r}")
        for source in self.api_sources:
            if not isinstance(source, IPv4Network):
                raise TypeError("api_sources must be IPv4Networks")
        for uid in (
            *((self.proxy_uid,) if self.proxy_uid is not None else ()),
            *self.loopback_uids,
        ):
            if not isinstance(uid, int) or uid < 0:
                raise ValueError(f"not a uid: {uid!r}")


# The appliance: a /30 between the harness's namespace (10.200.0.2) and the proxy's
# (10.200.0.1); the proxy's data plane on 8700 (``Listen.port``'s default); the harness's API on
# 8600, reachable from the proxy's side of the veth only.
APPLIANCE = HarnessRules(
    proxy_address=IPv4Address("10.200.0.1"),
    proxy_ports=(8700,),
    api_port=8600,
    api_sources=(IPv4Network("10.200.0.0/30"),),
)


def _set(items: list[str]) -> str:
    return "{ " + ", ".join(items) + " }"


def render(rules: HarnessRules) -> str:
    """The nftables ruleset (``nft -f`` input) for the harness's namespace."""
    sources = [str(s) for s in rules.api_sources] or ["0.0.0.0/0"]
    ports = [str(p) for p in sorted(set(rules.proxy_ports))]
    shared = rules.proxy_uid is not None  # the proxy shares the namespace: loopback by uid
    defines: list[str] = []
    loopback = ['\t\toif "lo" accept']
    chain: list[str] = []
    if rules.proxy_uid is not None:
        bounded = rules.proxy_loopback_ports is not None  # the proxy: only those loopback ports
        uids = sorted({*rules.loopback_uids, *(() if bounded else (rules.proxy_uid,))})
        defines = [f"define loopback_uids = {_set([str(u) for u in uids])}"] if uids else []
        engine: list[str] = []
        if rules.proxy_loopback_ports is not None:
            ports_of_proxy = [str(p) for p in sorted(set(rules.proxy_loopback_ports))]
            defines.append(f"define proxy_loopback_ports = {_set(ports_of_proxy)}")
            engine = [
                f"\t\tmeta skuid {rules.proxy_uid} ip daddr 127.0.0.1 tcp dport"
                ' $proxy_loopback_ports accept comment "the proxy: the engine\'s port only"'
            ]
        who = "loopback_uids" if bounded else "the proxy, loopback_uids"
        loopback = [
            '\t\toif "lo" jump loopback',
            f'\t\tmeta skuid {rules.proxy_uid} accept comment "the proxy\'s own sockets"',
        ]
        chain = [
            "",
            "\tchain loopback {",
            "\t\tct state established,related accept",
            *(
                [f'\t\tmeta skuid $loopback_uids accept comment "{who}: every port"']
                if uids
                else []
            ),
            *engine,
            '\t\ttcp dport $proxy_ports accept comment "any other uid: the proxy\'s port only"',
            '\t\tmeta l4proto tcp reject with tcp reset comment "refused at once, not dropped"',
            "\t\treject",
            "\t}",
        ]
    lines = [
        "# affidavit: the harness's network namespace. Generated by egress_proxy.netrules;",
        "# out: TCP to the proxy only; in: TCP to the API port only; all else dropped."
        if rules.tls_port is None
        else "# out: TCP to the proxy only; in: TCP to the API and TLS ports only; all else"
        " dropped.",
        *(
            [
                "# loopback: by uid; only the proxy (to the engine) and loopback_uids get past the"
                " proxy's port."
                if rules.proxy_loopback_ports is not None
                else "# loopback: by uid; only the proxy and loopback_uids get past the proxy's"
                " port."
            ]
            if shared
            else []
        ),
        f"define proxy_address = {rules.proxy_address}",
        f"define proxy_ports = {_set(ports)}",
        f"define api_port = {rules.api_port}",
        f"define api_sources = {_set(sources)}",
        *([f"define tls_port = {rules.tls_port}"] if rules.tls_port is not None else []),
        *defines,
        "",
        f"table inet {TABLE}",  # declared, so the delete below never fails
        f"delete table inet {TABLE}",
        "",
        f"table inet {TABLE} {{",
        "\tchain input {",
        "\t\ttype filter hook input priority filter; policy drop;",
        '\t\tiif "lo" accept',
        "\t\tct state invalid drop",
        "\t\tct state established,related accept",
        "\t\tmeta nfproto ipv4 ip saddr $api_sources tcp dport $api_port ct state new accept",
        *(
            [
                "\t\tmeta nfproto ipv4 tcp dport $tls_port ct state new accept"
                ' comment "the attested front, from anywhere"'
            ]
            if rules.tls_port is not None
            else []
        ),
        "\t}",
        "",
        "\tchain output {",
        "\t\ttype filter hook output priority filter; policy drop;",
        *loopback,
        "\t\tct state invalid drop",
        "\t\tct state established,related accept",
        "\t\tmeta nfproto ipv4 ip daddr $proxy_address tcp dport $proxy_ports ct state new accept",
        "\t}",
        *chain,
        "",
        "\tchain forward {",
        "\t\ttype filter hook forward priority filter; policy drop;",
        "\t}",
        "}",
        "",
    ]
    return "\n".join(lines)


def appliance_ruleset() -> str:
    """The shipped ``netrules/appliance.nft`` (``render(APPLIANCE)``)."""
    return (resources.files("egress_proxy") / "netrules" / "appliance.nft").read_text("utf-8")


if __name__ == "__main__":  # regenerate the shipped file: python -m egress_proxy.netrules
    print(render(APPLIANCE), end="")
