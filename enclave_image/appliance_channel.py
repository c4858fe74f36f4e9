"""The guest's side of the attested channel: fresh evidence for ``GET /attestation``.

PID 1 serves the external TLS port with ``harness.front.Front``: TLS with the key kept on the
state disk (``attestation.tls_identity``), ``/attestation`` answered with fresh evidence
bound to the client's nonce and to that key (``attestation.binding`` v2), every other request
relayed to the proxy on loopback. The evidence comes from here: a report asked of the TEE
through configfs-tsm (or ``/dev/sev-guest``) for each request, with the certificate chain
kept at boot (the host's certificate table, or AMD's KDS through the proxy), so a client
needs nothing but the reply to check it.

The file operations go through ``appliance_tsm.ReportFiles``, so a test stands a double in
for the kernel's side; the guest uses the real files.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path

from attestation.channel import NoEvidence, Piece
from enclave_image.appliance_tsm import TSM_REPORTS, ReportFiles, collect_evidence

__all__ = ["GuestEvidence"]


class GuestEvidence:
    """An ``attestation.channel.EvidenceSource`` over this guest's TEE: one fresh report per
    request, with ``chain`` (PEM: VCEK, ASK, ARK; empty when none could be had at boot)."""

    def __init__(
        self,
        chain: bytes,
        *,
        reports: Path = TSM_REPORTS,
        sev_guest: Path = Path("/dev/sev-guest"),
        files: ReportFiles | None = None,
    ) -> None:
        self.chain = chain
        self.reports = reports
        self.sev_guest = sev_guest
        self.files = files

    def collect(self, report_data: bytes, nonce: bytes) -> Sequence[Piece]:
        """A report carrying ``report_data``; ``NoEvidence`` when this guest has no TEE.
        (``nonce`` is for a GPU, which this guest does not ask yet.)"""
        got = collect_evidence(
            report_data, reports=self.reports, sev_guest=self.sev_guest, files=self.files
        )
        if got is None:
            raise NoEvidence(f"neither {self.reports} nor {self.sev_guest} is here: no TEE")
        evidence = base64.b64encode(got.report).decode("ascii")
        if got.kind == "sev-snp":
            return [Piece(kind="snp", evidence=evidence, certs=self.chain.decode("ascii"))]
        # TDX: the quote alone; its collateral (Intel's PCS) is the client's to fetch
        return [Piece(kind="tdx", evidence=evidence)]
