"""An X.509 chain walked from a leaf to a self-signed root, with the reason it breaks: what
NVIDIA's device chains (``attestation.nvidia``) and RIM signing chains
(``attestation.nvidia_rim``) are both checked with.

Why by hand: ``cryptography``'s verifier builds web PKI paths (it wants a DNS name or a
client policy and refuses the extensions NVIDIA's chains carry); these chains are short and
pinned at their root, so the walk is a few lines and says exactly where it breaks.
"""

from __future__ import annotations

from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.x509.oid import ExtensionOID, NameOID

__all__ = [
    "TCG_DICE_FWID_OID",
    "build_chain",
    "ca_ok",
    "cert_name",
    "extension",
    "is_ca",
    "issued",
    "pick_leaf",
    "self_signed",
]

#: TCG DICE FWID: the firmware digest a device's leaf certificate carries
TCG_DICE_FWID_OID = x509.ObjectIdentifier("2.23.133.5.4.1")


def cert_name(cert: x509.Certificate) -> str:
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else cert.subject.rfc4514_string()


def extension(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> x509.Extension[Any] | None:
    try:
        return cert.extensions.get_extension_for_oid(oid)
    except x509.ExtensionNotFound:
        return None


def is_ca(cert: x509.Certificate) -> bool:
    bc = extension(cert, ExtensionOID.BASIC_CONSTRAINTS)
    return bc is not None and isinstance(bc.value, x509.BasicConstraints) and bc.value.ca


def self_signed(cert: x509.Certificate) -> bool:
    return cert.subject == cert.issuer


def pick_leaf(certs: list[x509.Certificate]) -> x509.Certificate:
    """The certificate no other one names as its issuer (preferring one with a FWID)."""
    candidates = [
        c for c in certs if not any(o is not c and o.issuer == c.subject for o in certs)
    ] or certs
    with_fwid = [c for c in candidates if extension(c, TCG_DICE_FWID_OID) is not None]
    return (with_fwid or candidates)[0]


def issued(child: x509.Certificate, issuer: x509.Certificate) -> str | None:
    """None if ``issuer`` signed ``child``; else why not."""
    try:
        child.verify_directly_issued_by(issuer)
    except InvalidSignature:
        return f"the signature on {cert_name(child)} does not verify with {cert_name(issuer)}'s key"
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        return f"{cert_name(child)} cannot be checked against {cert_name(issuer)}: {exc}"
    return None


def ca_ok(issuer: x509.Certificate, below: int) -> str | None:
    """None if ``issuer`` may sign certificates ``below`` intermediate CAs above a leaf."""
    bc = extension(issuer, ExtensionOID.BASIC_CONSTRAINTS)
    if bc is None or not isinstance(bc.value, x509.BasicConstraints) or not bc.value.ca:
        return f"{cert_name(issuer)} signs certificates but is not a CA (basicConstraints)"
    if bc.value.path_length is not None and below > bc.value.path_length:
        return f"{cert_name(issuer)}'s path length {bc.value.path_length} is exceeded ({below})"
    ku = extension(issuer, ExtensionOID.KEY_USAGE)
    if ku is not None and isinstance(ku.value, x509.KeyUsage) and not ku.value.key_cert_sign:
        return f"{cert_name(issuer)}'s key usage does not allow signing certificates"
    return None


def build_chain(
    leaf: x509.Certificate, pool: list[x509.Certificate], extra_root: x509.Certificate | None
) -> tuple[list[x509.Certificate], str | None]:
    """leaf → … → a self-signed root; returns the path and, if it breaks, why."""
    path = [leaf]
    candidates = [*pool, *([extra_root] if extra_root is not None else [])]
    while True:
        current = path[-1]
        if self_signed(current):
            problem = issued(current, current)
            return path, (f"the root {cert_name(current)}: {problem}" if problem else None)
        # each step adds a certificate not yet in the path, so the walk ends
        named = [c for c in candidates if c.subject == current.issuer]
        if not named:
            return path, (
                f"no certificate given issued {cert_name(current)}: its issuer "
                f"{current.issuer.rfc4514_string()} is missing"
            )
        named = [c for c in named if c not in path]
        if not named:
            return path, f"the chain loops: {cert_name(current)}'s issuer is already in it"
        problems = [(c, issued(current, c)) for c in named]
        issuer = next((c for c, p in problems if p is None), None)
        if issuer is None:
            return path, "; ".join(p for _, p in problems if p)
        ca_problem = ca_ok(issuer, len(path) - 1)
        path.append(issuer)
        if ca_problem:
            return path, ca_problem
