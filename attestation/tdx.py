"""Intel TDX quotes (DCAP quote v4 and v5), checked offline.

The quote (raw bytes or hex text; every integer little-endian) is laid out as Intel's TDX
DCAP Quote Generation Library describes it:

    header (48): version (2) | attestation key type (2, 2 = ECDSA-256 P-256) | TEE type (4,
        0x81 = TDX) | reserved (4) | QE vendor id (16) | user data (20)
    v4: TD report body (584, TDX 1.0)
    v5: body type (2: 2 = TDX 1.0, 3 = TDX 1.5) | body size (4) | body (584 or 648; TDX 1.5
        adds TEE_TCB_SVN2 and MRSERVICETD)
    signature data length (4) | signature data:
        ECDSA P-256 signature r || s (64) over header || body (v5: with its type and size)
        | attestation key x || y (64) | certification data type (2, 6) | size (4) |
        QE report certification data: QE report (384) | its signature r || s (64, by the PCK
        key) | QE auth data size (2) | QE auth data | certification data type (2, 5) | size
        (4) | the PEM chain PCK certificate → Intel SGX PCK Platform/Processor CA → Intel SGX
        Root CA

Some collectors append bytes after the signature data; they are outside every signature,
tolerated and reported in the facts.

``verify_tdx`` checks the quote signature with the attestation key, the QE report signature
with the PCK leaf, that the QE report binds the attestation key (report_data[0:32] =
SHA-256(attestation key || QE auth data), the rest zero), and the PCK chain up to Intel's SGX
Root CA (pinned by the SHA-256 of its SubjectPublicKeyInfo) with every certificate valid at
the verification time. With Intel's collateral (see ``verify_tdx``) it also checks the TCB
info and QE identity signatures over their exact JSON text, their issuer chains, their
validity windows, the CRLs, the QE identity, the TDX module identity and the platform TCB
level, and reports Intel's TCB status with its advisories. Without collateral those checks
are listed as not checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.x509.oid import ExtensionOID, NameOID

from attestation.certs import load_certs, spki_sha256
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

#: SHA-256 of the SubjectPublicKeyInfo (DER) of "CN=Intel SGX Root CA, O=Intel Corporation,
#: L=Santa Clara, ST=CA, C=US", the self-signed ECDSA P-256 root of every PCK, TCB-signing and
#: CRL-signing chain (valid 2018-05-21 to 2049-12-31). This is Intel's public root,
#: https://certificates.trustedservices.intel.com/Intel_SGX_Provisioning_Certification_RootCA.pem
#: (the same key as the copies shipped by Phala-Network/dcap-qvl src/TrustedRootCA.der and
#: google/go-tdx-guest verify/trusted_root.pem, whose DER SHA-256 is
#: 44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3).
INTEL_SGX_ROOT_CA_SPKI_SHA256 = "a0af031289f5d5d4132f9186068a7fc13628633ba235777472e29b6b6c67a49e"

#: Intel's Quoting Enclave vendor id.
INTEL_QE_VENDOR_ID = bytes.fromhex("939a7233f79c4ca9940a0db3957f0607")
#: The Intel SGX extension of a PCK certificate and the OIDs read inside it.
SGX_EXTENSION_OID = x509.ObjectIdentifier("1.2.840.113741.1.13.1")
_SGX = "1.2.840.113741.1.13.1"
_OID_PPID = f"{_SGX}.1"
_OID_TCB = f"{_SGX}.2"
_OID_PCESVN = f"{_SGX}.2.17"
_OID_CPUSVN = f"{_SGX}.2.18"
_OID_PCEID = f"{_SGX}.3"
_OID_FMSPC = f"{_SGX}.4"
_OID_SGX_TYPE = f"{_SGX}.5"

#: Intel's TCB statuses, best first.
TCB_STATUSES = (
    "UpToDate",
    "SWHardeningNeeded",
    "ConfigurationNeeded",
    "ConfigurationAndSWHardeningNeeded",
    "OutOfDate",
    "OutOfDateConfigurationNeeded",
    "Revoked",
)

TDX_VERSIONS = (4, 5)
TEE_TYPE_TDX = 0x81
ATT_KEY_ECDSA_P256 = 2
HEADER_LENGTH = 48
TD10_LENGTH = 584
TD15_LENGTH = 648
BODY_LENGTHS = {2: TD10_LENGTH, 3: TD15_LENGTH}  # v5 body type → size (1 is an SGX report)
QE_REPORT_LENGTH = 384
SIGNATURE_LENGTH = 64
KEY_LENGTH = 64
CERT_QE_REPORT = 6
CERT_PCK_CHAIN = 5
PCK_LEAF_CN = "Intel SGX PCK Certificate"
PCK_CA_CNS = ("Intel SGX PCK Platform CA", "Intel SGX PCK Processor CA")
TCB_SIGNING_CN = "Intel SGX TCB Signing"
_NO_COLLATERAL = (
    "not checked: needs Intel's collateral (TCB info, QE identity, their issuer chains and "
    "CRLs) for this FMSPC"
)


# --------------------------------------------------------------------------- the structures


@dataclass(frozen=True)
class QuoteHeader:
    version: int
    att_key_type: int
    tee_type: int
    reserved: bytes  # 4 bytes (QE SVN and PCE SVN in SGX v3 quotes; reserved for TDX)
    qe_vendor_id: bytes  # 16
    user_data: bytes  # 20


@dataclass(frozen=True)
class TdReport:
    """The TD quote body (TDX 1.0: 584 bytes; TDX 1.5 adds the last two fields: 648)."""

    tee_tcb_svn: bytes  # 16: [0] TDX module SVN, [1] module major version, …
    mrseam: bytes  # 48
    mrsignerseam: bytes  # 48
    seam_attributes: bytes  # 8
    td_attributes: bytes  # 8; bit 0 is DEBUG
    xfam: bytes  # 8
    mrtd: bytes  # 48
    mrconfigid: bytes  # 48
    mrowner: bytes  # 48
    mrownerconfig: bytes  # 48
    rtmr0: bytes  # 48
    rtmr1: bytes
    rtmr2: bytes
    rtmr3: bytes
    report_data: bytes  # 64
    tee_tcb_svn2: bytes | None = None  # 16, TDX 1.5 only
    mrservicetd: bytes | None = None  # 48, TDX 1.5 only

    @property
    def debug(self) -> bool:
        """TD_ATTRIBUTES bit 0 (TUD.DEBUG): the host may read and change the TD's state."""
        return bool(self.td_attributes[0] & 0x01)

    @property
    def rtmrs(self) -> tuple[bytes, bytes, bytes, bytes]:
        return (self.rtmr0, self.rtmr1, self.rtmr2, self.rtmr3)


