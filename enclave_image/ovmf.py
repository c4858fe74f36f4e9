"""Build the SEV firmware a measured direct-kernel boot needs: edk2's ``AmdSevX64`` OVMF.

Debian's ``ovmf`` package ships ``OvmfPkg/OvmfPkgX64.dsc`` builds only. They carry no SEV
hashes table, so QEMU cannot put the kernel, initrd and command line hashes where the
firmware checks them, and ``sev-snp-measure --kernel`` refuses them. The ``AmdSevX64.dsc``
platform has the table (``OvmfPkg/AmdSev/BlobVerifierLibSevHashes``). We build it from
Debian's own ``edk2`` source package (bookworm, :data:`EDK2_VERSION`): the same upstream
release and security patches as the ``ovmf`` binary, with Debian's bundled OpenSSL and
Brotli sources, so nothing comes from outside the Debian mirror.

edk2 2022.11's AmdSev firmware is enough for SEV and SEV-ES, but for SEV-SNP the VMM must
also find the hashes page in the firmware's SNP metadata (section type 0x10), which edk2
only gained in edk2-stable202402. :data:`PATCHES` backports the two upstream commits that
add it (``enclave_image/edk2_patches/``, each pinned by sha256).

:func:`build_amdsev_ovmf` does four things, each checked:

1. ``apt-get source --download-only`` the ``.dsc``, the orig tarball and the Debian tarball
   into ``cache_dir/src/`` (apt checks them against the mirror's signed index); each file
   is then checked against :data:`SOURCES`, pinned here, so a later mirror state cannot
   change what we build. A cached file with another digest is refused, never replaced.
2. ``dpkg-source -x`` (applies Debian's patches) into a fresh folder, then
   :data:`PATCHES` with ``patch -p1``.
3. One hand-made change, :func:`drop_grub`: the platform embeds a GRUB binary that its
   ``PREBUILD`` script makes with ``grub-mkimage`` and a ``sevsecret`` module Debian's GRUB
   2.06 does not have. GRUB is only the fallback for a boot without ``-kernel``: the boot
   manager (``PlatformBootManagerLibGrub``) tries QEMU's kernel first, and if the boot
   fails it stops (``PlatformBootManagerUnableToBoot``: ``CpuDeadLoop``). Without GRUB the
   firmware can boot a measured kernel and nothing else.
4. BaseTools, then ``build -p OvmfPkg/AmdSev/AmdSevX64.dsc -a X64 -t GCC5 -b RELEASE``
   in a folder whose path always has the same length (:func:`_scratch`), with
   ``SOURCE_DATE_EPOCH``, ``TZ``, the locale, the environment and the umask fixed; the
   single combined firmware ``OVMF.fd`` is copied to ``cache_dir/ovmf/OVMF.amdsev.fd``.

When that file is already there with :data:`OVMF_SHA256` (the digest two builds gave,
byte for byte), it is returned without a build. A build that gives other bytes is an
error: the firmware is part of the launch measurement, so a different one must be noticed.

Run it as ``python -m enclave_image.ovmf CACHE_DIR`` (``make ovmf``). It needs ``nasm``,
``iasl``, ``uuid-dev``, ``gcc``, ``make``, ``patch``, ``python3``, ``dpkg-dev`` and
``apt-get``.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from enclave_image.lock import file_sha256
from enclave_image.tool import run_tool

__all__ = [
    "EDK2_VERSION",
    "OVMF_FILE",
    "OVMF_SHA256",
    "PATCHES",
    "SOURCES",
    "OvmfError",
    "OvmfResult",
    "SourceFile",
    "apply_patches",
    "build_amdsev_ovmf",
    "check_sources",
    "drop_grub",
    "dsc_checksums",
    "main",
]

EDK2_VERSION = "2022.11-6+deb12u2"
#: Where the firmware lands, relative to the cache folder.
OVMF_FILE = "ovmf/OVMF.amdsev.fd"
#: sha256 of ``OVMF.amdsev.fd``: three builds here (three caches, three build folders) gave it.
OVMF_SHA256 = "78cb18a6f15b51c5a4eef2a01f39e0de1bf03a6037828098d3e15ec3f62be180"
SOURCE_DATE_EPOCH = 1700000000
#: Builds run in ``BUILD_PARENT/affidavit-edk2-<16 hex digits>``: a path of fixed length.
BUILD_PARENT = Path("/tmp")
PLATFORM = "OvmfPkg/AmdSev/AmdSevX64.dsc"
MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class SourceFile:
    name: str
    sha256: str
    size: int


#: The source package, pinned. The two tarballs' digests and sizes are the ``.dsc``'s
#: ``Checksums-Sha256``; the ``.dsc``'s own digest is of the file the mirror served.
SOURCES: tuple[SourceFile, ...] = (
    SourceFile(
        f"edk2_{EDK2_VERSION}.dsc",
        "3129d783c9017f738af4453c9f94a2fdfba2ee91cf409c0c3623b31377e76cc6",
        2104,
    ),
    SourceFile(
        "edk2_2022.11.orig.tar.xz",
        "64257dd8a2778c969b8a869cd3b6eda2db2a346bfcf24dc729859745968f1fd6",
        16710140,
    ),
    SourceFile(
        f"edk2_{EDK2_VERSION}.debian.tar.xz",
        "a1d848115ae9b140e64d3ab34f7c08210b665bee473e3242a6801c163678780e",
        77616,
    ),
)

#: Upstream edk2 commits backported onto Debian's source (file in ``edk2_patches/``, sha256):
#: 6436d9b6939a (AmdSev: reorder MEMFD pages so the SEV secret and hashes page follows the
#: CPUID page) and 9eec96bd4fc5 (ResetVector: SNP metadata section 0x10 for that page).
PATCHES: tuple[tuple[str, str], ...] = (
    (
        "0001-OvmfPkg-AmdSev-Reorder-MEMFD-pages-to-match-the-or.patch",
        "85fd5984214ce98e04f368828ae084720053a3716d4716d9a0af292898af5e44",
    ),
    (
        "0002-OvmfPkg-ResetVector-Define-SNP-metadata-for-kernel.patch",
        "9fe666c2e8a7905a9f827810ddb00e2b8494b2db5ee0d4b059577740a4d7e933",
    ),
)
PATCH_DIR = Path(__file__).resolve().parent / "edk2_patches"

# The tools the build runs and the Debian package that brings each one.
_TOOLS = {
    "apt-get": "apt",
    "dpkg-source": "dpkg-dev",
    "nasm": "nasm",
    "iasl": "acpica-tools",
    "gcc": "gcc",
    "make": "make",
    "patch": "patch",
    "python3": "python3",
}


class OvmfError(RuntimeError):
    """The firmware cannot be built or checked; the message names the file or step."""


_run = partial(run_tool, error=OvmfError)


@dataclass(frozen=True)
class OvmfResult:
    path: Path
    sha256: str
    size: int
    seconds: float  # wall time of this call (0-ish when the cached file was reused)
    built: bool  # False when the cached firmware was returned


def _say(message: str) -> None:
    print(f"[ovmf] {message}", flush=True)


def dsc_checksums(dsc_text: str) -> dict[str, tuple[str, int]]:
    """``{file name: (sha256, size)}`` from a ``.dsc``'s ``Checksums-Sha256`` field."""
    found: dict[str, tuple[str, int]] = {}
    in_field = False
    for line in dsc_text.splitlines():
        if line.startswith("Checksums-Sha256:"):
            in_field = True
            continue
        if in_field:
            match = re.fullmatch(r" ([0-9a-f]{64}) ([0-9]+) (\S+)", line)
            if match is None:
                break
            found[match.group(3)] = (match.group(1), int(match.group(2)))
    return found


