"""``enclave_image.ovmf``: the pins (sources, patches) agree with what they pin, a changed
cached source is refused by name, GRUB is taken out exactly once, and, when ``make ovmf``
has built it, the cached AmdSev firmware has the pinned digest and lets ``sev-snp-measure``
measure a direct-kernel boot (which Debian's ``OVMF_CODE.fd`` does not).

The edk2 build itself (about 2 minutes on 2 cores) is not run here: ``make ovmf`` runs it.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest

from attestation.measure import MeasureError, launch_digest
from enclave_image.ovmf import (
    OVMF_SHA256,
    PATCH_DIR,
    PATCHES,
    SOURCES,
    OvmfError,
    build_amdsev_ovmf,
    check_sources,
    drop_grub,
    dsc_checksums,
)

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".affidavit" / "image-cache"
# The .dsc as the bookworm mirror serves it (PGP-signed by the uploader), kept as a fixture
# so the pins can be checked without the network.
DSC = Path(__file__).parent / "data" / SOURCES[0].name
DEBIAN_OVMF = Path("/usr/share/OVMF/OVMF_CODE.fd")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_pinned_dsc_is_the_fixture_and_lists_the_pinned_tarballs() -> None:
    data = DSC.read_bytes()
    assert (_sha(data), len(data)) == (SOURCES[0].sha256, SOURCES[0].size)
    listed = dsc_checksums(data.decode())
    assert listed == {s.name: (s.sha256, s.size) for s in SOURCES[1:]}


def test_the_edk2_patches_match_their_pins_and_name_their_upstream_commit() -> None:
    assert sorted(p.name for p in PATCH_DIR.glob("*.patch")) == [name for name, _ in PATCHES]
    for name, pinned in PATCHES:
        data = (PATCH_DIR / name).read_bytes()
        assert _sha(data) == pinned, name
        assert data.startswith(b"Backport of upstream edk2 commit "), name


def test_sources_missing_are_listed_and_a_changed_one_is_refused_by_name(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    assert check_sources(src) == [s.name for s in SOURCES]
    shutil.copyfile(DSC, src / DSC.name)
    assert check_sources(src) == [s.name for s in SOURCES[1:]]

    orig = src / SOURCES[1].name
    orig.write_bytes(b"not the orig tarball")
    with pytest.raises(
        OvmfError, match=re.escape(f"{orig}: sha256 {_sha(b'not the orig tarball')}")
    ):
        check_sources(src)
    orig.unlink()

    tampered = DSC.read_bytes().replace(b"Version: 2022.11", b"Version: 2099.11")
    (src / DSC.name).write_bytes(tampered)
    with pytest.raises(OvmfError, match=re.escape(f"{src / DSC.name}: sha256 ") + ".*delete it"):
        check_sources(src)


def test_the_build_refuses_a_changed_cached_source_before_running_anything(
    tmp_path: Path,
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / SOURCES[2].name).write_bytes(b"patched debian/ folder")
    with pytest.raises(OvmfError, match=re.escape(f"{src / SOURCES[2].name}: sha256")):
        build_amdsev_ovmf(tmp_path)
    assert not (tmp_path / "ovmf").exists()


def test_drop_grub_removes_the_three_lines_once(tmp_path: Path) -> None:
    amdsev = tmp_path / "OvmfPkg/AmdSev"
    amdsev.mkdir(parents=True)
    dsc, fdf = amdsev / "AmdSevX64.dsc", amdsev / "AmdSevX64.fdf"
    dsc.write_bytes(
        b"  FLASH_DEFINITION               = OvmfPkg/AmdSev/AmdSevX64.fdf\r\n"
        b"  PREBUILD                       = sh OvmfPkg/AmdSev/Grub/grub.sh\r\n"
        b"  OvmfPkg/AmdSev/SecretDxe/SecretDxe.inf\r\n"
        b"  OvmfPkg/AmdSev/Grub/Grub.inf\r\n"
    )
    fdf.write_bytes(
        b"INF OvmfPkg/AmdSev/SecretDxe/SecretDxe.inf\r\nINF  OvmfPkg/AmdSev/Grub/Grub.inf\r\n"
    )
    drop_grub(tmp_path)
    assert dsc.read_bytes() == (
        b"  FLASH_DEFINITION               = OvmfPkg/AmdSev/AmdSevX64.fdf\r\n"
        b"  OvmfPkg/AmdSev/SecretDxe/SecretDxe.inf\r\n"
    )
    assert fdf.read_bytes() == b"INF OvmfPkg/AmdSev/SecretDxe/SecretDxe.inf\r\n"
    with pytest.raises(OvmfError, match=r"AmdSevX64\.dsc: expected one line"):
        drop_grub(tmp_path)


@pytest.fixture(scope="module")
def firmware() -> Path:
    """The AmdSev firmware in the checkout's cache, built first if it is not there (a cold
    clone: ~2 min). ``build_amdsev_ovmf`` refuses bytes other than the pin, so a build here
    is the lock's reproducibility claim checked again."""
    try:
        result = build_amdsev_ovmf(CACHE)
    except OvmfError as exc:
        text = str(exc)
        if "missing:" in text or "apt-get" in text:  # no tools, or the mirror dropped the pin
            print(f"AmdSev firmware checks skipped: {text}")
            pytest.skip(text)
        raise
    assert result.sha256 == OVMF_SHA256
    print(f"AmdSev firmware {'built' if result.built else 'cached'}: {result.path}")
    return result.path


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_cached_firmware_is_the_pinned_one_and_is_reused(firmware: Path) -> None:
    result = build_amdsev_ovmf(CACHE)
    assert (result.path, result.sha256, result.built) == (firmware, OVMF_SHA256, False)


def test_sev_snp_measure_measures_a_kernel_with_it_and_not_with_debians(
    firmware: Path, tmp_path: Path
) -> None:
    kernel, initrd = tmp_path / "vmlinuz", tmp_path / "initrd.img"
    kernel.write_bytes(b"a kernel")
    initrd.write_bytes(b"an initrd")

    def measure(ovmf: Path, append: str, mode: str = "snp") -> str:
        return launch_digest(
            ovmf, mode=mode, vcpus=1, vcpu_type="EPYC-v4",  # type: ignore[arg-type]
            kernel=kernel, initrd=initrd, append=append,
        )  # fmt: skip

    snp = measure(firmware, "console=ttyS0")
    assert len(snp) == 96
    assert snp != measure(firmware, "console=ttyS1")  # the command line is measured
    assert len(measure(firmware, "console=ttyS0", "seves")) == 64
    if DEBIAN_OVMF.is_file():
        with pytest.raises(MeasureError, match="cannot measure it"):
            measure(DEBIAN_OVMF, "console=ttyS0")
