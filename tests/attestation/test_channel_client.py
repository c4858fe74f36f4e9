"""The attested channel's client (#19): attest over one TLS connection, then pin that key.

Real TLS on loopback, real uvicorn, the real ``openai`` and ``anthropic`` SDKs; the TEE is the
only double (``channel_double.SyntheticSnp``, a synthetic SEV-SNP report over a throwaway
chain whose root the client is told to trust)."""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from attestation.channel import MAX_REPLY_BYTES, ReplyError
from attestation.channel_client import (
    Attested,
    NotAttested,
    Unreachable,
    async_client,
    attest,
    client,
    clients,
    pinned_client,
    pinned_context,
)
from attestation.evidence import Missing, TrustedRoots, read_trusted_roots
from tests.attestation.channel_double import (
    OTHER_MEASUREMENT,
    Appliance,
    Inputs,
    RawTlsRecorder,
    RelayMitm,
    SyntheticSnp,
    TlsServer,
    inputs,
    write_policy,
)

PROMPT = "the secret prompt 7f3a"


@dataclass
class World:
    appliance: Appliance
    server: TlsServer
    inputs: Inputs
    trusted: TrustedRoots
    folder: Path

    @property
    def url(self) -> str:
        return self.server.url

    def attest(self, url: str | None = None, **options: Any) -> Attested:
        options.setdefault("release_key", self.inputs.release_key)
        options.setdefault("trusted", self.trusted)
        published = options.pop("published", self.inputs.published)
        policy = options.pop("policy", self.inputs.policy)
        return attest(url or self.url, published, policy, **options)

    def options(self) -> dict[str, Any]:
        return {"release_key": self.inputs.release_key, "trusted": self.trusted}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("channel")
    (folder / "appliance").mkdir()
    appliance = Appliance(folder / "appliance")
    given = inputs(folder / "inputs", appliance.tee)
    with appliance.serve() as server:
        yield World(appliance, server, given, read_trusted_roots(given.trusted_root), folder)


@pytest.fixture
def fresh(world: World) -> Iterator[World]:
    """The module's world with its recordings cleared and no canned reply after the test."""
    world.appliance.seen.clear()
    yield world
    world.appliance.canned = None


def _names(found: Attested) -> list[str]:
    return [c.name for c in found.checks if c.ok is False]


def _chat(http_client: httpx2.Client, url: str) -> str:
    sdk = openai.OpenAI(base_url=url + "/v1", api_key="token", http_client=http_client)
    reply = sdk.with_options(max_retries=0).chat.completions.create(
        model="m", messages=[{"role": "user", "content": PROMPT}]
    )
    return reply.choices[0].message.content or ""


# --- the happy path ------------------------------------------------------------------------


def test_attest_checks_everything_and_names_the_channel_checks(fresh: World) -> None:
    found = fresh.attest()
    assert found.ok, [c.line() for c in found.checks]
    assert found.spki_sha256 == fresh.appliance.identity.spki_sha256
    assert found.cert_der == fresh.appliance.identity.cert_der
    assert found.release == "0.0.0-test" and found.reply.release == "0.0.0-test"
    names = [c.name for c in found.checks if c.ok]
    for name in ("report_signature", "published.signature", "published.snp", "policy.debug"):
        assert name in names
    assert names[-3:] == ["channel.nonce", "channel.tls_key", "channel.binding"]
    # the nonce is fresh each time, and it is what the TEE double was asked to carry
    again = fresh.attest()
    assert again.reply.nonce != found.reply.nonce
    assert fresh.appliance.tee.asked[-1][32:].hex() == again.reply.nonce


