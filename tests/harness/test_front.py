"""#19: the appliance's external TLS address (``affidavit up --external``, ``harness.front``).

A real appliance (the tiny engine in this process, the real proxy and control plane) with
its front on loopback: TLS with the home's own key, ``/attestation`` answered there, every
other request relayed to the proxy unchanged, streamed. No TEE exists here: with none given,
``/attestation`` says so (503 ``no_tee``); the attested path with a TEE double is
``test_front_attested.py``."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from attestation.tls_identity import CERT_FILE, KEY_FILE, spki_sha256_of, tls_identity
from harness.session import open_session, read_bodies, user_key
from harness.state import Home
from harness.up import running_appliance
from record.schema import ModelRequest, ModelResponse
from tests.harness.rig import CLOCK, PINS, TINY_SERVED, in_process_engine

REPO = Path(__file__).resolve().parents[2]


def _served_cert(url: str) -> bytes:
    """The certificate the server at ``url`` presents, DER."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw) as tls,
    ):
        cert = tls.getpeercert(binary_form=True)
    assert cert is not None
    return cert


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Home, str, str]]:
    home = Home(tmp_path_factory.mktemp("front") / "home")
    with (
        in_process_engine(home) as (_, provider),
        running_appliance(
            home,
            provider=provider,
            model=TINY_SERVED,
            clock=CLOCK,
            external=("127.0.0.1", 0),
        ) as up,
    ):
        assert up.front is not None
        yield home, up.front.url, up.appliance.proxy_url


def test_the_tls_key_is_the_homes_kept_private_and_served(front: tuple[Home, str, str]) -> None:
    home, url, _ = front
    assert (home.root / KEY_FILE).stat().st_mode & 0o777 == 0o600
    kept = tls_identity(home.root)
    served = _served_cert(url)
    assert served == kept.cert_der
    assert spki_sha256_of(served) == kept.spki_sha256
    assert home.appliance().external_url == url


def test_attestation_on_a_machine_with_no_tee_says_so(front: tuple[Home, str, str]) -> None:
    _, url, _ = front
    with httpx.Client(verify=False, timeout=10) as client:  # the key is not CA-vouched
        reply = client.get(f"{url}/attestation", params={"nonce": "ab" * 32})
        assert reply.status_code == 503
        assert reply.json()["error"]["code"] == "no_tee"
        for bad in ("", "ab" * 31, "zz" * 32, "ab" * 33):
            reply = client.get(f"{url}/attestation", params={"nonce": bad})
            assert reply.status_code == 400, bad
            assert reply.json()["error"]["code"] == "bad_nonce"
        reply = client.post(f"{url}/attestation", params={"nonce": "ab" * 32})
        assert reply.status_code == 405


def test_a_turn_through_the_front_is_the_proxys_byte_for_byte(
    front: tuple[Home, str, str],
) -> None:
    """The same pinned request through the front and straight to the proxy: the same reply
    (pinned: a pure function of the request), both recorded; a stream arrives as a stream, annotation included."""
    home, url, proxy_url = front
    state = open_session(home, PINS)
    outside = state.base_url.replace(proxy_url, url) + "/v1"
    assert outside.startswith("https://")
    messages = [{"role": "user", "content": "Say hello."}]
    with httpx.Client(verify=False, timeout=60) as tls_client:
        via_front = openai.OpenAI(
            base_url=outside, api_key=state.token, http_client=tls_client
        ).chat.completions.with_raw_response.create(model=TINY_SERVED, messages=messages)  # type: ignore[arg-type]
        direct = openai.OpenAI(
            base_url=f"{state.base_url}/v1", api_key=state.token
        ).chat.completions.with_raw_response.create(model=TINY_SERVED, messages=messages)  # type: ignore[arg-type]
        # the same reply; only the proxy's annotation differs (its record seq, checkpoint)
        a, b = json.loads(via_front.http_response.content), json.loads(direct.http_response.content)
        assert a.pop("affidavit")["seq"] != b.pop("affidavit")["seq"]
        assert a == b
        stream = openai.OpenAI(
            base_url=outside, api_key=state.token, http_client=tls_client
        ).chat.completions.create(model=TINY_SERVED, messages=messages, stream=True)  # type: ignore[arg-type]
        chunks = list(stream)
    assert len(chunks) > 2
    # the proxy's own annotation event (choices: []) came through the front
    assert any(not c.choices for c in chunks)
    bodies = [b for _, b in read_bodies(home.appliance().store, state.session_id, user_key(home))]
    assert sum(isinstance(b, ModelRequest) for b in bodies) == 3
    assert sum(isinstance(b, ModelResponse) for b in bodies) == 3


