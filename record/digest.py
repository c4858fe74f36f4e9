"""Every digest domain of the record, in one place.

A record digest is ``SHA-256(domain || bytes)``: the one-byte domain keeps a request hash
from ever being read as a response hash (the v1.0 record's replay contract). Each domain
byte is a named constant here and nowhere else writes one.

RFC 9162's Merkle prefixes (0x00 leaf, 0x01 node) are *not* these domains: they hash
envelope bytes in ``record.merkle`` as the RFC says, a different input space, so their
numeric overlap with ``REQUEST``/``RESPONSE`` is deliberate and harmless.

This module never does I/O and never canonicalises on its own: callers pass the exact bytes.
"""

from __future__ import annotations

import hashlib
from enum import IntEnum
from typing import Any

import rfc8785

__all__ = [
    "Domain",
    "canonical_json",
    "digest",
    "digest_hex",
    "parse_digest",
]

#: The textual form of a digest in records and documents.
PREFIX = "sha256:"


class Domain(IntEnum):
    """Domain bytes. Values are frozen once a record uses them: never renumber."""

    REQUEST = 0x00  # content_key: the exact request bytes sent upstream
    RESPONSE = 0x01  # response_digest: the raw reply body as received
    INPUT = 0x02  # input_digest: bytes as the client sent them (pre-normalisation)
    PROMPT = 0x03  # prompt_digest: canonical prompt as the engine will see it
    TOOL_ARGUMENTS = 0x04  # canonical JSON of a tool call's arguments
    TOOL_RESULT = 0x05  # the raw tool result bytes as received
    TOOL_CALL_ID = 0x06  # derived tool-call ids: (prompt digest, seed, ordinal)
    FETCH_REQUEST = 0x07  # the exact bytes of a web fetch request line, headers and body
    FETCH_RESPONSE = 0x08  # a fetched page: status, headers and body as received
    ERROR = 0x09  # error_bytes: verbatim provider error body
    WEIGHTS = 0x0A  # model weights (engine's half of the reproducibility block)
    EVIDENCE = 0x0B  # archived attestation evidence
    BODY = 0x0C  # a sealed entry's plaintext body


def digest(domain: Domain, data: bytes) -> str:
    """``sha256:<hex>`` of ``domain || data``."""
    return PREFIX + digest_hex(domain, data)


def digest_hex(domain: Domain, data: bytes) -> str:
    h = hashlib.sha256(bytes((domain,)))
    h.update(data)
    return h.hexdigest()


def parse_digest(text: str) -> bytes:
    """The 32 raw bytes of a ``sha256:<hex>`` string; ``ValueError`` naming the problem."""
    if not text.startswith(PREFIX):
        raise ValueError(f"digest {text!r} does not start with {PREFIX!r}")
    raw = bytes.fromhex(text[len(PREFIX) :])
    if len(raw) != 32:
        raise ValueError(f"digest {text!r} is {len(raw)} bytes, not 32")
    return raw


def canonical_json(value: Any) -> bytes:
    """RFC 8785 (JCS) bytes of a JSON value, through the maintained ``rfc8785`` library."""
    return rfc8785.dumps(value)
