"""Revocation with AMD's CRL: a CRL signed by the test chain's ARK (``snp_double``, RSA-PSS
like AMD's), given as a file (DER or PEM) or fetched from a stand-in KDS, a real HTTP server
on 127.0.0.1; through the real verifier and ``affidavit attest verify``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

from affidavit.cli import main
from attestation.amd_crl import CrlError, crl_url, fetch_crl
from attestation.policy import Policy, apply_policy
from attestation.snp import verify_snp, verify_snp_chain
from attestation.verdict import Check, Verdict
from tests.attestation.kds_double import StandInKds, stand_in_kds
from tests.attestation.snp_double import (
    CHIP_ID,
    TURIN_TCB,
    FakeAmd,
    fake_amd,
    v5_report,
    vek_with_extensions,
)

NOW = datetime(2025, 6, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def amd() -> FakeAmd:
    return fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])


def _judge(amd: FakeAmd, crl: bytes | None, now: datetime = NOW) -> Verdict:
    report = v5_report(amd.vek_key)
    return verify_snp(report, amd.vek, amd.chain, now=now, trusted_roots=amd.roots, crl=crl)


def _revocation(verdict: Verdict) -> Check:
    return next(c for c in verdict.checks if c.name == "chain.revocation")


def test_a_crl_from_the_ark_listing_neither_passes(amd: FakeAmd) -> None:
    ask, vek = amd.serial("ask"), amd.serial("vek")
    for crl in (amd.crl(revoked=(ask + 1, vek + 1)), amd.crl(pem=True)):
        verdict = _judge(amd, crl)
        assert verdict.accepted, [c.line() for c in verdict.failed]
        check = _revocation(verdict)
        assert check.ok is True
        assert f"lists neither ASK (serial {ask:#x}) nor VCEK (serial {vek:#x})" in check.detail
    assert verdict.facts["crl"] == {
        "issuer": "ARK-Turin",
        "this_update": "2025-05-01T00:00:00Z",
        "next_update": "2025-07-01T00:00:00Z",
    }


@pytest.mark.parametrize("which", ["vek", "ask"])
def test_a_revoked_certificate_rejects_naming_its_serial(amd: FakeAmd, which: str) -> None:
    serial = amd.serial(which)
    verdict = _judge(amd, amd.crl(revoked=(serial,)))
    assert [c.name for c in verdict.failed] == ["chain.revocation"]
    detail = _revocation(verdict).detail
    role = {"vek": "VCEK SEV-VCEK", "ask": "ASK SEV-Turin"}[which]
    assert detail == f"{role} (serial {serial:#x}) is revoked since 2025-05-01T00:00:00Z"


def test_a_crl_signed_by_another_key_rejects(amd: FakeAmd) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    verdict = _judge(amd, amd.crl(signer=other))
    assert [c.name for c in verdict.failed] == ["chain.revocation"]
    assert "does not verify with ARK-Turin's key" in _revocation(verdict).detail


def test_a_crl_naming_another_issuer_rejects(amd: FakeAmd) -> None:
    verdict = _judge(amd, amd.crl(issuer="ARK-Milan"))
    assert [c.name for c in verdict.failed] == ["chain.revocation"]
    assert "not ARK-Turin" in _revocation(verdict).detail


@pytest.mark.parametrize(
    ("now", "why"),
    [
        (datetime(2025, 7, 2, tzinfo=UTC), "expired"),
        (datetime(2025, 4, 30, tzinfo=UTC), "not yet issued"),
    ],
)
def test_a_crl_out_of_its_window_rejects(amd: FakeAmd, now: datetime, why: str) -> None:
    # the certificates are valid 2025-01-01 .. 2034: only the CRL's window is at stake
    verdict = _judge(amd, amd.crl(), now=now)
    assert [c.name for c in verdict.failed] == ["chain.revocation"], why
    assert "in force 2025-05-01T00:00:00Z .. 2025-07-01T00:00:00Z, not at" in (
        _revocation(verdict).detail
    )
    # both edges are inside
    for edge in (datetime(2025, 5, 1, tzinfo=UTC), datetime(2025, 7, 1, tzinfo=UTC)):
        assert _revocation(_judge(amd, amd.crl(), now=edge)).ok is True


def test_something_that_is_not_a_crl_rejects(amd: FakeAmd) -> None:
    verdict = _judge(amd, b"not a CRL")
    assert _revocation(verdict).ok is False
    assert _revocation(verdict).detail.startswith("not a CRL (DER or PEM)")


def test_without_a_crl_revocation_is_not_checked_unless_the_policy_requires_it(
    amd: FakeAmd,
) -> None:
    verdict = _judge(amd, None)
    assert _revocation(verdict).ok is None and verdict.accepted
    required = apply_policy(_judge(amd, None), Policy(require_crl=True))
    assert [c.name for c in required.failed] == ["policy.crl"]
    assert "require_crl" in required.failed[0].detail
    held = apply_policy(_judge(amd, amd.crl()), Policy(require_crl=True))
    assert held.accepted and next(c for c in held.checks if c.name == "policy.crl").ok


def test_the_chain_alone_is_checked_against_the_crl(amd: FakeAmd) -> None:
    revoked = amd.crl(revoked=(amd.serial("ask"),))
    verdict = verify_snp_chain(amd.vek, amd.chain, now=NOW, trusted_roots=amd.roots, crl=revoked)
    assert [c.name for c in verdict.failed] == ["chain.revocation"]


# --- the CLI: --crl FILE and --fetch-crl from a stand-in KDS ---------------------------------


def _args(tmp: Path, amd: FakeAmd, *extra: str) -> list[str]:
    (tmp / "report.bin").write_bytes(v5_report(amd.vek_key))
    (tmp / "vek.der").write_bytes(amd.vek)
    (tmp / "chain.pem").write_bytes(amd.chain)
    (tmp / "ark.pem").write_bytes(amd.ark)
    return [
        "attest", "verify", "--kind", "snp", "--evidence", str(tmp / "report.bin"),
        "--certs", str(tmp / "vek.der"), "--certs", str(tmp / "chain.pem"),
        "--trusted-root", str(tmp / "ark.pem"), "--now", "2025-06-01T00:00:00Z", *extra,
    ]  # fmt: skip


def test_cli_crl_file_der_and_pem(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, pem = tmp_path / "ark.crl", tmp_path / "ark.crl.pem"
    good.write_bytes(amd.crl())
    pem.write_bytes(amd.crl(pem=True))
    for path in (good, pem):
        assert main(_args(tmp_path, amd, "--crl", str(path))) == 0
        assert "ok   chain.revocation: ARK-Turin's CRL" in capsys.readouterr().out
    revoked = tmp_path / "revoked.crl"
    revoked.write_bytes(amd.crl(revoked=(amd.serial("vek"),)))
    assert main(_args(tmp_path, amd, "--crl", str(revoked))) == 1
    out = capsys.readouterr().out
    assert f"FAIL chain.revocation: VCEK SEV-VCEK (serial {amd.serial('vek'):#x})" in out
    assert main(_args(tmp_path, amd, "--crl", str(tmp_path / "absent.crl"))) == 3
    assert main(_args(tmp_path, amd)) == 0  # no CRL: accepted, revocation said not checked
    assert "skip chain.revocation: no CRL given" in capsys.readouterr().out
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"require_crl": True}))
    assert main(_args(tmp_path, amd, "--policy", str(policy))) == 1
    assert "FAIL policy.crl" in capsys.readouterr().out
    assert main(_args(tmp_path, amd, "--policy", str(policy), "--crl", str(good))) == 0
    assert main(_args(tmp_path, amd, "--crl", str(good), "--fetch-crl")) == 2


@pytest.fixture
def kds() -> Iterator[StandInKds]:
    with stand_in_kds() as stand_in:
        yield stand_in


def test_fetch_crl_asks_kds_for_the_products_crl(amd: FakeAmd, kds: StandInKds) -> None:
    assert crl_url("Milan") == "https://kdsintf.amd.com/vcek/v1/Milan/crl"
    served = kds.documents["/vcek/v1/Turin/crl"] = amd.crl()
    with httpx.Client() as client:
        assert fetch_crl("Turin", client, base=kds.url) == served
        with pytest.raises(CrlError, match=r"/vcek/v1/Genoa/crl: HTTP 404"):
            fetch_crl("Genoa", client, base=kds.url)
        kds.documents["/vcek/v1/Milan/crl"] = b"garbage"
        with pytest.raises(CrlError, match="not a CRL"):
            fetch_crl("Milan", client, base=kds.url)
    assert kds.asked == ["/vcek/v1/Turin/crl", "/vcek/v1/Genoa/crl", "/vcek/v1/Milan/crl"]


def test_cli_fetch_crl_from_the_stand_in_kds(
    amd: FakeAmd, tmp_path: Path, kds: StandInKds, capsys: pytest.CaptureFixture[str]
) -> None:
    kds.documents["/vcek/v1/Turin/crl"] = amd.crl(revoked=(amd.serial("ask"),))
    assert main(_args(tmp_path, amd, "--fetch-crl", "--kds", kds.url)) == 1
    assert "FAIL chain.revocation: ASK SEV-Turin" in capsys.readouterr().out
    kds.documents["/vcek/v1/Turin/crl"] = amd.crl()
    assert main(_args(tmp_path, amd, "--fetch-crl", "--kds", kds.url)) == 0
    assert "ok   chain.revocation" in capsys.readouterr().out
    assert kds.asked == ["/vcek/v1/Turin/crl"] * 2
    del kds.documents["/vcek/v1/Turin/crl"]
    assert main(_args(tmp_path, amd, "--fetch-crl", "--kds", kds.url)) == 3
    assert "/vcek/v1/Turin/crl: HTTP 404" in capsys.readouterr().err


def test_a_revoked_key_certificate_whose_kind_is_unknown_is_named_vek(amd: FakeAmd) -> None:
    vek = vek_with_extensions({"3.1": b"\xff"})  # a TCB that does not parse: no VCEK/VLEK kind
    serial = x509.load_der_x509_certificate(vek).serial_number
    report = v5_report(amd.vek_key)
    crl = amd.crl(revoked=(serial,))
    verdict = verify_snp(report, vek, amd.chain, now=NOW, trusted_roots=amd.roots, crl=crl)
    assert _revocation(verdict).detail == (
        f"VEK SEV-VCEK (serial {serial:#x}) is revoked since 2025-05-01T00:00:00Z"
    )
