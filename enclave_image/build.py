"""Build the REDUCED enclave image: a Debian kernel, an initrd holding busybox, Python and
the proxy, a kernel command line, and a dm-verity protected model disk.

The reduced profile boots to one thing: :mod:`enclave_image.guest` starts the real proxy on
loopback, asks its own ``/metrics`` and prints a health line on the serial console.

Inputs come from Debian (``apt-get download``, kept in ``cache_dir/debs``) and PyPI
(``pip install --no-deps`` of the versions this checkout's environment runs, plus our own
wheel built from the checkout). Debian's cloud kernel builds virtio and device-mapper as
modules, so the kernel's ``dm-mod.create=`` (dm-init, built-in only) does not run: the
initrd loads the modules and ``/init`` creates the verity device with ``dmsetup`` from the
``dm-mod.create=`` table on the command line, so the root hash stays in the measured
command line.

Not yet: the pinned lock (``enclave_image.lock``) is not consulted here, so a rebuild takes
what the mirror and PyPI serve today. With the same inputs, two builds give the same bytes
(``tests/enclave_image/test_boot.py`` varies cwd, umask, locale and time zone).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from enclave_image.initrd import write_initrd
from enclave_image.verity import cmdline, format_verity

__all__ = ["BootResult", "BuildResult", "boot", "build_reduced", "qemu_command"]

KERNEL_META = "linux-image-cloud-amd64"
#: The userland: busybox for /init, Python 3.11 and the shared libraries it and the wheels
#: load, dmsetup for the verity device.
DEBS = (
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
#: What the proxy imports at run time (distribution names), installed at the versions this
#: environment has.
WHEELS = (
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
    "uuid6",
    "grpcio",
    "protobuf",
    "prometheus-client",
    "opentelemetry-api",
)
#: Kernel modules the boot needs, loaded by /init in this order with their dependencies.
MODULES = ("virtio_pci", "virtio_blk", "dm-verity")
#: Trees of the Debian packages that the guest never uses.
_PRUNE = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/share/bug",
    "usr/lib/python3.11/idlelib",
    "usr/lib/python3.11/tkinter",
    "usr/lib/python3.11/ensurepip",
    "usr/lib/python3.11/lib2to3",
    "usr/lib/python3.11/pydoc_data",
    "usr/lib/python3.11/turtledemo",
)
MODEL_BYTES = 4 * 1024 * 1024
MODEL_SALT = bytes.fromhex("a1" * 32)
MODEL_UUID = "0b7a1c3e-5d2f-4e6a-8b9c-0d1e2f3a4b5c"

INIT = """#!/bin/busybox sh
# The reduced image's init: modules, the verity model disk, then the proxy's health check.
/bin/busybox mkdir -p /proc /sys /dev /tmp /run
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
/bin/busybox mount -t tmpfs tmpfs /run
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
ip link set lo up
for m in $(cat /etc/affidavit/modules); do insmod "/lib/modules/$m" || echo "init: insmod $m failed"; done
i=0; while [ ! -b /dev/vdb ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
table=$(sed -n 's/.*dm-mod\\.create="[^,]*,[^,]*,[^,]*,ro,\\([^"]*\\)".*/\\1/p' /proc/cmdline)
if [ -n "$table" ]; then
  dmsetup create vroot --readonly --noudevsync --table "$table" || echo "init: dmsetup failed"
fi
echo "init: starting the proxy health check"
python3.11 -m enclave_image.guest
echo "init: health check exited $?"
echo o > /proc/sysrq-trigger
sleep 5
"""


@dataclass(frozen=True)
class BuildResult:
    out_dir: Path
    kernel: Path
    initrd: Path
    cmdline: Path
    model: Path
    model_verity: Path
    root_hash: str
    initrd_sha256: str

    def json(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.__dict__.items()}


def _run(args: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def _deb(cache: Path, package: str) -> Path:
    """The package's .deb in ``cache``, downloaded once with ``apt-get download``."""
    name = package.split(":")[0]
    found = sorted(cache.glob(f"{name}_*.deb"))
    if not found:
        _run(["apt-get", "download", package], cwd=cache)
        found = sorted(cache.glob(f"{name}_*.deb"))
    if not found:
        raise RuntimeError(f"apt-get download {package} gave no .deb")
    return found[-1]


def _kernel_package(cache: Path) -> Path:
    meta = _deb(cache, KERNEL_META)
    depends = _run(["dpkg-deb", "-f", str(meta), "Depends"])
    match = re.search(r"(linux-image-[0-9][^\s,(]*)", depends)
    if match is None:
        raise RuntimeError(f"{KERNEL_META}: no versioned kernel in Depends: {depends!r}")
    return _deb(cache, match.group(1))


def _module_deps(path: Path) -> list[str]:
    match = re.search(rb"depends=([A-Za-z0-9_,-]*)\0", path.read_bytes())
    return [d for d in (match.group(1).decode().split(",") if match else []) if d]


def _modules(kernel_tree: Path, root: Path) -> list[str]:
    """Copy ``MODULES`` and their dependencies into ``root``; return the load order."""
    (base,) = (kernel_tree / "lib/modules").iterdir()
    files = {p.name.split(".ko")[0]: p for p in base.rglob("*.ko*")}
    order: list[str] = []

    def visit(name: str) -> None:
        key = name if name in files else name.replace("_", "-")
        if key not in files:
            key = name.replace("-", "_")
        if key in order:
            return
        for dep in _module_deps(files[key]):
            visit(dep)
        order.append(key)

    for name in MODULES:
        visit(name)
    dest = root / "lib/modules"
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    for key in order:
        shutil.copyfile(files[key], dest / files[key].name)
        names.append(files[key].name)
    return names


def _python_packages(root: Path, cache: Path) -> None:
    site = root / "usr/lib/python3/dist-packages"
    site.mkdir(parents=True, exist_ok=True)
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    checkout = Path(__file__).resolve().parent.parent
    for old in wheels.glob("affidavit-*.whl"):
        old.unlink()
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels),
          str(checkout)])  # fmt: skip
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
          "--only-binary", ":all:", "-d", str(wheels), *pins])  # fmt: skip
    ours = sorted(wheels.glob("affidavit-*.whl"))
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
          "--no-compile", "--find-links", str(wheels), "--target", str(site),
          *pins, str(ours[-1])])  # fmt: skip
    for junk in site.glob("bin"):
        shutil.rmtree(junk)
    # pip records where each wheel came from (the cache path, the wheel's own hash, which
    # for our wheel changes with its zip timestamps): drop it so the tree does not vary.
    for direct in site.glob("*.dist-info/direct_url.json"):
        direct.unlink()
        record = direct.with_name("RECORD")
        kept = [
            line
            for line in record.read_text().splitlines()
            if not line.startswith(f"{direct.parent.name}/direct_url.json,")
        ]
        record.write_text("\n".join(kept) + "\n")