def test_a_wrong_token_is_the_proxys_answer_through_the_front(
    front: tuple[Home, str, str],
) -> None:
    home, url, proxy_url = front
    state = open_session(home, PINS)
    outside = state.base_url.replace(proxy_url, url) + "/v1"
    with httpx.Client(verify=False, timeout=30) as client:
        reply = client.post(
            f"{outside}/chat/completions",
            headers={"authorization": "Bearer wrong"},
            json={"model": TINY_SERVED, "messages": []},
        )
    assert reply.status_code == 401
    assert "code" in json.dumps(reply.json())


def test_the_key_outlives_the_appliance(tmp_path: Path) -> None:
    first = tls_identity(tmp_path)
    again = tls_identity(tmp_path)
    assert again == first
    (tmp_path / KEY_FILE).chmod(0o644)
    with pytest.raises(ValueError, match="others can read it"):
        tls_identity(tmp_path)
    (tmp_path / KEY_FILE).chmod(0o600)
    other = tmp_path / "other"
    other.mkdir()
    tls_identity(other)
    (tmp_path / CERT_FILE).write_bytes((other / CERT_FILE).read_bytes())
    with pytest.raises(ValueError, match="is not the certificate of"):
        tls_identity(tmp_path)
    (tmp_path / CERT_FILE).write_text("not a certificate")
    with pytest.raises(ValueError, match="the TLS key or certificate"):
        tls_identity(tmp_path)


def test_up_on_a_taken_external_address_is_a_usage_error(tmp_path: Path) -> None:
    """``up --external`` on an address another process listens on: 2, in one line, and
    nothing of the appliance is left running (no ``appliance.json``)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    home = tmp_path / "home"
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "affidavit",
                "up",
                "--home",
                str(home),
                "--provider-url",
                "http://127.0.0.1:9",
                "--model-name",
                "nobody",
                "--external",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    finally:
        taken.close()
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (home / "appliance.json").exists()
    bad = subprocess.run(
        [sys.executable, "-m", "affidavit", "up", "--home", str(home), "--external", "8443"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert bad.returncode == 2
    assert "HOST:PORT" in bad.stderr


def test_the_panel_over_tls_is_behind_the_same_key(front: tuple[Home, str, str]) -> None:
    """``affidavit panel --tls``: the panel with the home's key, ``/attestation`` beside it."""
    from harness.front import home_identity
    from harness.panel.server import running_panel
    from harness.panel.source import ApplianceSource

    home, url, _ = front
    opened = open_session(home, PINS).session_id
    key = tls_identity(home.root)
    identity = home_identity(home, key)
    assert identity.tls_spki_sha256 == key.spki_sha256
    with running_panel(ApplianceSource(home, None), tls=(identity, key)) as panel:
        assert panel.base.startswith("https://127.0.0.1:")
        assert _served_cert(panel.base) == _served_cert(url) == key.cert_der
        with httpx.Client(verify=False, timeout=30, follow_redirects=True) as client:
            page = client.get(panel.url)
            assert page.status_code == 200
            assert opened in page.text  # the home's record, read through the TLS panel
            reply = client.get(f"{panel.base}/attestation", params={"nonce": "cd" * 32})
            assert reply.status_code == 503
            assert reply.json()["error"]["code"] == "no_tee"


class _BrokenTee:
    """A TEE whose driver fails (a stand-in: no TEE exists here)."""

    def collect(self, report_data: bytes, nonce: bytes) -> list[object]:
        raise OSError(5, "Input/output error")


def test_a_failing_tee_and_a_gone_proxy_are_said_not_traced(tmp_path: Path) -> None:
    from attestation.channel import ChannelIdentity
    from attestation.relay import Relay
    from harness.front import Attested, Front

    key = tls_identity(tmp_path)
    identity = ChannelIdentity("log+key", b"\x01" * 32, key.spki_sha256)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: nothing answers there
    gone = f"http://127.0.0.1:{dead.getsockname()[1]}"
    try:
        with (
            Front("127.0.0.1", 0, key, Attested(Relay(gone), identity, _BrokenTee())) as front,
            httpx.Client(verify=False, timeout=30) as client,
        ):
            reply = client.get(f"{front.url}/attestation", params={"nonce": "ef" * 32})
            assert reply.status_code == 503
            assert reply.json()["error"]["code"] == "evidence_failed"
            assert "Input/output error" in reply.json()["error"]["message"]
            reply = client.post(f"{front.url}/s/x/v1/chat/completions", json={})
            assert reply.status_code == 502
            assert reply.json()["error"]["code"] == "upstream_unreachable"
    finally:
        dead.close()
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ValueError, match="another TLS key"):
        Front("127.0.0.1", 0, tls_identity(other), Attested(Relay(gone), identity, _BrokenTee()))