@dataclass(frozen=True)
class EnclaveReport:
    """An SGX enclave report body (384 bytes): here, the Quoting Enclave's."""

    cpu_svn: bytes  # 16
    miscselect: bytes  # 4, as in the report (little-endian u32)
    attributes: bytes  # 16
    mrenclave: bytes  # 32
    mrsigner: bytes  # 32
    isv_prod_id: int
    isv_svn: int
    report_data: bytes  # 64
    raw: bytes  # the 384 bytes the PCK key signs


@dataclass(frozen=True)
class QeReportCertificationData:
    """Certification data type 6: the QE report, its PCK signature, and the PCK chain."""

    qe_report: EnclaveReport
    qe_report_signature: bytes  # 64, r || s
    qe_auth_data: bytes
    certification_data_type: int  # 5: PEM chain PCK → CA → root
    certification_data: bytes

    @property
    def pck_chain_pem(self) -> bytes | None:
        if self.certification_data_type != CERT_PCK_CHAIN:
            return None
        return self.certification_data.rstrip(b"\x00")


@dataclass(frozen=True)
class QuoteSignatureData:
    signature: bytes  # 64, r || s, over header || body
    attestation_key: bytes  # 64, raw x || y on P-256
    certification_data_type: int  # 6
    qe_certification: QeReportCertificationData


@dataclass(frozen=True)
class TdxQuote:
    header: QuoteHeader
    body_type: int  # 2: TDX 1.0, 3: TDX 1.5 (a v4 quote's body is TDX 1.0)
    body: TdReport
    signature_data: QuoteSignatureData
    signed_bytes: bytes  # header || body (v5: with the body's type and size)
    trailing: bytes = b""  # after the signature data: signed by nothing


