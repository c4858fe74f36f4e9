"""The fetch endpoint against a raw TCP server on loopback that keeps the bytes it receives.

- ``fetch.request`` is durable before the server sees a byte, and its ``request_bytes`` are
  exactly the bytes that arrived (request line, header lines, body); ``content_key`` is their
  digest. The answer carries status, reason, headers (names as received) and the body as
  received (content-coding not undone), and ``fetch.response`` holds them as one HTTP message;
  with ``Content-Length`` framing that is byte for byte what the server sent.
- A chunked body is recorded with its framing removed (documented).
- No connection: 502 ``upstream_unavailable``, recorded ``UNKNOWN``; a cut body: 502
  ``upstream_cut``, ``UNKNOWN`` with what arrived; a body over the limit: 502
  ``response_too_large``, ``FAILED``.
- Bad input is refused before anything is recorded (400 ``malformed_json`` or
  ``malformed_fetch``); the token guards the route (401); only POST (405).
"""

from __future__ import annotations

import base64
import gzip
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from record.digest import Domain, digest
from record.schema import FetchRequest, FetchResponse
from tests.egress_proxy.loopback import read_bodies
from tests.egress_proxy.tool_rig import RawHttpServer, ToolRig, build_tool_rig


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
    return [b for _, b in tools.rig.bodies(stream).values()][1:]  # after stream.opened


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
        doc = {
            "method": "POST",
            "url": url,
            "headers": [["X-Trace", "1"], ["accept", "text/html"]],
            "body": base64.b64encode(b'{"k": 1}').decode(),
        }
        response = _fetch(session, doc)
    assert not server.errors, server.errors
    assert response.status_code == 200
    sent = server.received[0]
    assert checked == [sent]
    assert (
        sent
        == (
            f"POST /a/b?q=1&r=%2F~x HTTP/1.1\r\nhost: 127.0.0.1:{server.port}\r\n"
            "x-trace: 1\r\naccept: text/html\r\nuser-agent: affidavit-proxy\r\n"
            'accept-encoding: identity\r\ncontent-length: 8\r\n\r\n{"k": 1}'
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
    assert (request.method, request.url) == ("POST", url)
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
        response = _fetch(session, {"method": "GET", "url": f"http://127.0.0.1:{server.port}/"})
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


def test_no_connection_is_recorded_unknown(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    response = _fetch(session, {"method": "GET", "url": f"http://127.0.0.1:{_closed_port()}/x"})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unavailable"
    request, reply = _entries(tools, session.session_id)
    assert isinstance(request, FetchRequest) and isinstance(reply, FetchResponse)
    assert (reply.outcome, reply.status, reply.response_bytes) == ("UNKNOWN", None, None)
    assert response.headers["affidavit-request-seq"] == "1"


def test_a_cut_body_is_recorded_unknown_with_what_arrived(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    partial = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b"
    with RawHttpServer(partial) as server:
        response = _fetch(session, {"method": "GET", "url": f"http://127.0.0.1:{server.port}/"})
    assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_cut"
    _, reply = _entries(tools, session.session_id)
    assert isinstance(reply, FetchResponse)
    assert (reply.outcome, reply.status, reply.response_bytes) == ("UNKNOWN", 200, partial)


def test_a_body_over_the_limit_is_refused_and_recorded_failed(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    size = 64 * 1024 + 1  # the rig's fetch.max_response_bytes, plus one
    big = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size
    with RawHttpServer(big) as server:
        response = _fetch(session, {"method": "GET", "url": f"http://127.0.0.1:{server.port}/"})
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
