"""What each image profile holds: Debian packages, wheels and kernel modules, by name.

Versions and digests are not here: the lock (``enclave_image/image.lock.json``) pins them,
and :func:`lock_names` is what ``affidavit image lock`` asks it to cover.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

__all__ = [
    "FULL_DEBS",
    "FULL_MODULES",
    "KERNEL_META",
    "REDUCED_DEBS",
    "REDUCED_MODULES",
    "REDUCED_WHEELS",
    "full_wheels",
    "lock_names",
]

#: Debian's generic 6.12 kernel (bookworm-security): its 6.1 kernel has no TDX guest support
#: (``CONFIG_INTEL_TDX_GUEST`` unset), and the cloud flavour has no ``sev-guest`` driver; this
#: one has both guest drivers and the configfs-tsm report interface (``TSM_REPORTS``).
#: ``tests/enclave_image/test_kernel_config.py`` reads the options from the pinned kernel.
KERNEL_META = "linux-image-6.12-amd64"

#: busybox for /init, Python 3.11 and the shared libraries it and the wheels load, dmsetup.
REDUCED_DEBS = (
    "busybox-static",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "libc6",
    "zlib1g",
    "libssl3",
    "libffi8",
    "libexpat1",
    "libsqlite3-0",
    "libbz2-1.0",
    "liblzma5",
    "libuuid1",
    "libcrypt1",
    "libgcc-s1",
    "libstdc++6",
    "libtinfo6",
    "libncursesw6",
    "libreadline8",
    "dmsetup",
    "libdevmapper1.02.1",
    "libselinux1",
    "libudev1",
    "libpcre2-8-0",
    "libcap2",
)
#: The full profile adds nft (the network rules), cryptsetup (the state disk) and mke2fs.
FULL_DEBS = (
    *REDUCED_DEBS,
    "nftables",
    "libnftables1",
    "libedit2",
    "libbsd0",
    "libmd0",
    "libgmp10",
    "libjansson4",
    "libmnl0",
    "libnftnl11",
    "libxtables12",
    "cryptsetup-bin",
    "libcryptsetup12",
    "libargon2-1",
    "libblkid1",
    "libjson-c5",
    "libpopt0",
    "e2fsprogs",
    "libext2fs2",
    "libcom-err2",
    "libss2",
)

#: What the proxy imports at run time (distribution names).
REDUCED_WHEELS = (
    "pydantic",
    "pydantic-core",
    "typing-extensions",
    "annotated-types",
    "typing-inspection",
    "fastapi",
    "starlette",
    "annotated-doc",
    "python-multipart",
    "uvicorn",
    "h11",
    "anyio",
    "sniffio",
    "idna",
    "click",
    "httpx",
    "httpcore",
    "certifi",
    "cryptography",
    "cffi",
    "pycparser",
    "rfc8785",
    "pybase64",
    "uuid6",
    "grpcio",
    "protobuf",
    "prometheus-client",
    "opentelemetry-api",
)

#: Kernel modules, loaded by /init in this order after their dependencies.
REDUCED_MODULES = ("virtio_pci", "virtio_blk", "dm-verity")
FULL_MODULES = (
    *REDUCED_MODULES,
    "virtio_net",
    "squashfs",
    "dm-crypt",
    "ecb",  # xts(aes) is built on ecb(aes): the state disk's aes-xts-plain64
    "xts",
    # libcrc32c (under nf_conntrack and nf_tables) names crc32c only as a soft dependency,
    # which insmod does not follow: load the generic implementation first
    "crc32c_generic",
    "ext4",  # the state disk's file system (a module in Debian's generic kernel)
    "nf_tables",
    "nft_ct",
    "nf_conntrack",
    "nft_reject_inet",  # loopback's refusals (TCP reset) for every uid but the proxy's
    # the ACPI power button as /dev/input/event*: a VMM's shutdown stops the appliance cleanly
    "button",
    "evdev",
    # the TEE's guest drivers (each brings tsm and configfs: the configfs-tsm report interface)
    "sev-guest",
    "tdx-guest",
)


#: The checkout's project file: the image ships our wheel built from it.
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _requires(name: str, extras: frozenset[str]) -> list[str]:
    """``name``'s requirements. Ours come from the checkout's ``pyproject.toml`` when there
    is one: the image's wheel is built from it, and the installed metadata is only as new as
    the last ``pip install -e`` (a dependency added since would be left out of the image)."""
    if name == "affidavit" and PYPROJECT.is_file():
        project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
        optional = project.get("optional-dependencies", {})
        return [*project["dependencies"], *(r for e in sorted(extras) for r in optional[e])]
    return importlib.metadata.distribution(name).requires or []


def full_wheels(
    root: str = "affidavit", extras: frozenset[str] = frozenset({"engine", "postgres"})
) -> list[str]:
    """Every distribution ``affidavit[engine,postgres]`` needs at run time, as installed here.

    Markers are evaluated with ``packaging`` (a maintainer's tool: only ``image lock`` calls
    this, the build reads the names back from the lock).
    """
    from packaging.requirements import Requirement

    from enclave_image.inputs import dist_key

    wanted: dict[str, set[str]] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, extras)]
    while todo:
        name, with_extras = todo.pop()
        for text in _requires(name, with_extras):
            req = Requirement(text)
            if req.marker is not None and not any(
                req.marker.evaluate({"extra": e}) for e in (with_extras or {""})
            ):
                continue
            key = dist_key(req.name)
            if key in wanted and set(req.extras) <= wanted[key]:
                continue
            wanted[key] = wanted.get(key, set()) | set(req.extras)
            todo.append((req.name, frozenset(req.extras)))
    return sorted(importlib.metadata.distribution(k).metadata["Name"] for k in wanted)


def lock_names() -> tuple[list[str], list[str]]:
    """The Debian packages and wheels a complete lock covers (both profiles)."""
    from enclave_image.inputs import dist_key, kernel_package

    debs = sorted({*FULL_DEBS, kernel_package(KERNEL_META)})
    by_key = {dist_key(name): name for name in (*REDUCED_WHEELS, *full_wheels())}
    return debs, sorted(by_key.values(), key=dist_key)
