"""KDS's addresses for a report's VCEK and chain, and the chain made from KDS's answers
(``attestation.amd_kds``). The chain and reports are the test double of AMD's
(``tests.attestation.snp_double``); the paths follow AMD publication 57230."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from attestation.amd_kds import KdsError, chain_from_kds, chain_path, vcek_path
from attestation.snp import parse_report, parse_vek, verify_snp
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, FakeAmd, fake_amd, v5_report

NOW = datetime(2026, 12, 1, tzinfo=UTC)
REAL_NOW = datetime(2025, 6, 1, tzinfo=UTC)  # inside the real certificates' windows
MILAN_CHIP = bytes(range(64))
#: v5_report's REPORTED_TCB bytes 1,2,3,4,0,0,0,0x55 in Milan's layout (byte 0 BOOT_LOADER,
#: 1 TEE, 6 SNP, 7 MICROCODE)
MILAN_TCB = {"bl": 1, "tee": 2, "snp": 0, "ucode": 0x55}


@pytest.fixture(scope="module")
def turin() -> FakeAmd:
    return fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])


def test_a_turin_vcek_is_asked_for_by_its_8_byte_hwid_with_fmc_first(turin: FakeAmd) -> None:
    report = parse_report(v5_report(turin.vek_key))
    assert vcek_path(report) == (
        "/vcek/v1/Turin/a0a1a2a3a4a5a6a7?fmcSPL=01&blSPL=02&teeSPL=03&snpSPL=04&ucodeSPL=85"
    )
    assert chain_path(report) == "/vcek/v1/Turin/cert_chain"


def test_a_milan_vcek_is_asked_for_by_all_64_bytes_of_chip_id() -> None:
    amd = fake_amd("Milan", MILAN_TCB, MILAN_CHIP)
    report = parse_report(v5_report(amd.vek_key, cpuid_family=0x19, chip_id=MILAN_CHIP))
    assert vcek_path(report) == (
        f"/vcek/v1/Milan/{MILAN_CHIP.hex()}?blSPL=01&teeSPL=02&snpSPL=00&ucodeSPL=85"
    )
    assert chain_path(report) == "/vcek/v1/Milan/cert_chain"


def test_three_digit_svns_are_written_whole(turin: FakeAmd) -> None:
    tcb = bytes([200, 201, 202, 203, 0, 0, 0, 255])
    report = parse_report(v5_report(turin.vek_key, tcbs={"reported": tcb}))
    assert vcek_path(report).endswith("?fmcSPL=200&blSPL=201&teeSPL=202&snpSPL=203&ucodeSPL=255")


def test_a_report_kds_cannot_be_asked_about_is_refused_naming_why(turin: FakeAmd) -> None:
    unknown = parse_report(v5_report(turin.vek_key, cpuid_family=0x17))
    with pytest.raises(KdsError, match=r"\(version 5\) names no known product"):
        vcek_path(unknown)
    with pytest.raises(KdsError, match="names no known product"):
        chain_path(unknown)
    raw = bytearray(v5_report(turin.vek_key))
    struct.pack_into("<I", raw, 0x048, 0b00101)  # SIGNING_KEY 1: a VLEK
    with pytest.raises(KdsError, match="signed by a vlek, not a VCEK"):
        vcek_path(parse_report(bytes(raw)))


def test_the_chain_from_kds_is_vcek_ask_ark_and_verifies(turin: FakeAmd) -> None:
    raw = v5_report(turin.vek_key)
    chain = chain_from_kds(parse_report(raw), turin.vek, turin.chain)
    certs = x509.load_pem_x509_certificates(chain)
    assert certs[0].public_bytes(Encoding.DER) == turin.vek
    assert b"".join(c.public_bytes(Encoding.PEM) for c in certs[1:]) == turin.chain
    vek, rest = chain[: chain.index(b"-----BEGIN", 1)], chain[chain.index(b"-----BEGIN", 1) :]
    verdict = verify_snp(raw, vek, rest, now=NOW, trusted_roots=turin.roots)
    assert verdict.accepted, verdict


def test_answers_that_do_not_belong_to_the_report_are_refused(turin: FakeAmd) -> None:
    report = parse_report(v5_report(turin.vek_key))
    other_chip = fake_amd("Turin", TURIN_TCB, bytes(8))
    with pytest.raises(KdsError, match="another chip"):
        chain_from_kds(report, other_chip.vek, turin.chain)
    older = fake_amd("Turin", {**TURIN_TCB, "snp": 3}, CHIP_ID[:8])
    with pytest.raises(KdsError, match=r"for TCB .*'snp': 3.*REPORTED_TCB is .*'snp': 4"):
        chain_from_kds(report, older.vek, turin.chain)
    vlek = fake_amd("Turin", TURIN_TCB, None, vek_cn="SEV-VLEK", csp_id="cloud")
    with pytest.raises(KdsError, match="another chip"):
        chain_from_kds(report, vlek.vek, turin.chain)
    with pytest.raises(KdsError, match="VCEK answer is not a VCEK certificate"):
        chain_from_kds(report, b"<html>not found</html>", turin.chain)
    with pytest.raises(KdsError, match="cert_chain holds 0 certificates, not 2"):
        chain_from_kds(report, turin.vek, b"<html>not found</html>")
    with pytest.raises(KdsError, match="cert_chain answer is not PEM certificates"):
        chain_from_kds(report, turin.vek, b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END")
    ask = turin.chain[: turin.chain.index(b"-----BEGIN", 1)]
    with pytest.raises(KdsError, match="holds 1 certificates, not 2"):
        chain_from_kds(report, turin.vek, ask)


# -- real reports and certificates: the public vectors ------------------------------------------

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "attestation"
REAL = [
    ("go-sev-guest/attestation.bin", "go-sev-guest/vcek.der", "go-sev-guest/ask_ark_milan.pem"),
    ("virtee-sev/report_milan.hex", "virtee-sev/vcek_milan.der", "virtee-sev/cert_chain_milan.pem"),
    ("trustee/test-report.bin", "trustee/test-vcek.der", "trustee/milan_ask_ark_asvk.pem"),
]


@pytest.fixture(scope="module")
def snp_vectors() -> Path:
    if not (VECTORS / "amd-sev-snp").is_dir():
        reason = f"{VECTORS} is absent: the public attestation vectors live in ../shared/vectors"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return VECTORS / "amd-sev-snp"


@pytest.mark.parametrize("report_file, vcek_file, chain_file", REAL)
def test_real_reports_get_the_address_of_their_own_vcek(
    snp_vectors: Path, report_file: str, vcek_file: str, chain_file: str
) -> None:
    """AMD's real version-2 reports name no product: the guest's CPUID gives it. The address
    then names exactly the chip and TCB the real VCEK's own extensions carry, and KDS's
    answers (the real VCEK, and the ASK and ARK as KDS serves them) make a chain that verifies
    against AMD's pinned roots."""
    report = parse_report((snp_vectors / report_file).read_bytes())
    vcek = (snp_vectors / vcek_file).read_bytes()
    assert report.version == 2 and report.cpuid_product is None
    with pytest.raises(KdsError, match="names no known product"):
        vcek_path(report)
    info = parse_vek(vcek)
    path = vcek_path(report, "Milan")
    where, _, query = path.partition("?")
    assert where == f"/vcek/v1/Milan/{info.hwid.hex() if info.hwid else None}"
    spls = dict(part.split("=") for part in query.split("&"))
    names = {"blSPL": "bl", "teeSPL": "tee", "snpSPL": "snp", "ucodeSPL": "ucode"}
    assert list(spls) == list(names)
    assert {names[k]: int(v) for k, v in spls.items()} == dict(info.tcb)
    assert chain_path(report, "Milan") == "/vcek/v1/Milan/cert_chain"
    ask, ark = x509.load_pem_x509_certificates((snp_vectors / chain_file).read_bytes())[:2]
    served = ask.public_bytes(Encoding.PEM) + ark.public_bytes(Encoding.PEM)
    chain = chain_from_kds(report, vcek, served, "Milan")
    first = chain.index(b"-----BEGIN", 1)
    verdict = verify_snp(report.raw, chain[:first], chain[first:], now=REAL_NOW)
    assert verdict.accepted, verdict
