"""``enclave_image.lock``: a synthetic cache checked against a lock (every input matching,
then one missing, one changed), the lock format's refusals, and ``affidavit image inputs``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from affidavit.cli import main
from enclave_image.lock import FORMAT, LockError, load_lock, unpinned, verify_inputs

FILES = {
    "debian/busybox-static_1%3a1.36.1-9_amd64.deb": b"a deb",
    "wheels/pydantic-2.9.2-py3-none-any.whl": b"a wheel",
    "ovmf/OVMF.fd": b"firmware",
    "kernel/vmlinuz": b"kernel",
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lock_doc() -> dict[str, Any]:
    return {
        "format": FORMAT,
        "debian": [
            {
                "package": "busybox-static",
                "version": "1:1.36.1-9",
                "arch": "amd64",
                "sha256": _sha(b"a deb"),
                "url": "https://deb.debian.org/debian/pool/main/b/busybox/x.deb",
            }
        ],
        "wheels": [
            {
                "name": "pydantic",
                "version": "2.9.2",
                "filename": "pydantic-2.9.2-py3-none-any.whl",
                "sha256": _sha(b"a wheel"),
            }
        ],
        "ovmf": {
            "source": "edk2 AmdSevX64",
            "sha256": _sha(b"firmware"),
            "how": "build",
            "file": "ovmf/OVMF.fd",
        },
        "kernel": {
            "source": "linux",
            "sha256": _sha(b"kernel"),
            "how": "build",
            "file": "kernel/vmlinuz",
        },
    }


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    for rel, data in FILES.items():
        (tmp_path / "cache" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cache" / rel).write_bytes(data)
    (tmp_path / "image.lock.json").write_text(json.dumps(lock_doc(), indent=2))
    return tmp_path / "cache"


def test_a_matching_cache_has_no_problems(cache: Path) -> None:
    lock = load_lock(cache.parent / "image.lock.json")
    assert verify_inputs(lock, cache) == [] and unpinned(lock) == []


def test_missing_and_changed_inputs_are_named(cache: Path) -> None:
    lock = load_lock(cache.parent / "image.lock.json")
    (cache / "ovmf/OVMF.fd").write_bytes(b"firmware, patched")
    (cache / "wheels/pydantic-2.9.2-py3-none-any.whl").unlink()
    problems = verify_inputs(lock, cache)
    assert [(p.kind, p.name) for p in problems] == [("wheel", "pydantic 2.9.2"), ("ovmf", "OVMF")]
    wheel, ovmf = problems
    assert wheel.actual is None and "is missing" in str(wheel)
    assert ovmf.actual == _sha(b"firmware, patched") and ovmf.expected == _sha(b"firmware")
    assert str(cache / "ovmf/OVMF.fd") in str(ovmf)


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda d: d.update(format="affidavit-image-lock/2"), "format"),
        (lambda d: d["debian"][0].update(sha256="AB" * 32), "debian.0.sha256"),
        (lambda d: d["wheels"][0].update(filename="../evil.whl"), "wheels.0.filename"),
        (lambda d: d["ovmf"].update(file="/etc/passwd"), "ovmf.file"),
        (lambda d: d["kernel"].update(file="../../x"), "kernel.file"),
        (lambda d: d.update(extra=1), "extra"),
    ],
)
def test_bad_locks_are_refused(tmp_path: Path, mutate: Any, where: str) -> None:
    doc = lock_doc()
    mutate(doc)
    (tmp_path / "lock.json").write_text(json.dumps(doc))
    with pytest.raises(LockError, match=where.replace(".", r"\.")):
        load_lock(tmp_path / "lock.json")


def test_unpinned_sections(tmp_path: Path) -> None:
    (tmp_path / "lock.json").write_text(json.dumps({"format": FORMAT}))
    assert unpinned(load_lock(tmp_path / "lock.json")) == ["debian", "wheels", "ovmf"]


def test_cli(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = str(cache.parent / "image.lock.json")
    assert main(["image", "inputs", "--lock", lock, "--cache", str(cache), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    (cache / "kernel/vmlinuz").write_bytes(b"other")
    assert main(["image", "inputs", "--lock", lock, "--cache", str(cache), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [p["kind"] for p in doc["problems"]] == ["kernel"]
    assert main(["image", "inputs", "--lock", lock + ".absent", "--cache", str(cache)]) == 3
    (cache.parent / "bad.json").write_text("{}")
    assert main(["image", "inputs", "--lock", str(cache.parent / "bad.json"), "--cache", "x"]) == 2
