"""attestation.policy as a unit: ``apply_policy`` on verdicts whose facts are written out here
(what the SNP, TDX and NVIDIA verifiers put there), every ``policy.*`` check word for word,
each rule at its edge; and a policy file's members, each refusal naming what is wrong.
The verifiers that read the facts from real evidence are tested in test_snp_policy.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from attestation.policy import (
    REASONS,
    SNP_TCB_FLOOR,
    Policy,
    PolicyError,
    apply_policy,
    load_policy,
)
from attestation.verdict import Verdict

Row = tuple[str, bool | None, str]
MILAN_OK = {"bl": 3, "tee": 0, "snp": 8, "ucode": 115}


def _apply(
    kind: str, facts: dict[str, Any], policy: Policy | None = None, *, before: list[Row] = ()
) -> list[Row]:
    """The checks ``apply_policy`` adds to a verdict holding ``facts`` (and ``before``)."""
    verdict = Verdict(kind, facts=facts)  # type: ignore[arg-type]
    for name, ok, detail in before:
        verdict.add(name, ok, detail)
    apply_policy(verdict, policy or Policy())
    return [(c.name, c.ok, c.detail) for c in verdict.checks[len(before) :]]


def _one(name: str, rows: list[Row]) -> tuple[bool | None, str]:
    [row] = [r for r in rows if r[0] == name]
    return row[1], row[2]


def _snp_facts(**more: Any) -> dict[str, Any]:
    """An SNP report's facts that meet the default policy (a Milan at its floor)."""
    facts: dict[str, Any] = {
        "vmpl": 0,
        "abi": "0.0",
        "firmware": "1.52.4",
        "product": "Milan",
        "reported_tcb": dict(MILAN_OK),
        "committed_tcb": dict(MILAN_OK),
        "launch_tcb": dict(MILAN_OK),
    }
    facts.update(more)
    return facts


# --- debug, measurement, report_data ------------------------------------------------------


def test_a_debug_guest_is_refused_unless_the_policy_allows_it() -> None:
    allow = Policy(allow_debug=True)
    assert _apply("tdx", {"debug": True, "tcb_status": "UpToDate"})[0] == (
        "policy.debug",
        False,
        "a debug guest",
    )
    assert _apply("tdx", {"debug": 1, "tcb_status": "UpToDate"}, allow)[0] == (
        "policy.debug",
        True,
        "a debug guest (allowed by the policy)",
    )
    for policy in (Policy(), allow):
        assert _apply("tdx", {"debug": 0, "tcb_status": "UpToDate"}, policy)[0] == (
            "policy.debug",
            True,
            "not a debug guest",
        )
    assert "policy.debug" not in [r[0] for r in _apply("tdx", {"tcb_status": "UpToDate"})]


def test_the_measurement_is_among_the_accepted_snp_measurement_or_tdx_mrtd() -> None:
    policy = Policy(measurements=("aa", "bb"))
    assert _one("policy.measurement", _apply("nvidia", {"measurement": "bb"}, policy)) == (
        True,
        "bb is among the accepted measurements",
    )
    assert _one("policy.measurement", _apply("nvidia", {"mrtd": "aa"}, policy)) == (
        True,
        "aa is among the accepted measurements",
    )
    assert _one("policy.measurement", _apply("nvidia", {"measurement": "cc"}, policy)) == (
        False,
        "cc is not among the accepted measurements",
    )
    assert _one("policy.measurement", _apply("nvidia", {}, policy)) == (
        False,
        "None is not among the accepted measurements",
    )
    assert "policy.measurement" not in [r[0] for r in _apply("nvidia", {"measurement": "cc"})]


def test_report_data_begins_with_the_expected_prefix() -> None:
    prefix = "ab" * 20  # 40 digits: the detail shows the first 32
    policy = Policy(report_data=prefix)
    shown = "ab" * 16 + "…"
    assert _one("policy.report_data", _apply("snp", {"report_data": prefix + "00"}, policy)) == (
        True,
        f"report_data begins with the expected {shown}",
    )
    assert _one("policy.report_data", _apply("snp", {"report_data": "00" + prefix}, policy)) == (
        False,
        f"report_data is not the expected {shown}",
    )
    assert _one("policy.report_data", _apply("snp", {}, policy))[0] is False
    assert _one("policy.report_data", _apply("snp", {}, Policy(report_data="")))[0] is True


