"""SEV launch digests through ``attestation.measure``: sev-snp-measure's own 24 upstream cases.

The cases and the two 4 KiB OVMF tails are read in place from
``../shared/vectors/attestation/measurement/sev-snp-measure`` (never copied into the
project); without that folder those tests skip, saying so. The input checks need nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from attestation.measure import MeasureError, launch_digest, vcpu_signature

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "attestation"
MEASURE = VECTORS / "measurement" / "sev-snp-measure"
EMPTY = "<empty file>"


def _cases() -> list[Any]:
    path = MEASURE / "expected.json"
    if not path.is_file():
        return []
    cases: list[dict[str, Any]] = json.loads(path.read_text())["cases"]
    return [pytest.param(case, id=case["name"]) for case in cases]


@pytest.fixture(scope="module")
def measure_vectors() -> Path:
    """The sev-snp-measure vectors folder; without it, the test skips and says why."""
    if not (MEASURE / "expected.json").is_file():
        reason = (
            f"{MEASURE} is absent: the public measurement vectors live there "
            "(../shared/vectors beside the repository), so the launch-digest cases cannot run"
        )
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return MEASURE


def test_the_vectors_are_all_here(measure_vectors: Path) -> None:
    """The manifest promises 24 cases (measure-01); all of them run below."""
    assert len(_cases()) == 24


@pytest.mark.parametrize("case", _cases() or [pytest.param(None, id="no-vectors")])
def test_upstream_case(case: dict[str, Any] | None, measure_vectors: Path, tmp_path: Path) -> None:
    assert case is not None
    empty = tmp_path / "empty"
    empty.write_bytes(b"")

    def path(value: str | None) -> Path | None:
        return None if value is None else empty if value == EMPTY else measure_vectors / value

    vcpu_sig = case["vcpu_sig"]
    run = dict(
        mode=case["mode"],
        vcpus=case["vcpus"],
        vcpu_type=case["vcpu_type"],
        vcpu_sig=int(vcpu_sig, 16) if vcpu_sig is not None else None,
        kernel=path(case["kernel"]),
        initrd=path(case["initrd"]),
        append=case["append"],
        guest_features=int(case["guest_features"], 16),
        vmm_type=case["vmm_type"],
        ovmf_hash=case["snp_ovmf_hash"],
    )
    ovmf = measure_vectors / case["ovmf"]
    if "expected_error" in case:
        with pytest.raises(MeasureError) as caught:
            launch_digest(ovmf, **run)
        assert case["expected_error"] in str(caught.value)
        assert "kernel" in str(caught.value)  # the message names the input at fault
    else:
        assert launch_digest(ovmf, **run) == case["expected_hex"]


def test_ovmf_hash_gives_the_same_digest_as_the_file(measure_vectors: Path, tmp_path: Path) -> None:
    ovmf = measure_vectors / "ovmf_AmdSev_suffix.bin"
    common: dict[str, Any] = dict(vcpus=2, vcpu_type="EPYC-Milan", guest_features=0x1)
    by_file = launch_digest(ovmf, **common)
    assert len(by_file) == 96
    pre = "086e2e9149ebf45abdc3445fba5b2da8270bdbb04094d7a2c37faaa4b24af3aa16aff8c374c2a55c467a50da6d466b74"
    assert launch_digest(ovmf, ovmf_hash=pre, **common) == by_file


def test_a_qemu_guest_needs_a_vcpu_signature(measure_vectors: Path) -> None:
    ovmf = measure_vectors / "ovmf_AmdSev_suffix.bin"
    with pytest.raises(MeasureError, match="needs its vCPU signature"):
        launch_digest(ovmf, vcpus=1)
    # GCE and EC2 set the vCPU state themselves: no signature needed (upstream's gce cases)
    assert len(launch_digest(ovmf, vcpus=1, vmm_type="gce")) == 96


def test_vcpu_signature_forms_agree() -> None:
    # EPYC-v4 is family 23 (0x17), model 1, stepping 2: 0x800f12
    assert vcpu_signature(vcpu_type="EPYC-v4") == 0x800F12
    assert vcpu_signature(vcpu_family=23, vcpu_model=1, vcpu_stepping=2) == 0x800F12
    assert vcpu_signature(vcpu_type="EPYC-v4", vcpu_sig=0x800F12) == 0x800F12
    assert vcpu_signature() is None
    with pytest.raises(MeasureError, match="disagree"):
        vcpu_signature(vcpu_type="EPYC-Milan", vcpu_sig=0x800F12)
    with pytest.raises(MeasureError, match="vcpu_type 'EPYC-v99' is unknown"):
        vcpu_signature(vcpu_type="EPYC-v99")
    with pytest.raises(MeasureError, match="go together"):
        vcpu_signature(vcpu_family=25)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        (dict(mode="snp2"), "mode 'snp2'"),
        (dict(vmm_type="xen"), "vmm_type 'xen'"),
        (dict(vcpus=0, vcpu_type="EPYC-v4"), "vcpus"),
        (dict(vcpus=1, vcpu_type="EPYC-v4", append="console=ttyS0"), "kernel is missing"),
        (dict(vcpus=1, vcpu_type="EPYC-v4", ovmf_hash="00"), "ovmf_hash"),
        (dict(mode="sev", ovmf_hash="00" * 48), "ovmf_hash is for mode 'snp'"),
        (dict(vcpus=1, vcpu_type="EPYC-v4", kernel="/nonexistent/vmlinuz"), "kernel"),
        (dict(vcpus=1, vcpu_type="EPYC-v4", guest_features=-1), "guest_features"),
    ],
)
def test_bad_inputs_name_themselves(kwargs: dict[str, Any], named: str, tmp_path: Path) -> None:
    ovmf = tmp_path / "OVMF.fd"
    ovmf.write_bytes(bytes(4096))
    with pytest.raises(MeasureError, match=named):
        launch_digest(ovmf, **kwargs)


def test_missing_and_unreadable_firmware(tmp_path: Path) -> None:
    with pytest.raises(MeasureError, match=r"ovmf .*is not a file"):
        launch_digest(tmp_path / "absent.fd", vcpus=1, vcpu_type="EPYC-v4")
    short = tmp_path / "short.fd"
    short.write_bytes(b"\x00" * 16)  # too short even for the footer table
    with pytest.raises(MeasureError, match=r"ovmf .*short\.fd"):
        launch_digest(short, vcpus=1, vcpu_type="EPYC-v4")
    blank = tmp_path / "blank.fd"
    blank.write_bytes(bytes(4096))  # no footer table: no SEV-ES reset block
    with pytest.raises(MeasureError, match=r"ovmf .*blank\.fd"):
        launch_digest(blank, vcpus=1, vcpu_type="EPYC-v4")
