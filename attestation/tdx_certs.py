"""Intel's certificate chains, as the TDX checks walk them: up to one pinned root.

The PCK chain in a quote and the issuer chains of Intel's collateral (TCB signing, CRL
signing) all end at the Intel SGX Root CA, trusted only by the SHA-256 of its
SubjectPublicKeyInfo. Here: that pin, the names Intel gives its certificates, building a
chain from a leaf up to the root, validity at a given time, and ECDSA P-256 signatures with a
raw r || s. Nothing here adds a check to a verdict (``attestation.tdx`` and
``attestation.tdx_collateral`` do) or reads the clock (validity is judged at the time given).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.x509.oid import ExtensionOID, NameOID

from attestation.certs import spki_sha256

__all__ = ["INTEL_SGX_ROOT_CA_SPKI_SHA256", "PCK_CA_CNS", "PCK_LEAF_CN", "TCB_SIGNING_CN"]

#: SHA-256 of the SubjectPublicKeyInfo (DER) of "CN=Intel SGX Root CA, O=Intel Corporation,
#: L=Santa Clara, ST=CA, C=US", the self-signed ECDSA P-256 root of every PCK, TCB-signing and
#: CRL-signing chain (valid 2018-05-21 to 2049-12-31). This is Intel's public root,
#: https://certificates.trustedservices.intel.com/Intel_SGX_Provisioning_Certification_RootCA.pem
#: (the same key as the copies shipped by Phala-Network/dcap-qvl src/TrustedRootCA.der and
#: google/go-tdx-guest verify/trusted_root.pem, whose DER SHA-256 is
#: 44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3).
INTEL_SGX_ROOT_CA_SPKI_SHA256 = "a0af031289f5d5d4132f9186068a7fc13628633ba235777472e29b6b6c67a49e"

#: The names Intel gives the certificates of its chains.
PCK_LEAF_CN = "Intel SGX PCK Certificate"
PCK_CA_CNS = ("Intel SGX PCK Platform CA", "Intel SGX PCK Processor CA")
TCB_SIGNING_CN = "Intel SGX TCB Signing"


def _cn(cert: x509.Certificate) -> str:
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else cert.subject.rfc4514_string()


def _cn_of(name: x509.Name) -> str:
    cns = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else name.rfc4514_string()


def _issued(child: x509.Certificate, issuer: x509.Certificate) -> str | None:
    """None if ``issuer`` signed ``child``; else why not."""
    try:
        child.verify_directly_issued_by(issuer)
    except InvalidSignature:
        return f"the signature on {_cn(child)} does not verify with {_cn(issuer)}'s key"
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        return f"{_cn(child)} cannot be checked against {_cn(issuer)}: {exc}"
    return None


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        bc = cert.extensions.get_extension_for_oid(ExtensionOID.BASIC_CONSTRAINTS).value
    except x509.ExtensionNotFound:
        return False
    return isinstance(bc, x509.BasicConstraints) and bc.ca


@dataclass(frozen=True)
class _Anchor:
    """The root every chain must end at: the pinned SPKI, and the certificate once seen."""

    pin: str
    source: str
    cert: x509.Certificate | None  # the given trusted root, or None until a chain shows it


@dataclass
class _Chain:
    path: list[x509.Certificate]
    problem: str | None  # the chain is broken (signature, CA flag, missing issuer)
    pinned: bool  # the top is self-signed and its key is the pinned one
    pin_detail: str

    @property
    def ok(self) -> bool:
        return self.problem is None and self.pinned


def _build_chain(
    leaf: x509.Certificate, pool: Sequence[x509.Certificate], anchor: _Anchor
) -> _Chain:
    path = [leaf]
    candidates = [*pool, *([anchor.cert] if anchor.cert is not None else [])]
    problem: str | None = None
    while True:
        current = path[-1]
        if current.subject == current.issuer:
            why = _issued(current, current)
            problem = f"the root {_cn(current)}: {why}" if why else None
            break
        if len(path) > len(candidates) + 1:
            problem = "the chain loops"
            break
        named = [c for c in candidates if c.subject == current.issuer and c not in path]
        if not named:
            problem = f"no certificate given issued {_cn(current)} (issuer {current.issuer.rfc4514_string()})"
            break
        tried = [(c, _issued(current, c)) for c in named]
        issuer = next((c for c, why in tried if why is None), None)
        if issuer is None:
            problem = "; ".join(why for _, why in tried if why)
            break
        if not _is_ca(issuer):
            problem = f"{_cn(issuer)} signs certificates but is not a CA (basicConstraints)"
            path.append(issuer)
            break
        path.append(issuer)
    top = path[-1]
    found = spki_sha256(top)
    if top.subject != top.issuer:
        return _Chain(path, problem, False, f"the chain stops at {_cn(top)}, not at a root")
    pinned = found == anchor.pin
    detail = (
        f"the root {_cn(top)} is {anchor.source} (SPKI SHA-256 {found})"
        if pinned
        else f"the root {_cn(top)} (SPKI SHA-256 {found}) is not {anchor.source} ({anchor.pin})"
    )
    return _Chain(path, problem, pinned, detail)


def _pick_leaf(certs: Sequence[x509.Certificate]) -> x509.Certificate:
    """The certificate no other one names as its issuer (the first such)."""
    for cert in certs:
        if not any(o is not cert and o.issuer == cert.subject for o in certs):
            return cert
    return certs[0]


def _expired(path: Sequence[x509.Certificate], now: datetime) -> list[str]:
    return [
        f"{_cn(c)} (valid {_iso(c.not_valid_before_utc)} to {_iso(c.not_valid_after_utc)})"
        for c in path
        if not c.not_valid_before_utc <= now <= c.not_valid_after_utc
    ]


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _p256_verify(key: ec.EllipticCurvePublicKey, signature: bytes, data: bytes) -> bool:
    """ECDSA P-256/SHA-256 with a raw r || s (64 bytes) signature."""
    if len(signature) != 2 * 32:
        return False
    r = int.from_bytes(signature[:32], "big")
    s = int.from_bytes(signature[32:], "big")
    try:
        key.verify(encode_dss_signature(r, s), data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


def _p256_key(cert: x509.Certificate) -> ec.EllipticCurvePublicKey | None:
    key = cert.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return key
    return None
