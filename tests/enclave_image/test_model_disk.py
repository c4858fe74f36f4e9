"""The full profile's model disk, as the build assembles it, without a build or a boot.

The release build ships SmolLM2-135M-Instruct, the GGUF file ``inference.pull`` pins by
sha256, with a ``model.json`` the guest reads to start its engine; ``--test-model tiny``
(a test build, for QEMU boots under emulation) ships the tiny model instead and says so in
``model.json``, ``inputs.json`` and on the console, and ``image measure`` refuses it
(``test_publish.py``). The full build and its boot are in ``test_full_image.py``.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from affidavit.cli import main
from enclave_image.appliance import (
    GuestLayout,
    StartError,
    prepare_dirs,
    read_model_disk,
    services,
    write_appliance_json,
)
from enclave_image.build import MODEL_JSON, build_image, model_tree, write_inputs
from enclave_image.publish import read_image_dir
from inference.gguf_file import is_gguf
from inference.pull import KNOWN_MODELS, model_path

RELEASE = KNOWN_MODELS["smollm2-135m"]


def _skip(reason: str) -> None:
    print(f"test_model_disk: skipped: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def release_disk(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """The release model's disk tree, from the model cache (``make model`` fills it): a fast
    test does not download 92 MB."""
    if not model_path(RELEASE.name).is_file():
        _skip(
            f"{RELEASE.filename} is not in the model cache ({model_path(RELEASE.name)}):"
            " `make model` (affidavit engine pull smollm2-135m) puts it there"
        )
    tree = tmp_path_factory.mktemp("release") / "model"
    said: list[str] = []
    record = model_tree(tree, say=said.append)
    assert any("smollm2-135m" in line for line in said)
    return tree, record


def _layout(tmp_path: Path, model_dir: Path) -> GuestLayout:
    (tmp_path / "state").mkdir(exist_ok=True)
    return GuestLayout(
        state_mount=tmp_path / "state",
        run_dir=tmp_path / "run",
        model_dir=model_dir,
        switch_users=False,
    )


def _engine_args(layout: GuestLayout) -> tuple[str, str]:
    argv = list(services(layout)["engine"].argv)
    return argv[argv.index("--model") + 1], argv[argv.index("--model-name") + 1]


def test_the_release_model_disk_holds_the_pinned_gguf_and_the_engine_serves_it(
    release_disk: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    tree, record = release_disk
    gguf = tree / RELEASE.filename
    assert sorted(p.name for p in tree.iterdir()) == sorted([RELEASE.filename, MODEL_JSON])
    assert is_gguf(gguf) and gguf.stat().st_size == RELEASE.size
    assert record["sha256"] == RELEASE.file_sha256  # what inputs.json records
    assert record["name"] == "smollm2-135m" and record["path"] == RELEASE.filename
    assert RELEASE.wheel_sha256 in str(record["source"])
    guest = json.loads((tree / MODEL_JSON).read_text())
    assert guest == {"name": "smollm2-135m", "path": RELEASE.filename, "test_model": None}
    # readable by the engine's uid whatever the build's umask was
    assert {stat.S_IMODE(p.stat().st_mode) for p in (gguf, tree / MODEL_JSON)} == {0o644}

    layout = _layout(tmp_path, tree)
    assert read_model_disk(tree).test_model is None
    assert _engine_args(layout) == (str(gguf), "smollm2-135m")
    prepare_dirs(layout)
    write_appliance_json(layout)  # the harness's turns ask the engine for this model id
    appliance = json.loads((layout.home_dir / "appliance.json").read_text())
    assert appliance["model"] == "smollm2-135m"


def test_the_release_disk_squashes_root_owned_and_readable(
    release_disk: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    """The squashfs the guest mounts: the same flags as the build (``_squashfs``)."""
    from enclave_image.build import _squashfs

    if shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None:
        _skip("mksquashfs/unsquashfs are not installed (make system-deps: squashfs-tools)")
    tree, _ = release_disk
    _squashfs(tree, tmp_path / "model.img", 0)
    listing = subprocess.run(
        ["unsquashfs", "-lln", str(tmp_path / "model.img")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    line = next(x for x in listing.splitlines() if x.endswith("/" + RELEASE.filename))
    assert line.startswith("-rw-r--r-- 0/0 ") and f" {RELEASE.size} " in line


def test_the_test_model_is_the_tiny_one_and_is_marked(tmp_path: Path) -> None:
    tree = tmp_path / "model"
    said: list[str] = []
    record = model_tree(tree, test_model="tiny", say=said.append)
    assert any("TEST MODEL" in line for line in said)
    assert sorted(p.name for p in tree.iterdir()) == ["affidavit-tiny", MODEL_JSON]
    assert (tree / "affidavit-tiny" / "config.json").is_file()
    assert not list(tree.rglob("*.gguf"))
    guest = json.loads((tree / MODEL_JSON).read_text())
    assert guest == {"name": "affidavit-tiny", "path": "affidavit-tiny", "test_model": "tiny"}
    files = record["files"]
    assert record["name"] == "affidavit-tiny" and isinstance(files, dict)
    assert "model.safetensors" in files
    assert _engine_args(_layout(tmp_path, tree)) == (str(tree / "affidavit-tiny"), "affidavit-tiny")

    # inputs.json marks the test build, and what `image measure` reads sees the mark
    image = tmp_path / "image"
    image.mkdir()
    for name in ("vmlinuz", "initrd.img"):
        (image / name).write_bytes(b"x")
    (image / "cmdline.txt").write_text("console=ttyS0\n")
    write_inputs(image, {"profile": "full"}, model=record, test_model="tiny")
    doc = json.loads((image / "inputs.json").read_text())
    assert doc["test_model"] == "tiny" and doc["model"]["name"] == "affidavit-tiny"
    assert read_image_dir(image).test_model == "tiny"
    write_inputs(image, {"profile": "full"}, model=record, test_model=None)
    assert read_image_dir(image).test_model is None


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        (None, "cannot read"),
        ("[]", "not a JSON object"),
        ('{"name": "m"}', "names no model"),
        ('{"name": "m", "path": "../etc/passwd"}', "is not on the disk"),
        ('{"name": "m", "path": "/etc/passwd"}', "is not on the disk"),
        ('{"name": "m", "path": "absent.gguf"}', "is not on the disk"),
        ('{"name": "m", "path": "m.gguf", "test_model": 1}', "is not a name"),
    ],
)
def test_a_model_disk_the_guest_cannot_use_stops_the_start(
    tmp_path: Path, doc: str | None, why: str
) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    if doc is not None:
        (tmp_path / MODEL_JSON).write_text(doc)
    with pytest.raises(StartError, match=why):
        read_model_disk(tmp_path)


def test_the_test_option_is_for_the_full_profile_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only the full profile"):
        build_image(tmp_path / "out", tmp_path / "cache", profile="reduced", test_model="tiny")
    with pytest.raises(ValueError, match="tiny"):
        model_tree(tmp_path / "m", test_model="huge")  # type: ignore[arg-type]
    base = ["image", "build", "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "c")]
    assert main([*base, "--profile", "reduced", "--test-model", "tiny"]) == 2
    assert main([*base, "--profile", "full", "--test-model", "huge"]) == 2
    assert not (tmp_path / "out").exists() and not (tmp_path / "m").exists()
