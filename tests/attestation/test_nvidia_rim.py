"""NVIDIA RIMs: NVIDIA's own signed sample RIMs, checked and compared offline.

The RIMs are the real ones NVIDIA ships in ``nv-local-gpu-verifier`` (``verifier/samples``).
The wheel is fetched at test time with ``pip download --no-deps --require-hashes`` (version and
SHA-256 pinned below), cached under ``.affidavit/test-cache/``, and read in place with
``zipfile``: it is never installed (it hard-pins an old ``cryptography``, and its support
ends in 2026-09) and nothing is extracted. Without a network the tests skip, saying why; in CI
(``CI=true``) they fail instead.

The RIMs' signing certificates expired in 2025 (the leaf on 2025-08-24 at the latest), so
every check runs at a pinned verification time, 2025-06-01.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding

from affidavit.cli import main
from attestation.certs import load_certs, spki_sha256
from attestation.nvidia import format_vbios_version, parse_nvidia_evidence, verify_nvidia
from attestation.nvidia_rim import (
    NVIDIA_RIM_ROOT_SPKI_SHA256,
    Rim,
    RimError,
    check_rims,
    parse_rim,
    verify_rim_signature,
)
from attestation.verdict import Verdict
from tests.attestation.test_nvidia import FWID, _ca, _evidence, _leaf, _tlv
from tests.conftest import in_ci

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT.parent / "shared" / "vectors" / "attestation" / "nvidia-h100" / "nvtrust"
PACKAGE, VERSION = "nv-local-gpu-verifier", "2.7.3"
WHEEL = "nv_local_gpu_verifier-2.7.3-py3-none-any.whl"
#: SHA-256 of the wheel on PyPI (looked up with ``pip download`` on 2026-12-02).
WHEEL_SHA256 = "27259ce3d828ca102db17f4b70c7b85c1882a55f99153eb706fcb1866db0fe7a"
CACHE = ROOT / ".affidavit" / "test-cache" / PACKAGE / WHEEL_SHA256
#: Inside every sample RIM chain's validity; the leaves expire from 2025-06-26 on.
AT = datetime(2025, 6, 1, tzinfo=UTC)
DRIVER = "verifier/samples/Driver_RIM_test_no_gpu.swidtag"  # driver 545.00
VBIOS = "verifier/samples/1010_0200_882_96005E0001_PROD.swidtag"  # nv-01's board, VBIOS 96.00.5E
NV01_NONCE = bytes.fromhex("931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb")
#: nv-01 (driver 550.90.07, VBIOS 96.00.9F.00.01) against the 545.00 driver RIM and the VBIOS
#: RIM above: the RIM indexes (SPDM block - 1) whose values differ.
NV01_DRIVER_DIFFER = "7, 21, 22, 25, 26, 27, 29, 30, 31, 32, 34, 36, 37, 39, 40"
NV01_VBIOS_DIFFER = "1, 2, 9, 11"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the RIM tests must run)")
    print(f"SKIP: {reason}")
    pytest.skip(reason)


def _download() -> Path:
    """The pinned wheel, from the cache or fetched once with pip (hash-checked both ways)."""
    wheel = CACHE / WHEEL
    if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
        return wheel
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--require-hashes", "--disable-pip-version-check", "--quiet",
            "-r", str(requirements), "-d", str(Path(tmp) / "out"),
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            _unavailable(f"pip download {PACKAGE}=={VERSION} took over 300 s (no network?)")
        fetched = Path(tmp) / "out" / WHEEL
        if done.returncode != 0 or not fetched.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            _unavailable(
                f"pip download {PACKAGE}=={VERSION} (hash-pinned) failed, rc "
                f"{done.returncode}: {tail[0]} (no network?); the sample RIMs come from it"
            )
        assert _sha256(fetched) == WHEEL_SHA256  # pip checked it too (--require-hashes)
        CACHE.mkdir(parents=True, exist_ok=True)
        os.replace(fetched, wheel)
    return wheel


@pytest.fixture(scope="session")
def nvtrust() -> dict[str, bytes]:
    """The wheel's samples and certificates by member name, read without extracting."""
    with zipfile.ZipFile(_download()) as wheel:
        wanted = [
            info
            for info in wheel.infolist()
            if info.filename.startswith(("verifier/samples/", "verifier/certs/"))
            and not info.is_dir()
        ]
        for info in wanted:  # read in memory only, but refuse what an extraction would fear
            assert ".." not in info.filename.split("/") and info.file_size < 1 << 20
        return {info.filename: wheel.read(info) for info in wanted}