def test_openai_and_anthropic_talk_through_the_pinned_clients(fresh: World) -> None:
    assert _chat(client(fresh.url, fresh.inputs.published, **fresh.options()), fresh.url) == (
        "hello from the appliance"
    )
    sdk = anthropic.Anthropic(
        base_url=fresh.url,
        api_key="token",
        http_client=client(fresh.url, fresh.inputs.published, **fresh.options()),
        max_retries=0,
    )
    message = sdk.messages.create(
        model="m", max_tokens=16, messages=[{"role": "user", "content": PROMPT}]
    )
    assert message.content[0].type == "text"
    assert message.content[0].text == "hello from the appliance"

    async def both() -> tuple[str, str]:
        one = openai.AsyncOpenAI(
            base_url=fresh.url + "/v1",
            api_key="token",
            http_client=async_client(fresh.url, fresh.inputs.published, **fresh.options()),
            max_retries=0,
        )
        chat = await one.chat.completions.create(
            model="m", messages=[{"role": "user", "content": PROMPT}]
        )
        _, pinned = clients(fresh.url, fresh.inputs.published, **fresh.options())
        two = anthropic.AsyncAnthropic(
            base_url=fresh.url, api_key="token", http_client=pinned, max_retries=0
        )
        msg = await two.messages.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": PROMPT}]
        )
        block = msg.content[0]
        assert block.type == "text"
        return chat.choices[0].message.content or "", block.text

    assert asyncio.run(both()) == ("hello from the appliance", "hello from the appliance")
    seen = [(s.path, PROMPT in s.body.decode()) for s in fresh.appliance.seen]
    assert seen == [
        ("/v1/chat/completions", True),
        ("/v1/messages", True),
        ("/v1/chat/completions", True),
        ("/v1/messages", True),
    ]


def _accepted(cls: Any, parameter: str = "http_client") -> tuple[type, ...]:
    """The classes the SDK's ``http_client`` annotation names (it is a string: the SDKs use
    ``from __future__ import annotations``)."""
    annotation: Any = inspect.signature(cls.__init__).parameters[parameter].annotation
    if isinstance(annotation, str):
        annotation = eval(annotation, vars(sys.modules[cls.__init__.__module__]))
    members = annotation.__args__ if isinstance(annotation, types.UnionType) else (annotation,)
    return tuple(m for m in members if m is not type(None))


def test_the_clients_are_what_the_installed_sdks_annotate(fresh: World) -> None:
    sync, asynchronous = clients(fresh.url, fresh.inputs.published, **fresh.options())
    for sdk in (openai.OpenAI, anthropic.Anthropic):
        assert isinstance(sync, _accepted(sdk)), (sdk, _accepted(sdk))
    for async_sdk in (openai.AsyncOpenAI, anthropic.AsyncAnthropic):
        assert isinstance(asynchronous, _accepted(async_sdk)), (async_sdk, _accepted(async_sdk))
    assert not sync.base_url.host and sync.trust_env is False
    assert not asynchronous.base_url.host and asynchronous.trust_env is False


# --- a man in the middle -------------------------------------------------------------------


@pytest.mark.parametrize("rewrite", [False, True], ids=["relays", "names-its-key"])
def test_a_relaying_man_in_the_middle_is_refused_before_a_prompt_byte(
    fresh: World, rewrite: bool
) -> None:
    """A MITM with its own key that relays the genuine evidence: the key of the connection is
    not the attested one; one that names its own key instead: the evidence does not bind it."""
    (fresh.folder / f"mitm-{rewrite}").mkdir()
    mitm = RelayMitm(fresh.folder / f"mitm-{rewrite}", fresh.url, rewrite=rewrite)
    with mitm.serve() as server:
        found = fresh.attest(server.url)
        assert not found.ok
        expected = "channel.binding" if rewrite else "channel.tls_key"
        assert _names(found) == [expected], [c.line() for c in found.checks]
        assert found.spki_sha256 == mitm.identity.spki_sha256
        with pytest.raises(NotAttested) as refused:
            client(server.url, fresh.inputs.published, **fresh.options())
        assert refused.value.reason.startswith(expected + ":")
        assert refused.value.verdicts and not refused.value.verdicts[0].accepted
        with pytest.raises(NotAttested):
            pinned_client(found)
    assert mitm.seen == []  # no prompt, no request at all but the relayed /attestation
    assert fresh.appliance.seen == []


