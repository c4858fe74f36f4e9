"""The pinned kernel has what the docs promise: every row of ``docs/image.md``'s kernel table
("The kernel") is read from the ``/boot/config-*`` inside the pinned ``.deb`` (#17: a kernel
that boots as both an SEV-SNP and a TDX guest, with the configfs-tsm report interface).

The ``.deb`` comes from the image cache, fetched by the lock's URL and checked against its
sha256 when missing (``make test`` builds the reduced image from the same cache)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from enclave_image.build import _kernel_entry
from enclave_image.inputs import debian_package, pinned_lock

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".affidavit" / "image-cache"
DOC = REPO / "docs" / "image.md"


def _promised() -> dict[str, str]:
    """``CONFIG_X`` → value, from the table under "### The kernel"."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### The kernel\n") :]
    section = section[: section.index("\n### ", 1)]
    rows = re.findall(r"^\| `(CONFIG_[A-Z0-9_]+)` \| `([ym])` \|", section, re.MULTILINE)
    return dict(rows)


def _config(deb: Path) -> dict[str, str]:
    dpkg = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    assert dpkg.stdout is not None
    found: dict[str, str] = {}
    with tarfile.open(fileobj=dpkg.stdout, mode="r|") as tar:
        for member in tar:
            if re.fullmatch(r"\./boot/config-[^/]+", member.name):
                data = tar.extractfile(member)
                assert data is not None
                for line in data.read().decode().splitlines():
                    if line.startswith("CONFIG_"):
                        key, _, value = line.partition("=")
                        found[key] = value
                break
    dpkg.stdout.close()
    dpkg.wait()
    return found


def test_the_docs_promise_a_kernel_for_both_guests() -> None:
    promised = _promised()
    for option in ("CONFIG_INTEL_TDX_GUEST", "CONFIG_TDX_GUEST_DRIVER", "CONFIG_SEV_GUEST",
                   "CONFIG_TSM_REPORTS", "CONFIG_AMD_MEM_ENCRYPT"):  # fmt: skip
        assert option in promised, option
    assert promised["CONFIG_INTEL_TDX_GUEST"] == "y"


def test_the_pinned_kernel_sets_every_option_the_docs_promise() -> None:
    if shutil.which("dpkg-deb") is None:
        print("kernel config test skipped: dpkg-deb is not installed (make system-deps)")
        pytest.skip("dpkg-deb is not installed (make system-deps)")
    lock = pinned_lock()
    deb = debian_package(lock, CACHE, _kernel_entry(lock))
    config = _config(deb)
    assert config, f"no /boot/config-* in {deb.name}"
    wrong = {k: (v, config.get(k, "unset")) for k, v in _promised().items() if config.get(k) != v}
    assert not wrong, f"{deb.name}: option (promised, set): {wrong}"
