"""AMD SEV-SNP reports: the public vectors' cases, tampering, and a generated version-5 report.

The public vectors are read in place from ``../shared/vectors/attestation`` (never copied into
the project); without that folder the vector tests skip, saying so. The generated-chain tests
(a test double of AMD's chain and a synthetic version-5 report) need nothing outside the
repository.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.serialization import Encoding

from attestation.amd_roots import AMD_ARK_SPKI_SHA256
from attestation.snp import (
    REPORT_SIZE,
    SIGNED_SIZE,
    decode_tcb,
    load_report,
    parse_vek,
    spki_sha256,
    verify_snp,
    verify_snp_chain,
)
from attestation.verdict import Verdict
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, FakeAmd, fake_amd, v5_report

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "attestation"
#: Inside every positive case's certificate validity (the VLEK of snp-04 ends 2025-12-10).
NOW = datetime(2025, 6, 1, tzinfo=UTC)
#: The manifest's SEV-SNP cases, as these tests run them.
HANDLED = {
    "snp-01-gosevguest-milan",
    "snp-02-virtee-milan",
    "snp-03-trustee-milan-idblock",
    "snp-04-trustee-milan-vlek-aws",
    "snp-05-trustee-azure-genoa",
    "snp-neg-01",
    "snp-neg-02",
    "snp-neg-03",
    "snp-neg-04",
    "snp-chain-turin",
}


@pytest.fixture(scope="module")
def snp_vectors() -> Path:
    """The SEV-SNP vectors folder; without it, the test skips and says why."""
    if not (VECTORS / "amd-sev-snp").is_dir():
        reason = (
            f"{VECTORS} is absent: the public attestation vectors live there "
            "(../shared/vectors beside the repository), so the SEV-SNP vector tests cannot run"
        )
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return VECTORS / "amd-sev-snp"


@pytest.fixture(scope="module")
def manifest(snp_vectors: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((snp_vectors.parent / "manifest.json").read_text())
    return data


@dataclass(frozen=True)
class Case:
    report: str
    vek: str
    chain: str | Callable[[Path], bytes]

    def load(self, root: Path) -> tuple[bytes, bytes, bytes]:
        chain = self.chain(root) if callable(self.chain) else (root / self.chain).read_bytes()
        return (root / self.report).read_bytes(), (root / self.vek).read_bytes(), chain


def _pem_certs(path: Path, pick: list[int]) -> bytes:
    certs = x509.load_pem_x509_certificates(path.read_bytes())
    return b"".join(certs[i].public_bytes(Encoding.PEM) for i in pick)


SNP01 = Case(
    "go-sev-guest/attestation.bin", "go-sev-guest/vcek.der", "go-sev-guest/ask_ark_milan.pem"
)
SNP02 = Case(
    "virtee-sev/report_milan.hex", "virtee-sev/vcek_milan.der", "virtee-sev/cert_chain_milan.pem"
)
SNP03 = Case("trustee/test-report.bin", "trustee/test-vcek.der", "trustee/milan_ask_ark_asvk.pem")
SNP04 = Case(
    "trustee/test-vlek-report.bin",
    "trustee/test-vlek.der",
    # the ARK (2nd) and the ASVK (3rd) of trustee's Milan file, ASVK first
    lambda root: _pem_certs(root / "trustee/milan_ask_ark_asvk.pem", [2, 1]),
)
SNP05 = Case(
    "trustee/az-snp-vtpm/genoa_snp_report.derived.bin",
    "trustee/az-snp-vtpm/vcek-genoa.pem",
    "go-sev-guest/ask_ark_genoa.pem",
)
POSITIVE = {"snp-01": SNP01, "snp-02": SNP02, "snp-03": SNP03, "snp-04": SNP04, "snp-05": SNP05}


def _verify(case: Case, root: Path, now: datetime = NOW) -> Verdict:
    return verify_snp(*case.load(root), now=now)


def _failed(verdict: Verdict) -> set[str]:
    return {c.name for c in verdict.failed}


def _explain(verdict: Verdict) -> str:
    return "\n".join(c.line() for c in verdict.checks)


# --- the public vectors ------------------------------------------------------------------


def test_every_snp_case_of_the_manifest_is_handled(manifest: dict[str, Any]) -> None:
    ids = {c["id"] for c in manifest["cases"] if c["kind"] == "amd-sev-snp"}
    assert ids == HANDLED


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_positive_case_accepts(name: str, snp_vectors: Path) -> None:
    verdict = _verify(POSITIVE[name], snp_vectors)
    assert verdict.accepted, _explain(verdict)
    made = {c.name for c in verdict.checks}
    assert {
        "chain.ark_self_signed",
        "chain.ark_pinned",
        "chain.ask_by_ark",
        "chain.vek_by_ask",
        "chain.validity",
        "report_signature",
        "vek.tcb",
        "vek.hwid",
        "vek.product",
        "vek.kind",
    } <= made


@pytest.mark.parametrize(
    ("name", "facts"),
    [
        (
            "snp-01",
            {
                "version": 2,
                "policy": "0xb0000",
                "debug": True,
                "measurement": "b07af9620f3b839b47996422ddec6058338951d984e312115131ea82705eaf5b6bdf8a9ece31a5a608eb0cf2e4872b01",
                "report_data": "0102030405" + "00" * 59,
                "reported_tcb": {"bl": 2, "tee": 0, "snp": 5, "ucode": 68},
                "product": "Milan-B0",
                "signing_key": "vcek",
            },
        ),
        (
            "snp-02",
            {
                "version": 2,
                "policy": "0x30000",
                "debug": False,
                "measurement": "7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd81841f",
                "reported_tcb": {"bl": 3, "tee": 0, "snp": 8, "ucode": 115},
            },
        ),
        (
            "snp-03",
            {
                "version": 2,
                "policy": "0x3001f",
                "guest_svn": 4,
                "family_id": "01" + "00" * 15,
                "image_id": "02" + "00" * 15,
                "id_key_digest": "0356215882a825279a85b300b0b742931d113bf7e32dde2e50ffde7ec743ca491ecdd7f336dc28a6e0b2bb57af7a44a3",
                "measurement": "a1f3930413247bb38cfc171579ea3c12d5fe4901f0c792f63fd75d98f1ef827c23500644e0e692e6be917f9050d3d38c",
                # CURRENT_TCB differs (ucode 0xce); the VCEK matches REPORTED_TCB
                "reported_tcb": {"bl": 3, "tee": 0, "snp": 8, "ucode": 0x73},
            },
        ),
        (
            "snp-04",
            {
                "version": 3,
                "vmpl": 1,
                "signing_key": "vlek",
                "report_signing_key": "vlek",
                "chip_id": "00" * 64,
                "reported_tcb": {"bl": 4, "tee": 0, "snp": 24, "ucode": 217},
                "cpuid": {"family": 0x19, "model": 1, "stepping": 1},
                "measurement": "8922ebbdd00ec2c541f36a6e7a82a8773a7accb451ed67bc94e740dbe92c93c4e8c9af857f5ceeb5a493df2a570d7bf0",
            },
        ),
        (
            "snp-05",
            {
                "version": 3,
                "policy": "0x3001f",
                "product": "Genoa",
                "measurement": "f57dc09a507c6ecd82369bffb600f0003792f4d99bc26e985ec0c266fc34faf3706faf814c9e61065768a6ff917c89ae",
                "report_data": "b581f12e29a2d7d64e5e0b738d563879a78b51c644d0fa0cce02b48699f6bf5f"
                + "00" * 32,
                "reported_tcb": {"bl": 10, "tee": 0, "snp": 23, "ucode": 84},
            },
        ),
    ],
)
def test_positive_case_facts(name: str, facts: dict[str, Any], snp_vectors: Path) -> None:
    got = _verify(POSITIVE[name], snp_vectors).facts
    assert {k: got.get(k) for k in facts} == facts


def test_snp01_chip_id_is_the_vcek_hwid(snp_vectors: Path) -> None:
    facts = _verify(SNP01, snp_vectors).facts
    assert facts["chip_id"].startswith("3ac3fe21") and facts["chip_id"].endswith("6b5d")
    vek = parse_vek((snp_vectors / SNP01.vek).read_bytes())
    assert vek.hwid is not None and vek.hwid.hex() == facts["chip_id"]


def test_snp03_current_tcb_differs_from_reported(snp_vectors: Path) -> None:
    report = load_report((snp_vectors / SNP03.report).read_bytes())
    assert report.current_tcb.ucode == 0xCE and report.reported_tcb.ucode == 0x73
    assert report.author_key_en is False and report.id_key_digest != bytes(48)


def test_snp04_vlek_has_no_hwid_and_that_is_not_a_failure(snp_vectors: Path) -> None:
    verdict = _verify(SNP04, snp_vectors)
    hwid = next(c for c in verdict.checks if c.name == "vek.hwid")
    assert hwid.ok is None and "VLEK" in hwid.detail and "amazonaws" in hwid.detail
    assert verdict.accepted


@pytest.mark.parametrize(
    ("now", "accepted"),
    [
        (datetime(2024, 12, 10, 22, 14, 20, tzinfo=UTC), False),  # a second before the VLEK
        (datetime(2024, 12, 10, 22, 14, 21, tzinfo=UTC), True),
        (datetime(2025, 6, 1, tzinfo=UTC), True),
        (datetime(2025, 12, 10, 22, 14, 21, tzinfo=UTC), True),
        (datetime(2025, 12, 10, 22, 14, 22, tzinfo=UTC), False),  # a second after it expired
        (datetime(2026, 6, 1, tzinfo=UTC), False),
    ],
)
def test_snp04_accepts_only_inside_the_vlek_validity(
    now: datetime, accepted: bool, snp_vectors: Path
) -> None:
    verdict = _verify(SNP04, snp_vectors, now)
    assert verdict.accepted is accepted, _explain(verdict)
    if not accepted:
        assert _failed(verdict) == {"chain.validity"}
        assert "SEV-VLEK is valid 2024-12-10T22:14:21Z .. 2025-12-10T22:14:21Z" in next(
            c.detail for c in verdict.failed
        )


def test_snp04_with_the_whole_trustee_file(snp_vectors: Path) -> None:
    """ASK, ARK and ASVK in one file: the ASVK that issued the VLEK is the one used."""
    case = Case(SNP04.report, SNP04.vek, "trustee/milan_ask_ark_asvk.pem")
    verdict = _verify(case, snp_vectors)
    assert verdict.accepted, _explain(verdict)
    assert verdict.facts["chain"] == ["ARK-Milan", "SEV-VLEK-Milan", "SEV-VLEK"]


def test_snp05_with_trustee_genoa_chain(snp_vectors: Path) -> None:
    case = Case(
        SNP05.report,
        SNP05.vek,
        lambda root: _pem_certs(root / "trustee/genoa_ask_ark_asvk.pem", [0, 1]),
    )
    assert _verify(case, snp_vectors).accepted


def test_neg01_genoa_vcek_against_the_milan_chain(snp_vectors: Path) -> None:
    case = Case(SNP05.report, SNP05.vek, "go-sev-guest/ask_ark_milan.pem")
    verdict = _verify(case, snp_vectors)
    assert not verdict.accepted
    assert "chain.vek_by_ask" in _failed(verdict)
    assert "vek.product" in _failed(verdict)


def test_neg02_report_with_another_chips_vcek(snp_vectors: Path) -> None:
    case = Case(SNP01.report, SNP02.vek, SNP01.chain)
    verdict = _verify(case, snp_vectors)
    assert not verdict.accepted
    assert {"report_signature", "vek.hwid", "vek.tcb"} <= _failed(verdict)
    assert "chain.vek_by_ask" not in _failed(verdict)  # a genuine VCEK, of another chip


@pytest.mark.parametrize("vek", ["test-vcek-invalid-legacy.der", "test-vcek-invalid-new.der"])
def test_neg03_synthetic_vceks_reject_but_parse(vek: str, snp_vectors: Path) -> None:
    case = Case(SNP03.report, f"trustee/{vek}", SNP03.chain)
    verdict = _verify(case, snp_vectors)
    assert not verdict.accepted
    assert {"chain.vek_by_ask", "report_signature"} <= _failed(verdict)
    # legacy: raw 64-byte hwID; new: the same bytes inside a DER OCTET STRING
    info = parse_vek((snp_vectors / "trustee" / vek).read_bytes())
    assert info.kind == "vcek" and info.hwid == bytes(range(64))


def test_neg04_bit_flips_in_the_signed_bytes_reject(snp_vectors: Path) -> None:
    report, vek, chain = SNP01.load(snp_vectors)
    rng = random.Random(20250601)
    positions = sorted(rng.sample(range(SIGNED_SIZE), 64))
    assert 0x90 not in positions
    positions.append(0x90)  # the manifest's example: the first measurement byte
    wrong = []
    for pos in positions:
        bit = rng.randrange(8)
        tampered = bytearray(report)
        tampered[pos] ^= 1 << bit
        verdict = verify_snp(bytes(tampered), vek, chain, now=NOW)
        if verdict.accepted or "report_signature" not in _failed(verdict):
            wrong.append(f"byte {pos:#x} bit {bit}")
    assert not wrong, f"{len(wrong)} flips not rejected on report_signature: {wrong}"


def test_flips_in_the_signature_or_after_it(snp_vectors: Path) -> None:
    report, vek, chain = SNP01.load(snp_vectors)
    r_flip = bytearray(report)
    r_flip[SIGNED_SIZE] ^= 1
    assert "report_signature" in _failed(verify_snp(bytes(r_flip), vek, chain, now=NOW))
    reserved = bytearray(report)
    reserved[REPORT_SIZE - 1] ^= 1  # the unsigned reserved tail of SIGNATURE
    assert verify_snp(bytes(reserved), vek, chain, now=NOW).accepted


def test_turin_chain_accepts(snp_vectors: Path) -> None:
    vek = (snp_vectors / "virtee-sev/vcek_turin.der").read_bytes()
    chain = (snp_vectors / "virtee-sev/cert_chain_turin.pem").read_bytes()
    verdict = verify_snp_chain(vek, chain, now=NOW)
    assert verdict.accepted, _explain(verdict)
    assert verdict.facts["product"] == "Turin"
    info = parse_vek(vek)
    assert info.product == "Turin" and "fmc" in info.tcb and info.tcb["ucode"] == 9
    assert info.hwid is not None and len(info.hwid) == 8  # Turin: CHIP_ID[0:8]
    assert not verify_snp_chain(vek, chain, now=datetime(2024, 11, 1, tzinfo=UTC)).accepted


def test_turin_chain_of_go_sev_guest_accepts(snp_vectors: Path) -> None:
    vek = (snp_vectors / "virtee-sev/vcek_turin.der").read_bytes()
    chain = (snp_vectors / "go-sev-guest/ask_ark_turin_vcek.pem").read_bytes()
    assert verify_snp_chain(vek, chain, now=NOW).accepted


def test_pinned_roots_are_the_vector_arks(snp_vectors: Path) -> None:
    """The pins in attestation.amd_roots are the ARKs of the public chains, one per product."""
    files = {
        "Milan": "go-sev-guest/ask_ark_milan.pem",
        "Genoa": "go-sev-guest/ask_ark_genoa.pem",
        "Turin": "virtee-sev/cert_chain_turin.pem",
    }
    for product, name in files.items():
        certs = x509.load_pem_x509_certificates((snp_vectors / name).read_bytes())
        ark = next(c for c in certs if c.subject == c.issuer)
        assert ark.subject.rfc4514_string().startswith(f"CN=ARK-{product},")
        assert AMD_ARK_SPKI_SHA256[product] == spki_sha256(ark)


def test_an_unpinned_root_rejects(snp_vectors: Path) -> None:
    report, vek, chain = SNP01.load(snp_vectors)
    only_genoa = {"Genoa": AMD_ARK_SPKI_SHA256["Genoa"]}
    verdict = verify_snp(report, vek, chain, now=NOW, trusted_roots=only_genoa)
    assert _failed(verdict) == {"chain.ark_pinned"}


def test_hex_text_parses_like_the_bytes(snp_vectors: Path) -> None:
    text = (snp_vectors / SNP02.report).read_bytes()
    assert len(text) == 2 * REPORT_SIZE and text.isupper() is True
    raw = bytes.fromhex(text.decode())
    for form in (text, text.decode(), text.lower() + b"\n", raw):
        report = load_report(form)
        assert report.raw == raw and report.version == 2
    assert load_report(text).measurement.hex().startswith("7a1e5c26")


def test_bad_input_is_a_clear_value_error(snp_vectors: Path) -> None:
    raw = (snp_vectors / SNP01.report).read_bytes()
    with pytest.raises(ValueError, match=r"0x4a0 \(1184\) bytes.*got 1183 bytes"):
        load_report(raw[:-1])
    with pytest.raises(ValueError, match="got 2366 hex digits"):
        load_report(raw.hex()[:-2])
    for version in (0, 1, 6, 0x02000002):
        bad = struct.pack("<I", version) + raw[4:]
        with pytest.raises(ValueError, match=f"version {version} is not supported"):
            load_report(bad)
    verdict = verify_snp(raw[:100], *SNP01.load(snp_vectors)[1:], now=NOW)
    assert "report.parse" in _failed(verdict) and not verdict.accepted
    with pytest.raises(ValueError, match="timezone-aware"):
        verify_snp(raw, *SNP01.load(snp_vectors)[1:], now=datetime(2025, 6, 1))


def test_garbage_certificates_reject(snp_vectors: Path) -> None:
    report, vek, _ = SNP01.load(snp_vectors)
    verdict = verify_snp(report, vek, b"not a certificate", now=NOW)
    assert not verdict.accepted and "chain.ark_self_signed" in _failed(verdict)
    verdict = verify_snp(report, vek, b"", now=NOW)
    assert not verdict.accepted


def test_the_serial_zero_warning_is_silenced(snp_vectors: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _verify(SNP01, snp_vectors).accepted


# --- TCB layouts -------------------------------------------------------------------------


def test_tcb_layouts_per_product() -> None:
    raw = int.from_bytes(bytes([1, 2, 3, 4, 0, 0, 6, 7]), "little")
    milan = decode_tcb(raw, "Milan-B0")
    assert (milan.bl, milan.tee, milan.snp, milan.ucode, milan.fmc) == (1, 2, 6, 7, None)
    assert decode_tcb(raw, "Genoa").as_dict() == milan.as_dict()
    assert decode_tcb(raw, None).as_dict() == milan.as_dict()
    turin = decode_tcb(raw, "Turin")
    assert turin.as_dict() == {"fmc": 1, "bl": 2, "tee": 3, "snp": 4, "ucode": 7}


# --- a generated chain and a version-5 report (test doubles) -----------------------------


@pytest.fixture(scope="module")
def fake_turin() -> FakeAmd:
    return fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])


def test_v5_fields_parse_at_their_offsets(fake_turin: FakeAmd) -> None:
    """A synthetic version-5 report (test double), checked field by field against ABI 1.58."""
    report = load_report(v5_report(fake_turin.vek_key))
    assert report.version == 5 and report.guest_svn == 7
    assert report.policy == 0xB0000 and report.debug and not report.migrate_ma
    assert report.smt_allowed and report.abi_major == 0 and report.abi_minor == 0
    assert (report.family_id, report.image_id) == (b"F" * 16, b"I" * 16)
    assert (report.vmpl, report.signature_algo) == (2, 1)
    assert report.platform_info == 0x25
    assert report.author_key_en and not report.mask_chip_key and report.signing_key_kind == "vcek"
    assert report.report_data == bytes(range(64))
    assert report.measurement == bytes(range(100, 148))
    assert report.host_data == b"H" * 32
    assert (report.id_key_digest, report.author_key_digest) == (b"K" * 48, b"A" * 48)
    assert (report.report_id, report.report_id_ma) == (b"R" * 32, b"M" * 32)
    assert (report.cpuid_fam_id, report.cpuid_mod_id, report.cpuid_step) == (0x1A, 2, 1)
    assert report.cpuid_product == "Turin"
    assert report.reported_tcb.layout == "turin"  # chosen by CPUID family 0x1A
    assert report.reported_tcb.as_dict() == TURIN_TCB
    assert report.current_tcb.ucode == 0x66 and report.current_tcb.fmc == 1
    assert report.committed_tcb.ucode == 0x60 and report.launch_tcb.ucode == 0x50
    assert report.chip_id == CHIP_ID
    assert (report.current_major, report.current_minor, report.current_build) == (1, 55, 21)
    assert (report.committed_major, report.committed_minor, report.committed_build) == (1, 55, 20)
    assert report.launch_mit_vector == 0x1122334455667788
    assert report.current_mit_vector == 0x99AABBCCDDEEFF00


def test_v3_has_no_mitigation_vectors_and_v2_no_cpuid(fake_turin: FakeAmd) -> None:
    raw = bytearray(v5_report(fake_turin.vek_key))
    raw[0:4] = struct.pack("<I", 3)
    v3 = load_report(bytes(raw))
    assert v3.launch_mit_vector is None and v3.current_mit_vector is None
    assert v3.cpuid_fam_id == 0x1A
    raw[0:4] = struct.pack("<I", 2)
    v2 = load_report(bytes(raw))
    assert v2.cpuid_fam_id is None and v2.cpuid_product is None
    assert v2.reported_tcb.layout == "milan-genoa"  # nothing says Turin: the default layout
    assert v2.with_product("Turin").reported_tcb.as_dict() == TURIN_TCB


def test_v5_report_verifies_with_a_test_chain(fake_turin: FakeAmd) -> None:
    """Test double: a throwaway RSA-PSS chain and P-384 VCEK, trusted only through
    ``trusted_roots``; never AMD's keys."""
    report = v5_report(fake_turin.vek_key)
    verdict = verify_snp(
        report, fake_turin.vek, fake_turin.chain, now=NOW, trusted_roots=fake_turin.roots
    )
    assert verdict.accepted, _explain(verdict)
    facts = verdict.facts
    assert facts["version"] == 5 and facts["debug"] is True and facts["vmpl"] == 2
    assert facts["reported_tcb"] == TURIN_TCB
    assert facts["launch_mit_vector"] == "0x1122334455667788"
    assert facts["current_mit_vector"] == "0x99aabbccddeeff00"
    assert facts["product"] == "Turin" and facts["signing_key"] == "vcek"
    hwid = next(c for c in verdict.checks if c.name == "vek.hwid")
    assert hwid.ok is True and "[0:8]" in hwid.detail
    # the same chain is refused under the default pins: it is not AMD's
    default = verify_snp(report, fake_turin.vek, fake_turin.chain, now=NOW)
    assert _failed(default) == {"chain.ark_pinned"}


