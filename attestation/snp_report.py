"""AMD SEV-SNP attestation reports: the ATTESTATION_REPORT structure and its parser.

Parsing follows the SEV-SNP Firmware ABI specification (AMD publication 56860, rev. 1.58,
Table 23 "ATTESTATION_REPORT Structure", and Table 3 / the Turin variant for TCB_VERSION).
``load_report`` turns 0x4A0 bytes (or their hex text) into a frozen ``SnpReport`` and raises
``ValueError`` for structure only: wrong length, an unknown report version. Nothing here
checks the signature or a certificate: ``attestation.snp.verify_snp`` judges the report.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "REPORT_SIZE",
    "SIGNED_SIZE",
    "SUPPORTED_VERSIONS",
    "SnpReport",
    "TcbVersion",
    "decode_tcb",
    "load_report",
    "parse_report",
    "product_family",
    "product_from_cpuid",
]

REPORT_SIZE = 0x4A0  # ABI Table 23: the whole report
SIGNED_SIZE = 0x2A0  # the signature covers bytes [0, 0x2A0); SIGNATURE starts here
SUPPORTED_VERSIONS = (2, 3, 4, 5)  # 3 adds CPUID_*, 4 is laid out as 3, 5 adds MIT vectors

# ABI Table 23 offsets
_CPUID_OFFSET = 0x188  # CPUID_FAM_ID, CPUID_MOD_ID, CPUID_STEP (version 3 and later)
_MIT_OFFSET = 0x1F8  # LAUNCH_MIT_VECTOR, then CURRENT_MIT_VECTOR at 0x200 (version 5 and later)
_SIG_R_SIZE = 72  # ECDSA P-384 signature (ABI Table 141): r then s, 72 bytes each, little-endian

# GUEST_POLICY bits (ABI, "Guest Policy Structure")
POLICY_SMT = 1 << 16
POLICY_MIGRATE_MA = 1 << 18
POLICY_DEBUG = 1 << 19
POLICY_SINGLE_SOCKET = 1 << 20

# PLATFORM_INFO bits (ABI Table 23, 0x040)
PLATFORM_SMT_EN = 1 << 0  # SMT is enabled on the host

# SIGNING_KEY (bits 4:2 of the word at 0x48)
SIGNING_KEY_VCEK, SIGNING_KEY_VLEK, SIGNING_KEY_NONE = 0, 1, 7

Product = Literal["Milan", "Genoa", "Turin"]


# --- TCB_VERSION -------------------------------------------------------------------------


@dataclass(frozen=True)
class TcbVersion:
    """One TCB_VERSION (8 bytes, little-endian u64), decoded by the product's layout.

    Milan and Genoa (ABI Table 3): byte 0 BOOT_LOADER, 1 TEE, 2-5 reserved, 6 SNP,
    7 MICROCODE. Turin: byte 0 FMC, 1 BOOT_LOADER, 2 TEE, 3 SNP, 4-6 reserved, 7 MICROCODE.
    """

    raw: int
    layout: Literal["milan-genoa", "turin"]
    bl: int
    tee: int
    snp: int
    ucode: int
    fmc: int | None = None

    def as_dict(self) -> dict[str, int]:
        parts = {"bl": self.bl, "tee": self.tee, "snp": self.snp, "ucode": self.ucode}
        if self.fmc is not None:
            parts = {"fmc": self.fmc, **parts}
        return parts


def decode_tcb(raw: int, product: str | None) -> TcbVersion:
    """Decode a TCB_VERSION u64 with the layout of ``product`` (Turin, else Milan/Genoa)."""
    b = raw.to_bytes(8, "little")
    if product_family(product) == "Turin":
        return TcbVersion(raw, "turin", bl=b[1], tee=b[2], snp=b[3], ucode=b[7], fmc=b[0])
    return TcbVersion(raw, "milan-genoa", bl=b[0], tee=b[1], snp=b[6], ucode=b[7])


def product_family(name: str | None) -> Product | None:
    """``Milan-B0`` → ``Milan``; the product a VCEK's productName or an ARK belongs to."""
    if not name:
        return None
    head = name.split("-", 1)[0].strip().capitalize()
    if head in ("Milan", "Genoa", "Turin"):
        return head  # type: ignore[return-value]
    return None


def product_from_cpuid(family: int, model: int) -> Product | None:
    """CPUID family/model (report version 3 and later) → the SEV-SNP product."""
    if family == 0x19:
        if model >> 4 == 0x0:
            return "Milan"
        if model >> 4 in (0x1, 0xA):  # Genoa; Bergamo and Siena share Genoa's keys
            return "Genoa"
    if family == 0x1A:
        return "Turin"
    return None


