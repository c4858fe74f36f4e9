"""A deterministic initramfs: a cpio "newc" archive of a directory tree, gzip-compressed.

The kernel unpacks the initrd as a cpio archive in the "newc" (SVR4, no CRC) format
(``Documentation/driver-api/early-userspace/buffer-format.rst``). The archive is written by
hand here: the format is a 110-byte ASCII header, a name and the data, each padded to four
bytes, and Python's standard library has no cpio writer (``tarfile`` does tar only). Writing
it ourselves is also what makes it reproducible: every field that a ``find | cpio`` pipeline
would take from the build machine is fixed instead.

What is fixed, so that the output is a function of the tree's names, contents, symlink
targets and executable bits alone:

* order: every entry sorted by its path relative to the root, compared as bytes (a
  directory's own path is a prefix of its contents', so it comes first); the root itself is
  not an entry (the kernel's rootfs already exists);
* owners uid 0, gid 0; ``mtime`` = ``epoch`` (the ``SOURCE_DATE_EPOCH`` convention);
* modes: directories 0755; regular files 0755 when the source has any execute bit, else
  0644 (set-id and sticky bits dropped); symlinks 0777 with their target as data, unchanged;
* inode numbers 1, 2, 3… in archive order; ``nlink`` 2 for directories, 1 otherwise (hard
  links are written as separate files); device numbers 0; the ``TRAILER!!!`` entry last;
* gzip with ``mtime`` 0, no file name and compression level 9.

The compressed bytes are identical for the same zlib; ``cpio_sha256`` (of the uncompressed
archive) is identical on any machine, for comparing builds whose zlib differs.

This module never runs ``cpio`` or ``gzip``, never reads the clock, and refuses device
nodes, FIFOs and sockets (an initramfs that needs ``/dev/console`` gets it from the kernel's
devtmpfs, not from the archive).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAGIC", "TRAILER", "InitrdResult", "source_date_epoch", "write_initrd"]

#: The "newc" header magic (no checksum; "070702" would be the CRC variant).
MAGIC = b"070701"
#: The name of the entry that ends every cpio archive.
TRAILER = b"TRAILER!!!"
#: gzip's level: fixed, because the compressed bytes depend on it.
COMPRESS_LEVEL = 9
_CHUNK = 1 << 20
_DIR_MODE, _EXEC_MODE, _FILE_MODE, _LINK_MODE = 0o755, 0o755, 0o644, 0o777


@dataclass(frozen=True)
class InitrdResult:
    """What :func:`write_initrd` wrote: the compressed file's digest and size, the number of
    entries (the trailer not counted) and the digest of the uncompressed archive."""

    sha256: str
    size: int
    entries: int
    cpio_sha256: str
    epoch: int

    def json(self) -> dict[str, str | int]:
        """A JSON-ready dict of every field."""
        return dict(self.__dict__)


def source_date_epoch(epoch: int | None = None) -> int:
    """``epoch`` if given, else ``$SOURCE_DATE_EPOCH``, else 0; ``ValueError`` if it is not
    a whole number of seconds that fits the header's 32 bits."""
    if epoch is None:
        text = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
        try:
            epoch = int(text) if text else 0
        except ValueError:
            raise ValueError(f"SOURCE_DATE_EPOCH {text!r} is not a whole number") from None
    if not 0 <= epoch < 1 << 32:
        raise ValueError(f"epoch {epoch} does not fit the cpio header (0 to 2**32 - 1)")
    return epoch


def _header(ino: int, mode: int, nlink: int, mtime: int, size: int, name: bytes) -> bytes:
    """One newc header, its name (NUL-terminated) and the padding to four bytes."""
    fields = (ino, mode, 0, 0, nlink, mtime, size, 0, 0, 0, 0, len(name) + 1, 0)
    head = MAGIC + b"".join(b"%08X" % f for f in fields) + name + b"\0"
    return head + bytes(-len(head) % 4)


def _entries(root: Path) -> list[tuple[bytes, os.stat_result]]:
    """Every path under ``root`` (relative, as bytes) with its ``lstat``, in archive order."""
    found: list[tuple[bytes, os.stat_result]] = []
    base = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            found.append((os.path.relpath(full, base), os.lstat(full)))
    found.sort(key=lambda entry: entry[0])
    return found


class _Sink:
    """Writes to the gzip stream and hashes the uncompressed archive on the way."""

    def __init__(self, out: gzip.GzipFile) -> None:
        self.out, self.digest = out, hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.digest.update(data)


def _write_file(sink: _Sink, path: bytes, size: int) -> None:
    written = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sink.write(chunk)
            written += len(chunk)
    if written != size:
        raise ValueError(f"{os.fsdecode(path)} changed while it was archived")
    sink.write(bytes(-size % 4))


def write_initrd(root: Path | str, out: Path | str, *, epoch: int | None = None) -> InitrdResult:
    """Write ``root``'s tree to ``out`` (replaced) as a gzip-compressed newc cpio archive.

    Args:
        root: the directory that becomes ``/`` in the initramfs.
        out: the file to write; written beside itself and renamed into place.
        epoch: every entry's mtime (default :func:`source_date_epoch`).

    Raises:
        ValueError: ``root`` holds a device node, FIFO or socket, ``out`` is inside
            ``root``, a file changed while it was read, or a bad epoch.
        NotADirectoryError: ``root`` is not a directory.
    """
    root, out = Path(root), Path(out)
    mtime = source_date_epoch(epoch)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    if out.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"{out} is inside {root}: the initrd would archive itself")
    entries = _entries(root)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            with gzip.GzipFile(
                filename="", mode="wb", compresslevel=COMPRESS_LEVEL, fileobj=raw, mtime=0
            ) as gz:
                sink = _Sink(gz)
                for ino, (rel, st) in enumerate(entries, start=1):
                    full = os.path.join(os.fsencode(root), rel)
                    if stat.S_ISDIR(st.st_mode):
                        sink.write(_header(ino, stat.S_IFDIR | _DIR_MODE, 2, mtime, 0, rel))
                    elif stat.S_ISLNK(st.st_mode):
                        target = os.readlink(full)
                        mode = stat.S_IFLNK | _LINK_MODE
                        sink.write(_header(ino, mode, 1, mtime, len(target), rel))
                        sink.write(target + bytes(-len(target) % 4))
                    elif stat.S_ISREG(st.st_mode):
                        perm = _EXEC_MODE if st.st_mode & 0o111 else _FILE_MODE
                        size = st.st_size
                        sink.write(_header(ino, stat.S_IFREG | perm, 1, mtime, size, rel))
                        _write_file(sink, full, size)
                    else:
                        raise ValueError(
                            f"{os.fsdecode(full)} is not a file, directory or symlink "
                            f"(mode {st.st_mode:o}): an initramfs gets devices from devtmpfs"
                        )
                sink.write(_header(0, 0, 1, 0, 0, TRAILER))
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    data_digest = hashlib.sha256()
    with out.open("rb") as f:
        while chunk := f.read(_CHUNK):
            data_digest.update(chunk)
    return InitrdResult(
        sha256=data_digest.hexdigest(),
        size=out.stat().st_size,
        entries=len(entries),
        cpio_sha256=sink.digest.hexdigest(),
        epoch=mtime,
    )