def test_v5_tampering_and_mismatches_reject(fake_turin: FakeAmd) -> None:
    report = v5_report(fake_turin.vek_key)

    def check(raw: bytes) -> set[str]:
        return _failed(
            verify_snp(
                raw, fake_turin.vek, fake_turin.chain, now=NOW, trusted_roots=fake_turin.roots
            )
        )

    flipped = bytearray(report)
    flipped[0x1F8] ^= 0x01  # LAUNCH_MIT_VECTOR is signed
    assert check(bytes(flipped)) == {"report_signature"}
    # a re-signed report whose REPORTED_TCB's fmc differs from the certificate's
    other = bytearray(report)
    other[0x180] = 9
    assert "vek.tcb" in check(_resign(bytes(other), fake_turin.vek_key))
    # a report whose CPUID says Milan, signed by a Turin VCEK
    milan = v5_report(fake_turin.vek_key, cpuid_family=0x19)
    assert "vek.product" in check(milan)
    # the report says VLEK, but a VCEK signed it
    vlek = bytearray(report)
    vlek[0x048] = 0b00101
    assert check(_resign(bytes(vlek), fake_turin.vek_key)) == {"vek.kind"}
    # an unknown signature algorithm
    algo = bytearray(report)
    algo[0x034] = 2
    assert "report_signature" in check(_resign(bytes(algo), fake_turin.vek_key))


def _resign(raw: bytes, key: ec.EllipticCurvePrivateKey) -> bytes:
    der = key.sign(raw[:SIGNED_SIZE], ec.ECDSA(hashes.SHA384()))
    sig_r, sig_s = decode_dss_signature(der)
    return (
        raw[:SIGNED_SIZE]
        + sig_r.to_bytes(72, "little")
        + sig_s.to_bytes(72, "little")
        + raw[SIGNED_SIZE + 144 :]
    )