def test_a_man_in_the_middle_after_attestation_gets_no_byte(world: World, tmp_path: Path) -> None:
    """Attest the appliance, then another key takes its port (same URL): the pinned clients'
    handshakes fail, and the impostor reads not one byte after its handshake."""
    (tmp_path / "appliance").mkdir()
    (tmp_path / "impostor").mkdir()
    appliance = Appliance(tmp_path / "appliance", tee=SyntheticSnp(chain=world.appliance.tee.chain))
    with appliance.serve() as server:
        port, url = server.port, server.url
        found = world.attest(url)
        assert found.ok, found.refusal()
        pinned = pinned_client(found)
        assert _chat(pinned, url) == "hello from the appliance"  # the genuine one answers
    recorder = RawTlsRecorder(tmp_path / "impostor", port)
    with recorder.serve():
        with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            pinned.post(url + "/v1/chat/completions", json={"prompt": PROMPT})
        with pytest.raises(openai.APIConnectionError):
            _chat(pinned, url)
        recorder.wait(2)
    assert recorder.handshakes == [False, False]
    assert recorder.received == []
    assert [s.path for s in appliance.seen] == ["/v1/chat/completions"]


def test_the_pinned_context_trusts_that_certificate_alone(world: World, tmp_path: Path) -> None:
    """Straight ssl: the pinned certificate's server completes a handshake, another key
    (same subject, also self-signed) does not."""
    import ssl

    recorder = RawTlsRecorder(tmp_path)
    with recorder.serve():
        for der, ok in (
            (recorder.identity.cert_der, True),
            (world.appliance.identity.cert_der, False),
        ):
            with socket.create_connection(("127.0.0.1", recorder.port)) as raw:
                if ok:
                    with pinned_context(der).wrap_socket(raw) as tls:
                        assert tls.version() == "TLSv1.3"
                        tls.sendall(b"hello")
                else:
                    with pytest.raises(ssl.SSLCertVerificationError):
                        pinned_context(der).wrap_socket(raw)
        recorder.wait(2)
    assert recorder.handshakes == [True, False]
    assert recorder.received == [b"hello"]


# --- freshness, measurements, policy -------------------------------------------------------


def test_a_replayed_reply_is_refused_on_the_nonce(fresh: World) -> None:
    old = "11" * 32
    with httpx.Client(verify=False, trust_env=False) as http:
        recorded = http.get(fresh.url + "/attestation", params={"nonce": old}).content
    fresh.appliance.canned = recorded
    found = fresh.attest()
    assert _names(found) == ["channel.nonce"], [c.line() for c in found.checks]
    assert "not ours" in found.first_failure.detail  # type: ignore[union-attr]

    def renamed(request: Request) -> Response:  # the reply says our nonce; the report does not
        doc = json.loads(recorded)
        doc["nonce"] = request.query_params["nonce"]
        return Response(json.dumps(doc), media_type="application/json")

    fresh.appliance.canned = renamed
    found = fresh.attest()
    assert _names(found) == ["channel.nonce"]
    assert f"report_data carries {old}" in found.refusal()
    with pytest.raises(NotAttested, match=r"^channel.nonce: report_data carries"):
        client(fresh.url, fresh.inputs.published, **fresh.options())


def test_evidence_of_other_measurements_is_refused_on_the_published_check(
    fresh: World, tmp_path: Path
) -> None:
    other = inputs(tmp_path, fresh.appliance.tee, [OTHER_MEASUREMENT])
    found = fresh.attest(published=other.published, release_key=other.release_key)
    assert _names(found) == ["published.snp"]
    with pytest.raises(NotAttested, match=r"^published.snp: measurement"):
        client(fresh.url, other.published, release_key=other.release_key, trusted=fresh.trusted)
    # a published file whose signature does not verify is not believed
    fresh.inputs.published.write_bytes(fresh.inputs.published.read_bytes() + b" ")
    try:
        found = fresh.attest()
    finally:
        fresh.inputs.published.write_bytes(fresh.inputs.published.read_bytes()[:-1])
    assert _names(found) == ["published.signature"]
    assert fresh.attest().ok


