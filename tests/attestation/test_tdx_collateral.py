"""Intel's TDX collateral, checked against a test double of Intel's SGX PKI.

Intel's keys cannot exist here, so the real vectors only ever show collateral that Intel
signed correctly. The double (``FakeIntel``) is a throwaway root → PCK Platform CA → PCK
certificate chain and a TCB-signing certificate, shaped and named like Intel's, with CRLs and
collateral JSON signed as Intel's PCS signs them (ECDSA P-256, raw r || s). Nothing in it is
Intel's: the checks trust it only through the verifier's anchor, set to the double's root.
Each test breaks one thing (a revoked certificate, a CRL signed by the wrong key or outside
its window, a member missing or of the wrong type…) and asserts the check a relying party
sees fail and the words that name what was wrong.

What the collateral says of the platform (QE identity, TDX module, TCB level) is tested on
tdx-01's real quote and TCB info / QE identity, one member changed at a time, each expected
verdict and detail written out (``TCB_CASES``). Last, tdx-01's quote is given the double's PCK
chain, its QE report signed again with the double's PCK key (``_requoted``), so the quote's
own chain checks can be broken one at a time too, through ``verify_tdx``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from attestation.certs import spki_sha256
from attestation.pck import SGX_EXTENSION_OID, PckExtension, parse_pck_extension
from attestation.tdx import INTEL_QE_VENDOR_ID, verify_tdx
from attestation.tdx_certs import _Anchor, _build_chain, _iso
from attestation.tdx_collateral import (
    _Bad,
    _collateral_members,
    _CollateralChecks,
    _exact_member,
    _get,
    _hex,
    _Signed,
    _when,
)
from attestation.tdx_quote import TdxQuote, parse_tdx_quote
from attestation.tdx_tcb import _TcbChecks
from attestation.verdict import Check, Verdict

NOW = datetime(2025, 6, 15, tzinfo=UTC)
ISSUED = datetime(2025, 6, 1, tzinfo=UTC)
NEXT = datetime(2025, 7, 1, tzinfo=UTC)
CERT_FROM = datetime(2020, 1, 1, tzinfo=UTC)
CERT_UNTIL = datetime(2040, 1, 1, tzinfo=UTC)
ROOT = "Intel SGX Root CA"
PLATFORM = "Intel SGX PCK Platform CA"
SIGNING = "Intel SGX TCB Signing"
PCK = "Intel SGX PCK Certificate"
AUTHENTICITY = (
    "collateral.tcb_info_signature",
    "collateral.tcb_info_chain",
    "collateral.tcb_info_validity",
    "collateral.qe_identity_signature",
    "collateral.qe_identity_chain",
    "collateral.qe_identity_validity",
    "collateral.root_ca_crl",
    "collateral.pck_crl",
    "pck_chain.revocation",
)


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Test double, not Intel"),
        ]
    )


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(
    cn: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool | None,
    valid: tuple[datetime, datetime] = (CERT_FROM, CERT_UNTIL),
) -> x509.Certificate:
    """``ca`` None: no basicConstraints at all."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer.subject if issuer is not None else _name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
    )
    if ca is not None:
        builder = builder.add_extension(x509.BasicConstraints(ca=ca, path_length=None), True)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(*certs: x509.Certificate) -> str:
    return "".join(c.public_bytes(Encoding.PEM).decode() for c in certs)


def _raw_signature(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def _document(issued: datetime = ISSUED, next_update: datetime = NEXT, **extra: Any) -> str:
    """A collateral document as Intel's PCS writes it: compact JSON, RFC 3339 times."""
    doc = {"version": 3, "issueDate": _iso(issued), "nextUpdate": _iso(next_update), **extra}
    return json.dumps(doc, separators=(",", ":"))


def _crl(
    issuer: x509.Certificate | x509.Name,
    key: ec.EllipticCurvePrivateKey,
    revoked: tuple[x509.Certificate, ...] = (),
    window: tuple[datetime, datetime] = (ISSUED, NEXT),
) -> x509.CertificateRevocationList:
    """A CRL as Intel's CAs publish them: ECDSA P-256, thisUpdate and nextUpdate."""
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(issuer.subject if isinstance(issuer, x509.Certificate) else issuer)
        .last_update(window[0])
        .next_update(window[1])
    )
    for cert in revoked:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder()
            .serial_number(cert.serial_number)
            .revocation_date(ISSUED)
            .build()
        )
    return builder.sign(key, hashes.SHA256())


@dataclass
class FakeIntel:
    """A test double of Intel's SGX PKI: root → PCK Platform CA → PCK certificate, and the
    root → TCB Signing certificate that signs the TCB info and QE identity. Not Intel's."""

    root_key: ec.EllipticCurvePrivateKey = field(default_factory=_key)
    platform_key: ec.EllipticCurvePrivateKey = field(default_factory=_key)
    signing_key: ec.EllipticCurvePrivateKey = field(default_factory=_key)
    pck_key: ec.EllipticCurvePrivateKey = field(default_factory=_key)

    def __post_init__(self) -> None:
        self.root = _cert(ROOT, self.root_key, None, self.root_key, ca=True)
        self.platform = _cert(PLATFORM, self.platform_key, self.root, self.root_key, ca=True)
        self.signing = _cert(SIGNING, self.signing_key, self.root, self.root_key, ca=False)
        self.pck = _cert(PCK, self.pck_key, self.platform, self.platform_key, ca=False)

    def signed(self, text: str, key: ec.EllipticCurvePrivateKey | None = None) -> tuple[str, str]:
        """``text`` and its signature (hex r || s) by the TCB Signing key (or ``key``)."""
        return text, _raw_signature(key or self.signing_key, text.encode()).hex()

    crl = staticmethod(_crl)

    def root_crl(self, *revoked: x509.Certificate) -> str:
        """The root CA's CRL as dcap-qvl carries it: hex DER."""
        return self.crl(self.root, self.root_key, revoked).public_bytes(Encoding.DER).hex()

    def pck_crl(self, *revoked: x509.Certificate) -> str:
        return self.crl(self.platform, self.platform_key, revoked).public_bytes(Encoding.DER).hex()

    def collateral(self) -> dict[str, Any]:
        """Every member, each well formed: ``check_authenticity`` passes it."""
        tcb, tcb_sig = self.signed(_document(id="TDX", fmspc="00906ED50000"))
        qe, qe_sig = self.signed(_document(id="TD_QE"))
        chain = _pem(self.signing, self.root)
        return {
            "tcb_info": tcb,
            "tcb_info_signature": tcb_sig,
            "tcb_info_issuer_chain": chain,
            "qe_identity": qe,
            "qe_identity_signature": qe_sig,
            "qe_identity_issuer_chain": chain,
            "root_ca_crl": self.root_crl(),
            "pck_crl": self.pck_crl(),
            "pck_crl_issuer_chain": _pem(self.platform, self.root),
        }


class Collateral(_CollateralChecks):
    """The collateral checks as ``attestation.tdx``'s verifier runs them, with the double's
    root as the anchor and its PCK chain as the quote's (``pck``: none, or not pinned)."""

    def __init__(self, pki: FakeIntel, *, pck: str = "pinned", now: datetime = NOW) -> None:
        self.now = now
        self.anchor = _Anchor(spki_sha256(pki.root), "the double's root", pki.root)
        self.verdict = Verdict("tdx")
        self.root = None
        self.pck_chain = None
        self.pck_leaf = None
        self.signers_seen = []
        if pck != "none":
            # "unpinned": the quote's chain ends at the double's root, trusted under another pin
            anchor = self.anchor if pck == "pinned" else _Anchor("00" * 32, "another root", None)
            self.pck_chain = _build_chain(pki.pck, [pki.pck, pki.platform, pki.root], anchor)
            self.pck_leaf = pki.pck
            if self.pck_chain.pinned:
                self.root = self.pck_chain.path[-1]
        self.window: list[tuple[datetime, datetime, str]] = []

    def add(self, name: str, ok: bool | None, detail: str) -> None:
        self.verdict.add(name, ok, detail)

    def run(self, members: dict[str, Any]) -> dict[str, Check]:
        self.check_authenticity(members, self.window)
        checks = {c.name: c for c in self.verdict.checks}
        assert list(checks) == list(AUTHENTICITY)
        return checks


def _checks(members: dict[str, Any], pki: FakeIntel, **kwargs: Any) -> dict[str, Check]:
    return Collateral(pki, **kwargs).run(members)


def _held(checks: dict[str, Check], *failed: str, skipped: tuple[str, ...] = ()) -> None:
    """Exactly the ``failed`` checks fail (``ok`` False) and the ``skipped`` ones were not
    made (``ok`` None); every other one holds."""
    assert {n for n, c in checks.items() if c.ok is not True} == {*failed, *skipped}, {
        n: c.detail for n, c in checks.items() if c.ok is not True
    }
    assert all(checks[n].ok is False for n in failed)
    assert all(checks[n].ok is None for n in skipped)


@pytest.fixture(scope="module")
def pki() -> FakeIntel:
    return FakeIntel()


def _crl_ok(label: str, revoked: int = 0) -> str:
    return (
        f"{label}'s CRL ({revoked} revoked) is signed by {label} and current at {_iso(NOW)} "
        f"(next update {_iso(NEXT)})"
    )


# --------------------------------------------------------------------------- all well


def test_the_doubles_collateral_passes_each_check_saying_what_held(pki: FakeIntel) -> None:
    members = pki.collateral()
    run = Collateral(pki)
    checks = run.run(members)
    _held(checks)
    tcb_size = len(members["tcb_info"].encode())
    assert checks["collateral.tcb_info_signature"].detail == (
        f"ECDSA P-256/SHA-256 over the exact tcbInfo text ({tcb_size} bytes) verifies with "
        f"{SIGNING}'s key"
    )
    assert checks["collateral.qe_identity_signature"].detail.startswith(
        "ECDSA P-256/SHA-256 over the exact enclaveIdentity text ("
    )
    assert checks["collateral.tcb_info_chain"].detail == (
        f"{SIGNING} → {ROOT}: signed by the next, ending at the double's root, valid at {_iso(NOW)}"
    )
    assert checks["collateral.qe_identity_validity"].detail == (
        f"enclaveIdentity issued {_iso(ISSUED)}, next update {_iso(NEXT)}: current at {_iso(NOW)}"
    )
    assert checks["collateral.root_ca_crl"].detail == _crl_ok(ROOT)
    assert checks["collateral.pck_crl"].detail == _crl_ok(PLATFORM)
    assert checks["pck_chain.revocation"].detail == (
        f"not revoked: {PCK} in {PLATFORM}'s CRL, {PLATFORM} in the root CA's CRL, "
        f"{SIGNING} in the root CA's CRL"
    )
    assert run.signers_seen == [pki.signing, pki.signing]
    assert [w[:2] for w in run.window] == [(ISSUED, NEXT)] * 4


def test_without_a_pck_chain_the_collateral_chains_show_the_root(pki: FakeIntel) -> None:
    """No pinned PCK chain to take the root from: the TCB signer's chain shows it, and the
    root CA's CRL is checked against that root."""
    run = Collateral(pki, pck="none")
    checks = run.run(pki.collateral())
    _held(checks)
    assert run.root == pki.root
    assert checks["pck_chain.revocation"].detail == f"not revoked: {SIGNING} in the root CA's CRL"


def test_a_valid_window_includes_both_ends(pki: FakeIntel) -> None:
    for when in (ISSUED, NEXT):
        _held(_checks(pki.collateral(), pki, now=when))


# --------------------------------------------------------------------------- revocation


def _revoked(cert: x509.Certificate, cn: str) -> str:
    return f"{cn} (serial {cert.serial_number:x})"


def test_a_revoked_pck_certificate_rejects(pki: FakeIntel) -> None:
    members = pki.collateral()
    members["pck_crl"] = pki.pck_crl(pki.pck)
    checks = _checks(members, pki)
    _held(checks, "pck_chain.revocation")
    assert checks["collateral.pck_crl"].detail == _crl_ok(PLATFORM, revoked=1)
    assert checks["pck_chain.revocation"].detail == "revoked: " + _revoked(pki.pck, PCK)
    # the PCK CRL alone (no root CA CRL) still finds it
    del members["root_ca_crl"]
    checks = _checks(members, pki)
    assert checks["collateral.root_ca_crl"].ok is None
    assert checks["pck_chain.revocation"].ok is False
    assert checks["pck_chain.revocation"].detail == "revoked: " + _revoked(pki.pck, PCK)


def test_a_revoked_pck_platform_ca_rejects(pki: FakeIntel) -> None:
    members = pki.collateral()
    members["root_ca_crl"] = pki.root_crl(pki.platform)
    checks = _checks(members, pki)
    _held(checks, "pck_chain.revocation")
    assert checks["pck_chain.revocation"].detail == "revoked: " + _revoked(pki.platform, PLATFORM)


def test_a_revoked_tcb_signing_certificate_rejects(pki: FakeIntel) -> None:
    members = pki.collateral()
    members["root_ca_crl"] = pki.root_crl(pki.signing)
    checks = _checks(members, pki)
    _held(checks, "pck_chain.revocation")
    assert checks["pck_chain.revocation"].detail == "revoked: " + _revoked(pki.signing, SIGNING)


