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
from datetime import UTC, datetime, timedelta, timezone, tzinfo
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
from tests.attestation.snp_double import (
    CHIP_ID,
    TURIN_TCB,
    FakeAmd,
    fake_amd,
    v5_report,
    vek_with_extensions,
)

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
    report = load_report(v5_report(fake_turin.vek_key, policy=0xB0000, vmpl=2))
    assert report.version == 5 and report.guest_svn == 7
    assert report.policy == 0xB0000 and report.debug and not report.migrate_ma
    assert report.smt_allowed and report.abi_major == 0 and report.abi_minor == 0
    assert (report.family_id, report.image_id) == (b"F" * 16, b"I" * 16)
    assert (report.vmpl, report.signature_algo) == (2, 1)
    assert report.platform_info == 0x25 and report.smt_enabled
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
    assert facts["version"] == 5 and facts["debug"] is False and facts["vmpl"] == 0
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


# --- one break each in the chain or the key, on a generated chain (test doubles) ----------
# Each test here fails if its one line of attestation/snp.py is broken (issue #16 line 14).

#: Milan TCB_VERSION of the synthetic report's REPORTED_TCB bytes [1, 2, 3, 4, 0, 0, 0, 0x55]
#: (byte 0 BOOT_LOADER, 1 TEE, 6 SNP, 7 MICROCODE)
MILAN_TCB = {"bl": 1, "tee": 2, "snp": 0, "ucode": 0x55}


def _judge(amd: FakeAmd, report: bytes, now: datetime = NOW) -> Verdict:
    return verify_snp(report, amd.vek, amd.chain, now=now, trusted_roots=amd.roots)


def _check(verdict: Verdict, name: str) -> Any:
    return next(c for c in verdict.checks if c.name == name)


def _last_byte_flipped(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0x01])


def test_turin_hwid_differing_from_chip_id_in_its_last_byte_rejects() -> None:
    amd = fake_amd("Turin", TURIN_TCB, _last_byte_flipped(CHIP_ID[:8]))
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _failed(verdict) == {"vek.hwid"}, _explain(verdict)
    assert "CHIP_ID[0:8] a0a1a2a3a4a5a6a7" in _check(verdict, "vek.hwid").detail


def test_milan_hwid_differing_from_chip_id_in_its_last_byte_rejects() -> None:
    """A 64-byte hwID is compared whole: CHIP_ID[63] alone differs."""
    chip_id = bytes(range(1, 65))
    good = fake_amd("Milan", MILAN_TCB, chip_id)
    report = v5_report(good.vek_key, cpuid_family=0x19, chip_id=chip_id)
    verdict = _judge(good, report)
    assert verdict.accepted, _explain(verdict)
    assert _check(verdict, "vek.hwid").detail == "the VCEK's hwID equals CHIP_ID"
    bad = fake_amd("Milan", MILAN_TCB, _last_byte_flipped(chip_id))
    report = v5_report(bad.vek_key, cpuid_family=0x19, chip_id=chip_id)
    verdict = _judge(bad, report)
    assert _failed(verdict) == {"vek.hwid"}
    assert _check(verdict, "vek.hwid").detail == (
        f"the VCEK's hwID (64 bytes) {_last_byte_flipped(chip_id).hex()} is not "
        f"CHIP_ID {chip_id.hex()}"
    )


@pytest.mark.parametrize("size", [8, 32, 63])
def test_milan_hwid_that_is_only_a_prefix_of_chip_id_rejects(size: int) -> None:
    """A Milan VCEK's hwID is all 64 bytes of CHIP_ID; a prefix of them binds no chip."""
    chip_id = bytes(range(1, 65))
    amd = fake_amd("Milan", MILAN_TCB, chip_id[:size])
    verdict = _judge(amd, v5_report(amd.vek_key, cpuid_family=0x19, chip_id=chip_id))
    assert _failed(verdict) == {"vek.hwid"}, _explain(verdict)
    assert f"({size} bytes)" in _check(verdict, "vek.hwid").detail


def test_turin_hwid_of_the_whole_chip_id_rejects() -> None:
    """A Turin VCEK carries CHIP_ID[0:8]: 64 bytes there are not a Turin hwID."""
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID)
    assert _failed(_judge(amd, v5_report(amd.vek_key))) == {"vek.hwid"}


def test_a_vcek_without_hwid_rejects() -> None:
    amd = fake_amd("Turin", TURIN_TCB, None)
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _failed(verdict) == {"vek.hwid"}, _explain(verdict)
    assert _check(verdict, "vek.hwid").detail == (
        "the VCEK has no hwID extension (1.3.6.1.4.1.3704.1.4)"
    )