def _model_disk(out_dir: Path) -> tuple[Path, Path, str]:
    """A deterministic stand-in for the weights (a hash stream) and its verity hash file."""
    model, hashes = out_dir / "model.img", out_dir / "model.verity"
    with model.open("wb") as f:
        for i in range(MODEL_BYTES // 32):
            f.write(hashlib.sha256(b"affidavit model %d" % i).digest())
    result = format_verity(model, hashes, salt=MODEL_SALT, uuid=MODEL_UUID)
    return model, hashes, cmdline(result)


def build_reduced(out_dir: Path | str, cache_dir: Path | str, *, epoch: int = 0) -> BuildResult:
    """Build ``vmlinuz``, ``initrd.img``, ``cmdline``, ``model.img`` and ``model.verity``
    into ``out_dir``; Debian packages and wheels are cached in ``cache_dir``."""
    out_dir, cache_dir = Path(out_dir), Path(cache_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    debs = cache_dir / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="affidavit-image-") as tmp:
        work = Path(tmp)
        root, kernel_tree = work / "root", work / "kernel"
        _run(["dpkg-deb", "-x", str(_kernel_package(debs)), str(kernel_tree)])
        (vmlinuz,) = (kernel_tree / "boot").glob("vmlinuz-*")
        kernel = out_dir / "vmlinuz"
        shutil.copyfile(vmlinuz, kernel)
        for package in DEBS:
            _run(["dpkg-deb", "-x", str(_deb(debs, package)), str(root)])
        for prune in _PRUNE:
            shutil.rmtree(root / prune, ignore_errors=True)
        modules = _modules(kernel_tree, root)
        _python_packages(root, cache_dir)
        model, hashes, verity_words = _model_disk(out_dir)
        etc = root / "etc/affidavit"
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "modules").write_text("\n".join(modules) + "\n")
        digest = hashlib.sha256(model.read_bytes()).hexdigest()
        (etc / "model.json").write_text(
            json.dumps({"device": "/dev/dm-0", "sha256": digest, "size": MODEL_BYTES}) + "\n"
        )
        init = root / "init"
        init.write_text(INIT)
        init.chmod(0o755)
        for d in ("proc", "sys", "dev", "tmp", "run", "root"):
            (root / d).mkdir(exist_ok=True)
        # Bytecode ahead of time: compiling at import would cost minutes under TCG. Checked
        # by hash, not mtime, so the bytes do not depend on when the tree was unpacked.
        _run([sys.executable, "-m", "compileall", "-q", "-j0",
              "--invalidation-mode", "unchecked-hash", "-s", str(root), "-p", "/",
              str(root / "usr/lib/python3.11"), str(root / "usr/lib/python3/dist-packages")])  # fmt: skip
        initrd = out_dir / "initrd.img"
        result = write_initrd(root, initrd, epoch=epoch)
    words = ["console=ttyS0", "panic=-1", "loglevel=4", verity_words]
    cmdline_path = out_dir / "cmdline"
    cmdline_path.write_text(" ".join(words) + "\n")
    root_hash = re.search(r"sha256 ([0-9a-f]{64})", verity_words)
    return BuildResult(
        out_dir=out_dir,
        kernel=kernel,
        initrd=initrd,
        cmdline=cmdline_path,
        model=model,
        model_verity=hashes,
        root_hash=root_hash.group(1) if root_hash else "",
        initrd_sha256=result.sha256,
    )


OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS.fd")
HEALTH_RE = re.compile(
    r"affidavit-proxy healthy (http://127\.0\.0\.1:\d+) metrics=(\d+) model=([0-9a-f]{64})"
)


def qemu_command(out_dir: Path, vars_copy: Path, *, ovmf_code: Path = OVMF_CODE) -> list[str]:
    """QEMU with software emulation (TCG, no KVM) and OVMF, booting the built kernel and
    initrd directly with the model disk (``/dev/vda``) and its hash tree (``/dev/vdb``)."""
    return [
        "qemu-system-x86_64", "-machine", "q35", "-accel", "tcg", "-m", "1024", "-smp", "1",
        "-nographic", "-no-reboot", "-net", "none",
        "-drive", f"if=pflash,format=raw,readonly=on,file={ovmf_code}",
        "-drive", f"if=pflash,format=raw,file={vars_copy}",
        "-kernel", str(out_dir / "vmlinuz"), "-initrd", str(out_dir / "initrd.img"),
        "-append", (out_dir / "cmdline").read_text().strip(),
        "-drive", f"file={out_dir / 'model.img'},if=virtio,format=raw,readonly=on",
        "-drive", f"file={out_dir / 'model.verity'},if=virtio,format=raw,readonly=on",
    ]  # fmt: skip


@dataclass(frozen=True)
class BootResult:
    health: str | None  # the proxy's health line, None if it never came
    seconds: float
    console: str  # everything the serial console printed


def boot(out_dir: Path | str, *, timeout: float = 240.0) -> BootResult:
    """Boot the image under QEMU; read the serial console until the health line or the end."""
    out_dir = Path(out_dir)
    start = time.monotonic()
    lines: list[str] = []
    health: str | None = None
    with tempfile.TemporaryDirectory(prefix="affidavit-boot-") as tmp:
        vars_copy = Path(tmp) / "OVMF_VARS.fd"
        shutil.copyfile(OVMF_VARS, vars_copy)
        proc = subprocess.Popen(
            qemu_command(out_dir, vars_copy),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\r\n")
                lines.append(line)
                match = HEALTH_RE.search(line)
                if match:
                    health = match.group(0)
                    break
        finally:
            timer.cancel()
            proc.kill()
            proc.wait()
    return BootResult(health, time.monotonic() - start, "\n".join(lines))


def main() -> None:  # pragma: no cover - `python -m enclave_image.build OUT CACHE`
    print(json.dumps(build_reduced(sys.argv[1], sys.argv[2]).json(), indent=2))


if __name__ == "__main__":  # pragma: no cover
    os.umask(0o022)
    main()