def check_sources(src_dir: Path) -> list[str]:
    """Check each pinned source file in ``src_dir``; return the names that are missing.

    Raises:
        OvmfError: a file is there with another digest or size than pinned (it is left in
            place for inspection: delete it to download it again), or the ``.dsc`` lists
            other tarball digests than :data:`SOURCES`.
    """
    missing = []
    for source in SOURCES:
        path = src_dir / source.name
        if not path.is_file():
            missing.append(source.name)
            continue
        actual, size = file_sha256(path), path.stat().st_size
        if actual != source.sha256 or size != source.size:
            raise OvmfError(
                f"{path}: sha256 {actual} ({size} bytes), pinned {source.sha256} "
                f"({source.size} bytes): the cached source file was changed; delete it "
                "to download it again"
            )
    dsc = src_dir / SOURCES[0].name
    if dsc.is_file():
        listed = dsc_checksums(dsc.read_text())
        pinned = {s.name: (s.sha256, s.size) for s in SOURCES[1:]}
        if listed != pinned:
            raise OvmfError(f"{dsc}: Checksums-Sha256 {listed} differ from the pins {pinned}")
    return missing


def _missing_tools() -> list[str]:
    missing = [
        f"{tool} (apt-get install {pkg})" for tool, pkg in _TOOLS.items() if not shutil.which(tool)
    ]
    if not Path("/usr/include/uuid/uuid.h").is_file():
        missing.append("uuid/uuid.h (apt-get install uuid-dev)")
    return missing