def test_a_p256_vcek_rejects_though_its_signature_verifies() -> None:
    """AMD's VCEK is P-384; a P-256 key signing the report (ECDSA SHA-384) is refused."""
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8], vek_curve=ec.SECP256R1())
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _failed(verdict) == {"report_signature"}, _explain(verdict)
    assert _check(verdict, "report_signature").detail == "SEV-VCEK has no ECDSA P-384 key"


def test_an_ask_naming_another_issuer_rejects_though_the_ark_signed_it() -> None:
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8], ask_issuer="ARK-Elsewhere")
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _failed(verdict) == {"chain.ask_by_ark"}, _explain(verdict)
    assert _check(verdict, "chain.ask_by_ark").detail == (
        "SEV-Turin names its issuer O=Test double\\, not AMD,CN=ARK-Elsewhere"
    )


def test_a_vcek_naming_another_issuer_rejects_though_the_ask_signed_it() -> None:
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8], vek_issuer="SEV-Elsewhere")
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _failed(verdict) == {"chain.vek_by_ask"}, _explain(verdict)
    assert "SEV-VCEK names its issuer" in _check(verdict, "chain.vek_by_ask").detail


@pytest.mark.parametrize(
    ("window", "shown"),
    [
        # the ARK expired a day before NOW; the ASK and the VCEK run to 2034
        (
            (datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 5, 31, tzinfo=UTC)),
            "ARK-Turin is valid 2025-01-01T00:00:00Z .. 2025-05-31T00:00:00Z",
        ),
        # the ARK becomes valid a day after NOW
        (
            (datetime(2025, 6, 2, tzinfo=UTC), datetime(2035, 1, 1, tzinfo=UTC)),
            "ARK-Turin is valid 2025-06-02T00:00:00Z .. 2035-01-01T00:00:00Z",
        ),
    ],
)
def test_an_ark_outside_its_validity_rejects_while_ask_and_vcek_are_valid(
    window: tuple[datetime, datetime], shown: str
) -> None:
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8], ark_validity=window)
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _failed(verdict) == {"chain.validity"}, _explain(verdict)
    assert _check(verdict, "chain.validity").detail == f"at 2025-06-01T00:00:00Z: {shown}"


def test_validity_holds_on_both_edges_of_the_window() -> None:
    """Inclusive at both ends: valid at notBefore and at notAfter, not a second outside."""
    start, end = datetime(2025, 1, 1, tzinfo=UTC), datetime(2035, 1, 1, tzinfo=UTC)
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8], ark_validity=(start, end))
    report = v5_report(amd.vek_key)
    assert _judge(amd, report, start).accepted
    second = timedelta(seconds=1)
    assert _failed(_judge(amd, report, start - second)) == {"chain.validity"}
    # the VCEK ends 2034-12-30 (3650 days from 2025-01-01): the ARK's end is past it
    vek_end = start + timedelta(days=3650)
    assert _judge(amd, report, vek_end).accepted
    assert _failed(_judge(amd, report, vek_end + second)) == {"chain.validity"}