# --- the report --------------------------------------------------------------------------


@dataclass(frozen=True)
class SnpReport:
    """An SEV-SNP ATTESTATION_REPORT (ABI Table 23); byte strings as they are in the report."""

    raw: bytes  # all 0x4A0 bytes
    version: int  # 0x000
    guest_svn: int  # 0x004
    policy: int  # 0x008, u64
    family_id: bytes  # 0x010, 16
    image_id: bytes  # 0x020, 16
    vmpl: int  # 0x030
    signature_algo: int  # 0x034 (1: ECDSA P-384 with SHA-384)
    current_tcb: TcbVersion  # 0x038
    platform_info: int  # 0x040, u64
    signer_info: int  # 0x048, u32: AUTHOR_KEY_EN bit 0, MASK_CHIP_KEY bit 1, SIGNING_KEY 4:2
    report_data: bytes  # 0x050, 64
    measurement: bytes  # 0x090, 48
    host_data: bytes  # 0x0C0, 32
    id_key_digest: bytes  # 0x0E0, 48
    author_key_digest: bytes  # 0x110, 48
    report_id: bytes  # 0x140, 32
    report_id_ma: bytes  # 0x160, 32
    reported_tcb: TcbVersion  # 0x180
    cpuid_fam_id: int | None  # 0x188 (version 3 and later)
    cpuid_mod_id: int | None  # 0x189
    cpuid_step: int | None  # 0x18A
    chip_id: bytes  # 0x1A0, 64
    committed_tcb: TcbVersion  # 0x1E0
    current_build: int  # 0x1E8
    current_minor: int  # 0x1E9
    current_major: int  # 0x1EA
    committed_build: int  # 0x1EC
    committed_minor: int  # 0x1ED
    committed_major: int  # 0x1EE
    launch_tcb: TcbVersion  # 0x1F0
    launch_mit_vector: int | None  # 0x1F8 (version 5 and later)
    current_mit_vector: int | None  # 0x200 (version 5 and later)
    signature_r: bytes  # 0x2A0, 72, little-endian
    signature_s: bytes  # 0x2E8, 72, little-endian

    @property
    def signed_bytes(self) -> bytes:
        return self.raw[:SIGNED_SIZE]

    @property
    def debug(self) -> bool:
        return bool(self.policy & POLICY_DEBUG)

    @property
    def migrate_ma(self) -> bool:
        return bool(self.policy & POLICY_MIGRATE_MA)

    @property
    def smt_allowed(self) -> bool:
        return bool(self.policy & POLICY_SMT)

    @property
    def single_socket(self) -> bool:
        return bool(self.policy & POLICY_SINGLE_SOCKET)

    @property
    def smt_enabled(self) -> bool:
        """PLATFORM_INFO bit 0: SMT is on in the host (the guest policy's SMT bit only
        permits it)."""
        return bool(self.platform_info & PLATFORM_SMT_EN)

    @property
    def abi_major(self) -> int:
        return (self.policy >> 8) & 0xFF

    @property
    def abi_minor(self) -> int:
        return self.policy & 0xFF

    @property
    def author_key_en(self) -> bool:
        return bool(self.signer_info & 1)

    @property
    def mask_chip_key(self) -> bool:
        return bool(self.signer_info & 2)

    @property
    def signing_key(self) -> int:
        """SIGNING_KEY: 0 VCEK, 1 VLEK, 7 none; 2-6 are reserved."""
        return (self.signer_info >> 2) & 7

    @property
    def signing_key_kind(self) -> str:
        return {SIGNING_KEY_VCEK: "vcek", SIGNING_KEY_VLEK: "vlek", SIGNING_KEY_NONE: "none"}.get(
            self.signing_key, f"reserved({self.signing_key})"
        )

    @property
    def cpuid_product(self) -> Product | None:
        """The product the report's CPUID names (version 3 and later), if a known one."""
        if self.cpuid_fam_id is None or self.cpuid_mod_id is None:
            return None
        return product_from_cpuid(self.cpuid_fam_id, self.cpuid_mod_id)

    def with_product(self, product: str | None) -> SnpReport:
        """The same report with its TCB fields decoded by ``product``'s layout."""
        return _parse(self.raw, product)


