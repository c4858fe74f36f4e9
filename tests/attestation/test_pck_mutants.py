"""The PCK certificate's Intel SGX extension, read member by member (``attestation.pck``).

Why: Intel's vectors carry one well-formed extension, so the small DER reader's edges (long
lengths, a length that runs past the end, a multi-byte tag, an OID's first arcs) and each
refusal were never shown. Here the extension is written byte by byte (SGX PCK Certificate
and CRL Profile: a SEQUENCE of SEQUENCE { OID, value }, the TCB one level down) into a real
certificate that ``cryptography`` builds, and every member and message is compared.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from attestation.pck import (
    SGX_EXTENSION_OID,
    PckExtension,
    _der_items,
    _der_oid,
    _der_uint,
    parse_pck_extension,
)

SGX = "1.2.840.113741.1.13.1"
SEQ, OID, INT, OCTETS, ENUM = 0x30, 0x06, 0x02, 0x04, 0x0A
COMPONENTS = (0, 1, 2, 127, 128, 200, 255, 7, 8, 9, 10, 11, 12, 13, 14, 15)


def _tlv(tag: int, body: bytes) -> bytes:
    n = len(body)
    if n < 0x80:
        return bytes([tag, n]) + body
    width = (n.bit_length() + 7) // 8
    return bytes([tag, 0x80 | width]) + n.to_bytes(width, "big") + body


def _oid(dotted: str) -> bytes:
    """An OID's DER contents (X.690 8.19): the first two arcs as 40 × a + b, base 128."""
    arcs = [int(a) for a in dotted.split(".")]
    out = b""
    for arc in [40 * arcs[0] + arcs[1], *arcs[2:]]:
        chunk = [arc & 0x7F]
        arc >>= 7
        while arc:
            chunk.append(0x80 | (arc & 0x7F))
            arc >>= 7
        out += bytes(reversed(chunk))
    return out


def _uint(value: int) -> bytes:
    return value.to_bytes(value.bit_length() // 8 + 1, "big")


def _pair(oid: str, tag: int, value: bytes) -> bytes:
    return _tlv(SEQ, _tlv(OID, _oid(oid)) + _tlv(tag, value))


def _members(**change: bytes | None) -> dict[str, bytes]:
    """The extension's pairs by name, each encoded; ``change`` replaces one (None: drops it)."""
    tcb = {f"c{i}": _pair(f"{SGX}.2.{i}", INT, _uint(v)) for i, v in enumerate(COMPONENTS, 1)}
    tcb["pcesvn"] = _pair(f"{SGX}.2.17", INT, _uint(0x0B0C))
    tcb["cpusvn"] = _pair(f"{SGX}.2.18", OCTETS, bytes(range(16)))
    tcb.update({k: v for k, v in change.items() if k in tcb and v is not None})
    tcb = {k: v for k, v in tcb.items() if change.get(k, b"") is not None}
    members = {
        "ppid": _pair(f"{SGX}.1", OCTETS, b"P" * 16),
        "tcb": _tlv(SEQ, _tlv(OID, _oid(f"{SGX}.2")) + _tlv(SEQ, b"".join(tcb.values()))),
        "pceid": _pair(f"{SGX}.3", OCTETS, b"\x00\x01"),
        "fmspc": _pair(f"{SGX}.4", OCTETS, bytes.fromhex("00906ED50000")),
        "sgx_type": _pair(f"{SGX}.5", ENUM, b"\x01"),
    }
    members.update({k: v for k, v in change.items() if k in members and v is not None})
    return {k: v for k, v in members.items() if change.get(k, b"") is not None}


def _extension(**change: bytes | None) -> bytes:
    return _tlv(SEQ, b"".join(_members(**change).values()))


def _cert(extension: bytes | None) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Intel SGX PCK Certificate")])
    start = datetime(2025, 1, 1, tzinfo=UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=1))
    )
    if extension is not None:
        ext = x509.UnrecognizedExtension(SGX_EXTENSION_OID, extension)
        builder = builder.add_extension(ext, critical=False)
    return builder.sign(key, hashes.SHA256())


