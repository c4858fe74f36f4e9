"""attestation.tdx_quote's parser as a unit, on quotes built here field by field (no TEE: the
bytes are laid out as Intel's DCAP library writes them, signed by nothing): every parsed field
compared with what was built, hex text in each spelling, and a quote cut at every field
boundary, each error word for word; and the helpers that walk the quote's PCK chain
(``attestation.tdx_certs``) on certificates made here. Each test pins a line a mutant changed
unnoticed."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from attestation.tdx_certs import _Anchor, _build_chain, _expired, _pick_leaf
from attestation.tdx_quote import TdxQuote, parse_tdx_quote

_TD_FIELDS = (
    ("tee_tcb_svn", 16),
    ("mrseam", 48),
    ("mrsignerseam", 48),
    ("seam_attributes", 8),
    ("td_attributes", 8),
    ("xfam", 8),
    ("mrtd", 48),
    ("mrconfigid", 48),
    ("mrowner", 48),
    ("mrownerconfig", 48),
    ("rtmr0", 48),
    ("rtmr1", 48),
    ("rtmr2", 48),
    ("rtmr3", 48),
    ("report_data", 64),
)
_TD15_FIELDS = (("tee_tcb_svn2", 16), ("mrservicetd", 48))
_CHAIN = b"-----BEGIN CERTIFICATE-----\nnot parsed here\n-----END CERTIFICATE-----\n\x00\x00"
# Header, body and the three fixed fields of the signature data, before the QE certification.
_SIG_FIXED = 64 + 64 + 2 + 4


@dataclass(frozen=True)
class BuiltQuote:
    """A quote's bytes and the values each field was given."""

    raw: bytes
    header: dict[str, bytes]
    body: dict[str, bytes]
    qe_report: bytes
    signature_data: bytes  # what signature_data.length counts
    signed_length: int  # header || body (v5: with its type and size)
    fields: tuple[tuple[str, int, int], ...]  # (name, offset, size) in reading order


