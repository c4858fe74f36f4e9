"""What every verifier returns: a typed verdict listing each check it made, never a bare bool.

A ``Check`` is one thing looked at (a signature, a certificate, a TCB comparison, a policy
rule) with whether it held and why. A ``Verdict`` collects them with the facts read from the
evidence (measurement, ``report_data``, TCB, versions…), so a person can see what was checked
and what was not: a check that could not be made offline is listed with ``ok`` None
(``skipped``), and it never counts as a pass. ``accepted`` is True only when at least one
check was made and every made check held.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Check", "EvidenceKind", "Verdict", "all_made_held"]

EvidenceKind = Literal["snp", "tdx", "nvidia"]


@dataclass(frozen=True)
class Check:
    name: str  # a short, stable identifier: "report_signature", "chain.ask_by_ark", …
    ok: bool | None  # None: not checked (offline, or no input for it); see ``detail``
    detail: str

    def json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}

    def line(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "skip"}[self.ok]
        return f"{mark} {self.name}: {self.detail}"


def all_made_held(checks: Iterable[Check]) -> bool:
    """True when at least one check was made and every made check held: skipped checks
    (``ok`` None) never count as a pass, and nothing checked is no acceptance."""
    made = [c.ok for c in checks if c.ok is not None]
    return bool(made) and all(made)


@dataclass
class Verdict:
    kind: EvidenceKind
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # read from the evidence, JSON-ready

    def add(self, name: str, ok: bool | None, detail: str) -> Check:
        check = Check(name, ok, detail)
        self.checks.append(check)
        return check

    def extend(self, checks: Iterable[Check]) -> None:
        self.checks.extend(checks)

    @property
    def accepted(self) -> bool:
        return all_made_held(self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    @property
    def not_checked(self) -> list[Check]:
        return [c for c in self.checks if c.ok is None]

    def json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "verdict": "accept" if self.accepted else "reject",
            "checks": [c.json() for c in self.checks],
            "facts": self.facts,
        }