def test_the_accepted_verdict_reads_in_full(fake_turin: FakeAmd) -> None:
    """Every check's line and every fact of an accepted report, exactly as a person reads
    them (``affidavit attest`` prints these)."""
    verdict = _judge(fake_turin, v5_report(fake_turin.vek_key))
    fp = fake_turin.roots["Turin"]
    assert [c.line() for c in verdict.checks] == [
        "ok   chain.ark_self_signed: ARK-Turin signs itself (RSA-PSS SHA-384, salt 48)",
        f"ok   chain.ark_pinned: ARK-Turin is the pinned AMD Turin root (SPKI SHA-256 {fp})",
        "ok   chain.ask_by_ark: SEV-Turin is signed by ARK-Turin (RSA-PSS SHA-384, salt 48)",
        "ok   chain.vek_by_ask: SEV-VCEK is signed by SEV-Turin (RSA-PSS SHA-384, salt 48)",
        "ok   chain.validity: all 3 certificates are valid at 2025-06-01T00:00:00Z "
        "(SEV-VCEK until 2034-12-30T00:00:00Z)",
        "skip chain.revocation: no CRL given (--crl): revocation was not checked",
        "ok   report_signature: ECDSA P-384 SHA-384 over bytes [0, 0x2A0) verifies with "
        "SEV-VCEK's key",
        "ok   vek.product: the certificate is for Turin, the root is AMD's Turin, "
        "the report's CPUID says Turin",
        "ok   vek.kind: the report says VCEK and a VCEK signed it",
        "ok   vek.tcb: REPORTED_TCB (fmc=1, bl=2, tee=3, snp=4, ucode=85, turin layout) matches",
        "ok   vek.hwid: the VCEK's hwID equals CHIP_ID [0:8]",
    ]
    tcb = {"fmc": 1, "bl": 2, "tee": 3, "snp": 4}
    assert verdict.facts == {
        "version": 5,
        "measurement": bytes(range(100, 148)).hex(),
        "report_data": bytes(range(64)).hex(),
        "host_data": "48" * 32,
        "policy": "0x30000",
        "debug": False,
        "migrate_ma": False,
        "abi": "0.0",
        "smt_allowed": True,
        "smt_enabled": True,
        "single_socket": False,
        "vmpl": 0,
        "guest_svn": 7,
        "reported_tcb": {**tcb, "ucode": 0x55},
        "current_tcb": {**tcb, "ucode": 0x66},
        "committed_tcb": {**tcb, "ucode": 0x60},
        "launch_tcb": {**tcb, "ucode": 0x50},
        "chip_id": CHIP_ID.hex(),
        "id_key_digest": "4b" * 48,
        "author_key_digest": "41" * 48,
        "family_id": "46" * 16,
        "image_id": "49" * 16,
        "platform_info": "0x25",
        "report_signing_key": "vcek",
        "firmware": "1.55.21",
        "committed_firmware": "1.55.20",
        "cpuid": {"family": 0x1A, "model": 2, "stepping": 1},
        "launch_mit_vector": "0x1122334455667788",
        "current_mit_vector": "0x99aabbccddeeff00",
        "ark_spki_sha256": fp,
        "chain": ["ARK-Turin", "SEV-Turin", "SEV-VCEK"],
        "signing_key": "vcek",
        "product": "Turin",
    }


# --- AMD's extensions as written: DER lengths, both hwID forms, fallbacks -------------------

_BL = "TCB extension 1.3.6.1.4.1.3704.1.3.1"


