"""``affidavit attest verify`` and ``affidavit attest bind-check``: an auditor's commands.

They need the base install only (``cryptography``, ``pydantic``, ``typer``): no engine, no
proxy. ``verify`` checks one piece of evidence against its certificates (and collateral),
optionally a policy and a signed published-measurements file, and prints one line per check
and the verdict; ``bind-check`` checks that an exported bundle's evidence vouches for the
key that signed its checkpoints; ``policy --show`` prints every policy default and why.
Exit codes: 0 accept, 1 reject, 2 usage, 3 an input file (or AMD's CRL) is missing. ``affidavit attest collect`` (inside the appliance) is added by the harness.

Both take ``--trusted-root FILE`` for SEV-SNP: the self-signed ARK certificate(s) in FILE
replace AMD's pinned roots. It exists to rehearse the whole path with a test chain (the
auditor guide's test does); the verdict then opens with a ``skip trust.amd_roots`` line
saying that AMD's roots were NOT checked, and the checks that would name an AMD root name
the file instead, so a verdict reached that way cannot pass for one against AMD's roots.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from attestation.evidence import (
    CertsNeeded,
    Missing,
    mark_trusted_roots,
    read_evidence,
    read_file,
    read_rims,
    read_trusted_roots,
    split_certs,
    verify_evidence,
)
from attestation.verdict import EvidenceKind, Verdict

__all__ = ["RELEASE_KEY", "parse_now", "register"]

EXIT_ACCEPT, EXIT_REJECT, EXIT_USAGE, EXIT_MISSING = 0, 1, 2, 3
#: Where a release's public key is committed (``measurements/release.pub``).
RELEASE_KEY = Path(__file__).resolve().parents[1] / "measurements" / "release.pub"


#: How long one KDS request may take: AMD's KDS answers slowly at times (well past httpx's
#: 5 s default), and a revocation check that gives up early fails the verdict for nothing.
KDS_TIMEOUT_S = 30.0


def parse_now(text: str | None) -> datetime:
    """``--now``: an RFC 3339 time with its offset (default: this instant, UTC)."""
    if text is None:
        return datetime.now(UTC)
    try:
        # RFC 3339 allows "z" for "Z" (UTC); Python 3.11's fromisoformat reads only "Z"
        when = datetime.fromisoformat(text[:-1] + "Z" if text.endswith("z") else text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an RFC 3339 time", param_hint="--now") from None
    if when.tzinfo is None:
        raise typer.BadParameter(f"{text!r} has no UTC offset", param_hint="--now")
    return when.astimezone(UTC)


def _print(verdict: Verdict, as_json: bool) -> None:
    if as_json:
        doc: dict[str, Any] = {
            "verdict": "accept" if verdict.accepted else "reject",
            "checks": [c.json() for c in verdict.checks],
            "kind": verdict.kind,
            "facts": verdict.facts,
        }
        print(json.dumps(doc, indent=2, default=str))
        return
    for check in verdict.checks:
        print(check.line())
    unchecked = len(verdict.not_checked)
    tail = f" ({unchecked} not checked: see the skip lines)" if unchecked else ""
    print(f"verdict: {'accept' if verdict.accepted else 'REJECT'}{tail}")


def attest_verify(
    evidence: Annotated[Path, typer.Option(help="the report, quote or SPDM evidence (raw or hex)")],
    kind: Annotated[str, typer.Option(help="snp, tdx or nvidia")],
    certs: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="PEM_FILE",
            help="certificates: VCEK/VLEK and ASK+ARK, or the GPU chain (repeatable)",
        ),
    ] = None,
    collateral: Annotated[
        Path | None, typer.Option(help="TDX collateral (TCB info, QE identity)")
    ] = None,
    published: Annotated[Path | None, typer.Option(help="a published measurements file")] = None,
    release_key: Annotated[
        Path | None, typer.Option(help="the pinned release key (default: measurements/release.pub)")
    ] = None,
    policy: Annotated[Path | None, typer.Option(help="a policy file (JSON)")] = None,
    nonce: Annotated[str | None, typer.Option(help="the expected nonce, hex")] = None,
    now: Annotated[
        str | None, typer.Option(help="verification time, RFC 3339 (default: now)")
    ] = None,
    online: Annotated[
        bool, typer.Option("--online", help="also the online steps (GPU RIMs, OCSP)")
    ] = False,
    trusted_root: Annotated[
        Path | None,
        typer.Option(
            "--trusted-root",
            help="SEV-SNP: trust the ARK(s) in this PEM INSTEAD of AMD's pinned roots "
            "(a test chain; the verdict says so)",
        ),
    ] = None,
    rim: Annotated[
        list[Path] | None,
        typer.Option(
            "--rim",
            metavar="SWIDTAG_FILE",
            help="NVIDIA: a RIM file (.swidtag) to compare the measurements with (driver, "
            "VBIOS; repeat the option)",
        ),
    ] = None,
    crl: Annotated[
        Path | None,
        typer.Option("--crl", help="SEV-SNP: AMD's CRL for the chain (DER or PEM)"),
    ] = None,
    fetch_crl: Annotated[
        bool,
        typer.Option(
            "--fetch-crl", help="SEV-SNP: fetch AMD's CRL for the VCEK's product from KDS"
        ),
    ] = False,
    kds: Annotated[
        str, typer.Option("--kds", help="the KDS base URL --fetch-crl asks")
    ] = "https://kdsintf.amd.com",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Verify attestation evidence; one line per check, then the verdict."""
    from attestation.policy import Policy, PolicyError, apply_policy, load_policy
    from attestation.published import (
        PublishedError,
        SignatureMismatch,
        check_published,
        load_published,
        read_public_key,
    )

    if kind not in ("snp", "tdx", "nvidia"):
        raise typer.BadParameter(f"{kind!r}: snp, tdx or nvidia", param_hint="--kind")
    if trusted_root is not None and kind != "snp":
        raise typer.BadParameter("is for --kind snp only", param_hint="--trusted-root")
    if rim and kind != "nvidia":
        raise typer.BadParameter("is for --kind nvidia only", param_hint="--rim")
    if (crl is not None or fetch_crl) and kind != "snp":
        raise typer.BadParameter("is for --kind snp only", param_hint="--crl/--fetch-crl")
    if crl is not None and fetch_crl:
        raise typer.BadParameter("give --crl FILE or --fetch-crl, not both", param_hint="--crl")
    when = parse_now(now)
    try:
        expected = bytes.fromhex(nonce) if nonce is not None else None
    except ValueError:
        raise typer.BadParameter(f"{nonce!r} is not hex", param_hint="--nonce") from None
    try:
        data = read_evidence(read_file(evidence))
        blobs = [read_file(p) for p in certs or []]
        extra = read_file(collateral) if collateral is not None else None
        try:
            trusted = read_trusted_roots(trusted_root) if trusted_root is not None else None
        except Missing:
            raise
        except ValueError as exc:  # a file that holds no ARK
            raise typer.BadParameter(str(exc), param_hint="--trusted-root") from None
        try:
            rims = read_rims(rim or [])
        except Missing:
            raise
        except ValueError as exc:  # a file that is not a RIM, named
            raise typer.BadParameter(str(exc), param_hint="--rim") from None
        revocations = read_file(crl) if crl is not None else None
        if fetch_crl:
            revocations = _fetch_crl(blobs, kds)
        rules = load_policy(policy) if policy is not None else Policy()
        if expected is not None and rules.nonce is None and kind != "nvidia":
            # the GPU verifier checks its nonce itself; for SNP and TDX it is report_data's tail
            rules = rules.model_copy(update={"nonce": expected.hex()})
        promised, untrusted = None, None
        if published is not None:
            key_path = release_key or RELEASE_KEY
            read_file(key_path)
            try:
                promised = load_published(published, read_public_key(key_path))
            except SignatureMismatch as exc:  # a problem found, not a usage error
                untrusted = str(exc)
    except Missing as exc:
        print(f"affidavit: missing: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_MISSING) from None
    except (PolicyError, PublishedError) as exc:
        print(f"affidavit: error: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None
    which = cast(EvidenceKind, kind)
    try:
        verdict = verify_evidence(
            which,
            data,
            certs=blobs,
            collateral=extra,
            now=when,
            nonce=expected,
            online=online,
            rims=rims,
            trusted=trusted,
            crl=revocations,
        )
    except CertsNeeded as exc:
        raise typer.BadParameter(str(exc), param_hint="--certs") from None
    except ValueError as exc:  # evidence that does not parse: a rejection, said plainly
        verdict = Verdict(which)
        verdict.add("parse", False, str(exc))
        if trusted is not None:
            mark_trusted_roots(verdict, trusted)
    apply_policy(verdict, rules)
    if promised is not None:
        verdict.add("published.signature", True, f"{published} is signed by the release key")
        check_published(verdict, promised)
    elif untrusted is not None:
        verdict.add("published.signature", False, untrusted)
    _print(verdict, as_json)
    raise typer.Exit(EXIT_ACCEPT if verdict.accepted else EXIT_REJECT)


def _fetch_crl(blobs: list[bytes], kds: str) -> bytes:
    """``--fetch-crl``: AMD's CRL for the product the VCEK/VLEK names, from ``kds``.

    Raises:
        Missing: KDS did not give it (no answer, not 200, not a CRL), naming the address.
    """
    import httpx

    from attestation.amd_crl import CrlError
    from attestation.amd_crl import fetch_crl as fetch
    from attestation.snp import parse_vek

    vek, _ = split_certs(blobs)
    product = parse_vek(vek).product if vek is not None else None
    if product is None:
        raise typer.BadParameter("no VCEK/VLEK naming its product", param_hint="--certs")
    try:
        with httpx.Client(timeout=KDS_TIMEOUT_S, trust_env=False) as client:
            return fetch(product, client, base=kds)
    except CrlError as exc:
        raise Missing(f"AMD's CRL: {exc}") from None


def attest_policy(
    show: Annotated[
        bool, typer.Option("--show", help="print every member, its value and why")
    ] = False,
    policy: Annotated[
        Path | None, typer.Option(help="a policy file: show its values over the defaults")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Print the attestation policy: every member, its default (or the file's value), why."""
    from attestation.policy import REASONS, Policy, PolicyError, load_policy

    if not show:
        raise typer.BadParameter("say --show", param_hint="--show")
    defaults = Policy()
    try:
        rules = load_policy(policy) if policy is not None else defaults
    except PolicyError as exc:
        if policy is not None and not policy.is_file():
            print(f"affidavit: missing: {policy} does not exist", file=sys.stderr)
            raise typer.Exit(EXIT_MISSING) from None
        print(f"affidavit: error: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None
    values = rules.model_dump(mode="json")
    base = defaults.model_dump(mode="json")
    members = [
        {
            "name": name,
            "value": values[name],
            "default": base[name],
            "from_file": name in rules.model_fields_set,
            "why": REASONS.get(name, "(no reason stated)"),
        }
        for name in type(rules).model_fields
    ]
    if as_json:
        doc = {"policy": values, "file": str(policy) if policy else None, "members": members}
        print(json.dumps(doc, indent=2))
        return
    for member in members:
        source = f"  (from {policy})" if member["from_file"] else ""
        print(f"{member['name']} = {json.dumps(member['value'])}{source}")
        print(f"    why: {member['why']}")


def register(app: typer.Typer) -> typer.Typer:
    """Add ``attest`` (with ``verify`` and ``bind-check``) to ``app``; returns the sub-app so
    the harness can add ``collect``."""
    from attestation import bind_check

    attest = typer.Typer(
        name="attest",
        help="Attestation: verify evidence, check a bundle's binding, collect (in the appliance).",
        no_args_is_help=True,
    )
    attest.command("verify")(attest_verify)
    attest.command("bind-check")(bind_check.attest_bind_check)
    attest.command("policy")(attest_policy)
    app.add_typer(attest)
    return attest
