"""Intel TDX quotes (DCAP quote v4 and v5), checked offline.

``verify_tdx`` checks the quote signature with the attestation key, the QE report signature
with the PCK leaf, that the QE report binds the attestation key (report_data[0:32] =
SHA-256(attestation key || QE auth data), the rest zero), and the PCK chain up to Intel's SGX
Root CA (pinned by the SHA-256 of its SubjectPublicKeyInfo) with every certificate valid at
the verification time. With Intel's collateral (see ``verify_tdx``) it also checks the TCB
info and QE identity signatures over their exact JSON text, their issuer chains, their
validity windows, the CRLs, the QE identity, the TDX module identity and the platform TCB
level, and reports Intel's TCB status with its advisories. Without collateral those checks
are listed as not checked.

This module orchestrates; each concept has its own module, and the public names are
re-exported here:

- ``attestation.tdx_quote``: the quote's layout, its structures and ``parse_tdx_quote``;
- ``attestation.pck``: the PCK certificate's SGX extension (``parse_pck_extension``);
- ``attestation.tdx_certs``: Intel's chains up to the pinned root, and P-256 signatures;
- ``attestation.tdx_collateral``: reading the collateral, its signatures, chains and CRLs;
- ``attestation.tdx_tcb``: QE identity, TDX module, TCB level matching, status convergence.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.certs import load_certs, spki_sha256
from attestation.pck import SGX_EXTENSION_OID, PckExtension, parse_pck_extension
from attestation.tdx_certs import (
    INTEL_SGX_ROOT_CA_SPKI_SHA256,
    PCK_CA_CNS,
    PCK_LEAF_CN,
    _Anchor,
    _build_chain,
    _Chain,
    _cn,
    _expired,
    _is_ca,
    _iso,
    _p256_key,
    _p256_verify,
    _pick_leaf,
)
from attestation.tdx_collateral import _collateral_members, _CollateralChecks
from attestation.tdx_quote import (
    CERT_PCK_CHAIN,
    EnclaveReport,
    QeReportCertificationData,
    QuoteHeader,
    QuoteSignatureData,
    TdReport,
    TdxQuote,
    parse_tdx_quote,
)
from attestation.tdx_tcb import TCB_STATUSES, _TcbChecks, converge_tcb_status
from attestation.verdict import Verdict

__all__ = [
    "INTEL_QE_VENDOR_ID",
    "INTEL_SGX_ROOT_CA_SPKI_SHA256",
    "SGX_EXTENSION_OID",
    "TCB_STATUSES",
    "EnclaveReport",
    "PckExtension",
    "QeReportCertificationData",
    "QuoteHeader",
    "QuoteSignatureData",
    "TdReport",
    "TdxQuote",
    "converge_tcb_status",
    "parse_pck_extension",
    "parse_tdx_quote",
    "verify_tdx",
]

#: Intel's Quoting Enclave vendor id.
INTEL_QE_VENDOR_ID = bytes.fromhex("939a7233f79c4ca9940a0db3957f0607")

_NO_COLLATERAL = (
    "not checked: needs Intel's collateral (TCB info, QE identity, their issuer chains and "
    "CRLs) for this FMSPC"
)


class _Verifier(_CollateralChecks, _TcbChecks):
    """The state every TDX check shares, the quote's own checks, and the collateral's and
    the TCB's checks mixed in from their modules."""

    def __init__(
        self,
        quote: TdxQuote,
        now: datetime,
        trusted_root: bytes | None,
    ) -> None:
        self.quote = quote
        self.now = now
        self.verdict = Verdict("tdx")
        self.facts = self.verdict.facts
        if trusted_root is not None:
            try:
                root = load_certs(trusted_root)[0]
            except (ValueError, IndexError) as exc:
                raise ValueError(f"trusted_root: not a certificate: {exc}") from None
            self.anchor = _Anchor(spki_sha256(root), f"the given trusted root {_cn(root)}", root)
        else:
            self.anchor = _Anchor(
                INTEL_SGX_ROOT_CA_SPKI_SHA256, "the pinned Intel SGX Root CA", None
            )
        self.pck_chain: _Chain | None = None
        self.pck_leaf: x509.Certificate | None = None
        self.pck_ext: PckExtension | None = None
        self.root: x509.Certificate | None = None  # the pinned root, once a chain shows it
        self.signers_seen: list[x509.Certificate] = []  # collateral signers, for the root CRL

    def add(self, name: str, ok: bool | None, detail: str) -> None:
        self.verdict.add(name, ok, detail)

    # ---- facts

    def quote_facts(self) -> None:
        q, b = self.quote, self.quote.body
        qe = q.signature_data.qe_certification.qe_report
        f = self.facts
        f["version"] = q.header.version
        f["tee_type"] = f"{q.header.tee_type:#x}"
        f["body_type"] = q.body_type
        f["qe_vendor_id"] = q.header.qe_vendor_id.hex()
        f["tee_tcb_svn"] = b.tee_tcb_svn.hex()
        f["mrseam"] = b.mrseam.hex()
        f["mrsignerseam"] = b.mrsignerseam.hex()
        f["seam_attributes"] = b.seam_attributes.hex()
        f["td_attributes"] = b.td_attributes.hex()
        f["debug"] = b.debug
        f["xfam"] = b.xfam.hex()
        f["mrtd"] = b.mrtd.hex()
        f["mrconfigid"] = b.mrconfigid.hex()
        f["mrowner"] = b.mrowner.hex()
        f["mrownerconfig"] = b.mrownerconfig.hex()
        for i, rtmr in enumerate(b.rtmrs):
            f[f"rtmr{i}"] = rtmr.hex()
        f["report_data"] = b.report_data.hex()
        if b.tee_tcb_svn2 is not None:
            f["tee_tcb_svn2"] = b.tee_tcb_svn2.hex()
        if b.mrservicetd is not None:
            f["mrservicetd"] = b.mrservicetd.hex()
        f["qe_isvsvn"] = qe.isv_svn
        f["qe_isvprodid"] = qe.isv_prod_id
        f["qe_mrsigner"] = qe.mrsigner.hex()
        f["tcb_status"] = None
        f["advisory_ids"] = []
        if q.trailing:
            f["trailing_bytes"] = len(q.trailing)
            f["trailing_bytes_note"] = (
                f"{len(q.trailing)} byte{'' if len(q.trailing) == 1 else 's'} after the signature "
                "data, outside every "
                "signature: ignored"
            )

    # ---- the quote itself

    def check_quote_signature(self) -> None:
        sd = self.quote.signature_data
        name = "quote_signature"
        try:
            key = ec.EllipticCurvePublicKey.from_encoded_point(
                ec.SECP256R1(), b"\x04" + sd.attestation_key
            )
        except ValueError:
            self.add(name, False, "the attestation key is not a point on P-256")
            return
        n = len(self.quote.signed_bytes)
        if _p256_verify(key, sd.signature, self.quote.signed_bytes):
            self.add(
                name,
                True,
                f"ECDSA P-256/SHA-256 over the header and TD body ({n} bytes) verifies with "
                "the attestation key",
            )
        else:
            self.add(
                name,
                False,
                f"the ECDSA P-256/SHA-256 signature over the header and TD body ({n} bytes) "
                "does not verify with the attestation key",
            )

    def check_qe_vendor(self) -> None:
        vendor = self.quote.header.qe_vendor_id
        self.add(
            "qe_vendor",
            vendor == INTEL_QE_VENDOR_ID,
            "the quote comes from Intel's Quoting Enclave"
            if vendor == INTEL_QE_VENDOR_ID
            else f"QE vendor id {vendor.hex()} is not Intel's {INTEL_QE_VENDOR_ID.hex()}",
        )

    def check_pck_chain(self) -> None:
        qc = self.quote.signature_data.qe_certification
        pem = qc.pck_chain_pem
        certs: list[x509.Certificate] = []
        problem: str | None = None
        if pem is None:
            problem = (
                f"QE certification data type {qc.certification_data_type}: the quote carries no "
                f"PCK chain (type {CERT_PCK_CHAIN}); fetch the PCK certificate from Intel"
            )
        else:
            try:
                certs = load_certs(pem)
            except ValueError as exc:
                problem = f"the PCK chain does not parse: {exc}"
            if not certs and problem is None:
                problem = "the PCK chain holds no certificates"
        if problem is not None:
            self.add("pck_chain", False, problem)
            self.add("pck_chain.root_pinned", False, "no PCK chain")
            self.add("pck_chain.validity", None, "no PCK chain")
            return
        leaf = _pick_leaf(certs)
        chain = _build_chain(leaf, certs, self.anchor)
        self.pck_chain, self.pck_leaf = chain, leaf
        if chain.pinned:
            self.root = chain.path[-1]
        names = " → ".join(_cn(c) for c in chain.path)
        problems: list[str] = [chain.problem] if chain.problem else []
        if _cn(leaf) != PCK_LEAF_CN or _is_ca(leaf):
            problems.append(f"the leaf {_cn(leaf)} is not an {PCK_LEAF_CN!r} end-entity")
        if len(chain.path) != 3 or _cn(chain.path[1]) not in PCK_CA_CNS:
            problems.append(
                "not leaf → Intel SGX PCK Platform/Processor CA → root "
                f"({len(chain.path)} certificates)"
            )
        try:
            self.pck_ext = parse_pck_extension(leaf)
        except ValueError as exc:
            problems.append(f"the PCK certificate's SGX extension: {exc}")
        self.facts["pck_chain"] = [c.subject.rfc4514_string() for c in chain.path]
        self.facts["pck_validity"] = {
            "not_before": _iso(leaf.not_valid_before_utc),
            "not_after": _iso(leaf.not_valid_after_utc),
        }
        if self.pck_ext is not None:
            ext = self.pck_ext
            self.facts["fmspc"] = ext.fmspc.hex()
            self.facts["pceid"] = ext.pceid.hex()
            self.facts["pcesvn"] = ext.pcesvn
            self.facts["pck_cpusvn_components"] = list(ext.cpusvn_components)
            if ext.sgx_type is not None:
                self.facts["sgx_type"] = ext.sgx_type
        self.add(
            "pck_chain",
            not problems,
            f"{names}: each certificate signed by the next, ending at a self-signed root"
            if not problems
            else f"{names}: " + "; ".join(problems),
        )
        self.add("pck_chain.root_pinned", chain.pinned, chain.pin_detail)
        expired = _expired(chain.path, self.now)
        self.add(
            "pck_chain.validity",
            not expired,
            f"{'the 1 certificate is' if len(chain.path) == 1 else f'all {len(chain.path)} certificates are'}"
            f" valid at {_iso(self.now)}"
            if not expired
            else f"not valid at {_iso(self.now)}: " + ", ".join(expired),
        )

    def check_qe_report(self) -> None:
        qc = self.quote.signature_data.qe_certification
        leaf = self.pck_leaf
        key = _p256_key(leaf) if leaf is not None else None
        if leaf is None:
            self.add("qe_report_signature", False, "no PCK certificate to check the QE report with")
        elif key is None:
            self.add("qe_report_signature", False, f"{_cn(leaf)} has no ECDSA P-256 key")
        elif _p256_verify(key, qc.qe_report_signature, qc.qe_report.raw):
            self.add(
                "qe_report_signature",
                True,
                "ECDSA P-256/SHA-256 over the QE report (384 bytes) verifies with the PCK key",
            )
        else:
            self.add(
                "qe_report_signature",
                False,
                "the QE report's signature does not verify with the PCK certificate's key",
            )
        expected = hashlib.sha256(
            self.quote.signature_data.attestation_key + qc.qe_auth_data
        ).digest()
        got = qc.qe_report.report_data
        if got[:32] != expected:
            self.add(
                "qe_report_binding",
                False,
                f"QE report_data[0:32] {got[:32].hex()} is not SHA-256(attestation key || QE "
                f"auth data) {expected.hex()}",
            )
        elif any(got[32:]):
            self.add("qe_report_binding", False, "QE report_data[32:64] is not zero")
        else:
            self.add(
                "qe_report_binding",
                True,
                "QE report_data = SHA-256(attestation key || QE auth data) || zeros: the QE "
                "vouches for the attestation key",
            )

    # ---- collateral

    def no_collateral(self) -> None:
        for name in (
            "collateral.tcb_info_signature",
            "collateral.tcb_info_chain",
            "collateral.tcb_info_validity",
            "collateral.qe_identity_signature",
            "collateral.qe_identity_chain",
            "collateral.qe_identity_validity",
            "collateral.root_ca_crl",
            "collateral.pck_crl",
            "pck_chain.revocation",
            "qe_identity",
            "tcb_info.platform",
            "tdx_module",
            "tcb_level",
        ):
            self.add(name, None, _NO_COLLATERAL)

    def check_collateral(self, collateral: Mapping[str, Any] | bytes | str) -> None:
        members = _collateral_members(collateral)
        window: list[tuple[datetime, datetime, str]] = []
        tcb, qe = self.check_authenticity(members, window)
        self.check_tcb(tcb, qe)
        if window:
            self.facts["collateral_valid_from"] = _iso(max(w[0] for w in window))
            self.facts["collateral_valid_until"] = _iso(min(w[1] for w in window))


