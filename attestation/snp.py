"""AMD SEV-SNP attestation reports: verify one against its VCEK/VLEK and AMD's chain.

``verify_snp`` judges a report against its VCEK or VLEK certificate and the AMD chain above
it, at an explicit time ``now``, and returns a ``Verdict`` naming every check:

- ``chain.ark_self_signed``  the ARK signs itself (RSA-PSS, SHA-384, 48-byte salt)
- ``chain.ark_pinned``       the ARK's key is a pinned AMD root (``attestation.amd_roots``)
- ``chain.ask_by_ark``       the ASK (or, for a VLEK, the ASVK) is signed by the ARK
- ``chain.vek_by_ask``       the VCEK/VLEK is signed by that ASK/ASVK
- ``chain.validity``         every certificate is within its validity window at ``now``
- ``report_signature``       ECDSA P-384 SHA-384 over bytes [0, 0x2A0) with the VCEK/VLEK key
- ``vek.kind``               the report's SIGNING_KEY names the kind of key that signed it
- ``vek.tcb``                the certificate's TCB extensions equal REPORTED_TCB
- ``vek.hwid``               a VCEK's hwID equals CHIP_ID (a VLEK has none: not checked)
- ``vek.product``            the certificate's product is the product of the pinned root
                             (and of the report's CPUID, version 3 and later)
- ``chain.revocation``       AMD's CRL (``crl``, DER or PEM) is the ARK's, in force at ``now``,
                             and lists neither the ASK/ASVK nor the VCEK/VLEK
                             (``attestation.amd_crl``); without one, listed as not checked

This module never reads the clock, never fetches from AMD's KDS (a CRL is passed in), and
never judges policy (debug, VMPL, ABI, minimum TCB, measurement): ``attestation.policy``
reads the facts for that.

Here too: reading AMD's extensions on a VCEK or VLEK certificate (``parse_vek``). The report's
structure and its parser (``load_report``, ``SnpReport``, ``TcbVersion``) are
``attestation.snp_report``'s, and re-exported here.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.x509.oid import NameOID, SignatureAlgorithmOID

from attestation.amd_crl import check_crl
from attestation.amd_roots import AMD_ARK_SPKI_SHA256
from attestation.certs import load_certs, spki_sha256
from attestation.snp_report import (
    _SIG_R_SIZE,
    REPORT_SIZE,
    SIGNED_SIZE,
    SIGNING_KEY_VCEK,
    SIGNING_KEY_VLEK,
    SUPPORTED_VERSIONS,
    Product,
    SnpReport,
    TcbVersion,
    _parse,
    _raw_report,
    decode_tcb,
    load_report,
    parse_report,
    product_family,
)
from attestation.verdict import Verdict

__all__ = [
    "REPORT_SIZE",
    "SIGNED_SIZE",
    "SUPPORTED_VERSIONS",
    "SnpReport",
    "TcbVersion",
    "VekInfo",
    "decode_tcb",
    "load_report",
    "parse_report",
    "parse_vek",
    "product_family",
    "spki_sha256",
    "verify_snp",
    "verify_snp_chain",
]

_SIG_ALGO_ECDSA_P384_SHA384 = 1

# AMD's VCEK/VLEK certificate extensions (AMD "Versioned Chip Endorsement Key (VCEK)
# Certificate and KDS Interface Specification", publication 57230)
_AMD_OID = "1.3.6.1.4.1.3704.1"
OID_PRODUCT_NAME = x509.ObjectIdentifier(f"{_AMD_OID}.2")
OID_HWID = x509.ObjectIdentifier(f"{_AMD_OID}.4")
OID_CSP_ID = x509.ObjectIdentifier(f"{_AMD_OID}.5")  # VLEK: the cloud provider it was issued to
#: TCB component → the extension holding its SVN (fmc: Turin and later only)
TCB_OIDS: Mapping[str, x509.ObjectIdentifier] = {
    "bl": x509.ObjectIdentifier(f"{_AMD_OID}.3.1"),
    "tee": x509.ObjectIdentifier(f"{_AMD_OID}.3.2"),
    "snp": x509.ObjectIdentifier(f"{_AMD_OID}.3.3"),
    "ucode": x509.ObjectIdentifier(f"{_AMD_OID}.3.8"),
    "fmc": x509.ObjectIdentifier(f"{_AMD_OID}.3.9"),
}

#: AMD's certificate signatures: RSASSA-PSS, SHA-384, MGF1-SHA-384, 48-byte salt.
_AMD_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)


# --- certificates ------------------------------------------------------------------------


def _cn(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else cert.subject.rfc4514_string()


def _der(data: bytes, tag: int, what: str) -> bytes:
    """The value of one DER TLV that must fill ``data`` exactly and carry ``tag``."""
    if len(data) < 2 or data[0] != tag:
        raise ValueError(f"{what}: not a DER value with tag {tag:#04x}")
    size, at = data[1], 2
    if size & 0x80:
        count = size & 0x7F
        if count == 0 or count > 4 or len(data) < 2 + count:
            raise ValueError(f"{what}: bad DER length")
        size, at = int.from_bytes(data[2 : 2 + count], "big"), 2 + count
    if len(data) != at + size:
        raise ValueError(f"{what}: DER length {size} does not match {len(data) - at} bytes")
    return data[at:]


def _der_uint(data: bytes, what: str) -> int:
    value = _der(data, 0x02, what)
    if not value or value[0] & 0x80:
        raise ValueError(f"{what}: not a non-negative DER INTEGER")
    return int.from_bytes(value, "big")


@dataclass(frozen=True)
class VekInfo:
    """What AMD's extensions on a VCEK or VLEK certificate say."""

    kind: Literal["vcek", "vlek"]
    product_name: str | None  # productName as written (``Milan-B0``, ``Genoa``, ``Turin``)
    tcb: Mapping[str, int]  # component → SVN, for the TCB extensions present
    hwid: bytes | None  # a VCEK's hwID (64 bytes; 8 on Turin); None for a VLEK
    csp_id: str | None  # a VLEK's cloud provider

    @property
    def product(self) -> Product | None:
        return product_family(self.product_name)


