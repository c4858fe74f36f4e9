"""The squashfs disks come out the same whatever umask the build ran under, and readable by
the guest's service uids: ``mksquashfs -all-root`` fixes owners, not modes, and pip under
umask 077 writes 0600 files (the full image's application disk differed between two builds,
and its files were unreadable by any uid but root's)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest

from enclave_image.build import _squashfs


def _tree(root: Path, umask: int) -> Path:
    old = os.umask(umask)
    try:
        (root / "pkg" / "sub").mkdir(parents=True)
        (root / "pkg" / "mod.py").write_text("x = 1\n")
        (root / "pkg" / "sub" / "data.bin").write_bytes(b"\x00\x01")
        tool = root / "pkg" / "tool"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o777 & ~umask)
        (root / "pkg" / "link.py").symlink_to("mod.py")
    finally:
        os.umask(old)
    return root


def test_two_umasks_one_disk(tmp_path: Path) -> None:
    if shutil.which("mksquashfs") is None:
        print("squashfs test skipped: mksquashfs is not installed (make system-deps)")
        pytest.skip("mksquashfs is not installed (make system-deps)")
    digests = []
    for umask in (0o022, 0o077):
        tree = _tree(tmp_path / f"tree-{umask:o}", umask)
        disk = tmp_path / f"disk-{umask:o}.img"
        _squashfs(tree, disk, 0)
        digests.append(hashlib.sha256(disk.read_bytes()).hexdigest())
        modes = {
            str(p.relative_to(tree)): stat.S_IMODE(p.lstat().st_mode)
            for p in tree.rglob("*")
            if not p.is_symlink()
        }
        assert modes == {
            "pkg": 0o755,
            "pkg/sub": 0o755,
            "pkg/mod.py": 0o644,
            "pkg/sub/data.bin": 0o644,
            "pkg/tool": 0o755,
        }
    assert digests[0] == digests[1]
