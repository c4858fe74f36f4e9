"""Reading certificates the way every verifier here needs them, and naming a pinned key.

One place for it: PEM (any number of certificates; a chain embedded in a TDX quote ends in
NUL bytes) or one DER certificate, each certificate once. AMD issues every VCEK with serial
number 0, which RFC 5280 forbids and ``cryptography`` warns about; that one warning is
silenced here and nowhere else.
"""

from __future__ import annotations

import hashlib
import warnings

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.utils import CryptographyDeprecationWarning

__all__ = ["load_certs", "spki_sha256"]

#: the one warning silenced (matched from its start): AMD's VCEKs carry serial number 0
_SERIAL_ZERO = "Parsed a serial number which wasn't positive"


def load_certs(data: bytes) -> list[x509.Certificate]:
    """The certificates in ``data``, in order, each once; ``ValueError`` if one does not parse.

    ``cryptography`` reads a certificate's key and extensions only when asked: they are read
    here (and its names), so a certificate with a curve it does not know, a repeated extension
    or a malformed name is refused now, as ``ValueError``, not deep inside a chain check
    (found by fuzzing).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _SERIAL_ZERO, CryptographyDeprecationWarning)
        try:
            if b"-----BEGIN CERTIFICATE-----" in data:
                # the PEM reader skips what lies outside BEGIN/END, a TDX quote's NULs too
                certs = x509.load_pem_x509_certificates(data)
            else:
                certs = [x509.load_der_x509_certificate(data)]
        except x509.InvalidVersion as exc:  # not a ValueError (found by fuzzing)
            raise ValueError(f"a certificate of an unknown X.509 version: {exc}") from None
    unique: dict[bytes, x509.Certificate] = {}
    for cert in certs:
        try:
            cert.public_key()
            cert.extensions  # noqa: B018 - parsed for what it raises
            cert.subject  # noqa: B018
            cert.issuer  # noqa: B018
        except (
            ValueError,
            TypeError,  # a name attribute of a type its OID does not take
            UnsupportedAlgorithm,
            x509.DuplicateExtension,
            x509.UnsupportedGeneralNameType,
        ) as exc:
            raise ValueError(f"a certificate that cannot be read: {exc}") from None
        unique.setdefault(cert.public_bytes(Encoding.DER), cert)
    return list(unique.values())


def spki_sha256(cert: x509.Certificate) -> str:
    """SHA-256 (hex) of a certificate's SubjectPublicKeyInfo, DER: what a pin names."""
    spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).hexdigest()