def _problem(extension: bytes | None) -> str:
    with pytest.raises(ValueError) as raised:
        parse_pck_extension(_cert(extension))
    return str(raised.value)


def test_every_member_is_read() -> None:
    assert len(_extension()) > 0x100  # long-form lengths, two bytes
    assert parse_pck_extension(_cert(_extension())) == PckExtension(
        cpusvn_components=COMPONENTS,
        pcesvn=0x0B0C,
        cpusvn=bytes(range(16)),
        pceid=b"\x00\x01",
        fmspc=bytes.fromhex("00906ED50000"),
        sgx_type=1,
    )


def test_members_in_any_order_and_no_sgx_type() -> None:
    members = _members(sgx_type=None)
    ext = _tlv(SEQ, b"".join(reversed(members.values())))
    parsed = parse_pck_extension(_cert(ext))
    assert parsed.sgx_type is None
    assert parsed.fmspc == bytes.fromhex("00906ED50000")
    assert parsed.cpusvn_components == COMPONENTS


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"fmspc": None}, f"the SGX extension has no FMSPC ({SGX}.4)"),
        ({"pceid": None}, f"the SGX extension has no PCE-ID ({SGX}.3)"),
        ({"tcb": None}, f"the SGX extension has no TCB ({SGX}.2)"),
        ({"c1": None}, f"the SGX extension has no TCB component 1 ({SGX}.2.1)"),
        ({"c16": None}, f"the SGX extension has no TCB component 16 ({SGX}.2.16)"),
        ({"pcesvn": None}, f"the SGX extension has no PCESVN ({SGX}.2.17)"),
        ({"cpusvn": None}, f"the SGX extension has no CPUSVN ({SGX}.2.18)"),
        (
            {"fmspc": _pair(f"{SGX}.4", INT, b"\x01")},
            "the SGX extension's FMSPC has tag 0x2, not 0x4",
        ),
        (
            {"pceid": _pair(f"{SGX}.3", INT, b"\x01")},
            "the SGX extension's PCE-ID has tag 0x2, not 0x4",
        ),
        (
            {"tcb": _pair(f"{SGX}.2", OCTETS, b"\x01")},
            "the SGX extension's TCB has tag 0x4, not 0x30",
        ),
        (
            {"c3": _pair(f"{SGX}.2.3", ENUM, b"\x01")},
            "the SGX extension's TCB component 3 has tag 0xa, not 0x2",
        ),
        (
            {"pcesvn": _pair(f"{SGX}.2.17", OCTETS, b"\x01")},
            "the SGX extension's PCESVN has tag 0x4, not 0x2",
        ),
        (
            {"cpusvn": _pair(f"{SGX}.2.18", INT, b"\x01")},
            "the SGX extension's CPUSVN has tag 0x2, not 0x4",
        ),
        (
            {"sgx_type": _pair(f"{SGX}.5", INT, b"\x01")},
            "the SGX extension's SGX type has tag 0x2, not 0xa",
        ),
        ({"c2": _pair(f"{SGX}.2.2", INT, b"\x80")}, "DER: not a non-negative integer"),
        ({"pcesvn": _pair(f"{SGX}.2.17", INT, b"")}, "DER: not a non-negative integer"),
        ({"sgx_type": _pair(f"{SGX}.5", ENUM, b"\xff")}, "DER: not a non-negative integer"),
        (
            {"ppid": _tlv(0x31, _tlv(OID, _oid(f"{SGX}.1")) + _tlv(OCTETS, b"P"))},
            "DER: an item is not a SEQUENCE { OID, value }",
        ),
        (
            {"ppid": _tlv(SEQ, _tlv(OID, _oid(f"{SGX}.1")))},
            "DER: an item is not a SEQUENCE { OID, value }",
        ),
        (
            {"ppid": _pair(f"{SGX}.1", OCTETS, b"P") + b"\x05\x00"},
            "DER: an item is not a SEQUENCE { OID, value }",
        ),
        (
            {"ppid": _tlv(SEQ, _tlv(OID, _oid(f"{SGX}.1")) * 2 + _tlv(OCTETS, b"P"))},
            "DER: an item is not a SEQUENCE { OID, value }",
        ),
        (
            {"ppid": _tlv(SEQ, _tlv(OCTETS, _oid(f"{SGX}.1")) + _tlv(OCTETS, b"P"))},
            "DER: an item is not a SEQUENCE { OID, value }",
        ),
    ],
)
def test_each_refusal_word_for_word(change: dict[str, bytes | None], problem: str) -> None:
    assert _problem(_extension(**change)) == problem


