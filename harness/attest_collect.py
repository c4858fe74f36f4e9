"""``affidavit attest collect``: keep the appliance's attestation evidence in a session's record.

Run inside the appliance. The evidence itself comes from the platform's own tools (for
SEV-SNP ``snpguest report`` with the ``report_data`` this command prints, then ``snpguest
fetch vcek`` and ``fetch ca``; for TDX the quote and Intel's collateral; for the GPU the SPDM
evidence and its chain): ``--print-report-data`` prints the 64 bytes the evidence must carry
(``attestation.binding``: the log's checkpoint key and the appliance's sealing key, and the
nonce). The command checks that binding before anything is kept, then hands each file to the
proxy (control plane ``ArchiveEvidence``), which records an ``evidence.archived`` entry; its
time is the collection time ``attest bind-check`` judges the evidence at.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]

_KIND = {"snp": "sev-snp", "tdx": "tdx", "nvidia": "nvidia-h100"}


def _keys(home_dir: Path | None) -> tuple[str, bytes]:
    """The appliance's log verifier key and raw sealing public key."""
    from harness.state import Home, HomeMissing
    from record.backends import open_store
    from record.seal import KeyPair

    home = Home.at(home_dir)
    appliance = home.appliance()
    store = open_store(appliance.store, readonly=True)
    try:
        log_key = store.get_meta("log_key")
    finally:
        store.close()
    if log_key is None:
        raise HomeMissing(f"the store {appliance.store} has no log key yet")
    sealing = KeyPair.read(home.root / "appliance.key").recipient
    return log_key, sealing.public.public_bytes_raw()


def register(attest: typer.Typer) -> None:
    """Add ``collect`` to the ``attest`` sub-app."""

    @attest.command("collect")
    def collect(
        session: Annotated[str, typer.Argument(help="the session (stream) to keep it in")],
        kind: Annotated[str, typer.Option(help="snp, tdx or nvidia")] = "snp",
        evidence: Annotated[
            Path | None, typer.Option(help="the report, quote or SPDM evidence")
        ] = None,
        certs: Annotated[Path | None, typer.Option(help="its certificates, PEM")] = None,
        collateral: Annotated[Path | None, typer.Option(help="TDX collateral (JSON)")] = None,
        nonce: Annotated[str, typer.Option(help="the verifier's nonce, hex")] = "",
        print_report_data: Annotated[
            bool, typer.Option("--print-report-data", help="print the report_data to ask for")
        ] = False,
        home: Annotated[Path | None, typer.Option(help="the state folder")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    ) -> None:
        """Keep attestation evidence (bound to the log and sealing keys) in a session's record."""
        import json

        from attestation.binding import binding_digest, report_data
        from attestation.evidence import read_evidence
        from harness.session import control
        from harness.state import Home

        if kind not in _KIND:
            raise typer.BadParameter(f"{kind!r}: snp, tdx or nvidia", param_hint="--kind")
        try:
            fresh = bytes.fromhex(nonce)
        except ValueError:
            raise typer.BadParameter(f"{nonce!r} is not hex", param_hint="--nonce") from None
        log_key, sealing = _keys(home)
        if print_report_data:
            print(report_data(log_key, sealing, fresh).hex())
            return
        if evidence is None:
            raise typer.BadParameter("give the --evidence file (or --print-report-data)")
        for path in (evidence, certs, collateral):
            if path is not None and not path.is_file():
                print(f"affidavit: missing: {path} does not exist", file=sys.stderr)
                raise typer.Exit(3)
        report = read_evidence(evidence.read_bytes())
        if kind != "nvidia":  # a GPU's evidence carries a nonce, not the binding
            carried = _report_data(kind, report)
            if carried[:32] != binding_digest(log_key, sealing):
                print(
                    "affidavit: the evidence's report_data does not bind this appliance's log "
                    f"key and sealing key (ask for {report_data(log_key, sealing, fresh).hex()})",
                    file=sys.stderr,
                )
                raise typer.Exit(1)
        from attestation.bind_check import evidence_names

        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        names = evidence_names(kind, stamp)  # type: ignore[arg-type]
        files = [(names[0], report)]
        if certs is not None:
            files.append((names[1], certs.read_bytes()))
        if collateral is not None:
            files.append((names[2], collateral.read_bytes()))
        kept = []
        with control(Home.at(home).appliance()) as client:
            for name, data in files:
                answer = client.archive_evidence(session, _KIND[kind], name, data)
                kept.append({"file": name, "seq": answer.seq, "collected_at": answer.occurred_at})
        if as_json:
            print(json.dumps({"session": session, "kept": kept}, indent=2))
        else:
            for item in kept:
                print(f"kept {item['file']} at seq {item['seq']} ({item['collected_at']})")


def _report_data(kind: str, report: bytes) -> bytes:
    if kind == "snp":
        from attestation.snp import parse_report

        return bytes(parse_report(report).report_data)
    from attestation.tdx import parse_tdx_quote

    return bytes(parse_tdx_quote(report).body.report_data)
