"""The build's inputs, taken only as the lock pins them (``enclave_image/image.lock.json``).

A build asks for a Debian package or a wheel by name; this module answers with the cached
file whose SHA-256 the lock pins, fetching it first if the cache lacks it (``apt-get
download <package>=<version>``, else the lock's URL; ``pip download --require-hashes``).
Anything that hashes differently is refused, naming the file and both digests, and is
never used; a rebuild therefore does not depend on a mirror still serving what we built
from, only on the cache or some mirror holding those exact bytes.

:func:`make_lock` is the other direction, for whoever updates the pins: it asks the Debian
mirror (``apt-get download --print-uris``, which gives URL and SHA-256) and this
environment (the installed version of each wheel) and writes a lock.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

from enclave_image.lock import (
    FORMAT,
    Artifact,
    DebianPackage,
    Lock,
    Wheel,
    file_sha256,
    load_lock,
)
from enclave_image.tool import run_tool

__all__ = [
    "LOCK_FILE",
    "InputError",
    "debian_package",
    "dist_key",
    "file_sha256",
    "make_lock",
    "pinned_lock",
    "requirement_lines",
    "wheel_files",
]

#: The committed lock, shipped inside the package so an installed ``affidavit`` finds it.
LOCK_FILE = Path(__file__).with_name("image.lock.json")
_CHUNK = 1 << 20


class InputError(RuntimeError):
    """An input the build cannot use: not in the lock, unavailable, or not the pinned bytes."""


_run = partial(run_tool, error=InputError)


def pinned_lock(path: Path | None = None) -> Lock:
    """The lock the build uses: ``path``, else the committed one."""
    return load_lock(path or LOCK_FILE)


def _checked(path: Path, expected: str, what: str) -> Path:
    actual = file_sha256(path)
    if actual != expected:
        raise InputError(
            f"{what}: {path} has sha256 {actual}, the lock pins {expected} "
            "(a changed input is never used; delete the file to fetch it again)"
        )
    return path


def _download(url: str, dest: Path) -> None:
    import httpx  # only on the fallback path: the mirror no longer serves the version

    with httpx.stream("GET", url, follow_redirects=True, timeout=120) as reply:
        reply.raise_for_status()
        with dest.open("wb") as f:
            for chunk in reply.iter_bytes(_CHUNK):
                f.write(chunk)


def debian_package(lock: Lock, cache: Path, name: str) -> Path:
    """The pinned ``.deb`` of ``name`` in ``cache`` (fetched and checked if absent)."""
    entry = next((d for d in lock.debian if d.package == name), None)
    if entry is None:
        raise InputError(
            f"Debian package {name} is not in the lock; add it with `affidavit image lock`"
        )
    path = cache / entry.cache_path
    what = f"Debian package {name} {entry.version}"
    if path.is_file():
        return _checked(path, entry.sha256, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetch-") as tmp:
        try:
            _run(["apt-get", "download", f"{name}={entry.version}"], cwd=Path(tmp))
            (got,) = Path(tmp).glob("*.deb")
        except (InputError, ValueError) as apt_error:
            got = Path(tmp) / path.name
            try:
                _download(entry.url, got)
            except Exception as exc:  # both routes failed: say both
                raise InputError(f"{what}: apt-get: {apt_error}; {entry.url}: {exc}") from None
        _checked(got, entry.sha256, what)
        got.replace(path)
    return path


def dist_key(name: str) -> str:
    """PEP 503 normalisation (the comparison pip makes between a name and a wheel's)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock_wheel(lock: Lock, name: str) -> Wheel:
    entry = next((w for w in lock.wheels if dist_key(w.name) == dist_key(name)), None)
    if entry is None:
        raise InputError(f"wheel {name} is not in the lock; add it with `affidavit image lock`")
    return entry


def requirement_lines(wheels: Iterable[Wheel]) -> str:
    """A ``--require-hashes`` requirements file for exactly these wheels."""
    return "".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n" for w in wheels)


def wheel_files(lock: Lock, cache: Path, names: Iterable[str]) -> list[Path]:
    """The pinned wheel of each distribution in ``names``, in ``cache/wheels``."""
    entries = [_lock_wheel(lock, name) for name in names]
    folder = cache / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    missing = [w for w in entries if not (cache / w.cache_path).is_file()]
    if missing:
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
            req.write(requirement_lines(missing))
            req.flush()
            _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                  "--only-binary", ":all:", "--require-hashes", "-r", req.name,
                  "-d", str(folder)])  # fmt: skip
    return [
        _checked(cache / w.cache_path, w.sha256, f"wheel {w.name} {w.version}") for w in entries
    ]


# -- writing a lock --------------------------------------------------------------------------


def _print_uris(name: str) -> tuple[str, str, str]:
    """URL, file name and SHA-256 of the candidate version, as the mirror's index gives them."""
    out = _run(["apt-get", "download", "--print-uris", name])
    match = re.search(r"'([^']+)' (\S+) \d+ SHA256:([0-9a-f]{64})", out)
    if match is None:
        raise InputError(f"apt-get download --print-uris {name}: no SHA256 in {out!r}")
    return match.group(1), match.group(2), match.group(3)


def kernel_package(meta: str) -> str:
    """The versioned kernel package a Debian kernel metapackage depends on."""
    out = _run(["apt-cache", "depends", meta])
    match = re.search(r"Depends: (linux-image-[0-9]\S*)", out)
    if match is None:
        raise InputError(f"{meta}: no versioned kernel among its dependencies: {out!r}")
    return match.group(1)


def _debian_entry(cache: Path, name: str, say: Callable[[str], None]) -> DebianPackage:
    url, filename, sha = _print_uris(name)
    fields = re.fullmatch(r"([^_]+)_([^_]+)_([^_]+)\.deb", filename)
    if fields is None:
        raise InputError(f"{name}: unexpected .deb file name {filename!r}")
    package, version, arch = fields.group(1), fields.group(2).replace("%3a", ":"), fields.group(3)
    entry = DebianPackage(package=package, version=version, arch=arch, sha256=sha, url=url)
    say(f"debian  {package} {version}")
    debian_package(Lock(format=FORMAT, debian=(entry,)), cache, package)
    return entry


def _wheel_entry(cache: Path, name: str, say: Callable[[str], None]) -> Wheel:
    version = importlib.metadata.version(name)
    folder = cache / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".fetch-") as tmp:
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
              "--only-binary", ":all:", "-d", tmp, f"{name}=={version}"])  # fmt: skip
        (got,) = Path(tmp).glob("*.whl")
        target = folder / got.name
        if not target.is_file():
            shutil.move(got, target)
    say(f"wheel   {name} {version}")
    return Wheel(name=name, version=version, filename=target.name, sha256=file_sha256(target))


def make_lock(
    cache: Path,
    debian: Iterable[str],
    wheels: Iterable[str],
    *,
    ovmf: Artifact | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> Lock:
    """A lock of the mirror's candidate version of each Debian package and this
    environment's version of each wheel, every file fetched into ``cache`` and hashed."""
    debs = tuple(_debian_entry(cache, name, say) for name in sorted(set(debian)))
    whls = tuple(_wheel_entry(cache, name, say) for name in sorted(set(wheels), key=dist_key))
    return Lock(format=FORMAT, debian=debs, wheels=whls, ovmf=ovmf)


def write_lock(lock: Lock, path: Path) -> None:
    """Indented, entries in name order (as :func:`make_lock` sorts them), one trailing
    newline: a lock's diff shows what changed."""
    doc = lock.model_dump(mode="json", exclude_none=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
