"""``GET /metrics``, scraped after real calls through a real proxy and parsed as Prometheus text.

- Calls, outcomes (as recorded: ``COMMITTED``, ``FAILED``, ``UNKNOWN``) and bytes count per
  upstream, whatever the route: streamed, not, a provider error, a cut, a malformed body, an
  upstream that cannot be reached.
- Added latency and added time to first byte are histograms per upstream, observed once per
  reply the client read to its end, never negative.
- The metrics live in the app's own registry, not the process-global one, and the route is
  outside the session paths: it needs no token and serves only GET.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import prometheus_client
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from egress_proxy.server import ProxyServer
from record.log import Log
from record.seal import KeyPair
from tests.egress_proxy.loopback import ENV, Rig, Script, proxy_config

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
STREAMED = b'{"model":"m","messages":[],"stream":true}'
MESSAGES = b'{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
EVENTS = [
    b'data: {"id":"s","choices":[{"index":0,"delta":{"content":"%d"}}]}\n\n' % i for i in range(3)
]
REPLY = b'{"id":"r","object":"chat.completion","choices":[]}'


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, sorted labels) -> value."""
    response = httpx.get(url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: list[Sample] = [
        s for family in text_string_to_metric_families(response.text) for s in family.samples
    ]
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}


def value(
    scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(
    url: str, name: str, at_least: float, **labels: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Outcomes are counted when the reply is committed, which may trail the client a little."""
    deadline = time.monotonic() + 10
    while True:
        scraped = scrape(url)
        if value(scraped, name, **labels) >= at_least or time.monotonic() > deadline:
            return scraped
        time.sleep(0.02)


def post(client: httpx.Client, url: str, body: bytes, token: str) -> httpx.Response:
    return client.post(url, content=body, headers={"authorization": f"Bearer {token}"})


def test_calls_outcomes_bytes_and_latency_per_upstream(fresh: Rig) -> None:
    rig = fresh
    url = rig.proxy.url
    before = scrape(url)
    session = rig.open_session()
    chat = f"{session.openai_base_url}/chat/completions"
    messages = f"{session.anthropic_base_url}/v1/messages"
    rig.upstream.queue.extend(
        [
            Script(chunks=[REPLY]),  # non-streamed, COMMITTED
            Script(chunks=[*EVENTS, b"data: [DONE]\n\n"], content_type="text/event-stream"),
            Script(chunks=[b'{"error":"busy"}'], status=503),  # FAILED
            Script(chunks=[EVENTS[0], EVENTS[1][:10]], content_type="text/event-stream", cut=True),
            Script(chunks=[b'{"id":"msg","type":"message","content":[]}']),  # anthropic
        ]
    )
    with httpx.Client(timeout=20) as client:
        assert post(client, chat, CHAT, session.token).status_code == 200
        streamed = post(client, chat, STREAMED, session.token)
        assert streamed.status_code == 200 and b"affidavit" in streamed.content
        assert post(client, chat, CHAT, session.token).status_code == 503
        with contextlib.suppress(httpx.HTTPError):  # the cut reaches the client as a cut
            post(client, chat, STREAMED, session.token)
        assert post(client, chat, b"{not json", session.token).status_code == 400
        response = client.post(messages, content=MESSAGES, headers={"x-api-key": session.token})
        assert response.status_code == 200
    after = wait_for(url, "affidavit_proxy_outcomes_total", 1, upstream="openai", outcome="UNKNOWN")

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("affidavit_proxy_calls_total", upstream="openai") == 5
    assert delta("affidavit_proxy_calls_total", upstream="anthropic") == 1
    outcomes = "affidavit_proxy_outcomes_total"
    assert delta(outcomes, upstream="openai", outcome="COMMITTED") == 2
    assert delta(outcomes, upstream="openai", outcome="FAILED") == 2  # the 503 and the malformed
    assert delta(outcomes, upstream="openai", outcome="UNKNOWN") == 1
    assert delta(outcomes, upstream="anthropic", outcome="COMMITTED") == 1

    received = 2 * len(CHAT) + 2 * len(STREAMED)  # the four sent upstream
    by = "affidavit_proxy_bytes_total"
    assert delta(by, upstream="openai", direction="request_in") == received + len(b"{not json")
    assert delta(by, upstream="openai", direction="request_out") == received
    upstream_bytes = len(REPLY) + sum(map(len, EVENTS)) + 14 + 16 + len(EVENTS[0]) + 10
    assert delta(by, upstream="openai", direction="response_in") == upstream_bytes
    # Delivered: the annotation makes the committed replies longer than what came upstream.
    assert delta(by, upstream="openai", direction="response_out") > len(REPLY) + 16
    assert delta(by, upstream="anthropic", direction="request_out") == len(MESSAGES)

    for histogram in (
        "affidavit_proxy_added_latency_seconds",
        "affidavit_proxy_added_ttfb_seconds",
    ):
        # Observed for the replies read to their end: two committed and the 503.
        assert delta(f"{histogram}_count", upstream="openai") == 3, histogram
        assert delta(f"{histogram}_count", upstream="anthropic") == 1, histogram
        total = delta(f"{histogram}_sum", upstream="openai")
        assert 0 < total < 3 * 5.0, (histogram, total)
        assert delta(f"{histogram}_bucket", upstream="openai", le="+Inf") == 3


def test_an_unreachable_upstream_counts_unknown(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    with (
        Log.open(tmp_path / "r.db", appliance_key=KeyPair.generate()) as log,
        ProxyServer(proxy_config(dead), log, env=ENV) as proxy,
    ):
        session = proxy.registry.open_session([KeyPair.generate().recipient])
        with httpx.Client(timeout=20) as client:
            response = post(
                client, f"{session.openai_base_url}/chat/completions", CHAT, session.token
            )
        assert response.status_code == 502
        scraped = scrape(proxy.url)
    assert value(scraped, "affidavit_proxy_calls_total", upstream="openai") == 1
    assert (
        value(scraped, "affidavit_proxy_outcomes_total", upstream="openai", outcome="UNKNOWN") == 1
    )
    assert value(scraped, "affidavit_proxy_added_latency_seconds_count", upstream="openai") == 0


def test_the_registry_is_the_apps_own_and_the_route_needs_no_session(fresh: Rig) -> None:
    url = fresh.proxy.url
    assert not any(name.startswith("affidavit_proxy") for name in _global_names()), (
        "the process-global registry holds none of the proxy's metrics"
    )
    assert fresh.proxy.app.state.metrics.registry is not prometheus_client.REGISTRY
    assert ("affidavit_proxy_calls_total", ()) not in scrape(url)  # labelled: no bare sample
    response = httpx.post(url + "/metrics", content=b"")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def _global_names() -> Iterator[str]:
    for family in text_string_to_metric_families(prometheus_client.generate_latest().decode()):
        yield family.name


def test_added_latency_counts_from_the_first_bytes_of_the_request(fresh: Rig) -> None:
    """The clock starts when the request's first bytes reach the server, not when its head
    is parsed: a head that trickles in over 0.3 s (the proxy's own HTTP server reading it)
    is time the client waited, and the histogram says so."""
    rig = fresh
    url = rig.proxy.url
    session = rig.open_session()
    rig.upstream.queue.append(Script(chunks=[REPLY]))
    before = scrape(url)
    target = httpx.URL(f"{session.openai_base_url}/chat/completions")
    head = (
        f"POST {target.raw_path.decode()} HTTP/1.1\r\nhost: {target.host}:{target.port}\r\n"
        f"authorization: Bearer {session.token}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(CHAT)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((target.host, target.port), timeout=20) as sock:
        sock.sendall(head[:20])  # the request line, cut short
        time.sleep(0.3)
        sock.sendall(head[20:] + CHAT)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    after = wait_for(
        url, "affidavit_proxy_outcomes_total", 1, upstream="openai", outcome="COMMITTED"
    )
    name = "affidavit_proxy_added_latency_seconds"
    added = value(after, f"{name}_sum", upstream="openai") - value(
        before, f"{name}_sum", upstream="openai"
    )
    assert 0.3 <= added < 5.0, added


def test_added_latency_counts_from_the_requests_arrival(fresh: Rig) -> None:
    """The call starts when the request reaches the app, not once its body is parsed: a body
    that trickles in over 0.3 s (read by the proxy before it dials) is time the client waited
    on the proxy, and the histogram says so; the upstream's own time is not in it."""
    rig = fresh
    url = rig.proxy.url
    session = rig.open_session()
    rig.upstream.queue.append(Script(chunks=[REPLY]))
    before = scrape(url)

    def trickle() -> Iterator[bytes]:
        half = len(CHAT) // 2
        yield CHAT[:half]
        time.sleep(0.3)
        yield CHAT[half:]

    with httpx.Client(timeout=20) as client:
        response = client.post(
            f"{session.openai_base_url}/chat/completions",
            content=trickle(),
            headers={"authorization": f"Bearer {session.token}"},
        )
    assert response.status_code == 200
    after = wait_for(
        url, "affidavit_proxy_outcomes_total", 1, upstream="openai", outcome="COMMITTED"
    )
    name = "affidavit_proxy_added_latency_seconds"
    count = value(after, f"{name}_count", upstream="openai") - value(
        before, f"{name}_count", upstream="openai"
    )
    added = value(after, f"{name}_sum", upstream="openai") - value(
        before, f"{name}_sum", upstream="openai"
    )
    assert count == 1
    assert 0.3 <= added < 5.0, added


def test_the_upstreams_own_time_is_not_added(fresh: Rig) -> None:
    """An upstream that takes 0.6 s over its reply (0.3 s before its first byte, 0.3 s before
    its last) costs the client that time with or without the proxy: the histograms leave it
    out, to the first byte and to the last."""
    rig = fresh
    url = rig.proxy.url
    session = rig.open_session()
    rig.upstream.on_request = lambda _received: time.sleep(0.3)
    rig.upstream.queue.append(Script(chunks=[REPLY[:10], REPLY[10:]], delay_s=0.3))
    before = scrape(url)
    with httpx.Client(timeout=20) as client:
        started = time.monotonic()
        response = post(client, f"{session.openai_base_url}/chat/completions", CHAT, session.token)
        waited = time.monotonic() - started
    assert response.status_code == 200 and waited >= 0.6
    after = wait_for(
        url, "affidavit_proxy_outcomes_total", 1, upstream="openai", outcome="COMMITTED"
    )
    for name in ("affidavit_proxy_added_latency_seconds", "affidavit_proxy_added_ttfb_seconds"):
        count = value(after, f"{name}_count", upstream="openai") - value(
            before, f"{name}_count", upstream="openai"
        )
        added = value(after, f"{name}_sum", upstream="openai") - value(
            before, f"{name}_sum", upstream="openai"
        )
        assert count == 1, name
        assert 0 < added < waited - 0.25, (name, added, waited)
