"""What both commands read to verify evidence, and the verifier each kind is handed to
(``attestation.evidence``), word for word.

Why: the CLI tests run these through ``attest verify`` and ``bind-check`` and look at exit codes
and a few lines, so the messages, the notice ``--trusted-root`` adds, the hex reading and what
each verifier is handed (the CRL, the collateral, the nonce, ``online``, the RIMs) went
unchecked. The SEV-SNP chain is the test double of AMD's (``snp_double``); TDX and NVIDIA
evidence are the public vectors in ``../shared/vectors``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from attestation.evidence import (
    CertsNeeded,
    Missing,
    TrustedRoots,
    mark_trusted_roots,
    read_evidence,
    read_file,
    read_rims,
    read_trusted_roots,
    split_certs,
    verify_evidence,
)
from attestation.nvidia import verify_nvidia
from attestation.nvidia_rim import SHA384_NS, SWID_NS, RimError
from attestation.snp import verify_snp
from attestation.tdx import verify_tdx
from attestation.verdict import Check, EvidenceKind, Verdict
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, FakeAmd, fake_amd, v5_report

NOW = datetime(2025, 6, 1, tzinfo=UTC)  # inside the double's windows and its CRL's
VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "attestation"


@pytest.fixture(scope="module")
def turin() -> FakeAmd:
    return fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])


def _self_signed(cn: str | None, *, issuer: str | None = None) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])
    other = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]) if issuer else None
    start = datetime(2025, 1, 1, tzinfo=UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(other or subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(Encoding.PEM)


# --------------------------------------------------------------------------- input files


def test_read_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"\x00bytes")
    assert read_file(tmp_path / "f") == b"\x00bytes"
    for path in (tmp_path / "absent", tmp_path):
        with pytest.raises(Missing) as raised:
            read_file(path)
        assert str(raised.value) == f"{path} does not exist"


def test_trusted_roots_are_each_arks_key_by_its_product(tmp_path: Path, turin: FakeAmd) -> None:
    milan = fake_amd("Milan", {"bl": 1, "tee": 1, "snp": 1, "ucode": 1}, bytes(64))
    path = tmp_path / "arks.pem"
    path.write_bytes(turin.ark + milan.ark)
    trusted = read_trusted_roots(path)
    assert trusted.path == path
    assert trusted.roots == {"Turin": turin.roots["Turin"], "Milan": milan.roots["Milan"]}
    der = tmp_path / "ark.der"
    der.write_bytes(x509.load_pem_x509_certificate(turin.ark).public_bytes(Encoding.DER))
    assert read_trusted_roots(der).roots == turin.roots
    with pytest.raises(Missing):
        read_trusted_roots(tmp_path / "absent.pem")


def test_trusted_roots_keep_their_own_copy() -> None:
    given = {"Turin": "ab" * 32}
    trusted = TrustedRoots(Path("x"), given)
    given["Milan"] = "cd" * 32
    assert trusted.roots == {"Turin": "ab" * 32}


@pytest.mark.parametrize(
    ("cn", "issuer", "problem"),
    [
        ("ARK-Rome", None, "'ARK-Rome' is not an ARK name (ARK-Milan, ARK-Genoa, ARK-Turin)"),
        ("Milan", None, "'Milan' is not an ARK name (ARK-Milan, ARK-Genoa, ARK-Turin)"),
        ("ark-Milan", None, "'ark-Milan' is not an ARK name (ARK-Milan, ARK-Genoa, ARK-Turin)"),
        (None, None, "'' is not an ARK name (ARK-Milan, ARK-Genoa, ARK-Turin)"),
        ("SEV-Turin", "ARK-Turin", "SEV-Turin is not a root"),
        ("ARK-Turin", "ARK-Milan", "ARK-Turin is not a root"),
    ],
)
def test_a_trusted_root_that_is_no_ark_is_refused_word_for_word(
    tmp_path: Path, cn: str | None, issuer: str | None, problem: str
) -> None:
    path = tmp_path / "root.pem"
    path.write_bytes(_self_signed(cn, issuer=issuer))
    with pytest.raises(ValueError) as raised:
        read_trusted_roots(path)
    assert str(raised.value) == f"{path}: {problem}"


def test_a_non_root_without_a_name_is_named_by_its_subject(tmp_path: Path) -> None:
    path = tmp_path / "root.pem"
    path.write_bytes(_self_signed(None, issuer="Someone"))
    with pytest.raises(ValueError) as raised:
        read_trusted_roots(path)
    assert str(raised.value) == f"{path}:  is not a root"


def _rim(version: str, index: int = 1) -> bytes:
    return (
        f'<SoftwareIdentity xmlns="{SWID_NS}" xmlns:h="{SHA384_NS}">'
        f'<Meta colloquialVersion="{version}" product="GH100"/><Payload>'
        f'<Resource type="Measurement" index="{index}" alternatives="1" size="48" active="True"'
        f' name="m{index}" h:Hash0="{"ab" * 48}"/></Payload></SoftwareIdentity>'
    ).encode()


def test_rims_are_read_in_order_one_of_each_kind(tmp_path: Path) -> None:
    driver, vbios, second = tmp_path / "d.xml", tmp_path / "v.xml", tmp_path / "d2.xml"
    driver.write_bytes(_rim("550.90.07"))
    vbios.write_bytes(_rim("96.00.9F.00.01", 2))
    second.write_bytes(_rim("550.90.08"))
    rims = read_rims([vbios, driver])
    assert [(r.kind, r.version, r.source) for r in rims] == [
        ("vbios", "96.00.9F.00.01", str(vbios)),
        ("driver", "550.90.07", str(driver)),
    ]
    assert read_rims([]) == []
    with pytest.raises(RimError) as raised:
        read_rims([driver, vbios, second])
    assert str(raised.value) == f"{second}: a second driver RIM (after {driver}): give one"
    with pytest.raises(Missing):
        read_rims([driver, tmp_path / "absent.xml"])


# --------------------------------------------------------------------------- the notice


def test_the_trusted_root_notice_goes_first_and_rewords_only_held_root_checks() -> None:
    trusted = TrustedRoots(Path("/x/arks.pem"), {"Turin": "ab" * 32, "Milan": "0123456789" * 6})
    verdict = Verdict(
        "snp",
        checks=[
            Check("chain.ark_pinned", True, "ARK-Turin is the pinned AMD root; AMD's Turin"),
            Check("vek.product", True, "AMD's Turin, as the pinned AMD root says"),
            Check("chain.ark_pinned", False, "not the pinned AMD root of AMD's"),
            Check("report_signature", True, "signed by AMD's VCEK with the pinned AMD key"),
        ],
        facts={"measurement": "00"},
    )
    marked = mark_trusted_roots(verdict, trusted)
    assert marked is verdict
    assert marked.checks == [
        Check(
            "trust.amd_roots",
            None,
            "NOT checked: the chain was held to --trusted-root /x/arks.pem (Milan"
            " 0123456789012345…, Turin abababababababab…) in place of AMD's pinned roots",
        ),
        Check(
            "chain.ark_pinned",
            True,
            "ARK-Turin is the --trusted-root root; the --trusted-root Turin",
        ),
        Check("vek.product", True, "the --trusted-root Turin, as the --trusted-root root says"),
        Check("chain.ark_pinned", False, "not the pinned AMD root of AMD's"),
        Check("report_signature", True, "signed by AMD's VCEK with the pinned AMD key"),
    ]
    assert marked.facts == {
        "measurement": "00",
        "trusted_roots": {"file": "/x/arks.pem", "Turin": "ab" * 32, "Milan": "0123456789" * 6},
    }


# --------------------------------------------------------------------------- evidence as given


@pytest.mark.parametrize(
    ("data", "read"),
    [
        (b"0a1B", b"\x0a\x1b"),
        (b" 0a 1b\r\n\t2c\n", b"\x0a\x1b\x2c"),
        (b"0a1", b"0a1"),  # odd: not hex after all, kept as given
        (b"0a1g", b"0a1g"),
        (b"", b""),
        (b" \n", b" \n"),
        (b"\x0a\x1b", b"\x0a\x1b"),
    ],
)
def test_read_evidence(data: bytes, read: bytes) -> None:
    assert read_evidence(data) == read


def test_split_certs_takes_the_ec_key_as_the_vek(turin: FakeAmd) -> None:
    ask, _ark = x509.load_pem_x509_certificates(turin.chain)
    vek_pem = x509.load_der_x509_certificate(turin.vek).public_bytes(Encoding.PEM)
    assert split_certs([turin.chain, vek_pem]) == (turin.vek, turin.chain)
    assert split_certs([turin.ark, turin.vek, ask.public_bytes(Encoding.PEM)]) == (
        turin.vek,
        turin.ark + ask.public_bytes(Encoding.PEM),
    )
    assert split_certs([turin.chain]) == (None, turin.chain)
    assert split_certs([]) == (None, b"")


# --------------------------------------------------------------------------- the verifiers


def test_snp_evidence_goes_to_verify_snp_with_its_crl(turin: FakeAmd) -> None:
    report = v5_report(turin.vek_key)
    certs = [turin.chain, turin.vek]
    plain = verify_evidence("snp", report, certs=certs, collateral=None, now=NOW)
    assert plain.json() == verify_snp(report, turin.vek, turin.chain, now=NOW).json()
    assert not plain.accepted  # the double's ARK is not AMD's
    crl = turin.crl(revoked=(turin.serial("vek"),))
    trusted = TrustedRoots(Path("ark.pem"), turin.roots)
    revoked = verify_evidence(
        "snp", report, certs=certs, collateral=None, now=NOW, trusted=trusted, crl=crl
    )
    direct = verify_snp(report, turin.vek, turin.chain, now=NOW, trusted_roots=turin.roots, crl=crl)
    assert revoked.json() == mark_trusted_roots(direct, trusted).json()
    assert not revoked.accepted
    held = verify_evidence("snp", report, certs=certs, collateral=None, now=NOW, trusted=trusted)
    assert held.accepted and held.checks[0].name == "trust.amd_roots"
    assert (
        verify_evidence("snp", report, certs=certs, collateral=None, now=NOW, crl=crl).json()
        == verify_snp(report, turin.vek, turin.chain, now=NOW, crl=crl).json()
    )


def test_snp_evidence_without_a_vek_and_a_trusted_root_elsewhere(turin: FakeAmd) -> None:
    with pytest.raises(CertsNeeded) as raised:
        verify_evidence("snp", b"", certs=[turin.chain], collateral=None, now=NOW)
    assert str(raised.value) == "no VCEK or VLEK among the certificates"
    trusted = TrustedRoots(Path("ark.pem"), turin.roots)
    kinds: tuple[EvidenceKind, ...] = ("tdx", "nvidia")
    for kind in kinds:
        with pytest.raises(ValueError) as refused:
            verify_evidence(
                kind, b"", certs=[turin.chain], collateral=None, now=NOW, trusted=trusted
            )
        assert str(refused.value) == "--trusted-root is for SEV-SNP evidence only"


@pytest.fixture(scope="module")
def vectors() -> Path:
    if not VECTORS.is_dir():
        reason = f"{VECTORS} is absent: the public attestation vectors live in ../shared/vectors"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return VECTORS


def test_tdx_evidence_goes_to_verify_tdx_with_its_collateral(vectors: Path) -> None:
    folder = vectors / "intel-tdx" / "dcap-qvl"
    quote = (folder / "tdx_quote").read_bytes()
    collateral = (folder / "tdx_quote_collateral.json").read_bytes()
    when = datetime(2025, 6, 25, tzinfo=UTC)
    given = verify_evidence("tdx", quote, certs=[], collateral=collateral, now=when)
    assert given.json() == verify_tdx(quote, now=when, collateral=collateral).json()
    bare = verify_evidence("tdx", quote, certs=[], collateral=None, now=when)
    assert bare.json() == verify_tdx(quote, now=when).json()
    assert bare.json() != given.json()
    later = verify_evidence(
        "tdx", quote, certs=[], collateral=collateral, now=when.replace(year=2031)
    )
    assert later.json() != given.json()


def test_nvidia_evidence_goes_to_verify_nvidia_with_its_options(
    vectors: Path, tmp_path: Path
) -> None:
    folder = vectors / "nvidia-h100" / "nvtrust"
    evidence = (folder / "hopperAttestationReport.hex").read_bytes()
    chain = (folder / "hopperCertChain.pem").read_bytes()
    certs = x509.load_pem_x509_certificates(chain)
    parts = [c.public_bytes(Encoding.PEM) for c in certs]
    now = datetime(2025, 1, 1, tzinfo=UTC)
    with pytest.raises(CertsNeeded) as raised:
        verify_evidence("nvidia", evidence, certs=[], collateral=None, now=now)
    assert str(raised.value) == "NVIDIA evidence needs its certificate chain"
    (tmp_path / "d.xml").write_bytes(_rim("550.90.07"))
    rims = read_rims([tmp_path / "d.xml"])
    runs: list[dict[str, Any]] = [
        {},
        {"nonce": bytes(32)},
        {"online": True},
        {"rims": rims},
    ]
    for options in runs:
        got = verify_evidence("nvidia", evidence, certs=parts, collateral=None, now=now, **options)
        assert got.json() == verify_nvidia(evidence, chain, now=now, **options).json()
        if options:
            plain = verify_nvidia(evidence, chain, now=now)
            assert got.json() != plain.json(), options
    later = verify_evidence(
        "nvidia", evidence, certs=parts, collateral=None, now=now.replace(year=1999)
    )
    assert later.json() != verify_nvidia(evidence, chain, now=now).json()
