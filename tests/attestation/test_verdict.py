"""A verdict accepts only when something was checked and every check made held."""

from __future__ import annotations

from attestation.verdict import Check, Verdict, all_made_held


def test_nothing_checked_is_not_accepted() -> None:
    assert Verdict("snp").accepted is False
    assert all_made_held([]) is False


def test_only_skipped_checks_are_not_accepted() -> None:
    verdict = Verdict("tdx")
    verdict.add("collateral", None, "offline: not fetched")
    verdict.add("tcb", None, "no collateral")
    assert verdict.accepted is False
    assert verdict.json()["verdict"] == "reject"


def test_a_made_check_that_held_with_skipped_ones_is_accepted() -> None:
    verdict = Verdict("snp")
    verdict.add("report_signature", True, "verified")
    verdict.add("crl", None, "offline")
    assert verdict.accepted is True
    assert verdict.json()["verdict"] == "accept"


def test_one_failed_check_rejects() -> None:
    checks = [Check("a", True, ""), Check("b", False, "bad"), Check("c", None, "skipped")]
    assert all_made_held(checks) is False
    verdict = Verdict("nvidia", checks=checks)
    assert verdict.accepted is False and verdict.failed == [checks[1]]
