"""The fetch endpoint against a raw TCP server on loopback that keeps the bytes it receives.

- ``fetch.request`` is durable before the server sees a byte, and its ``request_bytes`` are
  exactly the bytes that arrived (request line, header lines, body); ``content_key`` is their
  digest. The answer carries status, reason, headers (names as received) and the body as
  received (content-coding not undone), and ``fetch.response`` holds them as one HTTP message;
  with ``Content-Length`` framing that is byte for byte what the server sent.
- A chunked body is recorded with its framing removed (documented).
- No connection, or a name that does not resolve: not a byte went out, so 502
  ``upstream_unreachable``, recorded ``FAILED`` with that reason (#18 line 5: the turn goes on,
  it does not stop for a decision); a request sent and never answered: 502
  ``upstream_unavailable``, ``UNKNOWN``; a cut body: 502 ``upstream_cut``, ``UNKNOWN`` with
  what arrived; a body over the limit: 502 ``response_too_large``, ``FAILED``.
- Bad input is refused before anything is recorded (400 ``malformed_json`` or
  ``malformed_fetch``); the token guards the route (401); only POST (405).
- Fetch cannot reach inside (#16 line 5): on a proxy with no ``fetch.allow``, every internal
  address and every numeric host form (loopback, ``localhost``, decimal/octal/hex/short
  forms, IPv4-mapped IPv6, unspecified, link-local and the metadata addresses, private,
  CGNAT, multicast, 6to4, the proxy's own port) is 403 ``egress_refused``, recorded
  ``fetch.request`` + ``FAILED``, and a loopback listener never sees a connection.
  ``fetch.deny`` wins over ``fetch.allow``. A redirect is answered as it came: its
  ``Location`` (allow-listed, even) is never dialed. The transport connects to the pinned
  address only, the ``Host`` header still the URL's name. The module rig allow-lists
  ``127.0.0.1/32`` explicitly for the raw servers the other tests dial.
- Fetches only as the model asked (#16 line 6): every fetch here answers a ``web_fetch`` call
  of a reply committed through the proxy first (``_asked``); ``test_fetch_admission.py``
  shows the refusals.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from egress_proxy.errors import EgressRefused, UpstreamUnreachable
from egress_proxy.fetch_guard import EgressRule, default_refusal, numeric_host_form
from egress_proxy.server import ProxyServer
from egress_proxy.transports.base import UpstreamRequest
from egress_proxy.transports.network import NetworkTransport
from record.digest import Domain, digest
from record.log import Log
from record.schema import FetchRequest, FetchResponse
from record.seal import KeyPair
from tests.egress_proxy.loopback import (
    ENV,
    FakeUpstream,
    LoopbackServer,
    Rig,
    proxy_config,
    read_bodies,
)
from tests.egress_proxy.tool_rig import RawHttpServer, ToolRig, build_tool_rig, committed_reply


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolRig]:
    with build_tool_rig(tmp_path_factory.mktemp("fetch")) as rig:
        yield rig


def _fetch(session: Any, doc: Any, *, token: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {session.token if token is None else token}"}
    url = f"{session.openai_base_url}/fetch"
    if isinstance(doc, bytes):
        return httpx.post(url, content=doc, headers=headers, timeout=30)
    return httpx.post(url, json=doc, headers=headers, timeout=30)


def _entries(tools: ToolRig, stream: str) -> list[Any]:
    """The session's fetch entries (its model call, which asked for them, left out)."""
    bodies = [b for _, b in tools.rig.bodies(stream).values()]
    return [b for b in bodies if isinstance(b, FetchRequest | FetchResponse)]


def _asked(rig: Rig, session: Any, *urls: str) -> int:
    """Commit a model reply that asks for ``web_fetch`` of each URL: the calls a fetch of
    each is admitted as (``egress_proxy.fetch``). Its seq."""
    calls = [(f"call_{i}", "web_fetch", {"url": url}) for i, url in enumerate(urls)]
    return committed_reply(rig, session, list(calls))