def _ext_value(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> bytes | None:
    try:
        ext = cert.extensions.get_extension_for_oid(oid)
    except x509.ExtensionNotFound:
        return None
    value = ext.value
    return value.value if isinstance(value, x509.UnrecognizedExtension) else None


def _hwid(value: bytes) -> bytes:
    # AMD first wrote hwID as the raw bytes, later as a DER OCTET STRING around them. Raw
    # bytes never read as an OCTET STRING of 8 or 64 bytes (that takes 10 or 66 of them).
    try:
        inner = _der(value, 0x04, "hwID")  # pragma: no mutate (the name is never shown)
    except ValueError:
        return value
    return inner if len(inner) in (8, 64) else value


def _ia5(value: bytes) -> str:
    """An IA5String's text; where the value is not one (raw text), the bytes as ASCII."""
    try:
        return _der(value, 0x16, "IA5String").decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return value.decode("ascii", "replace")


def _vek_info(cert: x509.Certificate) -> VekInfo:
    cn = _cn(cert)
    csp_raw = _ext_value(cert, OID_CSP_ID)
    hwid_raw = _ext_value(cert, OID_HWID)
    if "VLEK" in cn.upper() or (csp_raw is not None and hwid_raw is None):
        kind: Literal["vcek", "vlek"] = "vlek"
    else:
        kind = "vcek"
    name_raw = _ext_value(cert, OID_PRODUCT_NAME)
    product_name = _ia5(name_raw) if name_raw is not None else None
    tcb: dict[str, int] = {}
    for part, oid in TCB_OIDS.items():
        raw = _ext_value(cert, oid)
        if raw is not None:
            tcb[part] = _der_uint(raw, f"TCB extension {oid.dotted_string}")
    csp = _ia5(csp_raw) if csp_raw is not None else None
    return VekInfo(
        kind=kind,
        product_name=product_name,
        tcb=tcb,
        hwid=_hwid(hwid_raw) if hwid_raw is not None else None,
        csp_id=csp,
    )


def parse_vek(data: bytes) -> VekInfo:
    """AMD's extensions of a VCEK/VLEK certificate (DER or PEM); ``ValueError`` if unreadable."""
    certs = load_certs(data)
    if len(certs) != 1:
        raise ValueError(f"expected one VCEK/VLEK certificate, got {len(certs)}")
    return _vek_info(certs[0])


def _pss_signed_by(child: x509.Certificate, issuer: x509.Certificate) -> str | None:
    """None when ``issuer``'s key made ``child``'s RSA-PSS signature; else why not."""
    key = issuer.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        return f"{_cn(issuer)} has no RSA key"
    if child.signature_algorithm_oid != SignatureAlgorithmOID.RSASSA_PSS:
        return f"{_cn(child)} is not signed with RSASSA-PSS"
    try:
        key.verify(child.signature, child.tbs_certificate_bytes, _AMD_PSS, hashes.SHA384())
    except InvalidSignature:
        return (
            f"the RSA-PSS SHA-384 (salt 48) signature on {_cn(child)} "
            f"does not verify with {_cn(issuer)}'s key"
        )
    if child.issuer != issuer.subject:
        return f"{_cn(child)} names its issuer {child.issuer.rfc4514_string()}"
    return None


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- verification ------------------------------------------------------------------------


@dataclass
class _Chain:
    vek: x509.Certificate | None = None
    info: VekInfo | None = None
    root_product: str | None = None
    ark: x509.Certificate | None = None
    ask: x509.Certificate | None = None


def _check_chain(
    verdict: Verdict,
    vek_data: bytes,
    chain_data: bytes,
    now: datetime,
    roots: Mapping[str, str],
) -> _Chain:
    """ARK → ASK/ASVK → VCEK/VLEK (VCEK spec, "Verifying the chain"); adds the chain.* checks."""
    found = _Chain()
    try:
        vek_certs = load_certs(vek_data)
        if len(vek_certs) != 1:
            raise ValueError(f"the key certificate holds {len(vek_certs)} certificates, not one")
        vek = vek_certs[0]
        chain = load_certs(chain_data)
    except ValueError as exc:
        for name in ("ark_self_signed", "ark_pinned", "ask_by_ark", "vek_by_ask"):
            verdict.add(f"chain.{name}", False, f"the certificates do not parse: {exc}")
        return found
    found.vek = vek
    try:
        found.info = _vek_info(vek)
    except ValueError as exc:
        verdict.add("vek.extensions", False, f"{_cn(vek)}: {exc}")

    pinned = {fp.lower(): product for product, fp in roots.items()}
    roots_in_chain = [c for c in chain if c.subject == c.issuer]
    ark = next((c for c in roots_in_chain if spki_sha256(c) in pinned), None)
    if ark is None and roots_in_chain:
        ark = roots_in_chain[0]
    if ark is None:
        verdict.add("chain.ark_self_signed", False, "the chain holds no self-issued ARK")
        verdict.add("chain.ark_pinned", False, "no ARK to compare with the pinned AMD roots")
    else:
        why = _pss_signed_by(ark, ark)
        verdict.add(
            "chain.ark_self_signed",
            why is None,
            why or f"{_cn(ark)} signs itself (RSA-PSS SHA-384, salt 48)",
        )
        fp = spki_sha256(ark)
        found.root_product = pinned.get(fp)
        verdict.add(
            "chain.ark_pinned",
            found.root_product is not None,
            f"{_cn(ark)} is the pinned AMD {found.root_product} root (SPKI SHA-256 {fp})"
            if found.root_product is not None
            else f"{_cn(ark)}'s key (SPKI SHA-256 {fp}) is none of the pinned roots "
            f"({', '.join(sorted(roots)) or 'none given'})",
        )

    found.ark = ark
    others = [c for c in chain if c is not ark and c.subject != c.issuer]
    ask = next((c for c in others if c.subject == vek.issuer), None)
    if ask is None and ark is not None:
        ask = next((c for c in others if c.issuer == ark.subject), None)
    found.ask = ask
    if ask is None:
        verdict.add("chain.ask_by_ark", False, "the chain holds no ASK or ASVK")
        verdict.add("chain.vek_by_ask", False, f"no ASK/ASVK to check {_cn(vek)} with")
    else:
        if ark is None:
            verdict.add("chain.ask_by_ark", False, f"no ARK to check {_cn(ask)} with")
        else:
            why = _pss_signed_by(ask, ark)
            verdict.add(
                "chain.ask_by_ark",
                why is None,
                why or f"{_cn(ask)} is signed by {_cn(ark)} (RSA-PSS SHA-384, salt 48)",
            )
        why = _pss_signed_by(vek, ask)
        verdict.add(
            "chain.vek_by_ask",
            why is None,
            why or f"{_cn(vek)} is signed by {_cn(ask)} (RSA-PSS SHA-384, salt 48)",
        )

    used = [c for c in (ark, ask, vek) if c is not None]
    late = [
        f"{_cn(c)} is valid {_when(c.not_valid_before_utc)} .. {_when(c.not_valid_after_utc)}"
        for c in used
        if not c.not_valid_before_utc <= now <= c.not_valid_after_utc
    ]
    verdict.add(
        "chain.validity",
        not late,
        f"at {_when(now)}: " + "; ".join(late)
        if late
        else f"all {len(used)} certificates are valid at {_when(now)} "
        f"({_cn(vek)} until {_when(vek.not_valid_after_utc)})",
    )
    if ark is not None:
        verdict.facts["ark_spki_sha256"] = spki_sha256(ark)
    verdict.facts["chain"] = [_cn(c) for c in used]
    if found.info is not None:
        verdict.facts["signing_key"] = found.info.kind
        verdict.facts["product"] = found.info.product_name
    return found


def _check_product(verdict: Verdict, found: _Chain, report: SnpReport | None) -> None:
    info = found.info
    if info is None:
        return
    cert_product = info.product
    problems: list[str] = []
    if cert_product is None:
        problems.append(f"the certificate names no known product ({info.product_name!r})")
    elif found.root_product is not None and cert_product != product_family(found.root_product):
        problems.append(
            f"the certificate is for {info.product_name}, the root for {found.root_product}"
        )
    cpuid = report.cpuid_product if report is not None else None
    if report is not None and cpuid is not None and cert_product not in (None, cpuid):
        problems.append(
            f"the report's CPUID (family {report.cpuid_fam_id:#x}, model "
            f"{report.cpuid_mod_id:#x}) is a {cpuid}, the certificate a {cert_product}"
        )
    if problems:
        verdict.add("vek.product", False, "; ".join(problems))
        return
    root = f", the root is AMD's {found.root_product}" if found.root_product else ""
    seen = f", the report's CPUID says {cpuid}" if cpuid else ""
    verdict.add("vek.product", True, f"the certificate is for {info.product_name}{root}{seen}")


def _check_signature(verdict: Verdict, raw: bytes, vek: x509.Certificate | None) -> None:
    """ABI: ECDSA P-384 SHA-384 over bytes [0, 0x2A0); r and s little-endian (Table 141)."""
    name = "report_signature"
    algo = struct.unpack_from("<I", raw, 0x34)[0]
    if algo != _SIG_ALGO_ECDSA_P384_SHA384:
        verdict.add(name, False, f"SIGNATURE_ALGO is {algo}, not 1 (ECDSA P-384 with SHA-384)")
        return
    if vek is None:
        verdict.add(name, False, "no VCEK/VLEK to check the signature with")
        return
    key = vek.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        verdict.add(name, False, f"{_cn(vek)} has no ECDSA P-384 key")
        return
    r = int.from_bytes(raw[SIGNED_SIZE : SIGNED_SIZE + _SIG_R_SIZE], "little")
    s = int.from_bytes(raw[SIGNED_SIZE + _SIG_R_SIZE : SIGNED_SIZE + 2 * _SIG_R_SIZE], "little")
    try:
        key.verify(encode_dss_signature(r, s), raw[:SIGNED_SIZE], ec.ECDSA(hashes.SHA384()))
    except InvalidSignature:
        verdict.add(
            name,
            False,
            f"the ECDSA P-384 SHA-384 signature over bytes [0, 0x2A0) does not verify "
            f"with {_cn(vek)}'s key",
        )
        return
    verdict.add(
        name, True, f"ECDSA P-384 SHA-384 over bytes [0, 0x2A0) verifies with {_cn(vek)}'s key"
    )


def _check_vek_fields(verdict: Verdict, report: SnpReport, found: _Chain) -> None:
    info = found.info
    if info is None:
        return
    # vek.kind: SIGNING_KEY (0x48 bits 4:2) must name the key that signed
    want = {"vcek": SIGNING_KEY_VCEK, "vlek": SIGNING_KEY_VLEK}[info.kind]
    verdict.add(
        "vek.kind",
        report.signing_key == want,
        f"the report says {report.signing_key_kind.upper()} and a {info.kind.upper()} signed it"
        if report.signing_key == want
        else f"the report's SIGNING_KEY is {report.signing_key_kind.upper()}, "
        f"but the key certificate is a {info.kind.upper()}",
    )
    # vek.tcb: the certificate's TCB extensions equal REPORTED_TCB (not CURRENT_TCB)
    tcb = report.reported_tcb.as_dict()
    missing = [p for p in ("bl", "tee", "snp", "ucode") if p not in info.tcb]
    if report.reported_tcb.fmc is not None and "fmc" not in info.tcb:
        missing.append("fmc")
    diff = [f"{p} {tcb[p]} ≠ {info.tcb[p]}" for p in tcb if p in info.tcb and tcb[p] != info.tcb[p]]
    parts = ", ".join(f"{p}={v}" for p, v in tcb.items())
    if missing or diff:
        detail = "; ".join(
            (
                [
                    f"the certificate lacks TCB extension{'' if len(missing) == 1 else 's'} "
                    + ", ".join(missing)
                ]
                if missing
                else []
            )
            + ([f"REPORTED_TCB vs certificate: {', '.join(diff)}"] if diff else [])
        )
        verdict.add("vek.tcb", False, detail)
    else:
        verdict.add(
            "vek.tcb", True, f"REPORTED_TCB ({parts}, {report.reported_tcb.layout} layout) matches"
        )
    # vek.hwid: a VCEK is bound to one chip; a VLEK to a cloud provider (no hwID)
    if info.kind == "vlek":
        csp = f" (issued to {info.csp_id})" if info.csp_id else ""
        verdict.add(
            "vek.hwid",
            None,
            f"a VLEK carries no hwID{csp}: it is not bound to one chip, nothing to compare "
            "with CHIP_ID",
        )
    elif info.hwid is None:
        verdict.add("vek.hwid", False, "the VCEK has no hwID extension (1.3.6.1.4.1.3704.1.4)")
    else:
        hwid = info.hwid
        # A Turin VCEK carries CHIP_ID[0:8]; Milan's and Genoa's all 64 bytes of it. What is
        # compared comes from the product, never from the hwID: a short one is no match.
        turin = info.product == "Turin"
        chip = report.chip_id[:8] if turin else report.chip_id
        same = chip == hwid
        verdict.add(
            "vek.hwid",
            same,
            f"the VCEK's hwID equals CHIP_ID{' [0:8]' if turin else ''}"
            if same
            else f"the VCEK's hwID ({len(hwid)} bytes) {hwid.hex()} is not "
            f"CHIP_ID{'[0:8]' if turin else ''} {chip.hex()}"
            + (" (the host masked CHIP_ID)" if report.mask_chip_key else ""),
        )


def _facts(report: SnpReport) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "version": report.version,
        "measurement": report.measurement.hex(),
        "report_data": report.report_data.hex(),
        "host_data": report.host_data.hex(),
        "policy": f"{report.policy:#x}",
        "debug": report.debug,
        "migrate_ma": report.migrate_ma,
        "abi": f"{report.abi_major}.{report.abi_minor}",
        "smt_allowed": report.smt_allowed,
        "smt_enabled": report.smt_enabled,
        "single_socket": report.single_socket,
        "vmpl": report.vmpl,
        "guest_svn": report.guest_svn,
        "reported_tcb": report.reported_tcb.as_dict(),
        "current_tcb": report.current_tcb.as_dict(),
        "committed_tcb": report.committed_tcb.as_dict(),
        "launch_tcb": report.launch_tcb.as_dict(),
        "chip_id": report.chip_id.hex(),
        "id_key_digest": report.id_key_digest.hex(),
        "author_key_digest": report.author_key_digest.hex(),
        "family_id": report.family_id.hex(),
        "image_id": report.image_id.hex(),
        "platform_info": f"{report.platform_info:#x}",
        "report_signing_key": report.signing_key_kind,
        "firmware": f"{report.current_major}.{report.current_minor}.{report.current_build}",
        "committed_firmware": (
            f"{report.committed_major}.{report.committed_minor}.{report.committed_build}"
        ),
    }
    if report.cpuid_fam_id is not None:
        facts["cpuid"] = {
            "family": report.cpuid_fam_id,
            "model": report.cpuid_mod_id,
            "stepping": report.cpuid_step,
        }
    if report.launch_mit_vector is not None:
        facts["launch_mit_vector"] = f"{report.launch_mit_vector:#x}"
        facts["current_mit_vector"] = f"{report.current_mit_vector:#x}"
    return facts


