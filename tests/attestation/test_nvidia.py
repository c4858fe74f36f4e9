"""NVIDIA H100 SPDM evidence: the public vectors' cases, tampering, and a generated chain.

The public vectors are read in place from ``../shared/vectors/attestation`` (never copied
into the project); without that folder the vector tests skip, saying so. The generated-chain
tests need nothing outside the repository.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from attestation.nvidia import (
    NVIDIA_DEVICE_ROOT_SPKI_SHA256,
    TCG_DICE_FWID_OID,
    MeasurementBlock,
    MeasurementsRequest,
    format_vbios_version,
    parse_nvidia_evidence,
    spki_sha256,
    verify_nvidia,
)
from attestation.verdict import Verdict

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "attestation"
NV = VECTORS / "nvidia-h100"
#: Inside every vector certificate's validity (the latest notBefore is 2022-03-01; all end 9999).
NOW = datetime(2025, 1, 1, tzinfo=UTC)
NV01 = ("nvtrust/hopperAttestationReport.hex", "nvtrust/hopperCertChain.pem")
NV02 = ("trustee/hopper_coco_report1.hex", "trustee/hopper_coco_certs1.pem")
#: The manifest's NVIDIA cases, as these tests run them (the negative case names three chains).
HANDLED = {"nv-01-nvtrust-h100", "nv-02-trustee-coco-h100", "nv-neg-01"}


@pytest.fixture(scope="module")
def attestation_vectors() -> Path:
    """The public vectors folder; without it, the test skips and says why."""
    if not VECTORS.is_dir():
        reason = (
            f"{VECTORS} is absent: the public attestation vectors live there "
            "(../shared/vectors beside the repository), so the NVIDIA vector tests cannot run"
        )
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return VECTORS


@pytest.fixture(scope="module")
def manifest(attestation_vectors: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((attestation_vectors / "manifest.json").read_text())
    return data


def _cases(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in manifest["cases"] if c["kind"] == "nvidia-h100"}


def _file(entry: str) -> Path:
    """A manifest path, without any trailing note like ``(5 certs leaf..root)``."""
    return VECTORS / entry.split(" ", 1)[0]


def _verify(evidence: str, chain: str, **kwargs: Any) -> Verdict:
    kwargs.setdefault("now", NOW)
    return verify_nvidia((NV / evidence).read_bytes(), (NV / chain).read_bytes(), **kwargs)


def _check(verdict: Verdict, name: str) -> Any:
    return next(c for c in verdict.checks if c.name == name)


# --------------------------------------------------------------------------- the manifest


def test_every_nvidia_case_in_the_manifest_is_run(manifest: dict[str, Any]) -> None:
    assert set(_cases(manifest)) == HANDLED


@pytest.mark.parametrize("case_id", ["nv-01-nvtrust-h100", "nv-02-trustee-coco-h100"])
def test_accepted_cases(manifest: dict[str, Any], case_id: str) -> None:
    case = _cases(manifest)[case_id]
    assert case["expected"].startswith("ACCEPT")
    nonce = re.search(r"nonce.*?\b([0-9a-f]{64})\b", case["expected"])
    assert nonce is not None
    verdict = verify_nvidia(
        _file(case["evidence"]).read_bytes(),
        _file(case["cert_chain"]).read_bytes(),
        now=NOW,
        nonce=bytes.fromhex(nonce.group(1)),
    )
    assert verdict.accepted, [c.line() for c in verdict.failed]
    made = {c.name: c.ok for c in verdict.checks if c.ok is not None}
    assert made == {
        "report_signature": True,
        "chain": True,
        "chain.root_pinned": True,
        "chain.leaf": True,
        "chain.validity": True,
        "nonce": True,
        "fwid": True,
    }
    facts = verdict.facts
    assert facts["nonce"] == nonce.group(1)
    expected = case["facts"]
    assert facts["driver_version"] == expected["driver_version"]
    assert facts["vbios_version"] == expected["vbios"]
    if "spdm_version" in expected:
        assert facts["spdm_version"] == expected["spdm_version"]
    if "measurement_blocks" in expected:
        assert facts["measurement_blocks"] == expected["measurement_blocks"]
    if "project/sku/chip_sku" in expected:
        got = f"{facts['project']}/{facts['project_sku']}/{facts['chip_sku']}"
        assert got == expected["project/sku/chip_sku"]


@pytest.mark.parametrize("chain", ["case2", "case3", "case4"])
def test_negative_chains_reject_on_the_chain(manifest: dict[str, Any], chain: str) -> None:
    case = _cases(manifest)["nv-neg-01"]
    assert case["expected"] == "REJECT"
    assert chain in case["setup"]
    assert f"nvidia-h100/trustee/hopper_cert_chain_{chain}.pem" in manifest["files"]
    # These chains belong to the nv-01 device (the same BROM and leaf certificates).
    verdict = _verify(NV01[0], f"trustee/hopper_cert_chain_{chain}.pem")
    assert not verdict.accepted
    failed = [c.name for c in verdict.failed]
    assert any(name.startswith("chain") for name in failed), failed


@pytest.mark.usefixtures("attestation_vectors")
def test_negative_chain_details() -> None:
    root_only = _verify(NV01[0], "trustee/hopper_cert_chain_case2.pem")
    assert "only the root" in _check(root_only, "chain").detail
    no_ica = _verify(NV01[0], "trustee/hopper_cert_chain_case3.pem")
    assert _check(no_ica, "chain").ok is False
    assert "Provisioner ICA 1 is missing" in _check(no_ica, "chain").detail
    assert _check(no_ica, "chain.root_pinned").ok is False
    no_leaf = _verify(NV01[0], "trustee/hopper_cert_chain_case4.pem")
    assert _check(no_leaf, "chain.leaf").ok is False
    assert _check(no_leaf, "report_signature").ok is False
    assert _check(no_leaf, "fwid").ok is False


# --------------------------------------------------------------------------- the facts


@pytest.mark.usefixtures("attestation_vectors")
def test_nv01_facts() -> None:
    verdict = _verify(*NV01)
    facts = verdict.facts
    assert facts["nonce"] == "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"
    assert facts["driver_version"] == "550.90.07"
    assert facts["vbios_version"] == "96.00.9F.00.01"
    assert facts["measurement_blocks"] == 64
    assert list(facts["measurements"]) == [str(i) for i in range(1, 65)]
    assert all(len(v) == 96 for v in facts["measurements"].values())
    assert facts["trailing_padding"] == 0
    assert facts["fwid"].startswith("f5c384ae")
    json.dumps(verdict.json())  # JSON-ready


@pytest.mark.usefixtures("attestation_vectors")
def test_nv02_trailing_zero_byte_is_tolerated_and_reported() -> None:
    raw = bytes.fromhex((NV / NV02[0]).read_text().strip())
    assert raw.endswith(b"\x00")
    parsed = parse_nvidia_evidence(raw)
    assert parsed.trailing_padding == 1
    assert len(parsed.request.raw) + len(parsed.response.signed) + 96 + 1 == len(raw)
    verdict = _verify(*NV02)
    assert verdict.accepted
    assert verdict.facts["trailing_padding"] == 1
    assert "tolerated" in verdict.facts["trailing_padding_note"]
    assert verdict.facts["driver_version"] == "580.95.05"
    assert verdict.facts["vbios_version"] == "96.00.74.00.1A"


@pytest.mark.usefixtures("attestation_vectors")
def test_hex_text_and_raw_bytes_parse_alike() -> None:
    text = (NV / NV01[0]).read_bytes()
    assert parse_nvidia_evidence(text) == parse_nvidia_evidence(bytes.fromhex(text.decode()))


@pytest.mark.usefixtures("attestation_vectors")
def test_pinned_root_is_the_vectors_nvidia_root() -> None:
    root = x509.load_pem_x509_certificate((NV / "nvtrust/verifier_device_root.pem").read_bytes())
    assert spki_sha256(root) == NVIDIA_DEVICE_ROOT_SPKI_SHA256


# --------------------------------------------------------------------------- tampering


@pytest.mark.usefixtures("attestation_vectors")
@pytest.mark.parametrize(
    "where",
    [
        37 + 8 + 4 + 3 + 5,  # inside measurement block 1's value
        37 + 2,  # the response's param1
        -96 - 20,  # inside the opaque data (the FWID entry, just before the signature)
        -1,  # the signature itself
    ],
)
def test_a_flipped_byte_rejects_on_the_signature(where: int) -> None:
    raw = bytearray(bytes.fromhex((NV / NV01[0]).read_text().strip()))
    raw[where] ^= 0x01
    verdict = verify_nvidia(bytes(raw), (NV / NV01[1]).read_bytes(), now=NOW)
    assert not verdict.accepted
    assert _check(verdict, "report_signature").ok is False
    assert _check(verdict, "chain").ok is True


@pytest.mark.usefixtures("attestation_vectors")
def test_a_flipped_nonce_byte_rejects_on_signature_and_nonce() -> None:
    raw = bytearray(bytes.fromhex((NV / NV01[0]).read_text().strip()))
    expected = bytes(raw[4:36])
    raw[10] ^= 0x80
    verdict = verify_nvidia(bytes(raw), (NV / NV01[1]).read_bytes(), now=NOW, nonce=expected)
    assert {c.name for c in verdict.failed} == {"report_signature", "nonce"}


@pytest.mark.usefixtures("attestation_vectors")
def test_a_wrong_expected_nonce_rejects_on_the_nonce() -> None:
    verdict = _verify(*NV01, nonce=bytes(32))
    assert not verdict.accepted
    assert [c.name for c in verdict.failed] == ["nonce"]
    assert "is not the expected 0000" in _check(verdict, "nonce").detail
    longer = _verify(*NV02, nonce=bytes.fromhex(verdict.facts["nonce"]) + bytes(16))
    assert _check(longer, "nonce").ok is False


@pytest.mark.usefixtures("attestation_vectors")
def test_no_expected_nonce_is_not_checked() -> None:
    verdict = _verify(*NV01)
    nonce = _check(verdict, "nonce")
    assert nonce.ok is None
    assert "no expected nonce" in nonce.detail


@pytest.mark.usefixtures("attestation_vectors")
def test_offline_verdicts_list_rim_and_ocsp_as_not_checked() -> None:
    verdict = _verify(*NV01)
    skipped = {c.name: c.detail for c in verdict.not_checked}
    for name in ("rim.driver", "rim.vbios", "ocsp"):
        assert name in skipped
        assert "not checked" in skipped[name]
    assert "--rim FILE" in skipped["rim.driver"] and "--rim FILE" in skipped["rim.vbios"]
    assert "--online" in skipped["ocsp"]
    assert "550.90.07" in skipped["rim.driver"]
    online = _verify(*NV01, online=True)
    for name in ("rim.driver", "rim.vbios", "ocsp"):
        check = _check(online, name)
        assert check.ok is None
        assert check.detail == "online verification is not available in this build: no network"
    assert online.accepted  # skipped checks neither pass nor fail the rest


@pytest.mark.usefixtures("attestation_vectors")
def test_certificates_in_any_order() -> None:
    certs = x509.load_pem_x509_certificates((NV / NV01[1]).read_bytes())
    shuffled = b"".join(c.public_bytes(Encoding.PEM) for c in [certs[2], *certs[::-1]])
    verdict = verify_nvidia((NV / NV01[0]).read_bytes(), shuffled, now=NOW)
    assert verdict.accepted
    assert verdict.facts["chain"][0].startswith("CN=GH100 A01 GSP FMC LF")


@pytest.mark.usefixtures("attestation_vectors")
def test_before_the_chain_is_valid() -> None:
    verdict = _verify(*NV01, now=datetime(2022, 1, 1, tzinfo=UTC))
    assert [c.name for c in verdict.failed] == ["chain.validity"]
    assert "NVIDIA GH100 Provisioner ICA 1" in _check(verdict, "chain.validity").detail


@pytest.mark.usefixtures("attestation_vectors")
def test_another_trusted_root_rejects_nvidias_chain() -> None:
    other, _ = _ca("Some Other Root")
    verdict = _verify(*NV01, trusted_root=other.public_bytes(Encoding.PEM))
    assert [c.name for c in verdict.failed] == ["chain.root_pinned"]


@pytest.mark.usefixtures("attestation_vectors")
def test_every_truncation_is_a_value_error() -> None:
    raw = bytes.fromhex((NV / NV01[0]).read_text().strip())
    for end in range(len(raw)):
        with pytest.raises(ValueError):
            parse_nvidia_evidence(raw[:end])


@pytest.mark.usefixtures("attestation_vectors")
def test_non_zero_trailing_bytes_are_refused() -> None:
    raw = bytes.fromhex((NV / NV01[0]).read_text().strip())
    with pytest.raises(ValueError, match="trailing bytes"):
        parse_nvidia_evidence(raw + b"\x00\x07")
    assert parse_nvidia_evidence(raw + bytes(3)).trailing_padding == 3


# --------------------------------------------------------------------------- generated


KEY_CERT_SIGN = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
DIGITAL_SIGNATURE = x509.KeyUsage(True, False, False, False, False, False, False, False, False)
START, END = datetime(2024, 1, 1, tzinfo=UTC), datetime(2034, 1, 1, tzinfo=UTC)
FWID = bytes(range(48))


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(START)
        .not_valid_after(END)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(KEY_CERT_SIGN, critical=True)
        .sign(key, hashes.SHA384())
    )
    return cert, key


def _dice_tcb_info(fwid: bytes) -> bytes:
    """SEQUENCE { SEQUENCE { OID sha384, OCTET STRING fwid } }: the FWID is the last 48 bytes."""
    sha384 = bytes.fromhex("0609608648016503040202")
    inner = sha384 + b"\x04\x30" + fwid
    return b"\x30" + bytes([len(inner) + 2]) + b"\x30" + bytes([len(inner)]) + inner


def _leaf(
    root: x509.Certificate, root_key: ec.EllipticCurvePrivateKey, fwid: bytes = FWID
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("Test GPU FMC LF"))
        .issuer_name(root.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(START)
        .not_valid_after(END)
        .add_extension(DIGITAL_SIGNATURE, critical=True)
        .add_extension(
            x509.UnrecognizedExtension(TCG_DICE_FWID_OID, _dice_tcb_info(fwid)), critical=False
        )
        .sign(root_key, hashes.SHA384())
    )
    return cert, key


def _tlv(kind: int, value: bytes) -> bytes:
    return kind.to_bytes(2, "little") + len(value).to_bytes(2, "little") + value


def _evidence(
    key: ec.EllipticCurvePrivateKey,
    *,
    nonce: bytes = bytes(range(32)),
    blocks: tuple[tuple[int, bytes], ...] = ((1, b"\xaa" * 48), (2, b"\xbb" * 48)),
    opaque: bytes | None = None,
    spec: int = 1,
    request_code: int = 0xE0,
    response_code: int = 0x60,
    trailing: bytes = b"",
) -> bytes:
    request = bytes([0x11, request_code, 0x01, 0xFF]) + nonce + b"\x00"
    record = b"".join(
        bytes([index, spec])
        + (len(value) + 3).to_bytes(2, "little")
        + b"\x01"
        + len(value).to_bytes(2, "little")
        + value
        for index, value in blocks
    )
    if opaque is None:
        opaque = (
            _tlv(6, bytes.fromhex("009f009601000000"))
            + _tlv(3, b"550.90.07\x00")
            + _tlv(17, b"1010\x00")
            + _tlv(20, FWID)
        )
    response = (
        bytes([0x11, response_code, 0, 0, len(blocks)])
        + len(record).to_bytes(3, "little")
        + record
        + b"\x5a" * 32
        + len(opaque).to_bytes(2, "little")
        + opaque
    )
    r, s = decode_dss_signature(key.sign(request + response, ec.ECDSA(hashes.SHA384())))
    return request + response + r.to_bytes(48, "big") + s.to_bytes(48, "big") + trailing


@pytest.fixture(scope="module")
def device() -> tuple[bytes, bytes, ec.EllipticCurvePrivateKey]:
    """A generated root (PEM), the leaf + root chain (PEM) and the leaf's key."""
    root, root_key = _ca("Test Device Identity CA")
    leaf, key = _leaf(root, root_key)
    chain = leaf.public_bytes(Encoding.PEM) + root.public_bytes(Encoding.PEM)
    return root.public_bytes(Encoding.PEM), chain, key


