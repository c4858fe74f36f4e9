"""attestation.self_check: the appliance's check of its own boot evidence.

The real verifiers and policy throughout; the one double is the TEE: the SNP chain and
reports of ``snp_double`` (a throwaway ARK → ASK → VCEK, trusted here through
``TrustedRoots`` in place of AMD's pinned roots)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from attestation.binding import report_data
from attestation.evidence import TrustedRoots
from attestation.policy import Policy
from attestation.self_check import GpuEvidence, SelfCheck, check_own
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, FakeAmd, fake_amd, v5_report

NOW = datetime(2025, 6, 1, tzinfo=UTC)
LOG_KEY = "affidavit-log+0123abcd+AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
SEALING = bytes(range(32))
NONCE = b"n" * 32


@pytest.fixture(scope="module")
def amd() -> FakeAmd:
    return fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])


def _chain(amd: FakeAmd) -> bytes:
    """The chain as the appliance keeps it: VCEK, ASK, ARK (PEM)."""
    return x509.load_der_x509_certificate(amd.vek).public_bytes(Encoding.PEM) + amd.chain


def _trusted(amd: FakeAmd) -> TrustedRoots:
    return TrustedRoots(Path("double-ark.pem"), amd.roots)


def _bound(amd: FakeAmd, **fields: object) -> bytes:
    data = report_data(LOG_KEY, SEALING, NONCE)
    return v5_report(amd.vek_key, report_data=data, **fields)  # type: ignore[arg-type]


def _check(amd: FakeAmd, report: bytes, **kw: object) -> SelfCheck:
    args: dict[str, object] = {
        "log_key": LOG_KEY,
        "sealing_public": SEALING,
        "nonce": NONCE,
        "now": NOW,
        "trusted": _trusted(amd),
    }
    args.update(kw)
    return check_own("sev-snp", report, _chain(amd), **args)  # type: ignore[arg-type]


def _reason(got: SelfCheck) -> str:
    assert got.reason is not None, "attested"
    return got.reason


def test_its_own_genuine_bound_report_is_attested(amd: FakeAmd) -> None:
    got = check_own(
        "sev-snp",
        _bound(amd),
        _chain(amd),
        log_key=LOG_KEY,
        sealing_public=SEALING,
        nonce=NONCE,
        now=NOW,
        trusted=_trusted(amd),
    )
    assert got.attested and got.tee_type == "sev-snp" and got.reason is None
    names = {c.name: c.ok for c in got.checks}
    for made in ("report_signature", "chain.vek_by_ask", "vek.tcb", "policy.debug",
                 "policy.min_tcb", "policy.vmpl", "binding"):  # fmt: skip
        assert names[made] is True, made
    # the launch digest: listed, never a pass; only outsiders can compare it
    digest = next(c for c in got.checks if c.name == "launch_digest")
    assert digest.ok is None
    assert digest.detail == (
        f"{bytes(range(100, 148)).hex()} is not compared here: only outsiders can, against the"
        " published values"
    )
    assert got.summary().startswith("attested (sev-snp): ")


def test_no_evidence_is_not_attested() -> None:
    for kind, report in ((None, None), ("sev-snp", b"")):
        got = check_own(
            kind,
            report,
            b"",
            log_key=LOG_KEY,
            sealing_public=SEALING,
            nonce=NONCE,
            now=NOW,
            absent="keysource=test-insecure asks no TEE",
        )
        assert not got.attested and got.tee_type == "none"
        assert got.reason == "no evidence: keysource=test-insecure asks no TEE"
        assert got.summary() == "FAILED: no evidence: keysource=test-insecure asks no TEE"


def test_a_report_bound_to_other_keys_or_another_nonce_fails_the_binding(amd: FakeAmd) -> None:
    other = v5_report(amd.vek_key, report_data=report_data(LOG_KEY, bytes(32), NONCE))
    got = _check(amd, other)
    assert not got.attested and got.tee_type == "none"
    assert _reason(got).startswith("binding: report_data ")
    assert "is not this appliance's binding" in _reason(got)
    stale = _check(amd, _bound(amd), nonce=b"m" * 32)
    assert _reason(stale).startswith("binding: ")


def test_the_chain_must_lead_to_a_trusted_root(amd: FakeAmd) -> None:
    # held to AMD's pinned roots (no trusted double): the double's ARK is not AMD's
    got = _check(amd, _bound(amd), trusted=None)
    assert not got.attested
    assert _reason(got).startswith("chain.ark_pinned: ")
    # another chain's VCEK did not sign this report
    stranger = fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])
    forged = v5_report(stranger.vek_key, report_data=report_data(LOG_KEY, SEALING, NONCE))
    assert _reason(_check(amd, forged)).startswith("report_signature: ")


def test_no_chain_is_a_failed_check_naming_it(amd: FakeAmd) -> None:
    got = check_own(
        "sev-snp",
        _bound(amd),
        b"",
        log_key=LOG_KEY,
        sealing_public=SEALING,
        nonce=NONCE,
        now=NOW,
        trusted=_trusted(amd),
    )
    assert not got.attested
    assert got.reason is not None and _reason(got).startswith(
        "evidence.certs: no certificate chain to check the sev-snp report with"
    )


def test_policy_bits_and_tcb_are_the_policy_s(amd: FakeAmd) -> None:
    debug = _bound(amd, policy=0x30000 | 1 << 19)
    assert _reason(_check(amd, debug)) == "policy.debug: a debug guest"
    allowed = _check(amd, debug, policy=Policy(allow_debug=True))
    assert allowed.attested
    high = Policy(min_tcb={"Turin": {"snp": 200}})
    assert _reason(_check(amd, _bound(amd), policy=high)).startswith("policy.min_tcb: ")


def test_an_unknown_kind_or_unreadable_report_fails(amd: FakeAmd) -> None:
    got = check_own("sgx", b"x", b"", log_key=LOG_KEY, sealing_public=SEALING, nonce=NONCE, now=NOW)
    assert got.reason == "evidence: 'sgx' is not a TEE this appliance knows (sev-snp, tdx)"
    short = _check(amd, b"\x05" + bytes(100))
    assert not short.attested


def test_gpu_evidence_that_does_not_check_out_fails_the_whole(amd: FakeAmd) -> None:
    got = _check(amd, _bound(amd), gpu=GpuEvidence(b"not spdm", b"", NONCE))
    assert not got.attested
    assert _reason(got).startswith("gpu.")
    cpu = [c for c in got.checks if not c.name.startswith("gpu.")]
    assert all(c.ok is not False for c in cpu)
