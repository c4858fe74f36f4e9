"""The panel's access and integrity guards, over a real record the log writer signed (no
engine needed): the cookie is a random browser session, never the access token; a POST from
anything but the panel's own pages is refused; values planted in the record cannot break out
of an attribute; and the "inclusion proof verified" mark comes from a proof checked against
the signed checkpoint's root, so a changed entry or a changed proof turns it off.

Raw HTTP goes through httpx to the panel served on loopback by uvicorn; the browser is Debian's
Chromium through Playwright (the ``browser`` fixture)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

pytest.importorskip("jinja2", reason="the panel renders with Jinja2")

import httpx
from fastapi.testclient import TestClient

from harness.panel.app import create_app
from harness.panel.server import RunningPanel, running_panel
from harness.panel.source import ApplianceSource, BundleSource, check_inclusion
from harness.state import Home
from record.bundle import ENTRIES, export_stream
from record.log import Log
from record.schema import PinsSet
from record.seal import KeyPair
from tests.record.conftest import _write_turn

TOKEN = "panel-access-test-token"
STREAM = "planted-stream"
#: what a hostile page or model could put in a record: quotes, a tag, an entity
PLANT = 'x" onmouseover="alert(1)" \'><script>alert(2)</script><img src=x onerror=alert(3)> &quot;'
PINS: dict[str, Any] = {"strict_cache": True, "note": PLANT, "quote": "'", "entity": "&quot;"}
LABELS = {"affidavit/model": PLANT, "affidavit/replays": PLANT}
POSITIONS = 8  # turn.started, 2 model requests and replies, a tool call and result, turn.ended


@dataclass
class Planted:
    home: Home
    key: KeyPair


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planted]:
    """A home whose record holds one stream: labels and pins with the planted values, then a
    tool-using turn, checkpointed by the log writer."""
    home = Home(tmp_path_factory.mktemp("panel-access"))
    key = KeyPair.generate()
    key.write(home.user_key_file)
    with Log.open(home.root / "record.db") as log:
        log.open_stream(STREAM, [key.recipient], labels=LABELS)
        log.append(STREAM, PinsSet(pins=PINS))
        _write_turn(log, STREAM, 0)
    yield Planted(home, key)


@pytest.fixture
def panel(planted: Planted) -> Iterator[RunningPanel]:
    with running_panel(ApplianceSource(planted.home), token=TOKEN) as running:
        yield running


@contextmanager
def signed_in(panel: RunningPanel) -> Iterator[httpx.Client]:
    """A client holding the session cookie the access token opened."""
    with httpx.Client(base_url=panel.base, trust_env=False, timeout=30) as http:
        assert http.get(f"/?token={TOKEN}", follow_redirects=True).status_code == 200
        yield http


# -- the cookie --------------------------------------------------------------------------------


def test_the_cookie_is_a_random_session_value_never_the_access_token(
    panel: RunningPanel,
) -> None:
    with httpx.Client(base_url=panel.base, trust_env=False, timeout=30) as http:
        first = http.get(f"/s/{STREAM}?token={TOKEN}", follow_redirects=False)
        again = http.get(f"/?token={TOKEN}", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == f"/s/{STREAM}"
    header = first.headers["set-cookie"]
    assert TOKEN not in header and TOKEN not in again.headers["set-cookie"]
    flags = [part.strip().lower() for part in header.split(";")]
    assert "httponly" in flags and "samesite=strict" in flags and "path=/" in flags
    assert "secure" not in flags  # served on http: a Secure cookie would never come back
    name, value = flags[0].split("=", 1)
    assert name == panel.app.state.cookie and len(value) >= 40
    assert first.cookies[name] != again.cookies[name]  # each sign-in, a session of its own
    with httpx.Client(base_url=panel.base, trust_env=False, timeout=30) as other:
        other.cookies.set(name, first.cookies[name])
        assert other.get("/").status_code == 200  # the session value is what signs in
        other.cookies.set(name, TOKEN)
        assert other.get("/").status_code == 401  # the token is no cookie value
        other.cookies.set(name, "made-up-session-value")
        assert other.get("/").status_code == 401


def test_on_https_the_cookie_is_secure(planted: Planted) -> None:
    app = create_app(ApplianceSource(planted.home), token=TOKEN)
    client = TestClient(app, base_url="https://panel.example")  # the ASGI scheme is https
    header = client.get(f"/?token={TOKEN}", follow_redirects=False).headers["set-cookie"]
    assert "secure" in [part.strip().lower() for part in header.split(";")]
    assert TOKEN not in header


# -- POSTs from elsewhere -----------------------------------------------------------------------


def _post(http: httpx.Client, headers: dict[str, str]) -> httpx.Response:
    return http.post(f"/s/{STREAM}/t/0/verify", headers=headers, follow_redirects=False)


def _finish(http: httpx.Client, started: httpx.Response) -> None:
    """Wait for the verify job a POST started, so no job outlives the panel."""
    job = started.headers["location"].rsplit("verify=", 1)[1]
    assert http.get(f"/jobs/{job}?wait=1").json()["state"] in ("done", "failed")


def test_a_post_is_refused_unless_it_comes_from_the_panels_own_pages(
    panel: RunningPanel,
) -> None:
    own = panel.base  # http://127.0.0.1:PORT, the origin the browser addressed
    with signed_in(panel) as http:
        for headers, why in (
            ({"sec-fetch-site": "same-site", "origin": own}, "Sec-Fetch-Site: same-site"),
            ({"sec-fetch-site": "cross-site"}, "Sec-Fetch-Site: cross-site"),
            ({"origin": "http://127.0.0.1:1"}, "Origin: http://127.0.0.1:1"),  # another port
            ({"origin": "null"}, "Origin: null"),
            ({"origin": "http://evil.example", "sec-fetch-site": "same-origin"}, "evil.example"),
            ({}, "neither Origin nor Sec-Fetch-Site"),  # the cookie alone is not enough
        ):
            refused = _post(http, headers)
            assert refused.status_code == 403, headers
            assert "location" not in refused.headers
            assert why in refused.text.replace("&#39;", "'"), refused.text
        for headers in (
            {"origin": own, "sec-fetch-site": "same-origin"},  # a form on the panel's page
            {"sec-fetch-site": "none"},  # the user's own navigation
            {"origin": own},  # a browser that sends no Sec-Fetch-Site
        ):
            started = _post(http, headers)
            assert started.status_code == 303, (headers, started.text)
            _finish(http, started)


def test_without_browser_headers_only_the_bearer_token_may_post(panel: RunningPanel) -> None:
    with httpx.Client(base_url=panel.base, trust_env=False, timeout=30) as http:
        bearer = {"authorization": f"Bearer {TOKEN}"}
        started = _post(http, bearer)  # curl with the token: no Origin, no Sec-Fetch-Site
        assert started.status_code == 303
        http.headers.update(bearer)
        _finish(http, started)
        cross = _post(http, {"origin": "http://evil.example"})
        assert cross.status_code == 403 and "evil.example" in cross.text
        wrong = _post(http, {"authorization": "Bearer not-it"})
        assert wrong.status_code == 401


class _HostilePage(BaseHTTPRequestHandler):
    """A page on another port of the same host: same site, other origin."""

    target = ""

    def do_GET(self) -> None:
        body = (
            f'<!doctype html><form method="post" action="{self.target}">'
            '<button id="go" type="submit">win a prize</button></form>'
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def hostile(panel: RunningPanel) -> Iterator[str]:
    handler = type("Hostile", (_HostilePage,), {"target": f"{panel.base}/s/{STREAM}/t/0/verify"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(30)


def test_in_a_browser_a_form_on_another_port_is_refused_and_the_panels_own_is_not(
    panel: RunningPanel, hostile: str, browser: Any
) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(panel.url)  # signed in: the SameSite=Strict cookie is set for 127.0.0.1
    page.goto(hostile)
    with page.expect_response(lambda r: r.url.endswith("/verify")) as posted:
        page.click("#go")
    assert posted.value.status == 403  # the cookie went along (same site); the guard refused
    page.wait_for_load_state()
    assert "refused a cross-site request (Sec-Fetch-Site: same-site)" in page.inner_text("main")
    page.goto(f"{panel.base}/s/{STREAM}/t/0")
    with page.expect_response(lambda r: "/verify" in r.url and r.request.method == "POST") as own:
        page.click("#verify-button")
    assert own.value.status == 303
    page.wait_for_selector("#verify")
    assert "verify=" in page.url
    job = page.url.rsplit("verify=", 1)[1]
    context.close()
    with httpx.Client(base_url=panel.base, trust_env=False, timeout=60) as http:
        http.headers["authorization"] = f"Bearer {TOKEN}"
        assert http.get(f"/jobs/{job}?wait=1").json()["state"] in ("done", "failed")


# -- values in attributes -----------------------------------------------------------------------


class _Elements(HTMLParser):
    """Every start tag of a page with its attributes, as a browser's tokenizer reads them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)