@pytest.fixture(scope="session")
def nv01() -> tuple[bytes, bytes]:
    if not VECTORS.is_dir():
        reason = f"{VECTORS} is absent: the public attestation vectors live in ../shared/vectors"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    evidence = (VECTORS / "hopperAttestationReport.hex").read_bytes()
    return evidence, (VECTORS / "hopperCertChain.pem").read_bytes()


def _rim(files: dict[str, bytes], name: str) -> Rim:
    return parse_rim(files[name], name.rsplit("/", 1)[-1])


def _check(verdict: Verdict, name: str) -> tuple[bool | None, str]:
    found = next(c for c in verdict.checks if c.name == name)
    return found.ok, found.detail


# --------------------------------------------------------------------------- signatures


def test_every_sample_rim_signature_verifies_at_the_pinned_time(nvtrust: dict[str, bytes]) -> None:
    names = sorted(n for n in nvtrust if n.endswith(".swidtag"))
    assert len(names) >= 20 and DRIVER in names and VBIOS in names
    kinds = set()
    for name in names:
        rim = _rim(nvtrust, name)
        result = verify_rim_signature(rim, AT)
        assert result.ok, result.detail
        assert (
            "NVIDIA CoRIM signing Root CA (the pinned NVIDIA CoRIM signing root)" in result.detail
        )
        assert result.signed is not None and result.signed.active == rim.active
        kinds.add(rim.kind)
    assert kinds == {"driver", "vbios"}
    driver = _rim(nvtrust, DRIVER)
    assert (driver.kind, driver.version, driver.product) == ("driver", "545.00", "GH100")
    assert len(driver.active) == 21 and len(driver.measurements) == 64
    assert len(driver.active[23].alternatives) == 2  # an index with two accepted values


def test_the_pinned_rim_root_is_the_one_nvidia_ships(nvtrust: dict[str, bytes]) -> None:
    shipped = x509.load_pem_x509_certificate(nvtrust["verifier/certs/verifier_RIM_root.pem"])
    assert spki_sha256(shipped) == NVIDIA_RIM_ROOT_SPKI_SHA256
    assert shipped.subject.rfc4514_string() == "CN=NVIDIA CoRIM signing Root CA,O=NVIDIA,C=US"
    embedded = _rim(nvtrust, DRIVER).certificates[-1]
    assert embedded.public_bytes(Encoding.DER) == shipped.public_bytes(Encoding.DER)
    if VECTORS.is_dir():  # the same file, as the vectors folder keeps it
        kept = (VECTORS / "verifier_RIM_root.pem").read_bytes()
        assert kept == nvtrust["verifier/certs/verifier_RIM_root.pem"]


def test_one_byte_changed_in_a_reference_value_fails_the_signature(
    nvtrust: dict[str, bytes],
) -> None:
    raw = nvtrust[DRIVER]
    value = _rim(nvtrust, DRIVER).active[7].alternatives[0].hex()
    assert raw.count(value.encode()) == 1
    at = raw.index(value.encode())
    tampered = raw[:at] + (b"1" if raw[at : at + 1] != b"1" else b"2") + raw[at + 1 :]
    rim = parse_rim(tampered, "tampered.swidtag")
    assert rim.active[7].alternatives[0] != bytes.fromhex(value)  # the parse sees the change
    result = verify_rim_signature(rim, AT)
    assert not result.ok and result.signed is None
    assert result.detail.startswith("tampered.swidtag (driver 545.00): the XML-DSig signature")
    assert "does not verify" in result.detail and "Digest mismatch" in result.detail


