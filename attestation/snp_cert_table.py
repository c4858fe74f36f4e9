"""The SEV-SNP certificate table: the certificates a host hands its guest with a report.

An extended report request (``SNP_GET_EXT_REPORT``, or configfs-tsm's ``auxblob``) returns,
beside the report, the table the host loaded for the guest (AMD's "SEV-SNP Firmware ABI"
and the GHCB specification, "SNP Extended Guest Request"): entries of a 16-byte GUID, a
32-bit offset and a 32-bit length (little-endian; the offset from the table's start), ended
by an all-zero entry, then the certificates, DER. The GUIDs name the VCEK (or a cloud's
VLEK), the ASK and the ARK. A host may give none, or only some: the guest keeps what it got.

Hand-written: no maintained Python library reads this table, and it is 24 bytes a row.
Outside bytes (the host writes it): every offset and length is checked against the table,
the rows are bounded, and each certificate must parse.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from cryptography.hazmat.primitives.serialization import Encoding

from attestation.certs import load_certs

__all__ = [
    "GUIDS",
    "CertTableError",
    "TableCert",
    "build_cert_table",
    "chain_pem",
    "read_cert_table",
]

#: The table's GUIDs (the GHCB specification, "SNP Extended Guest Request").
GUIDS: dict[uuid.UUID, str] = {
    uuid.UUID("63da758d-e664-4564-adc5-f4b93be8accd"): "vcek",
    uuid.UUID("a8074bc2-a25a-483e-aae6-39c045a0b8a1"): "vlek",
    uuid.UUID("4ab7b379-bbac-4fe4-a02f-05aef327c782"): "ask",
    uuid.UUID("c0b406a4-a803-4952-9743-3fb6014cd0ae"): "ark",
}
_ROW = 24
#: More rows than any host writes (four GUIDs are defined); past it the table is not one.
MAX_ROWS = 64


class CertTableError(ValueError):
    """A certificate table that cannot be read, naming the row and what is wrong."""


@dataclass(frozen=True)
class TableCert:
    name: str  # vcek, vlek, ask, ark, or the GUID of a row this code does not know
    der: bytes


def read_cert_table(table: bytes) -> list[TableCert]:
    """The certificates of ``table`` in its row order; an empty table gives none."""
    if not table.strip(b"\0"):
        return []
    rows: list[bytes] = []
    while True:
        start = len(rows) * _ROW
        entry = table[start : start + _ROW]
        if len(entry) < _ROW:
            raise CertTableError(f"row {len(rows)} runs past the table's {len(table)} bytes")
        if entry == bytes(_ROW):
            break
        if len(rows) == MAX_ROWS:
            raise CertTableError(f"no terminating row within {MAX_ROWS} rows")
        rows.append(entry)
    first = (len(rows) + 1) * _ROW  # the certificates start after the zero row
    certs: list[TableCert] = []
    for row, entry in enumerate(rows):
        guid = uuid.UUID(bytes_le=entry[:16])
        offset = int.from_bytes(entry[16:20], "little")
        length = int.from_bytes(entry[20:24], "little")
        name = GUIDS.get(guid, str(guid))
        if length == 0 or offset < first or offset + length > len(table):
            raise CertTableError(
                f"row {row} ({name}): offset {offset} and length {length} are outside the"
                f" table's certificates (bytes {first} to {len(table)})"
            )
        der = table[offset : offset + length]
        try:
            load_certs(der)  # AMD's VCEKs carry serial 0: read where that warning is silenced
        except ValueError as exc:
            raise CertTableError(f"row {row} ({name}) is not a DER certificate: {exc}") from None
        certs.append(TableCert(name, der))
    return certs


def chain_pem(certs: list[TableCert]) -> bytes:
    """The certificates as one PEM chain, as ``attest verify --certs`` and ``bind-check`` read
    it (the VCEK or VLEK first, then ASK, ARK)."""
    order = {"vcek": 0, "vlek": 0, "ask": 1, "ark": 2}
    ranked = sorted(certs, key=lambda c: order.get(c.name, 3))
    return b"".join(cert.public_bytes(Encoding.PEM) for c in ranked for cert in load_certs(c.der))


def build_cert_table(certs: list[tuple[str, bytes]]) -> bytes:
    """A table as a host writes it: ``(name, der)`` rows (names from :data:`GUIDS`). For the
    appliance's tests and for anyone who hands a guest its certificates."""
    by_name = {v: k for k, v in GUIDS.items()}
    header = (len(certs) + 1) * _ROW
    rows, blobs, offset = b"", b"", header
    for name, der in certs:
        rows += (
            by_name[name].bytes_le + offset.to_bytes(4, "little") + len(der).to_bytes(4, "little")
        )
        blobs += der
        offset += len(der)
    return rows + bytes(_ROW) + blobs
