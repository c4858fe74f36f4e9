"""Signed notes, log checkpoints and witness cosignatures (C2SP), with Ed25519 keys.

The log publishes its Merkle tree head as a *checkpoint*: a C2SP signed note whose text is
the origin, the tree size and the root hash. Witnesses may add *cosignatures* to the same
note. This module writes and reads those bytes exactly as the specifications say, so that
any C2SP-speaking tool (Go's ``golang.org/x/mod/sumdb/note``, transparency-dev witnesses)
can check our checkpoints and we can check theirs.

Parsing is kept apart from checking signatures, as in sigstore-python: ``parse_note`` and
``parse_checkpoint`` only say whether the bytes are well formed (``MalformedNote``);
``open_note`` and ``open_checkpoint`` then check the signatures of the keys the caller
trusts (``SignatureInvalid``). Text from a note must not be acted on before it is opened.

What this module never does:

* it never reads the clock: a cosignature's timestamp is only compared with a time when the
  caller passes one (``open_note(..., now=...)``), and ``cosign`` takes its timestamp;
* it never does I/O, except the explicit key-file helper ``load_or_create``;
* it never trusts a key because a note names it: only the verifiers passed in count.

Specifications (C2SP, https://c2sp.org):

* ``signed-note`` v1.0.0: note format, key names, key IDs, verifier keys (vkeys), the rules
  for unknown keys and failed signatures;
* ``tlog-checkpoint`` v1.0.0: the note text of a checkpoint;
* ``tlog-cosignature`` v1.0.0: Ed25519 cosignatures (signature type 0x04), the
  ``cosignature/v1`` signed message and the timestamped signature layout.

Signer key strings (``PRIVATE+KEY+...``) follow Go's ``sumdb/note`` encoding; a cosigner's
signer key uses the same layout with type byte 0x04, mirroring its vkey.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal, Self

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "MAX_SIGNATURES",
    "Checkpoint",
    "CheckpointError",
    "CosignatureSigner",
    "InvalidKey",
    "KeyFileError",
    "MalformedNote",
    "Note",
    "NoteSignature",
    "SignatureInvalid",
    "Signer",
    "VerifiedCosignature",
    "VerifiedNote",
    "Verifier",
    "cosignature_message",
    "key_id",
    "open_checkpoint",
    "open_note",
    "parse_checkpoint",
    "parse_note",
    "sign_checkpoint",
]

#: signed-note §Format: verifiers SHOULD cap the number of signatures (and MUST accept 16).
#: Go's ``note.Open`` allows 100; so do we, so that a note Go accepts is not refused here.
MAX_SIGNATURES = 100

#: signed-note §Signature types.
ALG_ED25519 = 0x01
#: signed-note §Signature types / tlog-cosignature §Format.
ALG_COSIGNATURE_V1 = 0x04

_SIG_PREFIX = "\u2014 "  # signed-note §Format: em dash (U+2014), space
_ED25519_SIG_LEN = 64
_COSIG_LEN = 8 + _ED25519_SIG_LEN  # tlog-cosignature §Format: u64 timestamp || signature
_MAX_TIMESTAMP = 2**63 - 1  # tlog-cosignature §Format: "MUST NOT exceed 2^63 - 1"
_MAX_TREE_SIZE = 2**64 - 1  # tree sizes are uint64 in the tlog ecosystem
_ROOT_HASH_LEN = 32  # tlog-checkpoint §Note text: an RFC 6962 (SHA-256) root hash
_SKEY_PREFIX = "PRIVATE+KEY+"

Kind = Literal["ed25519", "cosignature"]
_KIND_BY_ALG: dict[int, Kind] = {ALG_ED25519: "ed25519", ALG_COSIGNATURE_V1: "cosignature"}


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class CheckpointError(Exception):
    """Base of every error of this module."""


class MalformedNote(CheckpointError):
    """The bytes are not a well-formed note or checkpoint; ``line`` is 1-based when known."""

    def __init__(self, reason: str, line: int | None = None) -> None:
        self.reason = reason
        self.line = line
        super().__init__(reason if line is None else f"line {line}: {reason}")


class SignatureInvalid(CheckpointError):
    """No trusted key verified the note, or a trusted key's signature failed to verify."""

    def __init__(self, reason: str, key_name: str | None = None) -> None:
        self.reason = reason
        self.key_name = key_name
        super().__init__(reason)