def test_every_revoked_certificate_is_named(pki: FakeIntel) -> None:
    members = pki.collateral()
    members["root_ca_crl"] = pki.root_crl(pki.platform, pki.signing)
    members["pck_crl"] = pki.pck_crl(pki.pck)
    checks = _checks(members, pki)
    assert checks["pck_chain.revocation"].detail == "revoked: " + ", ".join(
        [_revoked(pki.pck, PCK), _revoked(pki.platform, PLATFORM), _revoked(pki.signing, SIGNING)]
    )


def test_only_the_root_ca_crl_says_the_pck_certificate_was_not_checked(pki: FakeIntel) -> None:
    members = pki.collateral()
    del members["pck_crl"]
    checks = _checks(members, pki)
    _held(checks, skipped=("collateral.pck_crl",))
    assert checks["collateral.pck_crl"].detail == "the collateral has no pck_crl: not checked"
    assert checks["pck_chain.revocation"].detail == (
        f"not revoked: {PLATFORM} in the root CA's CRL, {SIGNING} in the root CA's CRL; "
        "the PCK certificate itself not checked (no PCK CRL)"
    )


def test_no_crl_at_all_leaves_revocation_not_checked(pki: FakeIntel) -> None:
    members = pki.collateral()
    del members["pck_crl"], members["root_ca_crl"]
    checks = _checks(members, pki)
    assert checks["collateral.root_ca_crl"].ok is None
    assert checks["collateral.root_ca_crl"].detail == (
        "the collateral has no root_ca_crl: not checked"
    )
    assert checks["pck_chain.revocation"].ok is None
    assert checks["pck_chain.revocation"].detail == "no usable CRL: revocation not checked"


def test_a_crl_that_fails_its_check_vouches_for_nothing(pki: FakeIntel) -> None:
    """A revocation listed in a CRL that is not authentic or not current is not believed,
    and the certificates it would have covered are not called checked either."""
    forger = _key()
    members = pki.collateral()
    forged = pki.crl(pki.root, forger, (pki.platform,))
    members["root_ca_crl"] = forged.public_bytes(Encoding.DER).hex()
    stale = pki.crl(pki.platform, pki.platform_key, (pki.pck,), (ISSUED, NOW - timedelta(1)))
    members["pck_crl"] = stale.public_bytes(Encoding.DER).hex()
    checks = _checks(members, pki)
    _held(checks, "collateral.root_ca_crl", "collateral.pck_crl", skipped=("pck_chain.revocation",))
    assert checks["collateral.root_ca_crl"].detail == (
        f"{ROOT}'s CRL: no trusted certificate named {ROOT} verifies its signature"
    )
    assert checks["collateral.pck_crl"].detail == (
        f"{PLATFORM}'s CRL: issued {_iso(ISSUED)}, next update {_iso(NOW - timedelta(1))}: "
        f"not current at {_iso(NOW)}"
    )
    assert checks["pck_chain.revocation"].ok is None
    # only one of them fails: the other one is still read
    members["pck_crl"] = pki.pck_crl(pki.pck)
    checks = _checks(members, pki)
    assert checks["pck_chain.revocation"].detail == "revoked: " + _revoked(pki.pck, PCK)
    members["root_ca_crl"], members["pck_crl"] = (
        pki.root_crl(pki.platform),
        stale.public_bytes(Encoding.DER),
    )
    checks = _checks(members, pki)
    assert checks["pck_chain.revocation"].detail == ("revoked: " + _revoked(pki.platform, PLATFORM))


# --------------------------------------------------------------------------- the CRLs themselves


@pytest.mark.parametrize("form", ["hex", "der", "pem text", "pem bytes"])
def test_a_crl_in_each_form_intel_publishes(pki: FakeIntel, form: str) -> None:
    crl = pki.crl(pki.root, pki.root_key)
    value: str | bytes = {
        "hex": crl.public_bytes(Encoding.DER).hex(),
        "der": crl.public_bytes(Encoding.DER),
        "pem text": crl.public_bytes(Encoding.PEM).decode(),
        "pem bytes": b"\n " + crl.public_bytes(Encoding.PEM),
    }[form]
    members = pki.collateral()
    members["root_ca_crl"] = value
    members["pck_crl"] = value if isinstance(value, bytes) else members["pck_crl"]
    checks = _checks(members, pki)
    assert checks["collateral.root_ca_crl"].detail == _crl_ok(ROOT)
    if isinstance(value, bytes):  # the root's CRL given as the PCK CA's
        assert checks["collateral.pck_crl"].detail == (
            f"{ROOT}'s CRL: it is {ROOT}'s, not {PLATFORM}'s, as this quote needs; "
            f"no trusted certificate named {ROOT} verifies its signature"
        )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("zz", "neither PEM nor hex DER"),
        (42, "a int, not a CRL"),
        (b"\x30\x03\x02\x01\x01", "does not parse as a CRL: "),
        ("-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n", "does not parse as a CRL: "),
    ],
)
def test_a_crl_that_does_not_parse_names_its_member(
    pki: FakeIntel, value: Any, problem: str
) -> None:
    for member in ("root_ca_crl", "pck_crl"):
        members = pki.collateral()
        members[member] = value
        checks = _checks(members, pki)
        check = checks[f"collateral.{member}"]
        assert check.ok is False
        assert check.detail.startswith(f"{member}: {problem}"), check.detail
        assert checks["pck_chain.revocation"].ok is True  # the other CRL is still read


def test_a_crl_without_next_update_is_not_current(pki: FakeIntel) -> None:
    crl = _crl_without_next_update(pki.root, pki.root_key)
    assert crl.next_update_utc is None
    members = pki.collateral()
    members["root_ca_crl"] = crl.public_bytes(Encoding.DER)
    checks = _checks(members, pki)
    assert checks["collateral.root_ca_crl"].ok is False
    assert checks["collateral.root_ca_crl"].detail == f"{ROOT}'s CRL: it has no nextUpdate"


def test_the_pck_cas_crl_is_not_the_root_cas(pki: FakeIntel) -> None:
    members = pki.collateral()
    members["root_ca_crl"] = members["pck_crl"]
    checks = _checks(members, pki)
    _held(checks, "collateral.root_ca_crl")
    assert checks["collateral.root_ca_crl"].detail == (
        f"{PLATFORM}'s CRL: it is {PLATFORM}'s, not {ROOT}'s, as this quote needs; "
        f"no trusted certificate named {PLATFORM} verifies its signature"
    )


def test_a_crl_whose_issuer_has_no_common_name_is_named_in_full(pki: FakeIntel) -> None:
    nameless = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Test double, not Intel")])
    members = pki.collateral()
    members["pck_crl"] = _crl(nameless, _key()).public_bytes(Encoding.DER)
    checks = _checks(members, pki)
    full = nameless.rfc4514_string()
    assert full == "O=Test double\\, not Intel"
    assert checks["collateral.pck_crl"].detail == (
        f"{full}'s CRL: it is {full}'s, not {PLATFORM}'s, as this quote needs; "
        f"no trusted certificate named {full} verifies its signature"
    )


def test_the_root_ca_crl_needs_a_trusted_root(pki: FakeIntel) -> None:
    """Collateral signed under another root: nothing shows the trusted root, so the root CA's
    CRL (signed by that other root) cannot be checked, and its chains fail on the pin."""
    other = FakeIntel()
    members = other.collateral()
    checks = _checks(members, pki, pck="none")
    pin = spki_sha256(other.root)
    expected_pin = spki_sha256(pki.root)
    assert checks["collateral.tcb_info_chain"].detail == (
        f"{SIGNING} → {ROOT}: the root {ROOT} (SPKI SHA-256 {pin}) is not the double's root "
        f"({expected_pin})"
    )
    assert checks["collateral.root_ca_crl"].ok is False
    assert checks["collateral.root_ca_crl"].detail == (
        f"{ROOT}'s CRL: no trusted {ROOT} certificate to check it with"
    )
    # nor is its PCK CA's CRL: its issuer chain does not end at the trusted root either
    assert checks["collateral.pck_crl"].detail == (
        f"{PLATFORM}'s CRL: no trusted {PLATFORM} certificate to check it with"
    )


def test_the_pck_crl_signer_from_its_issuer_chain(pki: FakeIntel) -> None:
    """The quote's PCK chain is not pinned: the PCK CA that signs the CRL comes only from
    ``pck_crl_issuer_chain``, in either order, and only if it chains to the trusted root."""
    for chain in (_pem(pki.platform, pki.root), _pem(pki.root, pki.platform)):
        members = pki.collateral()
        members["pck_crl_issuer_chain"] = chain
        checks = _checks(members, pki, pck="unpinned")
        assert checks["collateral.pck_crl"].detail == _crl_ok(PLATFORM)
    members = pki.collateral()
    del members["pck_crl_issuer_chain"]
    checks = _checks(members, pki)  # pinned: the quote's own PCK CA checks it
    assert checks["collateral.pck_crl"].detail == _crl_ok(PLATFORM)
    no_signer = f"{PLATFORM}'s CRL: no trusted {PLATFORM} certificate to check it with"
    for chain in (None, "not PEM", _pem(pki.root)):
        members = pki.collateral()
        if chain is None:
            del members["pck_crl_issuer_chain"]
        else:
            members["pck_crl_issuer_chain"] = chain
        checks = _checks(members, pki, pck="unpinned")
        assert checks["collateral.pck_crl"].ok is False
        assert checks["collateral.pck_crl"].detail == no_signer
    # a PCK CA of the same name, issued by the root, whose key did not sign the CRL
    impostor = _cert(PLATFORM, _key(), pki.root, pki.root_key, ca=True)
    members = pki.collateral()
    members["pck_crl_issuer_chain"] = _pem(impostor, pki.root)
    checks = _checks(members, pki, pck="unpinned")
    assert checks["collateral.pck_crl"].detail == (
        f"{PLATFORM}'s CRL: no trusted certificate named {PLATFORM} verifies its signature"
    )


def test_another_pck_cas_crl_is_not_this_quotes(pki: FakeIntel) -> None:
    processor_key = _key()
    processor = _cert("Intel SGX PCK Processor CA", processor_key, pki.root, pki.root_key, ca=True)
    members = pki.collateral()
    members["pck_crl"] = pki.crl(processor, processor_key).public_bytes(Encoding.DER)
    members["pck_crl_issuer_chain"] = _pem(processor, pki.root)
    checks = _checks(members, pki)
    assert checks["collateral.pck_crl"].detail == (
        "Intel SGX PCK Processor CA's CRL: it is Intel SGX PCK Processor CA's, not "
        f"{PLATFORM}'s, as this quote needs"
    )
    # with no PCK certificate to say which CA it needs, a pinned CA's CRL is checked as is
    checks = _checks(members, pki, pck="none")
    assert checks["collateral.pck_crl"].ok is True


# --------------------------------------------------------------------------- signatures and chains


def test_a_document_signed_by_another_key_fails_its_signature(pki: FakeIntel) -> None:
    members = pki.collateral()
    members["tcb_info"], members["tcb_info_signature"] = pki.signed(_document(), _key())
    checks = _checks(members, pki)
    _held(checks, "collateral.tcb_info_signature")
    size = len(members["tcb_info"].encode())
    assert checks["collateral.tcb_info_signature"].detail == (
        f"the signature over the exact tcbInfo text ({size} bytes) does not verify with "
        f"{SIGNING}'s key"
    )


def _signed_by(pki: FakeIntel, signer: x509.Certificate, key: Any, *chain: x509.Certificate):
    members = pki.collateral()
    members["tcb_info"], members["tcb_info_signature"] = pki.signed(_document(), key)
    members["tcb_info_issuer_chain"] = _pem(signer, *chain)
    return members


def test_a_signer_that_is_not_the_tcb_signing_certificate_fails_the_chain(pki: FakeIntel) -> None:
    key = _key()
    for cn, ca in (("Intel SGX TCB Signing 2", False), (SIGNING, True)):
        signer = _cert(cn, key, pki.root, pki.root_key, ca=ca)
        checks = _checks(_signed_by(pki, signer, key, pki.root), pki)
        _held(checks, "collateral.tcb_info_chain")
        assert checks["collateral.tcb_info_chain"].detail == (
            f"{cn} → {ROOT}: the signer {cn} is not the '{SIGNING}' certificate"
        )


def test_a_signer_not_issued_directly_by_the_root_fails_the_chain(pki: FakeIntel) -> None:
    ca_key, key = _key(), _key()
    ca = _cert("Intel SGX TCB CA", ca_key, pki.root, pki.root_key, ca=True)
    signer = _cert(SIGNING, key, ca, ca_key, ca=False)
    run = Collateral(pki, pck="none")
    checks = run.run(_signed_by(pki, signer, key, ca, pki.root))
    _held(checks, "collateral.tcb_info_chain")
    assert checks["collateral.tcb_info_chain"].detail == (
        f"{SIGNING} → Intel SGX TCB CA → {ROOT}: the signer is not issued directly by the root"
    )
    assert run.root == pki.root  # the top of the pinned chain, not the CA under it


def test_an_expired_signer_fails_the_chain(pki: FakeIntel) -> None:
    key = _key()
    until = datetime(2021, 1, 1, tzinfo=UTC)
    signer = _cert(SIGNING, key, pki.root, pki.root_key, ca=False, valid=(CERT_FROM, until))
    checks = _checks(_signed_by(pki, signer, key, pki.root), pki)
    _held(checks, "collateral.tcb_info_chain")
    assert checks["collateral.tcb_info_chain"].detail == (
        f"{SIGNING} → {ROOT}: not valid at {_iso(NOW)}: {SIGNING} (valid {_iso(CERT_FROM)} to "
        f"{_iso(until)})"
    )


