"""Intel TDX quotes: the public vectors' cases, tampering, and malformed input.

The public vectors are read in place from ``../shared/vectors/attestation`` (never copied
into the project); without that folder the vector tests skip, saying so. The tests that need
no vector (Intel's TCB status convergence) run anyway.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.x509.oid import NameOID

from attestation.policy import Policy, apply_policy
from attestation.tdx import (
    INTEL_SGX_ROOT_CA_SPKI_SHA256,
    converge_tcb_status,
    parse_pck_extension,
    parse_tdx_quote,
    verify_tdx,
)
from attestation.verdict import Check, Verdict

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "attestation"
TDX = VECTORS / "intel-tdx"
#: The manifest's TDX cases, as these tests run them.
HANDLED = {
    "tdx-01-dcapqvl-uptodate",
    "tdx-02-dcapqvl-no-tcb-level",
    "tdx-03-gotdxguest-spr-v4",
    "tdx-04-gotdxguest-v5",
    "tdx-05-trustee-debug-td",
    "tdx-06-trustee-v5",
    "tdx-07-trustee-v4",
    "tdx-neg-01",
}
QUOTE_ONLY = (
    "quote_signature",
    "qe_report_signature",
    "qe_report_binding",
    "pck_chain",
    "pck_chain.root_pinned",
    "pck_chain.validity",
    "qe_vendor",
)
WITH_COLLATERAL = (
    "collateral.tcb_info_signature",
    "collateral.tcb_info_chain",
    "collateral.tcb_info_validity",
    "collateral.qe_identity_signature",
    "collateral.qe_identity_chain",
    "collateral.qe_identity_validity",
    "collateral.root_ca_crl",
    "collateral.pck_crl",
    "pck_chain.revocation",
    "qe_identity",
    "tcb_info.platform",
    "tdx_module",
    "tcb_level",
)
TDX01 = ("dcap-qvl/tdx_quote", "dcap-qvl/tdx_quote_collateral.json")
TDX02 = ("dcap-qvl/tdx_quote_outdated", "dcap-qvl/tdx_quote_outdated_collateral.json")
TDX03 = ("go-tdx-guest/tdx_prod_quote_SPR_E4.dat", "go-tdx-guest/collateral_v4.derived.json")
#: Times inside the windows the manifest states (and inside every certificate's validity).
T01 = datetime(2025, 7, 1, tzinfo=UTC)
T02 = datetime(2026, 3, 1, tzinfo=UTC)
T03 = datetime(2023, 7, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)


@pytest.fixture(scope="module")
def attestation_vectors() -> Path:
    """The public vectors folder; without it, the test skips and says why."""
    if not VECTORS.is_dir():
        reason = (
            f"{VECTORS} is absent: the public attestation vectors live there "
            "(../shared/vectors beside the repository), so the TDX vector tests cannot run"
        )
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return VECTORS


needs_vectors = pytest.mark.usefixtures("attestation_vectors")


@pytest.fixture(scope="module")
def manifest(attestation_vectors: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((attestation_vectors / "manifest.json").read_text())
    return data


@pytest.fixture(scope="module")
def cases(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in manifest["cases"] if c["kind"] == "intel-tdx"}


def _read(name: str) -> bytes:
    return (TDX / name).read_bytes()


def _verify(quote: str, collateral: str | None = None, **kwargs: Any) -> Verdict:
    coll = _read(collateral) if collateral is not None else None
    return verify_tdx(_read(quote), collateral=coll, **kwargs)


def _check(verdict: Verdict, name: str) -> Check:
    return next(c for c in verdict.checks if c.name == name)


#: What the manifest's "quote-level ACCEPT" means: a policy that allows it, explicitly.
QUOTE_LEVEL = Policy(allow_quote_level=True)


def _made(verdict: Verdict) -> dict[str, bool | None]:
    return {c.name: c.ok for c in verdict.checks}


def _window(text: str) -> tuple[datetime, datetime]:
    found = re.search(r"\[(\S+Z), (\S+Z)\]", text)
    assert found is not None, text
    start, end = (datetime.fromisoformat(t.replace("Z", "+00:00")) for t in found.groups())
    return start, end


def _assert_quote_accepted(verdict: Verdict) -> None:
    assert verdict.accepted, [c.line() for c in verdict.failed]
    made = _made(verdict)
    assert all(made[name] is True for name in QUOTE_ONLY), made


def _assert_no_collateral(verdict: Verdict) -> None:
    for name in WITH_COLLATERAL:
        check = _check(verdict, name)
        assert check.ok is None
        assert "collateral" in check.detail
    assert verdict.facts["tcb_status"] is None


# --------------------------------------------------------------------------- the manifest


def test_every_tdx_case_in_the_manifest_is_run(cases: dict[str, dict[str, Any]]) -> None:
    assert set(cases) == HANDLED


def test_the_tdx_vector_files_are_the_ones_the_manifest_lists(manifest: dict[str, Any]) -> None:
    for name, entry in manifest["files"].items():
        if name.startswith("intel-tdx/"):
            digest = hashlib.sha256((VECTORS / name).read_bytes()).hexdigest()
            assert digest == entry["sha256"], name


def test_the_pinned_root_is_the_vectors_intel_sgx_root(attestation_vectors: Path) -> None:
    for name in ("dcap-qvl/TrustedRootCA.der", "go-tdx-guest/trusted_root.pem"):
        blob = _read(name)
        cert = (
            x509.load_pem_x509_certificate(blob)
            if blob.startswith(b"-----")
            else x509.load_der_x509_certificate(blob)
        )
        spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        assert hashlib.sha256(spki).hexdigest() == INTEL_SGX_ROOT_CA_SPKI_SHA256
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
            "Intel SGX Root CA"
        )


# --------------------------------------------------------------------------- tdx-01


def test_tdx01_accepts_up_to_date_inside_its_window(cases: dict[str, dict[str, Any]]) -> None:
    case = cases["tdx-01-dcapqvl-uptodate"]
    assert case["expected"].startswith("ACCEPT, TCB status UpToDate")
    start, end = _window(case["verification_time"])
    for when in (start, T01, end):
        verdict = _verify(*TDX01, now=when)
        assert verdict.accepted, (when, [c.line() for c in verdict.failed])
        assert all(ok is True for ok in _made(verdict).values()), _made(verdict)
    facts = verdict.facts
    expected = case["facts"]
    assert facts["tcb_status"] == "UpToDate"
    assert facts["advisory_ids"] == []
    assert facts["version"] == expected["quote_version"] == 4
    assert facts["tee_type"] == expected["tee_type"] == "0x81"
    assert facts["fmspc"] == expected["fmspc"].lower()
    assert facts["tee_tcb_svn"] == expected["tee_tcb_svn"]
    assert facts["td_attributes"] == expected["td_attributes"].split()[0]
    assert facts["debug"] is False
    assert facts["qe_isvsvn"] == expected["qe_isvsvn"]
    assert facts["pcesvn"] == expected["pcesvn"]
    assert facts["pck_cpusvn_components"][:8] == [3, 3, 2, 2, 4, 1, 0, 5]
    assert facts["tdx_module_identity"] == "TDX_01"
    assert facts["tdx_module_tcb_status"] == "UpToDate"
    assert facts["qe_tcb_status"] == "UpToDate"
    assert facts["platform_tcb_status"] == "UpToDate"
    # The window the collateral allows is the one the manifest states.
    assert facts["collateral_valid_from"] == _iso(start)
    assert facts["collateral_valid_until"] == _iso(end)
    for key in ("mrtd", "rtmr0", "rtmr1", "rtmr2", "rtmr3", "mrconfigid", "mrowner"):
        assert re.fullmatch(r"[0-9a-f]{96}", facts[key]), key
    assert re.fullmatch(r"[0-9a-f]{128}", facts["report_data"])
    assert facts["pck_validity"]["not_before"] <= _iso(start)
    json.dumps(verdict.json())  # JSON-ready


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_tdx01_rejects_outside_its_window(cases: dict[str, dict[str, Any]]) -> None:
    start, end = _window(cases["tdx-01-dcapqvl-uptodate"]["verification_time"])
    before = _verify(*TDX01, now=start - SECOND)
    assert not before.accepted
    assert _check(before, "collateral.qe_identity_validity").ok is False  # not yet issued
    after = _verify(*TDX01, now=end + SECOND)
    assert not after.accepted
    assert {c.name for c in after.failed} == {"collateral.pck_crl"}  # the PCK CRL is stale
    late = _verify(*TDX01, now=datetime(2025, 8, 1, tzinfo=UTC))
    assert not late.accepted
    failed = {c.name for c in late.failed}
    assert {"collateral.tcb_info_validity", "collateral.qe_identity_validity"} <= failed
    assert "expired" in _check(late, "collateral.tcb_info_validity").detail
    # The quote itself is fine at those times: only the collateral expired.
    assert all(_check(late, name).ok for name in QUOTE_ONLY)


@needs_vectors
def test_tdx01_without_collateral_lists_the_tcb_checks_as_not_checked() -> None:
    verdict = _verify(TDX01[0], now=T01)
    _assert_quote_accepted(verdict)
    _assert_no_collateral(verdict)


@needs_vectors
def test_tdx01_collateral_as_a_mapping_and_as_text() -> None:
    members = json.loads(_read(TDX01[1]))
    by_map = verify_tdx(_read(TDX01[0]), now=T01, collateral=members)
    by_text = verify_tdx(_read(TDX01[0]), now=T01, collateral=_read(TDX01[1]).decode())
    assert by_map.accepted and by_text.accepted
    assert by_map.facts["tcb_status"] == by_text.facts["tcb_status"] == "UpToDate"


def test_tdx01_trusted_root_override(attestation_vectors: Path) -> None:
    same = _verify(*TDX01, now=T01, trusted_root=_read("dcap-qvl/TrustedRootCA.der"))
    assert same.accepted
    assert "given trusted root" in _check(same, "pck_chain.root_pinned").detail
    other = _verify(*TDX01, now=T01, trusted_root=_generated_root())
    assert not other.accepted
    failed = {c.name for c in other.failed}
    assert {
        "pck_chain.root_pinned",
        "collateral.tcb_info_chain",
        "collateral.qe_identity_chain",
    } <= failed
    assert "quote_signature" not in failed


def _generated_root() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Intel SGX Root CA")])
    now = datetime(2020, 1, 1, tzinfo=UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=365 * 40))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(Encoding.PEM)


# --------------------------------------------------------------------------- tdx-02, tdx-03


def test_tdx02_signatures_verify_but_no_tcb_level_matches(
    cases: dict[str, dict[str, Any]],
) -> None:
    case = cases["tdx-02-dcapqvl-no-tcb-level"]
    start, end = _window(case["verification_time"])
    for when in (start, T02, end):
        verdict = _verify(*TDX02, now=when)
        assert not verdict.accepted
        assert [c.name for c in verdict.failed] == ["tcb_level"], when
    level = _check(verdict, "tcb_level")
    assert "no TCB level matches" in level.detail
    assert "sgxtcbcomponents[7]: 3 < 5" in level.detail
    facts = verdict.facts
    assert facts["version"] == case["facts"]["quote_version"] == 5
    assert facts["body_type"] == 3  # TD report 1.5, 648 bytes
    assert "mrservicetd" in facts and "tee_tcb_svn2" in facts
    assert facts["fmspc"] == case["facts"]["fmspc"].lower()
    assert facts["pcesvn"] == case["facts"]["pcesvn"]
    assert facts["pck_cpusvn_components"][:8] == [3, 3, 2, 2, 4, 1, 0, 3]
    assert facts["qe_tcb_status"] == "UpToDate"
    assert facts["tcb_status"] is None


def test_tdx03_quote_accepted_in_2023_and_rejected_in_2053(
    cases: dict[str, dict[str, Any]],
) -> None:
    case = cases["tdx-03-gotdxguest-spr-v4"]
    assert "ACCEPT at 2023-07-01T01:00:00Z" in case["expected"]
    verdict = _verify(TDX03[0], now=T03)
    _assert_quote_accepted(verdict)
    _assert_no_collateral(verdict)
    held = apply_policy(_verify(TDX03[0], now=T03), QUOTE_LEVEL)
    assert held.accepted, [c.line() for c in held.failed]
    facts = verdict.facts
    assert facts["fmspc"] == case["facts"]["fmspc"]
    assert facts["td_attributes"] == case["facts"]["td_attributes"].split()[0]
    assert facts["tee_tcb_svn"] == case["facts"]["tee_tcb_svn"]
    assert facts["trailing_bytes"] == 39  # go-tdx-guest's "extra bytes", signed by nothing
    late = _verify(TDX03[0], now=datetime(2053, 7, 1, tzinfo=UTC))
    assert not late.accepted
    assert [c.name for c in late.failed] == ["pck_chain.validity"]
    assert "Intel SGX PCK Certificate" in _check(late, "pck_chain.validity").detail


def test_tdx03_with_collateral_no_tcb_level_matches(cases: dict[str, dict[str, Any]]) -> None:
    start, end = _window(cases["tdx-03-gotdxguest-spr-v4"]["expected"])
    for when in (start, T03, end):
        verdict = _verify(*TDX03, now=when)
        assert not verdict.accepted
        assert [c.name for c in verdict.failed] == ["tcb_level"], when
    assert verdict.facts["qe_tcb_status"] == "UpToDate"
    outside = _verify(*TDX03, now=end + SECOND)
    assert "collateral.qe_identity_validity" in {c.name for c in outside.failed}


def test_tdx03_collateral_from_intels_pcs_responses(attestation_vectors: Path) -> None:
    """Intel's PCS responses as published: the exact tcbInfo / enclaveIdentity substrings
    and their embedded signatures are taken from them, never re-serialised."""
    chain = (TDX / "go-tdx-guest/tcb_info_issuer_chain.derived.pem").read_text()
    collateral = {
        "tcb_info": _read("go-tdx-guest/sample_tcbInfo_response.json"),
        "qe_identity": _read("go-tdx-guest/sample_qeIdentity_response.json").decode(),
        "tcb_info_issuer_chain": chain,
        "qe_identity_issuer_chain": chain,
        "pck_crl": _read("go-tdx-guest/pckcrl.der"),
        "root_ca_crl": _read("go-tdx-guest/rootcrl.der"),
        "pck_crl_issuer_chain": _read("go-tdx-guest/pck_crl_issuer_chain.derived.pem"),
    }
    verdict = verify_tdx(_read(TDX03[0]), now=T03, collateral=collateral)
    assert [c.name for c in verdict.failed] == ["tcb_level"]
    assert _check(verdict, "collateral.tcb_info_signature").ok is True
    assert _check(verdict, "collateral.qe_identity_signature").ok is True


# --------------------------------------------------------------------------- tdx-04 … tdx-07


@pytest.mark.parametrize(
    ("case_id", "quote", "when", "version", "debug"),
    [
        # the upstream test time
        (
            "tdx-04-gotdxguest-v5",
            "go-tdx-guest/quote_v5_sample.dat",
            "2026-02-03T01:00:00Z",
            5,
            False,
        ),
        # inside the PCK validity the manifest states (2023-02-07..2030-02-07)
        ("tdx-05-trustee-debug-td", "trustee/tdx_quote_4.dat", "2025-01-01T00:00:00Z", 4, True),
        # PCK valid 2024-03-18..2031-03-18
        ("tdx-06-trustee-v5", "trustee/tdx_quote_5.dat", "2025-01-01T00:00:00Z", 5, False),
        # PCK valid 2025-04-08..2032-04-08
        ("tdx-07-trustee-v4", "trustee/tdx_quote_6.dat", "2026-01-01T00:00:00Z", 4, False),
    ],
)
def test_quote_level_cases_accept(
    cases: dict[str, dict[str, Any]],
    case_id: str,
    quote: str,
    when: str,
    version: int,
    debug: bool,
) -> None:
    case = cases[case_id]
    assert case["quote"] == f"intel-tdx/{quote}"
    now = datetime.fromisoformat(when.replace("Z", "+00:00"))
    verdict = _verify(quote, now=now)
    _assert_quote_accepted(verdict)
    _assert_no_collateral(verdict)
    facts = verdict.facts
    assert facts["version"] == version == case["facts"]["quote_version"]
    assert facts["fmspc"] == case["facts"]["fmspc"].lower()
    assert facts["debug"] is debug
    if "mrtd" in case["facts"]:
        assert facts["mrtd"] == case["facts"]["mrtd"]
    # "quote-level ACCEPT" is under a policy that allows it explicitly
    held = apply_policy(_verify(quote, now=now), QUOTE_LEVEL)
    assert _check(held, "policy.quote_level").ok is True
    assert [c.name for c in held.failed] == (["policy.debug"] if debug else [])
    if debug:
        # tdx-05: genuine, but a debug TD; the policy refuses it ("a production policy must
        # REJECT"), quote-level or not.
        assert "DEBUG=1" in case["expected"]
        assert facts["td_attributes"] == "0100001000000000"
    # The PCK validity the manifest states.
    validity = re.search(r"(\d{4}-\d\d-\d\d)\.\.(\d{4}-\d\d-\d\d)", json.dumps(case))
    if validity is not None:
        assert facts["pck_validity"]["not_before"].startswith(validity.group(1))
        assert facts["pck_validity"]["not_after"].startswith(validity.group(2))


@pytest.mark.parametrize(
    ("quote", "when"),
    [
        ("go-tdx-guest/tdx_prod_quote_SPR_E4.dat", "2023-07-01T01:00:00Z"),
        ("go-tdx-guest/quote_v5_sample.dat", "2026-02-03T01:00:00Z"),
        ("trustee/tdx_quote_5.dat", "2025-01-01T00:00:00Z"),
        ("trustee/tdx_quote_6.dat", "2026-01-01T00:00:00Z"),
    ],
)
@needs_vectors
def test_a_quote_without_collateral_is_refused_by_the_default_policy(quote: str, when: str) -> None:
    """The same genuine quotes, with no collateral and no policy saying quote-level is
    enough: the default policy refuses them, naming the rule."""
    verdict = apply_policy(
        _verify(quote, now=datetime.fromisoformat(when.replace("Z", "+00:00"))), Policy()
    )
    assert not verdict.accepted
    assert [c.name for c in verdict.failed] == ["policy.quote_level"]
    detail = _check(verdict, "policy.quote_level").detail
    assert "TCB status" in detail and "allow_quote_level" in detail
    assert _check(verdict, "policy.tcb_status").ok is None


@needs_vectors
def test_with_collateral_the_quote_level_rule_is_not_needed() -> None:
    verdict = apply_policy(_verify(*TDX01, now=T01), Policy())
    assert verdict.accepted, [c.line() for c in verdict.failed]
    assert "policy.quote_level" not in _made(verdict)


@needs_vectors
def test_the_cli_refuses_a_bare_quote_unless_the_policy_allows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from affidavit.cli import main

    args = ["attest", "verify", "--kind", "tdx", "--evidence", str(TDX / "trustee/tdx_quote_6.dat"),
            "--now", "2026-01-01T00:00:00Z"]  # fmt: skip
    assert main(args) == 1
    assert "FAIL policy.quote_level" in capsys.readouterr().out
    allow = tmp_path / "quote-level.json"
    allow.write_text('{"allow_quote_level": true}')
    assert main([*args, "--policy", str(allow)]) == 0
    out = capsys.readouterr().out
    assert "ok   policy.quote_level" in out and "verdict: accept" in out


# --------------------------------------------------------------------------- tdx-neg-01


def test_neg01_any_flip_in_header_or_body_rejects(cases: dict[str, dict[str, Any]]) -> None:
    assert cases["tdx-neg-01"]["expected"] == "REJECT"
    raw = bytearray(_read(TDX01[0]))
    signed = len(parse_tdx_quote(bytes(raw)).signed_bytes)
    assert signed == 632
    for offset in range(signed):
        flipped = bytearray(raw)
        flipped[offset] ^= 0x01
        try:
            verdict = verify_tdx(bytes(flipped), now=T01)
        except ValueError as exc:
            # the version, key type or TEE type no longer say "TDX ECDSA P-256 v4/v5" (a v5
            # version then misreads the body's start as its type)
            assert offset < 8, (offset, exc)
            assert re.match(r"(header|body)\.", str(exc)), exc
            continue
        assert not verdict.accepted, offset
        failed = {c.name for c in verdict.failed}
        assert "quote_signature" in failed, offset
        assert failed <= {"quote_signature", "qe_vendor"}, (offset, failed)


@needs_vectors
def test_neg01_flip_in_a_v5_body_rejects() -> None:
    raw = bytearray(_read(TDX02[0]))
    quote = parse_tdx_quote(bytes(raw))
    assert len(quote.signed_bytes) == 48 + 6 + 648
    for offset in (48, 50, 54, 54 + 647, 600):  # the body's type and size are signed too
        flipped = bytearray(raw)
        flipped[offset] ^= 0x80
        try:
            verdict = verify_tdx(bytes(flipped), now=T02)
        except ValueError as exc:
            assert offset in (48, 50)
            assert "body." in str(exc)
            continue
        assert "quote_signature" in {c.name for c in verdict.failed}


@needs_vectors
def test_neg01_flip_in_the_qe_report_rejects_on_the_pck_signature() -> None:
    raw = _read(TDX01[0])
    start = 632 + 4 + 64 + 64 + 2 + 4  # the QE report inside the certification data
    for offset, also in ((start + 10, set()), (start + 320, {"qe_report_binding"})):
        flipped = bytearray(raw)
        flipped[offset] ^= 0x01
        verdict = verify_tdx(bytes(flipped), now=T01)
        assert {c.name for c in verdict.failed} == {"qe_report_signature"} | also


@needs_vectors
def test_neg01_flipped_signature_or_key_rejects() -> None:
    raw = _read(TDX01[0])
    for offset in (636, 636 + 63, 636 + 64 + 5):  # the signature, then the attestation key
        flipped = bytearray(raw)
        flipped[offset] ^= 0x01
        verdict = verify_tdx(bytes(flipped), now=T01)
        assert "quote_signature" in {c.name for c in verdict.failed}
    # The attestation key is also bound by the QE report: changing it breaks that binding.
    assert "qe_report_binding" in {c.name for c in verdict.failed}


# --------------------------------------------------------------------------- collateral tampering


def _collateral(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_read(name))
    return data


@needs_vectors
def test_a_flipped_byte_in_tcb_info_rejects_on_its_signature() -> None:
    members = _collateral(TDX01[1])
    text = members["tcb_info"]
    for old, new in (('"tcbEvaluationDataNumber":17', '"tcbEvaluationDataNumber":18'),):
        assert old in text
        members["tcb_info"] = text.replace(old, new, 1)
        verdict = verify_tdx(_read(TDX01[0]), now=T01, collateral=members)
        assert not verdict.accepted
        assert _check(verdict, "collateral.tcb_info_signature").ok is False
        assert "does not verify" in _check(verdict, "collateral.tcb_info_signature").detail
        assert verdict.facts["tcb_status"] is None  # nothing taken from an unsigned tcbInfo
    # One flipped bit anywhere in the text does it too, whether or not it still parses.
    for index in (0, len(text) // 3, len(text) - 1):
        flipped = text[:index] + chr(ord(text[index]) ^ 0x01) + text[index + 1 :]
        members["tcb_info"] = flipped
        verdict = verify_tdx(_read(TDX01[0]), now=T01, collateral=members)
        assert _check(verdict, "collateral.tcb_info_signature").ok is False, index
        assert not verdict.accepted


@needs_vectors
def test_re_serialised_tcb_info_is_not_what_intel_signed() -> None:
    members = _collateral(TDX01[1])
    members["tcb_info"] = json.dumps(json.loads(members["tcb_info"]))
    verdict = verify_tdx(_read(TDX01[0]), now=T01, collateral=members)
    assert _check(verdict, "collateral.tcb_info_signature").ok is False
    members["tcb_info"] = json.loads(_collateral(TDX01[1])["tcb_info"])  # parsed, not text
    verdict = verify_tdx(_read(TDX01[0]), now=T01, collateral=members)
    assert not verdict.accepted
    assert "exact text" in _check(verdict, "collateral.tcb_info_signature").detail


@needs_vectors
def test_a_flipped_byte_in_qe_identity_rejects_on_its_signature() -> None:
    members = _collateral(TDX01[1])
    members["qe_identity"] = members["qe_identity"].replace('"isvprodid":2', '"isvprodid":3')
    verdict = verify_tdx(_read(TDX01[0]), now=T01, collateral=members)
    assert _check(verdict, "collateral.qe_identity_signature").ok is False
    assert _check(verdict, "qe_identity").ok is False  # and the QE no longer matches it
    assert not verdict.accepted


@needs_vectors
def test_a_flipped_collateral_signature_rejects() -> None:
    members = _collateral(TDX01[1])
    sig = bytearray(bytes.fromhex(members["tcb_info_signature"]))
    sig[5] ^= 0x01
    members["tcb_info_signature"] = sig.hex()
    verdict = verify_tdx(_read(TDX01[0]), now=T01, collateral=members)
    assert [c.name for c in verdict.failed] == ["collateral.tcb_info_signature"]


@needs_vectors
def test_another_platforms_collateral_rejects() -> None:
    """tdx-02's collateral (FMSPC 90C06F000000) for tdx-01's quote (B0C06F000000)."""
    verdict = verify_tdx(_read(TDX01[0]), now=T02, collateral=_read(TDX02[1]))
    assert not verdict.accepted
    assert "FMSPC" in _check(verdict, "tcb_info.platform").detail
    assert _check(verdict, "tcb_info.platform").ok is False
    assert "not evaluated" in _check(verdict, "tcb_level").detail
    assert verdict.facts["tcb_status"] is None


@needs_vectors
def test_incomplete_collateral() -> None:
    members = _collateral(TDX01[1])
    for key in ("root_ca_crl", "pck_crl", "pck_crl_issuer_chain"):
        del members[key]
    verdict = verify_tdx(_read(TDX01[0]), now=T01, collateral=members)
    assert verdict.accepted  # no CRLs: revocation is listed as not checked, never a pass
    assert _check(verdict, "pck_chain.revocation").ok is None
    assert _check(verdict, "collateral.pck_crl").ok is None
    del members["tcb_info_signature"]
    verdict = verify_tdx(_read(TDX01[0]), now=T01, collateral=members)
    assert not verdict.accepted
    assert "tcb_info_signature" in _check(verdict, "collateral.tcb_info_signature").detail
    swapped = _collateral(TDX01[1])
    swapped["pck_crl"], swapped["root_ca_crl"] = swapped["root_ca_crl"], swapped["pck_crl"]
    verdict = verify_tdx(_read(TDX01[0]), now=T01, collateral=swapped)
    assert {"collateral.pck_crl", "collateral.root_ca_crl"} <= {c.name for c in verdict.failed}


# --------------------------------------------------------------------------- parsing


@needs_vectors
def test_parse_v4_and_v5_into_frozen_dataclasses() -> None:
    v4 = parse_tdx_quote(_read(TDX01[0]))
    assert v4.header.version == 4 and v4.body_type == 2
    assert v4.header.tee_type == 0x81 and v4.header.att_key_type == 2
    assert len(v4.header.qe_vendor_id) == 16 and len(v4.header.user_data) == 20
    assert len(v4.body.tee_tcb_svn) == 16 and len(v4.body.report_data) == 64
    assert v4.body.tee_tcb_svn2 is None and v4.body.mrservicetd is None
    assert len(v4.body.rtmrs) == 4 and all(len(r) == 48 for r in v4.body.rtmrs)
    qc = v4.signature_data.qe_certification
    assert v4.signature_data.certification_data_type == 6
    assert qc.certification_data_type == 5 and len(qc.qe_report.raw) == 384
    assert qc.pck_chain_pem is not None and qc.pck_chain_pem.count(b"BEGIN CERTIFICATE") == 3
    assert len(v4.trailing) == 70 and not any(v4.trailing)  # dcap-qvl's zero padding
    with pytest.raises(dataclasses.FrozenInstanceError):
        v4.body.mrtd = b""  # type: ignore[misc]
    v5 = parse_tdx_quote(_read(TDX02[0]))
    assert v5.header.version == 5 and v5.body_type == 3
    assert v5.body.tee_tcb_svn2 is not None and len(v5.body.tee_tcb_svn2) == 16
    assert v5.body.mrservicetd is not None and len(v5.body.mrservicetd) == 48


@needs_vectors
def test_hex_text_is_accepted() -> None:
    raw = _read(TDX01[0])
    as_text = raw.hex()
    assert parse_tdx_quote(as_text) == parse_tdx_quote(raw)
    assert parse_tdx_quote(as_text.upper().encode() + b"\n") == parse_tdx_quote(raw)
    assert verify_tdx(as_text, now=T01).accepted
    with pytest.raises(ValueError, match="odd number"):
        parse_tdx_quote(as_text[:-1].encode())


@needs_vectors
def test_the_pck_certificates_sgx_extension() -> None:
    pem = parse_tdx_quote(_read(TDX01[0])).signature_data.qe_certification.pck_chain_pem
    assert pem is not None
    leaf, _platform_ca, root = x509.load_pem_x509_certificates(pem)
    ext = parse_pck_extension(leaf)
    assert ext.fmspc.hex() == "b0c06f000000"
    assert ext.pceid == b"\x00\x00"
    assert ext.pcesvn == 11
    assert ext.cpusvn_components == (3, 3, 2, 2, 4, 1, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0)
    assert ext.cpusvn == bytes(ext.cpusvn_components)
    with pytest.raises(ValueError, match="no Intel SGX extension"):
        parse_pck_extension(root)


def _malformed(raw: bytes) -> list[tuple[bytes, str]]:
    def patched(offset: int, fmt: str, value: int) -> bytes:
        out = bytearray(raw)
        struct.pack_into(fmt, out, offset, value)
        return bytes(out)

    sig_len_at = 632
    cert_type_at = sig_len_at + 4 + 128
    return [
        (b"", "empty"),
        (raw[:1], "header.version"),
        (raw[:3], "header.att_key_type"),
        (raw[:40], "header.user_data"),
        (raw[:300], "body"),
        (raw[:633], "signature_data.length"),
        (raw[:4000], "signature_data.length"),
        (patched(0, "<H", 3), "header.version"),
        (patched(0, "<H", 6), "header.version"),
        (patched(2, "<H", 3), "header.att_key_type"),
        (patched(4, "<I", 0), "header.tee_type"),
        (patched(sig_len_at, "<I", 10), "signature_data.signature"),
        (patched(sig_len_at, "<I", 100), "signature_data.attestation_key"),
        (patched(sig_len_at, "<I", 200), "certification_data.size"),
        (patched(cert_type_at, "<H", 5), "certification_data.type"),
        (patched(cert_type_at + 2, "<I", 1000), "certification_data.size"),
        (patched(cert_type_at + 6 + 384 + 64, "<H", 4000), "qe_auth_data"),
        (
            patched(cert_type_at + 6 + 384 + 64 + 2 + 32 + 2, "<I", 5000),
            "qe_certification_data.size",
        ),
    ]


@needs_vectors
def test_malformed_v4_quotes_raise_naming_the_field() -> None:
    raw = _read(TDX01[0])[:4936]
    for data, field in _malformed(raw):
        with pytest.raises(ValueError, match=re.escape(field)):
            parse_tdx_quote(data)
        with pytest.raises(ValueError, match=re.escape(field)):
            verify_tdx(data, now=T01)


@needs_vectors
def test_malformed_v5_bodies_raise_naming_the_field() -> None:
    raw = bytearray(_read(TDX02[0]))
    for offset, fmt, value, field in (
        (48, "<H", 1, "body.type"),
        (48, "<H", 4, "body.type"),
        (50, "<I", 584, "body.size"),
    ):
        bad = bytearray(raw)
        struct.pack_into(fmt, bad, offset, value)
        with pytest.raises(ValueError, match=re.escape(field)):
            parse_tdx_quote(bytes(bad))
    with pytest.raises(ValueError, match=r"body\.tee_tcb_svn2|body"):
        parse_tdx_quote(bytes(raw[: 48 + 6 + 600]))


@needs_vectors
def test_bad_arguments() -> None:
    raw = _read(TDX01[0])
    with pytest.raises(ValueError, match="time zone"):
        verify_tdx(raw, now=datetime(2025, 7, 1))
    with pytest.raises(ValueError, match="collateral"):
        verify_tdx(raw, now=T01, collateral=b"not json")
    with pytest.raises(ValueError, match="collateral"):
        verify_tdx(raw, now=T01, collateral=b"[1, 2]")
    with pytest.raises(ValueError, match="trusted_root"):
        verify_tdx(raw, now=T01, trusted_root=b"not a certificate")
    with pytest.raises(ValueError, match="not hex"):
        parse_tdx_quote("zz" * 10)


# --------------------------------------------------------------------------- TCB status


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (("UpToDate",), "UpToDate"),
        (("UpToDate", "UpToDate", "UpToDate"), "UpToDate"),
        (("UpToDate", "SWHardeningNeeded"), "SWHardeningNeeded"),
        (("ConfigurationNeeded", "SWHardeningNeeded"), "ConfigurationAndSWHardeningNeeded"),
        (("SWHardeningNeeded", "OutOfDate"), "OutOfDate"),
        (("ConfigurationNeeded", "OutOfDate"), "OutOfDateConfigurationNeeded"),
        (("ConfigurationAndSWHardeningNeeded", "OutOfDate"), "OutOfDateConfigurationNeeded"),
        (("OutOfDateConfigurationNeeded", "UpToDate"), "OutOfDateConfigurationNeeded"),
        (("UpToDate", "Revoked", "OutOfDate"), "Revoked"),
    ],
)
def test_converge_tcb_status(statuses: tuple[str, ...], expected: str) -> None:
    assert converge_tcb_status(*statuses) == expected


def test_converge_refuses_unknown_statuses() -> None:
    with pytest.raises(ValueError, match="Intel's TCB statuses"):
        converge_tcb_status("UpToDate", "Fine")