# --- nonces --------------------------------------------------------------------------------


def test_a_gpu_nonce_is_compared_as_given() -> None:
    nonce = "ab" * 32
    policy = Policy(nonce=nonce)
    assert _one("policy.nonce", _apply("nvidia", {"nonce": nonce}, policy)) == (
        True,
        "the expected nonce",
    )
    assert _one("policy.nonce", _apply("nvidia", {"nonce": "cd" * 32}, policy)) == (
        False,
        f"nonce {'cd' * 32} is not the expected one",
    )
    assert _apply("nvidia", {}, policy) == [("policy.nonce", None, "the evidence carries no nonce")]


def test_snp_and_tdx_carry_the_nonce_in_report_datas_second_half() -> None:
    first = "11" * 32
    short = "abcd"  # zero-padded to 32 bytes
    padded = "abcd" + "00" * 30
    assert _one(
        "policy.nonce", _apply("snp", {"report_data": first + padded}, Policy(nonce=short))
    ) == (
        True,
        "the expected nonce",
    )
    assert _one(
        "policy.nonce", _apply("snp", {"report_data": padded + first}, Policy(nonce=short))
    ) == (
        False,
        f"nonce {first} is not the expected one",
    )
    exact = "ef" * 32  # 32 bytes: as it is
    assert _one("policy.nonce", _apply("snp", {"report_data": first + exact}, Policy(nonce=exact)))[
        0
    ]
    long = "ef" * 33  # longer than 32 bytes: its SHA-256
    digest = hashlib.sha256(bytes.fromhex(long)).hexdigest()
    assert _one("policy.nonce", _apply("snp", {"report_data": first + digest}, Policy(nonce=long)))[
        0
    ]
    assert not _one("policy.nonce", _apply("snp", {"report_data": first + long[:64]}, Policy(nonce=long)))[0]  # fmt: skip


def test_gpu_evidence_needs_a_nonce_unless_the_policy_waives_it() -> None:
    refused = (
        "policy.nonce",
        False,
        "no nonce was given (--nonce HEX or the policy's nonce): the evidence's freshness is "
        "unknown, so it could be replayed; require_nonce: false accepts that",
    )
    waived = (
        "policy.nonce",
        None,
        "no nonce was given, and the policy does not require one (require_nonce: false)",
    )
    assert _apply("nvidia", {}) == [refused]
    assert _apply("nvidia", {}, Policy(require_nonce=False)) == [waived]
    # the verifier's own nonce check, made (held or not), decides
    for ok in (True, False):
        assert _apply("nvidia", {}, before=[("nonce", ok, "")]) == []
    # not made, or another check made: still no nonce
    assert _apply("nvidia", {}, before=[("nonce", None, "")]) == [refused]
    assert _apply("nvidia", {}, before=[("signature", True, "")]) == [refused]
    # SNP and TDX evidence: no nonce rule without a nonce
    assert "policy.nonce" not in [r[0] for r in _apply("snp", _snp_facts())]


# --- SNP -----------------------------------------------------------------------------------


def test_the_default_policy_accepts_a_milan_at_its_floor_saying_why() -> None:
    assert _apply("snp", _snp_facts()) == [
        ("policy.migration_agent", True, "no migration agent (MIGRATE_MA clear)"),
        ("policy.vmpl", True, "VMPL 0 (at most the maximum 0)"),
        ("policy.abi", True, "guest policy ABI 0.0 is at least 0.0 and within the firmware 1.52.4"),
        ("policy.min_tcb", True, "REPORTED_TCB meets the Milan minimum"),
        ("policy.min_committed_tcb", True, "COMMITTED_TCB meets the Milan minimum"),
        ("policy.min_launch_tcb", True, "LAUNCH_TCB meets the Milan minimum"),
    ]


def test_no_snp_rules_for_a_report_that_did_not_parse() -> None:
    assert _apply("snp", {"debug": False}) == [("policy.debug", True, "not a debug guest")]


def test_the_crl_is_required_only_when_the_policy_says_so() -> None:
    policy = Policy(require_crl=True)
    missing = (
        False,
        "revocation was not checked (no --crl) and the policy requires it (require_crl)",
    )
    assert _one("policy.crl", _apply("snp", {}, policy)) == missing
    assert (
        _one("policy.crl", _apply("snp", {}, policy, before=[("chain.revocation", None, "")]))
        == missing
    )
    assert _one("policy.crl", _apply("snp", {}, policy, before=[("other", True, "")])) == missing
    for ok in (True, False):  # checked: its own check says whether it held
        rows = _apply("snp", {}, policy, before=[("chain.revocation", ok, "")])
        assert _one("policy.crl", rows) == (True, "AMD's CRL was checked")
    assert "policy.crl" not in [r[0] for r in _apply("snp", _snp_facts())]


