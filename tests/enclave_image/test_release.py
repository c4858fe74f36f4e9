"""Issue 17 line 2, the fast half: ``make release`` and ``affidavit image release`` refuse,
before building anything, what ``docs/release.md`` says a release must not be cut with (no
version, no key, a key kept in the checkout or readable by others, a key that is not
``release.pub``'s, a release already published, another firmware), and the shapes table in
the code is the one the document states. The release itself (a full build, every shape
measured, the guide run against it from a second checkout) is ``test_auditor_guide.py``, in
``make test-long``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from affidavit.cli import main
from attestation.measure import vcpu_signature
from enclave_image.publish import (
    CHECKOUT,
    GUEST_FEATURES,
    GUEST_POLICY,
    RELEASE_SHAPES,
    RELEASE_VCPU_TYPES,
    RELEASE_VCPUS,
    VMM_TYPE,
    PublishError,
    check_release_key_file,
    public_key_text,
)

REPO = Path(__file__).resolve().parents[2]
RELEASE_DOC = REPO / "docs" / "release.md"


def _key(path: Path, mode: int = 0o600) -> Ed25519PrivateKey:
    key = Ed25519PrivateKey.generate()  # throwaway: the release key never enters the repo
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(mode)
    return key


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_make_release_refuses_without_version_or_key() -> None:
    done = _make("release", "RELEASE_KEY=/nowhere/release.pem")
    assert done.returncode == 2 and "make release needs VERSION=x.y.z" in done.stderr
    done = _make("release", "VERSION=1.2.3")
    assert done.returncode == 2 and "make release needs RELEASE_KEY=" in done.stderr


def test_make_release_runs_the_release_command_and_the_dry_run_writes_no_measurements() -> None:
    """What the long test runs is the Makefile's recipe, read with ``make -n``."""
    done = _make("-n", "release", "VERSION=1.2.3", "RELEASE_KEY=/keys/release.pem")
    assert done.returncode == 0, done.stderr
    assert (
        ".venv/bin/affidavit image release --version 1.2.3 --release-key /keys/release.pem"
        " --measurements measurements --build-dir .affidavit/release/1.2.3"
    ) in done.stdout.splitlines()
    assert ".venv/bin/python -m enclave_image.ovmf .affidavit/image-cache" in done.stdout
    dry = _make("-n", "release-dry-run")
    assert dry.returncode == 0, dry.stderr
    (line,) = [x for x in dry.stdout.splitlines() if "affidavit image release" in x]
    assert "--dry-run" in line and "--measurements" not in line and "--release-key" not in line


