"""NVIDIA H100 GPU evidence: the SPDM GET_MEASUREMENTS exchange, checked offline.

The evidence (raw bytes or hex text) is the SPDM 1.1 GET_MEASUREMENTS *request* the verifier
sent (37 bytes: version, code 0xE0, param1 with bit 0 "signature requested", param2 the
measurement operation, the 32-byte nonce, the slot id) followed by the GPU's MEASUREMENTS
*response* (DMTF DSP0274 1.1; every multi-byte integer little-endian):

    version (1) | code 0x60 (1) | param1 (1) | param2 (1) | number of blocks (1)
    | measurement record length (3) | measurement record | nonce (32)
    | opaque data length (2) | opaque data | signature (96: ECDSA P-384 r || s, big-endian)

A measurement block is index (1) | measurement specification (1, bit 0 = DMTF) | size (2) |
the DMTF measurement: value type (1) | value size (2) | value. NVIDIA's opaque data is a
sequence of TLVs, type (u16) | size (u16) | value (driver version, VBIOS version, FWID, …;
the type numbers are those of NVIDIA's nvtrust verifier). Everything is parsed by its length
fields, never by assuming the signature is the last 96 bytes: some collectors append zero
padding (tolerated, and reported in the facts); any other trailing byte is refused.

``verify_nvidia`` checks the signature over request || response-without-signature with the
leaf certificate's key (SHA-384), the certificate chain up to NVIDIA's Device Identity CA
(pinned by the SHA-256 of its SubjectPublicKeyInfo), every certificate's validity at the
verification time, the nonce, and that the leaf's TCG DICE FWID equals the FWID the GPU
reports in its opaque data. Given NVIDIA's reference integrity manifests (RIMs, the
``--rim`` files; ``attestation.nvidia_rim``), it checks their signatures and compares every
measurement index they hold active; without them the RIM checks are listed as not checked.
OCSP revocation needs NVIDIA's service: it is listed as not checked.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.x509.oid import ExtensionOID

from attestation.certs import load_certs, spki_sha256
from attestation.nvidia_chain import (
    TCG_DICE_FWID_OID,
    build_chain,
    cert_name,
    extension,
    is_ca,
    pick_leaf,
    self_signed,
)
from attestation.verdict import Verdict

if TYPE_CHECKING:
    from attestation.nvidia_rim import Rim

__all__ = [
    "NVIDIA_DEVICE_ROOT_SPKI_SHA256",
    "OPAQUE_TYPES",
    "TCG_DICE_FWID_OID",
    "MeasurementBlock",
    "MeasurementsRequest",
    "MeasurementsResponse",
    "NvidiaEvidence",
    "OpaqueField",
    "format_vbios_version",
    "parse_nvidia_evidence",
    "spki_sha256",
    "verify_nvidia",
]

#: SHA-256 of the SubjectPublicKeyInfo (DER) of "CN=NVIDIA Device Identity CA, O=NVIDIA", the
#: self-signed ECDSA P-384 root of every NVIDIA GPU's device identity chain (valid 2021-11-05 to
#: 9999-12-31). Derived from NVIDIA's published root,
#: https://github.com/NVIDIA/nvtrust/blob/main/guest_tools/gpu_verifiers/local_gpu_verifier/src/verifier/certs/verifier_device_root.pem
#: (the file whose SHA-256 is 6e6e91e84068cb7de2c715ca73d6df168a16b23d96a895b42e553b297a471bfc;
#: last changed in nvtrust commit 77e4b8660b011e2955923d71f02504c6a0b4f990).
NVIDIA_DEVICE_ROOT_SPKI_SHA256 = "a90c4eb5acfd3e3d03a25db6a26b84f720ad0503196c627c21ddd48dd85b06a4"

#: The TCG DICE TcbInfo extension; its last 48 bytes are the firmware's SHA-384 FWID.

REQUEST_LENGTH = 37
SIGNATURE_LENGTH = 96
NONCE_LENGTH = 32
FWID_LENGTH = 48
SPDM_VERSIONS = (0x11, 0x12)  # 1.1 and 1.2 share this layout (1.3 adds a requester context)
GET_MEASUREMENTS = 0xE0
MEASUREMENTS = 0x60
DMTF_SPECIFICATION = 0x01

#: NVIDIA's opaque data types (nvtrust's OPAQUE_FIELD_ID_* numbering).
OPAQUE_TYPES: dict[int, str] = {
    1: "CERT_ISSUER_NAME",
    2: "CERT_AUTHORITY_KEY_IDENTIFIER",
    3: "DRIVER_VERSION",
    4: "GPU_INFO",
    5: "SKU",
    6: "VBIOS_VERSION",
    7: "MANUFACTURER_ID",
    8: "TAMPER_DETECTION",
    9: "SMC",
    10: "VPR",
    11: "NVDEC0_STATUS",
    12: "MSRSCNT",
    13: "CPRINFO",
    14: "BOARD_ID",
    15: "CHIP_SKU",
    16: "CHIP_SKU_MOD",
    17: "PROJECT",
    18: "PROJECT_SKU",
    19: "PROJECT_SKU_MOD",
    20: "FWID",
    21: "PROTECTED_PCIE_STATUS",
    22: "SWITCH_PDI",
    23: "FLOORSWEPT_PORTS",
    24: "POSITION_ID",
    25: "LOCK_SWITCH_STATUS",
    32: "GPU_LINK_CONN",
    33: "SYS_ENABLE_STATUS",
    34: "OPAQUE_DATA_VERSION",
    35: "CHIP_INFO",
    36: "FEATURE_FLAG",
    255: "INVALID",
}
_BY_NAME = {name: number for number, name in OPAQUE_TYPES.items()}
#: Opaque fields that are NUL-terminated text, reported as facts under these keys.
_TEXT_FACTS = {
    "DRIVER_VERSION": "driver_version",
    "PROJECT": "project",
    "PROJECT_SKU": "project_sku",
    "PROJECT_SKU_MOD": "project_sku_mod",
    "CHIP_SKU": "chip_sku",
    "CHIP_SKU_MOD": "chip_sku_mod",
}
_HEX_TEXT = frozenset(b"0123456789abcdefABCDEF \t\r\n")
#: The request: version, code, param1, param2 (1 byte each), the nonce (32), the slot id (1).
_REQUEST_LAYOUT = struct.Struct("<4B32sB")


# --------------------------------------------------------------------------- the format


@dataclass(frozen=True)
class MeasurementsRequest:
    """The SPDM GET_MEASUREMENTS request, as the verifier sent it (the first 37 bytes)."""

    version: int
    code: int
    param1: int  # bit 0: a signature was requested
    param2: int  # the measurement operation: 0xFF all blocks, 0 the count, else one index
    nonce: bytes  # 32 bytes, the verifier's freshness
    slot_id: int
    raw: bytes


@dataclass(frozen=True)
class MeasurementBlock:
    """One measurement block with its DMTF measurement."""

    index: int
    specification: int  # bit 0: DMTF
    value_type: int  # DMTFSpecMeasurementValueType: bit 7 raw bit stream, bits 0-6 the kind
    value: bytes


@dataclass(frozen=True)
class OpaqueField:
    """One NVIDIA opaque data entry (type, value)."""

    type: int
    value: bytes

    @property
    def name(self) -> str:
        return OPAQUE_TYPES.get(self.type, f"TYPE_{self.type}")


@dataclass(frozen=True)
class MeasurementsResponse:
    """The SPDM MEASUREMENTS response; ``signed`` is everything before the signature."""

    version: int
    code: int
    param1: int
    param2: int
    blocks: tuple[MeasurementBlock, ...]
    nonce: bytes  # the responder's nonce
    opaque: tuple[OpaqueField, ...]
    signature: bytes  # 96 bytes: r || s, big-endian
    signed: bytes

    def opaque_value(self, name: str) -> bytes | None:
        number = _BY_NAME[name]
        return next((f.value for f in self.opaque if f.type == number), None)


@dataclass(frozen=True)
class NvidiaEvidence:
    request: MeasurementsRequest
    response: MeasurementsResponse
    trailing_padding: int  # zero bytes after the signature (tolerated, reported)

    @property
    def signed_bytes(self) -> bytes:
        """What the signature covers: request || response without its signature."""
        return self.request.raw + self.response.signed


class _Reader:
    """Bounds-checked little-endian reads; a short read names the field."""

    def __init__(self, data: bytes, offset: int = 0, end: int | None = None) -> None:
        self.data, self.pos = data, offset
        self.end = len(data) if end is None else end

    def take(self, size: int, field: str) -> bytes:
        if size > self.end - self.pos:
            raise ValueError(
                f"{field}: needs {size} bytes at offset {self.pos}, "
                f"only {max(self.end - self.pos, 0)} remain"
            )
        out = self.data[self.pos : self.pos + size]
        self.pos += size
        return out

    def uint(self, size: int, field: str) -> int:
        return int.from_bytes(self.take(size, field), "little")


def _as_bytes(data: bytes | str) -> bytes:
    """Hex text (whitespace ignored) or raw bytes."""
    if isinstance(data, str):
        data = data.encode("ascii", errors="replace")
    text = data.strip()
    if text and all(c in _HEX_TEXT for c in text):
        digits = bytes(c for c in text if c not in b" \t\r\n")
        if len(digits) % 2:
            raise ValueError(f"evidence: hex text with an odd number of digits ({len(digits)})")
        return bytes.fromhex(digits.decode("ascii"))
    return bytes(data)


def _parse_request(data: bytes) -> MeasurementsRequest:
    if len(data) < REQUEST_LENGTH:
        raise ValueError(
            f"request: the evidence is {len(data)} bytes, shorter than the "
            f"{REQUEST_LENGTH}-byte GET_MEASUREMENTS request"
        )
    # all 37 bytes are there (checked above), so no field can run short: no reader needed
    version, code, param1, param2, nonce, slot_id = _REQUEST_LAYOUT.unpack_from(data)
    if version not in SPDM_VERSIONS:
        raise ValueError(f"request.version: 0x{version:02x} is not SPDM 1.1 or 1.2 (0x11, 0x12)")
    if code != GET_MEASUREMENTS:
        raise ValueError(f"request.code: 0x{code:02x} is not GET_MEASUREMENTS (0xe0)")
    if not param1 & 1:
        raise ValueError(
            f"request.param1: 0x{param1:02x} does not request a signature (bit 0), so the "
            "request has no nonce and the response is not signed"
        )
    return MeasurementsRequest(version, code, param1, param2, nonce, slot_id, data[:REQUEST_LENGTH])


def _parse_blocks(r: _Reader, count: int, end: int) -> tuple[MeasurementBlock, ...]:
    blocks: list[MeasurementBlock] = []
    seen: set[int] = set()
    for n in range(count):
        where = f"measurement block {n + 1} of {count}"
        index = r.uint(1, f"{where}: index")
        spec = r.uint(1, f"{where}: measurement specification")
        size = r.uint(2, f"{where}: measurement size")
        if spec != DMTF_SPECIFICATION:
            raise ValueError(f"{where}: measurement specification 0x{spec:02x} is not DMTF (0x01)")
        if index in seen:
            raise ValueError(f"{where}: index {index} appears twice")
        seen.add(index)
        body = _Reader(r.take(size, f"{where} (index {index}): measurement"))
        value_type = body.uint(1, f"{where} (index {index}): DMTF value type")
        value_size = body.uint(2, f"{where} (index {index}): DMTF value size")
        value = body.take(value_size, f"{where} (index {index}): DMTF value")
        if body.pos != len(body.data):
            raise ValueError(
                f"{where} (index {index}): measurement size {size} but its DMTF value is "
                f"{value_size} bytes (expected size {value_size + 3})"
            )
        blocks.append(MeasurementBlock(index, spec, value_type, value))
    if r.pos != end:
        raise ValueError(
            f"response.measurement_record_length: the {count} blocks leave {end - r.pos} "
            "bytes of the measurement record unused"
        )
    return tuple(blocks)


def _parse_opaque(data: bytes) -> tuple[OpaqueField, ...]:
    r = _Reader(data)
    fields: list[OpaqueField] = []
    seen: set[int] = set()
    while r.pos < len(data):
        at = r.pos
        kind = r.uint(2, f"opaque data: the type of the entry at offset {at}")
        name = OPAQUE_TYPES.get(kind, f"TYPE_{kind}")
        size = r.uint(2, f"opaque data: the size of {name} at offset {at}")
        value = r.take(size, f"opaque data: {name} at offset {at}")
        if kind in seen:
            raise ValueError(f"opaque data: {name} (type {kind}) appears twice")
        seen.add(kind)
        fields.append(OpaqueField(kind, value))
    return tuple(fields)


def _parse_response(data: bytes, start: int) -> tuple[MeasurementsResponse, int]:
    """The response from ``start``; returns it and the offset just past its signature."""
    r = _Reader(data, start)
    if r.end == start:
        raise ValueError("response: the evidence ends after the request; no MEASUREMENTS response")
    version = r.uint(1, "response.version")
    code = r.uint(1, "response.code")
    param1, param2 = r.uint(1, "response.param1"), r.uint(1, "response.param2")
    if code != MEASUREMENTS:
        raise ValueError(f"response.code: 0x{code:02x} is not MEASUREMENTS (0x60)")
    if version not in SPDM_VERSIONS:
        raise ValueError(f"response.version: 0x{version:02x} is not SPDM 1.1 or 1.2")
    count = r.uint(1, "response.number_of_blocks")
    length = r.uint(3, "response.measurement_record_length")
    if length > r.end - r.pos:
        raise ValueError(
            f"response.measurement_record_length: {length} bytes, but only "
            f"{r.end - r.pos} remain in the evidence"
        )
    record_end = r.pos + length
    blocks = _parse_blocks(_Reader(data, r.pos, record_end), count, record_end)
    r.pos = record_end
    nonce = r.take(NONCE_LENGTH, "response.nonce")
    opaque_length = r.uint(2, "response.opaque_length")
    opaque = _parse_opaque(r.take(opaque_length, "response.opaque_data"))
    signed_end = r.pos
    signature = r.take(SIGNATURE_LENGTH, "response.signature")
    response = MeasurementsResponse(
        version, code, param1, param2, blocks, nonce, opaque, signature, data[start:signed_end]
    )
    return response, r.pos


def parse_nvidia_evidence(data: bytes | str) -> NvidiaEvidence:
    """Parse request + response by their length fields; ``ValueError`` names a bad field."""
    raw = _as_bytes(data)
    request = _parse_request(raw)
    response, end = _parse_response(raw, REQUEST_LENGTH)
    if response.version != request.version:
        raise ValueError(
            f"response.version: 0x{response.version:02x} differs from the request's "
            f"0x{request.version:02x}"
        )
    trailing = raw[end:]
    if trailing.strip(b"\x00"):
        first = end + next(i for i, b in enumerate(trailing) if b)
        raise ValueError(
            f"trailing bytes: {len(trailing)} bytes follow the signature (at offset {end}) "
            f"and are not zero padding (a non-zero byte at offset {first})"
        )
    return NvidiaEvidence(request, response, len(trailing))


def format_vbios_version(value: bytes) -> str:
    """The VBIOS version as NVIDIA prints it, e.g. ``96.00.9F.00.01``.

    The 8-byte field holds the version as a little-endian u32 (bytes 0..3: 96.00.9F.00 read
    from the top byte down) followed by the OEM byte (byte 4).
    """
    if len(value) != 8:
        return value.hex().upper()
    return ".".join(f"{b:02X}" for b in (value[3], value[2], value[1], value[0], value[4]))


def _text(value: bytes) -> str:
    text = value.partition(b"\x00")[0]
    try:
        decoded = text.decode("ascii")
    except UnicodeDecodeError:
        return value.hex()
    return decoded if decoded.isprintable() else value.hex()


def _facts(evidence: NvidiaEvidence) -> dict[str, Any]:
    req, resp = evidence.request, evidence.response
    facts: dict[str, Any] = {
        "spdm_version": f"0x{req.version:02x}",
        "nonce": req.nonce.hex(),
        "responder_nonce": resp.nonce.hex(),
        "slot_id": req.slot_id,
        "measurement_operation": f"0x{req.param2:02x}",
        "measurement_blocks": len(resp.blocks),
        "measurements": {str(b.index): b.value.hex() for b in resp.blocks},
        "trailing_padding": evidence.trailing_padding,
    }
    raw_types = {b.value_type for b in resp.blocks}
    facts["measurement_value_types"] = sorted(f"0x{t:02x}" for t in raw_types)
    for name, key in _TEXT_FACTS.items():
        value = resp.opaque_value(name)
        if value is not None:
            facts[key] = _text(value)
    vbios = resp.opaque_value("VBIOS_VERSION")
    if vbios is not None:
        facts["vbios_version"] = format_vbios_version(vbios)
    fwid = resp.opaque_value("FWID")
    if fwid is not None:
        facts["fwid"] = fwid.hex()
    version = resp.opaque_value("OPAQUE_DATA_VERSION")
    if version is not None:
        facts["opaque_data_version"] = int.from_bytes(version, "little")
    facts["opaque"] = {f.name: f.value.hex() for f in resp.opaque}
    if evidence.trailing_padding:
        facts["trailing_padding_note"] = (
            f"{evidence.trailing_padding} zero byte{'' if evidence.trailing_padding == 1 else 's'}"
            " after the signature, outside what the "
            "signature covers: tolerated as padding"
        )
    return facts


# --------------------------------------------------------------------------- the checks


def _fwid_from_cert(cert: x509.Certificate) -> bytes | None:
    ext = extension(cert, TCG_DICE_FWID_OID)
    if ext is None or not isinstance(ext.value, x509.UnrecognizedExtension):
        return None
    value = ext.value.value
    return value[-FWID_LENGTH:] if len(value) >= FWID_LENGTH else None


def _check_signature(verdict: Verdict, ev: NvidiaEvidence, leaf: x509.Certificate | None) -> None:
    name = "report_signature"
    if leaf is None:
        verdict.add(name, False, "no leaf certificate to check the SPDM signature with")
        return
    key = leaf.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        verdict.add(name, False, f"the leaf {cert_name(leaf)} has no ECDSA P-384 key")
        return
    sig = ev.response.signature
    r = int.from_bytes(sig[:48], "big")
    s = int.from_bytes(sig[48:], "big")
    try:
        key.verify(encode_dss_signature(r, s), ev.signed_bytes, ec.ECDSA(hashes.SHA384()))
    except InvalidSignature:
        verdict.add(
            name,
            False,
            f"the ECDSA P-384/SHA-384 signature over the request and response "
            f"({len(ev.signed_bytes)} bytes) does not verify with {cert_name(leaf)}'s key",
        )
        return
    verdict.add(
        name,
        True,
        f"ECDSA P-384/SHA-384 over request || response ({len(ev.signed_bytes)} bytes) "
        f"verifies with {cert_name(leaf)}'s key",
    )


def _check_chain(
    verdict: Verdict,
    certs: bytes,
    now: datetime,
    trusted_root: bytes | None,
) -> x509.Certificate | None:
    """The chain checks; returns the leaf (None if there is none)."""
    try:
        pool = load_certs(certs)
    except ValueError as exc:
        verdict.add("chain", False, f"the certificates do not parse: {exc}")
        verdict.add("chain.root_pinned", False, "no certificates")
        verdict.add("chain.leaf", False, "no certificates")
        verdict.add("chain.validity", None, "no certificates")
        return None
    extra_root: x509.Certificate | None = None
    if trusted_root is not None:
        try:
            extra_root = load_certs(trusted_root)[0]
        except ValueError as exc:
            raise ValueError(f"trusted_root: not a certificate: {exc}") from None
        pin, pin_source = spki_sha256(extra_root), f"the given trusted root {cert_name(extra_root)}"
    else:
        pin, pin_source = NVIDIA_DEVICE_ROOT_SPKI_SHA256, "the pinned NVIDIA Device Identity CA"

    leaf = pick_leaf(pool)
    path, problem = build_chain(leaf, pool, extra_root)
    names = " → ".join(cert_name(c) for c in path)
    verdict.facts["chain"] = [c.subject.rfc4514_string() for c in path]
    unused = [c for c in pool if c not in path]
    if unused:
        verdict.facts["unused_certificates"] = [c.subject.rfc4514_string() for c in unused]
    if problem is None and len(path) < 2:
        problem = f"only the root {cert_name(leaf)} was given: no device certificate"
    verdict.add(
        "chain",
        problem is None,
        f"{names}: each certificate signed by the next, ending at a self-signed root"
        if problem is None
        else f"{names}: {problem}",
    )

    top = path[-1]
    if not self_signed(top):
        verdict.add(
            "chain.root_pinned", False, f"the chain stops at {cert_name(top)}, not at a root"
        )
    else:
        found = spki_sha256(top)
        verdict.add(
            "chain.root_pinned",
            found == pin,
            f"the root {cert_name(top)} is {pin_source} (SPKI SHA-256 {found})"
            if found == pin
            else f"the root {cert_name(top)} (SPKI SHA-256 {found}) is not {pin_source} ({pin})",
        )

    leaf_problems: list[str] = []
    if is_ca(leaf):
        leaf_problems.append("is a CA certificate, not the device's end-entity (FMC) certificate")
    if extension(leaf, TCG_DICE_FWID_OID) is None:
        leaf_problems.append(f"has no TCG DICE FWID extension ({TCG_DICE_FWID_OID.dotted_string})")
    ku = extension(leaf, ExtensionOID.KEY_USAGE)
    if ku is not None and isinstance(ku.value, x509.KeyUsage) and not ku.value.digital_signature:
        leaf_problems.append("may not sign (key usage)")
    verdict.add(
        "chain.leaf",
        not leaf_problems,
        f"the leaf {cert_name(leaf)} is an end-entity certificate with a FWID extension"
        if not leaf_problems
        else f"the leaf {cert_name(leaf)} " + "; ".join(leaf_problems),
    )

    expired = [
        f"{cert_name(c)} (valid {c.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} to "
        f"{c.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ})"
        for c in path
        if not c.not_valid_before_utc <= now <= c.not_valid_after_utc
    ]
    verdict.add(
        "chain.validity",
        not expired,
        f"{_all_certificates(len(path))} valid at {now:%Y-%m-%dT%H:%M:%SZ}"
        if not expired
        else f"not valid at {now:%Y-%m-%dT%H:%M:%SZ}: " + ", ".join(expired),
    )
    return leaf


def _check_nonce(verdict: Verdict, ev: NvidiaEvidence, nonce: bytes | None) -> None:
    got = ev.request.nonce
    if nonce is None:
        verdict.add(
            "nonce",
            None,
            f"no expected nonce was given: freshness not checked (the request's nonce is "
            f"{got.hex()})",
        )
    elif nonce == got:
        verdict.add("nonce", True, f"the request's nonce is the expected {got.hex()}")
    else:
        verdict.add(
            "nonce",
            False,
            f"the request's nonce {got.hex()} is not the expected {nonce.hex()}"
            + (f" ({len(nonce)} bytes; SPDM nonces are 32)" if len(nonce) != NONCE_LENGTH else ""),
        )


def _check_fwid(verdict: Verdict, ev: NvidiaEvidence, leaf: x509.Certificate | None) -> None:
    reported = ev.response.opaque_value("FWID")
    certified = _fwid_from_cert(leaf) if leaf is not None else None
    if reported is None:
        verdict.add("fwid", False, "the opaque data carries no FWID (type 20)")
    elif certified is None:
        where = cert_name(leaf) if leaf is not None else "no leaf certificate"
        verdict.add("fwid", False, f"{where}: no TCG DICE FWID ({TCG_DICE_FWID_OID.dotted_string})")
    elif reported == certified:
        verdict.add("fwid", True, f"the leaf's TCG DICE FWID equals the reported {reported.hex()}")
    else:
        verdict.add(
            "fwid",
            False,
            f"the leaf's FWID {certified.hex()} differs from the reported {reported.hex()}",
        )


def _rim_checks(verdict: Verdict, ev: NvidiaEvidence, rims: Sequence[Rim], now: datetime) -> None:
    """The RIM checks from the given RIM files (``attestation.nvidia_rim``)."""
    from attestation.nvidia_rim import check_rims  # lazily: it imports this module

    facts = verdict.facts
    check_rims(
        verdict,
        rims,
        measurements={b.index: b.value for b in ev.response.blocks},
        driver_version=facts.get("driver_version"),
        vbios_version=facts.get("vbios_version"),
        nvdec0_status=ev.response.opaque_value("NVDEC0_STATUS"),
        now=now,
    )


def _online_checks(verdict: Verdict, online: bool, rims: bool) -> None:
    facts = verdict.facts
    if online:
        why = "online verification is not available in this build: no network"
        for name in (() if rims else ("rim.driver", "rim.vbios")) + ("ocsp",):
            verdict.add(name, None, why)
        return
    if not rims:
        verdict.add(
            "rim.driver",
            None,
            f"not checked offline: the measurements were not compared with NVIDIA's driver "
            f"RIM (driver {facts.get('driver_version', '?')}); --rim FILE compares them",
        )
        verdict.add(
            "rim.vbios",
            None,
            f"not checked offline: the measurements were not compared with NVIDIA's VBIOS RIM "
            f"(VBIOS {facts.get('vbios_version', '?')}); --rim FILE compares them",
        )
    verdict.add(
        "ocsp",
        None,
        "not checked offline: the certificates' revocation status was not asked of "
        "NVIDIA's OCSP service; --online would ask it",
    )


def verify_nvidia(
    evidence: bytes,
    certs: bytes,
    *,
    now: datetime,
    nonce: bytes | None = None,
    online: bool = False,
    trusted_root: bytes | None = None,
    rims: Sequence[Rim] = (),
) -> Verdict:
    """Verify NVIDIA GPU SPDM evidence against its certificate chain (PEM, any order).

    Raises ``ValueError`` when the evidence does not parse (naming the field), ``now`` has
    no time zone, ``trusted_root`` is not a certificate or two RIMs of one kind are given;
    everything else, unparseable ``certs`` included, is a check in the returned verdict.
    ``trusted_root`` (a PEM or DER certificate) replaces the pinned NVIDIA device root, for
    tests; it may also complete a chain given without its root. ``rims`` (parsed by
    ``attestation.nvidia_rim.parse_rim``) are checked against NVIDIA's pinned RIM root and
    compared at ``now``. ``online`` is accepted, but this build has no network: OCSP (and the
    RIM checks, without ``rims``) are then listed as not checked, saying so.
    """
    if now.tzinfo is None:
        raise ValueError("now: a time without a time zone")
    ev = parse_nvidia_evidence(evidence)
    verdict = Verdict("nvidia")
    verdict.facts.update(_facts(ev))
    leaf = _check_chain(verdict, certs, now, trusted_root)
    # The signature first in the list: it is the check everything else hangs on.
    before = len(verdict.checks)
    _check_signature(verdict, ev, leaf)
    verdict.checks.insert(0, verdict.checks.pop(before))
    _check_nonce(verdict, ev, nonce)
    _check_fwid(verdict, ev, leaf)
    if rims:
        _rim_checks(verdict, ev, rims, now)
    _online_checks(verdict, online, bool(rims))
    return verdict


def _all_certificates(n: int) -> str:
    """``all 2 certificates are`` (``the 1 certificate is``): the validity line's subject."""
    return "the 1 certificate is" if n == 1 else f"all {n} certificates are"