def test_a_migration_agent_is_refused_unless_allowed() -> None:
    with_ma = _snp_facts(migrate_ma=True)
    assert _one("policy.migration_agent", _apply("snp", with_ma)) == (
        False,
        "the guest policy allows a migration agent (MIGRATE_MA, bit 18)",
    )
    assert _one(
        "policy.migration_agent", _apply("snp", with_ma, Policy(allow_migration_agent=True))
    ) == (
        True,
        "the guest policy allows a migration agent (MIGRATE_MA, bit 18) (allowed by the policy)",
    )
    assert _one(
        "policy.migration_agent", _apply("snp", _snp_facts(), Policy(allow_migration_agent=True))
    ) == (
        True,
        "no migration agent (MIGRATE_MA clear)",
    )


def test_vmpl_at_most_the_maximum_or_among_the_allowed() -> None:
    assert _one("policy.vmpl", _apply("snp", _snp_facts(vmpl=1))) == (
        False,
        "VMPL 1 (above the maximum 0)",
    )
    assert _one("policy.vmpl", _apply("snp", _snp_facts(vmpl=2), Policy(max_vmpl=2))) == (
        True,
        "VMPL 2 (at most the maximum 2)",
    )
    allowed = Policy(allowed_vmpl=(0, 2), max_vmpl=3)
    assert _one("policy.vmpl", _apply("snp", _snp_facts(vmpl=2), allowed)) == (
        True,
        "VMPL 2 (among the allowed: 0, 2)",
    )
    assert _one("policy.vmpl", _apply("snp", _snp_facts(vmpl=1), allowed)) == (
        False,
        "VMPL 1 (not among the allowed: 0, 2)",
    )


def test_the_abi_is_at_least_the_minimum_and_no_newer_than_the_firmware() -> None:
    def abi(abi: str | None, firmware: str | None, min_abi: str = "0.0") -> tuple[bool | None, str]:
        facts = _snp_facts()
        for key, value in (("abi", abi), ("firmware", firmware)):
            if value is None:
                del facts[key]
            else:
                facts[key] = value
        return _one("policy.abi", _apply("snp", facts, Policy(min_abi=min_abi)))

    assert abi(None, None) == (
        True,
        "guest policy ABI 0.0 is at least 0.0 and within the firmware 0.0.0",
    )
    assert abi("1.55", "1.55.40", "1.55") == (
        True,
        "guest policy ABI 1.55 is at least 1.55 and within the firmware 1.55.40",
    )
    # numbers, not text: 1.10 is above 1.9
    assert abi("1.9", "1.55.40", "1.10") == (
        False,
        "guest policy ABI 1.9 below the minimum 1.10 (min_abi)",
    )
    assert abi("1.56", "1.55.40") == (
        False,
        "guest policy ABI 1.56 newer than the firmware 1.55.40 that signed the report implements",
    )
    assert abi("2.0", "1.55.40", "3.0") == (
        False,
        "guest policy ABI 2.0 below the minimum 3.0 (min_abi); newer than the firmware 1.55.40 "
        "that signed the report implements",
    )


def test_each_tcb_is_held_to_its_products_floor_naming_what_is_low() -> None:
    low = dict(MILAN_OK, snp=7, ucode=114)
    rows = _apply("snp", _snp_facts(reported_tcb=low, launch_tcb={"bl": 3}))
    assert _one("policy.min_tcb", rows) == (
        False,
        "REPORTED_TCB below the Milan minimum: snp 7 < 8, ucode 114 < 115",
    )
    assert _one("policy.min_committed_tcb", rows)[0] is True
    assert _one("policy.min_launch_tcb", rows) == (
        False,
        "LAUNCH_TCB below the Milan minimum: snp None < 8, ucode None < 115",
    )
    # exactly the floor passes; no TCB at all is below it
    assert (
        _one("policy.min_committed_tcb", _apply("snp", _snp_facts(committed_tcb=None)))[0] is False
    )