def _elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Elements()
    parser.feed(html)
    parser.close()
    return parser.elements


def test_planted_quotes_and_tags_stay_inside_their_attributes_over_raw_http(
    panel: RunningPanel,
) -> None:
    with signed_in(panel) as http:
        pages = {path: http.get(path).text for path in ("/", f"/s/{STREAM}", f"/s/{STREAM}/t/0")}
    for path, html in pages.items():
        elements = _elements(html)
        scripts = [attrs for tag, attrs in elements if tag == "script"]
        assert scripts == [{"src": "/static/panel.js", "defer": None}], path
        assert not [tag for tag, _ in elements if tag == "img"], path
        handlers = [(t, n) for t, attrs in elements for n in attrs if n.startswith("on")]
        assert handlers == [], path
        badges = [a for t, a in elements if t == "span" and a.get("class") == "badge pinned"]
        assert badges, path
        for badge in badges:  # the whole JSON, parsed back exactly: nothing broke out
            assert json.loads(badge["title"] or "") == PINS, path
    listing = [a.get("href") for t, a in _elements(pages["/"]) if t == "a"]
    assert f"/s/{PLANT}" in listing  # the planted "replays" label, whole, inside its href
    session = [a.get("href") for t, a in _elements(pages[f"/s/{STREAM}"]) if t == "a"]
    assert f"/s/{PLANT}/calls" in session