@pytest.mark.parametrize(
    ("raw", "svn"),
    [
        (b"\x02\x01\x05", 5),
        (b"\x02\x02\x01\x00", 256),
        (b"\x02\x81\x01\x05", 5),  # long form, one length byte
        (b"\x02\x82\x01\x00\x01" + bytes(255), 256**255),  # two length bytes: 256
        (b"\x02\x84\x00\x00\x00\x01\x05", 5),  # four length bytes, the most read
    ],
)
def test_a_tcb_extension_reads_in_short_and_long_form(raw: bytes, svn: int) -> None:
    assert parse_vek(vek_with_extensions({"3.1": raw})).tcb == {"bl": svn}


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"\x02", "not a DER value with tag 0x02"),
        (b"\x03\x01\x05", "not a DER value with tag 0x02"),
        (b"\x02\x00", "not a non-negative DER INTEGER"),
        (b"\x02\x01\x85", "not a non-negative DER INTEGER"),
        (b"\x02\x81\x00", "not a non-negative DER INTEGER"),
        (b"\x02\x80\x05", "bad DER length"),
        (b"\x02\x85\x00\x00\x00\x00\x01\x05", "bad DER length"),
        (b"\x02\x82\x00", "bad DER length"),
        (b"\x02\x02\x05", "DER length 2 does not match 1 bytes"),
        (b"\x02\x81\x02\x05", "DER length 2 does not match 1 bytes"),
    ],
)
def test_a_malformed_tcb_extension_is_a_value_error_naming_it(raw: bytes, why: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_vek(vek_with_extensions({"3.1": raw}))
    assert str(caught.value) == f"{_BL}: {why}"


@pytest.mark.parametrize(
    ("raw", "hwid"),
    [
        (bytes([4, 62]) + bytes(range(62)), bytes([4, 62]) + bytes(range(62))),  # raw 64 bytes
        (b"\x04\x40" + bytes(range(64)), bytes(range(64))),  # an OCTET STRING around them
        (b"\x04\x08" + bytes(range(8)), bytes(range(8))),  # Turin's 8, wrapped
        (b"\x04\x05" + bytes(range(5)), b"\x04\x05" + bytes(range(5))),  # 5: not a hwID size
        (bytes(range(8)), bytes(range(8))),  # Turin's 8, raw
    ],
)
def test_hwid_raw_or_wrapped(raw: bytes, hwid: bytes) -> None:
    assert parse_vek(vek_with_extensions({"4": raw})).hwid == hwid


def test_product_name_and_csp_id_as_ia5_or_raw() -> None:
    ia5 = parse_vek(vek_with_extensions({"2": b"\x16\x05Genoa", "5": b"\x16\x03aws"}))
    assert (ia5.product_name, ia5.product, ia5.csp_id) == ("Genoa", "Genoa", "aws")
    raw = parse_vek(vek_with_extensions({"2": b"Milan-B0", "5": b"gcp"}))
    assert (raw.product_name, raw.product, raw.csp_id) == ("Milan-B0", "Milan", "gcp")
    odd = parse_vek(vek_with_extensions({"2": b"\x16\x02\xff\xfe", "5": b"\x16\x01\xff"}))
    assert (odd.product_name, odd.csp_id) == ("\x16\x02\ufffd\ufffd", "\x16\x01\ufffd")
    none = parse_vek(vek_with_extensions({}))
    assert (none.product_name, none.product, none.csp_id, none.hwid, none.tcb) == (
        None,
        None,
        None,
        None,
        {},
    )


@pytest.mark.parametrize(
    ("cn", "extensions", "kind"),
    [
        ("SEV-VCEK", {"4": bytes(64)}, "vcek"),
        ("SEV-VLEK", {}, "vlek"),
        ("sev-vlek", {}, "vlek"),  # the name read in any case
        ("SEV-Key", {"5": b"\x16\x03aws"}, "vlek"),  # a CSP id and no hwID
        ("SEV-Key", {"5": b"\x16\x03aws", "4": bytes(64)}, "vcek"),
        ("SEV-Key", {}, "vcek"),
    ],
)
def test_the_kind_of_key(cn: str, extensions: dict[str, bytes], kind: str) -> None:
    assert parse_vek(vek_with_extensions(extensions, cn=cn)).kind == kind


def test_parse_vek_wants_exactly_one_certificate(fake_turin: FakeAmd) -> None:
    with pytest.raises(ValueError, match=r"^expected one VCEK/VLEK certificate, got 2$"):
        parse_vek(fake_turin.chain)


# --- the paths where evidence is missing or does not parse --------------------------------


def test_the_chain_alone_with_given_roots(fake_turin: FakeAmd) -> None:
    verdict = verify_snp_chain(
        fake_turin.vek, fake_turin.chain, now=NOW, trusted_roots=fake_turin.roots
    )
    assert verdict.kind == "snp" and verdict.json()["kind"] == "snp"
    assert verdict.accepted, _explain(verdict)
    assert [c.name for c in verdict.checks] == [
        "chain.ark_self_signed",
        "chain.ark_pinned",
        "chain.ask_by_ark",
        "chain.vek_by_ask",
        "chain.validity",
        "chain.revocation",
        "vek.product",
    ]
    assert _check(verdict, "vek.product").detail == (
        "the certificate is for Turin, the root is AMD's Turin"
    )
    with pytest.raises(ValueError, match="timezone-aware"):
        verify_snp_chain(fake_turin.vek, fake_turin.chain, now=datetime(2025, 6, 1))


def test_a_report_that_does_not_parse_is_a_failed_check(fake_turin: FakeAmd) -> None:
    short = _judge(fake_turin, b"\x05" * 100)
    assert short.kind == "snp"
    assert _failed(short) == {"report.parse"}
    assert "0x4a0 (1184) bytes" in _check(short, "report.parse").detail
    assert _check(short, "vek.product").ok is True
    # the right size, a version this verifier does not read: the parser says so
    raw = bytearray(v5_report(fake_turin.vek_key))
    raw[0:4] = struct.pack("<I", 6)
    verdict = _judge(fake_turin, _resign(bytes(raw), fake_turin.vek_key))
    assert _failed(verdict) == {"report.parse"}
    assert "version 6 is not supported" in _check(verdict, "report.parse").detail
    assert [c.name for c in verdict.checks][-2:] == ["report.parse", "vek.product"]
    assert _check(verdict, "vek.product").ok is True


def test_a_version_2_report_reads_its_tcb_by_the_certificates_product(
    fake_turin: FakeAmd,
) -> None:
    """A version-2 report has no CPUID: the Turin VCEK says how REPORTED_TCB is laid out."""
    raw = bytearray(v5_report(fake_turin.vek_key))
    raw[0:4] = struct.pack("<I", 2)
    verdict = _judge(fake_turin, _resign(bytes(raw), fake_turin.vek_key))
    assert verdict.accepted, _explain(verdict)
    assert verdict.facts["reported_tcb"] == TURIN_TCB


def test_no_key_certificate_no_signature_check(fake_turin: FakeAmd) -> None:
    report = v5_report(fake_turin.vek_key)
    verdict = verify_snp(
        report, b"not a certificate", fake_turin.chain, now=NOW, trusted_roots=fake_turin.roots
    )
    assert _check(verdict, "report_signature").ok is False
    assert _check(verdict, "report_signature").detail == (
        "no VCEK/VLEK to check the signature with"
    )


def test_signature_algo_read_unsigned_and_the_bad_signature_named(fake_turin: FakeAmd) -> None:
    raw = bytearray(v5_report(fake_turin.vek_key))
    raw[0x034:0x038] = struct.pack("<I", 0x80000001)
    verdict = _judge(fake_turin, _resign(bytes(raw), fake_turin.vek_key))
    assert _check(verdict, "report_signature").detail == (
        "SIGNATURE_ALGO is 2147483649, not 1 (ECDSA P-384 with SHA-384)"
    )
    other = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    verdict = _judge(fake_turin, v5_report(other.vek_key))
    assert _failed(verdict) == {"report_signature"}
    assert _check(verdict, "report_signature").detail == (
        "the ECDSA P-384 SHA-384 signature over bytes [0, 0x2A0) does not verify "
        "with SEV-VCEK's key"
    )


def test_the_signatures_reserved_bytes_are_not_read(fake_turin: FakeAmd) -> None:
    """R and S are 72 bytes each; the 368 bytes after them are reserved and unsigned."""
    raw = bytearray(v5_report(fake_turin.vek_key))
    for at in (SIGNED_SIZE + 144, SIGNED_SIZE + 215, REPORT_SIZE - 1):
        raw[at] = 0xFF
    assert _judge(fake_turin, bytes(raw)).accepted


# --- the key certificate against the report: kind, TCB, hwID, each as it reads -----------


def _with_signer_info(report: bytes, signer_info: int, key: ec.EllipticCurvePrivateKey) -> bytes:
    raw = bytearray(report)
    raw[0x048:0x04C] = struct.pack("<I", signer_info)
    return _resign(bytes(raw), key)


@pytest.mark.parametrize(
    ("drop", "lacks"),
    [
        (("snp",), "snp"),
        (("bl",), "bl"),
        (("tee", "ucode"), "tee, ucode"),
        (("fmc",), "fmc"),  # Turin's REPORTED_TCB has an FMC SVN: its certificate must too
    ],
)
def test_a_vcek_lacking_a_tcb_extension_rejects(drop: tuple[str, ...], lacks: str) -> None:
    tcb = {k: v for k, v in TURIN_TCB.items() if k not in drop}
    amd = fake_amd("Turin", tcb, CHIP_ID[:8])
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _failed(verdict) == {"vek.tcb"}, _explain(verdict)
    noun = "extension" if len(drop) == 1 else "extensions"
    assert _check(verdict, "vek.tcb").detail == f"the certificate lacks TCB {noun} {lacks}"


def test_a_vcek_whose_tcb_differs_names_each_difference() -> None:
    amd = fake_amd("Turin", {**TURIN_TCB, "bl": 9, "ucode": 1}, CHIP_ID[:8])
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _check(verdict, "vek.tcb").detail == (
        "REPORTED_TCB vs certificate: bl 2 ≠ 9, ucode 85 ≠ 1"
    )
    both = fake_amd("Turin", {k: v for k, v in TURIN_TCB.items() if k != "tee"} | {"snp": 7}, None)
    verdict = _judge(both, v5_report(both.vek_key))
    assert _check(verdict, "vek.tcb").detail == (
        "the certificate lacks TCB extension tee; REPORTED_TCB vs certificate: snp 4 ≠ 7"
    )


def test_a_milan_vcek_needs_no_fmc() -> None:
    amd = fake_amd("Milan", MILAN_TCB, bytes(range(1, 65)))
    report = v5_report(amd.vek_key, cpuid_family=0x19, chip_id=bytes(range(1, 65)))
    verdict = _judge(amd, report)
    assert verdict.accepted, _explain(verdict)
    assert _check(verdict, "vek.tcb").detail == (
        "REPORTED_TCB (bl=1, tee=2, snp=0, ucode=85, milan-genoa layout) matches"
    )


def test_the_signing_key_kind_mismatch_reads(fake_turin: FakeAmd) -> None:
    report = _with_signer_info(v5_report(fake_turin.vek_key), 0b00101, fake_turin.vek_key)
    verdict = _judge(fake_turin, report)
    assert _failed(verdict) == {"vek.kind"}
    assert _check(verdict, "vek.kind").detail == (
        "the report's SIGNING_KEY is VLEK, but the key certificate is a VCEK"
    )


def test_a_vlek_signed_report_is_checked_without_hwid() -> None:
    amd = fake_amd("Turin", TURIN_TCB, None, vek_cn="SEV-VLEK", csp_id="cloud.example")
    report = _with_signer_info(v5_report(amd.vek_key), 0b00101, amd.vek_key)
    verdict = _judge(amd, report)
    assert verdict.accepted, _explain(verdict)
    assert verdict.facts["signing_key"] == "vlek"
    assert _check(verdict, "vek.kind").detail == "the report says VLEK and a VLEK signed it"
    hwid = _check(verdict, "vek.hwid")
    assert hwid.ok is None
    assert hwid.detail == (
        "a VLEK carries no hwID (issued to cloud.example): it is not bound to one chip, "
        "nothing to compare with CHIP_ID"
    )
    # no provider named: the same words without it
    anon = fake_amd("Turin", TURIN_TCB, None, vek_cn="SEV-VLEK")
    report = _with_signer_info(v5_report(anon.vek_key), 0b00101, anon.vek_key)
    assert _check(_judge(anon, report), "vek.hwid").detail.startswith(
        "a VLEK carries no hwID: it is"
    )
    # a VCEK-signed report with that VLEK: the kinds differ
    vcek_said = _judge(amd, v5_report(amd.vek_key))
    assert _check(vcek_said, "vek.kind").detail == (
        "the report's SIGNING_KEY is VCEK, but the key certificate is a VLEK"
    )


def test_a_masked_chip_id_is_named_when_hwid_differs(fake_turin: FakeAmd) -> None:
    """MASK_CHIP_KEY: the host zeroed CHIP_ID, so no VCEK's hwID can match; the verdict says
    why rather than only that."""
    masked = v5_report(fake_turin.vek_key, chip_id=bytes(64))
    report = _with_signer_info(masked, 0b00011, fake_turin.vek_key)
    verdict = _judge(fake_turin, report)
    assert _failed(verdict) == {"vek.hwid"}
    assert _check(verdict, "vek.hwid").detail == (
        "the VCEK's hwID (8 bytes) a0a1a2a3a4a5a6a7 is not CHIP_ID[0:8] 0000000000000000 "
        "(the host masked CHIP_ID)"
    )
    unmasked = _judge(fake_turin, masked)
    assert _check(unmasked, "vek.hwid").detail == (
        "the VCEK's hwID (8 bytes) a0a1a2a3a4a5a6a7 is not CHIP_ID[0:8] 0000000000000000"
    )


def test_an_ask_signed_without_pss_rejects() -> None:
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8], ask_pkcs1=True)
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _failed(verdict) == {"chain.ask_by_ark"}, _explain(verdict)
    assert _check(verdict, "chain.ask_by_ark").detail == "SEV-Turin is not signed with RSASSA-PSS"


