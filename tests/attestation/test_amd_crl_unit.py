"""attestation.amd_crl's check as a unit: ``check_crl`` on real CRLs signed by the test chain's
ARK (``snp_double``, RSA-PSS like AMD's), every detail word for word; ``fetch_crl`` against a
port nothing listens on. Each test here pins a line a mutant changed unnoticed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from attestation.amd_crl import CrlError, check_crl, crl_url, fetch_crl
from attestation.verdict import Check, Verdict
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, FakeAmd, fake_amd

NOW = datetime(2025, 6, 1, tzinfo=UTC)
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)


@pytest.fixture(scope="module")
def amd() -> FakeAmd:
    return fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])


def _ark(amd: FakeAmd) -> x509.Certificate:
    return x509.load_pem_x509_certificate(amd.ark)


def _below(amd: FakeAmd) -> list[tuple[str, x509.Certificate]]:
    ask = x509.load_pem_x509_certificates(amd.chain)[0]
    return [("ASK", ask), ("VCEK", x509.load_der_x509_certificate(amd.vek))]


def _check(
    amd: FakeAmd,
    crl: bytes,
    below: list[tuple[str, x509.Certificate]] | None = None,
    now: datetime = NOW,
    ark: x509.Certificate | None = None,
) -> tuple[Check, Verdict]:
    verdict = Verdict("snp")
    check_crl(verdict, crl, ark=ark or _ark(amd), below=_below(amd) if below is None else below,
              now=now)  # fmt: skip
    [check] = verdict.checks
    return check, verdict


def _head(der: bytes) -> int:
    """The length of a DER element's tag and length octets."""
    return 2 + (der[1] & 0x7F if der[1] & 0x80 else 0)


def _tlvs(body: bytes) -> list[bytes]:
    """The DER elements of a SEQUENCE's body, each whole (tag, length, value)."""
    out, at = [], 0
    while at < len(body):
        head = _head(body[at:])
        size = body[at + 1] if head == 2 else int.from_bytes(body[at + 2 : at + head], "big")
        out.append(body[at : at + head + size])
        at += head + size
    return out


def _inner(der: bytes) -> list[bytes]:
    """The elements inside one SEQUENCE (``der`` is the whole SEQUENCE)."""
    return _tlvs(der[_head(der) :])


def _seq(tag: int, body: bytes) -> bytes:
    n = len(body)
    if n < 0x80:
        return bytes([tag, n]) + body
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + body


def test_the_kds_address_drops_only_the_bases_trailing_slashes() -> None:
    assert crl_url("Turin", "http://127.0.0.1:8080/mirror/X/") == (
        "http://127.0.0.1:8080/mirror/X/vcek/v1/Turin/crl"
    )
    assert crl_url("Genoa", "/kds//") == "/kds/vcek/v1/Genoa/crl"


def test_a_kds_that_cannot_be_reached_is_named_with_the_error() -> None:
    with socket.socket() as closed:  # a port that was free a moment ago: nothing listens
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    url = f"http://127.0.0.1:{port}/vcek/v1/Milan/crl"
    with httpx.Client() as client, pytest.raises(CrlError) as info:
        fetch_crl("Milan", client, base=f"http://127.0.0.1:{port}")
    assert str(info.value).startswith(f"{url}: ConnectError: ")


def test_no_ark_to_check_the_signature_with(amd: FakeAmd) -> None:
    verdict = Verdict("snp")
    check_crl(verdict, amd.crl(), ark=None, below=_below(amd), now=NOW)
    assert [(c.name, c.ok, c.detail) for c in verdict.checks] == [
        ("chain.revocation", False, "no ARK to check the CRL's signature with")
    ]


def test_an_ark_without_an_rsa_key_is_named(amd: FakeAmd) -> None:
    ark = _ark(amd)
    key = ec.generate_private_key(ec.SECP384R1())
    not_rsa = (
        x509.CertificateBuilder()
        .subject_name(ark.subject)
        .issuer_name(ark.subject)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(NOW - timedelta(days=1))
        .not_valid_after(NOW + timedelta(days=1))
        .sign(key, hashes.SHA384())
    )
    check, _ = _check(amd, amd.crl(), ark=not_rsa)
    assert (check.ok, check.detail) == (False, "ARK-Turin has no RSA key")


