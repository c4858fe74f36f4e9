"""dm-verity hash trees, written exactly as ``veritysetup format`` writes them.

The image's root file system is a read-only data device checked by the kernel's dm-verity
target against a hash tree on a second device; the tree's root hash goes on the kernel
command line, which the firmware measures. :func:`format_verity` writes that hash device
(superblock, then the tree) and returns the root hash; :func:`cmdline` gives the
``dm-mod.create=`` fragment that opens the verified device at boot.

Hand-written on purpose: no maintained Python library computes dm-verity trees (the usual
route is to shell out to ``veritysetup`` from cryptsetup, which a reproducible build would
then have to pin as well). The layout follows cryptsetup's ``lib/verity/verity.c`` and
``lib/verity/verity_hash.c`` and the kernel's ``Documentation/admin-guide/device-mapper/
verity.rst``; ``tests/enclave_image/test_verity.py`` checks the root hash and the hash file
byte for byte against the real ``veritysetup``.

What is written (format version 1, ``hash_type`` 1, the only one supported here):

* block 0 of the hash device: the 512-byte verity superblock (little-endian: signature
  ``verity\\0\\0``, superblock version 1, hash type 1, UUID, algorithm name, data and hash
  block sizes, data block count, salt size, salt), zero-padded to one hash block;
* then the tree's levels, the *top* level first. Level 0 holds one digest per data block;
  level *i* + 1 one digest per hash block of level *i*; a level with one block is the top.
  Digests sit at a fixed stride (the digest size rounded up to a power of two) and each
  level's last block is zero-padded;
* each digest is ``sha256(salt || block)``; the root hash is the digest of the top level's
  single block (of the one data block itself when there is only one).

This module never runs ``veritysetup``, never touches a block device or the device mapper,
and never reads the clock; with a given salt and UUID its output is a function of the data.
"""

from __future__ import annotations

import hashlib
import os
import struct
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = [
    "ALGORITHM",
    "HASH_TYPE",
    "SUPERBLOCK_SIZE",
    "Superblock",
    "VerityResult",
    "cmdline",
    "format_verity",
    "hash_levels",
]

#: The superblock's first eight bytes.
SIGNATURE = b"verity\0\0"
#: The superblock layout's own version (``struct verity_sb.version``).
SUPERBLOCK_VERSION = 1
#: The hash format: 1 is "normal" (salt first), 0 is Chrome OS (salt last); only 1 is written.
HASH_TYPE = 1
#: The digest algorithm, as the kernel and cryptsetup name it.
ALGORITHM = "sha256"
#: ``struct verity_sb``: signature, version, hash_type, uuid[16], algorithm[32],
#: data_block_size, hash_block_size, data_blocks (u64), salt_size (u16), 6 pad, salt[256],
#: 168 pad; little-endian, packed.
_SB = struct.Struct("<8sII16s32sIIQH6x256s168x")
SUPERBLOCK_SIZE = _SB.size
MAX_SALT = 256
MIN_BLOCK, MAX_BLOCK = 512, 512 * 1024
_DIGEST_SIZE = hashlib.new(ALGORITHM).digest_size

assert SUPERBLOCK_SIZE == 512


