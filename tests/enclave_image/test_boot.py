"""Acceptance 6 of issue 8: the reduced image boots under QEMU with software emulation (TCG,
no KVM) and OVMF, with the dm-verity model disk attached, and the running proxy prints its
health line on the serial console.

The health line is printed by ``enclave_image.guest`` only after the proxy it started
answered ``GET /metrics`` over loopback; it carries the proxy's URL, the number of metric
families it served, and the sha256 of the model disk read through dm-verity (checked in
the guest against the build). The image is built once per session into
``.affidavit/image-cache`` (Debian packages and wheels are cached there; the first build
downloads ~60 MB). Needs ``qemu-system-x86`` and ``ovmf`` (``make system-deps``), and
``apt-get``/``dpkg-deb`` for the build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from attestation.measure import launch_digest
from enclave_image.build import OVMF_CODE, OVMF_VARS, BuildResult, boot, build_reduced
from enclave_image.inputs import LOCK_FILE
from enclave_image.publish import read_image_dir
from tests.enclave_image.checkouts import second_checkout, second_venv

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".affidavit" / "image-cache"
BUILT_OVMF = CACHE / "ovmf" / "OVMF.amdsev.fd"
VECTOR_OVMF = (
    REPO.parent / "shared/vectors/attestation/measurement/sev-snp-measure/ovmf_AmdSev_suffix.bin"
)


def _missing() -> str | None:
    for tool in ("qemu-system-x86_64", "apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make system-deps installs qemu-system-x86)"
    for firmware in (OVMF_CODE, OVMF_VARS):
        if not firmware.is_file():
            return f"{firmware} is missing (Debian's ovmf package; make system-deps)"
    return None


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    reason = _missing()
    if reason is not None:
        print(f"boot test skipped: {reason}")
        pytest.skip(reason)
    return build_reduced(tmp_path_factory.mktemp("image"), CACHE, epoch=0)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_reduced_image_boots_and_the_proxy_reports_healthy(image: BuildResult) -> None:
    cmdline = image.cmdline.read_text()
    assert "console=ttyS0" in cmdline
    assert f"sha256 {image.root_hash} " in cmdline  # the verity root in the measured cmdline

    result = boot(image.out_dir, timeout=300)

    assert result.health is not None, f"no health line; the console said:\n{result.console}"
    _, _, url, metrics, model = result.health.split(" ")
    assert url == "http://127.0.0.1:8700"  # the proxy's own URL, from the running server
    assert int(metrics.removeprefix("metrics=")) > 0  # it served its metric families
    model_sha = hashlib.sha256(image.model.read_bytes()).hexdigest()
    assert model == f"model={model_sha}"  # read through dm-verity in the guest
    assert "init: starting the proxy health check" in result.console
    print(f"booted to health in {result.seconds:.1f} s")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_corrupted_model_disk_gives_no_health_line(image: BuildResult, tmp_path: Path) -> None:
    bad = tmp_path / "image"
    shutil.copytree(image.out_dir, bad)
    data = bytearray((bad / "model.img").read_bytes())
    data[5 * 4096 + 7] ^= 0x01  # one bit in block 5: verity must refuse it
    (bad / "model.img").write_bytes(bytes(data))

    result = boot(bad, timeout=300)

    assert result.health is None
    assert "Input/output error" in result.console or "verity" in result.console


ARTIFACTS = (
    "vmlinuz", "initrd.img", "cmdline.txt", "model.img", "model.verity",
    "model-weights.sha256", "inputs.json",
)  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_second_build_from_another_checkout_and_environment_is_byte_identical(
    image: BuildResult, tmp_path: Path
) -> None:
    """Another checkout path, another venv outside it (so another interpreter path in every
    console script pip writes), another way of starting the build (``python -m`` against
    the fixture's in-process call), working directory, umask, locale, time zone and, with
    ``faketime``, a wall clock three years on; every artifact byte-identical."""
    checkout = second_checkout(tmp_path / "a" / "deeper" / "checkout-2")
    python = second_venv(tmp_path / "venvs" / "other")
    out = tmp_path / "elsewhere" / "out"
    env = {**os.environ, "TZ": "Asia/Tokyo", "LC_ALL": "C", "LANG": "C",
           "PYTHONPATH": str(checkout)}  # fmt: skip
    for name in ("SOURCE_DATE_EPOCH", "VIRTUAL_ENV"):
        env.pop(name, None)
    command = [str(python), "-m", "enclave_image.build", str(out), str(CACHE)]
    if shutil.which("faketime"):
        command = ["faketime", "-f", "+3y", *command]
    else:
        print("faketime is not installed (make system-deps): the wall clock is not varied")
    done = subprocess.run(
        command, cwd=tmp_path, env=env, umask=0o077, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout[done.stdout.index("{") :])["out_dir"] == str(out)
    for name in ARTIFACTS:
        first = hashlib.sha256((image.out_dir / name).read_bytes()).hexdigest()
        second = hashlib.sha256((out / name).read_bytes()).hexdigest()
        assert first == second, name
    # and so the SNP launch digest an auditor compares (the lock's AmdSev firmware when
    # `make ovmf` built it here, else the public vector's AmdSev OVMF)
    ovmf = BUILT_OVMF if BUILT_OVMF.is_file() else VECTOR_OVMF
    if ovmf.is_file():
        digests = {
            launch_digest(ovmf, mode="snp", vcpus=4, vcpu_type="EPYC-v4",
                          kernel=i.kernel, initrd=i.initrd, append=i.cmdline)
            for i in map(read_image_dir, (image.out_dir, out))
        }  # fmt: skip
        assert len(digests) == 1, digests
    else:
        print(f"no AmdSev OVMF here ({BUILT_OVMF}, {VECTOR_OVMF}): SNP digests not compared")
    # inputs.json (equal above) names the lock and our own wheel's digest, rebuilt alike
    inputs = json.loads((out / "inputs.json").read_text())
    assert inputs["lock_sha256"] == hashlib.sha256(LOCK_FILE.read_bytes()).hexdigest()
    assert len(inputs["affidavit_wheel"]) == 1