class InvalidKey(CheckpointError):
    """A verifier or signer key string (or key name) that cannot be used."""


class KeyFileError(CheckpointError):
    """A signing key file that must not be used (readable by others, wrong name, unreadable)."""


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def _b64decode(s: str) -> bytes:
    """Decode standard base64 (RFC 4648 §4), refusing anything but the canonical encoding.

    Canonical only (padding present, zero pad bits, RFC 4648 §3.5) so that every value has
    one spelling and a parsed checkpoint's ``body()`` is byte-for-byte the signed text.
    """
    try:
        raw = binascii.a2b_base64(s.encode("ascii"), strict_mode=True)
    except (UnicodeEncodeError, binascii.Error) as exc:
        raise ValueError(f"not standard base64: {exc}") from None
    if base64.b64encode(raw).decode("ascii") != s:
        raise ValueError("not the canonical standard base64 encoding")
    return raw


def _b64encode(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _name_problem(name: str) -> str | None:
    """signed-note §Format: key names are non-empty, without Unicode spaces or '+'."""
    if not name:
        return "key name is empty"
    if any(ch.isspace() for ch in name):
        return f"key name {name!r} contains a space character"
    if "+" in name:
        return f"key name {name!r} contains '+'"
    if any(ord(ch) < 0x20 for ch in name):
        return f"key name {name!r} contains a control character"
    return None


def _first_control_char(text: str) -> tuple[int, str] | None:
    """signed-note §Format: no ASCII control characters other than newline.

    Returns the 1-based line number and the offending character, or None.
    """
    for index, ch in enumerate(text):
        if ch < " " and ch != "\n":
            return text.count("\n", 0, index) + 1, ch
    return None


def _text_problem(text: str) -> str | None:
    """What keeps ``text`` from being the text of a signed note (signed-note §Format)."""
    if not text:
        return "note text is empty"
    if not text.endswith("\n"):
        return "note text does not end in a newline"
    bad = _first_control_char(text)
    if bad is not None:
        return f"line {bad[0]} contains control character {bad[1]!r}"
    return None


def key_id(name: str, alg: int, public_key: bytes) -> bytes:
    """signed-note §Signatures: SHA-256(key name || 0x0A || signature type || public key)[:4]."""
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([alg]) + public_key).digest()[:4]


def cosignature_message(checkpoint_text: str, timestamp: int) -> bytes:
    """tlog-cosignature §Ed25519 signed message: header, time line, then the whole note text."""
    if not 0 <= timestamp <= _MAX_TIMESTAMP:
        raise ValueError(f"cosignature timestamp {timestamp} is outside 0..2^63-1")
    return f"cosignature/v1\ntime {timestamp}\n{checkpoint_text}".encode()


# --------------------------------------------------------------------------------------------
# Notes: parsing and encoding, no cryptography
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoteSignature:
    """One signature line: the key it names and the bytes after the 4-byte key ID."""

    key_name: str
    key_id: bytes
    signature: bytes

    def __post_init__(self) -> None:
        problem = _name_problem(self.key_name)
        if problem is not None:
            raise ValueError(problem)
        if len(self.key_id) != 4:
            raise ValueError(f"key ID must be 4 bytes, got {len(self.key_id)}")
        if not self.signature:
            raise ValueError("signature is empty")

    def line(self) -> str:
        """The signature line, newline included (signed-note §Signatures)."""
        return f"{_SIG_PREFIX}{self.key_name} {_b64encode(self.key_id + self.signature)}\n"


@dataclass(frozen=True)
class Note:
    """A parsed but *unverified* note: do not act on ``text`` before ``open_note``."""

    text: str
    signatures: tuple[NoteSignature, ...]

    def encode(self) -> bytes:
        """The note's bytes: text, a blank line, the signature lines (signed-note §Format)."""
        problem = _text_problem(self.text)
        if problem is not None:
            raise ValueError(problem)
        if not self.signatures:
            raise ValueError("a note needs at least one signature")
        if len(self.signatures) > MAX_SIGNATURES:
            raise ValueError(f"a note holds at most {MAX_SIGNATURES} signatures")
        return (self.text + "\n" + "".join(s.line() for s in self.signatures)).encode("utf-8")


