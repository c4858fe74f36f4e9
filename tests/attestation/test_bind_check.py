"""``attest bind-check``'s own rules, on real bundles written by the real log.

The evidence verifier is a double (named so): no TEE exists here, so it answers with a
verdict carrying the ``report_data`` the test chose, and records the time it was asked to
judge at. Everything else (the log, its checkpoints, the bundle) is real.

- ``report_data`` must be 64 bytes whose whole first half is the binding digest: one wrong
  byte anywhere in it, or a report_data of the digest alone, binds nothing;
- evidence is judged at its entry's time only when a signed checkpoint covers that entry.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from attestation.bind_check import check_bundle
from attestation.binding import binding_digest, report_data
from attestation.verdict import Check, Verdict
from record.bundle import export_stream
from record.log import Log
from record.seal import KeyPair

STREAM = "session-bound"
REPORT = "snp-20261201T120000Z.report"


@dataclass
class VerifierDouble:
    """Stands in for the SEV-SNP verifier (no TEE here): accepts the report's signature and
    reports ``data`` as its ``report_data``."""

    data: bytes
    asked_at: list[datetime] = field(default_factory=list)

    def __call__(self, kind: str, report: bytes, **kwargs: Any) -> Verdict:
        self.asked_at.append(kwargs["now"])
        verdict = Verdict("snp", facts={"report_data": self.data.hex()})
        verdict.add("report_signature", True, "double: no TEE here")
        return verdict


@dataclass
class Recorded:
    store: Path
    user: KeyPair
    log_key: str
    sealing: bytes
    evidence_seq: int


@pytest.fixture
def recorded(tmp_path: Path) -> Recorded:
    user, appliance = KeyPair.generate(), KeyPair.generate()
    store = tmp_path / "record.db"
    with Log.open(store, appliance_key=appliance) as log:
        log.open_stream(STREAM, [user.recipient, appliance.recipient])
        kept = log.archive_evidence(STREAM, "sev-snp", REPORT, b"a report, as collected")
        log_key = log.log_key()
    sealing = appliance.recipient.public.public_bytes_raw()
    return Recorded(store, user, log_key, sealing, kept.seq)


def _check(recorded: Recorded, tmp_path: Path, data: bytes) -> tuple[dict[str, Check], Any]:
    bundle = tmp_path / "bundle"
    export_stream(recorded.store, STREAM, bundle)
    verify = VerifierDouble(data)
    checks, _ = check_bundle(bundle, recorded.user, verify=verify)
    return {c.name: c for c in checks}, verify


def test_the_binding_and_a_nonce_are_accepted(recorded: Recorded, tmp_path: Path) -> None:
    data = report_data(recorded.log_key, recorded.sealing, bytes(range(32)))
    checks, verify = _check(recorded, tmp_path, data)
    assert all(c.ok for c in checks.values()), [c.line() for c in checks.values()]
    assert checks[f"binding.{REPORT}"].ok is True
    assert len(verify.asked_at) == 1


@pytest.mark.parametrize("position", [0, 15, 16, 31])
def test_one_wrong_byte_anywhere_in_the_binding_half_binds_nothing(
    recorded: Recorded, tmp_path: Path, position: int
) -> None:
    good = report_data(recorded.log_key, recorded.sealing)
    data = bytearray(good)
    data[position] ^= 0x01
    checks, _ = _check(recorded, tmp_path, bytes(data))
    assert checks[f"binding.{REPORT}"].ok is False


@pytest.mark.parametrize("length", [32, 63, 65])
def test_a_report_data_that_is_not_64_bytes_binds_nothing(
    recorded: Recorded, tmp_path: Path, length: int
) -> None:
    digest = binding_digest(recorded.log_key, recorded.sealing)
    data = (digest + bytes(64))[:length]
    checks, _ = _check(recorded, tmp_path, data)
    assert checks[f"binding.{REPORT}"].ok is False


def _unsign_from(store: Path, size: int) -> None:
    """A store whose checkpoints stop before ``size`` entries (as one written before every
    commit was signed, or with a forged tail)."""
    conn = sqlite3.connect(store, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("DROP TRIGGER checkpoints_no_delete")
        conn.execute("DELETE FROM checkpoints WHERE size >= ?", (size,))
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_evidence_in_an_unsigned_tail_is_not_judged_at_its_claimed_time(
    recorded: Recorded, tmp_path: Path
) -> None:
    _unsign_from(recorded.store, recorded.evidence_seq + 1)
    data = report_data(recorded.log_key, recorded.sealing)
    checks, verify = _check(recorded, tmp_path, data)
    evidence = checks[f"evidence.{REPORT}"]
    assert evidence.ok is False
    assert "covered by no signed checkpoint" in evidence.detail
    assert verify.asked_at == []  # never judged at a time nothing signed
    assert checks["bundle"].ok is False  # and the bundle itself names the unsigned tail
    assert "unsigned_tail" in checks["bundle"].detail
