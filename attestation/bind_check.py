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

Opening ``evidence.archived`` bodies (their kind and file name) needs a recipient key.
``--trusted-root FILE`` (SEV-SNP) replaces AMD's pinned roots with the ARK(s) in FILE, for a
rehearsal with a test chain; the output then opens with ``skip trust.amd_roots`` (see
``attestation.cli``).
Files are named ``<kind>-<stamp>.report`` / ``.certs.pem`` / ``.collateral.json``.
"""

from __future__ import annotations

import hmac
import json
import sys
from collections.abc import Callable
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


def check_bundle(
    bundle: Path, key: Any, *, verify: Verifier | None = None, certs: bytes | None = None
) -> tuple[list[Check], list[Verdict]]:
    """The binding checks of ``bundle`` (opened with ``key``, a ``record.seal.KeyPair``), and
    the verdict of each archived report. ``verify`` replaces the evidence verifier (tests).
    ``certs``: a chain (PEM) for the reports the record kept without one (``--certs``); a
    report kept with its chain is judged by that chain only, the record's word."""
    from attestation.cli import verify_evidence
    from record.bundle import ENTRIES, EVIDENCE, LOG_KEY, verify_bundle
    from record.reader import StreamKeys
    from record.schema import EvidenceArchived, StreamOpened, parse_entry

    checks: list[Check] = []
    log_key = (bundle / LOG_KEY).read_text().strip()
    integrity = verify_bundle(bundle, key=key, log_key=log_key)
    checks.append(
        Check(
            "bundle",
            integrity.ok,
            f"{integrity.entries} entries and the checkpoints verify under {log_key}"
            if integrity.ok
            else "; ".join(f"{p.code}: {p.detail}" for p in integrity.problems[:3]),
        )
    )
    entries = [parse_entry(line) for line in (bundle / ENTRIES).read_bytes().splitlines()]
    stream = entries[0].stream
    # Entries at positions below this are covered by a checkpoint the log key signed.
    signed_size = integrity.entries - integrity.unsigned.get(stream, integrity.entries)
    keys = StreamKeys.collect(stream, entries, key)
    opened = [(entry, keys.open(entry)) for entry in entries]
    sealing = [
        w.recipient for _, body in opened if isinstance(body, StreamOpened) for w in body.recipients
    ]
    archived = [(e, b) for e, b in opened if isinstance(b, EvidenceArchived)]
    files = {b.file: (e, b) for e, b in archived}
    verdicts: list[Verdict] = []
    reports = [(e, b) for e, b in archived if b.file.endswith(".report")]
    if not reports:
        checks.append(Check("evidence", False, "the bundle holds no archived report"))
    for entry, body in reports:
        kind = KINDS[body.evidence_kind]
        if entry.seq >= signed_size:
            checks.append(
                Check(
                    f"evidence.{body.file}",
                    False,
                    f"not judged: its entry (seq {entry.seq}) is covered by no signed checkpoint "
                    f"(they cover {signed_size} entries), so its time {entry.occurred_at} is "
                    "not the log's word",
                )
            )
            continue
        base = body.file[: -len(".report")]
        collected = datetime.fromisoformat(entry.occurred_at.replace("Z", "+00:00"))
        report = (bundle / EVIDENCE / body.file).read_bytes()
        kept = [
            (bundle / EVIDENCE / name).read_bytes()
            for name in (base + ".certs.pem",)
            if name in files
        ]
        given = not kept and certs is not None
        chain = kept if kept else [certs] if certs is not None else []
        collateral_name = base + ".collateral.json"
        collateral = (
            (bundle / EVIDENCE / collateral_name).read_bytes() if collateral_name in files else None
        )
        check = verify or verify_evidence
        try:
            verdict = check(kind, report, certs=chain, collateral=collateral, now=collected)
        except ValueError as exc:  # no certificates kept, evidence that does not parse
            verdict = Verdict(kind)
            verdict.add("evidence", False, str(exc))
        verdicts.append(verdict)
        checks.append(
            Check(
                f"evidence.{body.file}",
                verdict.accepted,
                f"verified at its collection time {entry.occurred_at} (seq {entry.seq})"
                + (" with the certificates of --certs" if given else "")
                if verdict.accepted
                else "; ".join(c.line() for c in verdict.failed[:3]),
            )
        )
        data = bytes.fromhex(str(verdict.facts.get("report_data", "")))
        bound = _bound_to(log_key, sealing, data)
        checks.append(
            Check(
                f"binding.{body.file}",
                bound is not None,
                f"report_data binds the log key and sealing key {bound}"
                if bound is not None
                else "report_data binds neither this log key nor any recipient of the stream",
            )
        )
    return checks, verdicts


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
    key: Annotated[Path, typer.Option(help="a recipient private key of the stream")],
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
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Check that a bundle's evidence vouches for the key that signed its checkpoints."""
    from attestation.cli import read_trusted_roots, verify_evidence
    from record.errors import RecordError
    from record.seal import KeyPair

    for path, present in (
        (bundle, bundle.is_dir()),
        (key, key.is_file()),
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
        checks, _ = check_bundle(bundle, KeyPair.read(key), verify=verify, certs=chain)
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
