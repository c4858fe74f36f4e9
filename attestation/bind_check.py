"""``affidavit attest bind-check BUNDLE``: was this record written by the attested appliance?

An exported bundle carries the stream's entries, its checkpoints, the checkpoint signer's
verifier key (``log_key.pub``) and, in ``evidence/``, what ``attest collect`` archived: each
report with its certificates (and collateral), recorded as ``evidence.archived`` entries
whose envelope time is when the evidence was collected. The check:

1. the bundle is whole and its checkpoints verify under ``log_key.pub`` (``verify_bundle``
   with that key pinned);
2. each archived report verifies, at its recorded collection time (old evidence is judged
   by the certificates valid when it was taken, not today). That time is the envelope's of
   an ``evidence.archived`` entry, so it is only believed when a checkpoint signed by the log
   key covers the entry: evidence recorded in an unsigned tail is not judged at all;
3. its ``report_data`` is 64 bytes whose first 32 are exactly
   ``binding_digest(log key, sealing key)`` for the log key of the bundle and one of the
   stream's recipients (the appliance's sealing key); the last 32 are the verifier's nonce,
   which ``attest verify --nonce`` checks.

The appliance's boot report lies in ``boot/<stream>/evidence/`` (a boot bundle, checked under
the same log key; docs/record.md §11) and is judged the same way. No recipient key is needed:
the log key and the recipients are in the clear. ``--key`` opens the session's
``evidence.archived`` bodies (kind, file name, digest), linking each file to its entry and
time; without it, and always for boot evidence (sealed to the appliance's key), a report is
judged at the time of its stream's first signed ``evidence.archived`` entry, its kind read
from its name, and a ``skip evidence.link`` line says so.
``--trusted-root FILE`` (SEV-SNP) replaces AMD's pinned roots with the ARK(s) in FILE, for a
rehearsal with a test chain; the output then opens with ``skip trust.amd_roots`` (see
``attestation.evidence``).
Files are named ``<kind>-<stamp>.report`` / ``.certs.pem`` / ``.collateral.json``.
"""

from __future__ import annotations

import hmac
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from attestation.binding import binding_digest
from attestation.verdict import Check, EvidenceKind, Verdict, all_made_held

__all__ = ["KINDS", "attest_bind_check", "check_bundle", "evidence_names"]

#: evidence.archived's kinds and the verifier for each.
KINDS: dict[str, EvidenceKind] = {"sev-snp": "snp", "tdx": "tdx", "nvidia-h100": "nvidia"}


def evidence_names(kind: EvidenceKind, stamp: str) -> tuple[str, str, str]:
    """The report, certificates and collateral file names ``collect`` uses."""
    base = f"{kind}-{stamp}"
    return f"{base}.report", f"{base}.certs.pem", f"{base}.collateral.json"


Verifier = Callable[..., Verdict]

#: The kind of evidence a file is, from its name's first part (``evidence_names``).
_KIND_OF_NAME: dict[str, EvidenceKind] = {"snp": "snp", "tdx": "tdx", "nvidia": "nvidia"}


@dataclass(frozen=True)
class _Report:
    """One archived report to judge: where it lies, and the entry time it is judged at."""

    label: str  # "snp-….report" or "boot/<stream>/snp-….report", for the check names
    folder: Path  # the evidence/ folder holding it and its companions
    file: str
    kind: EvidenceKind | None  # None: the name says no kind this command knows
    companions: frozenset[str]  # the names beside it that may pair with it
    seq: int | None  # its entry (exact), or the stream's first signed evidence.archived entry
    occurred_at: str | None  # that entry's time; None: no signed entry to take it from
    linked: bool  # True: the entry that names the file (a key opened it)
    stream: str


