"""The Intel SGX extension of a PCK certificate: what the certificate says about the platform.

A TDX quote's PCK certificate carries, in extension 1.2.840.113741.1.13.1, the platform's FMSPC,
PCE-ID, PCESVN and the 16 CPUSVN components that Intel's TCB levels are matched against. This
module only reads that extension; it never checks a signature or a chain
(``attestation.tdx`` does).
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography import x509

__all__ = ["SGX_EXTENSION_OID", "PckExtension", "parse_pck_extension"]

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
