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
import json
from collections.abc import Mapping
from enum import IntEnum
from typing import Any

import rfc8785

__all__ = [
    "Domain",
    "canonical_json",
    "digest",
    "digest_hex",
    "parse_digest",
    "prompt_bytes",
    "prompt_digest",
    "prompt_fields",
    "tool_call_id",
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
    PROMPT_TOKENS = 0x0D  # the token ids an engine ran: canonical JSON of the id list


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
    """RFC 8785 (JCS) bytes of a JSON value.

    The maintained ``rfc8785`` library is the rule. For values with no floats, only
    I-JSON-safe integers and only ASCII keys, the standard library's sorted, compact,
    non-ASCII-preserving ``json.dumps`` produces the very same bytes (same escapes, lowercase
    ``\\u00xx``, code-point key order equal to UTF-16 order for ASCII), at several times the
    speed; a property test holds the two equal. Anything else goes to ``rfc8785``.
    """
    if _plain(value):
        try:
            return json.dumps(
                value, ensure_ascii=False, sort_keys=True, separators=(",", ":")
            ).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: let the library judge it
            pass
    return rfc8785.dumps(value)


_MAX_SAFE_INT = 2**53 - 1


def _plain(value: Any) -> bool:
    """True when ``json.dumps`` and JCS agree on ``value`` byte for byte."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) or item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            if -_MAX_SAFE_INT <= item <= _MAX_SAFE_INT:
                continue
            return False
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str) or not key.isascii():
                    return False
                stack.append(child)
            continue
        if isinstance(item, list | tuple):
            stack.extend(item)
            continue
        return False  # floats and anything else: the library decides
    return True


#: The request members that make up a prompt: what the model reads, not how it samples.
PROMPT_FIELDS = ("model", "system", "messages", "tools", "tool_choice", "response_format")
#: The prompt members of an OpenAI Responses request (one with ``input`` and no ``messages``).
RESPONSES_PROMPT_FIELDS = ("model", "instructions", "input", "tools", "tool_choice", "text")


def prompt_fields(request: Mapping[str, Any]) -> tuple[str, ...]:
    """The members that are prompt in ``request``: a Responses request (``input``, no
    ``messages``) has its own; every Chat Completions or Messages request carries
    ``messages``, so its prompt, and its digest, are what :data:`PROMPT_FIELDS` always said."""
    if "messages" not in request and "input" in request:
        return RESPONSES_PROMPT_FIELDS
    return PROMPT_FIELDS


def prompt_bytes(request: Mapping[str, Any]) -> bytes:
    """The canonical prompt of a model request (Chat Completions, Messages or Responses shape)
    as the engine sees it.

    The proxy hashes it after pins and clock are applied; the engine hashes the same members
    of what it received, so both halves of a reproducibility block name one prompt digest.
    """
    return canonical_json({key: request[key] for key in prompt_fields(request) if key in request})


def prompt_digest(request: Mapping[str, Any]) -> str:
    return digest(Domain.PROMPT, prompt_bytes(request))


def tool_call_id(prompt_digest_value: str, seed: int | None, ordinal: int) -> str:
    """A derived tool-call id: never random, so the next prompt that quotes it is replayable."""
    material = canonical_json([prompt_digest_value, seed, ordinal])
    return "call_" + digest_hex(Domain.TOOL_CALL_ID, material)[:24]
