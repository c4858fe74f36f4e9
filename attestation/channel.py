"""The attested channel's one message: what ``GET /attestation?nonce=HEX`` answers.

A client sends a fresh 32-byte nonce; the appliance asks its TEE for a report whose
``report_data`` is ``attestation.binding`` v2 over its log key, its sealing key and the SPKI
digest of the TLS key serving this very connection, followed by the nonce. The reply carries
that evidence (and the GPU's, bound to the same nonce, when there is a GPU), the public halves
the client needs to recompute the binding, and the release it claims to be. The client
(``attestation.channel_client``) checks all of it against its own published measurements and
policy, and only then pins the TLS key. Both sides use these models, so the format lives in
one place (``docs/attestation.md``, "The attested channel").

Every report here is fresh: SEV-SNP and TDX guests get one per request through configfs-tsm
(or ``/dev/sev-guest``), and the GPU signs the nonce itself, so ``mode`` is always
``fresh``; a TEE that could give only its boot report would need a signed reply instead,
which this format leaves room for (``mode``) but nothing here builds.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attestation.binding import channel_digest, report_data

__all__ = [
    "FORMAT",
    "MAX_REPLY_BYTES",
    "NONCE_SIZE",
    "AttestationReply",
    "BindingKeys",
    "ChannelIdentity",
    "EvidenceSource",
    "NoEvidence",
    "Piece",
    "ReplyError",
    "answer",
    "claimed_release",
    "parse_nonce",
    "parse_reply",
]

FORMAT: Final = "affidavit/attestation/v1"
NONCE_SIZE = 32
#: A reply is a report (about 1 KiB), its chain (a few KiB), a GPU's evidence and chain (tens
#: of KiB) and TDX collateral (about 100 KiB): anything past this is not an answer.
MAX_REPLY_BYTES = 4 << 20
_HEX32 = r"^[0-9a-f]{64}$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class BindingKeys(_Model):
    """The public halves ``report_data``'s first 32 bytes are recomputed from (v2)."""

    version: Literal[2]
    log_key: str = Field(min_length=1, max_length=512)
    sealing_key: str = Field(pattern=_HEX32)  # raw X25519, hex
    tls_spki_sha256: str = Field(pattern=_HEX32)


class Piece(_Model):
    """One piece of evidence as the verifier of its kind takes it."""

    kind: Literal["snp", "tdx", "nvidia"]
    evidence: str = Field(max_length=MAX_REPLY_BYTES)  # base64 of the report, quote or SPDM
    certs: str = Field(default="", max_length=MAX_REPLY_BYTES)  # PEM: its chain, when it has one
    collateral: str | None = Field(default=None, max_length=MAX_REPLY_BYTES)  # TDX: JSON text


class AttestationReply(_Model):
    """``GET /attestation``'s body."""

    format: Literal["affidavit/attestation/v1"]
    mode: Literal["fresh"]
    nonce: str = Field(pattern=_HEX32)
    binding: BindingKeys
    evidence: list[Piece] = Field(min_length=1, max_length=4)
    release: str | None = Field(default=None, max_length=256)  # the published version it claims


class ReplyError(ValueError):
    """A reply that is not an attestation reply: too large, not JSON, not this format."""


class NoEvidence(RuntimeError):
    """This appliance has no TEE to ask (or its TEE did not answer): nothing to attest."""


def parse_nonce(text: str) -> bytes:
    """A client's nonce: exactly 32 bytes as 64 hex digits (``ValueError`` naming what is
    wrong otherwise)."""
    if len(text) != 2 * NONCE_SIZE:
        raise ValueError(f"the nonce must be {NONCE_SIZE} bytes as {2 * NONCE_SIZE} hex digits")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError("the nonce is not hex") from None


def parse_reply(body: bytes) -> AttestationReply:
    """A reply from the outside, checked for size and shape before anything reads it."""
    if len(body) > MAX_REPLY_BYTES:
        raise ReplyError(f"the reply is {len(body)} bytes, over {MAX_REPLY_BYTES}")
    try:
        return AttestationReply.model_validate(json.loads(body), strict=False)
    except (ValueError, RecursionError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else None
        where = ".".join(str(p) for p in first["loc"]) if first else ""
        said = f"{where}: {first['msg']}" if first else str(exc)
        raise ReplyError(f"not an attestation reply ({said})") from None


def decode(text: str, what: str) -> bytes:
    """A base64 field of a reply (``ReplyError`` naming it when it is not base64)."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ReplyError(f"{what} is not base64") from None


@dataclass(frozen=True)
class ChannelIdentity:
    """What the appliance binds: its log key, its sealing key and its TLS key's SPKI digest."""

    log_key: str
    sealing_public: bytes
    tls_spki_sha256: bytes

    def digest(self) -> bytes:
        return channel_digest(self.log_key, self.sealing_public, self.tls_spki_sha256)

    def report_data(self, nonce: bytes) -> bytes:
        return report_data(
            self.log_key, self.sealing_public, nonce, tls_spki_sha256=self.tls_spki_sha256
        )


class EvidenceSource(Protocol):
    """The TEE (and GPU) of this machine: fresh evidence for 64 bytes of ``report_data``."""

    def collect(self, report_data: bytes, nonce: bytes) -> Sequence[Piece]:
        """Evidence carrying ``report_data`` (CPU) and ``nonce`` (GPU); ``NoEvidence`` when
        there is no TEE to ask."""
        ...


def claimed_release() -> str | None:
    """The release an appliance claims to be: its installed distribution's version (a
    release's published file is ``measurements/<version>.json``), None when it runs from a
    source tree with no metadata. Only a claim, which nothing signs: a client holds the
    evidence to the published file it chose, whatever this says."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("affidavit")
    except PackageNotFoundError:
        return None


def answer(
    nonce: bytes, identity: ChannelIdentity, source: EvidenceSource, release: str | None = None
) -> AttestationReply:
    """The reply to a client's nonce: fresh evidence bound to it and to the TLS key."""
    if len(nonce) != NONCE_SIZE:
        raise ValueError(f"the nonce must be {NONCE_SIZE} bytes")
    pieces = list(source.collect(identity.report_data(nonce), nonce))
    if not pieces:
        raise NoEvidence("the TEE gave no evidence")
    return AttestationReply(
        format=FORMAT,
        mode="fresh",
        nonce=nonce.hex(),
        binding=BindingKeys(
            version=2,
            log_key=identity.log_key,
            sealing_key=identity.sealing_public.hex(),
            tls_spki_sha256=identity.tls_spki_sha256.hex(),
        ),
        evidence=pieces,
        release=release,
    )