def test_the_release_command_refuses_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurements = tmp_path / "measurements"
    measurements.mkdir()
    key_file = tmp_path / "keys" / "release.pem"
    key_file.parent.mkdir()
    key = _key(key_file)
    (measurements / "release.pub").write_text(public_key_text(key) + "\n")
    build = tmp_path / "build"
    base = ["image", "release", "--measurements", str(measurements), "--build-dir", str(build)]
    base += ["--cache", str(tmp_path / "cache")]

    def refused(*more: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main([*base, *more])
        return code, capsys.readouterr().err

    assert refused("--release-key", str(key_file))[0] == 2  # no version
    assert refused("--version", "1.2.3")[0] == 2  # no key
    code, err = refused("--version", "../1", "--release-key", str(key_file))
    assert code == 2 and "version '../1'" in err
    assert refused("--version", "1.2.3", "--release-key", str(tmp_path / "absent.pem"))[0] == 3

    key_file.chmod(0o640)
    code, err = refused("--version", "1.2.3", "--release-key", str(key_file))
    assert code == 2 and "mode 0o640" in err and "chmod 600" in err
    key_file.chmod(0o600)

    other = tmp_path / "keys" / "other.pem"
    _key(other)
    code, err = refused("--version", "1.2.3", "--release-key", str(other))
    assert code == 2 and f"is not the one {measurements / 'release.pub'} pins" in err

    (measurements / "1.2.3.json").write_text("{}")
    code, err = refused("--version", "1.2.3", "--release-key", str(key_file))
    assert code == 2 and "1.2.3.json exists" in err
    (measurements / "1.2.3.json").unlink()

    wrong = tmp_path / "OVMF.fd"
    wrong.write_bytes(b"\0" * 4096)
    more = ("--version", "1.2.3", "--release-key", str(key_file), "--ovmf", str(wrong))
    code, err = refused(*more)
    assert code == 2 and "not the pinned" in err
    assert refused(*more[:-1], str(tmp_path / "no-ovmf.fd"))[0] == 3

    (measurements / "release.pub").unlink()
    code, err = refused("--version", "1.2.3", "--release-key", str(key_file))
    assert code == 3 and "release.pub is missing" in err
    assert not build.exists() and not (tmp_path / "cache").exists()  # nothing was built
    assert sorted(p.name for p in measurements.iterdir()) == []

    capsys.readouterr()
    code = main(["image", "release", "--dry-run", "--measurements", str(measurements)])
    assert code == 2 and "never measurements/" in capsys.readouterr().err


def test_a_release_key_inside_the_checkout_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key file under the checkout (even an ignored folder, even through a symlink from
    outside) could be committed or copied with the tree: refused, exit 2."""
    assert CHECKOUT == REPO
    inside = REPO / ".affidavit" / "test-release-key.pem"
    inside.parent.mkdir(exist_ok=True)
    try:
        _key(inside)
        link = tmp_path / "looks-outside.pem"
        link.symlink_to(inside)
        for path in (inside, link):
            with pytest.raises(PublishError, match="inside the checkout"):
                check_release_key_file(path)
        measurements = tmp_path / "measurements"
        measurements.mkdir()
        argv = ["image", "release", "--version", "1.2.3", "--release-key", str(link)]
        argv += ["--measurements", str(measurements), "--build-dir", str(tmp_path / "b")]
        capsys.readouterr()
        assert main(argv) == 2
        assert "inside the checkout" in capsys.readouterr().err
    finally:
        inside.unlink(missing_ok=True)
    # another checkout's measurements/ (a folder with .git): its tree is refused too
    other = tmp_path / "clone"
    (other / ".git").mkdir(parents=True)
    (other / "measurements").mkdir()
    _key(other / "release.pem")
    argv = ["image", "release", "--version", "1.2.3", "--release-key", str(other / "release.pem")]
    argv += ["--measurements", str(other / "measurements"), "--build-dir", str(tmp_path / "b")]
    capsys.readouterr()
    assert main(argv) == 2 and "inside the checkout" in capsys.readouterr().err
    # a key outside, mode 600, is accepted by the check
    _key(tmp_path / "ok.pem")
    assert check_release_key_file(tmp_path / "ok.pem") == tmp_path / "ok.pem"


def _doc_table() -> dict[str, str]:
    """docs/release.md's shapes table: ``| what | value |`` rows after "## The shapes"."""
    text = RELEASE_DOC.read_text()
    section = text.split("## The shapes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|$", section, flags=re.M)
    return {k.strip("` "): v.strip() for k, v in rows if not set(k) <= {"-"}}


def test_the_shapes_table_is_the_documented_one_and_sev_snp_measure_knows_every_type() -> None:
    table = _doc_table()
    counts = [int(n) for n in re.findall(r"\d+", table["vCPU counts"])]
    types = re.findall(r"`([^`]+)`", table["vCPU types"])
    assert tuple(counts) == RELEASE_VCPUS and tuple(types) == RELEASE_VCPU_TYPES, table
    assert table["VMM type"] == f"`{VMM_TYPE}`"
    assert table["guest features"] == f"`{GUEST_FEATURES:#x}`"
    assert table["guest policy"].startswith(f"`{GUEST_POLICY:#x}`")
    assert len(RELEASE_SHAPES) == len(counts) * len(types) == int(table["launch digests"])
    assert len(set(RELEASE_SHAPES)) == len(RELEASE_SHAPES)
    for vcpu_type in RELEASE_VCPU_TYPES:
        assert vcpu_signature(vcpu_type=vcpu_type) is not None