def test_an_extension_that_is_not_one_sequence() -> None:
    one = _extension()
    assert _problem(one + one) == "the SGX extension is not one SEQUENCE"
    assert _problem(bytes([0x31]) + one[1:]) == "the SGX extension is not one SEQUENCE"
    assert _problem(None) == f"no Intel SGX extension ({SGX})"


@pytest.mark.parametrize(
    ("data", "items"),
    [
        (b"", []),
        (b"\x04\x00", [(4, b"")]),
        (b"\x04\x02\xaa\xbb\x05\x00", [(4, b"\xaa\xbb"), (5, b"")]),
        (b"\x04\x81\x01\xaa", [(4, b"\xaa")]),
        (b"\x04\x82\x00\x00", [(4, b"")]),  # the length's bytes end exactly at the end
        (b"\x04\x84\x00\x00\x00\x02\xaa\xbb", [(4, b"\xaa\xbb")]),
        (b"\x1e\x01\x41", [(0x1E, b"A")]),
        (b"\x04\x01\x00\x1e\x00", [(4, b"\x00"), (0x1E, b"")]),
    ],
)
def test_der_items(data: bytes, items: list[tuple[int, bytes]]) -> None:
    assert _der_items(data) == items


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x04", "DER: truncated tag or length"),
        (b"\x04\x00\x05", "DER: truncated tag or length"),
        (b"\x1f\x01\x00", "DER: multi-byte tags are not used in the SGX extension"),
        (b"\x3f\x01\x00", "DER: multi-byte tags are not used in the SGX extension"),
        (b"\x04\x80", "DER: bad length"),
        (b"\x04\x85\x00\x00\x00\x00\x01\xaa", "DER: bad length"),
        (b"\x04\x82\x00", "DER: bad length"),
        (b"\x04\x03\xaa\xbb", "DER: contents run past the end"),
        (b"\x04\x81\x02\xaa", "DER: contents run past the end"),
    ],
)
def test_der_items_refused(data: bytes, problem: str) -> None:
    with pytest.raises(ValueError) as raised:
        _der_items(data)
    assert str(raised.value) == problem


@pytest.mark.parametrize(
    "dotted",
    ["0.0", "0.39", "1.0", "1.39", "2.0", "2.39", "2.40", "2.999.1", f"{SGX}.2.18", "1.2.16384"],
)
def test_der_oid(dotted: str) -> None:
    assert _der_oid(_oid(dotted)) == dotted


def test_der_oid_refused() -> None:
    for contents, problem in [(b"", "DER: empty OID"), (b"\x2a\x86", "DER: truncated OID")]:
        with pytest.raises(ValueError) as raised:
            _der_oid(contents)
        assert str(raised.value) == problem


def test_der_uint() -> None:
    assert [_der_uint(b) for b in (b"\x00", b"\x7f", b"\x00\xff", b"\x01\x00")] == [
        0,
        127,
        255,
        256,
    ]
    for contents in (b"", b"\x80", b"\xff\xff"):
        with pytest.raises(ValueError) as raised:
            _der_uint(contents)
        assert str(raised.value) == "DER: not a non-negative integer"