def test_generated_evidence_accepts_with_its_trusted_root(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, chain, key = device
    verdict = verify_nvidia(
        _evidence(key), chain, now=NOW, nonce=bytes(range(32)), trusted_root=root
    )
    assert verdict.accepted, [c.line() for c in verdict.failed]
    assert verdict.facts["measurements"] == {"1": "aa" * 48, "2": "bb" * 48}
    assert verdict.facts["vbios_version"] == "96.00.9F.00.01"
    assert verdict.facts["project"] == "1010"
    assert verdict.facts["fwid"] == FWID.hex()


def test_generated_evidence_without_the_pin_rejects(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    _, chain, key = device
    verdict = verify_nvidia(_evidence(key), chain, now=NOW)
    assert [c.name for c in verdict.failed] == ["chain.root_pinned"]
    assert NVIDIA_DEVICE_ROOT_SPKI_SHA256 in _check(verdict, "chain.root_pinned").detail


def test_root_given_only_as_trusted_root(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, chain, key = device
    leaf_only = chain[: chain.index(b"-----END CERTIFICATE-----") + 26]
    verdict = verify_nvidia(_evidence(key), leaf_only, now=NOW, trusted_root=root)
    assert verdict.accepted
    assert len(verdict.facts["chain"]) == 2


def test_generated_fwid_mismatch_rejects(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, chain, key = device
    opaque = _tlv(3, b"550.90.07\x00") + _tlv(20, bytes(48))
    verdict = verify_nvidia(_evidence(key, opaque=opaque), chain, now=NOW, trusted_root=root)
    assert [c.name for c in verdict.failed] == ["fwid"]
    no_fwid = verify_nvidia(
        _evidence(key, opaque=_tlv(3, b"1\x00")), chain, now=NOW, trusted_root=root
    )
    assert [c.name for c in no_fwid.failed] == ["fwid"]


def test_generated_expired_chain_rejects(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, chain, key = device
    late = END + timedelta(days=1)
    verdict = verify_nvidia(_evidence(key), chain, now=late, trusted_root=root)
    assert [c.name for c in verdict.failed] == ["chain.validity"]


def test_a_leaf_signed_by_another_key_breaks_the_chain(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, _, _ = device
    root_cert = x509.load_pem_x509_certificate(root)
    impostor_key = ec.generate_private_key(ec.SECP384R1())
    leaf, key = _leaf(root_cert, impostor_key)  # names the root as issuer; not signed by it
    chain = leaf.public_bytes(Encoding.PEM) + root
    verdict = verify_nvidia(_evidence(key), chain, now=NOW, trusted_root=root)
    assert _check(verdict, "chain").ok is False
    assert "does not verify" in _check(verdict, "chain").detail


def test_unparseable_certificates_reject(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, _, key = device
    verdict = verify_nvidia(_evidence(key), b"not a certificate", now=NOW, trusted_root=root)
    assert not verdict.accepted
    assert _check(verdict, "chain").ok is False
    assert _check(verdict, "report_signature").ok is False


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"request_code": 0xE1}, "request.code"),
        ({"response_code": 0x61}, "response.code"),
        ({"spec": 2}, "measurement specification"),
        ({"blocks": ((1, b"x"), (1, b"y"))}, "appears twice"),
        ({"opaque": _tlv(3, b"a") + _tlv(3, b"b")}, "DRIVER_VERSION"),
        ({"opaque": _tlv(3, b"abc")[:-1]}, "opaque data"),
        ({"trailing": b"\x00\x01"}, "trailing bytes"),
    ],
)
def test_malformed_evidence_names_the_field(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey], change: dict[str, Any], field: str
) -> None:
    _, _, key = device
    with pytest.raises(ValueError, match=re.escape(field)):
        parse_nvidia_evidence(_evidence(key, **change))


def test_malformed_header_fields() -> None:
    with pytest.raises(ValueError, match="request:"):
        parse_nvidia_evidence(b"\x11\xe0")
    with pytest.raises(ValueError, match=r"request\.version"):
        parse_nvidia_evidence(bytes([0x13, 0xE0, 1, 0xFF]) + bytes(33))
    with pytest.raises(ValueError, match=r"request\.param1"):
        parse_nvidia_evidence(bytes([0x11, 0xE0, 0, 0xFF]) + bytes(33))
    with pytest.raises(ValueError, match="no MEASUREMENTS response"):
        parse_nvidia_evidence(bytes([0x11, 0xE0, 1, 0xFF]) + bytes(33))
    with pytest.raises(ValueError, match="odd number"):
        parse_nvidia_evidence(b"11e0f")


def test_naive_time_is_refused(device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey]) -> None:
    root, chain, key = device
    with pytest.raises(ValueError, match="now"):
        verify_nvidia(_evidence(key), chain, now=datetime(2025, 1, 1), trusted_root=root)


def test_vbios_format() -> None:
    assert format_vbios_version(bytes.fromhex("009f009601000000")) == "96.00.9F.00.01"
    assert format_vbios_version(bytes.fromhex("007400961a000000")) == "96.00.74.00.1A"


def test_a_bad_trusted_root_is_a_value_error(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    _, chain, key = device
    with pytest.raises(ValueError, match="trusted_root"):
        verify_nvidia(_evidence(key), chain, now=NOW, trusted_root=b"junk")


# --------------------------------------------------------------------------- word for word


def _signed_by(
    cn: str | x509.Name,
    key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey,
    *,
    ca: bool | None = True,
    path_length: int | None = None,
    usage: x509.KeyUsage | None = KEY_CERT_SIGN,
    fwid: bool | bytes = False,
) -> x509.Certificate:
    """A certificate for ``key`` signed by ``issuer_key`` (self-signed when no ``issuer``).

    ``fwid``: True for a TcbInfo holding ``FWID``, or the extension's raw value.
    """
    subject = _name(cn) if isinstance(cn, str) else cn
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(START)
        .not_valid_after(END)
    )
    if ca is not None:
        builder = builder.add_extension(x509.BasicConstraints(ca, path_length), critical=True)
    if usage is not None:
        builder = builder.add_extension(usage, critical=True)
    if fwid is not False:
        value = _dice_tcb_info(FWID) if fwid is True else fwid
        builder = builder.add_extension(
            x509.UnrecognizedExtension(TCG_DICE_FWID_OID, value), critical=False
        )
    if isinstance(issuer_key, ed25519.Ed25519PrivateKey):
        return builder.sign(issuer_key, None)
    return builder.sign(issuer_key, hashes.SHA384())


def _pem(*certs: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(Encoding.PEM) for c in certs)


def _details(verdict: Verdict) -> dict[str, tuple[bool | None, str]]:
    return {c.name: (c.ok, c.detail) for c in verdict.checks}


def test_generated_checks_word_for_word(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, chain, key = device
    spki = spki_sha256(x509.load_pem_x509_certificate(root))
    nonce = bytes(range(32))
    got = _details(verify_nvidia(_evidence(key), chain, now=NOW, nonce=nonce, trusted_root=root))
    assert got["report_signature"] == (
        True,
        "ECDSA P-384/SHA-384 over request || response (276 bytes) verifies with "
        "Test GPU FMC LF's key",
    )
    assert got["chain.root_pinned"] == (
        True,
        "the root Test Device Identity CA is the given trusted root Test Device Identity CA "
        f"(SPKI SHA-256 {spki})",
    )
    assert got["nonce"] == (True, f"the request's nonce is the expected {nonce.hex()}")
    assert got["fwid"] == (True, f"the leaf's TCG DICE FWID equals the reported {FWID.hex()}")
    wrong = verify_nvidia(_evidence(key), chain, now=NOW, nonce=bytes(32), trusted_root=root)
    assert _details(wrong)["nonce"] == (
        False,
        f"the request's nonce {nonce.hex()} is not the expected {bytes(32).hex()}",
    )
    short = verify_nvidia(_evidence(key), chain, now=NOW, nonce=bytes(31), trusted_root=root)
    assert _details(short)["nonce"] == (
        False,
        f"the request's nonce {nonce.hex()} is not the expected {bytes(31).hex()} "
        "(31 bytes; SPDM nonces are 32)",
    )
    bad = bytearray(_evidence(key))
    bad[-1] ^= 1
    assert _details(verify_nvidia(bytes(bad), chain, now=NOW, trusted_root=root))[
        "report_signature"
    ] == (
        False,
        "the ECDSA P-384/SHA-384 signature over the request and response (276 bytes) does not "
        "verify with Test GPU FMC LF's key",
    )


def test_without_a_leaf_or_a_fwid_the_checks_say_so(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, chain, key = device
    none = _details(verify_nvidia(_evidence(key), b"not a certificate", now=NOW))
    assert none["report_signature"] == (
        False,
        "no leaf certificate to check the SPDM signature with",
    )
    assert none["fwid"] == (
        False,
        f"no leaf certificate: no TCG DICE FWID ({TCG_DICE_FWID_OID.dotted_string})",
    )
    opaque = _tlv(3, b"1\x00")
    no_fwid = verify_nvidia(_evidence(key, opaque=opaque), chain, now=NOW, trusted_root=root)
    assert _details(no_fwid)["fwid"] == (False, "the opaque data carries no FWID (type 20)")


def test_a_leaf_without_a_p384_key_fails_the_signature() -> None:
    root_key = ec.generate_private_key(ec.SECP384R1())
    root = _signed_by("Test Root", root_key, None, root_key)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = _signed_by(
        "P-256 Leaf", leaf_key, root, root_key, ca=None, usage=DIGITAL_SIGNATURE, fwid=True
    )
    device_key = ec.generate_private_key(ec.SECP384R1())
    verdict = verify_nvidia(
        _evidence(device_key), _pem(leaf, root), now=NOW, trusted_root=_pem(root)
    )
    assert _details(verdict)["report_signature"] == (
        False,
        "the leaf P-256 Leaf has no ECDSA P-384 key",
    )
    assert not verdict.accepted


def _chain_through(
    **intermediate: Any,
) -> tuple[Verdict, str]:
    """root -> intermediate (as given) -> leaf; the verdict and the chain check's detail."""
    root_key, mid_key, leaf_key = (ec.generate_private_key(ec.SECP384R1()) for _ in range(3))
    root = _signed_by(
        "Test Root", root_key, None, root_key, path_length=intermediate.pop("root_path", None)
    )
    mid = _signed_by("Test Middle", mid_key, root, root_key, **intermediate)
    leaf = _signed_by(
        "Test Leaf", leaf_key, mid, mid_key, ca=None, usage=DIGITAL_SIGNATURE, fwid=True
    )
    verdict = verify_nvidia(
        _evidence(leaf_key), _pem(leaf, mid, root), now=NOW, trusted_root=_pem(root)
    )
    return verdict, _details(verdict)["chain"][1]


def test_every_issuer_must_be_a_ca_that_may_sign_so_deep() -> None:
    verdict, _ = _chain_through(root_path=1)
    assert verdict.accepted, [c.line() for c in verdict.failed]
    verdict, detail = _chain_through(ca=None)
    assert not verdict.accepted
    assert "Test Middle signs certificates but is not a CA (basicConstraints)" in detail
    verdict, detail = _chain_through(ca=False)
    assert "Test Middle signs certificates but is not a CA (basicConstraints)" in detail
    verdict, detail = _chain_through(root_path=0)
    assert "Test Root's path length 0 is exceeded (1)" in detail
    verdict, detail = _chain_through(usage=DIGITAL_SIGNATURE)
    assert "Test Middle's key usage does not allow signing certificates" in detail


def test_generated_facts_and_every_check_word_for_word(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, chain, key = device
    opaque = (
        _tlv(6, bytes.fromhex("009f009601000000"))
        + _tlv(3, b"550.90.07\x00")
        + _tlv(17, b"1010\x00")
        + _tlv(20, FWID)
        + _tlv(34, b"\x02\x01")
    )
    evidence = _evidence(key, opaque=opaque, trailing=b"\x00\x00")
    verdict = verify_nvidia(evidence, chain, now=NOW, trusted_root=root)
    assert verdict.facts == {
        "spdm_version": "0x11",
        "nonce": bytes(range(32)).hex(),
        "responder_nonce": "5a" * 32,
        "slot_id": 0,
        "measurement_operation": "0xff",
        "measurement_blocks": 2,
        "measurements": {"1": "aa" * 48, "2": "bb" * 48},
        "trailing_padding": 2,
        "measurement_value_types": ["0x01"],
        "driver_version": "550.90.07",
        "project": "1010",
        "vbios_version": "96.00.9F.00.01",
        "fwid": FWID.hex(),
        "opaque_data_version": 0x0102,
        "opaque": {
            "VBIOS_VERSION": "009f009601000000",
            "DRIVER_VERSION": b"550.90.07\x00".hex(),
            "PROJECT": b"1010\x00".hex(),
            "FWID": FWID.hex(),
            "OPAQUE_DATA_VERSION": "0201",
        },
        "trailing_padding_note": "2 zero bytes after the signature, outside what the "
        "signature covers: tolerated as padding",
        "chain": ["CN=Test GPU FMC LF", "CN=Test Device Identity CA"],
    }
    spki = spki_sha256(x509.load_pem_x509_certificate(root))
    assert _details(verdict) == {
        "report_signature": (
            True,
            "ECDSA P-384/SHA-384 over request || response (282 bytes) verifies with "
            "Test GPU FMC LF's key",
        ),
        "chain": (
            True,
            "Test GPU FMC LF → Test Device Identity CA: each certificate signed by the next, "
            "ending at a self-signed root",
        ),
        "chain.root_pinned": (
            True,
            "the root Test Device Identity CA is the given trusted root Test Device Identity "
            f"CA (SPKI SHA-256 {spki})",
        ),
        "chain.leaf": (
            True,
            "the leaf Test GPU FMC LF is an end-entity certificate with a FWID extension",
        ),
        "chain.validity": (True, "all 2 certificates are valid at 2025-01-01T00:00:00Z"),
        "nonce": (
            None,
            "no expected nonce was given: freshness not checked (the request's nonce is "
            f"{bytes(range(32)).hex()})",
        ),
        "fwid": (True, f"the leaf's TCG DICE FWID equals the reported {FWID.hex()}"),
        "rim.driver": (
            None,
            "not checked offline: the measurements were not compared with NVIDIA's driver "
            "RIM (driver 550.90.07); --rim FILE compares them",
        ),
        "rim.vbios": (
            None,
            "not checked offline: the measurements were not compared with NVIDIA's VBIOS "
            "RIM (VBIOS 96.00.9F.00.01); --rim FILE compares them",
        ),
        "ocsp": (
            None,
            "not checked offline: the certificates' revocation status was not asked of "
            "NVIDIA's OCSP service; --online would ask it",
        ),
    }
    assert verdict.kind == "nvidia"
    assert [c.name for c in verdict.checks][:3] == [
        "report_signature",
        "chain",
        "chain.root_pinned",
    ]
    with pytest.raises(ValueError) as naive:
        verify_nvidia(evidence, chain, now=NOW.replace(tzinfo=None))
    assert str(naive.value) == "now: a time without a time zone"
    online = _details(verify_nvidia(evidence, chain, now=NOW, trusted_root=root, online=True))
    why = "online verification is not available in this build: no network"
    assert [online[n] for n in ("rim.driver", "rim.vbios", "ocsp")] == [(None, why)] * 3
    unpinned = _details(verify_nvidia(evidence, chain, now=NOW))["chain.root_pinned"]
    assert unpinned == (
        False,
        f"the root Test Device Identity CA (SPKI SHA-256 {spki}) is not the pinned NVIDIA "
        f"Device Identity CA ({NVIDIA_DEVICE_ROOT_SPKI_SHA256})",
    )
    nothing = _details(verify_nvidia(evidence, b"", now=NOW))
    assert nothing["chain"][0] is False
    assert nothing["chain"][1].startswith("the certificates do not parse: ")
    assert [nothing[n] for n in ("chain.root_pinned", "chain.leaf", "chain.validity")] == [
        (False, "no certificates"),
        (False, "no certificates"),
        (None, "no certificates"),
    ]


def test_parse_errors_name_the_block_and_the_opaque_entry(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    _, _, key = device
    with pytest.raises(ValueError) as info:
        parse_nvidia_evidence(_evidence(key, spec=2))
    assert str(info.value) == (
        "measurement block 1 of 2: measurement specification 0x02 is not DMTF (0x01)"
    )
    for opaque, message in [
        (
            b"\x01",
            "opaque data: the type of the entry at offset 0: needs 2 bytes at offset 0, "
            "only 1 remain",
        ),
        (
            _tlv(3, b"1\x00") + b"\x63\x00\x05",
            "opaque data: the size of TYPE_99 at offset 6: needs 2 bytes at offset 8, "
            "only 1 remain",
        ),
    ]:
        with pytest.raises(ValueError) as info:
            parse_nvidia_evidence(_evidence(key, opaque=opaque))
        assert str(info.value) == message
    unknown = parse_nvidia_evidence(_evidence(key, opaque=_tlv(99, b"\x01")))
    assert [(f.type, f.name) for f in unknown.response.opaque] == [(99, "TYPE_99")]


def test_text_facts_that_are_not_printable_are_shown_as_hex(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, chain, key = device
    opaque = _tlv(3, b"5\x07\x00") + _tlv(17, b"1010\x00tail\x00")
    verdict = verify_nvidia(_evidence(key, opaque=opaque), chain, now=NOW, trusted_root=root)
    assert verdict.facts["driver_version"] == "350700"
    assert verdict.facts["project"] == "1010"
    assert format_vbios_version(b"\xab\xcd") == "ABCD"


def test_every_truncation_of_the_response_names_the_field_it_cuts(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    """The response's layout, written out here, against the parser's words at every cut."""
    _, _, key = device
    evidence = _evidence(key, opaque=_tlv(3, b"1\x00"))
    record = 2 * (4 + 3 + 48)
    fields = [  # (field, size) in order, from offset 37
        ("response.version", 1),
        ("response.code", 1),
        ("response.param1", 1),
        ("response.param2", 1),
        ("response.number_of_blocks", 1),
        ("response.measurement_record_length", 3),
        ("record", record),
        ("response.nonce", 32),
        ("response.opaque_length", 2),
        ("response.opaque_data", 6),
        ("response.signature", 96),
    ]
    assert 37 + sum(size for _, size in fields) == len(evidence)
    start = 37
    for field, size in fields:
        for cut in range(start, start + size):
            if cut == 37:
                continue  # nothing after the request: its own words, tested elsewhere
            with pytest.raises(ValueError) as info:
                parse_nvidia_evidence(evidence[:cut])
            if field == "record":
                expected = (
                    f"response.measurement_record_length: {record} bytes, but only "
                    f"{cut - start} remain in the evidence"
                )
            else:
                expected = (
                    f"{field}: needs {size} bytes at offset {start}, only {cut - start} remain"
                )
            assert str(info.value) == expected, cut
        start += size
    with pytest.raises(ValueError) as info:
        parse_nvidia_evidence(evidence[:37])
    assert str(info.value) == (
        "response: the evidence ends after the request; no MEASUREMENTS response"
    )


def test_inconsistent_lengths_and_versions_are_named(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, chain, key = device
    evidence = _evidence(key)

    def refused(data: bytes) -> str:
        with pytest.raises(ValueError) as info:
            parse_nvidia_evidence(data)
        return str(info.value)

    def edited(at: int, value: int) -> bytes:
        return evidence[:at] + bytes([value]) + evidence[at + 1 :]

    assert refused(edited(37, 0x12)) == "response.version: 0x12 differs from the request's 0x11"
    assert refused(edited(41, 1)) == (
        "response.measurement_record_length: the 1 blocks leave 55 bytes of the measurement "
        "record unused"
    )
    assert refused(edited(50, 47)) == (  # block 1's DMTF value size: 47 of its 48 bytes
        "measurement block 1 of 2 (index 1): measurement size 51 but its DMTF value is 47 "
        "bytes (expected size 50)"
    )
    padded = _evidence(key, trailing=b"\x00\x07")
    assert refused(padded) == (
        f"trailing bytes: 2 bytes follow the signature (at offset {len(evidence)}) and are not "
        f"zero padding (a non-zero byte at offset {len(evidence) + 1})"
    )
    bare = verify_nvidia(_evidence(key, opaque=_tlv(20, FWID)), chain, now=NOW, trusted_root=root)
    assert "(driver ?); --rim FILE" in _details(bare)["rim.driver"][1]
    assert "(VBIOS ?); --rim FILE" in _details(bare)["rim.vbios"][1]


# --------------------------------------------------------------------------- every word


def _block(index: int, value: bytes) -> bytes:
    """One measurement block: index, DMTF, size, then the DMTF value (type 1)."""
    dmtf = b"\x01" + len(value).to_bytes(2, "little") + value
    return bytes([index, 1]) + len(dmtf).to_bytes(2, "little") + dmtf


def _unsigned(record: bytes, count: int, *, version: int = 0x11) -> bytes:
    """Request and response around a measurement record written by hand, for the parser
    only: the signature is zeros, and the record starts at offset 45."""
    request = bytes([0x11, 0xE0, 0x01, 0xFF]) + bytes(range(32)) + b"\x00"
    head = bytes([version, 0x60, 0, 0, count]) + len(record).to_bytes(3, "little")
    return request + head + record + b"\x5a" * 32 + b"\x00\x00" + bytes(96)


def test_every_short_read_inside_the_measurement_record_names_the_field() -> None:
    """A block cut short is named inside the record: no read runs on past its end."""
    first = _block(1, b"\xaa" * 48)  # offsets 45..99; the second block starts at 100
    for record, message in [
        (first, "measurement block 2 of 2: index: needs 1 bytes at offset 100, only 0 remain"),
        (
            first + b"\x02",
            "measurement block 2 of 2: measurement specification: needs 1 bytes at offset "
            "101, only 0 remain",
        ),
        (
            first + b"\x02\x01\x33",
            "measurement block 2 of 2: measurement size: needs 2 bytes at offset 102, "
            "only 1 remain",
        ),
        (  # a block longer than what is left of the record, with the nonce right after it
            first + b"\x02\x01\x33\x00" + b"\x01\x30\x00" + b"\xbb" * 7,
            "measurement block 2 of 2 (index 2): measurement: needs 51 bytes at offset 104, "
            "only 10 remain",
        ),
    ]:
        with pytest.raises(ValueError) as info:
            parse_nvidia_evidence(_unsigned(record, 2))
        assert str(info.value) == message
    for body, message in [  # inside one block's measurement (offsets from its start)
        (b"", "DMTF value type: needs 1 bytes at offset 0, only 0 remain"),
        (b"\x01\x30", "DMTF value size: needs 2 bytes at offset 1, only 1 remain"),
        (b"\x01\x30\x00", "DMTF value: needs 48 bytes at offset 3, only 0 remain"),
    ]:
        record = bytes([1, 1]) + len(body).to_bytes(2, "little") + body
        with pytest.raises(ValueError) as info:
            parse_nvidia_evidence(_unsigned(record, 1))
        assert str(info.value) == f"measurement block 1 of 1 (index 1): {message}"
    with pytest.raises(ValueError) as info:
        parse_nvidia_evidence(_unsigned(first, 1, version=0x10))
    assert str(info.value) == "response.version: 0x10 is not SPDM 1.1 or 1.2"
    with pytest.raises(ValueError) as info:
        parse_nvidia_evidence(bytes([0x11, 0xE0, 0x02, 0xFF]) + bytes(33))
    assert str(info.value) == (
        "request.param1: 0x02 does not request a signature (bit 0), so the request has no "
        "nonce and the response is not signed"
    )


def test_every_parsed_field_is_the_one_sent(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    _, _, key = device
    raw = bytearray(_evidence(key))
    raw[3], raw[36] = 0x07, 0x05  # the request's measurement operation and slot id
    raw[39], raw[40] = 0x02, 0x03  # the response's param1 and param2
    parsed = parse_nvidia_evidence(bytes(raw))
    assert parsed.request == MeasurementsRequest(
        0x11, 0xE0, 0x01, 0x07, bytes(range(32)), 0x05, bytes(raw[:37])
    )
    response = parsed.response
    assert (response.version, response.code, response.param1, response.param2) == (
        0x11,
        0x60,
        0x02,
        0x03,
    )
    assert response.blocks == (
        MeasurementBlock(1, 1, 1, b"\xaa" * 48),
        MeasurementBlock(2, 1, 1, b"\xbb" * 48),
    )
    assert response.nonce == b"\x5a" * 32
    assert response.signed == bytes(raw[37:-96])


def test_hex_text_given_as_a_string_and_other_strings(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    _, _, key = device
    evidence = _evidence(key)
    spaced = " ".join(evidence[i : i + 16].hex() for i in range(0, len(evidence), 16))
    assert parse_nvidia_evidence(spaced + "\n") == parse_nvidia_evidence(evidence)
    # not hex: each character outside ASCII is read as "?" (0x3f), which is no SPDM version
    with pytest.raises(ValueError) as info:
        parse_nvidia_evidence("é" * 40)
    assert str(info.value) == "request.version: 0x3f is not SPDM 1.1 or 1.2 (0x11, 0x12)"


def test_only_zero_bytes_pass_as_padding(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    _, _, key = device
    end = len(_evidence(key))
    with pytest.raises(ValueError) as info:
        parse_nvidia_evidence(_evidence(key, trailing=b"\x00X"))
    assert str(info.value) == (
        f"trailing bytes: 2 bytes follow the signature (at offset {end}) and are not zero "
        f"padding (a non-zero byte at offset {end + 1})"
    )


def _keys(n: int) -> list[ec.EllipticCurvePrivateKey]:
    return [ec.generate_private_key(ec.SECP384R1()) for _ in range(n)]


def _leaf_of(
    issuer: x509.Certificate,
    issuer_key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey,
    **kw: Any,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A device leaf (end entity, digital signature, a FWID unless told) and its key."""
    key = ec.generate_private_key(ec.SECP384R1())
    kw.setdefault("fwid", True)
    leaf = _signed_by("Test Leaf", key, issuer, issuer_key, ca=None, usage=DIGITAL_SIGNATURE, **kw)
    return leaf, key


def _verify_chain(
    certs: bytes, key: ec.EllipticCurvePrivateKey, root: x509.Certificate | None, **kw: Any
) -> Verdict:
    kw.setdefault("now", NOW)
    trusted = _pem(root) if root is not None else None
    return verify_nvidia(_evidence(key), certs, trusted_root=trusted, **kw)


def test_a_leaf_that_is_a_ca_without_a_fwid_that_may_not_sign_is_named_each_way() -> None:
    root_key, leaf_key = _keys(2)
    root = _signed_by("Test Root", root_key, None, root_key)
    leaf = _signed_by("Test Leaf", leaf_key, root, root_key)  # a CA, keyCertSign only
    got = _details(_verify_chain(_pem(leaf, root), leaf_key, root))
    assert got["chain"][0] is True
    assert got["chain.leaf"] == (
        False,
        "the leaf Test Leaf is a CA certificate, not the device's end-entity (FMC) certificate; "
        f"has no TCG DICE FWID extension ({TCG_DICE_FWID_OID.dotted_string}); "
        "may not sign (key usage)",
    )
    assert got["fwid"] == (
        False,
        f"Test Leaf: no TCG DICE FWID ({TCG_DICE_FWID_OID.dotted_string})",
    )


def test_the_fwid_is_the_last_48_bytes_of_the_extension() -> None:
    root_key, _ = _keys(2)
    root = _signed_by("Test Root", root_key, None, root_key)
    bare, key = _leaf_of(root, root_key, fwid=FWID)  # exactly the 48 bytes, no TcbInfo around
    assert _details(_verify_chain(_pem(bare, root), key, root))["fwid"] == (
        True,
        f"the leaf's TCG DICE FWID equals the reported {FWID.hex()}",
    )
    short, key = _leaf_of(root, root_key, fwid=FWID[:10])
    got = _details(_verify_chain(_pem(short, root), key, root))
    assert got["fwid"] == (
        False,
        f"Test Leaf: no TCG DICE FWID ({TCG_DICE_FWID_OID.dotted_string})",
    )
    assert got["chain.leaf"][0] is True  # the extension is there; it holds no FWID
    other, key = _leaf_of(root, root_key, fwid=bytes(48))
    assert _details(_verify_chain(_pem(other, root), key, root))["fwid"] == (
        False,
        f"the leaf's FWID {bytes(48).hex()} differs from the reported {FWID.hex()}",
    )


def test_validity_includes_both_ends_and_names_every_certificate_out_of_it(
    device: tuple[bytes, bytes, ec.EllipticCurvePrivateKey],
) -> None:
    root, chain, key = device
    for now in (START, END):
        verdict = verify_nvidia(_evidence(key), chain, now=now, trusted_root=root)
        assert _details(verdict)["chain.validity"] == (
            True,
            f"all 2 certificates are valid at {now:%Y-%m-%dT%H:%M:%SZ}",
        )
    late = verify_nvidia(_evidence(key), chain, now=END + timedelta(seconds=1), trusted_root=root)
    span = "(valid 2024-01-01T00:00:00Z to 2034-01-01T00:00:00Z)"
    assert _details(late)["chain.validity"] == (
        False,
        f"not valid at 2034-01-01T00:00:01Z: Test GPU FMC LF {span}, Test Device Identity CA {span}",
    )


def test_the_leaf_is_the_certificate_with_a_fwid_that_issues_none_in_any_order() -> None:
    root_key, mid_key, stray_key = _keys(3)
    root = _signed_by("Test Root", root_key, None, root_key)
    mid = _signed_by("Test Middle", mid_key, root, root_key)
    stray = _signed_by("Stray", stray_key, None, stray_key, ca=None, usage=None)
    leaf, key = _leaf_of(mid, mid_key)
    verdict = _verify_chain(_pem(stray, root, leaf, mid), key, root)
    assert verdict.accepted, [c.line() for c in verdict.failed]
    assert verdict.facts["chain"] == ["CN=Test Leaf", "CN=Test Middle", "CN=Test Root"]
    assert verdict.facts["unused_certificates"] == ["CN=Stray"]
    # without a FWID anywhere, the one certificate that issues none is still the leaf
    bare, key = _leaf_of(mid, mid_key, fwid=False)
    verdict = _verify_chain(_pem(root, mid, bare), key, root)
    assert verdict.facts["chain"] == ["CN=Test Leaf", "CN=Test Middle", "CN=Test Root"]
    assert _details(verdict)["chain"][0] is True
    assert "unused_certificates" not in verdict.facts


def test_a_chain_without_its_root_or_that_loops_is_named() -> None:
    root_key, mid_key, a_key, b_key = _keys(4)
    root = _signed_by("Test Root", root_key, None, root_key)
    mid = _signed_by("Test Middle", mid_key, root, root_key)
    leaf, key = _leaf_of(mid, mid_key)
    got = _details(_verify_chain(_pem(leaf, mid), key, None))
    assert got["chain"] == (
        False,
        "Test Leaf → Test Middle: no certificate given issued Test Middle: its issuer "
        "CN=Test Root is missing",
    )
    assert got["chain.root_pinned"] == (False, "the chain stops at Test Middle, not at a root")
    # A and B each issued by the other: the walk stops where it comes back
    b_name = _name("Test B")
    a = _signed_by("Test A", a_key, _signed_by(b_name, b_key, None, b_key), b_key, fwid=True)
    b = _signed_by(b_name, b_key, a, a_key)
    got = _details(_verify_chain(_pem(a, b), a_key, None))
    assert got["chain"] == (
        False,
        "Test A → Test B: the chain loops: Test B's issuer is already in it",
    )
    assert got["chain.root_pinned"] == (False, "the chain stops at Test B, not at a root")


def test_every_signature_in_the_chain_is_checked_and_each_failure_named() -> None:
    root_key, other_key, third_key = _keys(3)
    root = _signed_by("Test Root", root_key, None, root_key)
    leaf, key = _leaf_of(root, root_key)
    # a root whose self-signature is not its own key's
    forged = _signed_by("Test Root", root_key, None, other_key)
    assert _details(_verify_chain(_pem(leaf, forged), key, None))["chain"] == (
        False,
        "Test Leaf → Test Root: the root Test Root: the signature on Test Root does not verify "
        "with Test Root's key",
    )
    # two certificates named as the issuer, neither of which signed the leaf
    impostor, key = _leaf_of(root, third_key)
    twin = _signed_by("Test Root", other_key, None, other_key)
    wrong = "the signature on Test Leaf does not verify with Test Root's key"
    assert _details(_verify_chain(_pem(impostor, root, twin), key, None))["chain"] == (
        False,
        f"Test Leaf: {wrong}; {wrong}",
    )
    # an issuer whose key cannot check the leaf's signature at all
    ed_key = ed25519.Ed25519PrivateKey.generate()
    ed_root = _signed_by("Test Ed Root", ed_key, None, ed_key)
    orphan, key = _leaf_of(ed_root, third_key)
    assert _details(_verify_chain(_pem(orphan, ed_root), key, None))["chain"] == (
        False,
        "Test Leaf: Test Leaf cannot be checked against Test Ed Root: Signature algorithm "
        "does not match issuer key type",
    )


def test_a_certificate_without_a_common_name_is_named_by_its_subject() -> None:
    root_key, _ = _keys(2)
    org = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Test Org")])
    root = _signed_by(org, root_key, None, root_key)
    leaf, key = _leaf_of(root, root_key)
    verdict = _verify_chain(_pem(leaf, root), key, root)
    assert verdict.accepted, [c.line() for c in verdict.failed]
    assert _details(verdict)["chain"] == (
        True,
        "Test Leaf → O=Test Org: each certificate signed by the next, ending at a self-signed root",
    )


# --------------------------------------------------------------------------- nonce by default

NV01_NONCE = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"


def _cli(*extra: str) -> list[str]:
    return [
        "attest", "verify", "--kind", "nvidia",
        "--evidence", str(NV / NV01[0]), "--certs", str(NV / NV01[1]),
        "--now", "2025-01-01T00:00:00Z", *extra,
    ]  # fmt: skip


def test_the_manifest_names_nv01s_nonce(manifest: dict[str, Any]) -> None:
    expected = _cases(manifest)["nv-01-nvtrust-h100"]["expected"]
    assert f"nonce must equal {NV01_NONCE}" in expected


@pytest.mark.usefixtures("attestation_vectors")
def test_the_default_policy_refuses_gpu_evidence_checked_against_no_nonce() -> None:
    from attestation.policy import Policy, apply_policy

    verdict = apply_policy(_verify(*NV01), Policy())
    assert not verdict.accepted
    assert [c.name for c in verdict.failed] == ["policy.nonce"]
    assert "no nonce was given" in _check(verdict, "policy.nonce").detail
    assert Policy().require_nonce is True
    fresh = apply_policy(_verify(*NV01, nonce=bytes.fromhex(NV01_NONCE)), Policy())
    assert fresh.accepted, [c.line() for c in fresh.failed]
    assert "policy.nonce" not in {c.name for c in fresh.checks}  # the verifier's check decided
    by_policy = apply_policy(_verify(*NV01), Policy(nonce=NV01_NONCE))
    assert by_policy.accepted and _check(by_policy, "policy.nonce").ok is True
    wrong = apply_policy(_verify(*NV01), Policy(nonce="00" * 32))
    assert [c.name for c in wrong.failed] == ["policy.nonce"]
    waived = apply_policy(_verify(*NV01), Policy(require_nonce=False))
    assert waived.accepted
    assert _check(waived, "policy.nonce").ok is None
    assert "require_nonce: false" in _check(waived, "policy.nonce").detail


def test_the_nonce_rule_is_for_gpu_evidence_only() -> None:
    from attestation.policy import Policy, apply_policy

    for kind in ("snp", "tdx"):
        verdict = apply_policy(Verdict(kind, facts={}), Policy())  # type: ignore[arg-type]
        assert "policy.nonce" not in {c.name for c in verdict.checks}


@pytest.mark.usefixtures("attestation_vectors")
def test_the_command_refuses_nv01_without_a_nonce_and_accepts_it_with_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from affidavit.cli import main

    assert main(_cli()) == 1
    out = capsys.readouterr().out
    assert "FAIL policy.nonce: no nonce was given" in out
    assert out.splitlines()[-1].startswith("verdict: REJECT")
    assert main(_cli("--nonce", NV01_NONCE)) == 0
    assert "ok   nonce: the request's nonce is the expected" in capsys.readouterr().out
    assert main(_cli("--nonce", "00" * 32)) == 1
    waiver = tmp_path / "no-nonce.json"
    waiver.write_text('{"require_nonce": false}')
    assert main(_cli("--policy", str(waiver))) == 0
    assert "skip policy.nonce" in capsys.readouterr().out
    pinned = tmp_path / "nonce.json"
    pinned.write_text(json.dumps({"nonce": NV01_NONCE}))
    assert main(_cli("--policy", str(pinned))) == 0
    assert "ok   policy.nonce" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text('{"require_nonce": "sometimes"}')
    assert main(_cli("--policy", str(bad))) == 2
    assert "require_nonce" in capsys.readouterr().err


def test_the_validity_line_counts_its_certificates_in_words() -> None:
    from attestation.nvidia import _all_certificates

    assert _all_certificates(1) == "the 1 certificate is"
    assert _all_certificates(4) == "all 4 certificates are"