@dataclass(frozen=True)
class Superblock:
    """The verity superblock at the start of the hash device."""

    uuid: uuidlib.UUID
    data_blocks: int
    salt: bytes
    data_block_size: int = 4096
    hash_block_size: int = 4096
    algorithm: str = ALGORITHM
    hash_type: int = HASH_TYPE

    def to_bytes(self) -> bytes:
        """The 512 bytes cryptsetup's ``VERITY_write_sb`` writes."""
        return _SB.pack(
            SIGNATURE,
            SUPERBLOCK_VERSION,
            self.hash_type,
            self.uuid.bytes,
            self.algorithm.encode("ascii"),
            self.data_block_size,
            self.hash_block_size,
            self.data_blocks,
            len(self.salt),
            self.salt,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Superblock:
        """Parse a superblock (its first 512 bytes); ``ValueError`` if it is not one."""
        if len(data) < SUPERBLOCK_SIZE:
            raise ValueError(f"a verity superblock is {SUPERBLOCK_SIZE} bytes, got {len(data)}")
        (sig, version, hash_type, raw_uuid, algorithm, dbs, hbs, blocks, salt_size, salt) = (
            _SB.unpack_from(data)
        )
        if sig != SIGNATURE or version != SUPERBLOCK_VERSION:
            raise ValueError(f"not a verity superblock (signature {sig!r}, version {version})")
        if salt_size > MAX_SALT:
            raise ValueError(f"salt size {salt_size} is over {MAX_SALT}")
        return cls(
            uuid=uuidlib.UUID(bytes=raw_uuid),
            data_blocks=blocks,
            salt=salt[:salt_size],
            data_block_size=dbs,
            hash_block_size=hbs,
            algorithm=algorithm.rstrip(b"\0").decode("ascii"),
            hash_type=hash_type,
        )


@dataclass(frozen=True)
class VerityResult:
    """What :func:`format_verity` wrote: everything the kernel table and an auditor need.

    ``hash_offset`` is the byte offset of the tree in the hash file (after the superblock's
    block) and ``hash_start_block`` the same in hash blocks, as the verity table takes it;
    ``hash_blocks`` counts the tree's blocks, ``hash_size`` is the hash file's length.
    """

    root_hash: str
    salt: str
    uuid: str
    data_blocks: int
    data_block_size: int
    hash_block_size: int
    hash_offset: int
    hash_start_block: int
    hash_blocks: int
    hash_size: int
    levels: int
    algorithm: str = ALGORITHM
    hash_type: int = HASH_TYPE

    def json(self) -> dict[str, str | int]:
        """A JSON-ready dict of every field."""
        return dict(self.__dict__)


def _bits_down(n: int) -> int:
    """floor(log2(n)) for n >= 1 (cryptsetup's ``get_bits_down``)."""
    return n.bit_length() - 1


def _check_block_size(name: str, size: int) -> None:
    if size < MIN_BLOCK or size > MAX_BLOCK or size & (size - 1):
        raise ValueError(
            f"{name} {size} is not a power of two from {MIN_BLOCK} to {MAX_BLOCK} bytes"
        )


def hash_levels(data_blocks: int, hash_block_size: int = 4096) -> list[int]:
    """The number of hash blocks of each level, level 0 (over the data) first.

    Level *i* has ``ceil(data_blocks / per_block ** (i + 1))`` blocks, ``per_block`` being
    the digests one hash block holds (128 for sha256 in 4096 bytes); levels are added until
    one block covers everything, so one data block needs no level at all.
    """
    if data_blocks < 1:
        raise ValueError(f"a verity device needs at least one data block, got {data_blocks}")
    bits = _bits_down(hash_block_size // _DIGEST_SIZE)
    levels = 0
    while bits * levels < 64 and (data_blocks - 1) >> (bits * levels):
        levels += 1
    return [-(-data_blocks // (1 << (bits * (i + 1)))) for i in range(levels)]


def _hash_blocks(
    source: IO[bytes],
    offset: int,
    count: int,
    block_size: int,
    salted: hashlib._Hash,
    out: IO[bytes] | None,
    hash_block_size: int,
) -> bytes:
    """Digest ``count`` blocks of ``source`` from ``offset``; write them, packed into hash
    blocks, to ``out`` at its current position. Return the last digest (the root when
    ``count`` is 1)."""
    per_block = 1 << _bits_down(hash_block_size // _DIGEST_SIZE)
    stride = 1 << (_DIGEST_SIZE - 1).bit_length()  # the digest size rounded up to 2**k
    pad = bytes(stride - _DIGEST_SIZE)
    source.seek(offset)
    digest = b""
    done = 0
    while done < count:
        chunk = []
        for _ in range(min(per_block, count - done)):
            block = source.read(block_size)
            if len(block) != block_size:
                raise ValueError(f"short read at block {done}: the data changed under us")
            h = salted.copy()
            h.update(block)
            digest = h.digest()
            chunk.append(digest + pad)
            done += 1
        if out is not None:
            filled = b"".join(chunk)
            out.write(filled + bytes(hash_block_size - len(filled)))
    return digest


def format_verity(
    data_path: Path | str,
    hash_path: Path | str,
    *,
    salt: bytes,
    uuid: str | None = None,
    data_block_size: int = 4096,
    hash_block_size: int = 4096,
) -> VerityResult:
    """Write the dm-verity hash device for ``data_path`` to ``hash_path`` (replaced) as
    ``veritysetup format --salt HEX --uuid UUID --hash sha256`` would, and return the root.

    Args:
        data_path: the data device's image; its whole length is protected, so it must be a
            non-empty multiple of ``data_block_size`` (``veritysetup`` would silently leave
            a tail unprotected; we refuse it).
        hash_path: the hash file to write: superblock, then the tree, top level first.
        salt: 0 to 256 bytes (32 random bytes is ``veritysetup``'s default; pass a fixed
            one for a reproducible build).
        uuid: the superblock's UUID (default: a random one, as ``veritysetup`` does).
        data_block_size, hash_block_size: powers of two from 512 bytes to 512 KiB.

    Raises:
        ValueError: a bad size, salt or UUID, or ``hash_path`` naming the data file.
        FileNotFoundError: ``data_path`` is not there.
    """
    _check_block_size("data block size", data_block_size)
    _check_block_size("hash block size", hash_block_size)
    if len(salt) > MAX_SALT:
        raise ValueError(f"the salt is {len(salt)} bytes; at most {MAX_SALT}")
    the_uuid = uuidlib.uuid4() if uuid is None else uuidlib.UUID(uuid)
    data_path, hash_path = Path(data_path), Path(hash_path)
    size = data_path.stat().st_size
    if size == 0 or size % data_block_size:
        raise ValueError(
            f"{data_path} is {size} bytes: not a non-empty multiple of the "
            f"{data_block_size}-byte data block"
        )
    if hash_path.exists() and hash_path.samefile(data_path):
        raise ValueError(f"{hash_path} is the data itself: the hash tree needs its own file")
    data_blocks = size // data_block_size
    sizes = hash_levels(data_blocks, hash_block_size)
    # The superblock takes the first hash block; level i sits after every level above it.
    start = -(-SUPERBLOCK_SIZE // hash_block_size)
    position = start
    level_block = [0] * len(sizes)
    for i in range(len(sizes) - 1, -1, -1):
        level_block[i] = position
        position += sizes[i]

    superblock = Superblock(the_uuid, data_blocks, salt, data_block_size, hash_block_size)
    salted = hashlib.new(ALGORITHM, salt)  # hash type 1: sha256(salt || block)
    with data_path.open("rb") as data, hash_path.open("wb") as out:
        header = superblock.to_bytes()
        out.write(header + bytes(start * hash_block_size - len(header)))
        for i in range(len(sizes)):
            out.seek(level_block[i] * hash_block_size)
            if i == 0:
                _hash_blocks(data, 0, data_blocks, data_block_size, salted, out, hash_block_size)
                continue
            out.flush()
            with hash_path.open("rb") as below:  # the level just written, read back
                _hash_blocks(
                    below,
                    level_block[i - 1] * hash_block_size,
                    sizes[i - 1],
                    hash_block_size,
                    salted,
                    out,
                    hash_block_size,
                )
        out.flush()
        if sizes:
            with hash_path.open("rb") as top:
                top_level = level_block[-1] * hash_block_size
                root = _hash_blocks(
                    top, top_level, 1, hash_block_size, salted, None, hash_block_size
                )
        else:
            root = _hash_blocks(data, 0, 1, data_block_size, salted, None, hash_block_size)
        os.fsync(out.fileno())
    return VerityResult(
        root_hash=root.hex(),
        salt=salt.hex(),
        uuid=str(the_uuid),
        data_blocks=data_blocks,
        data_block_size=data_block_size,
        hash_block_size=hash_block_size,
        hash_offset=start * hash_block_size,
        hash_start_block=start,
        hash_blocks=position - start,
        hash_size=position * hash_block_size,
        levels=len(sizes),
    )


def _cmdline_word(name: str, value: str) -> str:
    if not value or any(c.isspace() or c in ',;"' for c in value):
        raise ValueError(f'{name} {value!r} would break the command line (space , ; or ")')
    return value


def cmdline(
    result: VerityResult,
    *,
    data_device: str = "/dev/vda",
    hash_device: str = "/dev/vdb",
    name: str = "vroot",
    options: Sequence[str] = (),
) -> str:
    """The kernel command-line fragment that opens the verified root at boot.

    It is the kernel's own early device-mapper syntax (``dm-mod.create``, see
    ``Documentation/admin-guide/device-mapper/dm-init.rst``): one read-only device ``name``
    with one verity table line (``verity.rst``), no UUID and the next free minor::

        dm-mod.create="vroot,,,ro,0 <sectors> verity 1 <data_dev> <hash_dev>
                       <data_block_size> <hash_block_size> <data_blocks> <hash_start_block>
                       sha256 <root_hash> <salt>[ <#opts> <opts>…]"

    (one line). The hash device is the file :func:`format_verity` wrote, its superblock in
    the first hash block, so the tree starts at ``hash_start_block``. The device appears as
    ``/dev/dm-0`` (pass ``root=/dev/dm-0``; add ``dm-mod.waitfor=<devices>`` when the disks
    show up late). ``options`` are the target's optional arguments, e.g.
    ``("panic_on_corruption",)``; without them a block that fails its check reads as EIO.
    An empty salt is written ``-``, as the table wants.

    Raises:
        ValueError: a device, name or option holding a space, comma, semicolon or quote.
    """
    sectors = result.data_blocks * result.data_block_size // 512
    table = [
        "0",
        str(sectors),
        "verity",
        str(result.hash_type),
        _cmdline_word("data device", data_device),
        _cmdline_word("hash device", hash_device),
        str(result.data_block_size),
        str(result.hash_block_size),
        str(result.data_blocks),
        str(result.hash_start_block),
        result.algorithm,
        result.root_hash,
        result.salt or "-",
    ]
    if options:
        table += [str(len(options)), *(_cmdline_word("option", o) for o in options)]
    return f'dm-mod.create="{_cmdline_word("name", name)},,,ro,{" ".join(table)}"'
