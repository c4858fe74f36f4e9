"""The SEV-SNP default policy, rule by rule: each check is shown a report that has that bit
or value set, signed by the test chain (``snp_double``, real crypto), through the real
verifier and ``affidavit attest verify --policy``; and the real vectors keep their manifest
verdicts under the policy each case names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from affidavit.cli import main
from attestation.policy import REASONS, SNP_TCB_FLOOR, Policy, apply_policy
from tests.attestation.snp_double import CHIP_ID, TURIN_TCB, FakeAmd, fake_amd, v5_report
from tests.attestation.test_snp import POSITIVE, VECTORS, _verify

NOW = "2025-06-01T00:00:00Z"
DEBUG, MIGRATE_MA, SINGLE_SOCKET = 1 << 19, 1 << 18, 1 << 20
APPLIANCE = 0x30000  # the appliance's guest policy: SMT allowed, reserved bit 17, ABI 0.0
#: a Turin TCB_VERSION's bytes with only the microcode SVN set (fmc, bl, tee, snp all 0)
LOW_UCODE = bytes([0, 0, 0, 0, 0, 0, 0, 8])


@pytest.fixture(scope="module")
def amd() -> FakeAmd:
    return fake_amd("Turin", TURIN_TCB, CHIP_ID[:8])


def _files(tmp: Path, amd: FakeAmd, report: bytes) -> list[str]:
    (tmp / "report.bin").write_bytes(report)
    (tmp / "vek.der").write_bytes(amd.vek)
    (tmp / "chain.pem").write_bytes(amd.chain)
    (tmp / "ark.pem").write_bytes(amd.ark)
    return [
        "attest", "verify", "--kind", "snp", "--evidence", str(tmp / "report.bin"),
        "--certs", str(tmp / "vek.der"), "--certs", str(tmp / "chain.pem"),
        "--trusted-root", str(tmp / "ark.pem"), "--now", NOW,
    ]  # fmt: skip


def _run(
    tmp: Path, amd: FakeAmd, report: bytes, capsys: pytest.CaptureFixture[str], **policy: Any
) -> tuple[int, dict[str, Any]]:
    """``attest verify --json`` on ``report`` (with ``policy`` as a policy file, if any)."""
    args = _files(tmp, amd, report)
    if policy:
        (tmp / "policy.json").write_text(json.dumps(policy))
        args += ["--policy", str(tmp / "policy.json")]
    code = main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _failed(doc: dict[str, Any]) -> list[str]:
    return [c["name"] for c in doc["checks"] if c["ok"] is False]


def _check(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in doc["checks"] if c["name"] == name)


def test_the_appliances_own_report_passes_every_default(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = _run(tmp_path, amd, v5_report(amd.vek_key), capsys)
    assert code == 0, _failed(doc)
    made = {c["name"]: c["ok"] for c in doc["checks"]}
    for name in (
        "policy.debug", "policy.migration_agent", "policy.vmpl", "policy.abi",
        "policy.min_tcb", "policy.min_committed_tcb", "policy.min_launch_tcb",
    ):  # fmt: skip
        assert made[name] is True, name
    # SMT and single-socket are facts, not rules, unless the policy asks
    assert "policy.smt" not in made and "policy.single_socket" not in made
    facts = doc["facts"]
    assert (facts["smt_enabled"], facts["smt_allowed"], facts["single_socket"]) == (
        True, True, False,
    )  # fmt: skip
    assert facts["abi"] == "0.0" and facts["vmpl"] == 0
    assert made["chain.revocation"] is None  # no CRL: said, not passed


@pytest.mark.parametrize(
    ("fields", "rule", "says"),
    [
        ({"policy": APPLIANCE | DEBUG}, "policy.debug", "a debug guest"),
        ({"policy": APPLIANCE | MIGRATE_MA}, "policy.migration_agent", "MIGRATE_MA"),
        ({"vmpl": 1}, "policy.vmpl", "VMPL 1 (above the maximum 0)"),
        ({"vmpl": 2}, "policy.vmpl", "VMPL 2 (above the maximum 0)"),
        ({"vmpl": 3}, "policy.vmpl", "VMPL 3 (above the maximum 0)"),
        ({"policy": APPLIANCE | 0xFFFF}, "policy.abi", "255.255 newer than the firmware 1.55.21"),
        ({"policy": APPLIANCE | 0x0138}, "policy.abi", "1.56 newer than the firmware 1.55.21"),
        ({"tcbs": {"committed": LOW_UCODE}}, "policy.min_committed_tcb", "ucode 8 < 9"),
        ({"tcbs": {"launch": LOW_UCODE}}, "policy.min_launch_tcb", "ucode 8 < 9"),
    ],
)
def test_each_default_rule_refuses_its_bit_or_value(
    amd: FakeAmd,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fields: dict[str, Any],
    rule: str,
    says: str,
) -> None:
    code, doc = _run(tmp_path, amd, v5_report(amd.vek_key, **fields), capsys)
    assert code == 1
    assert _failed(doc) == [rule]
    assert says in _check(doc, rule)["detail"]


def test_a_reported_tcb_below_the_floor_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """REPORTED_TCB must match the VCEK, so the VCEK is issued for the old TCB too."""
    old = {"fmc": 0, "bl": 0, "tee": 0, "snp": 0, "ucode": 8}
    amd = fake_amd("Turin", old, CHIP_ID[:8])
    report = v5_report(amd.vek_key, tcbs={"reported": LOW_UCODE})
    code, doc = _run(tmp_path, amd, report, capsys)
    assert code == 1 and _failed(doc) == ["policy.min_tcb"]
    assert _check(doc, "vek.tcb")["ok"] is True  # genuine: only the policy refuses it
    assert _check(doc, "policy.min_tcb")["detail"] == (
        "REPORTED_TCB below the Turin minimum: ucode 8 < 9"
    )
    code, doc = _run(tmp_path, amd, report, capsys, min_tcb={"Turin": {"ucode": 8}})
    assert code == 0, _failed(doc)


@pytest.mark.parametrize(
    ("fields", "policy"),
    [
        ({"policy": APPLIANCE | DEBUG}, {"allow_debug": True}),
        ({"policy": APPLIANCE | MIGRATE_MA}, {"allow_migration_agent": True}),
        ({"vmpl": 2}, {"max_vmpl": 2}),
        ({"vmpl": 2}, {"allowed_vmpl": [0, 2]}),
        ({"tcbs": {"launch": LOW_UCODE}}, {"min_launch_tcb": {}}),
        ({"policy": APPLIANCE | 0x0137}, {"min_abi": "1.55"}),  # ABI 1.55, firmware 1.55.21
    ],
)
def test_a_policy_file_overrides_each_default(
    amd: FakeAmd,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fields: dict[str, Any],
    policy: dict[str, Any],
) -> None:
    report = v5_report(amd.vek_key, **fields)
    code, doc = _run(tmp_path, amd, report, capsys, **policy)
    assert code == 0, _failed(doc)


def test_min_abi_refuses_an_older_guest_policy_abi(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = _run(tmp_path, amd, v5_report(amd.vek_key), capsys, min_abi="1.51")
    assert code == 1 and _failed(doc) == ["policy.abi"]
    assert "0.0 below the minimum 1.51" in _check(doc, "policy.abi")["detail"]


def test_vmpl_above_an_explicit_list(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = _run(tmp_path, amd, v5_report(amd.vek_key, vmpl=1), capsys, allowed_vmpl=[0, 2])
    assert code == 1 and _failed(doc) == ["policy.vmpl"]
    assert _check(doc, "policy.vmpl")["detail"] == "VMPL 1 (not among the allowed: 0, 2)"


def test_smt_and_single_socket_are_enforced_only_when_asked(
    amd: FakeAmd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    smt_on = v5_report(amd.vek_key)  # PLATFORM_INFO 0x25: SMT_EN
    code, doc = _run(tmp_path, amd, smt_on, capsys, allow_smt=False)
    assert code == 1 and _failed(doc) == ["policy.smt"]
    assert "SMT is on" in _check(doc, "policy.smt")["detail"]
    smt_off = v5_report(amd.vek_key, platform_info=0x24)
    code, doc = _run(tmp_path, amd, smt_off, capsys, allow_smt=False)
    assert code == 0 and _check(doc, "policy.smt")["ok"] is True
    assert doc["facts"]["smt_enabled"] is False

    code, doc = _run(tmp_path, amd, smt_on, capsys, require_single_socket=True)
    assert code == 1 and _failed(doc) == ["policy.single_socket"]
    single = v5_report(amd.vek_key, policy=APPLIANCE | SINGLE_SOCKET)
    code, doc = _run(tmp_path, amd, single, capsys, require_single_socket=True)
    assert code == 0 and doc["facts"]["single_socket"] is True
    code, doc = _run(tmp_path, amd, single, capsys)  # not asked: a fact only
    assert code == 0 and "policy.single_socket" not in {c["name"] for c in doc["checks"]}


@pytest.mark.parametrize(
    ("member", "right", "wrong"),
    [
        ("host_data", "48" * 32, "49" * 32),
        ("id_key_digest", "4b" * 48, "00" * 48),
        ("author_key_digest", "41" * 48, "42" * 48),
    ],
)
def test_host_data_and_the_id_block_are_checked_when_named(
    amd: FakeAmd,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    member: str,
    right: str,
    wrong: str,
) -> None:
    report = v5_report(amd.vek_key)  # HOST_DATA "H"*32, ID key "K"*48, author "A"*48
    code, doc = _run(tmp_path, amd, report, capsys)
    assert code == 0 and f"policy.{member}" not in {c["name"] for c in doc["checks"]}
    code, doc = _run(tmp_path, amd, report, capsys, **{member: right})
    assert code == 0 and _check(doc, f"policy.{member}")["ok"] is True
    code, doc = _run(tmp_path, amd, report, capsys, **{member: wrong})
    assert code == 1 and _failed(doc) == [f"policy.{member}"]
    assert wrong in _check(doc, f"policy.{member}")["detail"]


@pytest.mark.parametrize(
    ("policy", "names"),
    [
        ({"max_vmpl": 4}, "max_vmpl"),
        ({"min_abi": "1"}, "min_abi"),
        ({"min_tcb": {"Zen": {"snp": 1}}}, "min_tcb"),
        ({"min_tcb": {"Milan": {"microcode": 1}}}, "min_tcb"),
        ({"min_launch_tcb": {"Milan": {"snp": 256}}}, "min_launch_tcb"),
        ({"host_data": "48" * 31}, "host_data"),
        ({"id_key_digest": "4B" * 48}, "id_key_digest"),
        ({"allow_smt": "maybe"}, "allow_smt"),
    ],
)
def test_a_bad_policy_member_is_a_usage_error_naming_it(
    amd: FakeAmd,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    policy: dict[str, Any],
    names: str,
) -> None:
    args = _files(tmp_path, amd, v5_report(amd.vek_key))
    (tmp_path / "policy.json").write_text(json.dumps(policy))
    assert main([*args, "--policy", str(tmp_path / "policy.json")]) == 2
    assert names in capsys.readouterr().err


def test_a_flat_min_tcb_applies_to_every_product() -> None:
    assert Policy(min_tcb={"snp": 8}).min_tcb == {"*": {"snp": 8}}
    assert Policy().min_tcb == SNP_TCB_FLOOR and Policy(min_tcb={}).min_tcb == {}


# --- attest policy --show ------------------------------------------------------------------


def test_policy_show_prints_every_default_with_its_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set(REASONS) == set(Policy.model_fields)  # every member has its reason
    assert main(["attest", "policy", "--show"]) == 0
    out = capsys.readouterr().out
    for name in Policy.model_fields:
        assert f"\n{name} = " in f"\n{out}", name
    assert out.count("    why: ") == len(Policy.model_fields)
    assert "max_vmpl = 0\n    why: SNP: the appliance boots directly" in out
    assert "allow_quote_level = false\n" in out and "require_crl = false\n" in out
    assert main(["attest", "policy", "--show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["policy"] == Policy().model_dump(mode="json")
    members = {m["name"]: m for m in doc["members"]}
    assert members["allow_migration_agent"] == {
        "name": "allow_migration_agent", "value": False, "default": False,
        "from_file": False, "why": REASONS["allow_migration_agent"],
    }  # fmt: skip


def test_policy_show_with_a_file_marks_what_it_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.json"
    path.write_text('{"max_vmpl": 1, "require_crl": true}')
    assert main(["attest", "policy", "--show", "--policy", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"max_vmpl = 1  (from {path})" in out and f"require_crl = true  (from {path})" in out
    assert "allow_debug = false\n" in out
    assert main(["attest", "policy", "--show", "--policy", str(tmp_path / "nope.json")]) == 3
    path.write_text('{"max_vmpl": 9}')
    assert main(["attest", "policy", "--show", "--policy", str(path)]) == 2
    assert "max_vmpl" in capsys.readouterr().err
    assert main(["attest", "policy"]) == 2  # say --show


# --- the real vectors under the policy each case names ------------------------------------


@pytest.fixture(scope="module")
def snp_vectors() -> Path:
    root = VECTORS / "amd-sev-snp"
    if not root.is_dir():
        reason = f"{VECTORS} is absent: the public attestation vectors live in ../shared/vectors"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return root


@pytest.mark.parametrize("name", ["snp-02", "snp-03", "snp-05"])
def test_real_reports_accept_under_the_default_policy(name: str, snp_vectors: Path) -> None:
    verdict = apply_policy(_verify(POSITIVE[name], snp_vectors), Policy())
    assert verdict.accepted, [c.line() for c in verdict.failed]
    made = {c.name for c in verdict.checks if c.ok}
    assert {"policy.debug", "policy.vmpl", "policy.abi", "policy.min_tcb"} <= made


def test_snp01_is_refused_by_the_strict_default_policy(snp_vectors: Path) -> None:
    """The manifest: "DEBUG bit19 = 1 -> a strict policy must REJECT"; its firmware (1.49.3)
    is older than the Milan floor as well."""
    verdict = apply_policy(_verify(POSITIVE["snp-01"], snp_vectors), Policy())
    assert [c.name for c in verdict.failed] == [
        "policy.debug", "policy.min_tcb", "policy.min_committed_tcb", "policy.min_launch_tcb",
    ]  # fmt: skip
    assert "snp 5 < 8" in verdict.failed[1].detail


def test_snp04_from_vmpl1_needs_a_policy_that_allows_it(snp_vectors: Path) -> None:
    """AWS's VLEK-signed report comes from VMPL 1: genuine (the manifest's ACCEPT is the
    signature and chain), refused by the appliance's default (VMPL 0), accepted under a
    policy that allows VMPL 1."""
    default = apply_policy(_verify(POSITIVE["snp-04"], snp_vectors), Policy())
    assert [c.name for c in default.failed] == ["policy.vmpl"]
    allowed = apply_policy(_verify(POSITIVE["snp-04"], snp_vectors), Policy(max_vmpl=1))
    assert allowed.accepted, [c.line() for c in allowed.failed]
