"""What an auditor accepts, beyond genuine evidence: the policy a verdict is held to.

Genuine evidence from a debug guest, an old TCB or an unexpected measurement is still
evidence of the wrong thing. ``Policy`` says what to accept; ``apply_policy`` reads the facts
a verifier put in its ``Verdict`` and adds one ``policy.*`` check per rule, so a rejection
names the rule. The defaults are what a careful relying party of this appliance accepts,
each with its reason in ``REASONS`` (``affidavit attest policy --show`` prints them, and
``docs/attestation.md`` lists them). A policy file is JSON with the members below; each it
names replaces that default, and unknown members are refused, naming them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from attestation.snp_report import product_family
from attestation.verdict import Verdict

__all__ = ["REASONS", "SNP_TCB_FLOOR", "Policy", "PolicyError", "apply_policy", "load_policy"]

_HEX = r"^[0-9a-f]*$"
_TCB_PARTS = ("fmc", "bl", "tee", "snp", "ucode")
_PRODUCTS = ("Milan", "Genoa", "Turin", "*")

#: SEV-SNP: the lowest TCB accepted by default, per product (SVNs are per product: a Genoa
#: SNP SVN says nothing about a Milan's). Each is the oldest TCB among the real non-debug
#: reports and VCEKs this project accepts (``../shared/vectors``): Milan the virtee and
#: trustee reports (firmware 1.52.4, 2023), Genoa Azure's report (firmware 1.55.40, 2025),
#: Turin the virtee VCEK (2024). A floor, not AMD's latest: set ``min_tcb`` from AMD's
#: current security bulletin per fleet.
SNP_TCB_FLOOR: dict[str, dict[str, int]] = {
    "Milan": {"bl": 3, "tee": 0, "snp": 8, "ucode": 115},
    "Genoa": {"bl": 10, "tee": 0, "snp": 23, "ucode": 84},
    "Turin": {"fmc": 0, "bl": 0, "tee": 0, "snp": 0, "ucode": 9},
}


def _floor() -> dict[str, dict[str, int]]:
    return {product: dict(parts) for product, parts in SNP_TCB_FLOOR.items()}


class PolicyError(ValueError):
    """A policy file that cannot be used, naming the member that is wrong."""


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_debug: bool = False  # SNP guest policy bit 19; TDX TD attribute DEBUG (bit 0)
    #: SNP: the lowest acceptable reported TCB, per product (``Milan``, ``Genoa``, ``Turin``,
    #: or ``*`` for any), per component (fmc, bl, tee, snp, ucode). A flat map of components
    #: reads as ``{"*": …}``; ``{}`` is no minimum.
    min_tcb: dict[str, dict[str, int]] = Field(default_factory=_floor)
    #: TDX: the TCB statuses accepted (Intel's names: UpToDate, SWHardeningNeeded, …).
    tcb_status: tuple[str, ...] = ("UpToDate",)
    allowed_vmpl: tuple[int, ...] | None = None  # SNP: exactly these VMPLs (replaces max_vmpl)
    allow_migration_agent: bool = False  # SNP guest policy bit 18 (MIGRATE_MA)
    max_vmpl: int = Field(0, ge=0, le=3)  # SNP: the highest VMPL a report may come from
    #: SNP: the lowest guest-policy ABI (``major.minor``) accepted; the ABI must also be one
    #: the firmware that signed the report implements.
    min_abi: str = Field("0.0", pattern=r"^[0-9]{1,3}\.[0-9]{1,3}$")
    #: SNP: the lowest committed and launch TCB, per product, like ``min_tcb``.
    min_committed_tcb: dict[str, dict[str, int]] = Field(default_factory=_floor)
    min_launch_tcb: dict[str, dict[str, int]] = Field(default_factory=_floor)
    allow_smt: bool = True  # SNP: False refuses a host with SMT on (PLATFORM_INFO bit 0)
    require_single_socket: bool = False  # SNP: True needs guest policy bit 20 (SINGLE_SOCKET)
    host_data: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")  # SNP: expected HOST_DATA
    id_key_digest: str | None = Field(None, pattern=r"^[0-9a-f]{96}$")  # SNP: the ID block's
    author_key_digest: str | None = Field(None, pattern=r"^[0-9a-f]{96}$")  # SNP: its author
    require_crl: bool = False  # SNP: refuse when AMD's CRL was not checked (no --crl)
    #: TDX: accept a quote checked without Intel's collateral (no TCB status, no revocation)
    allow_quote_level: bool = False
    #: Accepted launch measurements (SNP ``measurement``, TDX ``mrtd``), lower-case hex;
    #: empty: any (a published measurements file then says which).
    measurements: tuple[str, ...] = ()
    report_data: str | None = Field(None, pattern=_HEX)  # expected, whole or a prefix
    nonce: str | None = Field(None, pattern=_HEX)  # expected nonce (NVIDIA; or report_data)
    #: NVIDIA: refuse evidence checked against no expected nonce (``--nonce`` or ``nonce``):
    #: without one, a recorded report could be replayed from another GPU session or boot.
    require_nonce: bool = True

    @field_validator("min_tcb", "min_committed_tcb", "min_launch_tcb", mode="before")
    @classmethod
    def _per_product(cls, value: object) -> object:
        if isinstance(value, dict) and value and all(isinstance(v, int) for v in value.values()):
            return {"*": value}  # a flat map of components: any product
        return value

    @field_validator("min_tcb", "min_committed_tcb", "min_launch_tcb")
    @classmethod
    def _tcb_names(cls, value: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        for product, parts in value.items():
            if product not in _PRODUCTS:
                raise ValueError(f"{product!r} is not one of {', '.join(_PRODUCTS)}")
            for part, svn in parts.items():
                if part not in _TCB_PARTS:
                    raise ValueError(f"{product}: {part!r} is not one of {', '.join(_TCB_PARTS)}")
                if not 0 <= svn <= 255:
                    raise ValueError(f"{product}: {part} {svn} is not an SVN (0..255)")
        return value

    @field_validator("measurements")
    @classmethod
    def _hex(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not item or any(c not in "0123456789abcdef" for c in item):
                raise ValueError(f"{item!r} is not lower-case hex")
        return value


#: Why each member's default is what it is: ``affidavit attest policy --show`` prints these,
#: and a test holds that every member has one.
REASONS: dict[str, str] = {
    "allow_debug": "a debug guest's memory and registers can be read and changed by the host "
    "(SNP DBG_DECRYPT; a TDX debug TD), so its record proves nothing",
    "min_tcb": "SNP: reported TCB (what the VCEK certifies) at least the per-product floor: the "
    "oldest TCB among the real non-debug reports and VCEKs this project accepts (Milan: "
    "firmware 1.52.4, 2023; Genoa: 1.55.40, 2025; Turin: the 2024 VCEK), so firmware 1.49 "
    "(Milan SNP SVN 5) is refused. Current firmware meets it. It is a floor, not "
    "AMD's latest: raise it per fleet from AMD's current security bulletin",
    "min_committed_tcb": "SNP: the host can roll the firmware back to its COMMITTED_TCB at any "
    "time, so that one must meet the floor too (same table as min_tcb)",
    "min_launch_tcb": "SNP: the firmware that built the guest's memory at launch is LAUNCH_TCB; "
    "a flaw fixed only later may have touched the guest then (same table as min_tcb)",
    "tcb_status": "TDX: only a platform Intel rates UpToDate is accepted; add "
    "SWHardeningNeeded, ConfigurationNeeded, … knowingly, per fleet",
    "allowed_vmpl": "SNP: unset, max_vmpl decides; a list replaces it with exactly those VMPLs",
    "allow_migration_agent": "SNP: a migration agent (guest policy MIGRATE_MA) can export the "
    "guest's memory and state to another machine, outside what the report attests; the "
    "appliance is launched without one",
    "max_vmpl": "SNP: the appliance boots directly (no SVSM or paravisor), so its kernel runs "
    "and asks for its report at VMPL0. A report from VMPL1-3 was asked for by code below a more "
    "privileged layer that can read and change its memory, and whose launch measurement need "
    "not cover the code that chose report_data: it does not vouch for the binding",
    "min_abi": "SNP: 0.0, no minimum: the appliance is launched with QEMU's guest policy "
    "0x30000, whose ABI is 0.0, and the firmware's own level is held by the TCB floors (its "
    "snp SVN). A report whose ABI is newer than the firmware that signed it (e.g. 255.255) is "
    "refused whatever the minimum",
    "allow_smt": "SNP: SMT is reported as a fact (smt_enabled). A sibling thread shares a "
    "core's caches and buffers with whatever else the host runs there (side channels), but "
    "turning SMT off costs a host half its threads: a fleet choice, enforced only when the "
    "policy says false",
    "require_single_socket": "SNP: reported as a fact (single_socket); enforced only when the "
    "policy says true, for fleets that launch with guest policy bit 20",
    "host_data": "SNP: HOST_DATA is whatever the host set at launch; checked only when the "
    "policy names the value its deployment sets",
    "id_key_digest": "SNP: the appliance is launched without an ID block; checked only when "
    "the policy names the ID key its deployment signs with",
    "author_key_digest": "SNP: as id_key_digest, for the ID block's author key",
    "require_crl": "SNP: AMD's CRL is fetched from KDS (--crl FILE, or --fetch-crl) and the "
    "auditor may work offline; without it the verdict says 'chain.revocation: not checked'. "
    "true makes that a rejection",
    "allow_quote_level": "TDX: without Intel's collateral neither the TCB status nor the PCK "
    "revocation is checked, so a quote alone is not accepted; true accepts it knowingly",
    "measurements": "any: the signed published-measurements file (--published) says which "
    "launch measurements a release promised; list them here to pin some without one",
    "report_data": "unset: bind-check checks the binding; set it to pin report_data's prefix",
    "nonce": "unset: --nonce gives the nonce the verifier chose; SNP and TDX carry it in "
    "report_data's second half",
    "require_nonce": "NVIDIA: without an expected nonce a recorded GPU report could be "
    "replayed from another session or boot",
}


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
    elif verdict.kind == "nvidia":
        _nvidia_nonce_required(verdict, policy)
    return verdict


def _nvidia_nonce_required(verdict: Verdict, policy: Policy) -> None:
    """GPU evidence is fresh only against a nonce the verifier chose: with none given (the
    verifier's ``nonce`` check not made), refuse unless ``require_nonce`` is false."""
    if any(c.name == "nonce" and c.ok is not None for c in verdict.checks):
        return  # --nonce was given: the verifier's own nonce check decided
    if policy.require_nonce:
        verdict.add(
            "policy.nonce",
            False,
            "no nonce was given (--nonce HEX or the policy's nonce): the evidence's freshness "
            "is unknown, so it could be replayed; require_nonce: false accepts that",
        )
    else:
        verdict.add(
            "policy.nonce",
            None,
            "no nonce was given, and the policy does not require one (require_nonce: false)",
        )


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
    if policy.require_crl:
        crl = next((c for c in verdict.checks if c.name == "chain.revocation"), None)
        checked = crl is not None and crl.ok is not None
        verdict.add(
            "policy.crl",
            checked,
            "AMD's CRL was checked"
            if checked
            else "revocation was not checked (no --crl) and the policy requires it (require_crl)",
        )
    if "vmpl" not in facts:
        return  # the report did not parse: nothing to hold to the rules
    migrate = bool(facts.get("migrate_ma"))
    verdict.add(
        "policy.migration_agent",
        policy.allow_migration_agent or not migrate,
        "the guest policy allows a migration agent (MIGRATE_MA, bit 18)"
        + (" (allowed by the policy)" if policy.allow_migration_agent else "")
        if migrate
        else "no migration agent (MIGRATE_MA clear)",
    )
    _vmpl(verdict, policy, int(facts["vmpl"]))
    _abi(verdict, policy)
    product = product_family(facts.get("product"))
    for name, fact, rule in (
        ("policy.min_tcb", "reported_tcb", policy.min_tcb),
        ("policy.min_committed_tcb", "committed_tcb", policy.min_committed_tcb),
        ("policy.min_launch_tcb", "launch_tcb", policy.min_launch_tcb),
    ):
        _min_tcb(verdict, name, fact, rule, product)
    smt = bool(facts.get("smt_enabled"))
    if not policy.allow_smt:
        verdict.add(
            "policy.smt",
            not smt,
            "SMT is on in the host (PLATFORM_INFO bit 0) and the policy refuses it (allow_smt)"
            if smt
            else "SMT is off in the host",
        )
    if policy.require_single_socket:
        single = bool(facts.get("single_socket"))
        verdict.add(
            "policy.single_socket",
            single,
            "the guest policy requires a single socket (bit 20)"
            if single
            else "the guest policy does not require a single socket (bit 20 clear)",
        )
    for member in ("host_data", "id_key_digest", "author_key_digest"):
        expected = getattr(policy, member)
        if expected is None:
            continue
        have = str(facts.get(member, ""))
        verdict.add(
            f"policy.{member}",
            have == expected,
            f"{member} is the expected {expected[:16]}…"
            if have == expected
            else f"{member} {have} is not the expected {expected}",
        )


def _vmpl(verdict: Verdict, policy: Policy, vmpl: int) -> None:
    if policy.allowed_vmpl is not None:
        ok = vmpl in policy.allowed_vmpl
        allowed = ", ".join(str(v) for v in policy.allowed_vmpl)
        detail = f"VMPL {vmpl} ({'' if ok else 'not '}among the allowed: {allowed})"
    else:
        ok = vmpl <= policy.max_vmpl
        detail = f"VMPL {vmpl} ({'at most' if ok else 'above'} the maximum {policy.max_vmpl})"
    verdict.add("policy.vmpl", ok, detail)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _abi(verdict: Verdict, policy: Policy) -> None:
    """The guest policy's ABI is the oldest firmware ABI the guest owner allowed to launch
    it: at least ``min_abi``, and never newer than the firmware that signed the report."""
    abi = str(verdict.facts.get("abi", "0.0"))
    firmware = str(verdict.facts.get("firmware", "0.0.0"))
    problems = []
    if _version(abi) < _version(policy.min_abi):
        problems.append(f"below the minimum {policy.min_abi} (min_abi)")
    if _version(abi) > _version(firmware)[:2]:
        problems.append(f"newer than the firmware {firmware} that signed the report implements")
    verdict.add(
        "policy.abi",
        not problems,
        f"guest policy ABI {abi} "
        + (
            "; ".join(problems)
            if problems
            else f"is at least {policy.min_abi} and within the firmware {firmware}"
        ),
    )


def _min_tcb(
    verdict: Verdict, name: str, fact: str, rule: dict[str, dict[str, int]], product: str | None
) -> None:
    label = fact.replace("_tcb", "").upper() + "_TCB"
    floor = rule.get(product or "", rule.get("*"))
    if not rule:
        return  # {}: no minimum, by the policy
    if floor is None:
        verdict.add(
            name, None, f"the policy states no minimum {label} for {product or 'this product'}"
        )
        return
    tcb = verdict.facts.get(fact) or {}
    low = {k: (tcb.get(k), v) for k, v in floor.items() if (tcb.get(k) or 0) < v}
    which = product if product in rule else "any product"
    verdict.add(
        name,
        not low,
        f"{label} meets the {which} minimum"
        if not low
        else f"{label} below the {which} minimum: "
        + ", ".join(f"{k} {have} < {want}" for k, (have, want) in low.items()),
    )


def _tdx(verdict: Verdict, policy: Policy) -> None:
    status = verdict.facts.get("tcb_status")
    if status is None:
        verdict.add(
            "policy.quote_level",
            policy.allow_quote_level,
            "quote-level verification, allowed by the policy (allow_quote_level): the TCB "
            "status and revocation were NOT checked"
            if policy.allow_quote_level
            else "no collateral: the quote's signatures and PCK chain were checked, but not its "
            "TCB status nor revocation; give --collateral (or allow_quote_level: true)",
        )
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
