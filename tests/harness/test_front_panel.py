"""#19 line 1: the panel on the appliance's external address, under ``/panel``, over TLS
with the attested key, beside the data plane's ``/s/…``.

A real appliance (the tiny engine in this process, the real proxy and control plane) with
its front on loopback (``affidavit up --external``): a model call through the front with the
real ``openai`` SDK, then the panel read and driven through the same address, over raw HTTP
and in Debian's Chromium (Playwright). The guest's way (the panel in its own process,
relayed to by the front) is ``tests/enclave_image/test_appliance.py``."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import pytest

from attestation.tls_identity import tls_identity
from harness.session import open_session, user_key
from harness.state import Home
from harness.up import running_appliance
from record.bundle import verify_bundle
from tests.harness.rig import CLOCK, PINS, TINY_SERVED, in_process_engine


@dataclass
class Outside:
    home: Home
    url: str  # the front: https://127.0.0.1:PORT
    panel_url: str  # the panel there, with its token
    stream: str  # a session that made one model call through the front


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outside]:
    home = Home(tmp_path_factory.mktemp("front-panel") / "home")
    with (
        in_process_engine(home) as (_, provider),
        running_appliance(
            home, provider=provider, model=TINY_SERVED, clock=CLOCK, external=("127.0.0.1", 0)
        ) as up,
    ):
        assert up.front is not None and up.panel_url is not None
        state = open_session(home, PINS)
        base = state.base_url.replace(up.appliance.proxy_url, up.front.url) + "/v1"
        with httpx2.Client(verify=False, timeout=60) as tls:
            openai.OpenAI(
                base_url=base, api_key=state.token, http_client=tls
            ).chat.completions.create(
                model=TINY_SERVED,
                messages=[{"role": "user", "content": "Say hello."}],
            )
        yield Outside(home, up.front.url, up.panel_url, state.session_id)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src", "action") and value and not value.startswith("#"):
                self.links.append(value)


def _links(html: str) -> list[str]:
    parser = _Links()
    parser.feed(html)
    return parser.links


def test_the_panel_is_under_panel_on_the_external_address(outside: Outside) -> None:
    """Sign-in, a cookie for ``/panel`` only and Secure, pages whose every link stays under
    ``/panel``; ``/s/…`` at the same address is still the proxy's."""
    assert outside.panel_url.startswith(f"{outside.url}/panel/?token=")
    token = outside.panel_url.rsplit("token=", 1)[1]
    with httpx.Client(verify=False, timeout=30) as client:
        bare = client.get(f"{outside.url}/panel?token={token}")
        assert bare.status_code == 307
        assert bare.headers["location"] == f"/panel/?token={token}"
        assert client.get(f"{outside.url}/panel/").status_code == 401  # no token, no cookie
        signed = client.get(outside.panel_url)
        assert signed.status_code == 303 and signed.headers["location"] == "/panel/"
        cookie = signed.headers["set-cookie"]
        assert "Path=/panel;" in cookie and "Secure" in cookie and "HttpOnly" in cookie
        page = client.get(f"{outside.url}/panel/")
        assert page.status_code == 200
        assert outside.stream in page.text
        links = _links(page.text)
        assert f"/panel/s/{outside.stream}" in links
        assert links and all(link.startswith("/panel/") for link in links), links
        session = client.get(f"{outside.url}/panel/s/{outside.stream}")
        assert session.status_code == 200
        assert all(link.startswith("/panel/") for link in _links(session.text))
        # the same path without /panel is the data plane's: the proxy answers, not the panel
        proxied = client.get(f"{outside.url}/s/{outside.stream}")
        assert "Affidavit panel" not in proxied.text
        assert "error" in proxied.json()


def test_a_post_from_another_origin_is_refused_behind_the_front(outside: Outside) -> None:
    with httpx.Client(verify=False, timeout=30) as client:
        client.get(outside.panel_url)  # the cookie
        target = f"{outside.url}/panel/s/{outside.stream}/calls/verify"
        refused = client.post(target, headers={"origin": "https://elsewhere.example"})
        assert refused.status_code == 403
        own = client.post(target, headers={"origin": outside.url}, follow_redirects=False)
        assert own.status_code == 303
        where = own.headers["location"]
        assert where.startswith(f"/panel/s/{outside.stream}/calls?verify=")
        job = where.rsplit("verify=", 1)[1]
        done = client.get(f"{outside.url}/panel/jobs/{job}", params={"wait": 1}, timeout=120)
        assert done.json()["state"] == "done", done.text


def test_in_a_browser_the_panel_over_the_front_verifies_and_exports(
    outside: Outside, browser: Any, tmp_path: Path
) -> None:
    """Chromium at the external address: the self-signed attested key accepted (as after
    ``affidavit connect``), then sign in, the session, its calls, Verify, and the export."""
    context = browser.new_context(ignore_https_errors=True, accept_downloads=True)
    page = context.new_page()
    served: list[Any] = []
    page.on("response", lambda r: served.append(r.url))
    page.goto(outside.panel_url)
    assert page.url == f"{outside.url}/panel/"
    page.click(f"a.stream[href='/panel/s/{outside.stream}']")
    page.click("#calls-link")
    page.wait_for_selector("#verify-button")
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.click("#verify-button")
    assert posted.value.status == 303  # the browser's own Origin passed the guard
    page.wait_for_selector("#verify-result", timeout=60_000)
    result = page.inner_text("#verify-result")
    assert "reconstructed exactly: 1 of 1 calls" in result, page.inner_text("#verify")
    with page.expect_download() as info:
        page.click("#export")
    archive = tmp_path / "bundle.tar.gz"
    info.value.save_as(archive)
    context.close()
    assert all(url.startswith(f"{outside.url}/panel/") for url in served), served
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "out", filter="data")
    report = verify_bundle(
        tmp_path / "out" / f"{outside.stream}-bundle", key=user_key(outside.home)
    )
    assert report.ok, report


def test_the_panel_shares_the_attested_key(outside: Outside) -> None:
    """The address the panel is served at presents the home's TLS key: the one the evidence
    binds and ``affidavit connect`` pins."""
    import socket
    import ssl

    host, port = outside.url.removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw) as tls,
    ):
        tls.sendall(b"GET /panel/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = tls.recv(65536)
        cert = tls.getpeercert(binary_form=True)
    assert cert == tls_identity(outside.home.root).cert_der
    assert answer.startswith(b"HTTP/1.1 401")
    assert b"x-frame-options: DENY" in answer  # the panel's own headers: the panel answered
