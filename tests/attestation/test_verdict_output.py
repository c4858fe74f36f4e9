"""What a verdict shows a person: its JSON and its one-line-per-check text, exactly.

``affidavit attest`` prints these; an auditor (or a script) reads the keys and the marks,
so a renamed key or a changed mark is a broken interface, not a cosmetic change.
"""

from __future__ import annotations

from attestation.verdict import Check, Verdict


def test_a_check_as_json_and_as_a_line() -> None:
    held = Check("report_signature", True, "verifies")
    failed = Check("chain.validity", False, "expired")
    skipped = Check("crl", None, "offline")
    assert held.json() == {"name": "report_signature", "ok": True, "detail": "verifies"}
    assert failed.json() == {"name": "chain.validity", "ok": False, "detail": "expired"}
    assert skipped.json() == {"name": "crl", "ok": None, "detail": "offline"}
    assert held.line() == "ok   report_signature: verifies"
    assert failed.line() == "FAIL chain.validity: expired"
    assert skipped.line() == "skip crl: offline"


def test_a_verdict_as_json() -> None:
    verdict = Verdict("snp", facts={"vmpl": 0})
    made = verdict.add("report_signature", True, "verifies")
    verdict.extend([Check("crl", None, "offline"), Check("vek.tcb", False, "differs")])
    assert verdict.checks[0] is made and [c.name for c in verdict.checks] == [
        "report_signature",
        "crl",
        "vek.tcb",
    ]
    assert verdict.json() == {
        "kind": "snp",
        "verdict": "reject",
        "checks": [
            {"name": "report_signature", "ok": True, "detail": "verifies"},
            {"name": "crl", "ok": None, "detail": "offline"},
            {"name": "vek.tcb", "ok": False, "detail": "differs"},
        ],
        "facts": {"vmpl": 0},
    }
    assert [c.name for c in verdict.not_checked] == ["crl"]
    assert [c.name for c in verdict.failed] == ["vek.tcb"]