def parse_note(data: bytes) -> Note:
    """Split a signed note into its text and signature lines; check structure only.

    Raises ``MalformedNote`` naming the line and the problem. Signatures are not checked.
    """
    # signed-note §Format: "Signed notes MUST be valid UTF-8".
    try:
        msg = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise MalformedNote(f"not valid UTF-8 at byte {exc.start}", line) from None
    # signed-note §Format: no ASCII control characters other than newline.
    bad = _first_control_char(msg)
    if bad is not None:
        raise MalformedNote(f"control character {bad[1]!r} is not allowed", bad[0])
    if not msg:
        raise MalformedNote("note is empty")
    # signed-note §Format: every line, the last signature line included, ends in a newline.
    if not msg.endswith("\n"):
        raise MalformedNote("missing final newline", msg.count("\n") + 1)
    # signed-note §Format: the text is separated from the signatures by the LAST empty line.
    split = msg.rfind("\n\n")
    if split < 0:
        raise MalformedNote("no blank line separating the text from the signatures")
    text, sig_block = msg[: split + 1], msg[split + 2 :]
    first_sig_line = text.count("\n") + 2
    if not sig_block:
        raise MalformedNote("no signature lines after the blank line", first_sig_line)
    lines = sig_block[:-1].split("\n")
    # signed-note §Format: a cap on the number of signatures (Go's note.Open uses 100 too).
    if len(lines) > MAX_SIGNATURES:
        raise MalformedNote(
            f"{len(lines)} signature lines; at most {MAX_SIGNATURES} are accepted",
            first_sig_line + MAX_SIGNATURES,
        )
    signatures = tuple(
        _parse_signature_line(line, first_sig_line + i) for i, line in enumerate(lines)
    )
    return Note(text=text, signatures=signatures)


def _parse_signature_line(line: str, lineno: int) -> NoteSignature:
    """signed-note §Signatures: ``— <key name> base64(32-bit key ID || signature)``."""
    if not line.startswith(_SIG_PREFIX):
        raise MalformedNote("signature line does not start with an em dash and a space", lineno)
    name, sep, b64 = line[len(_SIG_PREFIX) :].partition(" ")
    problem = _name_problem(name)
    if problem is not None:
        raise MalformedNote(problem, lineno)
    if not sep or not b64:
        raise MalformedNote(f"signature line for {name!r} has no signature", lineno)
    try:
        raw = _b64decode(b64)
    except ValueError as exc:
        raise MalformedNote(f"signature of {name!r} is {exc}", lineno) from None
    # signed-note §Format: 4 bytes of key ID followed by a signature of n > 0 bytes.
    if len(raw) < 5:
        raise MalformedNote(f"signature of {name!r} is {len(raw)} bytes; at least 5", lineno)
    return NoteSignature(key_name=name, key_id=raw[:4], signature=raw[4:])


