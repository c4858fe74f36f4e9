"""``affidavit connect`` (#19): attest an appliance's TLS endpoint from the command line, and
``--listen``: forward plain HTTP on loopback through the pinned key.

Real TLS on loopback, real uvicorn, the real ``openai`` SDK through the forwarder; the TEE is
the only double (``channel_double.SyntheticSnp``)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from affidavit.cli import main
from attestation.relay import forwardable
from tests.attestation.channel_double import (
    Appliance,
    Inputs,
    RawTlsRecorder,
    RelayMitm,
    SyntheticSnp,
    TlsServer,
    inputs,
)

REPO = Path(__file__).resolve().parents[2]
PROMPT = "the secret prompt 7f3a"


@dataclass
class World:
    appliance: Appliance
    server: TlsServer
    inputs: Inputs
    folder: Path

    def args(self, url: str | None = None) -> list[str]:
        return [
            "connect",
            url or self.server.url,
            "--published",
            str(self.inputs.published),
            "--release-key",
            str(self.inputs.release_key),
            "--trusted-root",
            str(self.inputs.trusted_root),
        ]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("connect")
    (folder / "appliance").mkdir()
    appliance = Appliance(folder / "appliance")
    given = inputs(folder / "inputs", appliance.tee)
    with appliance.serve() as server:
        yield World(appliance, server, given, folder)


def test_connect_attests_and_prints_the_pinned_key(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(world.args()) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[-1] == f"pinned TLS key sha256:{world.appliance.identity.spki_sha256.hex()}"
    assert lines[-2].startswith("verdict: attested")
    for name in ("report_signature", "published.snp", "channel.nonce", "channel.tls_key"):
        assert any(line.startswith(f"ok   {name}:") for line in lines), name
    assert lines[0].startswith("skip trust.amd_roots: NOT checked")  # the test root, said


def test_connect_json(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*world.args(), "--json", "--home", str(world.folder / "home")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["verdict"] == "accept" and doc["failed"] is None
    assert doc["url"] == world.server.url
    assert doc["spki_sha256"] == world.appliance.identity.spki_sha256.hex()
    assert doc["pinned"] == "sha256:" + doc["spki_sha256"]
    assert doc["release"] == "0.0.0-test" and doc["claimed_release"] == "0.0.0-test"
    assert len(doc["nonce"]) == 64
    names = [c["name"] for c in doc["checks"]]
    assert names[-3:] == ["channel.nonce", "channel.tls_key", "channel.binding"]
    assert {c["kind"] for c in doc["checks"]} == {"snp"}
    (evidence,) = doc["evidence"]
    assert evidence["facts"]["report_data"][64:] == doc["nonce"]


def test_connect_refuses_a_man_in_the_middle_naming_the_check(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    (world.folder / "mitm").mkdir()
    mitm = RelayMitm(world.folder / "mitm", world.server.url)
    with mitm.serve() as server:
        assert main(world.args(server.url)) == 1
        captured = capsys.readouterr()
        assert "FAIL channel.tls_key:" in captured.out
        assert "pinned TLS key" not in captured.out
        assert captured.err.startswith("affidavit: not attested: channel.tls_key:")
        assert main([*world.args(server.url), "--json"]) == 1
        doc = json.loads(capsys.readouterr().out)
        assert doc["ok"] is False and doc["pinned"] is None
        assert doc["failed"].startswith("channel.tls_key:")
    assert mitm.seen == []


def test_connect_exit_codes(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nobody listens there
    assert main(world.args(f"https://127.0.0.1:{port}")) == 3
    assert "affidavit: missing: no answer" in capsys.readouterr().err
    assert main(world.args(f"http://127.0.0.1:{world.server.port}")) == 2
    assert "https only" in capsys.readouterr().err
    args = world.args()
    absent = [*args[:3], str(tmp_path / "absent.json"), *args[4:]]
    assert main(absent) == 3
    bad = tmp_path / "policy.json"
    bad.write_text('{"allow_debug": "maybe"}')
    assert main([*args, "--policy", str(bad)]) == 2
    assert "policy" in capsys.readouterr().err
    world.appliance.canned = b"not json"
    try:
        assert main(args) == 1
    finally:
        world.appliance.canned = None
    assert "affidavit: not attested: the reply: not an attestation reply" in (
        capsys.readouterr().err
    )


def _line(process: subprocess.Popen[str], timeout: float = 30.0) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.2)
        if ready:
            line = process.stdout.readline()
            if line.startswith("forwarding "):
                return line.strip()
            if not line and process.poll() is not None:
                break
    process.kill()
    raise AssertionError(f"no forwarding line; stderr: {process.communicate()[1]}")


def test_connect_listen_forwards_through_the_pin_and_streams(world: World, tmp_path: Path) -> None:
    """A subprocess ``connect --listen 0``: plain httpx and the openai SDK through it, a
    streamed reply arriving chunk by chunk, then another key on the appliance's port: 502
    ``not_attested`` and not a byte to it; SIGTERM: exit 0."""
    (tmp_path / "appliance").mkdir()
    (tmp_path / "impostor").mkdir()
    appliance = Appliance(tmp_path / "appliance", tee=SyntheticSnp(chain=world.appliance.tee.chain))
    server = TlsServer(appliance.app(), appliance.identity).start()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SSL_CERT_FILE", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "affidavit", *world.args(server.url), "--listen", "0"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = _line(process)
        spki = appliance.identity.spki_sha256.hex()
        assert line.endswith(f"-> {server.url} (pinned sha256:{spki})"), line
        forward = line.split()[1]
        assert forward.startswith("http://127.0.0.1:")

        # plain httpx: method, path, query, body forwarded; the reply as the appliance gave it
        reply = httpx.post(
            forward + "/v1/chat/completions?probe=1",
            json={"model": "m", "messages": [{"role": "user", "content": PROMPT}]},
            timeout=10,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == "hello from the appliance"
        first = appliance.seen[0]
        assert (first.method, first.path, first.query) == (
            "POST",
            "/v1/chat/completions",
            "probe=1",
        )
        # the openai SDK, its base URL the forwarder
        sdk = openai.OpenAI(base_url=forward + "/v1", api_key="token", max_retries=0)
        chat = sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": PROMPT}]
        )
        assert chat.choices[0].message.content == "hello from the appliance"
        # streamed: the appliance holds its second chunk until this client has seen the first
        stream = sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": PROMPT}], stream=True
        )
        words = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                words.append(chunk.choices[0].delta.content)
                appliance.release.set()
        assert "".join(words) == "first second third"
        assert appliance.released == [True]  # released by the client, not by the timeout
        assert [PROMPT in s.body.decode() for s in appliance.seen] == [True, True, True]
        assert appliance.seen[1].headers["authorization"] == "Bearer token"
        assert appliance.seen[1].headers["host"] == server.url.removeprefix("https://")

        # another key takes the appliance's port: the forwarder refuses, sends nothing
        server.stop()
        recorder = RawTlsRecorder(tmp_path / "impostor", server.port)
        with recorder.serve():
            refused = httpx.post(
                forward + "/v1/chat/completions", json={"prompt": PROMPT}, timeout=10
            )
            recorder.wait(1)
        assert refused.status_code == 502
        assert refused.json()["error"]["code"] == "not_attested"
        assert recorder.handshakes and not any(recorder.handshakes)
        assert recorder.received == []

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        server.stop()


def test_hop_by_hop_headers_stay_on_their_hop() -> None:
    given = [
        (b"Connection", b"close, X-Drop"),
        (b"X-Drop", b"1"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Host", b"127.0.0.1:8080"),
        (b"Authorization", b"Bearer t"),
        (b"Accept", b"text/event-stream"),
    ]
    assert forwardable(given) == [
        (b"Authorization", b"Bearer t"),
        (b"Accept", b"text/event-stream"),
    ]
