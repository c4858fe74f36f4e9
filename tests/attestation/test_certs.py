"""attestation.certs: each certificate once, and a certificate that cannot be read is refused
up front with a ``ValueError`` that says so (real certificates, edited byte for byte)."""

from __future__ import annotations

import datetime
import hashlib
import warnings

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID

from attestation.certs import load_certs, spki_sha256

_OID_A = x509.ObjectIdentifier("1.2.3.4")  # DER: 06 03 2a 03 04
_OID_B = x509.ObjectIdentifier("1.2.3.5")  # DER: 06 03 2a 03 05


def _cert(serial: int = 1, *, extensions: bool = False) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "certs test")])
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=1))
    )
    if extensions:
        for oid in (_OID_A, _OID_B):
            builder = builder.add_extension(x509.UnrecognizedExtension(oid, b"\x05\x00"), False)
    return builder.sign(key, hashes.SHA256())


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def test_pem_and_der_each_certificate_once() -> None:
    one, two = _cert(), _cert()
    pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (one, two, one))
    assert load_certs(pem + b"\x00" * 8) == [one, two]  # a TDX quote's chain ends in NULs
    assert load_certs(_der(one)) == [one]
    spki = one.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert spki_sha256(one) == hashlib.sha256(spki).hexdigest()


def test_a_serial_number_of_zero_loads_without_a_warning() -> None:
    """AMD issues every VCEK with serial 0: that one warning is silenced, here only."""
    der = _der(_cert(serial=1))
    zero = der.replace(b"\x02\x01\x01", b"\x02\x01\x00", 1)  # the serial, the first INTEGER 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        [cert] = load_certs(zero)
    with pytest.warns(CryptographyDeprecationWarning, match="serial number which wasn't positive"):
        assert cert.serial_number == 0  # read outside load_certs, the warning is the library's


def test_an_unknown_x509_version_is_a_value_error() -> None:
    der = _der(_cert())
    v3 = b"\xa0\x03\x02\x01\x02"  # [0] EXPLICIT INTEGER 2: X.509 v3
    assert der.count(v3) == 1
    with pytest.raises(ValueError) as info:
        load_certs(der.replace(v3, b"\xa0\x03\x02\x01\x07"))
    assert str(info.value).startswith("a certificate of an unknown X.509 version: ")


def test_a_repeated_extension_is_a_value_error() -> None:
    der = _der(_cert(extensions=True))
    oid_b = b"\x06\x03\x2a\x03\x05"
    assert der.count(oid_b) == 1
    with pytest.raises(ValueError) as info:
        load_certs(der.replace(oid_b, b"\x06\x03\x2a\x03\x04"))
    assert str(info.value).startswith("a certificate that cannot be read: ")