PAGE = gzip.compress(b"<html>hello</html>", mtime=0)
REPLY = (
    b"HTTP/1.1 201 Created\r\nX-Mixed-Case: Yes\r\nContent-Encoding: gzip\r\n"
    b"Content-Length: " + str(len(PAGE)).encode() + b"\r\n\r\n" + PAGE
)


def test_the_exact_bytes_sent_are_recorded_first_and_the_reply_verbatim(tools: ToolRig) -> None:
    rig = tools.rig
    session = rig.open_session()
    checked: list[bytes] = []

    def inspect_store(received: bytes) -> None:
        bodies = read_bodies(rig.store_path, session.session_id, rig.user)
        [request] = [b for _, b in bodies.values() if isinstance(b, FetchRequest)]
        assert not [b for _, b in bodies.values() if isinstance(b, FetchResponse)]
        assert request.request_bytes == received
        checked.append(received)

    with RawHttpServer(REPLY) as server:
        server.on_request = inspect_store
        url = f"http://127.0.0.1:{server.port}/a/b?q=1&r=%2F~x"
        reply_seq = _asked(rig, session, url)
        doc = {
            "method": "GET",
            "url": url,
            "headers": [["Accept-Language", "en"], ["accept", "text/html"]],
        }
        response = _fetch(session, doc)
    assert not server.errors, server.errors
    assert response.status_code == 200
    sent = server.received[0]
    assert checked == [sent]
    assert (
        sent
        == (
            f"GET /a/b?q=1&r=%2F~x HTTP/1.1\r\nhost: 127.0.0.1:{server.port}\r\n"
            "accept-language: en\r\naccept: text/html\r\nuser-agent: affidavit-proxy\r\n"
            "accept-encoding: identity\r\n\r\n"
        ).encode()
    )
    answer = response.json()
    assert (answer["status"], answer["reason"], answer["http_version"]) == (
        201,
        "Created",
        "HTTP/1.1",
    )
    assert answer["headers"] == [
        ["X-Mixed-Case", "Yes"],
        ["Content-Encoding", "gzip"],
        ["Content-Length", str(len(PAGE))],
    ]
    assert base64.b64decode(answer["body"]) == PAGE  # as received: not decompressed
    request, reply = _entries(tools, session.session_id)
    assert isinstance(request, FetchRequest) and isinstance(reply, FetchResponse)
    assert (request.method, request.url) == ("GET", url)
    assert (request.reply_seq, request.call_id) == (reply_seq, "call_0")  # the call it answers
    assert request.content_key == digest(Domain.FETCH_REQUEST, sent)
    assert (reply.outcome, reply.status, reply.response_bytes) == ("COMMITTED", 201, REPLY)
    assert reply.response_digest == digest(Domain.FETCH_RESPONSE, REPLY)
    note = answer["affidavit"]
    assert note["content_key"] == request.content_key
    assert note["response_digest"] == reply.response_digest
    assert note["seq"] == note["request_seq"] + 1 and note["outcome"] == "COMMITTED"
    assert response.headers["affidavit-request-seq"] == str(note["request_seq"])