def test_in_a_browser_the_planted_values_add_no_element_and_no_handler(
    panel: RunningPanel, browser: Any
) -> None:
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(panel.url)
    for path in ("/", f"/s/{STREAM}", f"/s/{STREAM}/t/0"):
        page.goto(panel.base + path)
        found = page.evaluate(
            """() => ({
              scripts: [...document.scripts].map(s => s.getAttribute('src')),
              images: document.images.length,
              handlers: [...document.querySelectorAll('*')].flatMap(
                e => [...e.attributes].map(a => a.name).filter(n => n.startsWith('on'))),
              titles: [...document.querySelectorAll('.badge.pinned')].map(e => e.title),
            })"""
        )
        assert found["scripts"] == ["/static/panel.js"], path
        assert found["images"] == 0 and found["handlers"] == [], path
        assert found["titles"] and all(json.loads(t) == PINS for t in found["titles"]), path
    page.hover(".badge.pinned")
    page.close()
    assert dialogs == []


# -- the inclusion-proof mark -------------------------------------------------------------------


def test_every_position_is_proven_against_the_signed_root(panel: RunningPanel) -> None:
    with signed_in(panel) as http:
        page = http.get(f"/s/{STREAM}/t/0").text
    assert page.count('<details class="position') == POSITIONS
    assert page.count("✓ inclusion proof verified") == POSITIONS


