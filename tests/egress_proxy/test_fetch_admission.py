"""Fetches only as the model asked (#16 line 6): the admission rule of ``tools/call`` holds
for the web tools' fetches, through a real proxy, a scripted model upstream and raw loopback
web servers that count the connections they get.

- A fetch is admitted only as an unserved ``web_fetch {"url"}`` call of the session's
  committed reply (or ``web_search {"query"}``, a GET of the session's search endpoint), once
  per reply and call id; its ``fetch.request`` names the reply and call.
- Anything else is 409 (``reply_not_committed``, ``tool_not_asked``, ``tool_call_served``),
  recorded as ``fetch.request`` naming no call and a ``FAILED`` ``fetch.response`` with the
  body answered, and never resolved or dialed: the web server sees no connection.
- A refusal serves nothing; an ``UNKNOWN`` fetch may be sent again (a GET is idempotent, as
  resume sends it); a ``FAILED`` one was served. What was served is read from the record.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from egress_proxy.admission import WEB
from egress_proxy.errors import ToolCallServed, answered_status
from egress_proxy.fetch import SEARCH_LABEL, search_query
from egress_proxy.tools import ToolAsk, ToolCalls
from record.digest import canonical_json
from record.schema import FetchRequest, FetchResponse
from tests.egress_proxy.test_fetch import Listener, _closed_port
from tests.egress_proxy.tool_rig import RawHttpServer, ToolRig, build_tool_rig, committed_reply

PAGE = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolRig]:
    with build_tool_rig(tmp_path_factory.mktemp("fetch-admission")) as rig:
        yield rig


def _fetch(session: Any, url: str, **extra: Any) -> httpx.Response:
    doc = {"method": "GET", "url": url, **extra}
    headers = {"authorization": f"Bearer {session.token}"}
    return httpx.post(f"{session.openai_base_url}/fetch", json=doc, headers=headers, timeout=30)


def _fetches(tools: ToolRig, stream: str) -> list[tuple[FetchRequest, FetchResponse | None]]:
    bodies = tools.rig.bodies(stream)
    answers = {b.request_seq: b for _, b in bodies.values() if isinstance(b, FetchResponse)}
    return [(b, answers.get(seq)) for seq, (_, b) in bodies.items() if isinstance(b, FetchRequest)]


def _code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


def _refused_and_recorded(
    tools: ToolRig, session: Any, response: httpx.Response, code: str, reply_seq: int | None
) -> None:
    """A 409 with ``code``, recorded as the last fetch: naming no call, ``FAILED`` with the
    very body answered."""
    assert response.status_code == 409, response.text
    assert _code(response) == code
    request, answer = _fetches(tools, session.session_id)[-1]
    assert (request.reply_seq, request.call_id) == (reply_seq, None)
    assert answer is not None and answer.outcome == "FAILED"
    assert answer.error_bytes == response.content
    assert response.headers["affidavit-request-seq"] == str(answer.request_seq)


def test_a_fetch_without_a_committed_reply_is_refused_recorded_and_never_dialed(
    tools: ToolRig,
) -> None:
    session = tools.rig.open_session()
    web = Listener()
    response = _fetch(session, f"http://127.0.0.1:{web.port}/")
    _refused_and_recorded(tools, session, response, "reply_not_committed", None)
    assert web.connections() == 0


def test_a_url_the_model_did_not_ask_for_is_refused_and_never_dialed(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    asked, other = Listener(), Listener()
    reply_seq = committed_reply(
        tools.rig, session, [("c1", "web_fetch", {"url": f"http://127.0.0.1:{asked.port}/"})]
    )
    for url in (
        f"http://127.0.0.1:{other.port}/",  # another host
        f"http://127.0.0.1:{asked.port}/x",  # another path
        f"http://127.0.0.1:{asked.port}/?",  # not the same text
    ):
        response = _fetch(session, url)
        _refused_and_recorded(tools, session, response, "tool_not_asked", reply_seq)
        assert "web_fetch" in response.json()["error"]["message"]
    assert asked.connections() == 0 and other.connections() == 0


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"method": "POST", "body": base64.b64encode(b"secret").decode()}, "a POST"),
        ({"method": "HEAD"}, "a HEAD"),
        ({"body": base64.b64encode(b"secret").decode()}, "a body"),
        ({"headers": {"x-exfil": "secret"}}, "header x-exfil"),
    ],
)
def test_a_fetch_no_web_tool_makes_is_refused(
    tools: ToolRig, extra: dict[str, Any], why: str
) -> None:
    """The model asked for this URL, but ``web_fetch`` is a GET with no body and no header
    that carries data: anything more was not asked for."""
    session = tools.rig.open_session()
    web = Listener()
    url = f"http://127.0.0.1:{web.port}/"
    reply_seq = committed_reply(tools.rig, session, [("c1", "web_fetch", {"url": url})])
    response = _fetch(session, url, **extra)
    _refused_and_recorded(tools, session, response, "tool_not_asked", reply_seq)
    assert why in response.json()["error"]["message"]
    assert web.connections() == 0


def test_a_call_is_served_once_and_a_refusal_serves_nothing(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    with RawHttpServer(PAGE) as web:
        url = f"http://127.0.0.1:{web.port}/page"
        asked = [("c1", "web_fetch", {"url": url}), ("c2", "web_fetch", {"url": url})]
        reply_seq = committed_reply(tools.rig, session, list(asked))
        refused = _fetch(session, url, method="POST")  # refused: serves nothing
        assert refused.status_code == 409
        first, second = _fetch(session, url), _fetch(session, url)  # c1, then c2
        third = _fetch(session, url)
    assert (first.status_code, second.status_code) == (200, 200)
    _refused_and_recorded(tools, session, third, "tool_call_served", reply_seq)
    assert len(web.received) == 2  # the refused ones were never sent
    admitted = [(r.reply_seq, r.call_id) for r, _ in _fetches(tools, session.session_id)]
    assert admitted == [(reply_seq, None), (reply_seq, "c1"), (reply_seq, "c2"), (reply_seq, None)]
    # a fresh ledger, as after a restart, reads what was served from the record alone
    fresh = ToolCalls(tools.rig.log)
    ask = ToolAsk(WEB, "web_fetch", canonical_json({"url": url}), None, True)
    served = tools.rig.proxy.registry.get(session.session_id)
    assert served is not None
    with pytest.raises(ToolCallServed):
        asyncio.run(fresh.check(served, ask))


def test_a_named_call_must_be_that_call_and_is_served_once(tools: ToolRig) -> None:
    session = tools.rig.open_session()
    with RawHttpServer(PAGE) as web:
        a, b = f"http://127.0.0.1:{web.port}/a", f"http://127.0.0.1:{web.port}/b"
        asked = [("ca", "web_fetch", {"url": a}), ("cb", "web_fetch", {"url": b})]
        reply_seq = committed_reply(tools.rig, session, list(asked))
        wrong = _fetch(session, b, reply_seq=reply_seq, call_id="ca")
        _refused_and_recorded(tools, session, wrong, "tool_not_asked", reply_seq)
        assert "other arguments" in wrong.json()["error"]["message"]
        unknown = _fetch(session, a, reply_seq=reply_seq, call_id="nope")
        _refused_and_recorded(tools, session, unknown, "reply_not_committed", reply_seq)
        right = _fetch(session, b, reply_seq=reply_seq, call_id="cb")
        assert right.status_code == 200
        again = _fetch(session, b, reply_seq=reply_seq, call_id="cb")
        _refused_and_recorded(tools, session, again, "tool_call_served", reply_seq)
        not_a_reply = _fetch(session, a, reply_seq=reply_seq - 1, call_id="ca")
        _refused_and_recorded(tools, session, not_a_reply, "reply_not_committed", reply_seq - 1)
    assert len(web.received) == 1
    request, answer = _fetches(tools, session.session_id)[2]
    assert (request.url, request.reply_seq, request.call_id) == (b, reply_seq, "cb")
    assert answer is not None and answer.outcome == "COMMITTED"


def test_unknown_may_be_sent_again_failed_was_served(tools: ToolRig) -> None:
    """An ``UNKNOWN`` fetch (sent, never answered) may go again, as resume sends it; one that
    surely did not happen is ``FAILED`` and served, whether the egress rule refused it or no
    connection opened: a second is 409, not a second 403 or 502."""
    session = tools.rig.open_session()
    with RawHttpServer(b"") as silent:  # reads the request, closes without a word
        dark = f"http://127.0.0.1:{silent.port}/"
        closed = f"http://127.0.0.1:{_closed_port()}/"
        inside = "http://10.0.0.1/"  # private: the rig's fetch.allow opens only 127.0.0.1/32
        asked = [
            ("c1", "web_fetch", {"url": dark}),
            ("c2", "web_fetch", {"url": inside}),
            ("c3", "web_fetch", {"url": closed}),
        ]
        reply_seq = committed_reply(tools.rig, session, list(asked))
        assert [_fetch(session, dark).status_code for _ in range(2)] == [502, 502]
        assert len(silent.received) == 2
    assert _fetch(session, inside).status_code == 403
    again = _fetch(session, inside)
    _refused_and_recorded(tools, session, again, "tool_call_served", reply_seq)
    assert _fetch(session, closed).status_code == 502
    again = _fetch(session, closed)
    _refused_and_recorded(tools, session, again, "tool_call_served", reply_seq)
    outcomes = [(r.call_id, a and a.outcome) for r, a in _fetches(tools, session.session_id)]
    assert outcomes == [
        ("c1", "UNKNOWN"),
        ("c1", "UNKNOWN"),
        ("c2", "FAILED"),
        (None, "FAILED"),
        ("c3", "FAILED"),
        (None, "FAILED"),
    ]


def test_web_search_is_admitted_as_the_query_the_model_asked_for(tools: ToolRig) -> None:
    with RawHttpServer(PAGE) as web:
        template = f"http://127.0.0.1:{web.port}/search?q={{query}}&n=3"
        session = tools.rig.proxy.registry.open_session(
            [tools.rig.user.recipient], {SEARCH_LABEL: template}
        )
        query = "caf\u00e9 & a/b?"
        url = template.replace("{query}", quote(query, safe=""))
        reply_seq = committed_reply(tools.rig, session, [("s1", "web_search", {"query": query})])
        other = template.replace("{query}", quote("something else", safe=""))
        refused = _fetch(session, other)
        _refused_and_recorded(tools, session, refused, "tool_not_asked", reply_seq)
        assert _fetch(session, url).status_code == 200
    request, _ = _fetches(tools, session.session_id)[-1]
    assert (request.url, request.call_id) == (url, "s1")
    assert len(web.received) == 1


@pytest.mark.parametrize(
    ("url", "query"),
    [
        ("http://s/?q=a%20b&n=1", "a b"),
        ("http://s/?q=&n=1", ""),
        ("http://s/?q=a%2Fb&n=1", "a/b"),
        ("http://s/?q=a/b&n=1", None),  # not the encoding the harness sends
        ("http://s/?q=a%20b", None),  # the suffix is missing
        ("http://s/?q=%ff&n=1", None),  # not UTF-8
        ("http://t/?q=a&n=1", None),
    ],
)
def test_a_search_url_gives_back_exactly_one_query(url: str, query: str | None) -> None:
    assert search_query(url, "http://s/?q={query}&n=1") == query


def test_a_replayed_failed_fetch_answers_the_status_given_live() -> None:
    """A recorded ``FAILED`` fetch's ``status`` is the upstream's (200 for a body over the
    limit): the status answered is the proxy's error's, as it was live."""
    too_large = json.dumps({"error": {"code": "response_too_large", "message": "x"}}).encode()
    refused = json.dumps({"error": {"code": "egress_refused", "message": "x"}}).encode()
    served = json.dumps({"error": {"code": "tool_call_served", "message": "x"}}).encode()
    assert [answered_status(b) for b in (too_large, refused, served)] == [502, 403, 409]
    assert answered_status(b"not json") == 502 and answered_status(b'{"error":{}}') == 502
    assert answered_status(b'{"error":"x"}') == 502 and answered_status(b"[" * 100_000) == 502
    assert answered_status(b'{"error":{"code":"no_such_code"}}', 409) == 409
