"""Resume serves a web tool's call from the record by the call its fetch names (#16 line 6).

The proxy admits a fetch once per reply and call id, so resume must not send again a fetch
whose outcome is known, whatever it was: a ``COMMITTED`` page and a ``FAILED`` refusal are
both served from the record, with the status the proxy answered live; only an ``UNKNOWN``
one goes live again (a GET is idempotent). Fetches recorded before they named their call are
matched by URL, as before. A unit test of one stage: the live toolbox is an in-process double
that counts what would have gone to the proxy (``test_resume.py`` runs the real thing).
"""

from __future__ import annotations

import json
from typing import Any

from egress_proxy.errors import EgressRefused
from harness.resume import _ResumeToolbox
from harness.tools import WEB_FETCH, ToolOutput
from record.digest import Domain, digest
from record.schema import FetchRequest, FetchResponse, Strict

PAGE = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


class CountingLive:
    """Stands in for the live ``ProxyToolbox``: what resume sent live, answered plainly."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, str]] = []

    def call(self, spec: Any, arguments: bytes, *, reply_seq: int, call_id: str) -> ToolOutput:
        self.sent.append((json.loads(arguments)["url"], reply_seq, call_id))
        return ToolOutput("live", "COMMITTED")


def _fetch(
    url: str, outcome: str, *, call_id: str | None, reply_seq: int | None = 3
) -> list[Strict]:
    sent = f"GET / HTTP/1.1\r\nhost: {url}\r\n\r\n".encode()
    request = FetchRequest(
        method="GET",
        url=url,
        request_bytes=sent,
        content_key=digest(Domain.FETCH_REQUEST, sent),
        reply_seq=reply_seq if call_id else None,
        call_id=call_id,
    )
    if outcome == "COMMITTED":
        response = FetchResponse(
            request_seq=0,
            outcome="COMMITTED",
            status=200,
            response_bytes=PAGE,
            response_digest=digest(Domain.FETCH_RESPONSE, PAGE),
        )
    elif outcome == "FAILED":
        error = EgressRefused("10.0.0.1 is private").body()
        response = FetchResponse(
            request_seq=0,
            outcome="FAILED",
            error_bytes=error,
            error_digest=digest(Domain.ERROR, error),
        )
    else:
        response = FetchResponse(request_seq=0, outcome="UNKNOWN")
    return [request, response]


def _sliced(*pairs: list[Strict]) -> list[tuple[int, Strict]]:
    out: list[tuple[int, Strict]] = []
    for request, response in pairs:
        seq = 10 + len(out)
        out.append((seq, request))
        assert isinstance(response, FetchResponse)
        out.append((seq + 1, response.model_copy(update={"request_seq": seq})))
    return out


def _call(box: _ResumeToolbox, url: str, call_id: str) -> ToolOutput:
    return box.call(WEB_FETCH, json.dumps({"url": url}).encode(), reply_seq=3, call_id=call_id)


def test_a_known_outcome_is_served_from_the_record_by_its_call() -> None:
    live = CountingLive()
    sliced = _sliced(
        _fetch("http://a/", "COMMITTED", call_id="c1"),
        _fetch("http://10.0.0.1/", "FAILED", call_id="c2"),
        _fetch("http://b/", "UNKNOWN", call_id="c3"),
    )
    box = _ResumeToolbox(live, sliced, None)  # type: ignore[arg-type]
    page, refused, unknown = (
        _call(box, "http://a/", "c1"),
        _call(box, "http://10.0.0.1/", "c2"),
        _call(box, "http://b/", "c3"),
    )
    assert (page.outcome, page.text) == ("COMMITTED", "HTTP 200\nhello")
    # served as it was answered live: 403 egress_refused, not sent again (the proxy would
    # refuse it: that call of the reply was served)
    assert (refused.outcome, refused.text) == ("FAILED", "fetch failed: 403 egress_refused")
    assert refused.reason.startswith("fetch failed: 403 egress_refused: ")
    assert unknown.text == "live"
    assert live.sent == [("http://b/", 3, "c3")]
    assert (box.served, box.sent_live) == (2, 1)


def test_a_call_the_record_has_no_fetch_for_goes_live() -> None:
    live = CountingLive()
    box = _ResumeToolbox(live, _sliced(_fetch("http://a/", "COMMITTED", call_id="c1")), None)  # type: ignore[arg-type]
    assert _call(box, "http://a/", "c9").text == "live"  # the same URL, another call
    assert live.sent == [("http://a/", 3, "c9")]


def test_a_fetch_recorded_before_it_named_its_call_is_matched_by_url() -> None:
    live = CountingLive()
    old = _sliced(_fetch("http://a/", "COMMITTED", call_id=None))
    box = _ResumeToolbox(live, old, None)  # type: ignore[arg-type]
    assert _call(box, "http://a/", "c1").text == "HTTP 200\nhello"
    assert _call(box, "http://a/", "c2").text == "live"  # each recorded answer serves once
    assert live.sent == [("http://a/", 3, "c2")]