def test_a_client_idle_on_a_kept_alive_connection_does_not_hold_a_stopping_front(
    tmp_path: Path,
) -> None:
    """Closing TLS waits for the peer's close_notify (asyncio: 30 s), which an idle client
    never sends: the front drops idle connections instead, and stops within its wait."""
    from attestation.channel import ChannelIdentity
    from attestation.relay import Relay
    from harness.front import Attested, Front

    key = tls_identity(tmp_path)
    identity = ChannelIdentity("log+key", b"\x01" * 32, key.spki_sha256)
    front = Front(
        "127.0.0.1", 0, key, Attested(Relay("http://127.0.0.1:9"), identity, _BrokenTee())
    )
    with front, httpx.Client(verify=False, timeout=30) as client:
        reply = client.get(f"{front.url}/attestation", params={"nonce": "ef" * 32})
        assert reply.status_code == 503  # answered; the connection stays open, idle
        front.stop(timeout=10)  # well under the 30 s a close_notify may be waited for
        assert not front.running
        with pytest.raises(httpx.TransportError):  # the idle connection is gone
            client.get(f"{front.url}/attestation", params={"nonce": "ef" * 32})


def test_session_new_names_the_outside_address(
    front: tuple[Home, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from affidavit.cli import main

    home, url, proxy_url = front
    assert main(["session", "new", "--home", str(home.root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["external_base_url"] == f"{url}/s/{doc['session']}"
    assert doc["base_url"] == f"{proxy_url}/s/{doc['session']}"
    assert main(["session", "new", "--home", str(home.root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    outside = next(line for line in lines if line.startswith("outside  "))
    assert f"{url}/s/{lines[0]}" in outside and "affidavit connect" in outside


def test_connect_refuses_an_appliance_with_no_tee(
    front: tuple[Home, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a user of a developer's ``up --external`` sees: refused, saying why, exit 1."""
    from affidavit.cli import main
    from tests.attestation.channel_double import write_published

    _, url, _ = front
    published = write_published(tmp_path, [bytes(48)])
    code = main(
        [
            "connect",
            url,
            "--published",
            str(published),
            "--release-key",
            str(tmp_path / "release.pub"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert "503: no_tee: this appliance runs in no TEE" in err


def test_the_front_relays_only_the_sessions_routes(front: tuple[Home, str, str]) -> None:
    """The proxy's ``/metrics`` (every session's counts) stays inside: only ``/s/…`` passes,
    and no ``..`` segment takes a path out of it."""
    _, url, proxy_url = front
    with httpx.Client(verify=False, timeout=30) as client:
        assert httpx.get(f"{proxy_url}/metrics").status_code == 200  # there, on loopback
        for path in ("/metrics", "/", "/s/../metrics", "/s/%2e%2e/metrics", "/s/./x/../../metrics"):
            reply = client.get(url + path)
            assert reply.status_code == 404, path
            assert reply.json()["error"]["code"] == "not_found", path


def _tls_to(url: str, source: str = "127.0.0.1") -> ssl.SSLSocket:
    """A TLS connection to ``url`` from the loopback address ``source``, handshake done,
    nothing sent."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    return context.wrap_socket(raw)


def _ended(conn: ssl.SSLSocket, within: float) -> bool:
    """Whether the server ends ``conn`` within ``within`` seconds (what it sent is read)."""
    conn.settimeout(within)
    try:
        while conn.recv(4096):
            pass
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        pass
    return True


class _SlowUpstream(http.server.BaseHTTPRequestHandler):
    """Answers every GET after 3 s: longer than the front below lets a client stay silent."""

    def do_GET(self) -> None:
        time.sleep(3)
        body = b"late but whole"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_a_silent_or_trickling_client_loses_its_connection(tmp_path: Path) -> None:
    """uvicorn times out a connection only after a reply, and only until its next byte: a
    peer that said nothing, or trickled a request head, held its socket for ever. The front
    drops both after its keep-alive time, and a request under way longer still finishes."""
    from attestation.channel import ChannelIdentity
    from attestation.relay import Relay
    from harness.front import SESSION_ROUTES, Attested, Front

    key = tls_identity(tmp_path)
    identity = ChannelIdentity("log+key", b"\x01" * 32, key.spki_sha256)
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowUpstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    relay = Relay(f"http://127.0.0.1:{upstream.server_port}", only=SESSION_ROUTES)
    front = Front("127.0.0.1", 0, key, Attested(relay, identity, _BrokenTee()), keep_alive_s=1)
    try:
        with front, httpx.Client(verify=False, timeout=30) as client:
            silent, trickling = _tls_to(front.url), _tls_to(front.url)
            head = b"GET /attestation HTTP/1.1\r\nhost: front\r\nx-pad: " + b"a" * 64
            trickling.settimeout(0.25)
            sent = 0
            for byte in head:  # a byte every 0.25 s: 16 s for the whole head, were it kept
                try:
                    trickling.sendall(bytes([byte]))
                    if trickling.recv(1) == b"":
                        break
                except TimeoutError:
                    sent += 1
                    continue
                except (ConnectionError, ssl.SSLError):
                    break
            assert sent < len(head), "the trickling client was never dropped"
            assert _ended(silent, within=5), "a client that sent nothing kept its connection"

            late = client.get(f"{front.url}/s/any/v1/models")  # 3 s, past the keep-alive time
            assert (late.status_code, late.text) == (200, "late but whole")
            answered = client.get(f"{front.url}/attestation", params={"nonce": "ef" * 32})
            assert answered.status_code == 503  # a prompt client is served
    finally:
        upstream.shutdown()
        upstream.server_close()


def test_a_peer_that_never_starts_its_handshake_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket that never sends its ClientHello is counted by no cap (the protocol sees a
    connection only once TLS is up): asyncio would keep it 60 s, the listener keeps it
    ``HANDSHAKE_S`` (here 1 s), and a client that does shake hands is still served."""
    from attestation.channel import ChannelIdentity
    from attestation.relay import Relay
    from harness import tls_h11
    from harness.front import Attested, Front

    monkeypatch.setattr(tls_h11, "HANDSHAKE_S", 1.0)
    key = tls_identity(tmp_path)
    identity = ChannelIdentity("log+key", b"\x01" * 32, key.spki_sha256)
    relay = Relay("http://127.0.0.1:9")
    with Front("127.0.0.1", 0, key, Attested(relay, identity, _BrokenTee())) as front:
        mute = socket.create_connection(("127.0.0.1", front.port), timeout=15)
        with mute, contextlib.suppress(ConnectionError):
            assert mute.recv(1) == b""  # the server closed it (a timeout fails the test)
        with httpx.Client(verify=False, timeout=30) as client:
            answered = client.get(f"{front.url}/attestation", params={"nonce": "ef" * 32})
        assert answered.status_code == 503


def test_connections_past_the_caps_are_dropped_and_the_rest_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flood of connections costs the appliance at most ``max_connections`` sockets, and
    one address at most ``max_per_peer`` of them: a connection past either is ended as soon
    as it is made, while another address still gets in; once one goes, a client is served."""
    from attestation.channel import ChannelIdentity
    from attestation.relay import Relay
    from harness.front import Attested, Front
    from harness.tls_h11 import TlsH11Protocol

    monkeypatch.setattr(TlsH11Protocol, "max_connections", 4)
    monkeypatch.setattr(TlsH11Protocol, "max_per_peer", 3)
    key = tls_identity(tmp_path)
    identity = ChannelIdentity("log+key", b"\x01" * 32, key.spki_sha256)
    relay = Relay("http://127.0.0.1:9")
    with Front("127.0.0.1", 0, key, Attested(relay, identity, _BrokenTee())) as front:
        held = [_tls_to(front.url) for _ in range(3)]
        assert _ended(_tls_to(front.url), within=5)  # a fourth from the same address is not
        held.append(_tls_to(front.url, source="127.0.0.2"))  # another address gets in
        assert not any(_ended(conn, within=0.5) for conn in held)  # all four kept
        assert _ended(_tls_to(front.url, source="127.0.0.3"), within=5)  # a fifth is not
        held.pop(0).close()
        time.sleep(0.5)  # the server sees it go
        with httpx.Client(verify=False, timeout=30) as client:
            answered = client.get(f"{front.url}/attestation", params={"nonce": "ef" * 32})
        assert answered.status_code == 503
        for conn in held:
            conn.close()


def test_the_process_may_open_a_full_front_of_sockets_beside_its_own_files() -> None:
    """A service starts with 1,024 open files, fewer than a full front and the appliance's
    own: the listener raises the soft limit toward the hard one (never lowers it)."""
    script = (
        "import resource\n"
        "from harness.tls_h11 import FILES_PER_CONNECTION, MAX_CONNECTIONS, OWN_FILES\n"
        "from harness.tls_h11 import allow_open_files\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "allow_open_files()\n"
        "soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
        "want = MAX_CONNECTIONS * FILES_PER_CONNECTION + OWN_FILES\n"
        "assert soft == min(hard, want), (soft, hard)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))\n"
        "allow_open_files()\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