def test_a_chunked_body_is_recorded_without_its_framing(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    with RawHttpServer(head + b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n") as server:
        url = f"http://127.0.0.1:{server.port}/"
        _asked(tools.rig, session, url)
        response = _fetch(session, {"method": "GET", "url": url})
    assert base64.b64decode(response.json()["body"]) == b"hello world"
    _, reply = _entries(tools, session.session_id)
    assert isinstance(reply, FetchResponse)
    assert reply.response_bytes == head + b"hello world"
    assert server.received[0].startswith(b"GET / HTTP/1.1\r\n")
    assert b"content-length" not in server.received[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _failed_with(reply: FetchResponse, code: str) -> dict[str, str]:
    """The recorded ``FAILED`` outcome's error, which names ``code`` (what the client got)."""
    assert (reply.outcome, reply.status, reply.response_bytes) == ("FAILED", None, None)
    assert reply.error_bytes is not None
    error: dict[str, str] = json.loads(reply.error_bytes)["error"]
    assert error["code"] == code
    return error


def test_no_connection_is_recorded_failed_with_its_reason(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    url = f"http://127.0.0.1:{_closed_port()}/x"
    reply_seq = _asked(tools.rig, session, url)
    response = _fetch(session, {"method": "GET", "url": url})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"
    request, reply = _entries(tools, session.session_id)
    assert isinstance(request, FetchRequest) and isinstance(reply, FetchResponse)
    error = _failed_with(reply, "upstream_unreachable")
    assert url in error["message"] and "ConnectError" in error["message"]
    assert response.json()["error"] == error  # the record says what the client was told
    assert response.headers["affidavit-request-seq"] == str(reply_seq + 1)


def test_a_name_that_does_not_resolve_is_recorded_failed(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    _asked(tools.rig, session, "http://nothing.invalid/x")
    response = _fetch(session, {"method": "GET", "url": "http://nothing.invalid/x"})
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_unreachable" and "nothing.invalid" in error["message"]
    _, reply = _entries(tools, session.session_id)
    assert isinstance(reply, FetchResponse)
    assert _failed_with(reply, "upstream_unreachable")["message"] == error["message"]


def test_a_request_sent_and_never_answered_is_recorded_unknown(tools: ToolRig) -> None:
    """The server read the whole request and closed without a word: it may have acted on it."""
    session = tools.rig.open_session()
    with RawHttpServer(b"") as server:
        url = f"http://127.0.0.1:{server.port}/x"
        _asked(tools.rig, session, url)
        response = _fetch(session, {"method": "GET", "url": url})
    assert len(server.received) == 1
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unavailable"
    _, reply = _entries(tools, session.session_id)
    assert isinstance(reply, FetchResponse)
    assert (reply.outcome, reply.status, reply.response_bytes) == ("UNKNOWN", None, None)


def test_a_cut_body_is_recorded_unknown_with_what_arrived(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    partial = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b"
    with RawHttpServer(partial) as server:
        url = f"http://127.0.0.1:{server.port}/"
        _asked(tools.rig, session, url)
        response = _fetch(session, {"method": "GET", "url": url})
    assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_cut"
    _, reply = _entries(tools, session.session_id)
    assert isinstance(reply, FetchResponse)
    assert (reply.outcome, reply.status, reply.response_bytes) == ("UNKNOWN", 200, partial)


def test_a_body_over_the_limit_is_refused_and_recorded_failed(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    size = 64 * 1024 + 1  # the rig's fetch.max_response_bytes, plus one
    big = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size
    with RawHttpServer(big) as server:
        url = f"http://127.0.0.1:{server.port}/"
        _asked(tools.rig, session, url)
        response = _fetch(session, {"method": "GET", "url": url})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "response_too_large"
    _, reply = _entries(tools, session.session_id)
    assert isinstance(reply, FetchResponse)
    assert (reply.outcome, reply.status, reply.error_bytes) == ("FAILED", 200, response.content)


URL = "http://127.0.0.1:9/"


@pytest.mark.parametrize(
    ("doc", "code"),
    [
        (b"not json", "malformed_json"),
        (b'[{"method":"GET"}]', "malformed_json"),
        ({"method": "GET"}, "malformed_fetch"),
        ({"method": "GET", "url": URL, "extra": 1}, "malformed_fetch"),
        ({"method": "get", "url": URL}, "malformed_fetch"),
        ({"method": "GET", "url": "ftp://127.0.0.1/"}, "malformed_fetch"),
        ({"method": "GET", "url": "/relative"}, "malformed_fetch"),
        ({"method": "GET", "url": "http://u:p@127.0.0.1/"}, "malformed_fetch"),
        ({"method": "GET", "url": "http://127.0.0.1/#frag"}, "malformed_fetch"),
        ({"method": "GET", "url": "http://127.0.0.1/a b"}, "malformed_fetch"),
        ({"method": "GET", "url": "http://127.0.0.1/café"}, "malformed_fetch"),
        ({"method": "GET", "url": "http://127.0.0.1/a/../b"}, "malformed_fetch"),
        ({"method": "GET", "url": URL, "body": "***"}, "malformed_fetch"),
        (
            {"method": "GET", "url": URL, "headers": {"Authorization": "Bearer x"}},
            "malformed_fetch",
        ),
        ({"method": "GET", "url": URL, "headers": {"Host": "elsewhere"}}, "malformed_fetch"),
        ({"method": "GET", "url": URL, "headers": {"bad name": "x"}}, "malformed_fetch"),
        ({"method": "GET", "url": URL, "headers": {"x": "line\r\nbreak"}}, "malformed_fetch"),
        ({"method": "GET", "url": URL, "headers": [["x"]]}, "malformed_fetch"),
    ],
)
def test_bad_input_is_refused_before_anything_is_recorded(
    tools: ToolRig, doc: Any, code: str
) -> None:
    session = tools.rig.open_session()
    response = _fetch(session, doc)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == code
    assert _entries(tools, session.session_id) == []


def test_the_token_guards_the_route_and_only_post_is_taken(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    other = tools.rig.open_session()
    doc = {"method": "GET", "url": URL}
    assert _fetch(session, doc, token=other.token).status_code == 401
    response = httpx.get(
        f"{session.openai_base_url}/fetch", headers={"authorization": f"Bearer {session.token}"}
    )
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


# -- fetch cannot reach inside (#16 line 5) ----------------------------------------------------


class Listener:
    """A loopback port that must never see a connection: the kernel completes a handshake
    into the accept queue whether or not anyone accepts, so a non-blocking ``accept`` after the
    fact tells whether any connection came."""

    def __init__(self, family: socket.AddressFamily = socket.AF_INET) -> None:
        self.sock = socket.socket(family)
        self.sock.bind(("127.0.0.1" if family == socket.AF_INET else "::1", 0))
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.port: int = self.sock.getsockname()[1]

    def connections(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1


@contextmanager
def _proxy(tmp: Path, fetch: dict[str, Any]) -> Iterator[Rig]:
    """A proxy whose fetch config is ``fetch`` (and nothing allow-listed unless it says so),
    in front of a scripted model upstream (whose replies ask for the fetches)."""
    store = tmp / "record.db"
    appliance, upstream = KeyPair.generate(), FakeUpstream()
    with (
        LoopbackServer(upstream) as up,
        Log.open(store, appliance_key=appliance) as log,
        ProxyServer(proxy_config(up.url, fetch=fetch), log, env=ENV) as proxy,
    ):
        yield Rig(upstream, up.url, proxy, log, store, KeyPair.generate(), appliance)


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with _proxy(tmp_path_factory.mktemp("strict"), {"enabled": True}) as rig:
        yield rig


def _ipv6_listener() -> Listener | None:
    try:
        return Listener(socket.AF_INET6)
    except OSError:
        return None


#: Each form a model may write to reach inside; ``{v4}``/``{v6}``: a loopback listener's port,
#: ``{proxy}``: the proxy's own (its ``/metrics`` is there).
INSIDE = [
    "http://127.0.0.1:{v4}/",
    "http://localhost:{v4}/",
    "http://LOCALHOST:{v4}/",
    "http://127.0.0.2:{v4}/",
    "http://2130706433:{v4}/",  # decimal
    "http://2130706433:{proxy}/metrics",  # the review's find
    "http://017700000001:{v4}/",  # octal, whole
    "http://0177.0.0.1:{v4}/",  # octal, dotted
    "http://0x7f000001:{v4}/",  # hex, whole
    "http://0x7f.0x0.0x0.0x1:{v4}/",  # hex, dotted
    "http://127.1:{v4}/",  # short
    "http://127.0.0.1.:{v4}/",  # trailing dot
    "http://0.0.0.0:{v4}/",  # unspecified: loopback on Linux
    "http://0:{v4}/",
    "http://[::]:{v6}/",
    "http://[::1]:{v6}/",
    "http://[::ffff:127.0.0.1]:{v4}/",  # IPv4-mapped IPv6
    "http://[::ffff:7f00:1]:{v4}/",
    "http://[::ffff:8.8.8.8]/",  # mapped, even around a public address
    "http://[2002:7f00:1::]:{v4}/",  # 6to4 around loopback
    "http://169.254.169.254/latest/meta-data/",  # link-local: cloud metadata
    "http://[fd00:ec2::254]/latest/meta-data/",  # EC2's IPv6 metadata (unique local)
    "http://[fe80::1]/",
    "http://10.0.0.1/",
    "http://172.16.0.1/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",  # shared address space (CGNAT)
    "http://224.0.0.1/",  # multicast
    "http://[ff02::1]/",
    "http://240.0.0.1/",  # reserved
    "https://127.0.0.1:{v4}/",
]


def test_fetch_cannot_reach_inside_in_any_form(strict: Rig) -> None:
    proxy, store, user = strict.proxy, strict.store_path, strict.user
    port = int(proxy.url.rsplit(":", 1)[1].split("/")[0])
    v4, v6 = Listener(), _ipv6_listener()
    session = strict.open_session()
    urls = [
        form.format(v4=v4.port, v6=v6.port if v6 is not None else v4.port, proxy=port)
        for form in INSIDE
    ]
    _asked(strict, session, *urls)  # the model asked for each: only the rule refuses them
    answers = {url: _fetch(session, {"method": "GET", "url": url}) for url in urls}
    for url, response in answers.items():
        assert response.status_code == 403, (url, response.text)
        error = response.json()["error"]
        assert error["code"] == "egress_refused", (url, error)
        assert "fetch.allow" in error["message"] or "short form" in error["message"], url
    assert v4.connections() == 0
    assert v6 is None or v6.connections() == 0
    if v6 is None:
        print("no IPv6 loopback here: the [::] and [::1] forms were tried on the IPv4 port")
    bodies = [b for _, b in read_bodies(store, session.session_id, user).values()]
    requests = [b for b in bodies if isinstance(b, FetchRequest)]
    refused = [b for b in bodies if isinstance(b, FetchResponse)]
    assert [r.url for r in requests] == list(answers)  # each refusal is recorded
    assert [(r.outcome, r.error_bytes) for r in refused] == [
        ("FAILED", a.content) for a in answers.values()
    ]


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("2130706433", "decimal, octal, hex or short form"),
        ("[::ffff:127.0.0.1]", "IPv4-mapped"),
        ("169.254.169.254", "link-local"),
        ("[fd00:ec2::254]", "private"),
        ("100.64.0.1", "CGNAT"),
        ("127.0.0.1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
    ],
)
def test_a_refusal_names_what_the_address_is(host: str, says: str) -> None:
    with pytest.raises(EgressRefused, match=says):
        EgressRule().check_host(host)


def test_public_addresses_and_dotted_quads_pass_the_default_rule() -> None:
    for text in ("93.184.215.14", "8.8.8.8", "2606:4700::6810:85e5"):
        assert default_refusal(ip_address(text)) is None
    assert EgressRule().check_host("93.184.215.14") == ip_address("93.184.215.14")
    assert EgressRule().check_host("example.org") is None  # a name: resolved, then checked
    assert not numeric_host_form("10.0.0.1") and not numeric_host_form("1.example")
    assert numeric_host_form("1.2.3") and numeric_host_form("01.2.3.4")


def test_allow_opens_a_network_and_deny_wins(tmp_path: Path) -> None:
    rule = EgressRule(allow=[ip_network("127.0.0.0/8")], deny=[ip_network("127.0.0.1/32")])
    assert rule.refusal(ip_address("127.0.0.2")) is None
    assert rule.refusal(ip_address("127.0.0.1")) == "in fetch.deny"
    assert rule.refusal(ip_address("10.0.0.1")) is not None  # not opened
    public = EgressRule(deny=[ip_network("93.184.0.0/16")])
    assert public.refusal(ip_address("93.184.215.14")) == "in fetch.deny"
    fetch = {"enabled": True, "allow": ["127.0.0.0/8"], "deny": ["127.0.0.1/32"]}
    listener = Listener()
    with (
        _proxy(tmp_path, fetch) as rig,
        RawHttpServer(b"HTTP/1.1 204 No\r\n\r\n") as open_,
    ):
        session = rig.open_session()
        deny, allow = f"http://127.0.0.1:{listener.port}/", f"http://127.0.0.2:{open_.port}/"
        _asked(rig, session, deny, allow)
        denied = _fetch(session, {"method": "GET", "url": deny})
        assert denied.status_code == 403 and "fetch.deny" in denied.json()["error"]["message"]
        # allowed: 127.0.0.2 is in 127.0.0.0/8 and not denied (the raw server listens on
        # 127.0.0.1 only, so nothing answers there: the fetch was dialed, not refused)
        dialed = _fetch(session, {"method": "GET", "url": allow})
        assert dialed.status_code == 502
        assert dialed.json()["error"]["code"] == "upstream_unreachable"
    assert listener.connections() == 0


def test_a_redirect_is_answered_not_followed(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    target = Listener()  # on 127.0.0.1, which this rig allow-lists: still never dialed
    location = f"http://127.0.0.1:{target.port}/next"
    reply = f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode()
    with RawHttpServer(reply) as server:
        url = f"http://127.0.0.1:{server.port}/"
        _asked(tools.rig, session, url, location)  # the model asked for both: still one hop
        response = _fetch(session, {"method": "GET", "url": url})
    assert response.status_code == 200
    answer = response.json()
    assert answer["status"] == 302 and ["Location", location] in answer["headers"]
    assert len(server.received) == 1 and target.connections() == 0
    _, recorded = _entries(tools, session.session_id)
    assert isinstance(recorded, FetchResponse) and recorded.response_bytes == reply


def test_the_transport_connects_to_the_pinned_address_with_the_name_as_host() -> None:
    """``pinned.invalid`` resolves nowhere: the request can arrive only through the pin."""

    async def send(port: int) -> int:
        transport = NetworkTransport()
        try:
            host = f"pinned.invalid:{port}"
            request = UpstreamRequest("GET", f"http://{host}/p?q", (("host", host),), b"")
            response = await transport.send_exact(request, "127.0.0.1")
            async for _ in response.body():
                pass
            await response.aclose()
            return response.status
        finally:
            await transport.aclose()

    with RawHttpServer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") as server:
        assert anyio.run(send, server.port) == 200
    assert server.received == [
        f"GET /p?q HTTP/1.1\r\nhost: pinned.invalid:{server.port}\r\n\r\n".encode()
    ]


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    """A throwaway certificate for ``pinned.invalid`` (no CA trusts it)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pinned.invalid")])
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("pinned.invalid")]), False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls_to_the_pinned_address_names_the_host_as_the_server_name(tmp_path: Path) -> None:
    """The TLS server name is the URL's host, not the pinned address; the certificate is
    checked (an untrusted one refuses the fetch before any request byte is sent)."""
    import ssl
    import threading

    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    names: list[str | None] = []

    def remember(sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        names.append(name)

    context.sni_callback = remember  # what the client asked for, before the handshake fails
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(ssl.SSLError, OSError):
            context.wrap_socket(conn, server_side=True).recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    async def send() -> None:
        transport = NetworkTransport()
        try:
            host = f"pinned.invalid:{port}"
            request = UpstreamRequest("GET", f"https://{host}/", (("host", host),), b"")
            await transport.send_exact(request, "127.0.0.1")
        finally:
            await transport.aclose()

    with pytest.raises(UpstreamUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
        anyio.run(send)
    thread.join(10)
    listener.close()
    assert names == ["pinned.invalid"]