def _check_revocation(verdict: Verdict, found: _Chain, crl: bytes | None, now: datetime) -> None:
    below = [(role, cert) for role, cert in (("ASK", found.ask), ("VEK", found.vek)) if cert]
    if found.info is not None:
        below = [(role if role == "ASK" else found.info.kind.upper(), cert) for role, cert in below]
    check_crl(verdict, crl, ark=found.ark, below=below, now=now)


def _need_aware(now: datetime) -> None:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime (the verification time)")


def verify_snp_chain(
    vek: bytes,
    chain: bytes,
    *,
    now: datetime,
    trusted_roots: Mapping[str, str] | None = None,
    crl: bytes | None = None,
) -> Verdict:
    """Check only ARK → ASK/ASVK → VCEK/VLEK at ``now`` (no report): the chain.* checks.

    ``trusted_roots`` maps a product name to the SHA-256 (hex) of its ARK's
    SubjectPublicKeyInfo; by default AMD's pinned Milan, Genoa and Turin ARKs. ``crl``:
    AMD's CRL for the product (DER or PEM), checked as in ``verify_snp``.
    """
    _need_aware(now)
    verdict = Verdict("snp")
    found = _check_chain(verdict, vek, chain, now, _roots(trusted_roots))
    _check_revocation(verdict, found, crl, now)
    _check_product(verdict, found, None)
    return verdict