def test_a_root_that_is_not_a_ca_fails_the_chain() -> None:
    """The pinned root itself is broken (no CA flag): the chain's own problem is reported
    even though it ends at the pin."""
    pki = FakeIntel()
    pki.root = _cert(ROOT, pki.root_key, None, pki.root_key, ca=None)
    pki.signing = _cert(SIGNING, pki.signing_key, pki.root, pki.root_key, ca=False)
    checks = _checks(pki.collateral(), pki, pck="none")
    assert checks["collateral.tcb_info_chain"].ok is False
    assert checks["collateral.tcb_info_chain"].detail == (
        f"{SIGNING} → {ROOT}: {ROOT} signs certificates but is not a CA (basicConstraints)"
    )


def test_every_chain_problem_is_named(pki: FakeIntel) -> None:
    other = FakeIntel()
    key = _key()
    signer = _cert("Intel SGX TCB Signing 2", key, other.root, other.root_key, ca=False)
    checks = _checks(_signed_by(pki, signer, key, other.root), pki)
    assert checks["collateral.tcb_info_chain"].detail == (
        f"Intel SGX TCB Signing 2 → {ROOT}: the root {ROOT} (SPKI SHA-256 "
        f"{spki_sha256(other.root)}) is not the double's root ({spki_sha256(pki.root)}); "
        f"the signer Intel SGX TCB Signing 2 is not the '{SIGNING}' certificate"
    )


# --------------------------------------------------------------------------- members


@pytest.mark.parametrize("name", ["tcb_info", "qe_identity"])
@pytest.mark.parametrize("suffix", ["", "_signature", "_issuer_chain"])
def test_a_missing_member_fails_all_three_checks_naming_it(
    pki: FakeIntel, name: str, suffix: str
) -> None:
    members = pki.collateral()
    del members[name + suffix]
    checks = _checks(members, pki)
    for check in ("signature", "chain", "validity"):
        assert checks[f"collateral.{name}_{check}"].ok is False
        assert checks[f"collateral.{name}_{check}"].detail == (
            f"the collateral has no {name}{suffix}"
        )
    _held(checks, *(f"collateral.{name}_{check}" for check in ("signature", "chain", "validity")))


@pytest.mark.parametrize(
    ("member", "value", "problem"),
    [
        ("tcb_info", 42, "tcb_info: a int, not text"),
        ("tcb_info", b"\xff\xfe{}", "tcb_info: not UTF-8 text"),
        (
            "tcb_info",
            {"version": 3},
            "tcb_info: parsed JSON, not the exact text Intel signed: pass the text as published",
        ),
        ("tcb_info_signature", "zz", "tcb_info_signature: not hex"),
        ("tcb_info_signature", 42, "tcb_info_signature: a int, not hex text or bytes"),
        ("tcb_info_signature", "ab" * 10, "tcb_info_signature: 10 bytes, not a 64-byte r || s"),
        (
            "tcb_info_signature",
            b"\xff" * 128,
            "tcb_info_signature: 128 bytes, not a 64-byte r || s",
        ),
        ("tcb_info_signature", b"z" * 128, "tcb_info_signature: 128 bytes, not a 64-byte r || s"),
        ("tcb_info_issuer_chain", 42, "tcb_info_issuer_chain: a int, not PEM"),
    ],
)
def test_a_member_of_the_wrong_kind_is_named(
    pki: FakeIntel, member: str, value: Any, problem: str
) -> None:
    members = pki.collateral()
    members[member] = value
    checks = _checks(members, pki)
    for check in ("signature", "chain", "validity"):
        assert checks[f"collateral.tcb_info_{check}"].ok is False
        assert checks[f"collateral.tcb_info_{check}"].detail == problem


def test_an_issuer_chain_that_does_not_parse_is_named(pki: FakeIntel) -> None:
    members = pki.collateral()
    members["qe_identity_issuer_chain"] = (
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    )
    checks = _checks(members, pki)
    assert checks["collateral.qe_identity_chain"].ok is False
    assert checks["collateral.qe_identity_chain"].detail.startswith(
        "qe_identity_issuer_chain: the certificates do not parse: "
    )


@pytest.mark.parametrize("form", ["bytes", "hex bytes"])
def test_a_signature_as_bytes(pki: FakeIntel, form: str) -> None:
    members = pki.collateral()
    raw = bytes.fromhex(members["tcb_info_signature"])
    members["tcb_info_signature"] = raw if form == "bytes" else raw.hex().encode()
    _held(_checks(members, pki))


@pytest.mark.parametrize("spacing", ["", "\n  "])
def test_intels_pcs_response_gives_the_exact_text_and_its_signature(
    pki: FakeIntel, spacing: str
) -> None:
    """The TCB info as Intel's PCS answers it: the signed text is the exact ``tcbInfo``
    substring, the signature the response's own."""
    members = pki.collateral()
    text, signature = members.pop("tcb_info"), members.pop("tcb_info_signature")
    s = spacing
    members["tcb_info"] = (
        f'{{{s}"tcbInfo"{s}:{s}{text}{s},{s}"signature"{s}:{s}"{signature}"{s}}}'
    ).encode()
    checks = _checks(members, pki)
    _held(checks)
    assert (
        f"exact tcbInfo text ({len(text)} bytes)" in checks["collateral.tcb_info_signature"].detail
    )
    # a response without its signature, the signature given beside it
    members["tcb_info"] = f'{{"tcbInfo":{text}}}'
    members["tcb_info_signature"] = signature
    _held(_checks(members, pki))
    del members["tcb_info_signature"]
    checks = _checks(members, pki)
    assert checks["collateral.tcb_info_signature"].detail == (
        "the collateral has no tcb_info_signature"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "tcb_info is not JSON: Expecting value: line 1 column 1 (char 0)"),
        ("[1]", "tcb_info is not a JSON object"),
        ('{"nextUpdate":"2025-07-01T00:00:00Z"}', "tcbInfo has no issueDate"),
        ('{"issueDate":"2025-06-01T00:00:00Z"}', "tcbInfo has no nextUpdate"),
        (_document().replace('"2025-06-01T00:00:00Z"', "5"), "tcbInfo.issueDate is not a str"),
        (
            _document().replace("2025-07-01T00:00:00Z", "soon"),
            "tcbInfo.nextUpdate 'soon' is not an RFC 3339 time",
        ),
        (
            _document().replace("2025-06-01T00:00:00Z", "2025-06-01T00:00:00"),
            "tcbInfo.issueDate '2025-06-01T00:00:00' has no time zone",
        ),
    ],
)
def test_a_signed_document_without_a_readable_window(
    pki: FakeIntel, text: str, problem: str
) -> None:
    members = pki.collateral()
    members["tcb_info"], members["tcb_info_signature"] = pki.signed(text)
    checks = _checks(members, pki)
    _held(checks, "collateral.tcb_info_validity")
    assert checks["collateral.tcb_info_validity"].detail == problem


def test_a_document_outside_its_window_is_not_current(pki: FakeIntel) -> None:
    members = pki.collateral()
    members["qe_identity"], members["qe_identity_signature"] = pki.signed(
        _document(NOW + timedelta(seconds=1), NEXT)
    )
    checks = _checks(members, pki)
    _held(checks, "collateral.qe_identity_validity")
    assert checks["collateral.qe_identity_validity"].detail == (
        f"enclaveIdentity issued {_iso(NOW + timedelta(seconds=1))}, next update {_iso(NEXT)}: "
        f"expired or not yet issued at {_iso(NOW)}"
    )


# --------------------------------------------------------------------------- readers


@pytest.mark.parametrize(
    ("text", "key", "found"),
    [
        ('{"a":1,"b":[2, 3]}', "b", "[2, 3]"),
        (' \t\r\n{ "a" : 1 ,\n  "b"\t:\t{"c": 2}\n}', "b", '{"c": 2}'),
        ('{"a" : 1}', "a", "1"),
        ('{"a"  :  "x"}', "a", '"x"'),
        ('{"a":1}', "b", None),
        ("", "a", None),
        ("   ", "a", None),
        ("{ ", "a", None),
        ("[1]", "a", None),
        ('X{"a": 1}', "a", None),
        ('{"a": 1', "b", None),  # cut short after a member
        ('{"a": 1 ', "b", None),
        ('{"a"', "a", None),  # cut short after a name
        ('{"a"=1}', "a", None),  # not a colon
        ('{1: 2, "a": 3}', "a", None),  # a name that is not a string
        ('{"a": [[[', "a", None),  # a value that does not end
    ],
)
def test_exact_member_reads_the_documents_own_text(text: str, key: str, found: str | None) -> None:
    assert _exact_member(text, key) == found


def test_collateral_that_is_not_an_object_is_named() -> None:
    for collateral, problem in (
        (b"[1, 2]", "collateral: not a JSON object"),
        ("{", "collateral: not JSON: "),
        (42, "collateral: a int, not a mapping or JSON"),
    ):
        with pytest.raises(ValueError) as caught:
            _collateral_members(collateral)  # type: ignore[arg-type]
        assert str(caught.value).startswith(problem), caught.value
        assert problem.endswith(" ") or str(caught.value) == problem
    assert _collateral_members('{"a": 1}') == {"a": 1}


