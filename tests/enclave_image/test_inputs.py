"""Acceptance 1 of issue 8: the build takes only what the lock pins.

The committed lock covers every Debian package, wheel and kernel module list the profiles
name; a cached input is used only when its SHA-256 is the pinned one, and anything else is
refused with both digests named. The fetch paths run against the real Debian mirror and the
real package index only in the boot test (cold cache); here the cache is a folder of files.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from enclave_image.contents import FULL_DEBS, REDUCED_DEBS, REDUCED_WHEELS
from enclave_image.inputs import (
    LOCK_FILE,
    InputError,
    debian_package,
    dist_key,
    pinned_lock,
    requirement_lines,
    wheel_files,
)
from enclave_image.lock import FORMAT, DebianPackage, Lock, Wheel


def test_the_committed_lock_pins_every_input_the_profiles_name() -> None:
    lock = pinned_lock()
    debs = {d.package for d in lock.debian}
    assert set(FULL_DEBS) <= debs and set(REDUCED_DEBS) <= debs
    kernels = [d for d in debs if re.fullmatch(r"linux-image-[0-9].*-amd64", d)]
    assert len(kernels) == 1, kernels  # one versioned generic kernel (it has sev-guest)
    wheels = {dist_key(w.name) for w in lock.wheels}
    assert {dist_key(n) for n in REDUCED_WHEELS} <= wheels
    assert {"torch", "tokenizers", "safetensors", "gguf", "openai", "mcp"} <= wheels  # full
    assert len(wheels) == len(lock.wheels)  # no distribution twice
    for deb in lock.debian:
        assert deb.url.startswith("http://deb.debian.org/debian"), deb.url
    assert json.loads(LOCK_FILE.read_text())["format"] == FORMAT


def test_the_committed_lock_covers_the_checkouts_engine_closure() -> None:
    """The image's wheel is built from the checkout, so the lock must pin every distribution
    the checkout's ``affidavit[engine]`` needs (read from its pyproject.toml, not from the
    installed metadata, which may predate a new dependency): a dependency added without
    `affidavit image lock` fails here, not in a guest that cannot import it."""
    pytest.importorskip("packaging", reason="`affidavit image lock` needs the dev extra")
    from enclave_image.contents import full_wheels

    closure = {dist_key(n) for n in full_wheels()}
    assert {"gguf", "numpy", "requests"} <= closure
    assert closure <= {dist_key(w.name) for w in pinned_lock().wheels}


def _lock(tmp_path: Path) -> tuple[Lock, Path]:
    cache = tmp_path / "cache"
    deb = DebianPackage(
        package="busybox-static", version="1:1.35.0-4", arch="amd64",
        sha256=hashlib.sha256(b"the deb").hexdigest(), url="http://127.0.0.1:9/x.deb",
    )  # fmt: skip
    wheel = Wheel(
        name="rfc8785", version="0.1.4", filename="rfc8785-0.1.4-py3-none-any.whl",
        sha256=hashlib.sha256(b"the wheel").hexdigest(),
    )  # fmt: skip
    (cache / "debian").mkdir(parents=True)
    (cache / "wheels").mkdir()
    (cache / deb.cache_path).write_bytes(b"the deb")
    (cache / wheel.cache_path).write_bytes(b"the wheel")
    return Lock(format=FORMAT, debian=(deb,), wheels=(wheel,)), cache


def test_a_cached_input_with_the_pinned_digest_is_used_as_it_is(tmp_path: Path) -> None:
    lock, cache = _lock(tmp_path)
    assert debian_package(lock, cache, "busybox-static").read_bytes() == b"the deb"
    (wheel,) = wheel_files(lock, cache, ["RFC8785"])  # names compare as pip compares them
    assert wheel.read_bytes() == b"the wheel"


def test_a_changed_cached_input_is_refused_naming_both_digests(tmp_path: Path) -> None:
    lock, cache = _lock(tmp_path)
    deb = cache / lock.debian[0].cache_path
    deb.write_bytes(b"another deb")
    with pytest.raises(InputError) as caught:
        debian_package(lock, cache, "busybox-static")
    message = str(caught.value)
    assert str(deb) in message and lock.debian[0].sha256 in message
    assert hashlib.sha256(b"another deb").hexdigest() in message
    assert deb.read_bytes() == b"another deb"  # refused, not silently replaced

    (cache / lock.wheels[0].cache_path).write_bytes(b"another wheel")
    with pytest.raises(InputError, match=r"rfc8785 0\.1\.4"):
        wheel_files(lock, cache, ["rfc8785"])


def test_an_input_the_lock_does_not_name_is_refused(tmp_path: Path) -> None:
    lock, cache = _lock(tmp_path)
    with pytest.raises(InputError, match="dmsetup is not in the lock"):
        debian_package(lock, cache, "dmsetup")
    with pytest.raises(InputError, match="wheel torch is not in the lock"):
        wheel_files(lock, cache, ["torch"])


def test_a_wheel_missing_from_the_cache_is_fetched_only_with_its_hash(tmp_path: Path) -> None:
    """pip downloads with ``--require-hashes``: the index's real rfc8785 0.1.4 is not the
    pinned bytes here, so pip refuses it and nothing lands in the cache."""
    lock, cache = _lock(tmp_path)
    (cache / lock.wheels[0].cache_path).unlink()
    assert requirement_lines(lock.wheels) == (
        f"rfc8785==0.1.4 --hash=sha256:{hashlib.sha256(b'the wheel').hexdigest()}\n"
    )
    with pytest.raises(InputError, match=r"(?i)do not match the hashes"):
        wheel_files(lock, cache, ["rfc8785"])
    assert not (cache / lock.wheels[0].cache_path).exists()


def test_the_lock_pins_the_firmware_the_ovmf_build_reproduces() -> None:
    from enclave_image.ovmf import OVMF_SHA256

    ovmf = pinned_lock().ovmf
    assert ovmf is not None
    assert ovmf.sha256 == OVMF_SHA256  # one pin, stated twice: they must agree
    assert ovmf.file == "ovmf/OVMF.amdsev.fd"