def test_a_crl_signed_with_pkcs1_not_pss_is_refused(amd: FakeAmd) -> None:
    assert amd.ark_key is not None
    crl = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(_ark(amd).subject)
        .last_update(datetime(2025, 5, 1, tzinfo=UTC))
        .next_update(datetime(2025, 7, 1, tzinfo=UTC))
        .sign(amd.ark_key, hashes.SHA384())  # the ARK's key, PKCS#1 v1.5
    )
    check, _ = _check(amd, crl.public_bytes(Encoding.DER))
    assert (check.ok, check.detail) == (False, "the CRL is not signed with RSASSA-PSS")


def test_a_crl_without_next_update_is_never_in_force(amd: FakeAmd) -> None:
    assert amd.ark_key is not None
    tbs, algorithm, _ = _inner(amd.crl())
    # tbsCertList: version, signature, issuer, thisUpdate, nextUpdate (left out here)
    fields = _inner(tbs)
    assert fields[4][0] in (0x17, 0x18)  # a UTCTime or GeneralizedTime: nextUpdate
    tbs = _seq(0x30, b"".join(fields[:4] + fields[5:]))
    signature = amd.ark_key.sign(tbs, _PSS, hashes.SHA384())
    crl = _seq(0x30, tbs + algorithm + _seq(0x03, b"\0" + signature))
    assert x509.load_der_x509_crl(crl).next_update_utc is None

    check, verdict = _check(amd, crl)
    assert (check.ok, check.detail) == (
        False,
        "the CRL is in force 2025-05-01T00:00:00Z .. (no nextUpdate), not at 2025-06-01T00:00:00Z",
    )
    assert verdict.facts["crl"] == {"issuer": "ARK-Turin", "this_update": "2025-05-01T00:00:00Z"}


def test_every_revoked_certificate_is_named_and_one_without_a_common_name_by_its_name(
    amd: FakeAmd,
) -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "No CN")])
    nameless = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(0x1234)
        .not_valid_before(NOW - timedelta(days=1))
        .not_valid_after(NOW + timedelta(days=1))
        .sign(key, hashes.SHA384())
    )
    ask, vek = amd.serial("ask"), amd.serial("vek")
    below = [*_below(amd), ("VLEK", nameless)]
    check, _ = _check(amd, amd.crl(revoked=(ask, vek, 0x1234)), below=below)
    assert (check.ok, check.detail) == (
        False,
        f"ASK SEV-Turin (serial {ask:#x}) is revoked since 2025-05-01T00:00:00Z; "
        f"VCEK SEV-VCEK (serial {vek:#x}) is revoked since 2025-05-01T00:00:00Z; "
        "VLEK O=No CN (serial 0x1234) is revoked since 2025-05-01T00:00:00Z",
    )


def test_what_a_passing_crl_says_it_checked_for_none_one_or_three_certificates(
    amd: FakeAmd,
) -> None:
    ask, vek = _below(amd)
    crl = amd.crl()
    window = "(2025-05-01T00:00:00Z .. 2025-07-01T00:00:00Z, 0 entries)"
    for below, listed in (
        ([], "does not list anything checked"),
        ([vek], f"does not list VCEK (serial {vek[1].serial_number:#x})"),
        (
            [ask, vek, ask],
            f"does not list ASK (serial {ask[1].serial_number:#x}), "
            f"VCEK (serial {vek[1].serial_number:#x}), ASK (serial {ask[1].serial_number:#x})",
        ),
    ):
        check, _ = _check(amd, crl, below=below)
        assert (check.ok, check.detail) == (True, f"ARK-Turin's CRL {window} {listed}")


@pytest.fixture
def new_york() -> Iterator[None]:
    """The process's local time zone set to one that is not UTC, then put back."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        yield
    finally:
        mp.undo()
        time.tzset()


def test_times_are_said_in_utc_whatever_the_local_zone(amd: FakeAmd, new_york: None) -> None:
    late = datetime(2025, 7, 1, 1, 0, tzinfo=timezone(timedelta(hours=2)))  # 23:00Z the day before
    check, verdict = _check(amd, amd.crl(), now=late + timedelta(days=1))
    assert check.detail.endswith("not at 2025-07-01T23:00:00Z")
    assert "in force 2025-05-01T00:00:00Z .. 2025-07-01T00:00:00Z" in check.detail
    assert verdict.facts["crl"]["next_update"] == "2025-07-01T00:00:00Z"