def test_an_ask_without_an_rsa_key_rejects() -> None:
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8], ask_ec=True)
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _failed(verdict) == {"chain.vek_by_ask"}, _explain(verdict)
    assert _check(verdict, "chain.vek_by_ask").detail == "SEV-Turin has no RSA key"


def test_times_read_in_utc_whatever_the_machines_zone(
    fake_turin: FakeAmd, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        tokyo = datetime(2025, 6, 1, 9, tzinfo=timezone(timedelta(hours=9)))
        verdict = _judge(fake_turin, v5_report(fake_turin.vek_key), tokyo)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert _check(verdict, "chain.validity").detail == (
        "all 3 certificates are valid at 2025-06-01T00:00:00Z (SEV-VCEK until 2034-12-30T00:00:00Z)"
    )


# --- a chain with a part missing, or a key certificate that does not read -----------------


def _split(chain: bytes) -> tuple[bytes, bytes]:
    """The double's chain PEM: (ASK, ARK)."""
    ask, ark = x509.load_pem_x509_certificates(chain)
    return ask.public_bytes(Encoding.PEM), ark.public_bytes(Encoding.PEM)


def _details(verdict: Verdict) -> dict[str, tuple[bool | None, str]]:
    return {c.name: (c.ok, c.detail) for c in verdict.checks}


def test_a_chain_without_its_ask(fake_turin: FakeAmd) -> None:
    _, ark = _split(fake_turin.chain)
    report = v5_report(fake_turin.vek_key)
    verdict = verify_snp(report, fake_turin.vek, ark, now=NOW, trusted_roots=fake_turin.roots)
    got = _details(verdict)
    assert got["chain.ask_by_ark"] == (False, "the chain holds no ASK or ASVK")
    assert got["chain.vek_by_ask"] == (False, "no ASK/ASVK to check SEV-VCEK with")
    assert got["chain.ark_self_signed"][0] is True and got["chain.ark_pinned"][0] is True
    assert verdict.facts["chain"] == ["ARK-Turin", "SEV-VCEK"]
    assert "all 2 certificates are valid" in got["chain.validity"][1]


def test_a_chain_without_its_ark(fake_turin: FakeAmd) -> None:
    ask, _ = _split(fake_turin.chain)
    report = v5_report(fake_turin.vek_key)
    verdict = verify_snp(report, fake_turin.vek, ask, now=NOW, trusted_roots=fake_turin.roots)
    got = _details(verdict)
    assert got["chain.ark_self_signed"] == (False, "the chain holds no self-issued ARK")
    assert got["chain.ark_pinned"] == (False, "no ARK to compare with the pinned AMD roots")
    assert got["chain.ask_by_ark"] == (False, "no ARK to check SEV-Turin with")
    assert got["chain.vek_by_ask"][0] is True  # the ASK that is there did sign the VCEK
    assert "ark_spki_sha256" not in verdict.facts
    assert verdict.facts["chain"] == ["SEV-Turin", "SEV-VCEK"]


def test_an_unpinned_ark_is_named_with_its_fingerprint(fake_turin: FakeAmd) -> None:
    verdict = verify_snp(
        v5_report(fake_turin.vek_key), fake_turin.vek, fake_turin.chain, now=NOW, trusted_roots={}
    )
    fp = fake_turin.roots["Turin"]
    assert _details(verdict)["chain.ark_pinned"] == (
        False,
        f"ARK-Turin's key (SPKI SHA-256 {fp}) is none of the pinned roots (none given)",
    )
    assert _details(verdict)["vek.product"] == (
        True,
        "the certificate is for Turin, the report's CPUID says Turin",
    )
    two = verify_snp_chain(
        fake_turin.vek, fake_turin.chain, now=NOW, trusted_roots={"Milan": "00", "Genoa": "11"}
    )
    assert _details(two)["chain.ark_pinned"][1].endswith("none of the pinned roots (Genoa, Milan)")


def test_a_key_file_with_two_certificates_rejects(fake_turin: FakeAmd) -> None:
    verdict = _judge(
        FakeAmd(fake_turin.vek_key, fake_turin.chain, fake_turin.chain, fake_turin.roots),
        v5_report(fake_turin.vek_key),
    )
    reason = "the certificates do not parse: the key certificate holds 2 certificates, not one"
    got = _details(verdict)
    for name in ("ark_self_signed", "ark_pinned", "ask_by_ark", "vek_by_ask"):
        assert got[f"chain.{name}"] == (False, reason)
    assert "chain.validity" not in got


def test_a_vcek_whose_extensions_do_not_read_rejects() -> None:
    tcb = {k: v for k, v in TURIN_TCB.items() if k != "bl"}
    amd = fake_amd("Turin", tcb, CHIP_ID[:8], vek_extensions={"3.1": b"\x02\x01\x85"})
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _details(verdict)["vek.extensions"] == (
        False,
        "SEV-VCEK: TCB extension 1.3.6.1.4.1.3704.1.3.1: not a non-negative DER INTEGER",
    )
    assert not verdict.accepted
    assert "signing_key" not in verdict.facts
    assert not {"vek.kind", "vek.tcb", "vek.hwid", "vek.product"} & set(_details(verdict))


def test_the_pinned_root_is_chosen_among_several(fake_turin: FakeAmd) -> None:
    """A chain may carry more than one self-issued root: the pinned one is the ARK."""
    stranger = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    _, other_ark = _split(stranger.chain)
    chain = other_ark + fake_turin.chain
    verdict = verify_snp(
        v5_report(fake_turin.vek_key),
        fake_turin.vek,
        chain,
        now=NOW,
        trusted_roots=fake_turin.roots,
    )
    assert verdict.accepted, _explain(verdict)
    assert verdict.facts["ark_spki_sha256"] == fake_turin.roots["Turin"]


def test_an_ark_whose_self_signature_fails_rejects() -> None:
    amd = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8], ark_forged=True)
    verdict = _judge(amd, v5_report(amd.vek_key))
    assert _failed(verdict) == {"chain.ark_self_signed"}, _explain(verdict)
    assert _check(verdict, "chain.ark_self_signed").detail == (
        "the RSA-PSS SHA-384 (salt 48) signature on ARK-Turin does not verify with ARK-Turin's key"
    )