def verify_tdx(
    quote: bytes | str,
    *,
    now: datetime,
    collateral: Mapping[str, Any] | bytes | str | None = None,
    trusted_root: bytes | None = None,
) -> Verdict:
    """Verify a TDX quote (v4 or v5; raw bytes or hex text) offline, at time ``now``.

    ``collateral`` is Intel's collateral for the quote's FMSPC, as a mapping or its JSON text
    (the shape of dcap-qvl's ``QuoteCollateralV3``): ``tcb_info`` and ``qe_identity`` (the
    **exact** JSON text Intel signed, or Intel's PCS response containing it, from which the
    exact substring is taken), ``tcb_info_signature`` and ``qe_identity_signature`` (hex r ||
    s; taken from a PCS response when absent), ``tcb_info_issuer_chain`` and
    ``qe_identity_issuer_chain`` (PEM), and optionally ``root_ca_crl`` and ``pck_crl`` (hex
    DER, DER or PEM) with ``pck_crl_issuer_chain``. Without it, the collateral and TCB checks
    are listed as not checked, and the default policy refuses the quote
    (``policy.quote_level``) unless it says ``allow_quote_level``.

    ``trusted_root`` (a PEM or DER certificate) replaces the pinned Intel SGX Root CA, for
    tests. Raises ``ValueError`` when the quote does not parse (naming the field), ``now`` has
    no time zone, the collateral is not a JSON object, or ``trusted_root`` is not a
    certificate; everything else is a check in the returned verdict.
    """
    if now.tzinfo is None:
        raise ValueError("now: a time without a time zone")
    parsed = parse_tdx_quote(quote)
    v = _Verifier(parsed, now, trusted_root)
    v.quote_facts()
    v.check_quote_signature()
    v.check_pck_chain()
    # The signature checks first in the list: everything else hangs on them.
    chain_checks = v.verdict.checks[1:]
    del v.verdict.checks[1:]
    v.check_qe_report()
    v.verdict.checks.extend(chain_checks)
    v.check_qe_vendor()
    if collateral is None:
        v.no_collateral()
    else:
        v.check_collateral(collateral)
    return v.verdict