class _Reader:
    """Reads fixed-size fields from ``data[offset:end]``, naming the field when it is short."""

    def __init__(self, data: bytes, offset: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = offset
        self.end = len(data) if end is None else end

    @property
    def left(self) -> int:
        return self.end - self.pos

    def take(self, size: int, field: str) -> bytes:
        if size > self.left:
            raise ValueError(
                f"{field}: truncated: needs {size} byte(s) at offset {self.pos}, "
                f"{max(self.left, 0)} left"
            )
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def u16(self, field: str) -> int:
        value: int = struct.unpack("<H", self.take(2, field))[0]
        return value

    def u32(self, field: str) -> int:
        value: int = struct.unpack("<I", self.take(4, field))[0]
        return value


_HEX_TEXT = frozenset(b"0123456789abcdefABCDEF \t\r\n")


def _as_bytes(data: bytes | bytearray | memoryview | str) -> bytes:
    """Raw quote bytes, or hex text (whitespace and a leading 0x ignored) decoded."""
    if isinstance(data, str):
        text = "".join(data.split())
        text = text[2:] if text[:2].lower() == "0x" else text
        try:
            return bytes.fromhex(text)
        except ValueError:
            raise ValueError("quote: text that is not hex") from None
    raw = bytes(data)
    stripped = raw.strip()
    if stripped[:2].lower() == b"0x":
        stripped = stripped[2:]
    # A raw quote begins 04 00 or 05 00, never with hex digits, so hex text cannot be confused.
    if stripped and all(c in _HEX_TEXT for c in stripped):
        try:
            return bytes.fromhex(stripped.decode("ascii"))
        except ValueError:
            raise ValueError("quote: hex text with an odd number of digits") from None
    return raw


def _parse_td_report(raw: bytes, tdx15: bool) -> TdReport:
    r = _Reader(raw)

    def take(name: str, size: int) -> bytes:
        return r.take(size, f"body.{name}")

    return TdReport(
        tee_tcb_svn=take("tee_tcb_svn", 16),
        mrseam=take("mrseam", 48),
        mrsignerseam=take("mrsignerseam", 48),
        seam_attributes=take("seam_attributes", 8),
        td_attributes=take("td_attributes", 8),
        xfam=take("xfam", 8),
        mrtd=take("mrtd", 48),
        mrconfigid=take("mrconfigid", 48),
        mrowner=take("mrowner", 48),
        mrownerconfig=take("mrownerconfig", 48),
        rtmr0=take("rtmr0", 48),
        rtmr1=take("rtmr1", 48),
        rtmr2=take("rtmr2", 48),
        rtmr3=take("rtmr3", 48),
        report_data=take("report_data", 64),
        tee_tcb_svn2=take("tee_tcb_svn2", 16) if tdx15 else None,
        mrservicetd=take("mrservicetd", 48) if tdx15 else None,
    )


def _parse_enclave_report(raw: bytes) -> EnclaveReport:
    return EnclaveReport(
        cpu_svn=raw[0:16],
        miscselect=raw[16:20],
        attributes=raw[48:64],
        mrenclave=raw[64:96],
        mrsigner=raw[128:160],
        isv_prod_id=int.from_bytes(raw[256:258], "little"),
        isv_svn=int.from_bytes(raw[258:260], "little"),
        report_data=raw[320:384],
        raw=raw,
    )


def parse_tdx_quote(data: bytes | bytearray | memoryview | str) -> TdxQuote:
    """Parse a TDX quote (v4 or v5; raw bytes or hex text).

    Raises ``ValueError`` naming the field when the quote is truncated, is not a TDX ECDSA
    P-256 quote of version 4 or 5, or declares lengths that do not add up.
    """
    raw = _as_bytes(data)
    if not raw:
        raise ValueError("quote: empty")
    r = _Reader(raw)
    version = r.u16("header.version")
    if version not in TDX_VERSIONS:
        raise ValueError(
            f"header.version: {version} is not a TDX quote version (4 or 5; 3 is an SGX quote)"
        )
    att_key_type = r.u16("header.att_key_type")
    if att_key_type != ATT_KEY_ECDSA_P256:
        raise ValueError(
            f"header.att_key_type: {att_key_type} is not ECDSA-256 with P-256 ({ATT_KEY_ECDSA_P256})"
        )
    tee_type = r.u32("header.tee_type")
    if tee_type != TEE_TYPE_TDX:
        raise ValueError(f"header.tee_type: {tee_type:#x} is not TDX ({TEE_TYPE_TDX:#x})")
    header = QuoteHeader(
        version=version,
        att_key_type=att_key_type,
        tee_type=tee_type,
        reserved=r.take(4, "header.reserved"),
        qe_vendor_id=r.take(16, "header.qe_vendor_id"),
        user_data=r.take(20, "header.user_data"),
    )

    if version == 4:
        body_type, body_size = 2, TD10_LENGTH
    else:
        body_type = r.u16("body.type")
        if body_type not in BODY_LENGTHS:
            raise ValueError(
                f"body.type: {body_type} is not a TD report (2: TDX 1.0, 3: TDX 1.5; "
                "1 is an SGX enclave report)"
            )
        body_size = r.u32("body.size")
        if body_size != BODY_LENGTHS[body_type]:
            raise ValueError(
                f"body.size: {body_size} bytes for body type {body_type}; "
                f"expected {BODY_LENGTHS[body_type]}"
            )
    body = _parse_td_report(r.take(body_size, "body"), tdx15=body_type == 3)
    signed_length = r.pos

    sig_length = r.u32("signature_data.length")
    if sig_length > r.left:
        raise ValueError(
            f"signature_data.length: {sig_length} bytes declared, {r.left} left (truncated)"
        )
    sig_end = r.pos + sig_length
    s = _Reader(raw, r.pos, sig_end)
    signature = s.take(SIGNATURE_LENGTH, "signature_data.signature")
    attestation_key = s.take(KEY_LENGTH, "signature_data.attestation_key")
    cert_type = s.u16("certification_data.type")
    if cert_type != CERT_QE_REPORT:
        raise ValueError(
            f"certification_data.type: {cert_type}; a TDX quote carries type "
            f"{CERT_QE_REPORT} (QE report certification data)"
        )
    cert_size = s.u32("certification_data.size")
    if cert_size != s.left:
        raise ValueError(
            f"certification_data.size: {cert_size} bytes declared, the signature data "
            f"leaves {s.left}"
        )
    qe_report = _parse_enclave_report(s.take(QE_REPORT_LENGTH, "qe_report"))
    qe_report_signature = s.take(SIGNATURE_LENGTH, "qe_report_signature")
    auth_size = s.u16("qe_auth_data.size")
    qe_auth_data = s.take(auth_size, "qe_auth_data")
    inner_type = s.u16("qe_certification_data.type")
    inner_size = s.u32("qe_certification_data.size")
    if inner_size != s.left:
        raise ValueError(
            f"qe_certification_data.size: {inner_size} bytes declared, the certification "
            f"data leaves {s.left}"
        )
    inner = s.take(inner_size, "qe_certification_data")
    return TdxQuote(
        header=header,
        body_type=body_type,
        body=body,
        signature_data=QuoteSignatureData(
            signature=signature,
            attestation_key=attestation_key,
            certification_data_type=cert_type,
            qe_certification=QeReportCertificationData(
                qe_report=qe_report,
                qe_report_signature=qe_report_signature,
                qe_auth_data=qe_auth_data,
                certification_data_type=inner_type,
                certification_data=inner,
            ),
        ),
        signed_bytes=raw[:signed_length],
        trailing=raw[sig_end:],
    )


# --------------------------------------------------------------------------- PCK extension

# ``cryptography`` hands over an unknown extension only as its raw DER and exposes no ASN.1
# parser, and no dependency may be added for one structure. So this is a deliberately tiny DER
# reader for the one shape Intel's SGX extension has: a SEQUENCE of SEQUENCE { OID, value },
# one level nested for the TCB. It decodes definite lengths only (DER), single-byte tags,
# OIDs, non-negative INTEGER/ENUMERATED and OCTET STRINGs, and refuses anything else. No
# cryptography is done here; the certificate itself is parsed and checked by ``cryptography``.

_SEQUENCE, _OID, _INTEGER, _OCTETS, _ENUMERATED = 0x30, 0x06, 0x02, 0x04, 0x0A


def _der_items(data: bytes) -> list[tuple[int, bytes]]:
    """The (tag, contents) of each TLV laid end to end in ``data``."""
    items: list[tuple[int, bytes]] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 2:
            raise ValueError("DER: truncated tag or length")
        tag, length = data[pos], data[pos + 1]
        if tag & 0x1F == 0x1F:
            raise ValueError("DER: multi-byte tags are not used in the SGX extension")
        pos += 2
        if length & 0x80:
            count = length & 0x7F
            if count == 0 or count > 4 or pos + count > len(data):
                raise ValueError("DER: bad length")
            length = int.from_bytes(data[pos : pos + count], "big")
            pos += count
        if pos + length > len(data):
            raise ValueError("DER: contents run past the end")
        items.append((tag, data[pos : pos + length]))
        pos += length
    return items


def _der_oid(contents: bytes) -> str:
    if not contents:
        raise ValueError("DER: empty OID")
    arcs: list[int] = []
    value = 0
    for byte in contents:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    if contents[-1] & 0x80:
        raise ValueError("DER: truncated OID")
    first = arcs[0]
    head = [min(first // 40, 2), first - 40 * min(first // 40, 2)]
    return ".".join(str(a) for a in head + arcs[1:])


def _der_uint(contents: bytes) -> int:
    if not contents or contents[0] & 0x80:
        raise ValueError("DER: not a non-negative integer")
    return int.from_bytes(contents, "big")


def _der_pairs(contents: bytes) -> dict[str, tuple[int, bytes]]:
    """A SEQUENCE's contents, each item a SEQUENCE { OID, value }: OID → (tag, value)."""
    pairs: dict[str, tuple[int, bytes]] = {}
    for tag, item in _der_items(contents):
        inner = _der_items(item)
        if tag != _SEQUENCE or len(inner) != 2 or inner[0][0] != _OID:
            raise ValueError("DER: an item is not a SEQUENCE { OID, value }")
        pairs[_der_oid(inner[0][1])] = inner[1]
    return pairs


@dataclass(frozen=True)
class PckExtension:
    """What a PCK certificate's Intel SGX extension (1.2.840.113741.1.13.1) certifies."""

    cpusvn_components: tuple[int, ...]  # TCB .2.1 … .2.16
    pcesvn: int  # TCB .2.17
    cpusvn: bytes  # TCB .2.18
    pceid: bytes  # .3
    fmspc: bytes  # .4
    sgx_type: int | None  # .5 (0 Standard, 1 Scalable, 2 Scalable with integrity)


def parse_pck_extension(cert: x509.Certificate) -> PckExtension:
    """The SGX extension of a PCK certificate; ``ValueError`` if it is absent or malformed."""
    try:
        ext = cert.extensions.get_extension_for_oid(SGX_EXTENSION_OID)
    except x509.ExtensionNotFound:
        raise ValueError(f"no Intel SGX extension ({SGX_EXTENSION_OID.dotted_string})") from None
    if not isinstance(ext.value, x509.UnrecognizedExtension):
        raise ValueError("the SGX extension is not raw DER")
    top = _der_items(ext.value.value)
    if len(top) != 1 or top[0][0] != _SEQUENCE:
        raise ValueError("the SGX extension is not one SEQUENCE")
    pairs = _der_pairs(top[0][1])

    def need(oid: str, tag: int, name: str, where: dict[str, tuple[int, bytes]]) -> bytes:
        if oid not in where:
            raise ValueError(f"the SGX extension has no {name} ({oid})")
        got_tag, value = where[oid]
        if got_tag != tag:
            raise ValueError(f"the SGX extension's {name} has tag {got_tag:#x}, not {tag:#x}")
        return value

    tcb = _der_pairs(need(_OID_TCB, _SEQUENCE, "TCB", pairs))
    components = tuple(
        _der_uint(need(f"{_OID_TCB}.{i}", _INTEGER, f"TCB component {i}", tcb))
        for i in range(1, 17)
    )
    sgx_type = None
    if _OID_SGX_TYPE in pairs:
        sgx_type = _der_uint(need(_OID_SGX_TYPE, _ENUMERATED, "SGX type", pairs))
    return PckExtension(
        cpusvn_components=components,
        pcesvn=_der_uint(need(_OID_PCESVN, _INTEGER, "PCESVN", tcb)),
        cpusvn=need(_OID_CPUSVN, _OCTETS, "CPUSVN", tcb),
        pceid=need(_OID_PCEID, _OCTETS, "PCE-ID", pairs),
        fmspc=need(_OID_FMSPC, _OCTETS, "FMSPC", pairs),
        sgx_type=sgx_type,
    )


# --------------------------------------------------------------------------- certificates


def _cn(cert: x509.Certificate) -> str:
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else cert.subject.rfc4514_string()


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


# --------------------------------------------------------------------------- TCB status


_STATUS_FLAGS: dict[str, frozenset[str]] = {
    "UpToDate": frozenset(),
    "SWHardeningNeeded": frozenset({"sw"}),
    "ConfigurationNeeded": frozenset({"config"}),
    "ConfigurationAndSWHardeningNeeded": frozenset({"config", "sw"}),
    "OutOfDate": frozenset({"out"}),
    "OutOfDateConfigurationNeeded": frozenset({"out", "config"}),
    "Revoked": frozenset({"revoked"}),
}


def converge_tcb_status(*statuses: str) -> str:
    """One status from several (platform, TDX module, QE), as Intel's QVL converges them:
    Revoked wins; out of date with a configuration need is OutOfDateConfigurationNeeded;
    out of date subsumes SW hardening; otherwise the needs add up."""
    flags: set[str] = set()
    for status in statuses:
        if status not in _STATUS_FLAGS:
            raise ValueError(f"{status!r} is not one of Intel's TCB statuses")
        flags |= _STATUS_FLAGS[status]
    if "revoked" in flags:
        return "Revoked"
    if "out" in flags:
        return "OutOfDateConfigurationNeeded" if "config" in flags else "OutOfDate"
    if "config" in flags:
        return "ConfigurationAndSWHardeningNeeded" if "sw" in flags else "ConfigurationNeeded"
    return "SWHardeningNeeded" if "sw" in flags else "UpToDate"


# --------------------------------------------------------------------------- collateral


class _Bad(ValueError):
    """A collateral member that is missing or not what Intel publishes."""


def _exact_member(text: str, key: str) -> str | None:
    """The exact text of top-level member ``key``'s value in the JSON object ``text``.

    Walks the object with the standard decoder's ``raw_decode`` so the substring's offsets
    are the decoder's own: the bytes returned are the bytes in the document, never a
    re-serialisation. None when ``text`` is not an object or has no such member.
    """
    decoder = json.JSONDecoder()
    ws = " \t\r\n"
    n = len(text)

    def skip(i: int) -> int:
        while i < n and text[i] in ws:
            i += 1
        return i

    i = skip(0)
    if i >= n or text[i] != "{":
        return None
    i = skip(i + 1)
    try:
        while i < n and text[i] != "}":
            name, i = decoder.raw_decode(text, i)
            i = skip(i)
            if not isinstance(name, str) or i >= n or text[i] != ":":
                return None
            start = skip(i + 1)
            _, end = decoder.raw_decode(text, start)
            if name == key:
                return text[start:end]
            i = skip(end)
            if i < n and text[i] == ",":
                i = skip(i + 1)
    except json.JSONDecodeError:
        return None
    return None


def _text(value: Any, name: str) -> str:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise _Bad(f"{name}: not UTF-8 text") from None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping | list):
        raise _Bad(
            f"{name}: parsed JSON, not the exact text Intel signed: pass the text as published"
        )
    raise _Bad(f"{name}: a {type(value).__name__}, not text")


def _signature(value: Any, name: str) -> bytes:
    if isinstance(value, str):
        try:
            raw = bytes.fromhex(value.strip())
        except ValueError:
            raise _Bad(f"{name}: not hex") from None
    elif isinstance(value, bytes | bytearray):
        raw = bytes(value)
        if len(raw) == 2 * SIGNATURE_LENGTH:
            with contextlib.suppress(UnicodeDecodeError, ValueError):
                raw = bytes.fromhex(raw.decode("ascii"))
    else:
        raise _Bad(f"{name}: a {type(value).__name__}, not hex text or bytes")
    if len(raw) != SIGNATURE_LENGTH:
        raise _Bad(f"{name}: {len(raw)} bytes, not a 64-byte r || s")
    return raw


def _pem_chain(value: Any, name: str) -> list[x509.Certificate]:
    blob = value.encode() if isinstance(value, str) else value
    if not isinstance(blob, bytes | bytearray):
        raise _Bad(f"{name}: a {type(value).__name__}, not PEM")
    try:
        certs = load_certs(bytes(blob))
    except ValueError as exc:
        raise _Bad(f"{name}: the certificates do not parse: {exc}") from None
    if not certs:
        raise _Bad(f"{name}: no certificates")
    return certs


def _crl(value: Any, name: str) -> x509.CertificateRevocationList:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("-----BEGIN"):
            blob = text.encode()
        else:
            try:
                blob = bytes.fromhex(text)
            except ValueError:
                raise _Bad(f"{name}: neither PEM nor hex DER") from None
    elif isinstance(value, bytes | bytearray):
        blob = bytes(value)
    else:
        raise _Bad(f"{name}: a {type(value).__name__}, not a CRL")
    try:
        if blob.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_crl(blob)
        return x509.load_der_x509_crl(blob)
    except ValueError as exc:
        raise _Bad(f"{name}: does not parse as a CRL: {exc}") from None


@dataclass
class _Signed:
    """One signed collateral document: the exact text, its signature, its issuer chain."""

    name: str  # "tcb_info" or "qe_identity"
    member: str  # "tcbInfo" or "enclaveIdentity", in Intel's PCS responses
    text: str | None = None
    signature: bytes | None = None
    chain: list[x509.Certificate] | None = None
    problem: str | None = None  # why text/signature/chain is missing or unusable
    doc: dict[str, Any] | None = None  # the parsed text (only for reading its values)
    parse_problem: str | None = None
    authentic: bool = False  # signature, chain and pin all held


def _load_signed(members: Mapping[str, Any], name: str, member: str) -> _Signed:
    signed = _Signed(name, member)
    try:
        if name not in members:
            raise _Bad(f"the collateral has no {name}")
        text = _text(members[name], name)
        embedded_signature: str | None = None
        # Intel's PCS response itself ({"tcbInfo": {...}, "signature": "..."}): take the
        # exact substring Intel signed.
        inner = _exact_member(text, member)
        if inner is not None:
            sig = _exact_member(text, "signature")
            embedded_signature = json.loads(sig) if sig is not None else None
            text = inner
        signed.text = text
        sig_value = members.get(f"{name}_signature", embedded_signature)
        if sig_value is None:
            raise _Bad(f"the collateral has no {name}_signature")
        signed.signature = _signature(sig_value, f"{name}_signature")
        chain_key = f"{name}_issuer_chain"
        if chain_key not in members:
            raise _Bad(f"the collateral has no {chain_key}")
        signed.chain = _pem_chain(members[chain_key], chain_key)
    except _Bad as exc:
        signed.problem = str(exc)
    if signed.text is not None:
        try:
            doc = json.loads(signed.text)
        except ValueError as exc:
            signed.parse_problem = f"{name} is not JSON: {exc}"
        else:
            if isinstance(doc, dict):
                signed.doc = doc
            else:
                signed.parse_problem = f"{name} is not a JSON object"
    return signed


def _collateral_members(collateral: Mapping[str, Any] | bytes | str) -> Mapping[str, Any]:
    if isinstance(collateral, Mapping):
        return collateral
    if isinstance(collateral, bytes | bytearray | str):
        try:
            members = json.loads(collateral)
        except ValueError as exc:
            raise ValueError(f"collateral: not JSON: {exc}") from None
        if not isinstance(members, dict):
            raise ValueError("collateral: not a JSON object")
        return members
    raise ValueError(f"collateral: a {type(collateral).__name__}, not a mapping or JSON")


def _get(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise _Bad(f"{where} has no {key}")
    value = doc[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _Bad(f"{where}.{key} is not a {getattr(kind, '__name__', kind)}")
    return value


def _hex(doc: Mapping[str, Any], key: str, size: int, where: str) -> bytes:
    value = _get(doc, key, str, where)
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise _Bad(f"{where}.{key} is not hex") from None
    if len(raw) != size:
        raise _Bad(f"{where}.{key} is {len(raw)} bytes, not {size}")
    return raw


def _when(doc: Mapping[str, Any], key: str, where: str) -> datetime:
    value = _get(doc, key, str, where)
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _Bad(f"{where}.{key} {value!r} is not an RFC 3339 time") from None
    if when.tzinfo is None:
        raise _Bad(f"{where}.{key} {value!r} has no time zone")
    return when


def _status(level: Mapping[str, Any], where: str) -> tuple[str, list[str]]:
    status = _get(level, "tcbStatus", str, where)
    if status not in _STATUS_FLAGS:
        raise _Bad(f"{where}.tcbStatus {status!r} is not one of Intel's statuses")
    advisories = level.get("advisoryIDs", [])
    if not isinstance(advisories, list) or not all(isinstance(a, str) for a in advisories):
        raise _Bad(f"{where}.advisoryIDs is not a list of strings")
    return status, list(advisories)


def _svns(tcb: Mapping[str, Any], key: str, where: str) -> list[int]:
    comps = _get(tcb, key, list, where)
    if len(comps) != 16:
        raise _Bad(f"{where}.{key} has {len(comps)} components, not 16")
    out: list[int] = []
    for i, comp in enumerate(comps):
        if not isinstance(comp, dict):
            raise _Bad(f"{where}.{key}[{i}] is not an object")
        out.append(_get(comp, "svn", int, f"{where}.{key}[{i}]"))
    return out


# --------------------------------------------------------------------------- the verifier


class _Verifier:
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
                f"{len(q.trailing)} byte(s) after the signature data, outside every "
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
            f"all {len(chain.path)} certificate(s) are valid at {_iso(self.now)}"
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

    def check_signed(self, signed: _Signed, window: list[tuple[datetime, datetime, str]]) -> None:
        prefix = f"collateral.{signed.name}"
        member = signed.member
        if signed.problem is not None or signed.text is None or signed.signature is None:
            why = signed.problem or f"no {signed.name}"
            self.add(f"{prefix}_signature", False, why)
            self.add(f"{prefix}_chain", False, why)
            self.add(f"{prefix}_validity", False, why)
            return
        assert signed.chain is not None
        leaf = _pick_leaf(signed.chain)
        chain = _build_chain(leaf, signed.chain, self.anchor)
        if chain.pinned and self.root is None:
            self.root = chain.path[-1]
        key = _p256_key(leaf)
        sig_ok = key is not None and _p256_verify(key, signed.signature, signed.text.encode())
        size = len(signed.text.encode())
        self.add(
            f"{prefix}_signature",
            sig_ok,
            f"ECDSA P-256/SHA-256 over the exact {member} text ({size} bytes) verifies with "
            f"{_cn(leaf)}'s key"
            if sig_ok
            else f"the signature over the exact {member} text ({size} bytes) does not verify "
            f"with {_cn(leaf)}'s key",
        )
        problems = [chain.problem] if chain.problem else []
        if not chain.pinned:
            problems.append(chain.pin_detail)
        if _cn(leaf) != TCB_SIGNING_CN or _is_ca(leaf):
            problems.append(f"the signer {_cn(leaf)} is not the {TCB_SIGNING_CN!r} certificate")
        elif len(chain.path) != 2:
            problems.append("the signer is not issued directly by the root")
        problems += [f"not valid at {_iso(self.now)}: {e}" for e in _expired(chain.path, self.now)]
        names = " → ".join(_cn(c) for c in chain.path)
        self.add(
            f"{prefix}_chain",
            not problems,
            f"{names}: signed by the next, ending at {self.anchor.source}, valid at "
            f"{_iso(self.now)}"
            if not problems
            else f"{names}: " + "; ".join(problems),
        )
        signed.authentic = sig_ok and not problems
        if signed.doc is None:
            self.add(f"{prefix}_validity", False, signed.parse_problem or f"{member} unreadable")
            return
        try:
            issued = _when(signed.doc, "issueDate", member)
            next_update = _when(signed.doc, "nextUpdate", member)
        except _Bad as exc:
            self.add(f"{prefix}_validity", False, str(exc))
            return
        window.append((issued, next_update, member))
        ok = issued <= self.now <= next_update
        self.add(
            f"{prefix}_validity",
            ok,
            f"{member} issued {_iso(issued)}, next update {_iso(next_update)}: "
            + ("current at " if ok else "expired or not yet issued at ")
            + _iso(self.now),
        )

    def check_crls(
        self,
        members: Mapping[str, Any],
        signers: list[x509.Certificate],
        window: list[tuple[datetime, datetime, str]],
    ) -> None:
        root = self.root
        root_crl: x509.CertificateRevocationList | None = None
        pck_crl: x509.CertificateRevocationList | None = None

        # The root CA's CRL: signed by the pinned root; lists revoked intermediate CAs.
        if "root_ca_crl" not in members:
            self.add(
                "collateral.root_ca_crl", None, "the collateral has no root_ca_crl: not checked"
            )
        else:
            try:
                root_crl = _crl(members["root_ca_crl"], "root_ca_crl")
            except _Bad as exc:
                self.add("collateral.root_ca_crl", False, str(exc))
            else:
                if not self.crl_check(
                    "collateral.root_ca_crl",
                    root_crl,
                    [root] if root else [],
                    window,
                    root.subject if root else None,
                ):
                    root_crl = None  # not authentic or not current: it vouches for nothing

        # The PCK CA's CRL: signed by the CA that issued the PCK certificate.
        if "pck_crl" not in members:
            self.add("collateral.pck_crl", None, "the collateral has no pck_crl: not checked")
        else:
            try:
                pck_crl = _crl(members["pck_crl"], "pck_crl")
            except _Bad as exc:
                self.add("collateral.pck_crl", False, str(exc))
            else:
                candidates = list(signers)
                if "pck_crl_issuer_chain" in members:
                    try:
                        extra = _pem_chain(members["pck_crl_issuer_chain"], "pck_crl_issuer_chain")
                    except _Bad:
                        extra = []
                    for cert in extra:
                        if cert.subject == cert.issuer:
                            continue
                        if _build_chain(cert, extra, self.anchor).ok:
                            candidates.append(cert)
                expected = self.pck_leaf.issuer if self.pck_leaf is not None else None
                if not self.crl_check("collateral.pck_crl", pck_crl, candidates, window, expected):
                    pck_crl = None  # not authentic, not current, or another CA's list

        self.check_revocation(root_crl, pck_crl)

    def crl_check(
        self,
        name: str,
        crl: x509.CertificateRevocationList,
        candidates: list[x509.Certificate],
        window: list[tuple[datetime, datetime, str]],
        expected: x509.Name | None,
    ) -> bool:
        label = _cn_of(crl.issuer)
        problems: list[str] = []
        if expected is not None and crl.issuer != expected:
            problems.append(f"it is {label}'s, not {_cn_of(expected)}'s, as this quote needs")
        signer = None
        for cert in candidates:
            key = cert.public_key()
            if (
                cert.subject == crl.issuer
                and isinstance(key, ec.EllipticCurvePublicKey)
                and crl.is_signature_valid(key)
            ):
                signer = cert
                break
        if signer is None:
            problems.append(
                f"no trusted certificate named {label} verifies its signature"
                if candidates
                else f"no trusted {label} certificate to check it with"
            )
        this_update, next_update = crl.last_update_utc, crl.next_update_utc
        if next_update is None:
            problems.append("it has no nextUpdate")
        else:
            window.append((this_update, next_update, name.removeprefix("collateral.")))
            if not this_update <= self.now <= next_update:
                problems.append(
                    f"issued {_iso(this_update)}, next update {_iso(next_update)}: not current "
                    f"at {_iso(self.now)}"
                )
        self.add(
            name,
            not problems,
            f"{label}'s CRL ({len(crl)} revoked) is signed by {label} and current at "
            f"{_iso(self.now)} (next update {_iso(next_update) if next_update else '?'})"
            if not problems
            else f"{label}'s CRL: " + "; ".join(problems),
        )
        return not problems

    def check_revocation(
        self,
        root_crl: x509.CertificateRevocationList | None,
        pck_crl: x509.CertificateRevocationList | None,
    ) -> None:
        if root_crl is None and pck_crl is None:
            self.add("pck_chain.revocation", None, "no usable CRL: revocation not checked")
            return
        revoked: list[str] = []
        looked: list[str] = []
        path = self.pck_chain.path if self.pck_chain is not None else []
        if pck_crl is not None and path:
            looked.append(f"{_cn(path[0])} in {_cn_of(pck_crl.issuer)}'s CRL")
            if pck_crl.get_revoked_certificate_by_serial_number(path[0].serial_number):
                revoked.append(f"{_cn(path[0])} (serial {path[0].serial_number:x})")
        if root_crl is not None:
            for cert in [*path[1:], *self.signers_seen]:
                if cert.subject == cert.issuer or cert.issuer != root_crl.issuer:
                    continue
                looked.append(f"{_cn(cert)} in the root CA's CRL")
                if root_crl.get_revoked_certificate_by_serial_number(cert.serial_number):
                    revoked.append(f"{_cn(cert)} (serial {cert.serial_number:x})")
        missing = (
            "" if pck_crl is not None else "; the PCK certificate itself not checked (no PCK CRL)"
        )
        self.add(
            "pck_chain.revocation",
            not revoked,
            ("not revoked: " + ", ".join(dict.fromkeys(looked)) + missing)
            if not revoked
            else "revoked: " + ", ".join(revoked),
        )

    def check_qe_identity(self, signed: _Signed) -> tuple[str, list[str]] | None:
        name = "qe_identity"
        doc = signed.doc
        if doc is None:
            self.add(name, False, signed.parse_problem or signed.problem or "no QE identity")
            return None
        qe = self.quote.signature_data.qe_certification.qe_report
        w = "enclaveIdentity"
        try:
            ident = _get(doc, "id", str, w)
            if ident != "TD_QE":
                raise _Bad(f"{w}.id is {ident!r}, not the TDX Quoting Enclave's 'TD_QE'")
            mismatches: list[str] = []
            mrsigner = _hex(doc, "mrsigner", 32, w)
            if qe.mrsigner != mrsigner:
                mismatches.append(f"MRSIGNER {qe.mrsigner.hex()} is not {mrsigner.hex()}")
            prodid = _get(doc, "isvprodid", int, w)
            if qe.isv_prod_id != prodid:
                mismatches.append(f"ISVPRODID {qe.isv_prod_id} is not {prodid}")
            misc, misc_mask = _hex(doc, "miscselect", 4, w), _hex(doc, "miscselectMask", 4, w)
            if _masked(qe.miscselect, misc_mask) != _masked(misc, misc_mask):
                mismatches.append(f"MISCSELECT {qe.miscselect.hex()} under mask {misc_mask.hex()}")
            attrs, attrs_mask = _hex(doc, "attributes", 16, w), _hex(doc, "attributesMask", 16, w)
            if _masked(qe.attributes, attrs_mask) != _masked(attrs, attrs_mask):
                mismatches.append(
                    f"ATTRIBUTES {qe.attributes.hex()} under mask {attrs_mask.hex()} is not "
                    f"{_masked(attrs, attrs_mask).hex()}"
                )
            levels = _get(doc, "tcbLevels", list, w)
            found: tuple[str, list[str], str] | None = None
            for i, level in enumerate(levels):
                where = f"{w}.tcbLevels[{i}]"
                if not isinstance(level, dict):
                    raise _Bad(f"{where} is not an object")
                tcb = _get(level, "tcb", dict, where)
                if _get(tcb, "isvsvn", int, f"{where}.tcb") <= qe.isv_svn:
                    status, advisories = _status(level, where)
                    found = (status, advisories, str(level.get("tcbDate", "?")))
                    break
        except _Bad as exc:
            self.add(name, False, str(exc))
            return None
        if mismatches:
            self.add(
                name,
                False,
                "the QE report does not match the QE identity: " + "; ".join(mismatches),
            )
            return None
        if found is None:
            self.add(name, False, f"QE ISVSVN {qe.isv_svn} is below every QE identity TCB level")
            return None
        status, advisories, date = found
        self.facts["qe_tcb_status"] = status
        ok = status != "Revoked"
        self.add(
            name,
            ok,
            f"the QE matches Intel's TD_QE identity (MRSIGNER, ISVPRODID, MISCSELECT and "
            f"ATTRIBUTES under their masks); ISVSVN {qe.isv_svn}: {status} (TCB date {date})",
        )
        return (status, advisories) if ok else None

    def check_platform(self, doc: Mapping[str, Any] | None, why: str) -> bool:
        if doc is None:
            self.add("tcb_info.platform", False, why)
            return False
        ext = self.pck_ext
        if ext is None:
            self.add("tcb_info.platform", False, "no PCK SGX extension to compare with")
            return False
        w = "tcbInfo"
        try:
            ident = _get(doc, "id", str, w)
            version = _get(doc, "version", int, w)
            fmspc = _hex(doc, "fmspc", 6, w)
            pceid = _hex(doc, "pceId", 2, w)
        except _Bad as exc:
            self.add("tcb_info.platform", False, str(exc))
            return False
        problems: list[str] = []
        if ident != "TDX" or version < 3:
            problems.append(f"tcbInfo is {ident!r} version {version}, not TDX TCB info (version 3)")
        if fmspc != ext.fmspc:
            problems.append(f"its FMSPC {fmspc.hex()} is not the PCK's {ext.fmspc.hex()}")
        if pceid != ext.pceid:
            problems.append(f"its PCE-ID {pceid.hex()} is not the PCK's {ext.pceid.hex()}")
        self.facts["tcb_evaluation_data_number"] = doc.get("tcbEvaluationDataNumber")
        self.add(
            "tcb_info.platform",
            not problems,
            f"TDX TCB info v{version} for FMSPC {fmspc.hex()} and PCE-ID {pceid.hex()}: the PCK's own"
            if not problems
            else "; ".join(problems),
        )
        return not problems

    def check_tdx_module(
        self, doc: Mapping[str, Any] | None
    ) -> tuple[str, list[str]] | bool | None:
        """The TDX module's identity; returns its TCB status (None: it has none to add) or
        False when the check failed."""
        name = "tdx_module"
        if doc is None:
            self.add(name, False, "no readable tcbInfo")
            return False
        body = self.quote.body
        svn, major = body.tee_tcb_svn[0], body.tee_tcb_svn[1]
        w = "tcbInfo.tdxModule"
        try:
            base = _get(doc, "tdxModule", dict, "tcbInfo")
            mrsigner = _hex(base, "mrsigner", 48, w)
            attrs, mask = _hex(base, "attributes", 8, w), _hex(base, "attributesMask", 8, w)
            levels: list[Any] | None = None
            identity = None
            identities = doc.get("tdxModuleIdentities") or []
            if major > 0 and identities:
                if not isinstance(identities, list):
                    raise _Bad("tcbInfo.tdxModuleIdentities is not a list")
                identity = f"TDX_{major:02X}"
                entry = next(
                    (
                        e
                        for e in identities
                        if isinstance(e, dict) and str(e.get("id", "")).upper() == identity
                    ),
                    None,
                )
                if entry is None:
                    self.add(name, False, f"tcbInfo lists no TDX module identity {identity}")
                    return False
                w = f"tcbInfo.tdxModuleIdentities[{identity}]"
                mrsigner = _hex(entry, "mrsigner", 48, w)
                attrs, mask = _hex(entry, "attributes", 8, w), _hex(entry, "attributesMask", 8, w)
                levels = _get(entry, "tcbLevels", list, w)
            problems: list[str] = []
            if body.mrsignerseam != mrsigner:
                problems.append(f"MRSIGNERSEAM {body.mrsignerseam.hex()} is not {mrsigner.hex()}")
            if _masked(body.seam_attributes, mask) != _masked(attrs, mask):
                problems.append(
                    f"SEAMATTRIBUTES {body.seam_attributes.hex()} under mask {mask.hex()} are "
                    f"not {_masked(attrs, mask).hex()}"
                )
            found: tuple[str, list[str]] | None = None
            if levels is not None and not problems:
                for i, level in enumerate(levels):
                    where = f"{w}.tcbLevels[{i}]"
                    if not isinstance(level, dict):
                        raise _Bad(f"{where} is not an object")
                    tcb = _get(level, "tcb", dict, where)
                    if _get(tcb, "isvsvn", int, f"{where}.tcb") <= svn:
                        found = _status(level, where)
                        break
                if found is None:
                    problems.append(f"module ISVSVN {svn} is below every {identity} TCB level")
        except _Bad as exc:
            self.add(name, False, str(exc))
            return False
        if problems:
            self.add(name, False, "; ".join(problems))
            return False
        self.facts["tdx_module_identity"] = identity
        if found is None:
            self.add(
                name,
                True,
                f"MRSIGNERSEAM and SEAMATTRIBUTES match tcbInfo.tdxModule (module version {major}: "
                "no module identity TCB levels to apply)",
            )
            return None
        status = found[0]
        self.facts["tdx_module_tcb_status"] = status
        ok = status != "Revoked"
        self.add(
            name,
            ok,
            f"the TDX module matches {identity} (MRSIGNERSEAM, SEAMATTRIBUTES); ISVSVN {svn}: "
            f"{status}",
        )
        return found if ok else False

    def check_tcb_level(
        self,
        tcb_signed: _Signed,
        module: tuple[str, list[str]] | bool | None,
        qe: tuple[str, list[str]] | None,
        platform_ok: bool,
    ) -> None:
        name = "tcb_level"
        doc = tcb_signed.doc
        ext = self.pck_ext
        if doc is None or ext is None:
            why = tcb_signed.parse_problem or tcb_signed.problem or "no PCK SGX extension"
            self.add(name, False, why)
            return
        if not platform_ok:
            self.add(
                name,
                False,
                "not evaluated: this TCB info is not for this platform (see tcb_info.platform)",
            )
            return
        tee = list(self.quote.body.tee_tcb_svn)
        start = 2 if tee[1] > 0 else 0  # a module version > 0: its SVN is the module identity's
        try:
            levels = _get(doc, "tcbLevels", list, "tcbInfo")
            matched: tuple[str, list[str], str] | None = None
            closest = ""
            for i, level in enumerate(levels):
                where = f"tcbInfo.tcbLevels[{i}]"
                if not isinstance(level, dict):
                    raise _Bad(f"{where} is not an object")
                tcb = _get(level, "tcb", dict, where)
                sgx = _svns(tcb, "sgxtcbcomponents", f"{where}.tcb")
                tdx = _svns(tcb, "tdxtcbcomponents", f"{where}.tcb")
                pcesvn = _get(tcb, "pcesvn", int, f"{where}.tcb")
                short = [
                    f"sgxtcbcomponents[{j}]: {have} < {want}"
                    for j, (have, want) in enumerate(zip(ext.cpusvn_components, sgx, strict=True))
                    if have < want
                ]
                if ext.pcesvn < pcesvn:
                    short.append(f"pcesvn: {ext.pcesvn} < {pcesvn}")
                short += [
                    f"tdxtcbcomponents[{j}]: TEE_TCB_SVN {tee[j]} < {tdx[j]}"
                    for j in range(start, 16)
                    if tee[j] < tdx[j]
                ]
                if not short:
                    status, advisories = _status(level, where)
                    matched = (status, advisories, str(level.get("tcbDate", "?")))
                    break
                closest = f"lowest, level {i} ({level.get('tcbStatus')}), needs " + ", ".join(short)
        except _Bad as exc:
            self.add(name, False, str(exc))
            return
        if matched is None:
            self.add(
                name,
                False,
                f"no TCB level matches (TCB not supported): the PCK's SGX components "
                f"{list(ext.cpusvn_components)}, PCESVN {ext.pcesvn}, TEE_TCB_SVN "
                f"{self.quote.body.tee_tcb_svn.hex()}; the {closest}",
            )
            return
        status, advisories, date = matched
        self.facts["platform_tcb_status"] = status
        statuses = [status]
        all_advisories = list(advisories)
        for extra in (module, qe):
            if isinstance(extra, tuple):
                statuses.append(extra[0])
                all_advisories += [a for a in extra[1] if a not in all_advisories]
        final = converge_tcb_status(*statuses)
        authentic = tcb_signed.authentic
        if authentic:
            self.facts["tcb_status"] = final
            self.facts["advisory_ids"] = all_advisories
            self.facts["tcb_date"] = date
        ok = final != "Revoked"
        adv = f"; advisories {', '.join(all_advisories)}" if all_advisories else "; no advisories"
        self.add(
            name,
            ok,
            f"TCB level {status} (TCB date {date}) matches the PCK's SGX components, PCESVN "
            f"{ext.pcesvn} and TEE_TCB_SVN; with the TDX module and QE: {final}{adv}"
            + ("" if authentic else " (from a tcbInfo that is not authenticated)"),
        )

    def check_collateral(self, collateral: Mapping[str, Any] | bytes | str) -> None:
        members = _collateral_members(collateral)
        window: list[tuple[datetime, datetime, str]] = []
        tcb = _load_signed(members, "tcb_info", "tcbInfo")
        qe = _load_signed(members, "qe_identity", "enclaveIdentity")
        self.check_signed(tcb, window)
        self.check_signed(qe, window)
        self.signers_seen = [c for s in (tcb, qe) for c in (s.chain or []) if c.subject != c.issuer]
        pck_ca = (
            self.pck_chain.path[1:2] if self.pck_chain is not None and self.pck_chain.ok else []
        )
        self.check_crls(members, pck_ca, window)
        qe_status = self.check_qe_identity(qe)
        why = tcb.parse_problem or tcb.problem or "no readable tcbInfo"
        platform_ok = self.check_platform(tcb.doc, why)
        module = self.check_tdx_module(tcb.doc)
        self.check_tcb_level(tcb, module, qe_status, platform_ok)
        if window:
            self.facts["collateral_valid_from"] = _iso(max(w[0] for w in window))
            self.facts["collateral_valid_until"] = _iso(min(w[1] for w in window))


def _masked(value: bytes, mask: bytes) -> bytes:
    return bytes(v & m for v, m in zip(value, mask, strict=True))


def _cn_of(name: x509.Name) -> str:
    cns = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else name.rfc4514_string()


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
    are listed as not checked.

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