def test_the_certificates_product_not_the_roots_lays_out_a_version_2_report(
    fake_turin: FakeAmd,
) -> None:
    """A Turin VCEK under a root pinned as Milan: vek.product fails, and the report's TCB
    is still read the Turin VCEK's way (so vek.tcb holds)."""
    raw = bytearray(v5_report(fake_turin.vek_key))
    raw[0:4] = struct.pack("<I", 2)
    verdict = verify_snp(
        _resign(bytes(raw), fake_turin.vek_key),
        fake_turin.vek,
        fake_turin.chain,
        now=NOW,
        trusted_roots={"Milan": fake_turin.roots["Turin"]},
    )
    assert _failed(verdict) == {"vek.product"}, _explain(verdict)
    assert _check(verdict, "vek.product").detail == (
        "the certificate is for Turin, the root for Milan"
    )


def test_the_product_mismatches_read(fake_turin: FakeAmd) -> None:
    milan_cpu = _judge(fake_turin, v5_report(fake_turin.vek_key, cpuid_family=0x19))
    assert _check(milan_cpu, "vek.product").detail == (
        "the report's CPUID (family 0x19, model 0x2) is a Milan, the certificate a Turin"
    )
    venice = fake_amd("Venice", TURIN_TCB, CHIP_ID[:8])
    verdict = _judge(venice, v5_report(venice.vek_key))
    assert _check(verdict, "vek.product").ok is False
    assert _check(verdict, "vek.product").detail == (
        "the certificate names no known product ('Venice')"
    )
    # two problems at once, each named
    both = verify_snp(
        v5_report(fake_turin.vek_key, cpuid_family=0x19),
        fake_turin.vek,
        fake_turin.chain,
        now=NOW,
        trusted_roots={"Milan": fake_turin.roots["Turin"]},
    )
    assert _check(both, "vek.product").detail == (
        "the certificate is for Turin, the root for Milan; the report's CPUID (family 0x19, "
        "model 0x2) is a Milan, the certificate a Turin"
    )


