"""Intel TDX quotes (DCAP quote v4 and v5): the structures and the parser, nothing more.

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
kept in ``TdxQuote.trailing``.

``parse_tdx_quote`` raises ``ValueError`` for structure only. It never checks a signature, a
certificate or a TCB level: ``attestation.tdx.verify_tdx`` judges the parsed quote.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "EnclaveReport",
    "QeReportCertificationData",
    "QuoteHeader",
    "QuoteSignatureData",
    "TdReport",
    "TdxQuote",
    "parse_tdx_quote",
]

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
                f"{field}: truncated: needs {size} byte{'' if size == 1 else 's'} at offset "
                f"{self.pos}, "
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
