"""``enclave_image.verity`` against the real ``veritysetup`` (same root hash, byte-identical
hash files, ``veritysetup verify`` accepting ours and refusing flipped data), against a
literal in-memory reference tree, and ``affidavit image verity`` end to end.

The data is small: 1, 129 and 300 blocks of 4096 bytes (0, 2 and 2 levels; 300 is not a
multiple of the 128 blocks one hash block covers), and 300 blocks of 512 bytes with
512-byte hash blocks (16 digests a block: 3 levels).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import subprocess
import uuid as uuidlib
from pathlib import Path

import pytest

from affidavit.cli import main
from enclave_image.verity import (
    SUPERBLOCK_SIZE,
    Superblock,
    VerityResult,
    cmdline,
    format_verity,
    hash_levels,
)

SALT = bytes.fromhex("5a" * 16 + "c3" * 16)
UUID = "0f6c1a2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"
#: (data blocks, data block size, hash block size, levels)
SHAPES = [
    (1, 4096, 4096, 0),
    (129, 4096, 4096, 2),
    (300, 4096, 4096, 2),
    (300, 512, 512, 3),
]
SHAPE_IDS = [f"{n}x{dbs}-hash{hbs}" for n, dbs, hbs, _ in SHAPES]


@pytest.fixture(scope="module")
def veritysetup() -> str:
    path = shutil.which("veritysetup") or shutil.which("/usr/sbin/veritysetup")
    if path is None:
        reason = "veritysetup is absent: install cryptsetup-bin (make system-deps does)"
        print(reason)
        pytest.skip(reason)
    return path


def _data(path: Path, blocks: int, block_size: int) -> bytes:
    data = random.Random(blocks * block_size).randbytes(blocks * block_size)
    path.write_bytes(data)
    return data


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def _reference(data: bytes, salt: bytes, uuid: str, dbs: int, hbs: int) -> tuple[bytes, str]:
    """A literal dm-verity tree built in memory: the hash file and the root hash."""

    def digest(block: bytes) -> bytes:
        return hashlib.sha256(salt + block).digest()

    per = hbs // 32
    level = [data[i : i + dbs] for i in range(0, len(data), dbs)]
    levels: list[list[bytes]] = []
    while len(level) > 1:
        digests = [digest(b) for b in level]
        level = [b"".join(digests[i : i + per]).ljust(hbs, b"\0") for i in range(0, len(digests), per)]  # fmt: skip
        levels.append(level)
    superblock = (
        b"verity\0\0"
        + (1).to_bytes(4, "little")  # superblock version
        + (1).to_bytes(4, "little")  # hash type
        + uuidlib.UUID(uuid).bytes
        + b"sha256".ljust(32, b"\0")
        + dbs.to_bytes(4, "little")
        + hbs.to_bytes(4, "little")
        + (len(data) // dbs).to_bytes(8, "little")
        + len(salt).to_bytes(2, "little")
        + bytes(6)
        + salt.ljust(256, b"\0")
        + bytes(168)
    )
    tree = b"".join(b"".join(lvl) for lvl in reversed(levels))
    return superblock.ljust(hbs, b"\0") + tree, digest(level[0]).hex()


@pytest.mark.parametrize(("blocks", "dbs", "hbs", "levels"), SHAPES, ids=SHAPE_IDS)
def test_matches_veritysetup_byte_for_byte(
    tmp_path: Path, veritysetup: str, blocks: int, dbs: int, hbs: int, levels: int
) -> None:
    data = tmp_path / "data.img"
    _data(data, blocks, dbs)
    ours, theirs = tmp_path / "ours.hash", tmp_path / "theirs.hash"
    ours.write_bytes(b"\xff" * 100_000)  # a longer stale file is replaced, not overwritten
    result = format_verity(
        data, ours, salt=SALT, uuid=UUID, data_block_size=dbs, hash_block_size=hbs
    )
    made = _run(
        veritysetup, "format", "--salt", SALT.hex(), "--uuid", UUID, "--hash", "sha256",
        "--data-block-size", str(dbs), "--hash-block-size", str(hbs), str(data), str(theirs),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    root = re.search(r"Root hash:\s+([0-9a-f]+)", made.stdout)
    assert root is not None, made.stdout
    assert result.root_hash == root.group(1)
    assert result.levels == levels
    assert ours.read_bytes() == theirs.read_bytes()
    assert result.hash_size == ours.stat().st_size

    good = _run(veritysetup, "verify", str(data), str(ours), result.root_hash)
    assert good.returncode == 0, good.stderr
    raw = bytearray(data.read_bytes())
    raw[len(raw) - dbs // 2] ^= 0x01  # one bit of the last data block
    data.write_bytes(bytes(raw))
    bad = _run(veritysetup, "verify", str(data), str(ours), result.root_hash)
    assert bad.returncode != 0
    assert "fail" in (bad.stdout + bad.stderr).lower()


@pytest.mark.parametrize(("blocks", "dbs", "hbs", "levels"), SHAPES, ids=SHAPE_IDS)
def test_matches_the_reference_tree(
    tmp_path: Path, blocks: int, dbs: int, hbs: int, levels: int
) -> None:
    data = _data(tmp_path / "data.img", blocks, dbs)
    result = format_verity(
        tmp_path / "data.img",
        tmp_path / "hash",
        salt=SALT,
        uuid=UUID,
        data_block_size=dbs,
        hash_block_size=hbs,
    )
    expected_file, expected_root = _reference(data, SALT, UUID, dbs, hbs)
    assert (tmp_path / "hash").read_bytes() == expected_file
    assert result.root_hash == expected_root
    assert result.levels == levels == len(hash_levels(blocks, hbs))
    assert result.hash_offset == hbs and result.hash_start_block == 1
    assert result.hash_size == hbs * (1 + result.hash_blocks)


def test_superblock_round_trips(tmp_path: Path) -> None:
    _data(tmp_path / "data.img", 3, 4096)
    result = format_verity(tmp_path / "data.img", tmp_path / "hash", salt=SALT, uuid=UUID)
    sb = Superblock.from_bytes((tmp_path / "hash").read_bytes()[:SUPERBLOCK_SIZE])
    assert sb == Superblock(uuidlib.UUID(UUID), 3, SALT, 4096, 4096)
    assert sb.to_bytes() == (tmp_path / "hash").read_bytes()[:SUPERBLOCK_SIZE]
    assert result.uuid == UUID and result.salt == SALT.hex()
    with pytest.raises(ValueError, match="not a verity superblock"):
        Superblock.from_bytes(bytes(SUPERBLOCK_SIZE))


def test_level_sizes() -> None:
    assert hash_levels(1) == []
    assert hash_levels(128) == [1]
    assert hash_levels(129) == [2, 1]
    assert hash_levels(300) == [3, 1]
    assert hash_levels(128 * 128 + 1) == [129, 2, 1]
    with pytest.raises(ValueError, match="at least one data block"):
        hash_levels(0)


def test_same_inputs_same_bytes_and_salt_decides_the_root(tmp_path: Path) -> None:
    _data(tmp_path / "data.img", 130, 4096)
    a = format_verity(tmp_path / "data.img", tmp_path / "a", salt=SALT, uuid=UUID)
    b = format_verity(tmp_path / "data.img", tmp_path / "b", salt=SALT, uuid=UUID)
    assert a == b and (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    c = format_verity(tmp_path / "data.img", tmp_path / "c", salt=SALT)  # a random UUID
    assert c.root_hash == a.root_hash and c.uuid != UUID
    d = format_verity(tmp_path / "data.img", tmp_path / "d", salt=b"", uuid=UUID)
    assert d.root_hash != a.root_hash and d.salt == ""


def test_refuses_bad_inputs(tmp_path: Path) -> None:
    data = tmp_path / "data.img"
    data.write_bytes(bytes(4096 + 100))
    with pytest.raises(ValueError, match="multiple"):
        format_verity(data, tmp_path / "h", salt=SALT)
    data.write_bytes(b"")
    with pytest.raises(ValueError, match="multiple"):
        format_verity(data, tmp_path / "h", salt=SALT)
    data.write_bytes(bytes(4096))
    with pytest.raises(ValueError, match="at most 256"):
        format_verity(data, tmp_path / "h", salt=bytes(257))
    with pytest.raises(ValueError, match="power of two"):
        format_verity(data, tmp_path / "h", salt=SALT, hash_block_size=3000)
    with pytest.raises(ValueError, match="the data itself"):
        format_verity(data, data, salt=SALT)
    assert data.read_bytes() == bytes(4096)
    with pytest.raises(FileNotFoundError):
        format_verity(tmp_path / "nope", tmp_path / "h", salt=SALT)


def _result(salt: str = SALT.hex()) -> VerityResult:
    return VerityResult(
        root_hash="ab" * 32,
        salt=salt,
        uuid=UUID,
        data_blocks=300,
        data_block_size=4096,
        hash_block_size=4096,
        hash_offset=4096,
        hash_start_block=1,
        hash_blocks=4,
        hash_size=20480,
        levels=2,
    )


def test_cmdline_is_a_dm_mod_create_verity_table() -> None:
    assert cmdline(_result()) == (
        'dm-mod.create="vroot,,,ro,0 2400 verity 1 /dev/vda /dev/vdb 4096 4096 300 1 sha256 '
        f'{"ab" * 32} {SALT.hex()}"'
    )
    fragment = cmdline(
        _result(salt=""),
        data_device="/dev/sda2",
        hash_device="8:3",
        name="root",
        options=("panic_on_corruption",),
    )
    assert fragment.endswith(f' 8:3 4096 4096 300 1 sha256 {"ab" * 32} - 1 panic_on_corruption"')
    assert fragment.startswith('dm-mod.create="root,,,ro,0 2400 verity 1 /dev/sda2 ')
    for bad in ("/dev/v da", "a,b", "a;b", 'a"b', ""):
        with pytest.raises(ValueError, match="command line"):
            cmdline(_result(), data_device=bad)


def test_cli_prints_the_root_and_writes_the_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image, out = tmp_path / "model.img", tmp_path / "model.verity"
    _data(image, 129, 4096)
    argv = ["image", "verity", str(image), "--out", str(out), "--salt", SALT.hex()]
    assert main([*argv, "--uuid", UUID, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    expected = format_verity(image, tmp_path / "again", salt=SALT, uuid=UUID)
    assert doc["root_hash"] == expected.root_hash and doc["salt"] == SALT.hex()
    assert doc["data_blocks"] == 129 and doc["levels"] == 2 and doc["uuid"] == UUID
    assert doc["hash_file"] == str(out)
    assert doc["cmdline"] == cmdline(expected)
    assert out.read_bytes() == (tmp_path / "again").read_bytes()

    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"root hash    {expected.root_hash}" in text
    assert 'cmdline      dm-mod.create="vroot,,,ro,0 1032 verity 1 ' in text

    assert main(["image", "verity", str(image), "--out", str(out), "--json"]) == 0
    random_salt = json.loads(capsys.readouterr().out)["salt"]
    assert len(random_salt) == 64 and random_salt != SALT.hex()


@pytest.mark.parametrize(
    ("case", "code"),
    [("missing", 3), ("no-out-folder", 3), ("folder", 2), ("bad-salt", 2), ("odd-size", 2)],
)
def test_cli_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, code: int
) -> None:
    image, out, salt = tmp_path / "model.img", tmp_path / "h", SALT.hex()
    image.write_bytes(bytes(4096 + (1 if case == "odd-size" else 0)))
    if case == "missing":
        image = tmp_path / "nope.img"
    elif case == "no-out-folder":
        out = tmp_path / "nowhere" / "h"
    elif case == "folder":
        image = tmp_path
    elif case == "bad-salt":
        salt = "xyz"
    assert main(["image", "verity", str(image), "--out", str(out), "--salt", salt]) == code
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip()
    if code == 3:
        assert "affidavit: missing:" in captured.err