def test_a_subject_without_a_common_name_still_reads() -> None:
    assert parse_vek(vek_with_extensions({"4": bytes(64)}, cn=None)).kind == "vcek"


def test_now_must_carry_an_offset(fake_turin: FakeAmd) -> None:
    class NoOffset(tzinfo):
        """A zone that names no offset: as naive as no zone at all."""

        def utcoffset(self, dt: datetime | None) -> timedelta | None:
            return None

        def dst(self, dt: datetime | None) -> timedelta | None:
            return None

        def tzname(self, dt: datetime | None) -> str | None:
            return None

    why = r"^now must be a timezone-aware datetime \(the verification time\)$"
    for now in (datetime(2025, 6, 1), datetime(2025, 6, 1, tzinfo=NoOffset())):
        with pytest.raises(ValueError, match=why):
            verify_snp(b"", fake_turin.vek, fake_turin.chain, now=now)
        with pytest.raises(ValueError, match=why):
            verify_snp_chain(fake_turin.vek, fake_turin.chain, now=now)


def test_a_second_root_is_never_taken_for_the_ask(fake_turin: FakeAmd) -> None:
    """Another self-issued root, named like the ARK, is no ASK even though it names the ARK
    as its issuer."""
    stranger = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    _, other_ark = _split(stranger.chain)
    _, ark = _split(fake_turin.chain)
    verdict = verify_snp(
        v5_report(fake_turin.vek_key),
        fake_turin.vek,
        other_ark + ark,
        now=NOW,
        trusted_roots=fake_turin.roots,
    )
    assert _details(verdict)["chain.ask_by_ark"] == (False, "the chain holds no ASK or ASVK")


def test_every_certificate_out_of_its_validity_is_named(fake_turin: FakeAmd) -> None:
    late = datetime(2040, 1, 1, tzinfo=UTC)
    verdict = _judge(fake_turin, v5_report(fake_turin.vek_key), late)
    assert _failed(verdict) == {"chain.validity"}
    window = "2025-01-01T00:00:00Z .. 2034-12-30T00:00:00Z"
    assert _check(verdict, "chain.validity").detail == (
        f"at 2040-01-01T00:00:00Z: ARK-Turin is valid {window}; SEV-Turin is valid {window}; "
        f"SEV-VCEK is valid {window}"
    )
