"""NVIDIA RIM checks on RIMs signed by a test chain: what NVIDIA's own samples never show.

NVIDIA signs each whole SWID tag, and no two of its sample RIMs measure a common index, so
``test_nvidia_rim.py`` (NVIDIA's real RIMs) sees only the passing side of those checks. Here a
throwaway chain (a P-384 root and a signing leaf, made with ``cryptography``) stands in for
NVIDIA's CoRIM signing chain: a test double, trusted through ``trusted_root_spki``. The RIMs
are signed with ``signxml`` the way NVIDIA signs them (enveloped XML-DSig, ECDSA P-384 with
SHA-384, C14N 1.1, the chain in ``KeyInfo``), and checked by the same ``signxml`` verifier.
Needs no network.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID
from lxml import etree
from signxml.algorithms import (
    CanonicalizationMethod,
    DigestAlgorithm,
    SignatureConstructionMethod,
    SignatureMethod,
)
from signxml.signer import XMLSigner

from attestation.certs import spki_sha256
from attestation.nvidia_rim import (
    NVIDIA_RIM_ROOT_SPKI_SHA256,
    SHA384_NS,
    SWID_NS,
    Rim,
    check_rims,
    parse_rim,
    verify_rim_signature,
)
from attestation.verdict import Verdict

AT = datetime(2025, 6, 1, tzinfo=UTC)
DRIVER_VERSION, VBIOS_VERSION = "545.00", "96.00.5E.00.01"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    cn: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey
) -> x509.Certificate:
    ca = cn.endswith("Root")
    return (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(AT - timedelta(days=365))
        .not_valid_after(AT + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(signer, hashes.SHA384())
    )


class RimTestChain:
    """A test double of NVIDIA's RIM signing chain: a self-signed root and its signing leaf."""

    def __init__(self) -> None:
        root_key = ec.generate_private_key(ec.SECP384R1())
        self.root = _cert("Test RIM Root", root_key, _name("Test RIM Root"), root_key)
        self.leaf_key = ec.generate_private_key(ec.SECP384R1())
        self.leaf = _cert("Test RIM Signer", self.leaf_key, self.root.subject, root_key)
        self.spki = spki_sha256(self.root)

    def sign(self, indexes: dict[int, bool], version: str, *, payload_only: bool = False) -> bytes:
        """A SWID tag measuring ``indexes`` (index: active), signed whole or its Payload only."""
        tag = etree.Element(f"{{{SWID_NS}}}SoftwareIdentity", nsmap={None: SWID_NS})
        etree.SubElement(tag, f"{{{SWID_NS}}}Meta", colloquialVersion=version, product="GH100")
        payload = etree.SubElement(tag, f"{{{SWID_NS}}}Payload", Id="payload")
        for index, active in indexes.items():
            resource = etree.SubElement(
                payload,
                f"{{{SWID_NS}}}Resource",
                type="Measurement",
                index=str(index),
                active=str(active),
                alternatives="1",
                size="48",
                name=f"Measurement_{index}",
            )
            resource.set(f"{{{SHA384_NS}}}Hash0", bytes([index]).hex() * 48)
        signer = XMLSigner(
            method=SignatureConstructionMethod.enveloped,
            signature_algorithm=SignatureMethod.ECDSA_SHA384,
            digest_algorithm=DigestAlgorithm.SHA384,
            c14n_algorithm=CanonicalizationMethod.CANONICAL_XML_1_1,
        )
        chain = [c.public_bytes(Encoding.PEM).decode() for c in (self.leaf, self.root)]
        signed = signer.sign(
            tag,
            key=self.leaf_key,
            cert=chain,
            reference_uri="#payload" if payload_only else None,
        )
        return bytes(etree.tostring(signed))


@pytest.fixture(scope="module")
def chain() -> RimTestChain:
    return RimTestChain()


def _rim(chain: RimTestChain, name: str, indexes: dict[int, bool], version: str) -> Rim:
    return parse_rim(chain.sign(indexes, version), name)