def test_a_policy_refusal_is_a_refusal(fresh: World, tmp_path: Path) -> None:
    higher = write_policy(tmp_path, "tcb.json", min_tcb={"Turin": {"snp": 9}})
    assert _names(fresh.attest(policy=higher)) == ["policy.min_tcb"]
    prefix = write_policy(tmp_path, "rd.json", report_data="00" * 32)
    assert _names(fresh.attest(policy=prefix)) == ["policy.report_data"]
    # a debug guest (same chain, same measurement): refused by the default policy, and its
    # guest policy is not the published one
    tee = fresh.appliance.tee
    fresh.appliance.tee = SyntheticSnp(chain=tee.chain, policy=0x30000 | 1 << 19)
    try:
        with pytest.raises(NotAttested, match=r"^policy.debug: a debug guest"):
            client(fresh.url, fresh.inputs.published, **fresh.options())
        assert _names(fresh.attest()) == ["policy.debug", "published.guest_policy"]
    finally:
        fresh.appliance.tee = tee


def test_without_the_test_root_the_chain_is_refused(fresh: World) -> None:
    found = fresh.attest(trusted=None)
    assert not found.ok and "chain.ark_pinned" in _names(found)


# --- hostile replies -----------------------------------------------------------------------


def _streamed(size: int) -> Response:
    async def body() -> Any:
        for _ in range(size // 65536 + 1):
            yield b" " * 65536

    return StreamingResponse(body(), media_type="application/json")


@pytest.mark.parametrize(
    ("canned", "said"),
    [
        (b" " * (MAX_REPLY_BYTES + 1), f"over {MAX_REPLY_BYTES}"),
        (lambda _: _streamed(MAX_REPLY_BYTES + 65536), f"over {MAX_REPLY_BYTES}"),
        (b"<html>not json</html>", "not an attestation reply"),
        (b"[" * 100_000 + b"]" * 100_000, "not an attestation reply"),
        (lambda r: Response("{}", status_code=503), "answered 503"),
    ],
    ids=["oversized", "oversized-streamed", "not-json", "deeply-nested", "status"],
)
def test_a_hostile_reply_is_refused_plainly(fresh: World, canned: Any, said: str) -> None:
    fresh.appliance.canned = canned
    with pytest.raises(ReplyError, match=said):
        fresh.attest()
    with pytest.raises(NotAttested, match=r"^the reply: ") as refused:
        client(fresh.url, fresh.inputs.published, **fresh.options())
    assert refused.value.verdicts == []


def test_a_dripping_reply_is_cut_off(fresh: World) -> None:
    async def drip() -> Any:
        for _ in range(100):
            yield b" "
            await asyncio.sleep(0.05)

    fresh.appliance.canned = lambda _: StreamingResponse(drip(), media_type="application/json")
    started = time.monotonic()
    with pytest.raises(Unreachable, match=r"took over 0\.6 s"):
        fresh.attest(timeout=0.2)
    assert time.monotonic() - started < 3


def test_a_reply_of_another_format_or_bad_base64_is_refused(fresh: World) -> None:
    with httpx.Client(verify=False, trust_env=False) as http:
        genuine = json.loads(http.get(fresh.url + "/attestation", params={"nonce": "22" * 32}).text)
    other = {**genuine, "format": "affidavit/attestation/v0"}
    fresh.appliance.canned = json.dumps(other).encode()
    with pytest.raises(ReplyError, match="format"):
        fresh.attest()
    broken = {**genuine, "evidence": [{**genuine["evidence"][0], "evidence": "not base64!"}]}
    fresh.appliance.canned = json.dumps(broken).encode()
    with pytest.raises(ReplyError, match=r"evidence\[0\].evidence is not base64"):
        fresh.attest()


def test_no_answer_no_https_no_file(world: World, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nobody listens there
    with pytest.raises(Unreachable, match="ConnectError"):
        world.attest(f"https://127.0.0.1:{port}")
    with pytest.raises(ValueError, match="https only"):
        world.attest(f"http://127.0.0.1:{world.server.port}")
    for url in ("https://127.0.0.1:1/?nonce=1", "https://user@127.0.0.1:1", "https:///x"):
        with pytest.raises(ValueError, match="no query, fragment or user"):
            world.attest(url)
    with pytest.raises(Missing):
        world.attest(published=tmp_path / "absent.json")