def _roots(trusted_roots: Mapping[str, str] | None) -> Mapping[str, str]:
    return AMD_ARK_SPKI_SHA256 if trusted_roots is None else trusted_roots


def verify_snp(
    report: bytes | str,
    vek: bytes,
    chain: bytes,
    *,
    now: datetime,
    trusted_roots: Mapping[str, str] | None = None,
    crl: bytes | None = None,
) -> Verdict:
    """Verify an SEV-SNP report with its VCEK/VLEK (DER or PEM) and the AMD chain (PEM).

    ``chain`` holds the ASK or ASVK and the ARK, in any order (extra certificates are
    ignored). ``now`` is the verification time for every certificate's validity; it is
    required, and must be timezone-aware. ``trusted_roots`` maps a product name to the
    SHA-256 (hex) of its ARK's SubjectPublicKeyInfo (default: AMD's pinned ARKs). ``crl``
    is AMD's CRL for the product (DER or PEM; ``chain.revocation``); without it revocation
    is listed as not checked.

    Evidence that does not parse is a rejection (a failed ``report.parse`` check), not an
    exception. Raises ``ValueError`` only for a naive ``now``.
    """
    _need_aware(now)
    verdict = Verdict("snp")
    try:
        raw = _raw_report(report)
    except ValueError as exc:
        verdict.add("report.parse", False, str(exc))
        raw = None
    found = _check_chain(verdict, vek, chain, now, _roots(trusted_roots))
    _check_revocation(verdict, found, crl, now)
    if raw is None:
        _check_product(verdict, found, None)
        return verdict
    _check_signature(verdict, raw, found.vek)
    product = (
        found.info.product if found.info is not None and found.info.product else found.root_product
    )
    try:
        parsed = _parse(raw, product)
    except ValueError as exc:
        verdict.add("report.parse", False, str(exc))
        _check_product(verdict, found, None)
        return verdict
    _check_product(verdict, found, parsed)
    _check_vek_fields(verdict, parsed, found)
    chain_facts = dict(verdict.facts)
    verdict.facts = {**_facts(parsed), **chain_facts}
    return verdict