def _raw_report(data: bytes | str) -> bytes:
    """0x4A0 report bytes from raw bytes or their hex text (whitespace ignored)."""
    if isinstance(data, bytes | bytearray | memoryview):
        data = bytes(data)
        if len(data) == REPORT_SIZE:
            return data
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            text = None
    else:
        text = data
    if text is not None:
        digits = re.sub(r"\s+", "", text)
        if digits.lower().startswith("0x"):
            digits = digits[2:]
        if len(digits) == 2 * REPORT_SIZE and re.fullmatch(r"[0-9a-fA-F]*", digits):
            return bytes.fromhex(digits)
        if re.fullmatch(r"[0-9a-fA-F]+", digits):
            raise ValueError(
                f"an SEV-SNP report is {REPORT_SIZE:#x} ({REPORT_SIZE}) bytes, that is "
                f"{2 * REPORT_SIZE} hex digits; got {len(digits)} hex digits"
            )
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8"))
    raise ValueError(
        f"an SEV-SNP report is {REPORT_SIZE:#x} ({REPORT_SIZE}) bytes "
        f"(or {2 * REPORT_SIZE} hex digits); got {size} bytes"
    )


def _parse(raw: bytes, product: str | None) -> SnpReport:
    version = struct.unpack_from("<I", raw, 0)[0]
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(
            f"SEV-SNP report version {version} is not supported: this parser reads versions "
            f"{SUPPORTED_VERSIONS[0]}-{SUPPORTED_VERSIONS[-1]} (SEV-SNP ABI 1.58, Table 23)"
        )

    def u32(offset: int) -> int:
        value: int = struct.unpack_from("<I", raw, offset)[0]
        return value

    def u64(offset: int) -> int:
        value: int = struct.unpack_from("<Q", raw, offset)[0]
        return value

    def field(offset: int, size: int) -> bytes:
        return raw[offset : offset + size]

    cpuid = raw[_CPUID_OFFSET : _CPUID_OFFSET + 3] if version >= 3 else None
    if product is None and cpuid is not None:
        product = product_from_cpuid(cpuid[0], cpuid[1])

    def tcb(offset: int) -> TcbVersion:
        return decode_tcb(u64(offset), product)

    return SnpReport(
        raw=raw,
        version=version,
        guest_svn=u32(0x004),
        policy=u64(0x008),
        family_id=field(0x010, 16),
        image_id=field(0x020, 16),
        vmpl=u32(0x030),
        signature_algo=u32(0x034),
        current_tcb=tcb(0x038),
        platform_info=u64(0x040),
        signer_info=u32(0x048),
        report_data=field(0x050, 64),
        measurement=field(0x090, 48),
        host_data=field(0x0C0, 32),
        id_key_digest=field(0x0E0, 48),
        author_key_digest=field(0x110, 48),
        report_id=field(0x140, 32),
        report_id_ma=field(0x160, 32),
        reported_tcb=tcb(0x180),
        cpuid_fam_id=cpuid[0] if cpuid is not None else None,
        cpuid_mod_id=cpuid[1] if cpuid is not None else None,
        cpuid_step=cpuid[2] if cpuid is not None else None,
        chip_id=field(0x1A0, 64),
        committed_tcb=tcb(0x1E0),
        current_build=raw[0x1E8],
        current_minor=raw[0x1E9],
        current_major=raw[0x1EA],
        committed_build=raw[0x1EC],
        committed_minor=raw[0x1ED],
        committed_major=raw[0x1EE],
        launch_tcb=tcb(0x1F0),
        launch_mit_vector=u64(_MIT_OFFSET) if version >= 5 else None,
        current_mit_vector=u64(_MIT_OFFSET + 8) if version >= 5 else None,
        signature_r=field(SIGNED_SIZE, _SIG_R_SIZE),
        signature_s=field(SIGNED_SIZE + _SIG_R_SIZE, _SIG_R_SIZE),
    )


def load_report(data: bytes | str, *, product: str | None = None) -> SnpReport:
    """Parse an SEV-SNP attestation report: 0x4A0 raw bytes, or their hex text.

    TCB fields are decoded with ``product``'s layout; without it, with the layout of the
    product the report's CPUID names (version 3 and later), else Milan/Genoa's.

    Raises:
        ValueError: the data is not 0x4A0 bytes (nor 0x940 hex digits), or the report
            version is not one of ``SUPPORTED_VERSIONS``; the message says which.
    """
    return _parse(_raw_report(data), product)


def parse_report(data: bytes | str) -> SnpReport:
    """``load_report`` under the name the harness uses."""
    return load_report(data)