# --------------------------------------------------------------------------------------------
# Checkpoints: the note text of a log's tree head
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A tree head: origin, tree size, RFC 6962 root hash, optional extension lines."""

    origin: str
    size: int
    root_hash: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "extensions", tuple(self.extensions))
        # tlog-checkpoint §Note text, items 1-4; misuse by our own callers is a ValueError.
        if not self.origin or "\n" in self.origin or _first_control_char(self.origin):
            raise ValueError(f"origin {self.origin!r} must be one non-empty line")
        if isinstance(self.size, bool) or not 0 <= self.size <= _MAX_TREE_SIZE:
            raise ValueError(f"tree size {self.size!r} is not a uint64")
        if len(self.root_hash) != _ROOT_HASH_LEN:
            raise ValueError(f"root hash must be {_ROOT_HASH_LEN} bytes")
        for ext in self.extensions:
            if not ext or "\n" in ext or _first_control_char(ext):
                raise ValueError(f"extension line {ext!r} must be one non-empty line")

    def body(self) -> str:
        """The exact note text (tlog-checkpoint §Note text), final newline included."""
        lines = [self.origin, str(self.size), _b64encode(self.root_hash), *self.extensions]
        return "".join(line + "\n" for line in lines)


def parse_checkpoint(text: str) -> Checkpoint:
    """Parse a checkpoint's note text; raises ``MalformedNote`` naming the line."""
    bad = _first_control_char(text)
    if bad is not None:  # signed-note §Format
        raise MalformedNote(f"control character {bad[1]!r} is not allowed", bad[0])
    if not text.endswith("\n"):  # signed-note §Format: the text ends in a newline
        raise MalformedNote("checkpoint text does not end in a newline", text.count("\n") + 1)
    lines = text[:-1].split("\n")
    # tlog-checkpoint §Note text: at least three lines.
    if len(lines) < 3:
        raise MalformedNote(
            f"checkpoint has {len(lines)} line{'' if len(lines) == 1 else 's'}; origin, tree size "
            "and root hash are required"
        )
    origin, size_line, root_line, *extensions = lines
    # tlog-checkpoint §Note text, 1: the origin MUST be non-empty.
    if not origin:
        raise MalformedNote("origin is empty", 1)
    # tlog-checkpoint §Note text, 2: ASCII decimal, no leading zeroes (except "0").
    if not size_line or any(c not in "0123456789" for c in size_line):
        raise MalformedNote(f"tree size {size_line!r} is not an ASCII decimal number", 2)
    if size_line != "0" and size_line.startswith("0"):
        raise MalformedNote(f"tree size {size_line!r} has a leading zero", 2)
    size = int(size_line)
    if size > _MAX_TREE_SIZE:
        raise MalformedNote(f"tree size {size_line} does not fit in 64 bits", 2)
    # tlog-checkpoint §Note text, 3: base64 of the RFC 6962 (SHA-256) root hash.
    try:
        root = _b64decode(root_line)
    except ValueError as exc:
        raise MalformedNote(f"root hash is {exc}", 3) from None
    if len(root) != _ROOT_HASH_LEN:
        raise MalformedNote(f"root hash is {len(root)} bytes; expected {_ROOT_HASH_LEN}", 3)
    # tlog-checkpoint §Note text, 4: extension lines, if any, MUST be non-empty.
    for offset, ext in enumerate(extensions):
        if not ext:
            raise MalformedNote("extension line is empty", 4 + offset)
    return Checkpoint(origin=origin, size=size, root_hash=root, extensions=tuple(extensions))


# --------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------


def _parse_hex_id(hex_id: str) -> bytes:
    if len(hex_id) != 8 or any(c not in "0123456789abcdefABCDEF" for c in hex_id):
        raise InvalidKey(f"key ID {hex_id!r} is not 8 hexadecimal digits")
    return bytes.fromhex(hex_id)


