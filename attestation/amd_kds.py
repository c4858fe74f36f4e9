"""Where AMD's Key Distribution Service keeps an SEV-SNP report's certificates.

KDS (AMD publication 57230) serves, for each product (``Milan``, ``Genoa``, ``Turin``):

- the VCEK of one chip at one TCB, DER:
  ``/vcek/v1/{product}/{hwid}?blSPL=..&teeSPL=..&snpSPL=..&ucodeSPL=..``, where ``hwid`` is
  the report's CHIP_ID in lower-case hex (on Turin its first 8 bytes, and ``fmcSPL`` comes
  first) and the SPLs are REPORTED_TCB's components, two decimal digits at least;
- the ASK and the ARK, PEM, ASK first: ``/vcek/v1/{product}/cert_chain``.

Why here: the appliance asks KDS (through the proxy, which records both answers) when the host
hands the guest no certificate table, and keeps the chain beside its report. ``vcek_path``
names what to ask for, ``chain_from_kds`` checks the answers belong to the report and joins
them into the PEM chain (VCEK, ASK, ARK) that ``bind-check`` and ``attest verify`` read. The
chain is *not* trusted here: the verifier checks it against AMD's pinned roots.
This module dials nothing.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.serialization import Encoding

from attestation.certs import load_certs
from attestation.snp import parse_vek
from attestation.snp_report import Product, SnpReport

__all__ = ["KdsError", "chain_from_kds", "chain_path", "vcek_path"]


class KdsError(ValueError):
    """A report KDS cannot be asked about, or an answer that is not what was asked for."""


def _product(report: SnpReport, cpu: Product | None) -> Product:
    """The report's product from its CPUID fields (version 3 on), else ``cpu``: what the
    guest's own CPUID says (a report of version 2 carries none). A wrong one only asks KDS for
    another product's documents, which then do not verify."""
    product = report.cpuid_product or cpu
    if product is None:
        raise KdsError(
            f"the report (version {report.version}) names no known product in its CPUID"
            " fields and none was given, so there is no KDS address for its VCEK"
        )
    return product


def vcek_path(report: SnpReport, cpu: Product | None = None) -> str:
    """The KDS path of the VCEK that signs ``report`` (a VCEK-signed report: a VLEK is the
    cloud's, and KDS serves it to the cloud only); ``cpu``: the product when the report
    names none."""
    if report.signing_key_kind != "vcek":
        raise KdsError(f"the report is signed by a {report.signing_key_kind}, not a VCEK")
    product = _product(report, cpu)
    tcb = report.with_product(product).reported_tcb
    spl = f"blSPL={tcb.bl:02d}&teeSPL={tcb.tee:02d}&snpSPL={tcb.snp:02d}&ucodeSPL={tcb.ucode:02d}"
    if product == "Turin":
        return f"/vcek/v1/Turin/{report.chip_id[:8].hex()}?fmcSPL={tcb.fmc or 0:02d}&{spl}"
    return f"/vcek/v1/{product}/{report.chip_id.hex()}?{spl}"


def chain_path(report: SnpReport, cpu: Product | None = None) -> str:
    """The KDS path of the ASK and ARK of ``report``'s product."""
    return f"/vcek/v1/{_product(report, cpu)}/cert_chain"


def chain_from_kds(
    report: SnpReport, vcek_der: bytes, cert_chain_pem: bytes, cpu: Product | None = None
) -> bytes:
    """The PEM chain VCEK, ASK, ARK from KDS's two answers, after checking that the VCEK is
    a certificate for this report's chip and TCB and that ``cert_chain`` holds two
    certificates; ``KdsError`` naming what is wrong otherwise."""
    try:
        info = parse_vek(vcek_der)  # one certificate, DER or PEM, its extensions read
        vcek = load_certs(vcek_der)[0]
    except ValueError as exc:
        raise KdsError(f"KDS's VCEK answer is not a VCEK certificate: {exc}") from None
    product = _product(report, cpu)
    chip = report.chip_id[:8] if product == "Turin" else report.chip_id
    if info.kind != "vcek" or info.hwid != chip:
        raise KdsError("KDS's VCEK is for another chip than the report's CHIP_ID")
    tcb = report.with_product(product).reported_tcb.as_dict()
    if any(info.tcb.get(part) != value for part, value in tcb.items()):
        raise KdsError(f"KDS's VCEK is for TCB {info.tcb}, the report's REPORTED_TCB is {tcb}")
    try:
        ask_ark = load_certs(cert_chain_pem) if b"-----BEGIN" in cert_chain_pem else []
    except ValueError as exc:
        raise KdsError(f"KDS's cert_chain answer is not PEM certificates: {exc}") from None
    if len(ask_ark) != 2:
        raise KdsError(f"KDS's cert_chain holds {len(ask_ark)} certificates, not 2 (ASK, ARK)")
    return b"".join(cert.public_bytes(Encoding.PEM) for cert in [vcek, *ask_ark])
