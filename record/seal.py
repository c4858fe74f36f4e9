"""Sealing: who can read a body, and nobody else.

A recipe over ``cryptography``'s hazmat layer, the only place in ``record`` (with
``checkpoint``) that imports it.

- Each stream has a random 32-byte *data key* per key epoch.
- A body is sealed with ChaCha20-Poly1305 under the data key, a fresh random 12-byte nonce,
  and the entry's envelope (its canonical JSON, without ``body``) as associated data, so a
  body cannot be moved to another entry. Stored as ``base64(nonce || ciphertext || tag)``.
- The data key is wrapped to each recipient's X25519 public key with HPKE (RFC 9180, base
  mode, DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20-Poly1305, ``info`` =
  ``"affidavit/data-key/v1" || 0x00 || stream || 0x00 || epoch as decimal``). Stored as
  ``enc(32) || ciphertext(32) || tag(16)``.

Any failure to open is one ``CannotOpen``: it never says whether the key, nonce, associated
data or ciphertext was at fault. Wrong lengths from callers raise ``ValueError``.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from record.errors import CannotOpen, StoreMissing

DATA_KEY_SIZE = 32
NONCE_SIZE = 12
TAG_SIZE = 16  # ChaCha20-Poly1305's tag
_SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
_WRAPPED_SIZE = 32 + DATA_KEY_SIZE + 16


def new_data_key() -> bytes:
    return os.urandom(DATA_KEY_SIZE)


def seal(data_key: bytes, plaintext: bytes, associated_data: bytes) -> bytes:
    """``nonce || ciphertext || tag`` of ``plaintext`` bound to ``associated_data``."""
    if len(data_key) != DATA_KEY_SIZE:
        raise ValueError(f"data key must be {DATA_KEY_SIZE} bytes, got {len(data_key)}")
    nonce = os.urandom(NONCE_SIZE)
    return nonce + ChaCha20Poly1305(data_key).encrypt(nonce, plaintext, associated_data)


def seal_buffer(data_key: bytes, plaintext: bytes, associated_data: bytes) -> bytearray:
    """:func:`seal`'s ``nonce || ciphertext || tag`` written into one new buffer
    (``encrypt_into``): for a large body, the one copy the stored line is made from."""
    if len(data_key) != DATA_KEY_SIZE:
        raise ValueError(f"data key must be {DATA_KEY_SIZE} bytes, got {len(data_key)}")
    nonce = os.urandom(NONCE_SIZE)
    sealed = bytearray(NONCE_SIZE + len(plaintext) + TAG_SIZE)
    sealed[:NONCE_SIZE] = nonce
    ChaCha20Poly1305(data_key).encrypt_into(
        nonce, plaintext, associated_data, memoryview(sealed)[NONCE_SIZE:]
    )
    return sealed


def open_sealed(data_key: bytes, sealed: bytes, associated_data: bytes) -> bytes:
    """Inverse of :func:`seal`; ``CannotOpen`` on any failure."""
    if len(data_key) != DATA_KEY_SIZE:
        raise ValueError(f"data key must be {DATA_KEY_SIZE} bytes, got {len(data_key)}")
    if len(sealed) < NONCE_SIZE + 16:
        raise CannotOpen("sealed body is too short")
    try:
        return ChaCha20Poly1305(data_key).decrypt(
            sealed[:NONCE_SIZE], sealed[NONCE_SIZE:], associated_data
        )
    except InvalidTag:
        raise CannotOpen("body does not open with this stream key") from None


def _wrap_info(stream: str, epoch: int) -> bytes:
    return b"affidavit/data-key/v1\x00" + stream.encode() + b"\x00" + str(epoch).encode()


@dataclass(frozen=True)
class RecipientKey:
    """An X25519 public key a stream's data keys are sealed to."""

    public: X25519PublicKey

    @classmethod
    def from_text(cls, text: str) -> RecipientKey:
        """Parse the base64 form ``affidavit keys new`` prints; ``ValueError`` if malformed."""
        try:
            raw = base64.b64decode(text.strip(), validate=True)
        except binascii.Error:
            raise ValueError(f"recipient key {text!r} is not base64") from None
        if len(raw) != 32:
            raise ValueError(f"recipient key {text!r} is {len(raw)} bytes, not 32")
        return cls(X25519PublicKey.from_public_bytes(raw))

    def text(self) -> str:
        return base64.b64encode(self.public.public_bytes_raw()).decode("ascii")

    def wrap(self, data_key: bytes, stream: str, epoch: int) -> bytes:
        if len(data_key) != DATA_KEY_SIZE:
            raise ValueError(f"data key must be {DATA_KEY_SIZE} bytes, got {len(data_key)}")
        return _SUITE.encrypt(data_key, self.public, info=_wrap_info(stream, epoch))


@dataclass(frozen=True)
class KeyPair:
    """A recipient's private key; it opens every stream sealed to its public half."""

    private: X25519PrivateKey

    @classmethod
    def generate(cls) -> KeyPair:
        return cls(X25519PrivateKey.generate())

    @property
    def recipient(self) -> RecipientKey:
        return RecipientKey(self.private.public_key())

    def unwrap(self, sealed_key: bytes, stream: str, epoch: int) -> bytes:
        if len(sealed_key) != _WRAPPED_SIZE:
            raise CannotOpen("wrapped data key has the wrong length")
        try:
            key = _SUITE.decrypt(sealed_key, self.private, info=_wrap_info(stream, epoch))
        except (InvalidTag, ValueError):
            raise CannotOpen("data key does not open with this private key") from None
        return bytes(key)

    def to_pem(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    @classmethod
    def from_pem(cls, data: bytes, *, source: str = "key") -> KeyPair:
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{source}: not a PEM private key ({exc})") from None
        if not isinstance(key, X25519PrivateKey):
            raise ValueError(f"{source}: not an X25519 private key")
        return cls(key)

    def write(self, path: Path) -> None:
        """Write the PKCS#8 PEM with mode 0600; refuses to overwrite an existing file."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.to_pem())
            fh.flush()
            os.fsync(fh.fileno())

    @classmethod
    def read(cls, path: Path) -> KeyPair:
        """Load a key file; ``StoreMissing`` if absent, ``ValueError`` if it is not a key."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise StoreMissing(f"key file {path} does not exist") from None
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ValueError(f"key file {path} has mode {mode:04o}: others could read it")
        return cls.from_pem(data, source=str(path))
