"""TDX TCB evaluation: the QE identity, the TDX module, the platform's TCB level, the status.

Given collateral already read (``attestation.tdx_collateral``), these checks compare the
quote's QE report with Intel's QE identity, the TD report's SEAM fields with the TDX module
identity, and the PCK's SGX components, PCESVN and the TEE_TCB_SVN with the TCB info's levels,
then converge the statuses the way Intel's QVL does (``converge_tcb_status``). Whether the
collateral is authentic is not decided here (``attestation.tdx_collateral`` does); the
converged ``tcb_status`` fact is set only when the TCB info was authenticated. Nothing here
fetches collateral or reads the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attestation.pck import PckExtension
from attestation.tdx_collateral import _Bad, _get, _hex, _Signed
from attestation.tdx_quote import TdxQuote

__all__ = ["TCB_STATUSES", "converge_tcb_status"]

#: Intel's TCB statuses, best first.
TCB_STATUSES = (
    "UpToDate",
    "SWHardeningNeeded",
    "ConfigurationNeeded",
    "ConfigurationAndSWHardeningNeeded",
    "OutOfDate",
    "OutOfDateConfigurationNeeded",
    "Revoked",
)

_STATUS_FLAGS: dict[str, frozenset[str]] = {
    "UpToDate": frozenset(),
    "SWHardeningNeeded": frozenset({"sw"}),
    "ConfigurationNeeded": frozenset({"config"}),
    "ConfigurationAndSWHardeningNeeded": frozenset({"config", "sw"}),
    "OutOfDate": frozenset({"out"}),
    "OutOfDateConfigurationNeeded": frozenset({"out", "config"}),
    "Revoked": frozenset({"revoked"}),
}


def converge_tcb_status(*statuses: str) -> str:
    """One status from several (platform, TDX module, QE), as Intel's QVL converges them:
    Revoked wins; out of date with a configuration need is OutOfDateConfigurationNeeded;
    out of date subsumes SW hardening; otherwise the needs add up."""
    flags: set[str] = set()
    for status in statuses:
        if status not in _STATUS_FLAGS:
            raise ValueError(f"{status!r} is not one of Intel's TCB statuses")
        flags |= _STATUS_FLAGS[status]
    if "revoked" in flags:
        return "Revoked"
    if "out" in flags:
        return "OutOfDateConfigurationNeeded" if "config" in flags else "OutOfDate"
    if "config" in flags:
        return "ConfigurationAndSWHardeningNeeded" if "sw" in flags else "ConfigurationNeeded"
    return "SWHardeningNeeded" if "sw" in flags else "UpToDate"


def _status(level: Mapping[str, Any], where: str) -> tuple[str, list[str]]:
    status = _get(level, "tcbStatus", str, where)
    if status not in _STATUS_FLAGS:
        raise _Bad(f"{where}.tcbStatus {status!r} is not one of Intel's statuses")
    advisories = level.get("advisoryIDs", [])
    if not isinstance(advisories, list) or not all(isinstance(a, str) for a in advisories):
        raise _Bad(f"{where}.advisoryIDs is not a list of strings")
    return status, list(advisories)


def _svns(tcb: Mapping[str, Any], key: str, where: str) -> list[int]:
    comps = _get(tcb, key, list, where)
    if len(comps) != 16:
        raise _Bad(f"{where}.{key} has {len(comps)} components, not 16")
    out: list[int] = []
    for i, comp in enumerate(comps):
        if not isinstance(comp, dict):
            raise _Bad(f"{where}.{key}[{i}] is not an object")
        out.append(_get(comp, "svn", int, f"{where}.{key}[{i}]"))
    return out


def _masked(value: bytes, mask: bytes) -> bytes:
    return bytes(v & m for v, m in zip(value, mask, strict=True))


class _TcbChecks:
    """The TCB checks, mixed into ``attestation.tdx._Verifier``; it sets the attributes below."""

    quote: TdxQuote
    facts: dict[str, Any]
    pck_ext: PckExtension | None
    add: Callable[[str, bool | None, str], None]

    def check_tcb(self, tcb: _Signed, qe: _Signed) -> None:
        """What the collateral says of this platform: its QE, the TCB info's platform, the
        TDX module, and the TCB level with its converged status."""
        qe_status = self.check_qe_identity(qe)
        why = tcb.parse_problem or tcb.problem or "no readable tcbInfo"
        platform_ok = self.check_platform(tcb.doc, why)
        module = self.check_tdx_module(tcb.doc)
        self.check_tcb_level(tcb, module, qe_status, platform_ok)

    def check_qe_identity(self, signed: _Signed) -> tuple[str, list[str]] | None:
        name = "qe_identity"
        doc = signed.doc
        if doc is None:
            self.add(name, False, signed.parse_problem or signed.problem or "no QE identity")
            return None
        qe = self.quote.signature_data.qe_certification.qe_report
        w = "enclaveIdentity"
        try:
            ident = _get(doc, "id", str, w)
            if ident != "TD_QE":
                raise _Bad(f"{w}.id is {ident!r}, not the TDX Quoting Enclave's 'TD_QE'")
            mismatches: list[str] = []
            mrsigner = _hex(doc, "mrsigner", 32, w)
            if qe.mrsigner != mrsigner:
                mismatches.append(f"MRSIGNER {qe.mrsigner.hex()} is not {mrsigner.hex()}")
            prodid = _get(doc, "isvprodid", int, w)
            if qe.isv_prod_id != prodid:
                mismatches.append(f"ISVPRODID {qe.isv_prod_id} is not {prodid}")
            misc, misc_mask = _hex(doc, "miscselect", 4, w), _hex(doc, "miscselectMask", 4, w)
            if _masked(qe.miscselect, misc_mask) != _masked(misc, misc_mask):
                mismatches.append(f"MISCSELECT {qe.miscselect.hex()} under mask {misc_mask.hex()}")
            attrs, attrs_mask = _hex(doc, "attributes", 16, w), _hex(doc, "attributesMask", 16, w)
            if _masked(qe.attributes, attrs_mask) != _masked(attrs, attrs_mask):
                mismatches.append(
                    f"ATTRIBUTES {qe.attributes.hex()} under mask {attrs_mask.hex()} is not "
                    f"{_masked(attrs, attrs_mask).hex()}"
                )
            levels = _get(doc, "tcbLevels", list, w)
            found: tuple[str, list[str], str] | None = None
            for i, level in enumerate(levels):
                where = f"{w}.tcbLevels[{i}]"
                if not isinstance(level, dict):
                    raise _Bad(f"{where} is not an object")
                tcb = _get(level, "tcb", dict, where)
                if _get(tcb, "isvsvn", int, f"{where}.tcb") <= qe.isv_svn:
                    status, advisories = _status(level, where)
                    found = (status, advisories, str(level.get("tcbDate", "?")))
                    break
        except _Bad as exc:
            self.add(name, False, str(exc))
            return None
        if mismatches:
            self.add(
                name,
                False,
                "the QE report does not match the QE identity: " + "; ".join(mismatches),
            )
            return None
        if found is None:
            self.add(name, False, f"QE ISVSVN {qe.isv_svn} is below every QE identity TCB level")
            return None
        status, advisories, date = found
        self.facts["qe_tcb_status"] = status
        ok = status != "Revoked"
        self.add(
            name,
            ok,
            f"the QE matches Intel's TD_QE identity (MRSIGNER, ISVPRODID, MISCSELECT and "
            f"ATTRIBUTES under their masks); ISVSVN {qe.isv_svn}: {status} (TCB date {date})",
        )
        return (status, advisories) if ok else None

    def check_platform(self, doc: Mapping[str, Any] | None, why: str) -> bool:
        if doc is None:
            self.add("tcb_info.platform", False, why)
            return False
        ext = self.pck_ext
        if ext is None:
            self.add("tcb_info.platform", False, "no PCK SGX extension to compare with")
            return False
        w = "tcbInfo"
        try:
            ident = _get(doc, "id", str, w)
            version = _get(doc, "version", int, w)
            fmspc = _hex(doc, "fmspc", 6, w)
            pceid = _hex(doc, "pceId", 2, w)
        except _Bad as exc:
            self.add("tcb_info.platform", False, str(exc))
            return False
        problems: list[str] = []
        if ident != "TDX" or version < 3:
            problems.append(f"tcbInfo is {ident!r} version {version}, not TDX TCB info (version 3)")
        if fmspc != ext.fmspc:
            problems.append(f"its FMSPC {fmspc.hex()} is not the PCK's {ext.fmspc.hex()}")
        if pceid != ext.pceid:
            problems.append(f"its PCE-ID {pceid.hex()} is not the PCK's {ext.pceid.hex()}")
        self.facts["tcb_evaluation_data_number"] = doc.get("tcbEvaluationDataNumber")
        self.add(
            "tcb_info.platform",
            not problems,
            f"TDX TCB info v{version} for FMSPC {fmspc.hex()} and PCE-ID {pceid.hex()}: the PCK's own"
            if not problems
            else "; ".join(problems),
        )
        return not problems

    def check_tdx_module(
        self, doc: Mapping[str, Any] | None
    ) -> tuple[str, list[str]] | bool | None:
        """The TDX module's identity; returns its TCB status (None: it has none to add) or
        False when the check failed."""
        name = "tdx_module"
        if doc is None:
            self.add(name, False, "no readable tcbInfo")
            return False
        body = self.quote.body
        svn, major = body.tee_tcb_svn[0], body.tee_tcb_svn[1]
        w = "tcbInfo.tdxModule"
        try:
            base = _get(doc, "tdxModule", dict, "tcbInfo")
            mrsigner = _hex(base, "mrsigner", 48, w)
            attrs, mask = _hex(base, "attributes", 8, w), _hex(base, "attributesMask", 8, w)
            levels: list[Any] | None = None
            identity = None
            identities = doc.get("tdxModuleIdentities") or []
            if major > 0 and identities:
                if not isinstance(identities, list):
                    raise _Bad("tcbInfo.tdxModuleIdentities is not a list")
                identity = f"TDX_{major:02X}"
                entry = next(
                    (
                        e
                        for e in identities
                        if isinstance(e, dict) and str(e.get("id", "")).upper() == identity
                    ),
                    None,
                )
                if entry is None:
                    self.add(name, False, f"tcbInfo lists no TDX module identity {identity}")
                    return False
                w = f"tcbInfo.tdxModuleIdentities[{identity}]"
                mrsigner = _hex(entry, "mrsigner", 48, w)
                attrs, mask = _hex(entry, "attributes", 8, w), _hex(entry, "attributesMask", 8, w)
                levels = _get(entry, "tcbLevels", list, w)
            problems: list[str] = []
            if body.mrsignerseam != mrsigner:
                problems.append(f"MRSIGNERSEAM {body.mrsignerseam.hex()} is not {mrsigner.hex()}")
            if _masked(body.seam_attributes, mask) != _masked(attrs, mask):
                problems.append(
                    f"SEAMATTRIBUTES {body.seam_attributes.hex()} under mask {mask.hex()} are "
                    f"not {_masked(attrs, mask).hex()}"
                )
            found: tuple[str, list[str]] | None = None
            if levels is not None and not problems:
                for i, level in enumerate(levels):
                    where = f"{w}.tcbLevels[{i}]"
                    if not isinstance(level, dict):
                        raise _Bad(f"{where} is not an object")
                    tcb = _get(level, "tcb", dict, where)
                    if _get(tcb, "isvsvn", int, f"{where}.tcb") <= svn:
                        found = _status(level, where)
                        break
                if found is None:
                    problems.append(f"module ISVSVN {svn} is below every {identity} TCB level")
        except _Bad as exc:
            self.add(name, False, str(exc))
            return False
        if problems:
            self.add(name, False, "; ".join(problems))
            return False
        self.facts["tdx_module_identity"] = identity
        if found is None:
            self.add(
                name,
                True,
                f"MRSIGNERSEAM and SEAMATTRIBUTES match tcbInfo.tdxModule (module version {major}: "
                "no module identity TCB levels to apply)",
            )
            return None
        status = found[0]
        self.facts["tdx_module_tcb_status"] = status
        ok = status != "Revoked"
        self.add(
            name,
            ok,
            f"the TDX module matches {identity} (MRSIGNERSEAM, SEAMATTRIBUTES); ISVSVN {svn}: "
            f"{status}",
        )
        return found if ok else False

    def check_tcb_level(
        self,
        tcb_signed: _Signed,
        module: tuple[str, list[str]] | bool | None,
        qe: tuple[str, list[str]] | None,
        platform_ok: bool,
    ) -> None:
        name = "tcb_level"
        doc = tcb_signed.doc
        ext = self.pck_ext
        if doc is None or ext is None:
            why = tcb_signed.parse_problem or tcb_signed.problem or "no PCK SGX extension"
            self.add(name, False, why)
            return
        if not platform_ok:
            self.add(
                name,
                False,
                "not evaluated: this TCB info is not for this platform (see tcb_info.platform)",
            )
            return
        tee = list(self.quote.body.tee_tcb_svn)
        start = 2 if tee[1] > 0 else 0  # a module version > 0: its SVN is the module identity's
        try:
            levels = _get(doc, "tcbLevels", list, "tcbInfo")
            matched: tuple[str, list[str], str] | None = None
            closest = "tcbInfo lists no TCB level"
            for i, level in enumerate(levels):
                where = f"tcbInfo.tcbLevels[{i}]"
                if not isinstance(level, dict):
                    raise _Bad(f"{where} is not an object")
                tcb = _get(level, "tcb", dict, where)
                sgx = _svns(tcb, "sgxtcbcomponents", f"{where}.tcb")
                tdx = _svns(tcb, "tdxtcbcomponents", f"{where}.tcb")
                pcesvn = _get(tcb, "pcesvn", int, f"{where}.tcb")
                short = [
                    f"sgxtcbcomponents[{j}]: {have} < {want}"
                    for j, (have, want) in enumerate(zip(ext.cpusvn_components, sgx, strict=True))
                    if have < want
                ]
                if ext.pcesvn < pcesvn:
                    short.append(f"pcesvn: {ext.pcesvn} < {pcesvn}")
                short += [
                    f"tdxtcbcomponents[{j}]: TEE_TCB_SVN {tee[j]} < {tdx[j]}"
                    for j in range(start, 16)
                    if tee[j] < tdx[j]
                ]
                if not short:
                    status, advisories = _status(level, where)
                    matched = (status, advisories, str(level.get("tcbDate", "?")))
                    break
                closest = f"the lowest, level {i} ({level.get('tcbStatus')}), needs " + ", ".join(
                    short
                )
        except _Bad as exc:
            self.add(name, False, str(exc))
            return
        if matched is None:
            self.add(
                name,
                False,
                f"no TCB level matches (TCB not supported): the PCK's SGX components "
                f"{list(ext.cpusvn_components)}, PCESVN {ext.pcesvn}, TEE_TCB_SVN "
                f"{self.quote.body.tee_tcb_svn.hex()}; {closest}",
            )
            return
        status, advisories, date = matched
        self.facts["platform_tcb_status"] = status
        statuses = [status]
        all_advisories = list(advisories)
        for extra in (module, qe):
            if isinstance(extra, tuple):
                statuses.append(extra[0])
                all_advisories += [a for a in extra[1] if a not in all_advisories]
        final = converge_tcb_status(*statuses)
        authentic = tcb_signed.authentic
        if authentic:
            self.facts["tcb_status"] = final
            self.facts["advisory_ids"] = all_advisories
            self.facts["tcb_date"] = date
        ok = final != "Revoked"
        adv = f"; advisories {', '.join(all_advisories)}" if all_advisories else "; no advisories"
        self.add(
            name,
            ok,
            f"TCB level {status} (TCB date {date}) matches the PCK's SGX components, PCESVN "
            f"{ext.pcesvn} and TEE_TCB_SVN; with the TDX module and QE: {final}{adv}"
            + ("" if authentic else " (from a tcbInfo that is not authenticated)"),
        )
