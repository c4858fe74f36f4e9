"""#19 lines 1 to 4 end to end: the real appliance's external TLS address, checked by the
real client before a prompt leaves it.

Everything is the real thing (the tiny engine, the proxy, the control plane, the front's
TLS listener with the home's key, the ``openai`` SDK with the pinned ``httpx2`` client, the
``affidavit connect`` command) except the TEE: a test double (``SyntheticSnp``, named so)
signs synthetic SEV-SNP reports over a throwaway chain, as the binding test's evidence does.
The client trusts that chain's root (``--trusted-root``), and its verdict says so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import openai
import pytest

from affidavit.cli import main
from attestation.channel_client import NotAttested, attest, client
from attestation.evidence import read_trusted_roots
from attestation.tls_identity import tls_identity
from harness.front import home_identity
from harness.session import open_session, read_bodies, user_key
from harness.state import Home
from harness.up import running_appliance
from record.schema import ModelRequest
from tests.attestation.channel_double import Inputs, RelayMitm, SyntheticSnp, inputs
from tests.harness.rig import CLOCK, PINS, TINY_SERVED, in_process_engine


@dataclass
class Attestable:
    home: Home
    url: str
    proxy_url: str
    tee: SyntheticSnp
    given: Inputs


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attestable]:
    root = tmp_path_factory.mktemp("attested")
    home = Home(root / "home")
    tee = SyntheticSnp()
    with (
        in_process_engine(home) as (_, provider),
        running_appliance(
            home,
            provider=provider,
            model=TINY_SERVED,
            clock=CLOCK,
            external=("127.0.0.1", 0),
            evidence=tee,
        ) as up,
    ):
        assert up.front is not None
        yield Attestable(home, up.front.url, up.appliance.proxy_url, tee, inputs(root / "in", tee))


def _requests(a: Attestable, session: str) -> int:
    bodies = read_bodies(a.home.appliance().store, session, user_key(a.home))
    return sum(isinstance(b, ModelRequest) for _, b in bodies)


def test_a_pinned_turn_through_the_attested_channel(appliance: Attestable) -> None:
    a = appliance
    trusted = read_trusted_roots(a.given.trusted_root)
    checked = attest(a.url, a.given.published, release_key=a.given.release_key, trusted=trusted)
    assert checked.ok, checked.first_failure
    names = {c.name for c in checked.checks if c.ok}
    assert {"channel.nonce", "channel.tls_key", "channel.binding", "published.snp"} <= names
    # the evidence bound this appliance's keys: the record's log key, its TLS key
    # the release it claims: its own version (unsigned: the published file decides)
    assert checked.reply.release == version("affidavit")
    mine = home_identity(a.home, tls_identity(a.home.root))
    assert checked.reply.binding.log_key == mine.log_key
    assert checked.reply.binding.sealing_key == mine.sealing_public.hex()
    assert checked.spki_sha256 == mine.tls_spki_sha256
    assert checked.reply.binding.tls_spki_sha256 == mine.tls_spki_sha256.hex()
    state = open_session(a.home, PINS)
    pinned = client(a.url, a.given.published, release_key=a.given.release_key, trusted=trusted)
    sdk = openai.OpenAI(
        base_url=state.base_url.replace(a.proxy_url, a.url) + "/v1",
        api_key=state.token,
        http_client=pinned,
        max_retries=0,
    )
    reply = sdk.chat.completions.create(
        model=TINY_SERVED, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert reply.choices[0].message is not None
    assert _requests(a, state.session_id) == 1
    # each attestation asked the TEE afresh, with the v2 binding over the home's TLS key
    assert len(a.tee.asked) >= 2 and a.tee.asked[-1] != a.tee.asked[-2]


def test_a_man_in_the_middle_gets_no_byte_of_the_prompt(
    appliance: Attestable, tmp_path: Path
) -> None:
    """A stand-in man in the middle with its own key, relaying the appliance's genuine
    evidence: the client refuses before sending, and nothing reached the MITM or the
    record."""
    a = appliance
    trusted = read_trusted_roots(a.given.trusted_root)
    state = open_session(a.home, PINS)
    mitm = RelayMitm(tmp_path / "mitm", a.url)
    with mitm.serve() as server:
        with pytest.raises(NotAttested, match=r"channel\.tls_key"):
            client(server.url, a.given.published, release_key=a.given.release_key, trusted=trusted)
        code = main(
            [
                "connect",
                server.url,
                "--published",
                str(a.given.published),
                "--release-key",
                str(a.given.release_key),
                "--trusted-root",
                str(a.given.trusted_root),
            ]
        )
    assert code == 1
    assert mitm.seen == []
    assert _requests(a, state.session_id) == 0


def test_connect_pins_the_appliances_own_key(
    appliance: Attestable, capsys: pytest.CaptureFixture[str]
) -> None:
    a = appliance
    code = main(
        [
            "connect",
            a.url,
            "--published",
            str(a.given.published),
            "--release-key",
            str(a.given.release_key),
            "--trusted-root",
            str(a.given.trusted_root),
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    doc = json.loads(out)
    assert doc["ok"] is True
    assert doc["spki_sha256"] == tls_identity(a.home.root).spki_sha256.hex()


def test_other_measurements_are_refused(appliance: Attestable, tmp_path: Path) -> None:
    from tests.attestation.channel_double import OTHER_MEASUREMENT

    a = appliance
    other = inputs(tmp_path, a.tee, [OTHER_MEASUREMENT])
    checked = attest(
        a.url,
        other.published,
        release_key=other.release_key,
        trusted=read_trusted_roots(other.trusted_root),
    )
    assert not checked.ok
    assert checked.first_failure is not None
    assert checked.first_failure.name == "published.snp"