def test_a_forged_version_or_a_removed_signature_fails(nvtrust: dict[str, bytes]) -> None:
    raw = nvtrust[DRIVER]
    forged = raw.replace(b'colloquialVersion="545.00"', b'colloquialVersion="550.90.07"')
    assert forged != raw
    result = verify_rim_signature(parse_rim(forged, "forged.swidtag"), AT)
    assert not result.ok and "Digest mismatch" in result.detail
    start, end = raw.index(b"<ds:Signature"), raw.index(b"</ds:Signature>") + 15
    bare = verify_rim_signature(parse_rim(raw[:start] + raw[end:], "bare.swidtag"), AT)
    assert not bare.ok and "KeyInfo carries no X509Certificate" in bare.detail


def test_an_expired_signing_certificate_fails_and_is_named(nvtrust: dict[str, bytes]) -> None:
    result = verify_rim_signature(_rim(nvtrust, DRIVER), datetime(2026, 1, 1, tzinfo=UTC))
    assert not result.ok
    assert "not valid at 2026-01-01T00:00:00Z: HCC RIM L4 Signer (valid 2023-06-27" in (
        result.detail
    )
    with pytest.raises(ValueError, match="time zone"):
        verify_rim_signature(_rim(nvtrust, DRIVER), datetime(2025, 6, 1))


# --------------------------------------------------------------------------- comparing


def test_nv01_against_the_545_rims_fails_naming_the_differing_indexes(
    nvtrust: dict[str, bytes], nv01: tuple[bytes, bytes]
) -> None:
    rims = [_rim(nvtrust, DRIVER), _rim(nvtrust, VBIOS)]
    verdict = verify_nvidia(*nv01, now=AT, nonce=NV01_NONCE, rims=rims)
    assert {c.name for c in verdict.failed} == {"rim.driver", "rim.vbios"}
    assert _check(verdict, "rim.signature")[0] is True
    assert _check(verdict, "rim.indexes") == (
        True,
        "the driver and VBIOS RIMs measure disjoint indexes",
    )
    driver = _check(verdict, "rim.driver")[1]
    assert driver.startswith(
        "Driver_RIM_test_no_gpu.swidtag: driver 545.00, but the evidence reports 550.90.07; "
        f"15 of 20 active indexes differ: {NV01_DRIVER_DIFFER} "
    )
    assert "index 35 not compared: the GPU reports NVDEC0 disabled" in driver
    vbios = _check(verdict, "rim.vbios")[1]
    assert vbios == (
        "1010_0200_882_96005E0001_PROD.swidtag: vbios 96.00.5E.00.01, but the evidence reports "
        f"96.00.9F.00.01; 4 of 12 active indexes differ: {NV01_VBIOS_DIFFER} "
        "(RIM index i is SPDM block i + 1)"
    )
    mismatches = verdict.facts["rim_mismatches"]
    assert list(mismatches["vbios"]) == NV01_VBIOS_DIFFER.split(", ")
    assert mismatches["driver"]["7"]["rim"] == [
        _rim(nvtrust, DRIVER).active[7].alternatives[0].hex()
    ]
    ocsp = _check(verdict, "ocsp")
    assert ocsp[0] is None  # still not checked offline


def test_the_packages_sample_report_is_nv01_and_matches_none_of_its_rims(
    nvtrust: dict[str, bytes], nv01: tuple[bytes, bytes]
) -> None:
    """NVIDIA's sample report is the nv-01 vector itself (driver 550.90.07), while the sample
    RIMs describe driver 545.00 and other VBIOS builds: it matches none of them."""
    sample = nvtrust["verifier/samples/hopperAttestationReport.txt"]
    assert sample == nv01[0]
    assert nvtrust["verifier/samples/hopperCertChain.txt"] == nv01[1]
    for name in sorted(n for n in nvtrust if n.endswith(".swidtag")):
        verdict = verify_nvidia(*nv01, now=AT, nonce=NV01_NONCE, rims=[_rim(nvtrust, name)])
        kind = _rim(nvtrust, name).kind
        assert _check(verdict, "rim.signature")[0] is True
        assert _check(verdict, f"rim.{kind}")[0] is False, name
        assert "active indexes differ" in _check(verdict, f"rim.{kind}")[1]


