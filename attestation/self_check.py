"""The appliance's check of its own evidence, at boot.

Once it has its boot report and the report's chain (the host's certificate table, or AMD's
KDS through the proxy), the appliance holds them to the same verifiers and policy an outsider
uses (``attestation.evidence.verify_evidence``, ``attestation.policy.apply_policy``):
signature and chain, TCB, the guest policy bits, and the GPU's evidence when there is one.
It then checks that the report carries the binding of its own keys (``report_data`` is
``attestation.binding`` v1 over its log key and sealing key, with the boot's nonce).

One thing it cannot check: its own launch digest. A guest that compared its measurement
with a value it holds would compare it with a value the measured image itself supplied, so
the check would prove nothing; only an outsider, holding the published values, can. The
result lists that as a check not made (``ok`` None), never a pass.

A failed check (no evidence at all, on a machine with no TEE or with the test key source,
among them) makes the appliance refuse pinned sessions unless its boot options allow
unattested operation (``egress_proxy.tee_status``); every reproducibility block then says
``tee_type: none``. ``docs/attestation.md``, "The appliance checks itself".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from attestation.binding import report_data
from attestation.policy import Policy, apply_policy
from attestation.verdict import Check, EvidenceKind, all_made_held

if TYPE_CHECKING:
    from attestation.evidence import TrustedRoots

__all__ = ["GpuEvidence", "SelfCheck", "TeeType", "check_own"]

TeeType = Literal["sev-snp", "tdx", "none"]
_VERIFIER: dict[str, EvidenceKind] = {"sev-snp": "snp", "tdx": "tdx"}


@dataclass(frozen=True)
class GpuEvidence:
    """The GPU's evidence (SPDM), its certificate chain (PEM) and the nonce it signed."""

    evidence: bytes
    certs: bytes
    nonce: bytes


@dataclass(frozen=True)
class SelfCheck:
    """What the appliance found. ``tee_type``: the TEE it showed itself to run in, or
    ``none`` when it could not; ``reason``: the first failing check, None when attested."""

    attested: bool
    tee_type: TeeType
    checks: list[Check] = field(default_factory=list)
    reason: str | None = None

    def summary(self) -> str:
        """One line for the console."""
        if not self.attested:
            return f"FAILED: {self.reason}"
        made = sum(1 for c in self.checks if c.ok is not None)
        skipped = len(self.checks) - made
        return f"attested ({self.tee_type}): {made} checks held, {skipped} not made here"


def _failed(reason: str, checks: list[Check]) -> SelfCheck:
    return SelfCheck(False, "none", checks, reason)


def check_own(
    kind: str | None,
    report: bytes | None,
    certs: bytes | list[bytes],
    *,
    log_key: str,
    sealing_public: bytes,
    nonce: bytes,
    now: datetime,
    policy: Policy | None = None,
    collateral: bytes | None = None,
    trusted: TrustedRoots | None = None,
    gpu: GpuEvidence | None = None,
    absent: str = "no TEE report was collected at boot",
) -> SelfCheck:
    """Check this appliance's own boot evidence: ``report`` of ``kind`` (``sev-snp`` or
    ``tdx``; None with no report: ``absent`` says why), its chain ``certs`` (PEM; SNP) or
    ``collateral`` (TDX), held to ``policy`` (the defaults when None) at ``now``, bound to
    ``log_key`` and ``sealing_public`` with ``nonce``; the GPU's evidence too when given.
    ``trusted``: roots to trust in place of AMD's (tests: the TEE double's)."""
    from attestation.evidence import CertsNeeded, verify_evidence

    policy = policy or Policy()
    if kind is None or not report:
        reason = f"no evidence: {absent}"
        return _failed(reason, [Check("evidence", False, reason)])
    verifier = _VERIFIER.get(kind)
    if verifier is None:
        reason = f"evidence: {kind!r} is not a TEE this appliance knows (sev-snp, tdx)"
        return _failed(reason, [Check("evidence", False, reason)])
    blobs = [certs] if isinstance(certs, bytes) else list(certs)
    blobs = [b for b in blobs if b]
    try:
        verdict = verify_evidence(
            verifier,
            report,
            certs=blobs,
            collateral=collateral,
            now=now,
            trusted=trusted,
        )
    except CertsNeeded as exc:
        reason = f"evidence.certs: no certificate chain to check the {kind} report with ({exc})"
        return _failed(reason, [Check("evidence.certs", False, reason)])
    except ValueError as exc:
        reason = f"evidence: the {kind} report cannot be checked: {exc}"
        return _failed(reason, [Check("evidence", False, reason)])
    apply_policy(verdict, policy)
    checks = list(verdict.checks)
    facts = verdict.facts
    expected = report_data(log_key, sealing_public, nonce)
    carried = str(facts.get("report_data", ""))
    if not carried:
        checks.append(Check("binding", False, "the report's report_data could not be read"))
    else:
        bound = carried == expected.hex()
        checks.append(
            Check(
                "binding",
                bound,
                "report_data is the binding (v1) of this appliance's log key and sealing key,"
                " with this boot's nonce"
                if bound
                else f"report_data {carried[:32]}… is not this appliance's binding"
                f" {expected.hex()[:32]}…",
            )
        )
    measured = facts.get("measurement") or facts.get("mrtd")
    checks.append(
        Check(
            "launch_digest",
            None,
            f"{measured or 'the launch digest'} is not compared here: only outsiders can,"
            " against the published values",
        )
    )
    if gpu is not None:
        checks.extend(_gpu(gpu, policy, now))
    if not all_made_held(checks):
        first = next(c for c in checks if c.ok is False)
        return _failed(f"{first.name}: {first.detail}", checks)
    tee: TeeType = "sev-snp" if kind == "sev-snp" else "tdx"
    return SelfCheck(True, tee, checks, None)


def _gpu(gpu: GpuEvidence, policy: Policy, now: datetime) -> list[Check]:
    """The GPU's checks, named ``gpu.*``; a verifier's refusal to read it is one failed
    check."""
    from attestation.evidence import verify_evidence

    try:
        verdict = verify_evidence(
            "nvidia",
            gpu.evidence,
            certs=[gpu.certs] if gpu.certs else [],
            collateral=None,
            now=now,
            nonce=gpu.nonce,
        )
    except ValueError as exc:
        return [Check("gpu.evidence", False, f"the GPU's evidence cannot be checked: {exc}")]
    apply_policy(verdict, policy)
    return [Check(f"gpu.{c.name}", c.ok, c.detail) for c in verdict.checks]