def check_bundle(
    bundle: Path,
    key: Any | None,
    *,
    verify: Verifier | None = None,
    certs: bytes | None = None,
) -> tuple[list[Check], list[Verdict]]:
    """The binding checks of ``bundle`` and the verdict of each archived report: the
    session's own and its boot bundles' (docs/record.md §11). ``key`` (a
    ``record.seal.KeyPair``, or None) opens the session's sealed ``evidence.archived`` bodies,
    linking each file to its entry; without it, and always for boot evidence (sealed to the
    appliance's key), a report is judged at the time of its stream's first signed
    ``evidence.archived`` entry, and the output says so. ``verify`` replaces the evidence
    verifier (tests). ``certs``: a chain (PEM) for the reports the record kept without one
    (``--certs``); a report kept with its chain is judged by that chain only."""
    from attestation.evidence import verify_evidence
    from record.bundle import BOOT, ENTRIES, EVIDENCE, INDEX, LOG_KEY, verify_bundle
    from record.reader import StreamKeys
    from record.schema import EvidenceArchived, parse_entry

    checks: list[Check] = []
    log_key = (bundle / LOG_KEY).read_text().strip()
    integrity = verify_bundle(bundle, key=key, log_key=log_key)
    boot = _boot_streams(bundle, INDEX, BOOT)
    checks.append(
        Check(
            "bundle",
            integrity.ok,
            f"{integrity.entries} entries and the checkpoints verify under {log_key}"
            + (
                f", and the {len(boot)} boot bundle{'' if len(boot) == 1 else 's'} under the same key"
                if boot
                else ""
            )
            if integrity.ok
            else "; ".join(f"{p.code}: {p.detail}" for p in integrity.problems[:3]),
        )
    )
    entries = [parse_entry(line) for line in (bundle / ENTRIES).read_bytes().splitlines()]
    stream = entries[0].stream
    # Entries at positions below this are covered by a checkpoint the log key signed.
    signed_size = integrity.entries - integrity.unsigned.get(stream, integrity.entries)
    sealing = _recipients(entries)
    reports: list[_Report] = []
    if key is not None:
        keys = StreamKeys.collect(stream, entries, key)
        archived = [(e, b) for e in entries if isinstance(b := keys.open(e), EvidenceArchived)]
        named = frozenset(b.file for _, b in archived)
        for entry, body in archived:
            if body.file.endswith(".report"):
                kind = KINDS[body.evidence_kind]
                reports.append(
                    _Report(
                        body.file, bundle / EVIDENCE, body.file, kind, named, entry.seq,
                        entry.occurred_at, True, stream,
                    )
                )  # fmt: skip
    else:
        reports += _unlinked(bundle / EVIDENCE, "", entries, signed_size, stream)
    for name in boot:
        folder = bundle / BOOT / name
        try:
            inner = [parse_entry(line) for line in (folder / ENTRIES).read_bytes().splitlines()]
        except Exception:  # the bundle check named it; nothing here can be judged
            continue
        size = len(inner) - integrity.unsigned.get(name, len(inner))
        reports += _unlinked(folder / EVIDENCE, f"{BOOT}/{name}/", inner, size, name)
    if not reports:
        checks.append(Check("evidence", False, "the bundle holds no archived report"))
    if any(not r.linked for r in reports):
        checks.append(Check("evidence.link", None, _link_notice(key is not None)))
    verdicts: list[Verdict] = []
    for item in reports:
        verdict = _judge(item, verify or verify_evidence, certs, signed_size, checks)
        if verdict is None:
            continue
        verdicts.append(verdict)
        data = bytes.fromhex(str(verdict.facts.get("report_data", "")))
        bound = _bound_to(log_key, sealing, data)
        checks.append(
            Check(
                f"binding.{item.label}",
                bound is not None,
                f"report_data binds the log key and sealing key {bound}"
                if bound is not None
                else "report_data binds neither this log key nor any recipient of the stream",
            )
        )
    return checks, verdicts