def _matching_evidence(
    key: ec.EllipticCurvePrivateKey,
    driver: Rim,
    vbios: Rim,
    *,
    alternative: int = 0,
    changed: dict[int, bytes] | None = None,
    nvdec0: bytes = b"\xaa",
) -> bytes:
    """Evidence whose blocks hold the RIMs' values (SPDM block = RIM index + 1), but for
    ``changed`` (by block), with the RIMs' versions and the given NVDEC0 status."""
    active = [*driver.active.items(), *vbios.active.items()]
    values = {i + 1: m.alternatives[min(alternative, len(m.alternatives) - 1)] for i, m in active}
    values.update(changed or {})
    vbios_field = bytes([0x00, 0x5E, 0x00, 0x96, 0x01, 0, 0, 0])
    assert format_vbios_version(vbios_field) == vbios.version
    opaque = (
        _tlv(6, vbios_field)
        + _tlv(3, driver.version.encode() + b"\x00")
        + _tlv(11, nvdec0)
        + _tlv(20, FWID)
    )
    blocks = tuple(sorted((i, v) for i, v in values.items()))
    return _evidence(key, blocks=blocks, opaque=opaque)


@pytest.fixture(scope="module")
def generated_gpu() -> tuple[bytes, bytes, ec.EllipticCurvePrivateKey]:
    """A generated device chain (a stand-in GPU: no H100 here) and its leaf key."""
    root, root_key = _ca("Test Device Identity CA")
    leaf, key = _leaf(root, root_key)
    chain = leaf.public_bytes(Encoding.PEM) + root.public_bytes(Encoding.PEM)
    return root.public_bytes(Encoding.PEM), chain, key


def test_evidence_with_the_rims_values_is_accepted_and_one_changed_value_named(
    nvtrust: dict[str, bytes], generated_gpu: tuple[bytes, bytes, ec.EllipticCurvePrivateKey]
) -> None:
    root, chain, key = generated_gpu
    driver, vbios = _rim(nvtrust, DRIVER), _rim(nvtrust, VBIOS)
    for alternative in (0, 1):  # each listed alternative is accepted
        evidence = _matching_evidence(key, driver, vbios, alternative=alternative)
        verdict = verify_nvidia(
            evidence, chain, now=AT, nonce=bytes(range(32)), trusted_root=root, rims=[driver, vbios]
        )
        assert verdict.accepted, [c.line() for c in verdict.failed]
        assert _check(verdict, "rim.driver") == (
            True,
            "Driver_RIM_test_no_gpu.swidtag: driver 545.00; all 21 active indexes match one of "
            "their alternatives",
        )
        assert _check(verdict, "rim.vbios")[0] is True
    changed = _matching_evidence(key, driver, vbios, changed={24: b"\x02" * 48})  # RIM index 23
    verdict = verify_nvidia(
        changed, chain, now=AT, nonce=bytes(range(32)), trusted_root=root, rims=[driver, vbios]
    )
    assert [c.name for c in verdict.failed] == ["rim.driver"]
    assert "1 of 21 active indexes differ: 23 " in _check(verdict, "rim.driver")[1]
    assert verdict.facts["rim_mismatches"]["driver"]["23"]["evidence"] == "02" * 48
    only_driver = verify_nvidia(
        changed, chain, now=AT, nonce=bytes(range(32)), trusted_root=root, rims=[vbios]
    )
    assert _check(only_driver, "rim.driver")[0] is None  # no driver RIM given: not checked
    assert "no driver RIM given (--rim)" in _check(only_driver, "rim.driver")[1]
    assert only_driver.accepted


