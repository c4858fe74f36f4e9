"""Binding a record (and a TLS key) to the machine: what the evidence's ``report_data`` carries.

The appliance's evidence vouches for keys born inside it: the log's checkpoint signing key
(Ed25519, named by its C2SP verifier key text), the appliance's sealing key (X25519, a
recipient of every stream) and, for the attested channel, its TLS key (the SHA-256 of its
SubjectPublicKeyInfo). ``report_data`` (64 bytes) is a binding digest followed by a nonce:

    v1 (the record's keys; boot evidence, ``attest collect``, ``attest bind-check``):
    SHA-256("affidavit/report-data/v1" || 0x00 || u16 length || verifier key text ||
            32-byte sealing public key)

    v2 (the record's keys and the TLS key; the ``/attestation`` endpoint, ``connect``):
    SHA-256("affidavit/report-data/v2" || 0x00 || u16 length || verifier key text ||
            32-byte sealing public key || 32-byte SHA-256 of the TLS key's SPKI)

    || nonce (32 bytes; zeros when none; a longer nonce is replaced by its SHA-256)

so anyone holding the public halves can recompute the first half, and a verifier that sent a
fresh nonce finds it in the second. The version is in the hashed context, so a v1 digest can
never be read as a v2 one (``docs/attestation.md``, "The binding").
"""

from __future__ import annotations

import hashlib
import struct

__all__ = ["CONTEXT", "CONTEXT_V2", "binding_digest", "channel_digest", "report_data"]

CONTEXT = b"affidavit/report-data/v1\x00"
CONTEXT_V2 = b"affidavit/report-data/v2\x00"


def _keys(log_key: str, sealing_public: bytes) -> bytes:
    if len(sealing_public) != 32:
        raise ValueError("the sealing public key must be 32 bytes (raw X25519)")
    text = log_key.strip().encode("utf-8")
    return struct.pack(">H", len(text)) + text + sealing_public


def binding_digest(log_key: str, sealing_public: bytes) -> bytes:
    """The 32 bytes (v1) that tie ``log_key`` and ``sealing_public`` to the evidence."""
    return hashlib.sha256(CONTEXT + _keys(log_key, sealing_public)).digest()


def channel_digest(log_key: str, sealing_public: bytes, tls_spki_sha256: bytes) -> bytes:
    """The 32 bytes (v2) that tie the record's keys and the TLS key to the evidence."""
    if len(tls_spki_sha256) != 32:
        raise ValueError("the TLS key's SPKI digest must be 32 bytes (SHA-256)")
    return hashlib.sha256(CONTEXT_V2 + _keys(log_key, sealing_public) + tls_spki_sha256).digest()


def report_data(
    log_key: str,
    sealing_public: bytes,
    nonce: bytes = b"",
    *,
    tls_spki_sha256: bytes | None = None,
) -> bytes:
    """The 64-byte ``report_data`` the appliance asks its TEE to sign: v1, or v2 with the TLS
    key's SPKI digest."""
    tail = nonce if len(nonce) <= 32 else hashlib.sha256(nonce).digest()
    head = (
        binding_digest(log_key, sealing_public)
        if tls_spki_sha256 is None
        else channel_digest(log_key, sealing_public, tls_spki_sha256)
    )
    return head + tail.ljust(32, b"\x00")