def _link_notice(keyed: bool) -> str:
    why = (
        "boot evidence is sealed to the appliance's key, not this one"
        if keyed
        else "no key: evidence.archived bodies are sealed"
    )
    return (
        f"{why}, so which entry holds a file cannot be told: such a report is judged at the "
        "time of its stream's first evidence.archived entry that a signed checkpoint covers, "
        "and its files are not checked against their digests (a report vouches for its bytes "
        "by its signature)"
    )


def _boot_streams(bundle: Path, index_name: str, boot: str) -> list[str]:
    """The boot bundles ``bundle.json`` lists that are folders (the bundle check judges the
    list against ``boot/``)."""
    try:
        listed = json.loads((bundle / index_name).read_bytes()).get(boot)
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(listed, list):
        return []
    return [n for n in listed if isinstance(n, str) and n and "/" not in n and not n.startswith(".")
            and (bundle / boot / n).is_dir()]  # fmt: skip


def _recipients(entries: list[Any]) -> list[str]:
    """Every recipient the CLEAR ``stream.opened``/``key.rotated`` bodies list: readable
    without a key; the appliance's sealing key is among them."""
    from record.schema import CLEAR_KINDS, KeyRotated, StreamOpened, parse_body

    found: list[str] = []
    for entry in entries:
        if entry.kind not in CLEAR_KINDS or not isinstance(entry.body, dict):
            continue
        try:
            body = parse_body(entry.kind, entry.body, stored=True)
        except Exception:  # the bundle check named it
            continue
        if isinstance(body, StreamOpened | KeyRotated):
            found += [w.recipient for w in body.recipients if w.recipient not in found]
    return found