@dataclass(frozen=True)
class Verifier:
    """A trusted public key, from a vkey ``<name>+<hex key ID>+<base64(type || key)>``.

    ``kind`` is "ed25519" (signed-note type 0x01, e.g. the log's key) or "cosignature"
    (tlog-cosignature type 0x04, a witness).
    """

    name: str
    key_id: bytes
    public_key: bytes
    kind: Kind

    def __post_init__(self) -> None:
        problem = _name_problem(self.name)
        if problem is not None:
            raise InvalidKey(problem)
        if len(self.public_key) != 32:
            raise InvalidKey(f"{self.name}: an Ed25519 public key is 32 bytes")
        # signed-note §Signatures: the key ID is derived from name, type and key; one that
        # does not match was mistyped or tampered with.
        if key_id(self.name, self.alg, self.public_key) != self.key_id:
            raise InvalidKey(f"{self.name}: key ID {self.key_id.hex()} does not match the key")

    @classmethod
    def from_vkey(cls, vkey: str) -> Verifier:
        """Parse a vkey (signed-note §Verifier keys) and check that its key ID is right."""
        vkey = vkey.strip()
        parts = vkey.split("+", 2)
        if len(parts) != 3:
            raise InvalidKey("vkey must be <name>+<hex key ID>+<base64 key>")
        name, hex_id, key_b64 = parts
        problem = _name_problem(name)
        if problem is not None:
            raise InvalidKey(problem)
        kid = _parse_hex_id(hex_id)
        try:
            raw = _b64decode(key_b64)
        except ValueError as exc:
            raise InvalidKey(f"vkey {name!r}: key is {exc}") from None
        if len(raw) != 33 or raw[0] not in _KIND_BY_ALG:
            raise InvalidKey(f"vkey {name!r}: expected type 0x01 or 0x04 and a 32-byte Ed25519 key")
        return cls(name=name, key_id=kid, public_key=raw[1:], kind=_KIND_BY_ALG[raw[0]])

    @property
    def alg(self) -> int:
        return ALG_ED25519 if self.kind == "ed25519" else ALG_COSIGNATURE_V1

    def vkey(self) -> str:
        raw = bytes([self.alg]) + self.public_key
        return f"{self.name}+{self.key_id.hex()}+{_b64encode(raw)}"

    def verify(self, text: str, signature: bytes) -> int | None:
        """Check one signature over ``text``; return the cosignature timestamp, if any.

        Raises ``SignatureInvalid`` naming this key when the signature does not verify.
        """
        label = f"{self.name} ({self.key_id.hex()})"
        if self.kind == "ed25519":
            # signed-note §Ed25519 signatures: RFC 8032 over the note text.
            if len(signature) != _ED25519_SIG_LEN:
                raise SignatureInvalid(
                    f"signature from {label} is {len(signature)} bytes; Ed25519 uses 64",
                    self.name,
                )
            message, timestamp, sig = text.encode("utf-8"), None, signature
        else:
            # tlog-cosignature §Format: timestamped_signature = u64 timestamp || ed25519[64].
            if len(signature) != _COSIG_LEN:
                raise SignatureInvalid(
                    f"cosignature from {label} is {len(signature)} bytes; expected 72",
                    self.name,
                )
            (timestamp,) = struct.unpack(">Q", signature[:8])
            if timestamp > _MAX_TIMESTAMP:  # tlog-cosignature §Format
                raise SignatureInvalid(
                    f"cosignature from {label} has timestamp {timestamp} > 2^63-1", self.name
                )
            message, sig = cosignature_message(text, timestamp), signature[8:]
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(sig, message)
        except InvalidSignature:
            raise SignatureInvalid(f"signature from {label} does not verify", self.name) from None
        return timestamp


