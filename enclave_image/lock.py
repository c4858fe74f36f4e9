"""The image's lock file: every build input pinned by SHA-256 (``enclave_image/image.lock.json``).

A rebuild must not depend on a mirror still carrying what we built from, so inputs are kept
in a cache folder by name and checked against this file before a build uses them::

    {"format": "affidavit-image-lock/1",
     "debian": [{"package": "busybox-static", "version": "1:1.35.0-4+b3", "arch": "amd64",
                 "sha256": "…", "url": "https://deb.debian.org/debian/pool/…"}],
     "wheels": [{"name": "pydantic", "version": "2.9.2",
                 "filename": "pydantic-2.9.2-py3-none-any.whl", "sha256": "…"}],
     "ovmf":   {"source": "…", "sha256": "…", "how": "…", "file": "ovmf/OVMF.fd"},
     "kernel": {"source": "…", "sha256": "…", "how": "…", "file": "kernel/vmlinuz"}}

The cache layout (paths relative to the cache folder):

* ``debian/<package>_<version>_<arch>.deb``, the version's ``:`` written ``%3a``: the name
  ``apt-get download`` gives the file;
* ``wheels/<filename>``: the name ``pip download`` gives it (the lock records it because a
  wheel's name carries tags that name and version alone do not fix);
* ``ovmf`` and ``kernel``: their ``file``.

:func:`verify_inputs` hashes every cached file the lock names and reports each one missing
or different; :func:`unpinned` names the sections a complete lock still lacks. This module
never downloads anything and never reads the clock.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "FORMAT",
    "Artifact",
    "DebianPackage",
    "Lock",
    "LockError",
    "Problem",
    "Wheel",
    "file_sha256",
    "load_lock",
    "unpinned",
    "verify_inputs",
]

FORMAT = "affidavit-image-lock/1"
_SHA256 = r"^[0-9a-f]{64}$"


class LockError(ValueError):
    """A lock file that cannot be read, saying where."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _safe_name(value: str) -> str:
    if not value or "/" in value or value in (".", "..") or "\0" in value:
        raise ValueError(f"{value!r} is not a plain file name")
    return value


class DebianPackage(_Model):
    package: str = Field(pattern=r"^[a-z0-9][a-z0-9+.-]+$")
    version: str = Field(pattern=r"^[0-9A-Za-z.+~:-]+$")
    arch: str = Field(pattern=r"^[a-z0-9-]+$")
    sha256: str = Field(pattern=_SHA256)
    url: str

    @property
    def cache_path(self) -> str:
        return f"debian/{self.package}_{self.version.replace(':', '%3a')}_{self.arch}.deb"


class Wheel(_Model):
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    filename: str
    sha256: str = Field(pattern=_SHA256)

    @field_validator("filename")
    @classmethod
    def _plain(cls, value: str) -> str:
        return _safe_name(value)

    @property
    def cache_path(self) -> str:
        return f"wheels/{self.filename}"


class Artifact(_Model):
    """A single pinned file (OVMF, the kernel): where it came from and how it was made."""

    source: str = Field(min_length=1)
    sha256: str = Field(pattern=_SHA256)
    how: str = Field(min_length=1)
    file: str

    @field_validator("file")
    @classmethod
    def _relative(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not value or path.is_absolute() or ".." in path.parts:
            raise ValueError(f"{value!r} is not a path inside the cache folder")
        return value

    @property
    def cache_path(self) -> str:
        return self.file


class Lock(_Model):
    format: str = Field(pattern=f"^{FORMAT}$")
    debian: tuple[DebianPackage, ...] = ()
    wheels: tuple[Wheel, ...] = ()
    ovmf: Artifact | None = None
    kernel: Artifact | None = None


@dataclass(frozen=True)
class Problem:
    """One cached input that does not match the lock: missing (``actual`` None) or changed."""

    kind: Literal["debian", "wheel", "ovmf", "kernel"]
    name: str
    path: Path
    expected: str
    actual: str | None

    def __str__(self) -> str:
        if self.actual is None:
            return f"{self.kind} {self.name}: {self.path} is missing"
        return (
            f"{self.kind} {self.name}: {self.path} has sha256 {self.actual}, "
            f"the lock pins {self.expected}"
        )

    def json(self) -> dict[str, str | None]:
        return {
            "kind": self.kind,
            "name": self.name,
            "path": str(self.path),
            "expected": self.expected,
            "actual": self.actual,
        }


def load_lock(path: Path | str) -> Lock:
    """The lock file at ``path``; ``LockError`` naming the first bad field."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise LockError(f"lock {path}: {exc.strerror or exc}") from None
    try:
        return Lock.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(the file)"
        raise LockError(f"lock {path}: {where}: {first['msg']}") from None


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, hex: the digest every pin in the image's inputs uses."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify_inputs(lock: Lock, cache_dir: Path | str) -> list[Problem]:
    """Every cached input the lock names whose file is missing or hashes differently.

    An empty list means every pinned input is in ``cache_dir`` with its pinned digest.
    """
    cache = Path(cache_dir)
    pinned: list[tuple[Literal["debian", "wheel", "ovmf", "kernel"], str, str, str]] = []
    pinned += [
        ("debian", f"{d.package} {d.version} {d.arch}", d.cache_path, d.sha256) for d in lock.debian
    ]
    pinned += [("wheel", f"{w.name} {w.version}", w.cache_path, w.sha256) for w in lock.wheels]
    if lock.ovmf is not None:
        pinned.append(("ovmf", "OVMF", lock.ovmf.cache_path, lock.ovmf.sha256))
    if lock.kernel is not None:
        pinned.append(("kernel", "kernel", lock.kernel.cache_path, lock.kernel.sha256))
    problems: list[Problem] = []
    for kind, name, rel, expected in pinned:
        path = cache / rel
        actual = file_sha256(path) if path.is_file() else None
        if actual != expected:
            problems.append(Problem(kind, name, path, expected, actual))
    return problems


def unpinned(lock: Lock) -> list[str]:
    """The sections a complete lock must have and this one lacks (empty when complete)."""
    missing = [name for name in ("debian", "wheels") if not getattr(lock, name)]
    # the kernel is a Debian package like the rest; ``kernel`` is only for a kernel built
    # elsewhere, so a complete lock need not have it
    return missing + (["ovmf"] if lock.ovmf is None else [])
