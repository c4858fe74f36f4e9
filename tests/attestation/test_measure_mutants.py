"""The launch digest's input checks, each at its edge and word for word (``attestation.measure``).

Why: ``test_measure.py`` runs sev-snp-measure's own cases and matches a word of each refusal,
so the bounds (a 32-bit signature, family 0x10E, a 64-bit feature word, 96 hex digits) and the
exact messages went unchecked. The firmware is the public vectors' OVMF tail where a digest
is computed; a blank file where the check comes first.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from sevsnpmeasure import vcpu_types  # type: ignore[import-untyped]

from attestation.measure import MeasureError, launch_digest, vcpu_signature

MEASURE = (
    Path(__file__).resolve().parents[2].parent
    / "shared"
    / "vectors"
    / "attestation"
    / "measurement"
    / "sev-snp-measure"
)
EPYC_V4 = 0x800F12  # family 23, model 1, stepping 2
HASH = "086e2e9149ebf45abdc3445fba5b2da8270bdbb04094d7a2c37faaa4b24af3aa16aff8c374c2a55c467a50da6d466b74"


def _refused(**kwargs: Any) -> str:
    with pytest.raises(MeasureError) as raised:
        vcpu_signature(**kwargs)
    return str(raised.value)


def test_an_unknown_vcpu_type_lists_the_known_ones() -> None:
    known = ", ".join(sorted(vcpu_types.CPU_SIGS))
    assert "EPYC-v4" in known
    assert _refused(vcpu_type="EPYC-v99") == (
        f"vcpu_type 'EPYC-v99' is unknown; known types: {known}"
    )


@pytest.mark.parametrize("sig", [0, 1, 0xFFFFFFFF])
def test_every_32_bit_signature_is_one(sig: int) -> None:
    assert vcpu_signature(vcpu_sig=sig) == sig


@pytest.mark.parametrize(("sig", "shown"), [(-1, "-0x1"), (1 << 32, "0x100000000")])
def test_a_signature_past_32_bits_is_refused(sig: int, shown: str) -> None:
    assert _refused(vcpu_sig=sig) == f"vcpu_sig {shown} is not a 32-bit CPUID signature"


@pytest.mark.parametrize(
    "given",
    [
        {"vcpu_family": 23},
        {"vcpu_model": 1},
        {"vcpu_stepping": 2},
        {"vcpu_family": 23, "vcpu_model": 1},
        {"vcpu_family": 23, "vcpu_stepping": 2},
        {"vcpu_model": 1, "vcpu_stepping": 2},
        {"vcpu_family": 0, "vcpu_model": 0},
    ],
)
def test_family_model_and_stepping_go_together(given: dict[str, int]) -> None:
    assert _refused(**given) == "vcpu_family, vcpu_model and vcpu_stepping go together"


@pytest.mark.parametrize(
    "fms", [(0, 0, 0), (0x10E, 0, 0), (0, 0xFF, 0), (0, 0, 0xF), (25, 1, 1), (0x10E, 0xFF, 0xF)]
)
def test_family_model_and_stepping_at_their_edges(fms: tuple[int, int, int]) -> None:
    family, model, stepping = fms
    got = vcpu_signature(vcpu_family=family, vcpu_model=model, vcpu_stepping=stepping)
    assert got == vcpu_types.cpu_sig(family, model, stepping)


@pytest.mark.parametrize(
    "fms", [(0x10F, 0, 0), (0, 0x100, 0), (0, 0, 0x10), (-1, 0, 0), (0, -1, 0), (0, 0, -1)]
)
def test_family_model_and_stepping_out_of_range(fms: tuple[int, int, int]) -> None:
    family, model, stepping = fms
    assert _refused(vcpu_family=family, vcpu_model=model, vcpu_stepping=stepping) == (
        f"vcpu family/model/stepping {family}/{model}/{stepping} is out of range"
    )


def test_forms_given_together_agree_or_are_named() -> None:
    both = {"vcpu_family": 23, "vcpu_model": 1, "vcpu_stepping": 2}
    assert vcpu_signature(vcpu_type="EPYC-v4", vcpu_sig=EPYC_V4, **both) == EPYC_V4
    milan = vcpu_types.CPU_SIGS["EPYC-Milan"]
    assert _refused(vcpu_type="EPYC-Milan", vcpu_sig=EPYC_V4, **both) == (
        "the vCPU signatures given disagree: "
        f"vcpu_type → {milan:#x}, vcpu_sig → 0x800f12, vcpu_family/model/stepping → 0x800f12"
    )
    assert _refused(vcpu_sig=EPYC_V4, vcpu_family=25, vcpu_model=1, vcpu_stepping=1) == (
        "the vCPU signatures given disagree: vcpu_sig → 0x800f12, "
        f"vcpu_family/model/stepping → {vcpu_types.cpu_sig(25, 1, 1):#x}"
    )
    assert vcpu_signature() is None


# --------------------------------------------------------------------------- launch_digest


@pytest.fixture
def blank(tmp_path: Path) -> Path:
    ovmf = tmp_path / "OVMF.fd"
    ovmf.write_bytes(bytes(4096))
    return ovmf


def _digest_refused(ovmf: Path, **kwargs: Any) -> str:
    with pytest.raises(MeasureError) as raised:
        launch_digest(ovmf, **kwargs)
    return str(raised.value)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"mode": "snp2"}, "mode 'snp2' is not one of snp, seves, sev"),
        ({"vmm_type": "xen"}, "vmm_type 'xen' is not one of QEMU, ec2, gce"),
        (
            {"vcpus": 1, "append": "console=ttyS0"},
            "initrd and append are measured only with a kernel: kernel is missing",
        ),
        ({"vcpus": 0}, "vcpus must be a positive count in mode 'snp', got 0"),
        ({"vcpus": None}, "vcpus must be a positive count in mode 'snp', got None"),
        ({"mode": "seves", "vcpus": -1}, "vcpus must be a positive count in mode 'seves', got -1"),
        ({"vcpus": 1, "guest_features": -1}, "guest_features -0x1 is not a 64-bit value"),
        (
            {"vcpus": 1, "guest_features": 1 << 64},
            "guest_features 0x10000000000000000 is not a 64-bit value",
        ),
        (
            {"mode": "seves", "vcpus": 1, "ovmf_hash": HASH},
            "ovmf_hash is for mode 'snp' only, not 'seves'",
        ),
        ({"mode": "sev", "ovmf_hash": HASH}, "ovmf_hash is for mode 'snp' only, not 'sev'"),
        (
            {"vcpus": 1, "ovmf_hash": HASH[:-1]},
            "ovmf_hash must be 96 hex digits (a SHA-384 digest)",
        ),
        (
            {"vcpus": 1, "ovmf_hash": HASH + "0"},
            "ovmf_hash must be 96 hex digits (a SHA-384 digest)",
        ),
        (
            {"vcpus": 1, "ovmf_hash": HASH[:-1] + "g"},
            "ovmf_hash must be 96 hex digits (a SHA-384 digest)",
        ),
        ({"vcpus": 1, "vcpu_sig": 1 << 32}, "vcpu_sig 0x100000000 is not a 32-bit CPUID signature"),
    ],
)
def test_each_refused_input_word_for_word(
    blank: Path, kwargs: dict[str, Any], problem: str
) -> None:
    assert _digest_refused(blank, **kwargs) == problem


def test_an_input_file_that_is_not_there_is_named(blank: Path, tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    assert _digest_refused(absent, vcpus=1) == f"ovmf {absent} is not a file"
    assert _digest_refused(blank, vcpus=1, kernel=absent) == f"kernel {absent} is not a file"
    assert _digest_refused(blank, vcpus=1, kernel=blank, initrd=tmp_path) == (
        f"initrd {tmp_path} is not a file"
    )
    assert _digest_refused(blank, vcpus=1, initrd=blank) == (
        "initrd and append are measured only with a kernel: kernel is missing"
    )


@pytest.fixture(scope="module")
def ovmf() -> Path:
    if not (MEASURE / "expected.json").is_file():
        reason = f"{MEASURE} is absent: the public measurement vectors live in ../shared/vectors"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return MEASURE / "ovmf_AmdSev_suffix.bin"


def test_the_edges_that_are_still_measured(ovmf: Path, tmp_path: Path) -> None:
    """A 64-bit feature word at its top, hex in upper case, an empty ``append`` without a
    kernel, SEV with no vCPU count: each is measured (96 or 64 hex digits), not refused."""
    common: dict[str, Any] = {"vcpus": 1, "vcpu_type": "EPYC-v4"}
    assert len(launch_digest(ovmf, guest_features=(1 << 64) - 1, **common)) == 96
    assert launch_digest(ovmf, ovmf_hash=HASH.upper(), **common) == launch_digest(
        ovmf, ovmf_hash=HASH, **common
    )
    assert launch_digest(ovmf, append="", **common) == launch_digest(ovmf, **common)
    sev = launch_digest(ovmf, mode="sev")
    assert len(sev) == 64
    assert launch_digest(ovmf, mode="sev", vcpus=4, vcpu_type="EPYC-Milan") == sev
    assert launch_digest(str(ovmf), vcpus=2, vcpu_sig=EPYC_V4) == launch_digest(
        ovmf, vcpus=2, vcpu_family=23, vcpu_model=1, vcpu_stepping=2
    )


def test_a_qemu_guest_without_a_signature_is_named_after_the_firmware_errors(
    ovmf: Path, blank: Path
) -> None:
    for mode in ("snp", "seves"):
        assert _digest_refused(ovmf, mode=mode, vcpus=1) == (
            f"a QEMU guest in mode {mode!r} needs its vCPU signature: "
            "vcpu_type, vcpu_sig or vcpu_family/vcpu_model/vcpu_stepping"
        )
    # the firmware's own fault is reported first, though the signature is missing too
    assert _digest_refused(blank, vcpus=1).startswith(f"ovmf {blank}: cannot be measured: ")
    assert len(launch_digest(ovmf, vcpus=1, vmm_type="ec2")) == 96


def test_a_kernel_the_firmware_cannot_measure(tmp_path: Path) -> None:
    if not (MEASURE / "ovmf_OvmfX64_suffix.bin").is_file():
        pytest.skip(f"{MEASURE} is absent")
    ovmf = MEASURE / "ovmf_OvmfX64_suffix.bin"
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"")
    problem = _digest_refused(ovmf, vcpus=1, vcpu_type="EPYC-v4", kernel=kernel)
    assert problem.startswith(f"kernel given, but the firmware {ovmf} cannot measure it: ")
    assert "Kernel specified" in problem


def test_what_each_input_adds_to_the_digest(ovmf: Path, tmp_path: Path) -> None:
    """The defaults are what they say (SEV_FEATURES 0x1, any feature word from 0 is measured),
    a precomputed OVMF digest replaces the file's, and an initrd's bytes are measured."""
    common: dict[str, Any] = {"vcpus": 1, "vcpu_type": "EPYC-v4"}
    default = launch_digest(ovmf, **common)
    assert default == launch_digest(ovmf, guest_features=0x1, **common)
    assert launch_digest(ovmf, guest_features=0, **common) not in (default, "")
    assert launch_digest(ovmf, ovmf_hash="00" * 48, **common) != default
    kernel, initrd, empty = tmp_path / "vmlinuz", tmp_path / "initrd", tmp_path / "empty"
    kernel.write_bytes(b"kernel")
    initrd.write_bytes(b"initrd")
    empty.write_bytes(b"")
    with_initrd = launch_digest(ovmf, kernel=kernel, initrd=initrd, **common)
    assert with_initrd != launch_digest(ovmf, kernel=kernel, initrd=empty, **common)
    assert with_initrd != launch_digest(ovmf, kernel=kernel, **common)


def test_a_library_error_without_a_message_is_named_by_its_type(ovmf: Path, tmp_path: Path) -> None:
    """sev-snp-measure asserts a firmware is whole 4 KiB pages, with no message: its class is
    the message then."""
    odd = tmp_path / "odd.fd"
    odd.write_bytes(bytes(16) + ovmf.read_bytes())
    assert _digest_refused(odd, vcpus=1, vcpu_type="EPYC-v4") == (
        f"ovmf {odd}: cannot be measured: AssertionError"
    )


def test_without_sev_snp_measure_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, blank: Path
) -> None:
    monkeypatch.setitem(sys.modules, "sevsnpmeasure", None)  # what an import then raises
    problem = _digest_refused(blank, vcpus=1)
    assert problem.startswith("sev-snp-measure is not installed (")
    assert problem.endswith("): pip install 'sev-snp-measure>=0.0.13'")
