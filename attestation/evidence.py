"""One piece of attestation evidence, verified by the verifier of its kind, with what the
commands read to do it: certificate files, ``--trusted-root`` ARKs, RIM files.

Why its own module: ``attest verify`` and ``attest bind-check`` both verify evidence; the
commands (``attestation.cli``, ``attestation.bind_check``) import this, never each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from attestation.verdict import Check, EvidenceKind, Verdict

if TYPE_CHECKING:
    from attestation.nvidia_rim import Rim

__all__ = [
    "CertsNeeded",
    "Missing",
    "TrustedRoots",
    "mark_trusted_roots",
    "read_evidence",
    "read_file",
    "read_rims",
    "read_trusted_roots",
    "split_certs",
    "verify_evidence",
]


class Missing(Exception):
    """An input file that is not there (exit 3)."""


class CertsNeeded(ValueError):
    """The evidence's kind needs certificates that were not given."""


def read_file(path: Path) -> bytes:
    """The bytes of an input file; ``Missing`` when it is not there."""
    if not path.is_file():
        raise Missing(f"{path} does not exist")
    return path.read_bytes()


class TrustedRoots:
    """``--trusted-root FILE``: SEV-SNP ARKs to trust INSTEAD of AMD's pinned roots.

    ``roots`` maps the product each ARK names (its subject CN, ``ARK-<product>``) to the
    SHA-256 of its SubjectPublicKeyInfo, the form ``attestation.snp.verify_snp`` takes.
    """

    def __init__(self, path: Path, roots: Mapping[str, str]) -> None:
        self.path = path
        self.roots = dict(roots)


def read_trusted_roots(path: Path) -> TrustedRoots:
    """The self-signed ARK certificates in ``path`` (PEM or one DER).

    Raises:
        Missing: no such file.
        ValueError: no certificate parses, one is not self-issued, or its subject CN is not
            ``ARK-Milan``, ``ARK-Genoa`` or ``ARK-Turin`` (any other name says which).
    """
    from cryptography.x509.oid import NameOID

    from attestation.amd_roots import AMD_ARK_SPKI_SHA256
    from attestation.certs import load_certs, spki_sha256

    certs = load_certs(read_file(path))
    roots: dict[str, str] = {}
    for cert in certs:
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        cn = str(names[0].value) if names else ""
        product = cn.removeprefix("ARK-")
        if cert.subject != cert.issuer:
            raise ValueError(f"{path}: {cn or cert.subject.rfc4514_string()} is not a root")
        if not cn.startswith("ARK-") or product not in AMD_ARK_SPKI_SHA256:
            raise ValueError(
                f"{path}: {cn!r} is not an ARK name (ARK-{', ARK-'.join(AMD_ARK_SPKI_SHA256)})"
            )
        roots[product] = spki_sha256(cert)
    return TrustedRoots(path, roots)


def read_rims(paths: Sequence[Path]) -> list[Rim]:
    """``--rim FILE …``: the RIM files, parsed (signatures are checked by the verifier).

    Raises:
        Missing: no such file.
        RimError: a file that is not a RIM (not XML, a DTD, no Payload, …) or a second RIM of
            one kind (driver, VBIOS), naming the file.
    """
    from attestation.nvidia_rim import RimError, parse_rim

    rims: list[Rim] = []
    for path in paths:
        rim = parse_rim(read_file(path), str(path))
        same = next((r for r in rims if r.kind == rim.kind), None)
        if same is not None:
            raise RimError(f"{path}: a second {rim.kind} RIM (after {same.source}): give one")
        rims.append(rim)
    return rims


def mark_trusted_roots(verdict: Verdict, trusted: TrustedRoots) -> Verdict:
    """Say, in the verdict itself, that ``trusted`` replaced AMD's pinned roots.

    A ``trust.amd_roots`` check that was not made (``skip``) goes first, and the details that
    would say "AMD" of a root trusted from the file say ``--trusted-root`` instead.
    """
    products = ", ".join(f"{p} {fp[:16]}…" for p, fp in sorted(trusted.roots.items()))
    notice = Check(
        "trust.amd_roots",
        None,
        f"NOT checked: the chain was held to --trusted-root {trusted.path} ({products}) "
        "in place of AMD's pinned roots",
    )
    marked = [notice]
    for check in verdict.checks:
        if check.name in ("chain.ark_pinned", "vek.product") and check.ok:
            detail = check.detail.replace("the pinned AMD ", "the --trusted-root ")
            detail = detail.replace("AMD's ", "the --trusted-root ")
            check = Check(check.name, check.ok, detail)
        marked.append(check)
    verdict.checks = marked
    verdict.facts["trusted_roots"] = {"file": str(trusted.path), **trusted.roots}
    return verdict


def read_evidence(data: bytes) -> bytes:
    """Evidence as given: raw bytes, or hex text (whitespace ignored)."""
    text = data.strip()
    try:
        if text and all(c in b"0123456789abcdefABCDEF \n\r\t" for c in text):
            return bytes.fromhex(text.decode("ascii"))
    except ValueError:
        pass
    return data


def split_certs(blobs: list[bytes]) -> tuple[bytes | None, bytes]:
    """SNP ``--certs``: the VCEK/VLEK (the one EC key) and the rest of the chain, as PEM."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding

    from attestation.certs import load_certs

    certs = [cert for blob in blobs for cert in load_certs(blob)]
    leaf = next((c for c in certs if isinstance(c.public_key(), ec.EllipticCurvePublicKey)), None)
    rest = b"".join(c.public_bytes(Encoding.PEM) for c in certs if c is not leaf)
    return (leaf.public_bytes(Encoding.DER) if leaf is not None else None), rest


def verify_evidence(
    kind: EvidenceKind,
    evidence: bytes,
    *,
    certs: list[bytes],
    collateral: bytes | None,
    now: datetime,
    nonce: bytes | None = None,
    online: bool = False,
    trusted: TrustedRoots | None = None,
    rims: Sequence[Rim] = (),
    crl: bytes | None = None,
) -> Verdict:
    """Verify one piece of evidence with the verifier for its kind (``online``: also the
    steps that need the vendor's services: the GPU's RIMs and OCSP). ``trusted``
    (SEV-SNP only) replaces AMD's pinned roots, and the verdict says so. ``rims`` (NVIDIA
    only): the RIM files the GPU's measurements are compared with. ``crl`` (SEV-SNP only):
    AMD's CRL for the chain, DER or PEM."""
    if kind == "snp":
        from attestation.snp import verify_snp

        vek, chain = split_certs(certs)
        if vek is None:
            raise CertsNeeded("no VCEK or VLEK among the certificates")
        if trusted is None:
            return verify_snp(evidence, vek, chain, now=now, crl=crl)
        verdict = verify_snp(evidence, vek, chain, now=now, trusted_roots=trusted.roots, crl=crl)
        return mark_trusted_roots(verdict, trusted)
    if trusted is not None:
        raise ValueError("--trusted-root is for SEV-SNP evidence only")
    if kind == "tdx":
        from attestation.tdx import verify_tdx

        return verify_tdx(evidence, now=now, collateral=collateral)
    from attestation.nvidia import verify_nvidia

    if not certs:
        raise CertsNeeded("NVIDIA evidence needs its certificate chain")
    return verify_nvidia(evidence, b"".join(certs), now=now, nonce=nonce, online=online, rims=rims)