def test_a_floor_of_one_refuses_zero_and_a_missing_part() -> None:
    one = Policy(min_tcb={"*": {"tee": 1, "fmc": 1}})
    assert _one("policy.min_tcb", _apply("snp", _snp_facts(), one)) == (
        False,
        "REPORTED_TCB below the any product minimum: tee 0 < 1, fmc None < 1",
    )


def test_a_tcb_floor_for_any_product_or_none() -> None:
    star = Policy(min_tcb={"*": {"snp": 9}})
    assert _one("policy.min_tcb", _apply("snp", _snp_facts(), star)) == (
        False,
        "REPORTED_TCB below the any product minimum: snp 8 < 9",
    )
    both = Policy(min_tcb={"*": {"snp": 9}, "Milan": {"snp": 8}})
    assert _one("policy.min_tcb", _apply("snp", _snp_facts(), both)) == (
        True,
        "REPORTED_TCB meets the Milan minimum",
    )
    unknown = _snp_facts(product="Rome")
    assert _one("policy.min_tcb", _apply("snp", unknown)) == (
        None,
        "the policy states no minimum REPORTED_TCB for this product",
    )
    assert _one(
        "policy.min_launch_tcb",
        _apply("snp", _snp_facts(product="Genoa-B1"), Policy(min_launch_tcb={"Turin": {"snp": 1}})),
    ) == (
        None,
        "the policy states no minimum LAUNCH_TCB for Genoa",
    )
    assert "policy.min_tcb" not in [r[0] for r in _apply("snp", unknown, Policy(min_tcb={}))]


def test_smt_and_single_socket_only_when_the_policy_asks() -> None:
    names = [r[0] for r in _apply("snp", _snp_facts(smt_enabled=True))]
    assert "policy.smt" not in names and "policy.single_socket" not in names
    no_smt = Policy(allow_smt=False)
    assert _one("policy.smt", _apply("snp", _snp_facts(smt_enabled=True), no_smt)) == (
        False,
        "SMT is on in the host (PLATFORM_INFO bit 0) and the policy refuses it (allow_smt)",
    )
    assert _one("policy.smt", _apply("snp", _snp_facts(), no_smt)) == (
        True,
        "SMT is off in the host",
    )
    single = Policy(require_single_socket=True)
    assert _one("policy.single_socket", _apply("snp", _snp_facts(single_socket=True), single)) == (
        True,
        "the guest policy requires a single socket (bit 20)",
    )
    assert _one("policy.single_socket", _apply("snp", _snp_facts(), single)) == (
        False,
        "the guest policy does not require a single socket (bit 20 clear)",
    )


@pytest.mark.parametrize(
    ("member", "size"), [("host_data", 64), ("id_key_digest", 96), ("author_key_digest", 96)]
)
def test_host_data_and_the_id_block_keys_when_named(member: str, size: int) -> None:
    expected, other = "a" * size, "b" * size
    policy = Policy(**{member: expected})
    assert _one(f"policy.{member}", _apply("snp", _snp_facts(**{member: expected}), policy)) == (
        True,
        f"{member} is the expected {'a' * 16}…",
    )
    assert _one(f"policy.{member}", _apply("snp", _snp_facts(**{member: other}), policy)) == (
        False,
        f"{member} {other} is not the expected {expected}",
    )
    assert _one(f"policy.{member}", _apply("snp", _snp_facts(), policy)) == (
        False,
        f"{member}  is not the expected {expected}",
    )
    assert f"policy.{member}" not in [r[0] for r in _apply("snp", _snp_facts(**{member: other}))]


# --- TDX -----------------------------------------------------------------------------------


def test_a_tdx_quote_without_collateral_is_refused_unless_quote_level_is_allowed() -> None:
    not_checked = ("policy.tcb_status", None, "no TCB status: verify with the collateral")
    assert _apply("tdx", {}) == [
        (
            "policy.quote_level",
            False,
            "no collateral: the quote's signatures and PCK chain were checked, but not its TCB "
            "status nor revocation; give --collateral (or allow_quote_level: true)",
        ),
        not_checked,
    ]
    assert _apply("tdx", {}, Policy(allow_quote_level=True)) == [
        (
            "policy.quote_level",
            True,
            "quote-level verification, allowed by the policy (allow_quote_level): the TCB "
            "status and revocation were NOT checked",
        ),
        not_checked,
    ]


