"""KDS's addresses and the chain from its answers, word for word (``attestation.amd_kds``).

Why: ``test_amd_kds.py`` asks about reports whose CPUID names their product, so the layout a
product given by the caller decodes the TCB in, a zero FMC and the exact bytes of the chain
went unchecked. The chain is the test double of AMD's (``tests.attestation.snp_double``).
"""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from attestation.amd_kds import KdsError, chain_from_kds, chain_path, vcek_path
from attestation.snp import parse_report
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, FakeAmd, fake_amd, v5_report


@pytest.fixture(scope="module")
def turin() -> FakeAmd:
    return fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])


def test_a_product_given_by_the_caller_decodes_the_tcb_in_its_layout(turin: FakeAmd) -> None:
    """A report whose CPUID names no product (family 0x17) is read as Turin's when the caller
    says Turin: its REPORTED_TCB 1,2,3,4,0,0,0,0x55 is fmc 1, bl 2, tee 3, snp 4 (in Milan's
    layout it would be bl 1, tee 2, snp 0)."""
    report = parse_report(v5_report(turin.vek_key, cpuid_family=0x17))
    assert report.cpuid_product is None
    assert vcek_path(report, "Turin") == (
        "/vcek/v1/Turin/a0a1a2a3a4a5a6a7?fmcSPL=01&blSPL=02&teeSPL=03&snpSPL=04&ucodeSPL=85"
    )
    assert chain_path(report, "Turin") == "/vcek/v1/Turin/cert_chain"
    expected = x509.load_der_x509_certificate(turin.vek).public_bytes(Encoding.PEM) + turin.chain
    assert chain_from_kds(report, turin.vek, turin.chain, "Turin") == expected


def test_a_zero_fmc_is_asked_for_as_00(turin: FakeAmd) -> None:
    report = parse_report(
        v5_report(turin.vek_key, tcbs={"reported": bytes([0, 2, 3, 4, 0, 0, 0, 5])})
    )
    assert vcek_path(report) == (
        "/vcek/v1/Turin/a0a1a2a3a4a5a6a7?fmcSPL=00&blSPL=02&teeSPL=03&snpSPL=04&ucodeSPL=05"
    )


def test_the_chain_is_the_three_pem_certificates_and_nothing_between(turin: FakeAmd) -> None:
    report = parse_report(v5_report(turin.vek_key))
    vcek_pem = x509.load_der_x509_certificate(turin.vek).public_bytes(Encoding.PEM)
    assert chain_from_kds(report, turin.vek, turin.chain) == vcek_pem + turin.chain


def test_the_refusals_word_for_word(turin: FakeAmd) -> None:
    unknown = parse_report(v5_report(turin.vek_key, cpuid_family=0x17))
    with pytest.raises(KdsError) as raised:
        chain_path(unknown)
    assert str(raised.value) == (
        "the report (version 5) names no known product in its CPUID fields and none was"
        " given, so there is no KDS address for its VCEK"
    )
    other_chip = fake_amd("Turin", TURIN_TCB, bytes(8))
    with pytest.raises(KdsError) as raised:
        chain_from_kds(parse_report(v5_report(turin.vek_key)), other_chip.vek, turin.chain)
    assert str(raised.value) == "KDS's VCEK is for another chip than the report's CHIP_ID"
