"""Binding a record to the machine: what the evidence's ``report_data`` must carry.

The appliance's evidence vouches for two keys born inside it: the log's checkpoint signing
key (Ed25519, named by its C2SP verifier key text) and the appliance's sealing key (X25519,
a recipient of every stream). ``report_data`` (64 bytes) is

    SHA-256("affidavit/report-data/v1" || 0x00 || u16 length || verifier key text ||
            32-byte sealing public key)  ||  nonce (32 bytes; zeros when none)

so anyone holding the bundle (its ``log_key.pub`` and the stream's recipients) can recompute
the first half, and a verifier that sent a fresh nonce finds it in the second. A nonce
longer than 32 bytes is replaced by its SHA-256.
"""

from __future__ import annotations

import hashlib
import struct

__all__ = ["CONTEXT", "binding_digest", "report_data"]

CONTEXT = b"affidavit/report-data/v1\x00"


def binding_digest(log_key: str, sealing_public: bytes) -> bytes:
    """The 32 bytes that tie ``log_key`` and ``sealing_public`` to the evidence."""
    if len(sealing_public) != 32:
        raise ValueError("the sealing public key must be 32 bytes (raw X25519)")
    text = log_key.strip().encode("utf-8")
    return hashlib.sha256(CONTEXT + struct.pack(">H", len(text)) + text + sealing_public).digest()


def report_data(log_key: str, sealing_public: bytes, nonce: bytes = b"") -> bytes:
    """The 64-byte ``report_data`` the appliance asks its TEE to sign."""
    tail = nonce if len(nonce) <= 32 else hashlib.sha256(nonce).digest()
    return binding_digest(log_key, sealing_public) + tail.ljust(32, b"\x00")