def test_exact_member_past_the_decoders_depth() -> None:
    assert _exact_member('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "a") is None


def test_the_readers_name_the_member_and_what_is_wrong() -> None:
    doc = {"mrsigner": "zz", "short": "abcd", "svn": True, "n": 5}
    for call, problem in (
        (lambda: _hex(doc, "mrsigner", 2, "qe"), "qe.mrsigner is not hex"),
        (lambda: _hex(doc, "short", 4, "qe"), "qe.short is 2 bytes, not 4"),
        (lambda: _hex(doc, "absent", 4, "qe"), "qe has no absent"),
        (lambda: _hex(doc, "n", 4, "qe"), "qe.n is not a str"),
        (lambda: _get(doc, "svn", int, "tcb"), "tcb.svn is not a int"),
        (lambda: _get(doc, "n", list, "tcb"), "tcb.n is not a list"),
        (lambda: _when(doc, "absent", "qe"), "qe has no absent"),
        (lambda: _when(doc, "n", "qe"), "qe.n is not a str"),
    ):
        with pytest.raises(_Bad) as caught:
            call()
        assert str(caught.value) == problem
    assert _get(doc, "n", int, "tcb") == 5
    assert _hex(doc, "short", 2, "qe") == b"\xab\xcd"
    assert _when({"t": "2025-06-01T00:00:00Z"}, "t", "qe") == ISSUED


# --------------------------------------------------------------------------- a CRL with no nextUpdate


def _der(tag: int, body: bytes) -> bytes:
    n = len(body)
    size = (
        bytes([n])
        if n < 0x80
        else bytes([0x80 | ((n.bit_length() + 7) // 8)])
        + n.to_bytes((n.bit_length() + 7) // 8, "big")
    )
    return bytes([tag]) + size + body


def _der_items(data: bytes) -> list[bytes]:
    """The encoded items of a DER SEQUENCE's body, each whole (tag, length and value)."""
    items, i = [], 0
    while i < len(data):
        size, head = data[i + 1], 2
        if size & 0x80:
            width = size & 0x7F
            size, head = int.from_bytes(data[i + 2 : i + 2 + width], "big"), 2 + width
        items.append(data[i : i + head + size])
        i += head + size
    return items


def _crl_without_next_update(
    issuer: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateRevocationList:
    """``cryptography`` builds no CRL without a nextUpdate (RFC 5280 makes it optional): drop
    it from a built one's TBSCertList and sign that again."""
    built = _crl(issuer, key)
    outer = _der_items(built.public_bytes(Encoding.DER))[0]
    tbs, algorithm, _ = _der_items(outer[2:] if outer[1] < 0x80 else outer[2 + (outer[1] & 0x7F) :])
    body = tbs[2:] if tbs[1] < 0x80 else tbs[2 + (tbs[1] & 0x7F) :]
    version, sig_alg, name, this_update, next_update, *rest = _der_items(body)
    assert next_update[0] in (0x17, 0x18)  # UTCTime / GeneralizedTime
    tbs = _der(0x30, version + sig_alg + name + this_update + b"".join(rest))
    signature = key.sign(tbs, ec.ECDSA(hashes.SHA256()))
    der = _der(0x30, tbs + algorithm + _der(0x03, b"\x00" + signature))
    return x509.load_der_x509_crl(der)


# --------------------------------------------------------------------------- what the collateral says of the platform

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "attestation"
TDX01 = VECTORS / "intel-tdx" / "dcap-qvl"
DELETE = object()  # an edit that removes the member
GONE = object()  # a fact the edit takes away


@pytest.fixture(scope="module")
def tdx01() -> tuple[TdxQuote, PckExtension, dict[str, Any], dict[str, Any]]:
    """tdx-01's quote, its PCK's SGX extension, and its TCB info and QE identity, parsed."""
    if not TDX01.is_dir():
        reason = f"{TDX01} is absent: the public TDX vectors are needed for the TCB tests"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    quote = parse_tdx_quote((TDX01 / "tdx_quote").read_bytes())
    pem = quote.signature_data.qe_certification.pck_chain_pem
    assert pem is not None
    ext = parse_pck_extension(x509.load_pem_x509_certificates(pem)[0])
    members = json.loads((TDX01 / "tdx_quote_collateral.json").read_text())
    return quote, ext, json.loads(members["tcb_info"]), json.loads(members["qe_identity"])


class Tcb(_TcbChecks):
    """The TCB checks as ``attestation.tdx``'s verifier runs them, on tdx-01's quote."""

    def __init__(self, quote: TdxQuote, pck_ext: PckExtension | None) -> None:
        self.quote, self.pck_ext = quote, pck_ext
        self.facts: dict[str, Any] = {}
        self.verdict = Verdict("tdx")

    def add(self, name: str, ok: bool | None, detail: str) -> None:
        self.verdict.add(name, ok, detail)


def _edit(doc: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for step in parents:
        doc = doc[int(step)] if isinstance(doc, list) else doc[step]
    key: Any = int(last) if isinstance(doc, list) else last
    if value is DELETE:
        del doc[key]
    else:
        doc[key] = value


def _tcb_checks(
    tdx01: tuple[TdxQuote, PckExtension, dict[str, Any], dict[str, Any]],
    edits: dict[str, Any],
    *,
    tee_tcb_svn: bytes | None = None,
    authentic: bool = True,
    pck_ext: bool = True,
    tcb: dict[str, Any] | None = None,
    qe: dict[str, Any] | None = None,
) -> tuple[list[tuple[str, bool | None, str]], dict[str, Any]]:
    """Each check's (name, ok, detail) and the facts, for tdx-01 with ``edits`` made to its
    TCB info (``"tcb:path"``) and QE identity (``"qe:path"``); a path steps through objects
    and lists by dots."""
    quote, ext, tcb_doc, qe_doc = tdx01
    docs = {"tcb": copy.deepcopy(tcb_doc), "qe": copy.deepcopy(qe_doc)}
    for where, value in edits.items():
        which, path = where.split(":", 1)
        _edit(docs[which], path, value)
    if tee_tcb_svn is not None:
        quote = dataclasses.replace(
            quote, body=dataclasses.replace(quote.body, tee_tcb_svn=tee_tcb_svn)
        )
    run = Tcb(quote, ext if pck_ext else None)
    tcb_signed = _Signed("tcb_info", "tcbInfo", **{"doc": docs["tcb"], **(tcb or {})})
    tcb_signed.authentic = authentic
    qe_signed = _Signed("qe_identity", "enclaveIdentity", **{"doc": docs["qe"], **(qe or {})})
    run.check_tcb(tcb_signed, qe_signed)
    return [(c.name, c.ok, c.detail) for c in run.verdict.checks], run.facts


BASE_CHECKS = [
    (
        "qe_identity",
        True,
        "the QE matches Intel's TD_QE identity (MRSIGNER, ISVPRODID, MISCSELECT and ATTRIBUTES under their masks); ISVSVN 6: UpToDate (TCB date 2024-03-13T00:00:00Z)",
    ),
    (
        "tcb_info.platform",
        True,
        "TDX TCB info v3 for FMSPC b0c06f000000 and PCE-ID 0000: the PCK's own",
    ),
    (
        "tdx_module",
        True,
        "the TDX module matches TDX_01 (MRSIGNERSEAM, SEAMATTRIBUTES); ISVSVN 6: UpToDate",
    ),
    (
        "tcb_level",
        True,
        "TCB level UpToDate (TCB date 2024-03-13T00:00:00Z) matches the PCK's SGX components, PCESVN 11 and TEE_TCB_SVN; with the TDX module and QE: UpToDate; no advisories",
    ),
]
BASE_FACTS = {
    "qe_tcb_status": "UpToDate",
    "tcb_evaluation_data_number": 17,
    "tdx_module_identity": "TDX_01",
    "tdx_module_tcb_status": "UpToDate",
    "platform_tcb_status": "UpToDate",
    "tcb_status": "UpToDate",
    "advisory_ids": [],
    "tcb_date": "2024-03-13T00:00:00Z",
}
TCB_CASES = [
    (
        "qe id",
        {"qe:id": "TD_QE2"},
        {},
        {
            "qe_identity": (
                False,
                "enclaveIdentity.id is 'TD_QE2', not the TDX Quoting Enclave's 'TD_QE'",
            )
        },
        {"qe_tcb_status": GONE},
    ),
    (
        "qe no id",
        {"qe:id": DELETE},
        {},
        {"qe_identity": (False, "enclaveIdentity has no id")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe mrsigner",
        {"qe:mrsigner": "0000000000000000000000000000000000000000000000000000000000000000"},
        {},
        {
            "qe_identity": (
                False,
                "the QE report does not match the QE identity: MRSIGNER dc9e2a7c6f948f17474e34a7fc43ed030f7c1563f1babddf6340c82e0e54a8c5 is not 0000000000000000000000000000000000000000000000000000000000000000",
            )
        },
        {"qe_tcb_status": GONE},
    ),
    (
        "qe isvprodid",
        {"qe:isvprodid": 3},
        {},
        {
            "qe_identity": (
                False,
                "the QE report does not match the QE identity: ISVPRODID 2 is not 3",
            )
        },
        {"qe_tcb_status": GONE},
    ),
    (
        "qe miscselect",
        {"qe:miscselect": "FFFFFFFF"},
        {},
        {
            "qe_identity": (
                False,
                "the QE report does not match the QE identity: MISCSELECT 00000000 under mask ffffffff",
            )
        },
        {"qe_tcb_status": GONE},
    ),
    (
        "qe attributes",
        {"qe:attributes": "10000000000000000000000000000001"},
        {},
        {
            "qe_identity": (
                False,
                "the QE report does not match the QE identity: ATTRIBUTES 1500000000000000e700000000000000 under mask fbffffffffffffff0000000000000000 is not 10000000000000000000000000000000",
            )
        },
        {"qe_tcb_status": GONE},
    ),
    ("qe attributes masked", {"qe:attributes": "15000000000000000000000000000001"}, {}, {}, {}),
    (
        "qe two mismatches",
        {
            "qe:mrsigner": "0000000000000000000000000000000000000000000000000000000000000000",
            "qe:isvprodid": 3,
        },
        {},
        {
            "qe_identity": (
                False,
                "the QE report does not match the QE identity: MRSIGNER dc9e2a7c6f948f17474e34a7fc43ed030f7c1563f1babddf6340c82e0e54a8c5 is not 0000000000000000000000000000000000000000000000000000000000000000; ISVPRODID 2 is not 3",
            )
        },
        {"qe_tcb_status": GONE},
    ),
    (
        "qe miscselect not hex",
        {"qe:miscselect": "zzzzzzzz"},
        {},
        {"qe_identity": (False, "enclaveIdentity.miscselect is not hex")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe mrsigner not hex",
        {"qe:mrsigner": "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"},
        {},
        {"qe_identity": (False, "enclaveIdentity.mrsigner is not hex")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe no isvprodid",
        {"qe:isvprodid": DELETE},
        {},
        {"qe_identity": (False, "enclaveIdentity has no isvprodid")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe miscselectMask size",
        {"qe:miscselectMask": "FF"},
        {},
        {"qe_identity": (False, "enclaveIdentity.miscselectMask is 1 bytes, not 4")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe attributes size",
        {"qe:attributes": "11"},
        {},
        {"qe_identity": (False, "enclaveIdentity.attributes is 1 bytes, not 16")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe no attributesMask",
        {"qe:attributesMask": DELETE},
        {},
        {"qe_identity": (False, "enclaveIdentity has no attributesMask")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe no tcbLevels",
        {"qe:tcbLevels": DELETE},
        {},
        {"qe_identity": (False, "enclaveIdentity has no tcbLevels")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe level not object",
        {"qe:tcbLevels": [5]},
        {},
        {"qe_identity": (False, "enclaveIdentity.tcbLevels[0] is not an object")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe level no tcb",
        {"qe:tcbLevels.0.tcb": DELETE},
        {},
        {"qe_identity": (False, "enclaveIdentity.tcbLevels[0] has no tcb")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe level no isvsvn",
        {"qe:tcbLevels.0.tcb": {}},
        {},
        {"qe_identity": (False, "enclaveIdentity.tcbLevels[0].tcb has no isvsvn")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe below every level",
        {"qe:tcbLevels.0.tcb.isvsvn": 7},
        {},
        {"qe_identity": (False, "QE ISVSVN 6 is below every QE identity TCB level")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe revoked",
        {"qe:tcbLevels.0.tcbStatus": "Revoked"},
        {},
        {
            "qe_identity": (
                False,
                "the QE matches Intel's TD_QE identity (MRSIGNER, ISVPRODID, MISCSELECT and ATTRIBUTES under their masks); ISVSVN 6: Revoked (TCB date 2024-03-13T00:00:00Z)",
            )
        },
        {"qe_tcb_status": "Revoked"},
    ),
    (
        "qe unknown status",
        {"qe:tcbLevels.0.tcbStatus": "Fine"},
        {},
        {
            "qe_identity": (
                False,
                "enclaveIdentity.tcbLevels[0].tcbStatus 'Fine' is not one of Intel's statuses",
            )
        },
        {"qe_tcb_status": GONE},
    ),
    (
        "qe no status",
        {"qe:tcbLevels.0.tcbStatus": DELETE},
        {},
        {"qe_identity": (False, "enclaveIdentity.tcbLevels[0] has no tcbStatus")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe advisories not list",
        {"qe:tcbLevels.0.advisoryIDs": "INTEL-SA-1"},
        {},
        {
            "qe_identity": (
                False,
                "enclaveIdentity.tcbLevels[0].advisoryIDs is not a list of strings",
            )
        },
        {"qe_tcb_status": GONE},
    ),
    (
        "qe advisories not strings",
        {"qe:tcbLevels.0.advisoryIDs": [1]},
        {},
        {
            "qe_identity": (
                False,
                "enclaveIdentity.tcbLevels[0].advisoryIDs is not a list of strings",
            )
        },
        {"qe_tcb_status": GONE},
    ),
    (
        "qe no date",
        {"qe:tcbLevels.0.tcbDate": DELETE},
        {},
        {
            "qe_identity": (
                True,
                "the QE matches Intel's TD_QE identity (MRSIGNER, ISVPRODID, MISCSELECT and ATTRIBUTES under their masks); ISVSVN 6: UpToDate (TCB date ?)",
            )
        },
        {},
    ),
    (
        "advisories from every part",
        {
            "qe:tcbLevels.0.tcbStatus": "SWHardeningNeeded",
            "qe:tcbLevels.0.advisoryIDs": ["INTEL-SA-2", "INTEL-SA-1"],
            "tcb:tdxModuleIdentities.1.tcbLevels.0.tcbStatus": "OutOfDate",
            "tcb:tdxModuleIdentities.1.tcbLevels.0.advisoryIDs": ["INTEL-SA-3", "INTEL-SA-2"],
            "tcb:tcbLevels.0.advisoryIDs": ["INTEL-SA-1"],
            "tcb:tcbLevels.0.tcbStatus": "ConfigurationNeeded",
        },
        {},
        {
            "qe_identity": (
                True,
                "the QE matches Intel's TD_QE identity (MRSIGNER, ISVPRODID, MISCSELECT and ATTRIBUTES under their masks); ISVSVN 6: SWHardeningNeeded (TCB date 2024-03-13T00:00:00Z)",
            ),
            "tdx_module": (
                True,
                "the TDX module matches TDX_01 (MRSIGNERSEAM, SEAMATTRIBUTES); ISVSVN 6: OutOfDate",
            ),
            "tcb_level": (
                True,
                "TCB level ConfigurationNeeded (TCB date 2024-03-13T00:00:00Z) matches the PCK's SGX components, PCESVN 11 and TEE_TCB_SVN; with the TDX module and QE: OutOfDateConfigurationNeeded; advisories INTEL-SA-1, INTEL-SA-3, INTEL-SA-2",
            ),
        },
        {
            "qe_tcb_status": "SWHardeningNeeded",
            "tdx_module_tcb_status": "OutOfDate",
            "platform_tcb_status": "ConfigurationNeeded",
            "tcb_status": "OutOfDateConfigurationNeeded",
            "advisory_ids": ["INTEL-SA-1", "INTEL-SA-3", "INTEL-SA-2"],
        },
    ),
    (
        "only the qe needs something",
        {"qe:tcbLevels.0.tcbStatus": "ConfigurationNeeded"},
        {},
        {
            "qe_identity": (
                True,
                "the QE matches Intel's TD_QE identity (MRSIGNER, ISVPRODID, MISCSELECT and ATTRIBUTES under their masks); ISVSVN 6: ConfigurationNeeded (TCB date 2024-03-13T00:00:00Z)",
            ),
            "tcb_level": (
                True,
                "TCB level UpToDate (TCB date 2024-03-13T00:00:00Z) matches the PCK's SGX components, PCESVN 11 and TEE_TCB_SVN; with the TDX module and QE: ConfigurationNeeded; no advisories",
            ),
        },
        {"qe_tcb_status": "ConfigurationNeeded", "tcb_status": "ConfigurationNeeded"},
    ),
    (
        "not TDX",
        {"tcb:id": "SGX"},
        {},
        {
            "tcb_info.platform": (
                False,
                "tcbInfo is 'SGX' version 3, not TDX TCB info (version 3)",
            ),
            "tcb_level": (
                False,
                "not evaluated: this TCB info is not for this platform (see tcb_info.platform)",
            ),
        },
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "version 2",
        {"tcb:version": 2},
        {},
        {
            "tcb_info.platform": (
                False,
                "tcbInfo is 'TDX' version 2, not TDX TCB info (version 3)",
            ),
            "tcb_level": (
                False,
                "not evaluated: this TCB info is not for this platform (see tcb_info.platform)",
            ),
        },
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "version text",
        {"tcb:version": "3"},
        {},
        {
            "tcb_info.platform": (False, "tcbInfo.version is not a int"),
            "tcb_level": (
                False,
                "not evaluated: this TCB info is not for this platform (see tcb_info.platform)",
            ),
        },
        {
            "tcb_evaluation_data_number": GONE,
            "platform_tcb_status": GONE,
            "tcb_status": GONE,
            "advisory_ids": GONE,
            "tcb_date": GONE,
        },
    ),
    (
        "other fmspc",
        {"tcb:fmspc": "90C06F000000"},
        {},
        {
            "tcb_info.platform": (False, "its FMSPC 90c06f000000 is not the PCK's b0c06f000000"),
            "tcb_level": (
                False,
                "not evaluated: this TCB info is not for this platform (see tcb_info.platform)",
            ),
        },
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "other pceid and fmspc",
        {"tcb:fmspc": "90C06F000000", "tcb:pceId": "0100"},
        {},
        {
            "tcb_info.platform": (
                False,
                "its FMSPC 90c06f000000 is not the PCK's b0c06f000000; its PCE-ID 0100 is not the PCK's 0000",
            ),
            "tcb_level": (
                False,
                "not evaluated: this TCB info is not for this platform (see tcb_info.platform)",
            ),
        },
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "no fmspc",
        {"tcb:fmspc": DELETE},
        {},
        {
            "tcb_info.platform": (False, "tcbInfo has no fmspc"),
            "tcb_level": (
                False,
                "not evaluated: this TCB info is not for this platform (see tcb_info.platform)",
            ),
        },
        {
            "tcb_evaluation_data_number": GONE,
            "platform_tcb_status": GONE,
            "tcb_status": GONE,
            "advisory_ids": GONE,
            "tcb_date": GONE,
        },
    ),
    (
        "pceid size",
        {"tcb:pceId": "00"},
        {},
        {
            "tcb_info.platform": (False, "tcbInfo.pceId is 1 bytes, not 2"),
            "tcb_level": (
                False,
                "not evaluated: this TCB info is not for this platform (see tcb_info.platform)",
            ),
        },
        {
            "tcb_evaluation_data_number": GONE,
            "platform_tcb_status": GONE,
            "tcb_status": GONE,
            "advisory_ids": GONE,
            "tcb_date": GONE,
        },
    ),
    (
        "no id",
        {"tcb:id": DELETE},
        {},
        {
            "tcb_info.platform": (False, "tcbInfo has no id"),
            "tcb_level": (
                False,
                "not evaluated: this TCB info is not for this platform (see tcb_info.platform)",
            ),
        },
        {
            "tcb_evaluation_data_number": GONE,
            "platform_tcb_status": GONE,
            "tcb_status": GONE,
            "advisory_ids": GONE,
            "tcb_date": GONE,
        },
    ),
    (
        "no evaluation number",
        {"tcb:tcbEvaluationDataNumber": DELETE},
        {},
        {},
        {"tcb_evaluation_data_number": None},
    ),
    (
        "no pck extension",
        {},
        {"pck_ext": False},
        {
            "tcb_info.platform": (False, "no PCK SGX extension to compare with"),
            "tcb_level": (False, "no PCK SGX extension"),
        },
        {
            "tcb_evaluation_data_number": GONE,
            "platform_tcb_status": GONE,
            "tcb_status": GONE,
            "advisory_ids": GONE,
            "tcb_date": GONE,
        },
    ),
    (
        "no tdxModule",
        {"tcb:tdxModule": DELETE},
        {},
        {"tdx_module": (False, "tcbInfo has no tdxModule")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "module mrsigner not hex",
        {
            "tcb:tdxModule.mrsigner": "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"
        },
        {},
        {"tdx_module": (False, "tcbInfo.tdxModule.mrsigner is not hex")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "module attributes size",
        {"tcb:tdxModule.attributes": "00"},
        {},
        {"tdx_module": (False, "tcbInfo.tdxModule.attributes is 1 bytes, not 8")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "module no attributesMask",
        {"tcb:tdxModule.attributesMask": DELETE},
        {},
        {"tdx_module": (False, "tcbInfo.tdxModule has no attributesMask")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "identities not a list",
        {"tcb:tdxModuleIdentities": {"id": "TDX_01"}},
        {},
        {"tdx_module": (False, "tcbInfo.tdxModuleIdentities is not a list")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "no identity TDX_01",
        {"tcb:tdxModuleIdentities.1.id": "TDX_02"},
        {},
        {"tdx_module": (False, "tcbInfo lists no TDX module identity TDX_01")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    ("identity in lower case", {"tcb:tdxModuleIdentities.1.id": "tdx_01"}, {}, {}, {}),
    (
        "identity without id",
        {"tcb:tdxModuleIdentities.1.id": DELETE},
        {},
        {"tdx_module": (False, "tcbInfo lists no TDX module identity TDX_01")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    ("identity not an object", {"tcb:tdxModuleIdentities.0": "TDX_01"}, {}, {}, {}),
    (
        "identity mrsigner",
        {
            "tcb:tdxModuleIdentities.1.mrsigner": "111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111"
        },
        {},
        {
            "tdx_module": (
                False,
                "MRSIGNERSEAM 000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000 is not 111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111",
            )
        },
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "identity attributes",
        {"tcb:tdxModuleIdentities.1.attributes": "0100000000000000"},
        {},
        {
            "tdx_module": (
                False,
                "SEAMATTRIBUTES 0000000000000000 under mask ffffffffffffffff are not 0100000000000000",
            )
        },
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "identity attributes masked off",
        {
            "tcb:tdxModuleIdentities.1.attributes": "0100000000000000",
            "tcb:tdxModuleIdentities.1.attributesMask": "FEFFFFFFFFFFFFFF",
        },
        {},
        {},
        {},
    ),
    (
        "identity both",
        {
            "tcb:tdxModuleIdentities.1.mrsigner": "111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111",
            "tcb:tdxModuleIdentities.1.attributes": "0100000000000000",
        },
        {},
        {
            "tdx_module": (
                False,
                "MRSIGNERSEAM 000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000 is not 111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111; SEAMATTRIBUTES 0000000000000000 under mask ffffffffffffffff are not 0100000000000000",
            )
        },
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "identity no mrsigner",
        {"tcb:tdxModuleIdentities.1.mrsigner": DELETE},
        {},
        {"tdx_module": (False, "tcbInfo.tdxModuleIdentities[TDX_01] has no mrsigner")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "identity attributes not hex",
        {"tcb:tdxModuleIdentities.1.attributes": "zzzzzzzzzzzzzzzz"},
        {},
        {"tdx_module": (False, "tcbInfo.tdxModuleIdentities[TDX_01].attributes is not hex")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "identity attributesMask size",
        {"tcb:tdxModuleIdentities.1.attributesMask": "FF"},
        {},
        {
            "tdx_module": (
                False,
                "tcbInfo.tdxModuleIdentities[TDX_01].attributesMask is 1 bytes, not 8",
            )
        },
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "identity no tcbLevels",
        {"tcb:tdxModuleIdentities.1.tcbLevels": DELETE},
        {},
        {"tdx_module": (False, "tcbInfo.tdxModuleIdentities[TDX_01] has no tcbLevels")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "identity level not object",
        {"tcb:tdxModuleIdentities.1.tcbLevels": [1]},
        {},
        {
            "tdx_module": (
                False,
                "tcbInfo.tdxModuleIdentities[TDX_01].tcbLevels[0] is not an object",
            )
        },
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "identity level no tcb",
        {"tcb:tdxModuleIdentities.1.tcbLevels.0.tcb": DELETE},
        {},
        {"tdx_module": (False, "tcbInfo.tdxModuleIdentities[TDX_01].tcbLevels[0] has no tcb")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "identity level no isvsvn",
        {"tcb:tdxModuleIdentities.1.tcbLevels.0.tcb": {}},
        {},
        {
            "tdx_module": (
                False,
                "tcbInfo.tdxModuleIdentities[TDX_01].tcbLevels[0].tcb has no isvsvn",
            )
        },
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "module below its first level",
        {"tcb:tdxModuleIdentities.1.tcbLevels.0.tcb.isvsvn": 7},
        {},
        {
            "tdx_module": (
                True,
                "the TDX module matches TDX_01 (MRSIGNERSEAM, SEAMATTRIBUTES); ISVSVN 6: OutOfDate",
            ),
            "tcb_level": (
                True,
                "TCB level UpToDate (TCB date 2024-03-13T00:00:00Z) matches the PCK's SGX components, PCESVN 11 and TEE_TCB_SVN; with the TDX module and QE: OutOfDate; no advisories",
            ),
        },
        {"tdx_module_tcb_status": "OutOfDate", "tcb_status": "OutOfDate"},
    ),
    (
        "module below every level",
        {
            "tcb:tdxModuleIdentities.1.tcbLevels.0.tcb.isvsvn": 7,
            "tcb:tdxModuleIdentities.1.tcbLevels.1.tcb.isvsvn": 7,
        },
        {},
        {"tdx_module": (False, "module ISVSVN 6 is below every TDX_01 TCB level")},
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    ("module at its level", {"tcb:tdxModuleIdentities.1.tcbLevels.0.tcb.isvsvn": 6}, {}, {}, {}),
    (
        "module revoked",
        {"tcb:tdxModuleIdentities.1.tcbLevels.0.tcbStatus": "Revoked"},
        {},
        {
            "tdx_module": (
                False,
                "the TDX module matches TDX_01 (MRSIGNERSEAM, SEAMATTRIBUTES); ISVSVN 6: Revoked",
            )
        },
        {"tdx_module_tcb_status": "Revoked"},
    ),
    (
        "module status unknown",
        {"tcb:tdxModuleIdentities.1.tcbLevels.0.tcbStatus": "Fine"},
        {},
        {
            "tdx_module": (
                False,
                "tcbInfo.tdxModuleIdentities[TDX_01].tcbLevels[0].tcbStatus 'Fine' is not one of Intel's statuses",
            )
        },
        {"tdx_module_identity": GONE, "tdx_module_tcb_status": GONE},
    ),
    (
        "no identities",
        {"tcb:tdxModuleIdentities": []},
        {},
        {
            "tdx_module": (
                True,
                "MRSIGNERSEAM and SEAMATTRIBUTES match tcbInfo.tdxModule (module version 1: no module identity TCB levels to apply)",
            )
        },
        {"tdx_module_identity": None, "tdx_module_tcb_status": GONE},
    ),
    (
        "no tcbLevels",
        {"tcb:tcbLevels": DELETE},
        {},
        {"tcb_level": (False, "tcbInfo has no tcbLevels")},
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "no TCB level at all",
        {"tcb:tcbLevels": []},
        {},
        {
            "tcb_level": (
                False,
                "no TCB level matches (TCB not supported): the PCK's SGX components [3, 3, 2, 2, 4, 1, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0], PCESVN 11, TEE_TCB_SVN 06010300000000000000000000000000; tcbInfo lists no TCB level",
            )
        },
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "level not object",
        {"tcb:tcbLevels": ["UpToDate"]},
        {},
        {"tcb_level": (False, "tcbInfo.tcbLevels[0] is not an object")},
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "level no tcb",
        {"tcb:tcbLevels.0.tcb": DELETE},
        {},
        {"tcb_level": (False, "tcbInfo.tcbLevels[0] has no tcb")},
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "level 15 components",
        {"tcb:tcbLevels.0.tcb.sgxtcbcomponents.15": DELETE},
        {},
        {
            "tcb_level": (
                False,
                "tcbInfo.tcbLevels[0].tcb.sgxtcbcomponents has 15 components, not 16",
            )
        },
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "level component not object",
        {"tcb:tcbLevels.0.tcb.tdxtcbcomponents.3": 0},
        {},
        {"tcb_level": (False, "tcbInfo.tcbLevels[0].tcb.tdxtcbcomponents[3] is not an object")},
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "level component no svn",
        {"tcb:tcbLevels.0.tcb.sgxtcbcomponents.3": {}},
        {},
        {"tcb_level": (False, "tcbInfo.tcbLevels[0].tcb.sgxtcbcomponents[3] has no svn")},
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "level no pcesvn",
        {"tcb:tcbLevels.0.tcb.pcesvn": DELETE},
        {},
        {"tcb_level": (False, "tcbInfo.tcbLevels[0].tcb has no pcesvn")},
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "level no sgx components",
        {"tcb:tcbLevels.0.tcb.sgxtcbcomponents": DELETE},
        {},
        {"tcb_level": (False, "tcbInfo.tcbLevels[0].tcb has no sgxtcbcomponents")},
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "level tdx components not a list",
        {"tcb:tcbLevels.0.tcb.tdxtcbcomponents": {}},
        {},
        {"tcb_level": (False, "tcbInfo.tcbLevels[0].tcb.tdxtcbcomponents is not a list")},
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "level svn not a number",
        {"tcb:tcbLevels.0.tcb.sgxtcbcomponents.0.svn": "2"},
        {},
        {"tcb_level": (False, "tcbInfo.tcbLevels[0].tcb.sgxtcbcomponents[0].svn is not a int")},
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "level status unknown",
        {"tcb:tcbLevels.0.tcbStatus": "Fine"},
        {},
        {
            "tcb_level": (
                False,
                "tcbInfo.tcbLevels[0].tcbStatus 'Fine' is not one of Intel's statuses",
            )
        },
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "level no date",
        {"tcb:tcbLevels.0.tcbDate": DELETE},
        {},
        {
            "tcb_level": (
                True,
                "TCB level UpToDate (TCB date ?) matches the PCK's SGX components, PCESVN 11 and TEE_TCB_SVN; with the TDX module and QE: UpToDate; no advisories",
            )
        },
        {"tcb_date": "?"},
    ),
    (
        "level revoked",
        {"tcb:tcbLevels.0.tcbStatus": "Revoked"},
        {},
        {
            "tcb_level": (
                False,
                "TCB level Revoked (TCB date 2024-03-13T00:00:00Z) matches the PCK's SGX components, PCESVN 11 and TEE_TCB_SVN; with the TDX module and QE: Revoked; no advisories",
            )
        },
        {"platform_tcb_status": "Revoked", "tcb_status": "Revoked"},
    ),
    (
        "second level matches",
        {"tcb:tcbLevels.0.tcb.pcesvn": 12, "tcb:tcbLevels.0.tcb.sgxtcbcomponents.0.svn": 9},
        {},
        {
            "tcb_level": (
                True,
                "TCB level OutOfDate (TCB date 2018-01-04T00:00:00Z) matches the PCK's SGX components, PCESVN 11 and TEE_TCB_SVN; with the TDX module and QE: OutOfDate; advisories INTEL-SA-00106, INTEL-SA-00115, INTEL-SA-00135, INTEL-SA-00203, INTEL-SA-00220, INTEL-SA-00233, INTEL-SA-00270, INTEL-SA-00293, INTEL-SA-00320, INTEL-SA-00329, INTEL-SA-00381, INTEL-SA-00389, INTEL-SA-00477, INTEL-SA-00837",
            )
        },
        {
            "platform_tcb_status": "OutOfDate",
            "tcb_status": "OutOfDate",
            "advisory_ids": [
                "INTEL-SA-00106",
                "INTEL-SA-00115",
                "INTEL-SA-00135",
                "INTEL-SA-00203",
                "INTEL-SA-00220",
                "INTEL-SA-00233",
                "INTEL-SA-00270",
                "INTEL-SA-00293",
                "INTEL-SA-00320",
                "INTEL-SA-00329",
                "INTEL-SA-00381",
                "INTEL-SA-00389",
                "INTEL-SA-00477",
                "INTEL-SA-00837",
            ],
            "tcb_date": "2018-01-04T00:00:00Z",
        },
    ),
    (
        "no level matches",
        {
            "tcb:tcbLevels.0.tcb.pcesvn": 12,
            "tcb:tcbLevels.0.tcb.sgxtcbcomponents.0.svn": 9,
            "tcb:tcbLevels.1.tcb.pcesvn": 12,
            "tcb:tcbLevels.1.tcb.tdxtcbcomponents.2.svn": 9,
            "tcb:tcbLevels.1.tcb.tdxtcbcomponents.3.svn": 1,
        },
        {},
        {
            "tcb_level": (
                False,
                "no TCB level matches (TCB not supported): the PCK's SGX components [3, 3, 2, 2, 4, 1, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0], PCESVN 11, TEE_TCB_SVN 06010300000000000000000000000000; the lowest, level 1 (OutOfDate), needs pcesvn: 11 < 12, tdxtcbcomponents[2]: TEE_TCB_SVN 3 < 9, tdxtcbcomponents[3]: TEE_TCB_SVN 0 < 1",
            )
        },
        {"platform_tcb_status": GONE, "tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "the module's own svns are the identity's",
        {
            "tcb:tcbLevels.0.tcb.tdxtcbcomponents.0.svn": 99,
            "tcb:tcbLevels.0.tcb.tdxtcbcomponents.1.svn": 99,
        },
        {},
        {},
        {},
    ),
    (
        "not authenticated",
        {},
        {"authentic": False},
        {
            "tcb_level": (
                True,
                "TCB level UpToDate (TCB date 2024-03-13T00:00:00Z) matches the PCK's SGX components, PCESVN 11 and TEE_TCB_SVN; with the TDX module and QE: UpToDate; no advisories (from a tcbInfo that is not authenticated)",
            )
        },
        {"tcb_status": GONE, "advisory_ids": GONE, "tcb_date": GONE},
    ),
    (
        "qe not JSON",
        {},
        {"qe": {"doc": None, "parse_problem": "qe_identity is not JSON: x"}},
        {"qe_identity": (False, "qe_identity is not JSON: x")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe missing",
        {},
        {"qe": {"doc": None, "problem": "the collateral has no qe_identity"}},
        {"qe_identity": (False, "the collateral has no qe_identity")},
        {"qe_tcb_status": GONE},
    ),
    (
        "qe unreadable",
        {},
        {"qe": {"doc": None}},
        {"qe_identity": (False, "no QE identity")},
        {"qe_tcb_status": GONE},
    ),
    (
        "tcb not JSON",
        {},
        {"tcb": {"doc": None, "parse_problem": "tcb_info is not JSON: x"}},
        {
            "tcb_info.platform": (False, "tcb_info is not JSON: x"),
            "tdx_module": (False, "no readable tcbInfo"),
            "tcb_level": (False, "tcb_info is not JSON: x"),
        },
        {
            "tcb_evaluation_data_number": GONE,
            "tdx_module_identity": GONE,
            "tdx_module_tcb_status": GONE,
            "platform_tcb_status": GONE,
            "tcb_status": GONE,
            "advisory_ids": GONE,
            "tcb_date": GONE,
        },
    ),
    (
        "tcb missing",
        {},
        {"tcb": {"doc": None, "problem": "the collateral has no tcb_info"}},
        {
            "tcb_info.platform": (False, "the collateral has no tcb_info"),
            "tdx_module": (False, "no readable tcbInfo"),
            "tcb_level": (False, "the collateral has no tcb_info"),
        },
        {
            "tcb_evaluation_data_number": GONE,
            "tdx_module_identity": GONE,
            "tdx_module_tcb_status": GONE,
            "platform_tcb_status": GONE,
            "tcb_status": GONE,
            "advisory_ids": GONE,
            "tcb_date": GONE,
        },
    ),
    (
        "module version 0",
        {},
        {"tee_tcb_svn": b"\x05\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"},
        {
            "tdx_module": (
                True,
                "MRSIGNERSEAM and SEAMATTRIBUTES match tcbInfo.tdxModule (module version 0: no module identity TCB levels to apply)",
            )
        },
        {"tdx_module_identity": None, "tdx_module_tcb_status": GONE},
    ),
    (
        "module version 0 below a level",
        {
            "tcb:tcbLevels.0.tcb.tdxtcbcomponents.1.svn": 1,
            "tcb:tcbLevels.1.tcb.tdxtcbcomponents.0.svn": 6,
        },
        {"tee_tcb_svn": b"\x05\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"},
        {
            "tdx_module": (
                True,
                "MRSIGNERSEAM and SEAMATTRIBUTES match tcbInfo.tdxModule (module version 0: no module identity TCB levels to apply)",
            ),
            "tcb_level": (
                False,
                "no TCB level matches (TCB not supported): the PCK's SGX components [3, 3, 2, 2, 4, 1, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0], PCESVN 11, TEE_TCB_SVN 05000200000000000000000000000000; the lowest, level 1 (OutOfDate), needs tdxtcbcomponents[0]: TEE_TCB_SVN 5 < 6",
            ),
        },
        {
            "tdx_module_identity": None,
            "tdx_module_tcb_status": GONE,
            "platform_tcb_status": GONE,
            "tcb_status": GONE,
            "advisory_ids": GONE,
            "tcb_date": GONE,
        },
    ),
]


def test_tdx01s_own_collateral_says_up_to_date(
    tdx01: tuple[TdxQuote, PckExtension, dict[str, Any], dict[str, Any]],
) -> None:
    checks, facts = _tcb_checks(tdx01, {})
    assert checks == BASE_CHECKS
    assert facts == BASE_FACTS


@pytest.mark.parametrize(
    ("edits", "kwargs", "changed", "facts_changed"),
    [case[1:] for case in TCB_CASES],
    ids=[case[0] for case in TCB_CASES],
)
def test_each_tcb_finding_is_named(
    tdx01: tuple[TdxQuote, PckExtension, dict[str, Any], dict[str, Any]],
    edits: dict[str, Any],
    kwargs: dict[str, Any],
    changed: dict[str, tuple[bool, str]],
    facts_changed: dict[str, Any],
) -> None:
    """One thing changed in tdx-01's TCB info or QE identity: exactly the checks it touches
    change, each to the verdict and words given, and the facts with them."""
    checks, facts = _tcb_checks(tdx01, edits, **kwargs)
    assert checks == [(name, *changed.get(name, (ok, detail))) for name, ok, detail in BASE_CHECKS]
    expected = {**BASE_FACTS, **facts_changed}
    assert facts == {k: v for k, v in expected.items() if v is not GONE}


# --------------------------------------------------------------------------- through verify_tdx


def _check(verdict: Verdict, name: str) -> Check:
    return next(c for c in verdict.checks if c.name == name)


def test_verify_tdx_checks_the_doubles_collateral_under_its_root(
    tdx01: tuple[TdxQuote, PckExtension, dict[str, Any], dict[str, Any]], pki: FakeIntel
) -> None:
    """tdx-01's quote (Intel's chain) with the double's collateral and root: the collateral's
    own chains end at the given root even when they carry only the signer."""
    members = pki.collateral()
    members["tcb_info_issuer_chain"] = _pem(pki.signing)  # the root comes from trusted_root
    quote = (TDX01 / "tdx_quote").read_bytes()
    verdict = verify_tdx(quote, now=NOW, collateral=members, trusted_root=_pem(pki.root).encode())
    assert verdict.kind == "tdx" and verdict.json()["kind"] == "tdx"
    assert _check(verdict, "collateral.tcb_info_chain").detail == (
        f"{SIGNING} → {ROOT}: signed by the next, ending at the given trusted root {ROOT}, "
        f"valid at {_iso(NOW)}"
    )
    assert _check(verdict, "pck_chain.root_pinned").ok is False  # Intel's, not the double's


def test_verify_tdx_on_tdx01_names_what_it_checked(
    tdx01: tuple[TdxQuote, PckExtension, dict[str, Any], dict[str, Any]],
) -> None:
    quote, _ext, _tcb, _qe = tdx01
    raw = (TDX01 / "tdx_quote").read_bytes()
    when = datetime(2025, 7, 1, tzinfo=UTC)
    collateral = (TDX01 / "tdx_quote_collateral.json").read_bytes()
    verdict = verify_tdx(raw, now=when, collateral=collateral)
    assert verdict.accepted
    assert _check(verdict, "collateral.tcb_info_chain").detail.endswith(
        f"ending at the pinned Intel SGX Root CA, valid at {_iso(when)}"
    )
    assert _check(verdict, "quote_signature").detail == (
        "ECDSA P-256/SHA-256 over the header and TD body (632 bytes) verifies with the "
        "attestation key"
    )
    assert _check(verdict, "qe_vendor").detail == "the quote comes from Intel's Quoting Enclave"
    facts = verdict.facts
    body, qe = quote.body, quote.signature_data.qe_certification.qe_report
    assert facts["xfam"] == body.xfam.hex()
    assert facts["mrownerconfig"] == body.mrownerconfig.hex()
    assert facts["seam_attributes"] == body.seam_attributes.hex()
    assert facts["mrsignerseam"] == body.mrsignerseam.hex()
    assert facts["qe_isvprodid"] == qe.isv_prod_id == 2
    assert facts["qe_mrsigner"] == qe.mrsigner.hex()
    assert facts["qe_vendor_id"] == INTEL_QE_VENDOR_ID.hex()
    assert facts["trailing_bytes"] == 70
    assert facts["trailing_bytes_note"] == (
        "70 bytes after the signature data, outside every signature: ignored"
    )
    assert "tee_tcb_svn2" not in facts and "mrservicetd" not in facts
    quote_level = {
        "version": 4,
        "tee_type": "0x81",
        "body_type": 2,
        "qe_vendor_id": quote.header.qe_vendor_id.hex(),
        "tee_tcb_svn": body.tee_tcb_svn.hex(),
        "mrseam": body.mrseam.hex(),
        "mrsignerseam": body.mrsignerseam.hex(),
        "seam_attributes": body.seam_attributes.hex(),
        "td_attributes": body.td_attributes.hex(),
        "debug": False,
        "xfam": body.xfam.hex(),
        "mrtd": body.mrtd.hex(),
        "mrconfigid": body.mrconfigid.hex(),
        "mrowner": body.mrowner.hex(),
        "mrownerconfig": body.mrownerconfig.hex(),
        **{f"rtmr{i}": rtmr.hex() for i, rtmr in enumerate(body.rtmrs)},
        "report_data": body.report_data.hex(),
        "qe_isvsvn": qe.isv_svn,
        "qe_isvprodid": qe.isv_prod_id,
        "qe_mrsigner": qe.mrsigner.hex(),
    }
    assert {k: facts[k] for k in quote_level} == quote_level
    assert facts["sgx_type"] == _ext.sgx_type is not None
    # without collateral, the facts that only collateral gives are still there, empty
    bare = verify_tdx(raw, now=when).facts
    assert bare["tcb_status"] is None and bare["advisory_ids"] == []
    assert set(bare) == {
        *quote_level,
        "tcb_status",
        "advisory_ids",
        "trailing_bytes",
        "trailing_bytes_note",
        "pck_chain",
        "pck_validity",
        "fmspc",
        "pceid",
        "pcesvn",
        "pck_cpusvn_components",
        "sgx_type",
    }
    assert set(facts) == {
        *bare,
        "collateral_valid_from",
        "collateral_valid_until",
        "platform_tcb_status",
        "qe_tcb_status",
        "tcb_date",
        "tcb_evaluation_data_number",
        "tdx_module_identity",
        "tdx_module_tcb_status",
    }


def test_verify_tdx_names_a_broken_quote_signature(
    tdx01: tuple[TdxQuote, PckExtension, dict[str, Any], dict[str, Any]],
) -> None:
    raw = bytearray((TDX01 / "tdx_quote").read_bytes())
    when = datetime(2025, 7, 1, tzinfo=UTC)
    flipped = bytearray(raw)
    flipped[12] ^= 0x01  # the QE vendor id, inside the signed header
    verdict = verify_tdx(bytes(flipped), now=when)
    assert _check(verdict, "quote_signature").detail == (
        "the ECDSA P-256/SHA-256 signature over the header and TD body (632 bytes) does not "
        "verify with the attestation key"
    )
    vendor = _check(verdict, "qe_vendor")
    assert vendor.ok is False
    assert vendor.detail == (
        f"QE vendor id {bytes(flipped[12:28]).hex()} is not Intel's {INTEL_QE_VENDOR_ID.hex()}"
    )
    off_curve = bytearray(raw)
    key_at = 632 + 4 + 64
    off_curve[key_at : key_at + 64] = bytes(64)  # (0, 0) is no point on P-256
    verdict = verify_tdx(bytes(off_curve), now=when)
    assert _check(verdict, "quote_signature").ok is False
    assert _check(verdict, "quote_signature").detail == (
        "the attestation key is not a point on P-256"
    )


def test_verify_tdx_reads_a_v5_bodys_extra_fields() -> None:
    path = VECTORS / "intel-tdx" / "dcap-qvl" / "tdx_quote_outdated"
    if not path.is_file():
        print(f"SKIP: {path} is absent")
        pytest.skip(f"{path} is absent")
    raw = path.read_bytes()
    body = parse_tdx_quote(raw).body
    assert body.tee_tcb_svn2 is not None and body.mrservicetd is not None
    facts = verify_tdx(raw, now=datetime(2026, 3, 1, tzinfo=UTC)).facts
    assert facts["tee_tcb_svn2"] == body.tee_tcb_svn2.hex()
    assert facts["mrservicetd"] == body.mrservicetd.hex()


#: where tdx-01's QE certification data (type, size, then the PCK chain's PEM) starts
_INNER_AT = 632 + 4 + 64 + 64 + 2 + 4 + 384 + 64 + 2 + 32


@pytest.mark.parametrize(
    ("patch", "problem"),
    [
        (
            (_INNER_AT, b"\x03\x00"),
            "QE certification data type 3: the quote carries no PCK chain (type 5); fetch the "
            "PCK certificate from Intel",
        ),
        ((_INNER_AT + 6 + 28, b"!!!!"), "the PCK chain does not parse: "),
    ],
)
def test_a_quote_without_a_usable_pck_chain_says_so(
    tdx01: tuple[TdxQuote, PckExtension, dict[str, Any], dict[str, Any]],
    patch: tuple[int, bytes],
    problem: str,
) -> None:
    """Outside the signed header and body: the quote signature still holds, and every check
    that needs the PCK certificate says it has none."""
    raw = bytearray((TDX01 / "tdx_quote").read_bytes())
    at, new = patch
    raw[at : at + len(new)] = new
    collateral = (TDX01 / "tdx_quote_collateral.json").read_bytes()
    verdict = verify_tdx(bytes(raw), now=datetime(2025, 7, 1, tzinfo=UTC), collateral=collateral)
    checks = {c.name: c for c in verdict.checks}
    # the collateral's own chains show the pinned root: its CRL is still checked
    assert checks["collateral.root_ca_crl"].ok is True
    assert checks["collateral.pck_crl"].ok is True  # its issuer chain gives its CA
    assert checks["quote_signature"].ok is True
    assert checks["pck_chain"].ok is False
    assert checks["pck_chain"].detail.startswith(problem), checks["pck_chain"].detail
    assert problem.endswith(" ") or checks["pck_chain"].detail == problem
    assert (checks["pck_chain.root_pinned"].ok, checks["pck_chain.root_pinned"].detail) == (
        False,
        "no PCK chain",
    )
    assert (checks["pck_chain.validity"].ok, checks["pck_chain.validity"].detail) == (
        None,
        "no PCK chain",
    )
    assert (checks["qe_report_signature"].ok, checks["qe_report_signature"].detail) == (
        False,
        "no PCK certificate to check the QE report with",
    )
    assert [c.name for c in verdict.checks][:7] == [
        "quote_signature",
        "qe_report_signature",
        "qe_report_binding",
        "pck_chain",
        "pck_chain.root_pinned",
        "pck_chain.validity",
        "qe_vendor",
    ]
    assert "fmspc" not in verdict.facts and "pck_chain" not in verdict.facts


# --------------------------------------------------------------------------- a quote under the double


def _le(value: int, size: int) -> bytes:
    return value.to_bytes(size, "little")


def _requoted(
    raw: bytes,
    chain: tuple[x509.Certificate, ...],
    pck_key: ec.EllipticCurvePrivateKey,
    report_data: bytes | None = None,
) -> bytes:
    """tdx-01's quote with ``chain`` as its PCK chain and its QE report (``report_data``
    replaced, if given) signed again by ``pck_key``, as a Quoting Enclave on a platform under
    the double's PKI would have signed it. The header and TD body, the attestation key and its
    signature are tdx-01's own."""
    quote = parse_tdx_quote(raw)
    sd, qc = quote.signature_data, quote.signature_data.qe_certification
    report = qc.qe_report.raw
    if report_data is not None:
        report = report[:320] + report_data
    pem = _pem(*chain).encode()
    auth = qc.qe_auth_data
    certification = (
        report
        + _raw_signature(pck_key, report)
        + _le(len(auth), 2)
        + auth
        + _le(5, 2)
        + _le(len(pem), 4)
        + pem
    )
    signature_data = (
        sd.signature + sd.attestation_key + _le(6, 2) + _le(len(certification), 4) + certification
    )
    return quote.signed_bytes + _le(len(signature_data), 4) + signature_data


def _pck(
    pki: FakeIntel,
    sgx: x509.Extension[x509.ExtensionType] | None,
    *,
    cn: str = PCK,
    ca: bool = False,
    key: ec.EllipticCurvePrivateKey | None = None,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
    valid: tuple[datetime, datetime] = (CERT_FROM, CERT_UNTIL),
) -> x509.Certificate:
    """A PCK certificate from the double's Platform CA (or ``issuer``), carrying tdx-01's
    SGX extension (its FMSPC, PCE-ID and SVNs) when ``sgx`` is given."""
    signer, signer_key = issuer or (pki.platform, pki.platform_key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(signer.subject)
        .public_key((key or pki.pck_key).public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), True)
    )
    if sgx is not None:
        builder = builder.add_extension(sgx.value, sgx.critical)
    return builder.sign(signer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def sgx_extension(
    tdx01: tuple[TdxQuote, PckExtension, dict[str, Any], dict[str, Any]],
) -> x509.Extension[x509.ExtensionType]:
    pem = tdx01[0].signature_data.qe_certification.pck_chain_pem
    assert pem is not None
    leaf = x509.load_pem_x509_certificates(pem)[0]
    return leaf.extensions.get_extension_for_oid(SGX_EXTENSION_OID)


WHEN = datetime(2025, 6, 25, tzinfo=UTC)  # inside tdx-01's TCB info and QE identity windows


def _intels_texts_signed_by(pki: FakeIntel) -> dict[str, Any]:
    """The double's collateral, carrying tdx-01's own TCB info and QE identity texts signed
    again with the double's TCB Signing key."""
    members = pki.collateral()
    real = json.loads((TDX01 / "tdx_quote_collateral.json").read_text())
    for name in ("tcb_info", "qe_identity"):
        members[name], members[f"{name}_signature"] = pki.signed(real[name])
    return members


def _verify_under(pki: FakeIntel, quote: bytes, members: dict[str, Any] | None = None) -> Verdict:
    return verify_tdx(
        quote,
        now=WHEN,
        collateral=_intels_texts_signed_by(pki) if members is None else members,
        trusted_root=pki.root.public_bytes(Encoding.DER),
    )


def test_a_quote_under_the_double_is_accepted_end_to_end(
    pki: FakeIntel, sgx_extension: x509.Extension[x509.ExtensionType]
) -> None:
    raw = (TDX01 / "tdx_quote").read_bytes()
    pck = _pck(pki, sgx_extension)
    quote = _requoted(raw, (pck, pki.platform, pki.root), pki.pck_key)
    verdict = _verify_under(pki, quote)
    assert verdict.accepted, [c.line() for c in verdict.checks if c.ok is not True]
    checks = {c.name: c for c in verdict.checks}
    assert all(c.ok is True for c in verdict.checks)
    assert checks["pck_chain"].detail == (
        f"{PCK} → {PLATFORM} → {ROOT}: each certificate signed by the next, ending at a "
        "self-signed root"
    )
    assert checks["pck_chain.root_pinned"].detail == (
        f"the root {ROOT} is the given trusted root {ROOT} (SPKI SHA-256 {spki_sha256(pki.root)})"
    )
    assert checks["pck_chain.validity"].detail == (f"all 3 certificates are valid at {_iso(WHEN)}")
    assert checks["qe_report_signature"].detail == (
        "ECDSA P-256/SHA-256 over the QE report (384 bytes) verifies with the PCK key"
    )
    assert checks["qe_report_binding"].detail == (
        "QE report_data = SHA-256(attestation key || QE auth data) || zeros: the QE vouches "
        "for the attestation key"
    )
    assert checks["pck_chain.revocation"].detail == (
        f"not revoked: {PCK} in {PLATFORM}'s CRL, {PLATFORM} in the root CA's CRL, "
        f"{SIGNING} in the root CA's CRL"
    )
    facts = verdict.facts
    assert facts["pck_chain"] == [c.subject.rfc4514_string() for c in (pck, pki.platform, pki.root)]
    assert facts["pck_validity"] == {"not_before": _iso(CERT_FROM), "not_after": _iso(CERT_UNTIL)}
    assert facts["fmspc"] == "b0c06f000000" and facts["pceid"] == "0000"
    assert facts["pcesvn"] == 11
    assert facts["tcb_status"] == "UpToDate"
    assert facts["collateral_valid_from"] == "2025-06-19T10:32:27Z"  # the QE identity's
    assert facts["collateral_valid_until"] == _iso(NEXT)  # the double's CRLs'
    # the same quote, its PCK certificate revoked by the double's Platform CA
    members = _intels_texts_signed_by(pki)
    members["pck_crl"] = pki.pck_crl(pck)
    verdict = _verify_under(pki, quote, members)
    assert [c.name for c in verdict.failed] == ["pck_chain.revocation"]


def test_a_pck_chain_not_shaped_like_intels_is_refused(
    pki: FakeIntel, sgx_extension: x509.Extension[x509.ExtensionType]
) -> None:
    raw = (TDX01 / "tdx_quote").read_bytes()
    shape = "not leaf → Intel SGX PCK Platform/Processor CA → root"
    other_ca_key = _key()
    other_ca = _cert("Intel SGX PCK Other CA", other_ca_key, pki.root, pki.root_key, ca=True)
    cases = [
        (
            _pck(pki, sgx_extension, cn="Intel SGX PCK Cert"),
            (pki.platform, pki.root),
            "Intel SGX PCK Cert → {PLATFORM} → {ROOT}: the leaf Intel SGX PCK Cert is not an "
            "'Intel SGX PCK Certificate' end-entity",
        ),
        (
            _pck(pki, sgx_extension, ca=True),
            (pki.platform, pki.root),
            "{PCK} → {PLATFORM} → {ROOT}: the leaf {PCK} is not an 'Intel SGX PCK Certificate' "
            "end-entity",
        ),
        (
            _pck(pki, sgx_extension, issuer=(pki.root, pki.root_key)),
            (pki.root,),
            "{PCK} → {ROOT}: " + shape + " (2 certificates)",
        ),
        (
            _pck(pki, sgx_extension, issuer=(other_ca, other_ca_key)),
            (other_ca, pki.root),
            "{PCK} → Intel SGX PCK Other CA → {ROOT}: " + shape + " (3 certificates)",
        ),
        (
            _pck(pki, None),
            (pki.platform, pki.root),
            "{PCK} → {PLATFORM} → {ROOT}: the PCK certificate's SGX extension: ",
        ),
    ]
    for pck, rest, problem in cases:
        verdict = _verify_under(pki, _requoted(raw, (pck, *rest), pki.pck_key))
        check = next(c for c in verdict.checks if c.name == "pck_chain")
        expected = problem.format(PCK=PCK, PLATFORM=PLATFORM, ROOT=ROOT)
        assert check.ok is False
        assert check.detail.startswith(expected), (check.detail, expected)
        assert expected.endswith(" ") or check.detail == expected


def test_an_expired_pck_certificate_fails_validity(
    pki: FakeIntel, sgx_extension: x509.Extension[x509.ExtensionType]
) -> None:
    until = datetime(2025, 1, 1, tzinfo=UTC)
    pck = _pck(pki, sgx_extension, valid=(CERT_FROM, until))
    raw = _requoted((TDX01 / "tdx_quote").read_bytes(), (pck, pki.platform, pki.root), pki.pck_key)
    verdict = _verify_under(pki, raw)
    assert [c.name for c in verdict.failed] == ["pck_chain.validity"]
    assert verdict.failed[0].detail == (
        f"not valid at {_iso(WHEN)}: {PCK} (valid {_iso(CERT_FROM)} to {_iso(until)})"
    )


def test_the_qe_report_must_be_signed_by_the_pck_key_and_bind_the_attestation_key(
    pki: FakeIntel, sgx_extension: x509.Extension[x509.ExtensionType]
) -> None:
    raw = (TDX01 / "tdx_quote").read_bytes()
    pck = _pck(pki, sgx_extension)
    chain = (pck, pki.platform, pki.root)
    verdict = _verify_under(pki, _requoted(raw, chain, _key()))
    assert [(c.name, c.detail) for c in verdict.failed] == [
        (
            "qe_report_signature",
            "the QE report's signature does not verify with the PCK certificate's key",
        )
    ]
    p384 = ec.generate_private_key(ec.SECP384R1())
    leaf = _pck(pki, sgx_extension, key=p384)  # type: ignore[arg-type]
    verdict = _verify_under(pki, _requoted(raw, (leaf, pki.platform, pki.root), pki.pck_key))
    assert _check(verdict, "qe_report_signature").ok is False
    assert _check(verdict, "qe_report_signature").detail == f"{PCK} has no ECDSA P-256 key"
    report_data = parse_tdx_quote(raw).signature_data.qe_certification.qe_report.report_data
    bound = report_data[:32]
    for data, problem in (
        (
            bytes(32) + bytes(32),
            f"QE report_data[0:32] {bytes(32).hex()} is not SHA-256(attestation key || QE auth "
            f"data) {bound.hex()}",
        ),
        (bound + b"\x01" + bytes(31), "QE report_data[32:64] is not zero"),
    ):
        verdict = _verify_under(pki, _requoted(raw, chain, pki.pck_key, report_data=data))
        assert [(c.name, c.detail) for c in verdict.failed] == [("qe_report_binding", problem)]


# --------------------------------------------------------------------------- chains, built


def test_a_chain_that_stops_below_a_root_says_where(pki: FakeIntel) -> None:
    ca_key, key = _key(), _key()
    ca = _cert("Intel SGX TCB CA", ca_key, pki.root, pki.root_key, ca=True)
    signer = _cert(SIGNING, key, ca, ca_key, ca=False)
    checks = _checks(_signed_by(pki, signer, key), pki)  # the CA is not given
    assert checks["collateral.tcb_info_chain"].detail == (
        f"{SIGNING}: no certificate given issued {SIGNING} (issuer "
        f"{ca.subject.rfc4514_string()}); the chain stops at {SIGNING}, not at a root; "
        "the signer is not issued directly by the root"
    )


def test_chains_are_read_in_any_order(
    pki: FakeIntel, sgx_extension: x509.Extension[x509.ExtensionType]
) -> None:
    members = pki.collateral()
    members["tcb_info_issuer_chain"] = _pem(pki.root, pki.signing)
    _held(_checks(members, pki))
    pck = _pck(pki, sgx_extension)
    raw = (TDX01 / "tdx_quote").read_bytes()
    for chain in ((pki.platform, pck, pki.root), (pki.root, pki.platform, pck)):
        verdict = _verify_under(pki, _requoted(raw, chain, pki.pck_key))
        assert verdict.accepted, [c.line() for c in verdict.failed]


def test_a_root_whose_self_signature_is_forged_is_named(pki: FakeIntel) -> None:
    """The root's key is the pinned one, but another key signed the root certificate."""
    forged = (
        x509.CertificateBuilder()
        .subject_name(pki.root.subject)
        .issuer_name(pki.root.subject)
        .public_key(pki.root_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(CERT_FROM)
        .not_valid_after(CERT_UNTIL)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(_key(), hashes.SHA256())
    )
    members = pki.collateral()
    members["tcb_info_issuer_chain"] = _pem(pki.signing, forged)
    checks = _checks(members, pki)
    assert checks["collateral.tcb_info_chain"].detail == (
        f"{SIGNING} → {ROOT}: the root {ROOT}: the signature on {ROOT} does not verify with "
        f"{ROOT}'s key"
    )


def test_an_issuer_whose_key_cannot_check_the_signature_is_named(pki: FakeIntel) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    impostor = (
        x509.CertificateBuilder()
        .subject_name(pki.root.subject)
        .issuer_name(pki.root.subject)
        .public_key(rsa_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(CERT_FROM)
        .not_valid_after(CERT_UNTIL)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(rsa_key, hashes.SHA256())
    )
    chain = _build_chain(pki.signing, [pki.signing, impostor], _Anchor("00" * 32, "x", None))
    assert chain.problem is not None
    assert chain.problem.startswith(f"{SIGNING} cannot be checked against {ROOT}: "), chain


def test_the_quotes_pinned_chain_alone_shows_the_root(
    pki: FakeIntel, sgx_extension: x509.Extension[x509.ExtensionType]
) -> None:
    """The collateral's signer chains end at another root: the root CA's CRL is checked
    against the root the quote's own pinned PCK chain shows."""
    other = FakeIntel()
    members = _intels_texts_signed_by(other)
    members["root_ca_crl"], members["pck_crl"] = pki.root_crl(), pki.pck_crl()
    members["pck_crl_issuer_chain"] = _pem(pki.platform, pki.root)
    pck = _pck(pki, sgx_extension)
    raw = _requoted((TDX01 / "tdx_quote").read_bytes(), (pck, pki.platform, pki.root), pki.pck_key)
    verdict = _verify_under(pki, raw, members)
    assert _check(verdict, "collateral.root_ca_crl").detail == (
        f"{ROOT}'s CRL (0 revoked) is signed by {ROOT} and current at {_iso(WHEN)} "
        f"(next update {_iso(NEXT)})"
    )
    assert _check(verdict, "collateral.tcb_info_chain").ok is False


def test_a_pck_chain_with_two_faults_names_both(
    pki: FakeIntel, sgx_extension: x509.Extension[x509.ExtensionType]
) -> None:
    raw = (TDX01 / "tdx_quote").read_bytes()
    pck = _pck(pki, sgx_extension, cn="Intel SGX PCK Cert", issuer=(pki.root, pki.root_key))
    verdict = _verify_under(pki, _requoted(raw, (pck, pki.root), pki.pck_key))
    assert _check(verdict, "pck_chain").detail == (
        f"Intel SGX PCK Cert → {ROOT}: the leaf Intel SGX PCK Cert is not an "
        f"'{PCK}' end-entity; not leaf → Intel SGX PCK Platform/Processor CA → root "
        "(2 certificates)"
    )
    forged = (
        x509.CertificateBuilder()
        .subject_name(pki.root.subject)
        .issuer_name(pki.root.subject)
        .public_key(pki.root_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(CERT_FROM)
        .not_valid_after(CERT_UNTIL)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(_key(), hashes.SHA256())
    )
    good = _pck(pki, sgx_extension)
    verdict = verify_tdx(
        _requoted(raw, (good, pki.platform, forged), pki.pck_key),
        now=WHEN,
        trusted_root=forged.public_bytes(Encoding.DER),
    )
    assert _check(verdict, "pck_chain").ok is False
    assert _check(verdict, "pck_chain").detail == (
        f"{PCK} → {PLATFORM} → {ROOT}: the root {ROOT}: the signature on {ROOT} does not "
        f"verify with {ROOT}'s key"
    )
    late = datetime(2045, 1, 1, tzinfo=UTC)
    verdict = verify_tdx(
        _requoted(raw, (good, pki.platform, pki.root), pki.pck_key),
        now=late,
        trusted_root=pki.root.public_bytes(Encoding.DER),
    )
    window = f"(valid {_iso(CERT_FROM)} to {_iso(CERT_UNTIL)})"
    assert _check(verdict, "pck_chain.validity").detail == (
        f"not valid at {_iso(late)}: {PCK} {window}, {PLATFORM} {window}, {ROOT} {window}"
    )


def test_a_time_without_a_zone_is_refused() -> None:
    with pytest.raises(ValueError) as caught:
        verify_tdx(b"", now=datetime(2025, 7, 1))
    assert str(caught.value) == "now: a time without a time zone"


def test_the_quote_as_hex_text_and_its_sizes_read_unsigned(
    tdx01: tuple[TdxQuote, PckExtension, dict[str, Any], dict[str, Any]],
) -> None:
    raw = (TDX01 / "tdx_quote").read_bytes()
    hex_text = raw.hex()
    spaced = "0X" + " ".join(hex_text[i : i + 64] for i in range(0, len(hex_text), 64))
    assert parse_tdx_quote(spaced) == parse_tdx_quote(raw)
    with pytest.raises(ValueError) as caught:
        parse_tdx_quote(raw[:48])  # the header alone: nothing left for the body
    assert str(caught.value) == "body: truncated: needs 584 bytes at offset 48, 0 left"
    high = bytearray(raw)
    high[0:2] = (0x8004).to_bytes(2, "little")
    with pytest.raises(ValueError) as caught:
        parse_tdx_quote(bytes(high))
    assert str(caught.value).startswith("header.version: 32772 is not a TDX quote version")


def test_a_certificate_without_a_common_name_is_named_in_full(pki: FakeIntel) -> None:
    key = _key()
    nameless = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Test double, not Intel")])
    signer = (
        x509.CertificateBuilder()
        .subject_name(nameless)
        .issuer_name(pki.root.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(CERT_FROM)
        .not_valid_after(CERT_UNTIL)
        .sign(pki.root_key, hashes.SHA256())
    )
    checks = _checks(_signed_by(pki, signer, key, pki.root), pki)
    full = nameless.rfc4514_string()
    assert checks["collateral.tcb_info_chain"].detail == (
        f"{full} → {ROOT}: the signer {full} is not the '{SIGNING}' certificate"
    )


def test_intels_pck_chain_without_its_root_stops_at_the_pck_ca(
    tdx01: tuple[TdxQuote, PckExtension, dict[str, Any], dict[str, Any]],
) -> None:
    """tdx-01's quote with the root left out of its PCK chain (the QE report and its
    signature are Intel's own): the chain stops at the PCK CA, named."""
    raw = (TDX01 / "tdx_quote").read_bytes()
    quote = parse_tdx_quote(raw)
    sd, qc = quote.signature_data, quote.signature_data.qe_certification
    pem = qc.pck_chain_pem
    assert pem is not None
    leaf, platform, _root = x509.load_pem_x509_certificates(pem)
    chain = _pem(leaf, platform).encode()
    auth = qc.qe_auth_data
    certification = (
        qc.qe_report.raw
        + qc.qe_report_signature
        + _le(len(auth), 2)
        + auth
        + _le(5, 2)
        + _le(len(chain), 4)
        + chain
    )
    signature_data = (
        sd.signature + sd.attestation_key + _le(6, 2) + _le(len(certification), 4) + certification
    )
    requoted = quote.signed_bytes + _le(len(signature_data), 4) + signature_data
    verdict = verify_tdx(requoted, now=datetime(2025, 7, 1, tzinfo=UTC))
    assert _check(verdict, "qe_report_signature").ok is True
    assert _check(verdict, "pck_chain").detail == (
        f"{PCK} → {PLATFORM}: no certificate given issued {PLATFORM} (issuer "
        f"{platform.issuer.rfc4514_string()}); not leaf → Intel SGX PCK Platform/Processor CA "
        "→ root (2 certificates)"
    )
    assert _check(verdict, "pck_chain.root_pinned").detail == (
        f"the chain stops at {PLATFORM}, not at a root"
    )


def test_a_pck_chain_of_one_certificate_is_counted_as_one(pki: FakeIntel) -> None:
    """The root alone as the quote's PCK chain: no PCK certificate, but the one certificate
    there is valid, and said so in the singular."""
    raw = _requoted((TDX01 / "tdx_quote").read_bytes(), (pki.root,), pki.root_key)
    verdict = _verify_under(pki, raw)
    assert _check(verdict, "pck_chain").ok is False
    assert _check(verdict, "pck_chain.validity").ok is True
    assert _check(verdict, "pck_chain.validity").detail == (
        f"the 1 certificate is valid at {_iso(WHEN)}"
    )


def test_one_byte_after_the_signature_data_is_counted_as_one() -> None:
    raw = (TDX01 / "tdx_quote").read_bytes()
    quote = parse_tdx_quote(raw)
    assert len(quote.trailing) == 70
    collateral = (TDX01 / "tdx_quote_collateral.json").read_bytes()
    when = datetime(2025, 7, 1, tzinfo=UTC)
    for kept, note in ((1, "1 byte"), (2, "2 bytes")):
        verdict = verify_tdx(raw[: len(raw) - 70 + kept], now=when, collateral=collateral)
        assert verdict.accepted
        assert verdict.facts["trailing_bytes"] == kept
        assert verdict.facts["trailing_bytes_note"] == (
            f"{note} after the signature data, outside every signature: ignored"
        )