def _fsync_dir(folder: Path) -> None:
    """Make a new directory entry durable (POSIX needs the directory fsynced too)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _KeyPair:
    """An Ed25519 private key with its note key name; the signature type is per subclass."""

    ALG: ClassVar[int]

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        problem = _name_problem(name)
        if problem is not None:
            raise InvalidKey(problem)
        self.name = name
        self._private = private_key
        self.key_id = key_id(name, self.ALG, self.public_key_bytes())

    def __repr__(self) -> str:  # never the seed
        return f"{type(self).__name__}(name={self.name!r}, key_id={self.key_id.hex()!r})"

    @classmethod
    def generate(cls, name: str) -> Self:
        """A fresh key from the operating system's CSPRNG."""
        return cls(name, Ed25519PrivateKey.generate())

    @classmethod
    def from_skey(cls, skey: str) -> Self:
        """Parse ``PRIVATE+KEY+<name>+<hex key ID>+<base64(type || 32-byte seed)>``."""
        skey = skey.strip()
        if not skey.startswith(_SKEY_PREFIX):
            raise InvalidKey("signer key must start with PRIVATE+KEY+")
        parts = skey[len(_SKEY_PREFIX) :].split("+", 2)
        if len(parts) != 3:
            raise InvalidKey("signer key must be PRIVATE+KEY+<name>+<hex key ID>+<base64 key>")
        name, hex_id, key_b64 = parts
        kid = _parse_hex_id(hex_id)
        try:
            raw = _b64decode(key_b64)
        except ValueError as exc:
            raise InvalidKey(f"signer key {name!r}: key is {exc}") from None
        if len(raw) != 33 or raw[0] != cls.ALG:
            raise InvalidKey(
                f"signer key {name!r}: expected type 0x{cls.ALG:02x} and a 32-byte seed"
            )
        signer = cls(name, Ed25519PrivateKey.from_private_bytes(raw[1:]))
        if signer.key_id != kid:
            raise InvalidKey(f"signer key {name!r}: key ID {hex_id} does not match the key")
        return signer

    @classmethod
    def load_or_create(cls, path: Path, name: str) -> Self:
        """Load the key file at ``path``, or create it (mode 0600) at first start.

        The file holds the signer key string and a newline. A file that group or others
        may access is refused: anyone who can read it can sign as us.
        """
        path = Path(path)
        if path.exists():
            return cls._load(path, name)
        # Write a temporary file, fsync it, then link it into place: a crash at any point
        # leaves either no key file or a whole one, never an empty file that blocks restart.
        signer = cls.generate(name)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            # UTF-8: signed-note key names are UTF-8, the rest of the key string is ASCII
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(signer.skey() + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:  # another process created it first: use theirs
                return cls._load(path, name)
            _fsync_dir(path.parent)
        finally:
            tmp.unlink(missing_ok=True)
        return signer

    @classmethod
    def _load(cls, path: Path, name: str) -> Self:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise KeyFileError(f"cannot open signing key file {path}: {exc}") from exc
        try:
            st = os.fstat(fd)  # the file we read, not whatever the path is now
            # before fdopen, which would refuse a directory with an untyped IsADirectoryError
            if not stat.S_ISREG(st.st_mode):
                raise KeyFileError(f"signing key file {path} is not a regular file")
            mode = stat.S_IMODE(st.st_mode)
            if mode & 0o077:
                raise KeyFileError(
                    f"signing key file {path} has mode {mode:#o}; group and others must have "
                    "no access (chmod 600)"
                )
        except KeyFileError:
            os.close(fd)
            raise
        with os.fdopen(fd, "r", encoding="utf-8") as handle:
            try:
                content = handle.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise KeyFileError(f"cannot read signing key file {path}: {exc}") from exc
        try:
            signer = cls.from_skey(content)
        except InvalidKey as exc:
            raise KeyFileError(f"signing key file {path}: {exc}") from exc
        if signer.name != name:
            raise KeyFileError(
                f"signing key file {path} holds key {signer.name!r}, expected {name!r}"
            )
        return signer

    def public_key_bytes(self) -> bytes:
        return self._private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def skey(self) -> str:
        seed = self._private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        raw = bytes([self.ALG]) + seed
        return f"{_SKEY_PREFIX}{self.name}+{self.key_id.hex()}+{_b64encode(raw)}"

    def vkey(self) -> str:
        raw = bytes([self.ALG]) + self.public_key_bytes()
        return f"{self.name}+{self.key_id.hex()}+{_b64encode(raw)}"

    def verifier(self) -> Verifier:
        return Verifier.from_vkey(self.vkey())


class Signer(_KeyPair):
    """A note signing key (signed-note Ed25519, type 0x01): the log's checkpoint key."""

    ALG: ClassVar[int] = ALG_ED25519

    def sign(self, text: str) -> NoteSignature:
        """Sign note text (signed-note §Ed25519 signatures: over the text, final newline in)."""
        problem = _text_problem(text)
        if problem is not None:
            raise ValueError(problem)
        sig = self._private.sign(text.encode("utf-8"))
        return NoteSignature(key_name=self.name, key_id=self.key_id, signature=sig)

    def sign_note(self, text: str) -> bytes:
        """The complete signed note: text, blank line, our signature line."""
        return Note(text=text, signatures=(self.sign(text),)).encode()


class CosignatureSigner(_KeyPair):
    """A witness key (tlog-cosignature Ed25519, type 0x04).

    It signs only ``cosignature/v1`` messages over checkpoints, never free text, and must not
    share its key with a ``Signer`` (tlog-cosignature §Ed25519 signed message).
    """

    ALG: ClassVar[int] = ALG_COSIGNATURE_V1

    def cosign(self, checkpoint_text: str, timestamp: int) -> NoteSignature:
        """Cosign a checkpoint's note text at ``timestamp`` (POSIX seconds, given by caller)."""
        parse_checkpoint(checkpoint_text)  # a cosignature is only ever over a checkpoint
        message = cosignature_message(checkpoint_text, timestamp)
        sig = struct.pack(">Q", timestamp) + self._private.sign(message)
        return NoteSignature(key_name=self.name, key_id=self.key_id, signature=sig)


# --------------------------------------------------------------------------------------------
# Opening: checking signatures against trusted keys
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifiedCosignature:
    """A witness cosignature that verified: who, and the time it claims (not checked)."""

    key_name: str
    key_id: bytes
    timestamp: int


@dataclass(frozen=True)
class VerifiedNote:
    """A note whose signatures from trusted keys all verified (at least one did)."""

    note: Note
    verified_by: tuple[str, ...]
    ignored: tuple[NoteSignature, ...]
    cosignatures: tuple[VerifiedCosignature, ...] = ()


def open_note(
    data: bytes, verifiers: Sequence[Verifier], *, now: int | None = None
) -> VerifiedNote:
    """Parse ``data`` and check it against the trusted ``verifiers`` (signed-note §Signatures).

    Signatures whose (name, key ID) is not a trusted key are ignored. A trusted key's
    signature that fails rejects the note, and so does a note no trusted key verified.
    ``now``, when given, rejects cosignatures dated after it (tlog-cosignature §Format).
    """
    known: dict[tuple[str, bytes], Verifier] = {}
    for trusted in verifiers:
        ident = (trusted.name, trusted.key_id)
        if ident in known:
            raise ValueError(f"two verifiers share name {trusted.name!r} and key ID")
        known[ident] = trusted

    note = parse_note(data)
    first_sig_line = note.text.count("\n") + 2
    seen: set[tuple[str, bytes]] = set()
    verified: list[str] = []
    ignored: list[NoteSignature] = []
    cosigs: list[VerifiedCosignature] = []
    for index, sig in enumerate(note.signatures):
        ident = (sig.key_name, sig.key_id)
        verifier = known.get(ident)
        # signed-note §Signatures: ignore unknown keys, even if name or ID alone matches.
        if verifier is None:
            ignored.append(sig)
            continue
        # As Go's note.Open: a trusted key may sign once; a repeat is a malformed note.
        if ident in seen:
            raise MalformedNote(
                f"second signature from {sig.key_name} ({sig.key_id.hex()})",
                first_sig_line + index,
            )
        seen.add(ident)
        # signed-note §Signatures: a known key MUST be verified; failure rejects the note.
        timestamp = verifier.verify(note.text, sig.signature)
        if timestamp is not None:
            if now is not None and timestamp > now:
                raise SignatureInvalid(
                    f"cosignature from {sig.key_name} is dated {timestamp}, after {now}",
                    sig.key_name,
                )
            cosigs.append(VerifiedCosignature(sig.key_name, sig.key_id, timestamp))
        verified.append(sig.key_name)
    # signed-note §Signatures: no signature from a known key verified -> MUST reject.
    if not verified:
        present = ", ".join(f"{s.key_name} ({s.key_id.hex()})" for s in note.signatures)
        raise SignatureInvalid(f"no signature from a trusted key; note is signed by {present}")
    return VerifiedNote(
        note=note, verified_by=tuple(verified), ignored=tuple(ignored), cosignatures=tuple(cosigs)
    )


def sign_checkpoint(signer: Signer, cp: Checkpoint) -> bytes:
    """The log's signed checkpoint note for ``cp``."""
    return signer.sign_note(cp.body())


def open_checkpoint(
    data: bytes, verifiers: Sequence[Verifier], *, now: int | None = None
) -> tuple[Checkpoint, VerifiedNote]:
    """Open a checkpoint note: signatures first (``open_note``), then the text's structure.

    Which keys are required (the log's, a quorum of witnesses) is the caller's policy:
    inspect ``verified_by`` and ``cosignatures``.
    """
    opened = open_note(data, verifiers, now=now)
    return parse_checkpoint(opened.note.text), opened


def log_origin(key_name: str, key_id: bytes, stream: str) -> str:
    """The checkpoint origin of one stream of our log: ``<key name>/<key id hex>/<stream>``.

    Unique per log key and per stream, so a checkpoint of one stream can never pass for
    another's, and an auditor derives it from the log key alone.
    """
    return f"{key_name}/{key_id.hex()}/{stream}"