def test_an_entry_changed_after_signing_turns_every_mark_off(
    planted: Planted, tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle"
    export_stream(planted.home.root / "record.db", STREAM, bundle)
    lines = (bundle / ENTRIES).read_bytes().split(b"\n")
    assert b"onmouseover" in lines[0]  # stream.opened, in clear: its labels
    lines[0] = lines[0].replace(b"alert(1)", b"alert(7)", 1)  # same length, still parses
    (bundle / ENTRIES).write_bytes(b"\n".join(lines))
    client = TestClient(create_app(BundleSource(bundle, planted.key), token=TOKEN))
    client.headers["authorization"] = f"Bearer {TOKEN}"
    page = client.get(f"/s/{STREAM}/t/0").text
    assert page.count('<details class="position') == POSITIONS
    assert "✓ inclusion proof verified" not in page
    assert page.count("✗ proof does not verify") == POSITIONS  # not "not yet in a checkpoint"
    assert page.count("does not verify against the signed root") == POSITIONS


def test_a_changed_proof_or_leaf_does_not_verify(planted: Planted) -> None:
    record = ApplianceSource(planted.home).record(STREAM)
    (cp, signer), *_ = record.signed()
    index = 3  # the turn's first model reply
    good = record.position(index)
    assert good.verified and good.checkpoint_size == cp.size
    proof = [bytes.fromhex(h) for h in good.proof]
    line = record.rows[good.index].line
    assert check_inclusion(good, line, proof, cp, signer).verified
    flipped = [proof[0][:-1] + bytes([proof[0][-1] ^ 1]), *proof[1:]]
    bad_proof = check_inclusion(record.position(index), line, flipped, cp, signer)
    assert not bad_proof.verified and "does not match expected root" in bad_proof.detail
    short = check_inclusion(record.position(index), line, proof[:-1], cp, signer)
    assert not short.verified and "wrong proof size" in short.detail
    other_line = record.rows[good.index + 1].line
    bad_leaf = check_inclusion(record.position(index), other_line, proof, cp, signer)
    assert not bad_leaf.verified and bad_leaf.leaf_hash != good.leaf_hash


#: What an upstream may have sent, recorded byte for byte, that once failed the turn page (500)
#: and its Verify: a reply escaping a lone surrogate, an MCP result whose ``content`` is no
#: list, and one whose text is a lone surrogate (found by an adversarial review).
HOSTILE = {
    "reply-lone-surrogate": {
        "final": b'data: {"choices":[{"delta":{"content":"hi \\ud800 there"}}]}\n\ndata: [DONE]\n\n'
    },
    "result-content-int": {"result": b'{"content":5}'},
    "result-text-surrogate": {"result": b'{"content":[{"type":"text","text":"\\udc80"}]}'},
}


def test_hostile_recorded_bytes_show_on_the_turn_page_and_verify(tmp_path: Path) -> None:
    home = Home(tmp_path)
    key = KeyPair.generate()
    key.write(home.user_key_file)
    with Log.open(home.root / "record.db") as log:
        for stream, planted in HOSTILE.items():
            log.open_stream(stream, [key.recipient])
            log.append(stream, PinsSet(pins={"strict_cache": True}))
            _write_turn(log, stream, 0, **planted)
    with running_panel(ApplianceSource(home), token=TOKEN) as panel, signed_in(panel) as http:
        for stream in HOSTILE:
            page = http.get(f"/s/{stream}/t/0")
            assert page.status_code == 200, (stream, page.text[:200])
            own = {"origin": panel.base}  # as the panel's own page posts it
            started = http.post(f"/s/{stream}/t/0/verify", headers=own, follow_redirects=False)
            assert started.status_code == 303, (stream, started.text[:200])
            _finish(http, started)
            shown = http.get(started.headers["location"])
            assert shown.status_code == 200, (stream, shown.text[:200])
        assert "\\ud800" in http.get("/s/reply-lone-surrogate/t/0").text  # shown as its escape
        assert "\\udc80" in http.get("/s/result-text-surrogate/t/0").text


def test_a_bundle_naming_a_stream_no_record_could_hold_shows_none(
    planted: Planted, tmp_path: Path
) -> None:
    """A bundle is outside input: its ``bundle.json`` naming a stream with a line break (which
    reached the export's file name, and the server then dropped the connection) gives a
    panel with no stream and a plain 404, as an appliance's record would."""
    bundle = tmp_path / "bundle"
    export_stream(planted.home.root / "record.db", STREAM, bundle)
    index = json.loads((bundle / "bundle.json").read_bytes())
    hostile = "a\r\nSet-Cookie: x=1"
    (bundle / "bundle.json").write_text(json.dumps({**index, "stream": hostile}))
    source = BundleSource(bundle, planted.key)
    with running_panel(source, token=TOKEN) as panel, signed_in(panel) as http:
        assert "Set-Cookie" not in http.get("/").text
        exported = http.get(f"/s/{quote(hostile, safe='')}/export.tar.gz")
        assert exported.status_code == 404