def test_the_tdx_tcb_status_is_among_the_accepted_naming_the_advisories() -> None:
    assert _apply("tdx", {"tcb_status": "UpToDate"}) == [
        ("policy.tcb_status", True, "TCB UpToDate")
    ]
    late = {"tcb_status": "OutOfDate", "advisory_ids": ["INTEL-SA-00837", "INTEL-SA-00960"]}
    assert _apply("tdx", late, Policy(tcb_status=("UpToDate", "SWHardeningNeeded"))) == [
        (
            "policy.tcb_status",
            False,
            "TCB OutOfDate (advisories INTEL-SA-00837, INTEL-SA-00960); accepted: UpToDate, "
            "SWHardeningNeeded",
        )
    ]
    assert _apply("tdx", late, Policy(tcb_status=("OutOfDate",))) == [
        ("policy.tcb_status", True, "TCB OutOfDate (advisories INTEL-SA-00837, INTEL-SA-00960)")
    ]


# --- the policy file -----------------------------------------------------------------------


def test_every_member_has_a_reason_and_the_floors_are_copies() -> None:
    assert set(REASONS) == set(Policy.model_fields)
    policy = Policy()
    assert policy.min_tcb == policy.min_committed_tcb == policy.min_launch_tcb == SNP_TCB_FLOOR
    policy.min_tcb["Milan"]["snp"] = 99  # a policy's own table: the module's floor is unchanged
    assert SNP_TCB_FLOOR["Milan"]["snp"] == 8 and Policy().min_launch_tcb["Milan"]["snp"] == 8


def test_a_flat_tcb_map_reads_as_any_product() -> None:
    assert Policy(min_tcb={"bl": 1, "snp": 2}).min_tcb == {"*": {"bl": 1, "snp": 2}}  # type: ignore[dict-item]
    assert Policy(min_committed_tcb={}).min_committed_tcb == {}
    assert Policy(min_launch_tcb={"Turin": {"fmc": 0, "ucode": 255}}).min_launch_tcb == {
        "Turin": {"fmc": 0, "ucode": 255}
    }


@pytest.mark.parametrize(
    ("member", "value", "message"),
    [
        ("min_tcb", {"Rome": {"snp": 1}}, "'Rome' is not one of Milan, Genoa, Turin, *"),
        (
            "min_launch_tcb",
            {"Genoa": {"microcode": 1}},
            "Genoa: 'microcode' is not one of fmc, bl, tee, snp, ucode",
        ),
        ("min_committed_tcb", {"snp": 256}, "*: snp 256 is not an SVN (0..255)"),
        ("min_tcb", {"Milan": {"bl": -1}}, "Milan: bl -1 is not an SVN (0..255)"),
        ("measurements", ["ab", "AB"], "'AB' is not lower-case hex"),
        ("measurements", [""], "'' is not lower-case hex"),
        ("measurements", ["0g"], "'0g' is not lower-case hex"),
    ],
)
def test_a_wrong_member_is_refused_naming_it(member: str, value: Any, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        Policy.model_validate({member: value})
    [error] = info.value.errors()
    assert (error["loc"], error["msg"]) == ((member,), f"Value error, {message}")


def test_a_policy_file_is_read_and_its_faults_named(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"allow_smt": False, "measurements": ["ab"]}))
    assert load_policy(good) == Policy(allow_smt=False, measurements=("ab",))
    assert load_policy(str(good)).allow_smt is False

    def fault(text: str | None) -> str:
        path = tmp_path / "bad.json"
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)
        with pytest.raises(PolicyError) as info:
            load_policy(path)
        return str(info.value)

    bad = tmp_path / "bad.json"
    assert fault('{"bogus": 1}') == f"policy {bad}: bogus: Extra inputs are not permitted"
    assert fault("[1]") == (
        f"policy {bad}: (the file): Input should be a valid dictionary or instance of Policy"
    )
    assert fault('{"min_tcb": {"Milan": {"bl": 300}}}') == (
        f"policy {bad}: min_tcb: Value error, Milan: bl 300 is not an SVN (0..255)"
    )
    assert fault('{"min_tcb": {"Milan": {"bl": "x"}}}').startswith(
        f"policy {bad}: min_tcb.Milan.bl: "
    )
    assert fault("{").startswith(f"policy {bad}: Expecting property name")
    assert fault(None).startswith(f"policy {bad}: [Errno 2] No such file or directory")
