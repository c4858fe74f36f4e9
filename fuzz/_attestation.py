"""Attestation seeds: evidence built in code (structure only, never signed), and the public
vectors' files read in place when ``../shared/vectors`` is present."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

from fuzz.common import VECTORS

#: The verification time every attestation target uses (inside the vectors' windows).
NOW = datetime(2025, 1, 1, tzinfo=UTC)


def vector(path: str) -> bytes | None:
    """One file of ``attestation/`` in the vectors, or None when it is not there."""
    file = VECTORS / "attestation" / path
    return file.read_bytes() if file.is_file() else None


def vectors(*paths: str) -> list[bytes]:
    return [data for data in map(vector, paths) if data is not None]


def snp_report(version: int) -> bytes:
    """A 0x4A0-byte SEV-SNP report of ``version`` with a Genoa CPUID and made-up fields."""
    raw = bytearray(0x4A0)
    struct.pack_into("<IIQ", raw, 0, version, 1, 0x30000)
    raw[0x188:0x18B] = bytes([0x19, 0x11, 0x01])
    raw[0x90:0xC0] = bytes(range(48))
    return bytes(raw)


def tdx_quote(version: int) -> bytes:
    """A TDX quote of ``version`` (4 or 5) laid out as ``attestation.tdx_quote`` reads it."""
    header = struct.pack("<HHI", version, 2, 0x81) + bytes(4) + bytes(16) + bytes(20)
    body = bytes(584)
    if version == 5:
        body = struct.pack("<HI", 2, 584) + body
    pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    qe = bytes(384) + bytes(64) + struct.pack("<H", 2) + b"\x01\x02"
    qe += struct.pack("<HI", 5, len(pem)) + pem
    signature_data = bytes(64) + bytes(64) + struct.pack("<HI", 6, len(qe)) + qe
    return header + body + struct.pack("<I", len(signature_data)) + signature_data


def spdm_evidence() -> bytes:
    """A GET_MEASUREMENTS request and MEASUREMENTS response, as ``attestation.nvidia`` reads."""
    request = bytes([0x11, 0xE0, 0x01, 0xFF]) + bytes(range(32)) + b"\x00"
    value = bytes(48)
    block = bytes([1, 1]) + struct.pack("<H", 3 + len(value)) + b"\x01"
    block += struct.pack("<H", len(value)) + value
    opaque = struct.pack("<HH", 1, 4) + b"535." + struct.pack("<HH", 2, 5) + b"96.00"
    response = bytes([0x11, 0x60, 0x00, 0x00, 1]) + len(block).to_bytes(3, "little") + block
    response += bytes(range(32)) + struct.pack("<H", len(opaque)) + opaque + bytes(96)
    return request + response