def _rand(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


def _qe_report(rng: random.Random) -> bytes:
    """384 random bytes, the reserved ones included, so a field read a byte too long shows."""
    return _rand(rng, 384)


def build_quote(
    version: int = 4,
    body_type: int = 2,
    auth: bytes = b"qe-auth",
    trailing: bytes = b"",
    tee_type: int = 0x81,
    seed: int = 1,
) -> BuiltQuote:
    rng = random.Random(seed)
    fields: list[tuple[str, int, int]] = []
    out = bytearray()

    def put(name: str, value: bytes) -> None:
        fields.append((name, len(out), len(value)))
        out.extend(value)

    header = {
        "reserved": _rand(rng, 4),
        "qe_vendor_id": _rand(rng, 16),
        "user_data": _rand(rng, 20),
    }
    put("header.version", struct.pack("<H", version))
    put("header.att_key_type", struct.pack("<H", 2))
    put("header.tee_type", struct.pack("<I", tee_type))
    for name, value in header.items():
        put(f"header.{name}", value)
    layout = _TD_FIELDS + (_TD15_FIELDS if body_type == 3 else ())
    body = {name: _rand(rng, size) for name, size in layout}
    body_bytes = b"".join(body.values())
    if version == 5:
        put("body.type", struct.pack("<H", body_type))
        put("body.size", struct.pack("<I", len(body_bytes)))
    put("body", body_bytes)
    signed_length = len(out)
    qe_report = _qe_report(rng)
    inner = qe_report + _rand(rng, 64) + struct.pack("<H", len(auth)) + auth
    inner += struct.pack("<H", 5) + struct.pack("<I", len(_CHAIN)) + _CHAIN
    sig = _rand(rng, 64) + _rand(rng, 64) + struct.pack("<H", 6) + struct.pack("<I", len(inner))
    sig += inner
    put("signature_data.length", struct.pack("<I", len(sig)))
    out.extend(sig)
    out.extend(trailing)
    return BuiltQuote(bytes(out), header, body, qe_report, sig, signed_length, tuple(fields))


def _check_fields(quote: TdxQuote, built: BuiltQuote, version: int, body_type: int) -> None:
    h = quote.header
    assert (h.version, h.att_key_type, h.tee_type) == (version, 2, 0x81)
    assert (h.reserved, h.qe_vendor_id, h.user_data) == tuple(built.header.values())
    assert quote.body_type == body_type
    for name, value in built.body.items():
        assert getattr(quote.body, name) == value, name
    if body_type == 2:
        assert (quote.body.tee_tcb_svn2, quote.body.mrservicetd) == (None, None)
    assert quote.signed_bytes == built.raw[: built.signed_length]
    sd = quote.signature_data
    sig = built.signature_data
    assert (sd.signature, sd.attestation_key) == (sig[:64], sig[64:128])
    assert sd.certification_data_type == 6
    qe = sd.qe_certification
    r = built.qe_report
    report = qe.qe_report
    assert report.raw == r
    assert report.cpu_svn == r[0:16]
    assert report.miscselect == r[16:20]
    assert report.attributes == r[48:64]
    assert report.mrenclave == r[64:96]
    assert report.mrsigner == r[128:160]
    assert report.isv_prod_id == int.from_bytes(r[256:258], "little")
    assert report.isv_svn == int.from_bytes(r[258:260], "little")
    assert report.report_data == r[320:384]
    assert qe.qe_report_signature == sig[_SIG_FIXED + 384 : _SIG_FIXED + 448]
    assert qe.qe_auth_data == b"qe-auth"
    assert qe.certification_data_type == 5
    assert qe.certification_data == _CHAIN
    assert qe.pck_chain_pem == _CHAIN.rstrip(b"\x00")


@pytest.mark.parametrize(("version", "body_type"), [(4, 2), (5, 2), (5, 3)])
def test_every_field_is_read_from_where_it_was_written(version: int, body_type: int) -> None:
    built = build_quote(version, body_type, trailing=b"after")
    quote = parse_tdx_quote(built.raw)
    _check_fields(quote, built, version, body_type)
    assert quote.trailing == b"after"


def test_the_qe_reports_isv_svn_is_two_bytes_not_three() -> None:
    built = build_quote()
    r = built.qe_report
    assert r[260] != 0  # the reserved byte after ISVSVN is set, so a wider read would differ
    report = parse_tdx_quote(built.raw).signature_data.qe_certification.qe_report
    assert report.isv_svn == r[258] | r[259] << 8


@pytest.mark.parametrize(
    "spell",
    [
        lambda h: h,
        lambda h: "0x" + h,
        lambda h: "0X" + h.upper(),
        lambda h: " 0x" + " ".join(h[i : i + 8] for i in range(0, len(h), 8)) + "\n",
        lambda h: "\t".join(h[i : i + 64] for i in range(0, len(h), 64)),
    ],
    ids=["plain", "0x", "0X-upper", "0x-spaced", "tabbed"],
)
def test_hex_text_is_read_as_the_bytes_it_spells(spell: Callable[[str], str]) -> None:
    built = build_quote(5, 3)
    text = spell(built.raw.hex())
    assert parse_tdx_quote(text) == parse_tdx_quote(built.raw)
    assert parse_tdx_quote(text.encode()) == parse_tdx_quote(built.raw)
    assert parse_tdx_quote(bytearray(text.encode())) == parse_tdx_quote(built.raw)


def test_text_that_is_not_hex_is_refused_by_name() -> None:
    with pytest.raises(ValueError) as err:
        parse_tdx_quote("0x04zz")
    assert str(err.value) == "quote: text that is not hex"


def test_hex_bytes_with_an_odd_number_of_digits_are_refused_by_name() -> None:
    with pytest.raises(ValueError) as err:
        parse_tdx_quote(b"0x040")
    assert str(err.value) == "quote: hex text with an odd number of digits"


def test_an_empty_quote_is_refused_by_name() -> None:
    for empty in (b"", "", " \n"):
        with pytest.raises(ValueError) as err:
            parse_tdx_quote(empty)
        assert str(err.value) == "quote: empty"


def _error(data: bytes) -> str:
    with pytest.raises(ValueError) as err:
        parse_tdx_quote(data)
    return str(err.value)


def _truncated(name: str, size: int, offset: int, left: int) -> str:
    return f"{name}: truncated: needs {size} byte{'' if size == 1 else 's'} at offset {offset}, {left} left"


@pytest.mark.parametrize(("version", "body_type"), [(4, 2), (5, 2), (5, 3)])
def test_a_quote_cut_inside_its_header_or_body_names_the_field(
    version: int, body_type: int
) -> None:
    built = build_quote(version, body_type)
    for name, offset, size in built.fields:
        for left in sorted({0, size // 2, size - 1}):
            if offset + left == 0:
                continue  # nothing at all: "quote: empty"
            got = _error(built.raw[: offset + left])
            assert got == _truncated(name, size, offset, left), (name, left)


def _with_signature_data(built: BuiltQuote, sig: bytes) -> bytes:
    """The quote with other signature data, its declared length (and, once the data reaches
    it, the certification data's size) set to agree with what is there."""
    if len(sig) >= _SIG_FIXED:
        sig = sig[:130] + struct.pack("<I", len(sig) - _SIG_FIXED) + sig[_SIG_FIXED:]
    head = built.raw[: built.signed_length]
    return head + struct.pack("<I", len(sig)) + sig


def test_signature_data_cut_inside_a_field_names_the_field() -> None:
    built = build_quote(auth=b"qe-auth")
    start = built.signed_length + 4  # where the signature data begins in the quote
    layout = (
        ("signature_data.signature", 64),
        ("signature_data.attestation_key", 64),
        ("certification_data.type", 2),
        ("certification_data.size", 4),
        ("qe_report", 384),
        ("qe_report_signature", 64),
        ("qe_auth_data.size", 2),
        ("qe_auth_data", 7),
        ("qe_certification_data.type", 2),
        ("qe_certification_data.size", 4),
    )
    rel = 0
    for name, size in layout:
        for left in sorted({0, size // 2, size - 1}):
            got = _error(_with_signature_data(built, built.signature_data[: rel + left]))
            assert got == _truncated(name, size, start + rel, left), (name, left)
        rel += size


def test_a_one_byte_field_cut_short_is_named_in_the_singular() -> None:
    built = build_quote(auth=b"x")
    start = built.signed_length + 4
    rel = 64 + 64 + 2 + 4 + 384 + 64 + 2  # up to the one byte of QE auth data
    got = _error(_with_signature_data(built, built.signature_data[:rel]))
    assert got == f"qe_auth_data: truncated: needs 1 byte at offset {start + rel}, 0 left"


def test_declared_lengths_that_do_not_add_up_are_named() -> None:
    built = build_quote()
    head = built.raw[: built.signed_length]
    sig = built.signature_data
    assert _error(head + struct.pack("<I", len(sig) + 1) + sig) == (
        f"signature_data.length: {len(sig) + 1} bytes declared, {len(sig)} left (truncated)"
    )
    assert _error(head + struct.pack("<I", 0xFFFFFFF0) + sig) == (
        f"signature_data.length: {0xFFFFFFF0} bytes declared, {len(sig)} left (truncated)"
    )
    wrong_size = sig[:130] + struct.pack("<I", len(sig) - _SIG_FIXED + 1) + sig[_SIG_FIXED:]
    assert _error(head + struct.pack("<I", len(sig)) + wrong_size) == (
        f"certification_data.size: {len(sig) - _SIG_FIXED + 1} bytes declared, the signature "
        f"data leaves {len(sig) - _SIG_FIXED}"
    )
    short_chain = _with_signature_data(built, sig[:-1])
    assert _error(short_chain) == (
        f"qe_certification_data.size: {len(_CHAIN)} bytes declared, the certification "
        f"data leaves {len(_CHAIN) - 1}"
    )


def test_a_tee_type_with_its_top_bit_set_is_shown_unsigned() -> None:
    built = build_quote(tee_type=0x80000081)
    assert _error(built.raw) == "header.tee_type: 0x80000081 is not TDX (0x81)"


def test_an_sgx_report_body_is_refused_by_name() -> None:
    built = build_quote(5, 2)
    raw = bytearray(built.raw)
    raw[48:50] = struct.pack("<H", 1)
    assert _error(bytes(raw)) == (
        "body.type: 1 is not a TD report (2: TDX 1.0, 3: TDX 1.5; 1 is an SGX enclave report)"
    )


# The quote's PCK chain, as attestation.tdx walks it (certificates made here, not Intel's).
FROM = datetime(2025, 1, 1, tzinfo=UTC)
UNTIL = datetime(2026, 1, 1, tzinfo=UTC)
NO_ROOT = _Anchor("00" * 32, "the test's pinned root", None)


def _cert(
    cn: str, key: ec.EllipticCurvePrivateKey, issuer_cn: str, issuer_key: ec.EllipticCurvePrivateKey
) -> x509.Certificate:
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(FROM)
        .not_valid_after(UNTIL)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(issuer_key, hashes.SHA256())
    )


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def test_a_chain_with_two_issuers_of_that_name_that_both_fail_names_both() -> None:
    signer, other, third = _key(), _key(), _key()
    leaf = _cert("Leaf", _key(), "CA", signer)
    ca_a = _cert("CA", other, "CA", other)
    ca_b = _cert("CA", third, "CA", third)
    chain = _build_chain(leaf, [leaf, ca_a, ca_b], NO_ROOT)
    why = "the signature on Leaf does not verify with CA's key"
    assert chain.problem == f"{why}; {why}"
    assert chain.path == [leaf]


def test_a_chain_that_stops_short_of_a_root_is_not_pinned_rather_than_unknown() -> None:
    """verify_tdx reports ``pinned`` as ``pck_chain.root_pinned``'s ok: None would read as
    "not checked", where the chain was checked and found without a root."""
    leaf = _cert("Leaf", _key(), "Missing CA", _key())
    chain = _build_chain(leaf, [leaf], NO_ROOT)
    assert chain.pinned is False
    assert chain.pin_detail == "the chain stops at Leaf, not at a root"
    assert chain.ok is False


def test_when_every_certificate_names_another_as_issuer_the_first_is_the_leaf() -> None:
    key_a, key_b = _key(), _key()
    a = _cert("A", key_a, "B", key_b)
    b = _cert("B", key_b, "A", key_a)
    assert _pick_leaf([a, b]) is a
    assert _pick_leaf([b, a]) is b


def test_a_certificate_is_valid_at_both_ends_of_its_window() -> None:
    cert = _cert("Leaf", _key(), "CA", _key())
    assert _expired([cert], FROM) == []
    assert _expired([cert], UNTIL) == []
    outside = "Leaf (valid 2025-01-01T00:00:00Z to 2026-01-01T00:00:00Z)"
    assert _expired([cert], FROM - timedelta(seconds=1)) == [outside]
    assert _expired([cert], UNTIL + timedelta(seconds=1)) == [outside]
