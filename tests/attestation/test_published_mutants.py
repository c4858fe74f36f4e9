"""Published measurements, every path word for word (``attestation.published``).

Why: the CLI and binding tests load one good release file and compare one measurement, so
the release key's strict reading, each refusal of a published file and each ``published.*``
detail (the launch that matched, TDX's RTMRs, the GPU's versions, the guest policy) went
unchecked. Real Ed25519 keys and signatures, files in a temporary folder.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from attestation.published import (
    FORMAT,
    Published,
    PublishedError,
    SignatureMismatch,
    check_published,
    load_published,
    read_public_key,
    sign_published,
)
from attestation.verdict import Check, Verdict

KEY = Ed25519PrivateKey.generate()
M1, M2, M3 = "a1" * 48, "b2" * 48, "c3" * 48


def _doc(**change: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": "1.2.3",
        "image_digest": "sha256:" + "0" * 64,
        "model_weights_digest": "sha256:" + "1" * 64,
        "kernel_cmdline": "console=ttyS0",
        "snp": [
            {"vcpus": 2, "vcpu_type": "EPYC-v4", "measurement": M1},
            {"vcpus": 4, "vcpu_type": "EPYC-Milan", "measurement": M2},
        ],
    }
    doc.update(change)
    return doc


def _write(folder: Path, doc: dict[str, Any] | bytes, name: str = "1.2.3.json") -> Path:
    path = folder / name
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    path.write_bytes(data)
    (folder / (name + ".sig")).write_text(sign_published(data, KEY))
    return path


def _raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def test_the_release_key_is_read_strictly(tmp_path: Path) -> None:
    path = tmp_path / "release.pub"
    text = base64.b64encode(_raw_public(KEY)).decode()
    path.write_text(f"  {text}\n")
    assert read_public_key(path).public_bytes(Encoding.Raw, PublicFormat.Raw) == _raw_public(KEY)
    path.write_text(text[:10] + "!" + text[10:])  # not base64: never skipped over
    with pytest.raises(PublishedError) as raised:
        read_public_key(path)
    assert str(raised.value).startswith(f"release key {path}: not a base64 Ed25519 public key (")
    path.write_text(base64.b64encode(b"\x01" * 31).decode())
    with pytest.raises(PublishedError, match=r"not a base64 Ed25519 public key \(.+\)$"):
        read_public_key(path)
    with pytest.raises(PublishedError, match="not a base64 Ed25519 public key"):
        read_public_key(tmp_path / "absent.pub")


def test_the_signature_line_is_base64_of_the_signature_and_a_newline() -> None:
    line = sign_published(b"data", KEY)
    assert line.endswith("\n") and line.count("\n") == 1
    assert line == base64.b64encode(KEY.sign(b"data")).decode("ascii") + "\n"
    KEY.public_key().verify(base64.b64decode(line, validate=False), b"data")


def test_a_signed_file_loads_from_beside_it_or_from_the_signature_named(tmp_path: Path) -> None:
    path = _write(tmp_path, _doc())
    loaded = load_published(path, KEY.public_key())
    assert loaded == Published.model_validate(_doc())
    elsewhere = tmp_path / "sig.txt"
    (tmp_path / "1.2.3.json.sig").rename(elsewhere)
    assert load_published(str(path), KEY.public_key(), str(elsewhere)) == loaded
    with pytest.raises(PublishedError) as raised:
        load_published(path, KEY.public_key())
    assert str(raised.value).startswith(f"published {path}: ")
    assert "1.2.3.json.sig" in str(raised.value)


def test_a_signature_that_is_not_strict_base64_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, _doc())
    sig = tmp_path / "1.2.3.json.sig"
    text = sig.read_text().strip()
    sig.write_text(text[:8] + "*" + text[8:] + "\n")
    with pytest.raises(PublishedError) as raised:
        load_published(path, KEY.public_key())
    assert str(raised.value).startswith(f"published {path}: ")
    assert not isinstance(raised.value, SignatureMismatch)


def test_a_signature_by_another_key_is_a_mismatch_word_for_word(tmp_path: Path) -> None:
    path = _write(tmp_path, _doc())
    with pytest.raises(SignatureMismatch) as raised:
        load_published(path, Ed25519PrivateKey.generate().public_key())
    assert str(raised.value) == (
        f"published {path}: the signature {tmp_path / '1.2.3.json.sig'} does not verify"
        " with the release key"
    )


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        (_doc(snp=[{"vcpus": 0, "vcpu_type": "x", "measurement": M1}]), "snp.0.vcpus: "),
        (_doc(format="affidavit-measurements/2"), "format: "),
        (b"[1, 2]", "(the file): "),
        (b"not json", "(the file): "),
    ],
)
def test_a_file_that_does_not_validate_names_the_member(
    tmp_path: Path, doc: dict[str, Any] | bytes, where: str
) -> None:
    path = _write(tmp_path, doc)
    with pytest.raises(PublishedError) as raised:
        load_published(path, KEY.public_key())
    message = str(raised.value)
    assert message.startswith(f"published {path}: {where}")
    assert len(message) > len(f"published {path}: {where}")


def _checks(verdict: Verdict) -> list[Check]:
    return verdict.checks


def test_an_snp_measurement_names_the_launch_it_matches() -> None:
    published = Published.model_validate(_doc())
    verdict = check_published(Verdict("snp", facts={"measurement": M2}), published)
    assert _checks(verdict) == [
        Check("published.snp", True, "measurement matches 1.2.3 (4 × EPYC-Milan)")
    ]
    verdict = check_published(Verdict("snp", facts={"measurement": M3}), published)
    assert _checks(verdict) == [
        Check("published.snp", False, f"measurement {M3} is not one 1.2.3 publishes")
    ]


@pytest.mark.parametrize(
    ("reported", "check"),
    [
        (
            "0x30000",
            Check(
                "published.guest_policy", True, "guest policy 0x30000 is the one 1.2.3 publishes"
            ),
        ),
        (
            "30000",
            Check(
                "published.guest_policy", True, "guest policy 0x30000 is the one 1.2.3 publishes"
            ),
        ),
        (
            "0x30001",
            Check("published.guest_policy", False, "guest policy 0x30001, 1.2.3 publishes 0x30000"),
        ),
        (
            "0x0",
            Check("published.guest_policy", False, "guest policy 0x0, 1.2.3 publishes 0x30000"),
        ),
        ("zz", Check("published.guest_policy", False, "the report's policy 'zz' is not read")),
        (None, Check("published.guest_policy", False, "the report's policy None is not read")),
    ],
)
def test_the_guest_policy_is_exactly_the_published_one(reported: str | None, check: Check) -> None:
    published = Published.model_validate(_doc(guest_policy="0x30000"))
    facts: dict[str, Any] = {"measurement": M1}
    if reported is not None:
        facts["policy"] = reported
    verdict = check_published(Verdict("snp", facts=facts), published)
    assert _checks(verdict) == [
        Check("published.snp", True, "measurement matches 1.2.3 (2 × EPYC-v4)"),
        check,
    ]


def test_a_zero_guest_policy_is_held_to_as_well() -> None:
    published = Published.model_validate(_doc(guest_policy="0x0"))
    verdict = check_published(Verdict("snp", facts={"measurement": M1, "policy": "0x1"}), published)
    assert _checks(verdict)[1] == Check(
        "published.guest_policy", False, "guest policy 0x1, 1.2.3 publishes 0x0"
    )


TDX = [
    {"mrtd": M1, "rtmr0": M2, "rtmr1": None, "rtmr2": None},
    {"mrtd": M2, "rtmr0": M1, "rtmr1": M2, "rtmr2": M3},
]


@pytest.mark.parametrize(
    ("facts", "ok"),
    [
        ({"mrtd": M1, "rtmr0": M2, "rtmr1": M3, "rtmr2": M3}, True),  # RTMRs 1, 2 unpublished
        ({"mrtd": M1, "rtmr0": M3}, False),
        ({"mrtd": M2, "rtmr0": M1, "rtmr1": M2, "rtmr2": M3}, True),
        ({"mrtd": M2, "rtmr0": M1, "rtmr1": M2, "rtmr2": M1}, False),
        ({"mrtd": M2, "rtmr0": M1, "rtmr1": M3, "rtmr2": M3}, False),
        ({"mrtd": M3, "rtmr0": M2}, False),
    ],
)
def test_a_tdx_launch_matches_its_mrtd_and_each_published_rtmr(
    facts: dict[str, str], ok: bool
) -> None:
    published = Published.model_validate(_doc(tdx=TDX, guest_policy="0x1"))
    verdict = check_published(Verdict("tdx", facts=facts), published)
    detail = (
        "MRTD and RTMRs match 1.2.3"
        if ok
        else f"MRTD {facts['mrtd']} (with its RTMRs) is not one 1.2.3 publishes"
    )
    assert _checks(verdict) == [Check("published.tdx", ok, detail)]


@pytest.mark.parametrize(
    ("gpu", "driver", "vbios", "ok"),
    [
        ({}, "1", "2", True),
        ({"driver_versions": ["1", "3"]}, "3", "2", True),
        ({"driver_versions": ["1"]}, "3", "2", False),
        ({"vbios_versions": ["2"]}, "1", "2", True),
        ({"vbios_versions": ["2"]}, "1", "4", False),
        ({"driver_versions": ["1"], "vbios_versions": ["2"]}, "1", "2", True),
        ({"driver_versions": ["1"], "vbios_versions": ["2"]}, "1", "4", False),
        ({"driver_versions": ["1"], "vbios_versions": ["2"]}, "3", "2", False),
    ],
)
def test_the_gpu_versions(gpu: dict[str, list[str]], driver: str, vbios: str, ok: bool) -> None:
    published = Published.model_validate(_doc(gpu=gpu))
    facts = {"driver_version": driver, "vbios_version": vbios}
    verdict = check_published(Verdict("nvidia", facts=facts), published)
    word = "published" if ok else "not published"
    assert _checks(verdict) == [
        Check("published.nvidia", ok, f"driver {driver}, VBIOS {vbios}: {word}")
    ]


def test_a_release_without_gpu_state_checks_nothing_of_the_gpu() -> None:
    published = Published.model_validate(_doc())
    verdict = check_published(Verdict("nvidia", facts={"driver_version": "1"}), published)
    assert _checks(verdict) == [Check("published.nvidia", None, "1.2.3 publishes no GPU state")]
