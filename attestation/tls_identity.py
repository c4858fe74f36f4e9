"""The appliance's TLS key: made once where it runs, kept beside its other keys, attested.

No certificate authority vouches for this key: the attestation evidence does (its
``report_data`` binds the SHA-256 of the key's SubjectPublicKeyInfo, ``attestation.binding``
v2), and a client pins it after checking that evidence (``attestation.channel_client``).
So the certificate is self-signed, names no host (clients check the key, not a name), is
not a CA (it can vouch for no other key), and is valid for as long as the key is kept.

The key is an ECDSA P-256 key (every TLS 1.3 stack speaks it); the files are
``tls.key`` (PKCS#8 PEM, 0600) and ``tls.crt`` (PEM) in the folder given: the home for
``affidavit up``, the state disk in the guest, made at first start and reused after.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CERT_FILE",
    "KEY_FILE",
    "TlsIdentity",
    "TlsIdentityError",
    "spki_sha256_of",
    "tls_identity",
]

KEY_FILE = "tls.key"
CERT_FILE = "tls.crt"
#: The certificate's subject: a label for people reading it, never checked by anyone.
SUBJECT = "affidavit appliance (attested key, no CA)"


class TlsIdentityError(ValueError):
    """The kept key or certificate cannot be used (unreadable, not a key, not a pair)."""


@dataclass(frozen=True)
class TlsIdentity:
    """Where the key and certificate are, and what the evidence binds: the SPKI's SHA-256."""

    key_file: Path
    cert_file: Path
    cert_der: bytes
    spki_sha256: bytes


def spki_sha256_of(cert_der: bytes) -> bytes:
    """SHA-256 of a DER certificate's SubjectPublicKeyInfo: what the binding carries."""
    cert = x509.load_der_x509_certificate(cert_der)
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(spki).digest()


def _make(folder: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SUBJECT)])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(datetime(2000, 1, 1, tzinfo=UTC))
        .not_valid_after(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # the key first, written whole under a temporary name, then the certificate: a crash in
    # between leaves a key with no certificate, which the next start replaces
    tmp = folder / (KEY_FILE + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / KEY_FILE)
    (folder / CERT_FILE).write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def tls_identity(folder: Path) -> TlsIdentity:
    """The TLS key kept in ``folder``, made there the first time.

    Raises:
        TlsIdentityError: the kept files are not a key and its certificate, or others can
            read the key.
    """
    key_file, cert_file = folder / KEY_FILE, folder / CERT_FILE
    if not key_file.exists() or not cert_file.exists():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        _make(folder)
    try:
        if key_file.stat().st_mode & 0o077:
            raise TlsIdentityError(f"{key_file}: others can read it (chmod 600 it)")
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        if isinstance(exc, TlsIdentityError):
            raise
        raise TlsIdentityError(f"{folder}: the TLS key or certificate: {exc}") from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(der, spki):
        raise TlsIdentityError(f"{cert_file} is not the certificate of {key_file}")
    cert_der = cert.public_bytes(der)
    return TlsIdentity(key_file, cert_file, cert_der, spki_sha256_of(cert_der))