def _fetch_sources(src_dir: Path) -> None:
    """``apt-get source --download-only`` through a private deb-src configuration.

    The host's apt sources may have no ``deb-src`` line, so the configuration (one
    ``.sources`` file, its own lists and cache) lives in ``src_dir/apt`` and leaves the
    host's apt state alone.
    """
    apt = src_dir / "apt"
    for sub in ("sources", "lists/partial", "cache/archives/partial"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text("")  # none of the host's sources
    (apt / "sources" / "edk2-src.sources").write_text(
        f"Types: deb-src\nURIs: {MIRROR}\nSuites: bookworm\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    options = [
        "-o", f"Dir::Etc::SourceList={apt / 'sources.list'}",
        "-o", f"Dir::Etc::SourceParts={apt / 'sources'}",
        "-o", f"Dir::State::Lists={apt / 'lists'}",
        "-o", f"Dir::Cache={apt / 'cache'}",
    ]  # fmt: skip
    _say(f"apt-get update (deb-src bookworm, lists in {apt})")
    _run(["apt-get", *options, "update"])
    _say(f"apt-get source --download-only edk2={EDK2_VERSION} into {src_dir}")
    _run(["apt-get", *options, "source", "--download-only", f"edk2={EDK2_VERSION}"], cwd=src_dir)


def apply_patches(tree: Path) -> None:
    """Apply :data:`PATCHES` in order, each checked against its pinned sha256 first."""
    for name, pinned in PATCHES:
        path = PATCH_DIR / name
        if not path.is_file():
            raise OvmfError(f"{path}: the edk2 patch is missing")
        actual = file_sha256(path)
        if actual != pinned:
            raise OvmfError(f"{path}: sha256 {actual}, pinned {pinned}")
        _run(["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-i", str(path)],
             cwd=tree)  # fmt: skip


def drop_grub(tree: Path) -> None:
    """Take GRUB out of the AmdSev platform (its ``PREBUILD`` script and its binary).

    Hand-written because the upstream ``grub.sh`` needs a GRUB with a ``sevsecret`` module
    (Debian's 2.06 has none) and its output is not reproducible (``mkfs.msdos`` serial and
    timestamps); GRUB is not used by a direct-kernel boot (see the module docstring).
    Each removed line must be found exactly once, so a changed source fails loudly.
    """
    edits = {
        "OvmfPkg/AmdSev/AmdSevX64.dsc": (
            re.compile(rb"^  PREBUILD += sh OvmfPkg/AmdSev/Grub/grub\.sh\r?\n", re.M),
            re.compile(rb"^  OvmfPkg/AmdSev/Grub/Grub\.inf\r?\n", re.M),
        ),
        "OvmfPkg/AmdSev/AmdSevX64.fdf": (
            re.compile(rb"^INF  OvmfPkg/AmdSev/Grub/Grub\.inf\r?\n", re.M),
        ),
    }
    for name, patterns in edits.items():
        path = tree / name
        text = path.read_bytes()
        for pattern in patterns:
            text, count = pattern.subn(b"", text)
            if count != 1:
                raise OvmfError(
                    f"{path}: expected one line /{pattern.pattern.decode()}/, found {count}"
                )
        path.write_bytes(text)


def _build_env(workspace: Path) -> dict[str, str]:
    """A fixed environment: nothing from the caller's shell reaches the compiler."""
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(workspace),
        "LC_ALL": "C",
        "LANG": "C",
        "TZ": "UTC",
        "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH),
        "PYTHON_COMMAND": "/usr/bin/python3",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _run_logged(
    args: list[str], *, cwd: Path, env: Mapping[str, str], log: Path, step: str
) -> None:
    """Run a long step with its output in ``log`` and a progress line every 30 s."""
    start = last = time.monotonic()
    lines = 0
    with log.open("ab") as out:
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert proc.stdout is not None
        for raw in proc.stdout:
            out.write(raw)
            lines += 1
            now = time.monotonic()
            if now - last >= 30:
                last = now
                _say(f"{step}: {now - start:.0f} s, {lines} log lines")
        code = proc.wait()
    if code != 0:
        tail = log.read_bytes()[-3000:].decode(errors="replace")
        raise OvmfError(f"{step} failed ({code}); the end of {log}:\n{tail}")
    _say(f"{step}: done in {time.monotonic() - start:.0f} s")


@contextmanager
def _scratch() -> Iterator[Path]:
    """A fresh build folder whose absolute path has the same length on every build.

    Hand-made, not ``tempfile``: GenFw (``Elf64Convert.c``) sizes each image's CodeView
    debug entry by ``strlen`` of the module's absolute ``.dll`` path and aligns what follows
    to 64 bytes. The path's text is not kept in a RELEASE image, but its length moves the
    sections of some modules (seen: VirtioRngDxe, ScsiBus, PcdDxe, DxeIpl, LogoDxe, ...),
    so builds from folders of different path length give different firmware.
    ``$TMPDIR`` is ignored for the same reason.
    """
    path = BUILD_PARENT / f"affidavit-edk2-{secrets.token_hex(8)}"
    path.mkdir(mode=0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def build_amdsev_ovmf(cache_dir: Path | str, *, expect: str | None = OVMF_SHA256) -> OvmfResult:
    """Build (or reuse) ``cache_dir/ovmf/OVMF.amdsev.fd``, the AmdSev OVMF from Debian's source.

    ``expect`` is the digest the firmware must have (:data:`OVMF_SHA256`); None accepts
    any, for recording a new pin. Raises :class:`OvmfError` naming the file or step at fault.
    """
    start = time.monotonic()
    # absolute: apt reads a relative Dir:: path as relative to /etc/apt
    cache_dir = Path(cache_dir).resolve()
    out = cache_dir / OVMF_FILE
    if expect is not None and out.is_file() and file_sha256(out) == expect:
        _say(f"{out} is there with the pinned sha256 {expect}: no build")
        return OvmfResult(out, expect, out.stat().st_size, time.monotonic() - start, built=False)
    src_dir = cache_dir / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    # the cached sources first: a changed file is refused before anything runs
    missing_sources = check_sources(src_dir)
    missing_tools = _missing_tools()
    if missing_tools:
        raise OvmfError(f"cannot build OVMF, missing: {', '.join(missing_tools)}")
    if missing_sources:
        _fetch_sources(src_dir)
        still = check_sources(src_dir)
        if still:
            raise OvmfError(f"apt-get source gave no {', '.join(still)} in {src_dir}")
    _say(f"sources in {src_dir} match the pins (edk2 {EDK2_VERSION})")
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / "build.log"
    log.write_bytes(b"")
    old_umask = os.umask(0o022)
    try:
        with _scratch() as workspace:
            tree = workspace / "edk2"
            env = _build_env(workspace)
            _say(f"dpkg-source -x into {tree} (applies Debian's patches)")
            _run(["dpkg-source", "-x", str(src_dir / SOURCES[0].name), str(tree)], env=env)
            apply_patches(tree)
            drop_grub(tree)
            jobs = str(os.cpu_count() or 1)
            _run_logged(["make", "-C", "BaseTools", f"-j{jobs}", "ARCH=X64"],
                        cwd=tree, env=env, log=log, step="BaseTools")  # fmt: skip
            _say(f"building {PLATFORM} (RELEASE, GCC5); the log is {log}")
            script = (
                ". ./edksetup.sh BaseTools >/dev/null && "
                f"build -a X64 -t GCC5 -b RELEASE -n {jobs} -p {PLATFORM}"
            )
            _run_logged(["bash", "-c", script], cwd=tree, env=env, log=log, step="edk2 build")
            built = tree / "Build/AmdSev/RELEASE_GCC5/FV/OVMF.fd"
            if not built.is_file():
                raise OvmfError(f"the build gave no {built}")
            candidate = out.with_name(out.name + ".partial")
            shutil.copyfile(built, candidate)
    finally:
        os.umask(old_umask)
    digest = file_sha256(candidate)
    if expect is not None and digest != expect:
        raise OvmfError(
            f"the build gave sha256 {digest}, pinned {expect}: kept as {candidate}; a different "
            "toolchain or source changes the firmware, and with it every launch measurement"
        )
    candidate.replace(out)
    seconds = time.monotonic() - start
    _say(f"{out}: sha256 {digest}, {out.stat().st_size} bytes, {seconds:.0f} s")
    return OvmfResult(out, digest, out.stat().st_size, seconds, built=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m enclave_image.ovmf CACHE_DIR [--any-digest]``; exit 1 on failure."""
    parser = argparse.ArgumentParser(
        prog="python -m enclave_image.ovmf", description=__doc__.split("\n")[0] if __doc__ else None
    )
    parser.add_argument("cache_dir", type=Path)
    parser.add_argument("--any-digest", action="store_true",
                        help="accept a firmware whose sha256 is not OVMF_SHA256 (to record a new pin)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        result = build_amdsev_ovmf(args.cache_dir, expect=None if args.any_digest else OVMF_SHA256)
    except OvmfError as exc:
        print(f"ovmf: {exc}", file=sys.stderr)
        return 1
    print(
        f"{result.path} sha256={result.sha256} size={result.size} seconds={result.seconds:.0f} built={result.built}"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
