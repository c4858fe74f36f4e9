"""What an auditor accepts, beyond genuine evidence: the policy a verdict is held to.

Genuine evidence from a debug guest, an old TCB or an unexpected measurement is still
evidence of the wrong thing. ``Policy`` says what to accept; ``apply_policy`` reads the facts
a verifier put in its ``Verdict`` and adds one ``policy.*`` check per rule, so a rejection
names the rule. Defaults are strict where strictness costs nothing: debug guests are
refused, TDX TCB must be ``UpToDate``. A policy file is JSON with the members below; unknown
members are refused, naming them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from attestation.verdict import Verdict

__all__ = ["Policy", "PolicyError", "apply_policy", "load_policy"]

_HEX = r"^[0-9a-f]*$"


class PolicyError(ValueError):
    """A policy file that cannot be used, naming the member that is wrong."""


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_debug: bool = False  # SNP guest policy bit 19; TDX TD attribute DEBUG (bit 0)
    #: SNP: the lowest acceptable reported TCB per component (bl, tee, snp, ucode, fmc).
    min_tcb: dict[str, int] = Field(default_factory=dict)
    #: TDX: the TCB statuses accepted (Intel's names: UpToDate, SWHardeningNeeded, …).
    tcb_status: tuple[str, ...] = ("UpToDate",)
    allowed_vmpl: tuple[int, ...] | None = None  # SNP: the VMPLs a report may come from
    #: Accepted launch measurements (SNP ``measurement``, TDX ``mrtd``), lower-case hex;
    #: empty: any (a published measurements file then says which).
    measurements: tuple[str, ...] = ()
    report_data: str | None = Field(None, pattern=_HEX)  # expected, whole or a prefix
    nonce: str | None = Field(None, pattern=_HEX)  # expected nonce (NVIDIA; or report_data)

    @field_validator("measurements")
    @classmethod
    def _hex(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not item or any(c not in "0123456789abcdef" for c in item):
                raise ValueError(f"{item!r} is not lower-case hex")
        return value


def load_policy(path: Path | str) -> Policy:
    """A policy from its JSON file; ``PolicyError`` naming what is wrong."""
    try:
        data = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise PolicyError(f"policy {path}: {exc}") from None
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(the file)"
        raise PolicyError(f"policy {path}: {where}: {first['msg']}") from None


def apply_policy(verdict: Verdict, policy: Policy) -> Verdict:
    """Add one ``policy.*`` check per rule that applies to this kind of evidence."""
    facts = verdict.facts
    if "debug" in facts:
        debug = bool(facts["debug"])
        verdict.add(
            "policy.debug",
            policy.allow_debug or not debug,
            "a debug guest" + (" (allowed by the policy)" if policy.allow_debug else "")
            if debug
            else "not a debug guest",
        )
    if verdict.kind == "snp":
        _snp(verdict, policy)
    elif verdict.kind == "tdx":
        _tdx(verdict, policy)
    if policy.measurements:
        measured = facts.get("measurement") or facts.get("mrtd")
        verdict.add(
            "policy.measurement",
            measured in policy.measurements,
            f"{measured} is {'' if measured in policy.measurements else 'not '}"
            "among the accepted measurements",
        )
    if policy.report_data is not None:
        data = str(facts.get("report_data", ""))
        verdict.add(
            "policy.report_data",
            data.startswith(policy.report_data),
            f"report_data {'begins with' if data.startswith(policy.report_data) else 'is not'}"
            f" the expected {policy.report_data[:32]}…",
        )
    if policy.nonce is not None:
        _nonce(verdict, policy.nonce)
    return verdict


def _nonce(verdict: Verdict, expected: str) -> None:
    """GPU evidence carries its nonce; SNP and TDX carry it in ``report_data``'s second half
    (``attestation.binding``: zero-padded, or its SHA-256 when longer than 32 bytes)."""
    facts = verdict.facts
    if "nonce" in facts:
        nonce = str(facts["nonce"])
    elif "report_data" in facts:
        nonce = str(facts["report_data"])[64:]
        raw = bytes.fromhex(expected)
        expected = (raw if len(raw) <= 32 else hashlib.sha256(raw).digest()).ljust(32, b"\0").hex()
    else:
        verdict.add("policy.nonce", None, "the evidence carries no nonce")
        return
    verdict.add(
        "policy.nonce",
        nonce == expected,
        "the expected nonce" if nonce == expected else f"nonce {nonce} is not the expected one",
    )


def _snp(verdict: Verdict, policy: Policy) -> None:
    facts = verdict.facts
    if policy.allowed_vmpl is not None and "vmpl" in facts:
        vmpl = facts["vmpl"]
        verdict.add(
            "policy.vmpl",
            vmpl in policy.allowed_vmpl,
            f"VMPL {vmpl} ({'allowed' if vmpl in policy.allowed_vmpl else 'not allowed'})",
        )
    if policy.min_tcb:
        tcb = facts.get("reported_tcb") or {}
        low = {k: (tcb.get(k), v) for k, v in policy.min_tcb.items() if (tcb.get(k) or 0) < v}
        verdict.add(
            "policy.min_tcb",
            not low,
            "reported TCB meets the minimum"
            if not low
            else "below the minimum: "
            + ", ".join(f"{k} {have} < {want}" for k, (have, want) in low.items()),
        )


def _tdx(verdict: Verdict, policy: Policy) -> None:
    status = verdict.facts.get("tcb_status")
    if status is None:
        verdict.add("policy.tcb_status", None, "no TCB status: verify with the collateral")
        return
    advisories = verdict.facts.get("advisory_ids") or []
    verdict.add(
        "policy.tcb_status",
        status in policy.tcb_status,
        f"TCB {status}"
        + (f" (advisories {', '.join(advisories)})" if advisories else "")
        + ("" if status in policy.tcb_status else f"; accepted: {', '.join(policy.tcb_status)}"),
    )