def _unlinked(
    folder: Path, prefix: str, entries: list[Any], signed_size: int, stream: str
) -> list[_Report]:
    """The reports of ``folder``, each judged at the stream's first signed
    ``evidence.archived`` entry (no key tells which entry holds which file)."""
    names = frozenset(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    first = next(
        (e for e in entries if e.kind == "evidence.archived" and e.seq < signed_size), None
    )
    return [
        _Report(
            prefix + name, folder, name, _KIND_OF_NAME.get(name.split("-", 1)[0]),
            frozenset(names), first.seq if first else None,
            first.occurred_at if first else None, False, stream,
        )
        for name in sorted(names)
        if name.endswith(".report")
    ]  # fmt: skip


def _judge(
    item: _Report,
    verify: Verifier,
    certs: bytes | None,
    signed_size: int,
    checks: list[Check],
) -> Verdict | None:
    """Verify one report at its time; its check goes to ``checks``. None: not judged."""
    name = f"evidence.{item.label}"
    if item.occurred_at is None or item.seq is None:
        detail = (
            f"not judged: no evidence.archived entry of stream {item.stream} is covered by a "
            "signed checkpoint, so no collection time is the log's word"
        )
        checks.append(Check(name, False, detail))
        return None
    if item.linked and item.seq >= signed_size:
        checks.append(
            Check(
                name,
                False,
                f"not judged: its entry (seq {item.seq}) is covered by no signed checkpoint "
                f"(they cover {signed_size} entries), so its time {item.occurred_at} is "
                "not the log's word",
            )
        )
        return None
    if item.kind is None:
        checks.append(Check(name, False, "not judged: its name names no kind of evidence"))
        return None
    base = item.file[: -len(".report")]
    kept = [(item.folder / n).read_bytes() for n in (base + ".certs.pem",) if n in item.companions]
    given = not kept and certs is not None
    chain = kept if kept else [certs] if certs is not None else []
    collateral_name = base + ".collateral.json"
    collateral = (
        (item.folder / collateral_name).read_bytes() if collateral_name in item.companions else None
    )
    collected = datetime.fromisoformat(item.occurred_at.replace("Z", "+00:00"))
    report = (item.folder / item.file).read_bytes()
    try:
        verdict = verify(item.kind, report, certs=chain, collateral=collateral, now=collected)
    except ValueError as exc:  # no certificates kept, evidence that does not parse
        verdict = Verdict(item.kind)
        verdict.add("evidence", False, str(exc))
    when = (
        f"verified at its collection time {item.occurred_at} (seq {item.seq})"
        if item.linked
        else f"verified at {item.occurred_at}, the time of stream {item.stream}'s first signed "
        f"evidence.archived entry (seq {item.seq}): no key links the file to its own entry"
    )
    checks.append(
        Check(
            name,
            verdict.accepted,
            when + (" with the certificates of --certs" if given else "")
            if verdict.accepted
            else "; ".join(c.line() for c in verdict.failed[:3]),
        )
    )
    return verdict


def _bound_to(log_key: str, recipients: list[str], data: bytes) -> str | None:
    import base64

    if len(data) != 64:  # 32 bytes of binding, 32 of nonce: anything else binds nothing
        return None
    for text in recipients:
        raw = base64.b64decode(text)
        if len(raw) == 32 and hmac.compare_digest(data[:32], binding_digest(log_key, raw)):
            return text
    return None


def attest_bind_check(
    bundle: Annotated[Path, typer.Argument(help="an exported bundle directory")],
    trusted_root: Annotated[
        Path | None,
        typer.Option(
            "--trusted-root",
            help="SEV-SNP: trust the ARK(s) in this PEM INSTEAD of AMD's pinned roots "
            "(a test chain; the output says so)",
        ),
    ] = None,
    certs: Annotated[
        Path | None,
        typer.Option(
            "--certs",
            help="a certificate chain (PEM) for evidence the record kept without one; a report"
            " kept with its chain is judged by that chain",
        ),
    ] = None,
    key: Annotated[
        Path | None,
        typer.Option(
            help="a recipient private key of the stream: links each evidence file to its entry "
            "and checks its digest (without one, the binding is still checked)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Check that a bundle's evidence vouches for the key that signed its checkpoints."""
    from attestation.evidence import read_trusted_roots, verify_evidence
    from record.errors import RecordError
    from record.seal import KeyPair

    for path, present in (
        (bundle, bundle.is_dir()),
        (key, key is None or key.is_file()),
        (certs, certs is None or certs.is_file()),
    ):
        if not present:
            print(f"affidavit: missing: {path} does not exist", file=sys.stderr)
            raise typer.Exit(3)
    chain: bytes | None = None
    if certs is not None:
        from attestation.certs import load_certs

        chain = certs.read_bytes()
        try:
            if not load_certs(chain):
                raise ValueError("no certificate in it")
        except ValueError as exc:
            raise typer.BadParameter(f"{certs}: {exc}", param_hint="--certs") from None
    verify: Verifier | None = None
    notice: list[Check] = []
    if trusted_root is not None:
        if not trusted_root.is_file():
            print(f"affidavit: missing: {trusted_root} does not exist", file=sys.stderr)
            raise typer.Exit(3)
        try:
            trusted = read_trusted_roots(trusted_root)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--trusted-root") from None

        def verify(kind: EvidenceKind, report: bytes, **kwargs: Any) -> Verdict:
            if kind != "snp":
                return verify_evidence(kind, report, **kwargs)
            return verify_evidence(kind, report, trusted=trusted, **kwargs)

        notice = [
            Check(
                "trust.amd_roots",
                None,
                f"NOT checked: SEV-SNP chains were held to --trusted-root {trusted_root} in "
                "place of AMD's pinned roots",
            )
        ]
    try:
        pair = KeyPair.read(key) if key is not None else None
        checks, _ = check_bundle(bundle, pair, verify=verify, certs=chain)
    except (RecordError, ValueError, OSError) as exc:
        checks = [Check("bundle", False, f"{type(exc).__name__}: {exc}")]
    checks = notice + checks
    ok = all_made_held(checks)
    if as_json:
        doc = {"verdict": "accept" if ok else "reject", "checks": [c.json() for c in checks]}
        print(json.dumps(doc, indent=2))
    else:
        for check in checks:
            print(check.line())
        print(f"verdict: {'accept' if ok else 'REJECT'}")
    raise typer.Exit(0 if ok else 1)