def test_a_rim_signed_by_the_trusted_test_root_verifies_and_nvidias_root_stays_the_default(
    chain: RimTestChain,
) -> None:
    rim = _rim(chain, "test-driver.swidtag", {7: True, 21: False}, DRIVER_VERSION)
    result = verify_rim_signature(rim, AT, trusted_root_spki=chain.spki)
    assert (result.ok, result.detail) == (
        True,
        "test-driver.swidtag (driver 545.00): the enveloped XML-DSig signature verifies with "
        "Test RIM Signer → Test RIM Root (a trusted RIM root, not NVIDIA's), "
        "all valid at 2025-06-01T00:00:00Z",
    )
    assert result.signed is not None
    assert (result.signed.source, result.signed.version, sorted(result.signed.active)) == (
        "test-driver.swidtag",
        DRIVER_VERSION,
        [7],
    )
    # without the keyword the root is NVIDIA's pinned one, which did not sign this chain
    default = verify_rim_signature(rim, AT)
    assert (default.ok, default.signed) == (False, None)
    assert default.detail == (
        "test-driver.swidtag (driver 545.00): Test RIM Signer → Test RIM Root: the chain ends "
        f"at Test RIM Root (SPKI SHA-256 {chain.spki}), not at the pinned NVIDIA CoRIM signing "
        f"Root CA ({NVIDIA_RIM_ROOT_SPKI_SHA256})"
    )
    other = RimTestChain()
    refused = verify_rim_signature(rim, AT, trusted_root_spki=other.spki)
    assert refused.detail == (
        "test-driver.swidtag (driver 545.00): Test RIM Signer → Test RIM Root: the chain ends "
        f"at Test RIM Root (SPKI SHA-256 {chain.spki}), not at the trusted RIM root "
        f"({other.spki})"
    )


def test_a_signature_over_the_payload_only_is_not_a_signed_rim(chain: RimTestChain) -> None:
    """A valid signature whose reference is one element, not the whole tag (wrapping)."""
    rim = parse_rim(chain.sign({7: True}, DRIVER_VERSION, payload_only=True), "test-driver.swidtag")
    result = verify_rim_signature(rim, AT, trusted_root_spki=chain.spki)
    assert (result.ok, result.signed) == (False, None)
    assert result.detail == (
        "test-driver.swidtag (driver 545.00): what is signed is not the whole RIM: "
        f"test-driver.swidtag: the root element is {{{SWID_NS}}}Payload, not a SWID "
        "SoftwareIdentity"
    )
    # the same RIM signed whole verifies under the same chain
    whole = _rim(chain, "test-driver.swidtag", {7: True}, DRIVER_VERSION)
    assert verify_rim_signature(whole, AT, trusted_root_spki=chain.spki).ok


def _checks(rims: list[Rim], root: str) -> dict[str, tuple[bool | None, str]]:
    verdict = Verdict("nvidia")
    check_rims(
        verdict,
        rims,
        measurements={},
        driver_version=DRIVER_VERSION,
        vbios_version=VBIOS_VERSION,
        nvdec0_status=None,
        now=AT,
        trusted_root_spki=root,
    )
    return {c.name: (c.ok, c.detail) for c in verdict.checks}


def test_a_driver_and_a_vbios_rim_measuring_one_index_fail_naming_every_shared_index(
    chain: RimTestChain,
) -> None:
    driver = _rim(chain, "driver.swidtag", {3: True, 7: True, 21: True, 9: False}, DRIVER_VERSION)
    vbios = _rim(chain, "vbios.swidtag", {0: True, 3: True, 7: True, 21: False}, VBIOS_VERSION)
    checks = _checks([driver, vbios], chain.spki)
    assert checks["rim.signature"][0] is True
    assert checks["rim.indexes"] == (False, "the driver and VBIOS RIMs both measure index 3, 7")
    one = _rim(chain, "vbios.swidtag", {0: True, 7: True}, VBIOS_VERSION)
    assert _checks([driver, one], chain.spki)["rim.indexes"] == (
        False,
        "the driver and VBIOS RIMs both measure index 7",
    )
    # an index inactive in either RIM is not measured by it
    apart = _rim(chain, "vbios.swidtag", {0: True, 9: True, 21: False}, VBIOS_VERSION)
    assert _checks([driver, apart], chain.spki)["rim.indexes"] == (
        True,
        "the driver and VBIOS RIMs measure disjoint indexes",
    )


def test_check_rims_trusts_the_given_root_and_by_default_only_nvidias(
    chain: RimTestChain,
) -> None:
    driver = _rim(chain, "driver.swidtag", {7: True}, DRIVER_VERSION)
    vbios = _rim(chain, "vbios.swidtag", {0: True}, VBIOS_VERSION)
    trusted = _checks([driver, vbios], chain.spki)
    assert trusted["rim.signature"][0] is True
    assert trusted["rim.indexes"][0] is True
    verdict = Verdict("nvidia")
    check_rims(
        verdict,
        [driver, vbios],
        measurements={},
        driver_version=DRIVER_VERSION,
        vbios_version=VBIOS_VERSION,
        nvdec0_status=None,
        now=AT,
    )
    checks = {c.name: (c.ok, c.detail) for c in verdict.checks}
    assert checks["rim.signature"][0] is False
    assert "not at the pinned NVIDIA CoRIM signing Root CA" in checks["rim.signature"][1]
    assert checks["rim.driver"] == (
        False,
        "driver.swidtag: not compared: its signature does not verify",
    )
    assert "rim.indexes" not in checks