def test_index_35_is_left_out_only_when_the_gpu_reports_nvdec0_disabled(
    nvtrust: dict[str, bytes], generated_gpu: tuple[bytes, bytes, ec.EllipticCurvePrivateKey]
) -> None:
    root, chain, key = generated_gpu
    driver, vbios = _rim(nvtrust, DRIVER), _rim(nvtrust, VBIOS)
    kwargs = {"now": AT, "nonce": bytes(range(32)), "trusted_root": root, "rims": [driver, vbios]}
    wrong = b"\x01" * 48
    disabled = _matching_evidence(key, driver, vbios, changed={36: wrong}, nvdec0=b"\x55")
    assert parse_nvidia_evidence(disabled).response.opaque_value("NVDEC0_STATUS") == b"\x55"
    verdict = verify_nvidia(disabled, chain, **kwargs)  # type: ignore[arg-type]
    assert verdict.accepted, [c.line() for c in verdict.failed]
    assert "index 35 not compared" in _check(verdict, "rim.driver")[1]
    enabled = _matching_evidence(key, driver, vbios, changed={36: wrong}, nvdec0=b"\xaa")
    verdict = verify_nvidia(enabled, chain, **kwargs)  # type: ignore[arg-type]
    assert "active indexes differ: 35 " in _check(verdict, "rim.driver")[1]


def test_a_tampered_rim_is_not_compared(
    nvtrust: dict[str, bytes], nv01: tuple[bytes, bytes]
) -> None:
    raw = nvtrust[DRIVER]
    tampered = raw.replace(b'index="7" active="True"', b'index="7" active="False"')
    assert tampered != raw
    rims = [parse_rim(tampered, "tampered.swidtag")]
    verdict = verify_nvidia(*nv01, now=AT, nonce=NV01_NONCE, rims=rims)
    assert _check(verdict, "rim.signature")[0] is False
    assert _check(verdict, "rim.driver") == (
        False,
        "tampered.swidtag: not compared: its signature does not verify",
    )
    assert "rim.indexes" not in {c.name for c in verdict.checks}


# --------------------------------------------------------------------------- hostile files


def test_files_that_are_not_rims_are_refused_naming_the_file(nvtrust: dict[str, bytes]) -> None:
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
        b'<!ENTITY lol2 "&lol;&lol;&lol;&lol;">]><lolz>&lol2;</lolz>'
    )
    cases = {
        b"not xml at all": "a.swidtag: not an XML RIM",
        bomb: "a.swidtag: not an XML RIM: DTD",
        b"<other/>": "a.swidtag: the root element is other, not a SWID SoftwareIdentity",
        nvtrust[DRIVER].replace(b"ns0:Payload", b"ns0:Elsewhere"): "a.swidtag: no Payload",
        nvtrust[DRIVER].replace(b'ns2:Hash0="0e0e', b'ns2:Hash9="0e0e'): "Hash0 is missing",
        nvtrust[DRIVER].replace(b'index="8"', b'index="7"'): "index 7 appears twice",
    }
    for data, message in cases.items():
        with pytest.raises(RimError, match=message):
            parse_rim(data, "a.swidtag")


def test_two_rims_of_one_kind_are_refused(
    nvtrust: dict[str, bytes], nv01: tuple[bytes, bytes]
) -> None:
    rims = [_rim(nvtrust, DRIVER), _rim(nvtrust, DRIVER)]
    with pytest.raises(ValueError, match="two driver RIMs given"):
        verify_nvidia(*nv01, now=AT, nonce=NV01_NONCE, rims=rims)


# --------------------------------------------------------------------------- the command


