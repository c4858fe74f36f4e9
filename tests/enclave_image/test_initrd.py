"""``enclave_image.initrd``: the archive read back by a literal newc reader and by Debian's
``cpio``, and the same tree built twice under a varied environment (build path, umask, file
mtimes, creation order, locale, time zone, epoch from the argument or the environment) giving
byte-identical initrds, while any change of content, mode or epoch changes the digest."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from affidavit.cli import main
from enclave_image.initrd import source_date_epoch, write_initrd

REPO = Path(__file__).resolve().parents[2]
EPOCH = 1_700_000_000
#: (relative path, kind, content or target, executable); created in this order or reversed.
TREE: list[tuple[str, str, str, bool]] = [
    ("bin", "dir", "", False),
    ("bin/init", "file", "#!/bin/sh\necho affidavit\n", True),
    ("bin/sh", "link", "init", False),
    ("etc", "dir", "", False),
    ("etc/hostname", "file", "affidavit\n", False),
    ("etc/données.txt", "file", "non-ASCII name\n", False),
    ("etc-x", "file", "sorts between etc and etc/…: '-' < '/'\n", False),
    ("lib", "dir", "", False),
    ("lib/empty", "dir", "", False),
    ("lib/big.bin", "file", "x" * 70_001, False),
    ("usr", "dir", "", False),
    ("usr/lib", "link", "../lib", False),
]


@dataclass(frozen=True)
class Entry:
    name: bytes
    ino: int
    mode: int
    uid: int
    gid: int
    nlink: int
    mtime: int
    data: bytes


def read_newc(archive: bytes) -> list[Entry]:
    """A literal newc reader (buffer-format.rst): header, name, data, each 4-aligned."""
    entries: list[Entry] = []
    at = 0
    while True:
        assert archive[at : at + 6] == b"070701", f"bad magic at {at}"
        fields = [int(archive[at + 6 + 8 * i : at + 14 + 8 * i], 16) for i in range(13)]
        ino, mode, uid, gid, nlink, mtime, size, *devs, namesize, check = fields
        assert devs == [0, 0, 0, 0] and check == 0
        name_at = at + 110
        name = archive[name_at : name_at + namesize]
        assert name.endswith(b"\0") and b"\0" not in name[:-1]
        at = name_at + namesize
        assert archive[at : at + (-at % 4)] == bytes(-at % 4), "header padding is not zero"
        at += -at % 4
        data = archive[at : at + size]
        at += size
        assert archive[at : at + (-at % 4)] == bytes(-at % 4), "data padding is not zero"
        at += -at % 4
        if name[:-1] == b"TRAILER!!!":
            assert at == len(archive), "bytes after the trailer"
            return entries
        entries.append(Entry(name[:-1], ino, mode, uid, gid, nlink, mtime, data))


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def make_tree(root: Path, *, reverse: bool = False, mask: int = 0o022, mtime: int = 0) -> Path:
    """The tree of TREE under ``root``; files and directories created in either order."""
    with umask(mask):
        root.mkdir(parents=True)
        order = list(reversed(TREE)) if reverse else TREE
        for rel, kind, content, executable in order:
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if kind == "dir":
                path.mkdir(exist_ok=True)
            elif kind == "link":
                path.symlink_to(content)
            else:
                path.write_text(content, encoding="utf-8")
                if executable:
                    path.chmod(0o777 & ~mask)
        if mtime:
            for dirpath, dirnames, filenames in os.walk(root):
                for name in dirnames + filenames:
                    os.utime(os.path.join(dirpath, name), (mtime, mtime), follow_symlinks=False)
    return root


def test_the_archive_reads_back_with_fixed_fields(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "root")
    result = write_initrd(root, tmp_path / "initrd.img", epoch=EPOCH)
    raw = (tmp_path / "initrd.img").read_bytes()
    assert result.sha256 == hashlib.sha256(raw).hexdigest() and result.size == len(raw)
    assert raw[:4] == b"\x1f\x8b\x08\x00", "gzip, no FNAME flag"
    assert raw[4:8] == bytes(4), "gzip mtime 0"
    archive = gzip.decompress(raw)
    assert result.cpio_sha256 == hashlib.sha256(archive).hexdigest()
    entries = read_newc(archive)
    names = [e.name for e in entries]
    assert names == sorted(os.fsencode(rel) for rel, *_ in TREE)
    assert names.index(b"etc") < names.index(b"etc-x") < names.index(b"etc/hostname")
    assert result.entries == len(TREE)
    assert [e.ino for e in entries] == list(range(1, len(TREE) + 1))
    assert {(e.uid, e.gid, e.mtime) for e in entries} == {(0, 0, EPOCH)}
    by_name = {e.name.decode(): e for e in entries}
    for rel, kind, content, executable in TREE:
        e = by_name[rel]
        if kind == "dir":
            assert (e.mode, e.nlink, e.data) == (stat.S_IFDIR | 0o755, 2, b""), rel
        elif kind == "link":
            assert (e.mode, e.nlink, e.data) == (stat.S_IFLNK | 0o777, 1, content.encode()), rel
        else:
            perm = 0o755 if executable else 0o644
            assert (e.mode, e.nlink) == (stat.S_IFREG | perm, 1), rel
            assert e.data == content.encode(), rel


def test_debian_cpio_extracts_it(tmp_path: Path) -> None:
    cpio = shutil.which("cpio")
    if cpio is None:
        reason = "cpio is absent: apt-get install cpio (the literal reader above still ran)"
        print(reason)
        pytest.skip(reason)
    root = make_tree(tmp_path / "root")
    write_initrd(root, tmp_path / "initrd.img", epoch=EPOCH)
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(
        [cpio, "-idm", "--quiet", "--no-absolute-filenames"],
        input=gzip.decompress((tmp_path / "initrd.img").read_bytes()),
        cwd=out,
        check=True,
    )
    for rel, kind, content, executable in TREE:
        path = out / rel
        if kind == "dir":
            assert path.is_dir() and not path.is_symlink(), rel
        elif kind == "link":
            assert os.readlink(path) == content, rel
        else:
            assert path.read_text(encoding="utf-8") == content, rel
            assert path.stat().st_mtime == EPOCH, rel
            assert bool(path.stat().st_mode & 0o100) == executable, rel


def test_the_same_tree_in_a_varied_environment_gives_identical_bytes(tmp_path: Path) -> None:
    # build 1: in-process, umask 022, creation in order, fresh mtimes, epoch as an argument
    first = make_tree(tmp_path / "a" / "root")
    one = write_initrd(first, tmp_path / "one.img", epoch=EPOCH)
    # build 2: another path, umask 077, reversed creation, old mtimes, a subprocess with
    # another locale, time zone and working folder, the epoch from SOURCE_DATE_EPOCH
    second = make_tree(tmp_path / "elsewhere" / "deeper" / "tree", reverse=True, mask=0o077)
    for dirpath, dirnames, filenames in os.walk(second):
        for i, name in enumerate(sorted(dirnames + filenames)):
            then = 1_000_000 + 7919 * i
            os.utime(os.path.join(dirpath, name), (then, then), follow_symlinks=False)
    env = {
        **os.environ,
        "LC_ALL": "C",
        "LANG": "de_DE.UTF-8",
        "TZ": "Pacific/Auckland",
        "SOURCE_DATE_EPOCH": str(EPOCH),
        "PYTHONPATH": str(REPO),
    }
    argv = [sys.executable, "-m", "affidavit", "image", "initrd", str(second)]
    with umask(0o077):
        done = subprocess.run(
            [*argv, "--out", str(tmp_path / "two.img"), "--json"],
            env=env,
            cwd=tmp_path / "elsewhere",
            capture_output=True,
            text=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    two = json.loads(done.stdout)
    assert (tmp_path / "one.img").read_bytes() == (tmp_path / "two.img").read_bytes()
    assert (two["sha256"], two["cpio_sha256"]) == (one.sha256, one.cpio_sha256)


@pytest.mark.parametrize(
    "change",
    ["content", "mode", "name", "link", "epoch", "new-empty-dir"],
)
def test_any_change_changes_the_digest(tmp_path: Path, change: str) -> None:
    root = make_tree(tmp_path / "root")
    before = write_initrd(root, tmp_path / "before.img", epoch=EPOCH)
    epoch = EPOCH
    if change == "content":
        (root / "etc/hostname").write_text("affidavit2\n")
    elif change == "mode":
        (root / "etc/hostname").chmod(0o755)
    elif change == "name":
        (root / "etc/hostname").rename(root / "etc/hostnamf")
    elif change == "link":
        (root / "bin/sh").unlink()
        (root / "bin/sh").symlink_to("/bin/init")
    elif change == "epoch":
        epoch += 1
    else:
        (root / "srv").mkdir()
    after = write_initrd(root, tmp_path / "after.img", epoch=epoch)
    assert after.sha256 != before.sha256 and after.cpio_sha256 != before.cpio_sha256


def test_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_tree(tmp_path / "root")
    with pytest.raises(ValueError, match="inside"):
        write_initrd(root, root / "initrd.img")
    os.mkfifo(root / "fifo")
    with pytest.raises(ValueError, match="not a file, directory or symlink"):
        write_initrd(root, tmp_path / "x.img")
    assert not (tmp_path / "x.img").exists() and not list(tmp_path.glob(".x.img.*"))
    with pytest.raises(NotADirectoryError):
        write_initrd(tmp_path / "absent", tmp_path / "x.img")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(ValueError, match="SOURCE_DATE_EPOCH"):
        source_date_epoch()
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "42")
    assert source_date_epoch() == 42 and source_date_epoch(7) == 7
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert source_date_epoch() == 0
    with pytest.raises(ValueError, match="does not fit"):
        source_date_epoch(1 << 32)


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["image", "initrd", str(tmp_path / "absent"), "--out", str(tmp_path / "i")]) == 3
    root = make_tree(tmp_path / "root")
    assert main(["image", "initrd", str(root), "--out", str(root / "i.img")]) == 2
    capsys.readouterr()
    assert main(["image", "initrd", str(root), "--out", str(tmp_path / "i.img")]) == 0
    assert "sha256" in capsys.readouterr().out