def test_rim_through_the_command_with_its_exit_codes(
    nvtrust: dict[str, bytes],
    nv01: tuple[bytes, bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    driver, vbios = tmp_path / "driver.swidtag", tmp_path / "vbios.swidtag"
    driver.write_bytes(nvtrust[DRIVER])
    vbios.write_bytes(nvtrust[VBIOS])
    base = [
        "attest", "verify", "--kind", "nvidia",
        "--evidence", str(VECTORS / "hopperAttestationReport.hex"),
        "--certs", str(VECTORS / "hopperCertChain.pem"),
        "--now", "2025-06-01T00:00:00Z", "--nonce", NV01_NONCE.hex(),
    ]  # fmt: skip
    assert main([*base, "--rim", str(driver), "--rim", str(vbios)]) == 1
    out = capsys.readouterr().out
    assert "ok   rim.signature: " in out
    assert f"FAIL rim.driver: {driver}: driver 545.00, but the evidence reports 550.90.07" in out
    assert NV01_DRIVER_DIFFER in out and NV01_VBIOS_DIFFER in out
    assert "FAIL rim.vbios: " in out
    assert main([*base, "--rim", str(tmp_path / "absent.swidtag")]) == 3
    assert f"{tmp_path / 'absent.swidtag'} does not exist" in capsys.readouterr().err
    junk = tmp_path / "junk.swidtag"
    junk.write_text("this is not XML")
    assert main([*base, "--rim", str(junk)]) == 2
    assert f"{junk}: not an XML RIM" in capsys.readouterr().err
    assert main([*base, "--rim", str(driver), "--rim", str(driver)]) == 2
    assert "a second driver RIM" in capsys.readouterr().err
    snp = ["attest", "verify", "--kind", "snp", "--evidence", str(driver), "--rim", str(driver)]
    assert main(snp) == 2
    assert "is for --kind nvidia only" in capsys.readouterr().err
    expired = [*base[:-4], "--now", "2026-01-01T00:00:00Z", "--nonce", NV01_NONCE.hex()]
    assert main([*expired, "--rim", str(driver)]) == 1
    assert "FAIL rim.signature: " in capsys.readouterr().out
    assert main(base) == 0  # without --rim: the RIM checks stay "not checked"
    assert "skip rim.driver: not checked offline" in capsys.readouterr().out


# --------------------------------------------------------------------------- each detail


def _rims_check(rims: list[Rim], **evidence: object) -> dict[str, tuple[bool | None, str]]:
    """``check_rims`` on its own: the checks it adds, by name."""
    verdict = Verdict("nvidia")
    kwargs: dict[str, object] = {
        "measurements": {},
        "driver_version": None,
        "vbios_version": None,
        "nvdec0_status": None,
        "now": AT,
    }
    check_rims(verdict, rims, **{**kwargs, **evidence})  # type: ignore[arg-type]
    return {c.name: (c.ok, c.detail) for c in verdict.checks}


def test_a_chain_to_a_root_of_its_own_is_refused_before_the_signature(
    nvtrust: dict[str, bytes],
) -> None:
    root, root_key = _ca("Not NVIDIA RIM Root")
    leaf, _ = _leaf(root, root_key)
    rim = replace(_rim(nvtrust, DRIVER), certificates=(leaf, root))
    result = verify_rim_signature(rim, AT)
    assert (result.ok, result.signed) == (False, None)
    assert result.detail == (
        "Driver_RIM_test_no_gpu.swidtag (driver 545.00): Test GPU FMC LF → Not NVIDIA RIM Root: "
        f"the chain ends at Not NVIDIA RIM Root (SPKI SHA-256 {spki_sha256(root)}), not at the "
        f"pinned NVIDIA CoRIM signing Root CA ({NVIDIA_RIM_ROOT_SPKI_SHA256})"
    )
    bare = verify_rim_signature(replace(rim, certificates=()), AT)
    assert (bare.ok, bare.detail) == (
        False,
        "Driver_RIM_test_no_gpu.swidtag (driver 545.00): KeyInfo carries no X509Certificate",
    )
    with pytest.raises(ValueError, match=r"^now: a time without a time zone$"):
        verify_rim_signature(rim, datetime(2025, 6, 1))


def test_every_certificate_out_of_its_validity_is_named_and_both_ends_are_valid(
    nvtrust: dict[str, bytes],
) -> None:
    rim = _rim(nvtrust, DRIVER)
    path = " → ".join(
        [
            "HCC RIM L4 Signer",
            "NVIDIA Reference Value L3 GH100 001",
            "NVIDIA Reference Value GH100 CA",
            "NVIDIA CoRIM signing Root CA",
        ]
    )
    late = verify_rim_signature(rim, datetime(2060, 1, 1, tzinfo=UTC))
    assert (late.ok, late.detail) == (
        False,
        f"Driver_RIM_test_no_gpu.swidtag (driver 545.00): {path}: not valid at "
        "2060-01-01T00:00:00Z: HCC RIM L4 Signer (valid 2023-06-27 to 2025-06-26), NVIDIA "
        "Reference Value L3 GH100 001 (valid 2023-05-11 to 2026-11-11), NVIDIA Reference Value "
        "GH100 CA (valid 2023-05-11 to 2033-05-11), NVIDIA CoRIM signing Root CA (valid "
        "2023-03-16 to 2053-03-08)",
    )
    leaf = rim.certificates[0]  # the last to start and the first to end
    for edge in (leaf.not_valid_before_utc, leaf.not_valid_after_utc):
        result = verify_rim_signature(rim, edge)
        assert result.ok is True, result.detail
        # what was signed, with the file's own certificates and bytes
        assert result.signed is not None
        assert (result.signed.product, result.signed.certificates, result.signed.raw) == (
            rim.product,
            rim.certificates,
            rim.raw,
        )
        assert result.signed.product == "GH100"


def test_a_tampered_rims_signature_is_false_not_unknown(nvtrust: dict[str, bytes]) -> None:
    raw = nvtrust[DRIVER].replace(b'index="7" active="True"', b'index="7" active="False"')
    assert verify_rim_signature(parse_rim(raw, "t.swidtag"), AT).ok is False


def test_a_keyinfo_certificate_must_be_strict_base64(nvtrust: dict[str, bytes]) -> None:
    raw = nvtrust[DRIVER]
    tag = b"<ds:X509Certificate>"
    start = raw.index(tag) + len(tag)
    end = raw.index(b"</ds:X509Certificate>", start)
    with pytest.raises(RimError) as info:
        parse_rim(raw[:start] + b"!" + raw[start:], "a.swidtag")
    assert str(info.value).startswith("a.swidtag: KeyInfo certificate 1 does not parse: ")
    with pytest.raises(ValueError) as empty:
        load_certs(b"")
    with pytest.raises(RimError) as info:
        parse_rim(raw[:start] + raw[end:], "a.swidtag")  # an empty element: no certificate
    assert str(info.value) == f"a.swidtag: KeyInfo certificate 1 does not parse: {empty.value}"


def test_check_rims_says_what_it_compared_and_what_it_could_not(
    nvtrust: dict[str, bytes],
) -> None:
    driver, vbios = _rim(nvtrust, DRIVER), _rim(nvtrust, VBIOS)
    assert _rims_check([]) == {
        "rim.signature": (True, ""),
        "rim.driver": (
            None,
            "no driver RIM given (--rim): the measurements were not compared with NVIDIA's "
            "driver RIM (driver ?)",
        ),
        "rim.vbios": (
            None,
            "no vbios RIM given (--rim): the measurements were not compared with NVIDIA's "
            "vbios RIM (vbios ?)",
        ),
    }
    signatures = [verify_rim_signature(r, AT).detail for r in (driver, vbios)]
    # evidence that reports nothing: every active index differs, its value none
    checks = _rims_check([driver, vbios], nvdec0_status=b"\x55")
    assert checks["rim.signature"] == (True, "; ".join(signatures))
    ok, detail = checks["rim.driver"]
    assert ok is False and detail.startswith(
        "Driver_RIM_test_no_gpu.swidtag: driver 545.00, but the evidence reports none; "
        "20 of 20 active indexes differ: 7, 21, "
    )
    assert detail.endswith(
        "; index 35 not compared: the GPU reports NVDEC0 disabled (0x55), and NVIDIA's "
        "verifier skips it then"
    )
    # a driver RIM whose signature fails does not stop the VBIOS RIM's comparison
    tampered = parse_rim(
        nvtrust[DRIVER].replace(b'index="7" active="True"', b'index="7" active="False"'),
        "t.swidtag",
    )
    checks = _rims_check([tampered, vbios])
    assert checks["rim.driver"] == (False, "t.swidtag: not compared: its signature does not verify")
    assert checks["rim.vbios"][0] is False
    assert checks["rim.vbios"][1].startswith(
        "1010_0200_882_96005E0001_PROD.swidtag: vbios 96.00.5E.00.01, but the evidence reports "
        "none; 12 of 12 active indexes differ"
    )


def test_a_malformed_resource_or_meta_is_named_word_for_word(nvtrust: dict[str, bytes]) -> None:
    raw = nvtrust[DRIVER]
    seven = b'index="7" active="True" alternatives="1" ns2:Hash0="0e0e'
    assert raw.count(seven) == 1

    def fault(old: bytes, new: bytes) -> str:
        assert raw.count(old) >= 1
        with pytest.raises(RimError) as info:
            parse_rim(raw.replace(old, new, 1), "a.swidtag")
        return str(info.value)

    at = "a.swidtag: Resource Measurement_7"
    assert fault(b'index="7" ', b"") == f"{at}: no index attribute"
    assert fault(b'alternatives="1" ns2:Hash0="0e0e', b'ns2:Hash0="0e0e') == (
        f"{at}: no alternatives attribute"
    )
    assert fault(seven, seven.replace(b'index="7"', b'index="7x"')) == (
        f"{at}: invalid literal for int() with base 10: '7x'"
    )
    assert fault(seven, seven.replace(b'active="True"', b'active="true"')) == (
        f"{at}: active is 'true', not True or False"
    )
    assert fault(seven, seven.replace(b'index="7"', b'index="-1"')) == (
        f"{at}: index -1 with 1 alternatives"
    )
    assert fault(seven, seven.replace(b'alternatives="1"', b'alternatives="0"')) == (
        f"{at}: index 7 with 0 alternatives"
    )
    assert fault(seven, seven.replace(b'Hash0="0e0e', b'Hash0="zz0e')) == f"{at}: Hash0 is not hex"
    # a Resource without a name is named by its index, one without either by "?"
    unnamed = raw.replace(b' name="Measurement_7"', b"", 1)
    for old, new, message in (
        (seven, seven.replace(b'active="True"', b'active="x"'), "Resource 7: active is 'x'"),
        (seven, seven.replace(b'index="7" ', b""), "Resource ?: no index attribute"),
    ):
        with pytest.raises(RimError) as info:
            parse_rim(unnamed.replace(old, new, 1), "a.swidtag")
        assert str(info.value).startswith(f"a.swidtag: {message}")
    assert fault(b'colloquialVersion="545.00" ', b"") == "a.swidtag: Meta has no colloquialVersion"
    assert fault(b"<ns0:Meta ", b"<ns0:Other ").startswith("a.swidtag: no Meta element")


def test_a_parsed_resource_keeps_its_size_and_name_and_meta_its_product(
    nvtrust: dict[str, bytes],
) -> None:
    rim = _rim(nvtrust, DRIVER)
    seven = rim.active[7]
    assert (seven.index, seven.size, seven.name) == (7, 48, "Measurement_7")
    assert rim.product == "GH100"
    bare = parse_rim(
        nvtrust[DRIVER].replace(b' name="Measurement_7"', b"").replace(b' product="GH100"', b""),
        "a.swidtag",
    )
    assert (bare.active[7].name, bare.product) == ("", "")


def test_with_rims_only_ocsp_is_left_unchecked_online_or_not(
    nvtrust: dict[str, bytes], nv01: tuple[bytes, bytes]
) -> None:
    rims = [_rim(nvtrust, DRIVER), _rim(nvtrust, VBIOS)]
    for online in (False, True):
        verdict = verify_nvidia(*nv01, now=AT, nonce=NV01_NONCE, rims=rims, online=online)
        names = [c.name for c in verdict.checks]
        assert [names.count(n) for n in ("rim.driver", "rim.vbios", "ocsp")] == [1, 1, 1]
        assert [c.name for c in verdict.not_checked] == ["ocsp"]
