"""AMD's certificate revocation list for an SEV-SNP chain: read it, check it, fetch it.

AMD's Key Distribution Service publishes one CRL per product, signed by that product's ARK
(RSA-PSS, SHA-384, 48-byte salt, like every certificate in the chain), at
``https://kdsintf.amd.com/vcek/v1/{product}/crl`` (DER). It lists the serials AMD revoked
below the ARK. ``check_crl`` adds one ``chain.revocation`` check to a verdict: the CRL names
the ARK as its issuer and carries the ARK's signature, ``now`` lies within its
``thisUpdate`` .. ``nextUpdate``, and neither the ASK/ASVK nor the VCEK/VLEK is listed (a
revoked one is named by its serial). Without a CRL the check is listed as not made.

``fetch_crl`` asks KDS for the CRL through the ``httpx.Client`` it is given (so a test can
point it at a stand-in KDS on loopback); nothing here opens a connection by itself.
"""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID, SignatureAlgorithmOID

from attestation.verdict import Verdict

__all__ = ["KDS_URL", "CrlError", "check_crl", "crl_url", "fetch_crl", "load_crl"]

#: AMD's Key Distribution Service
KDS_URL = "https://kdsintf.amd.com"
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)
NAME = "chain.revocation"


class CrlError(ValueError):
    """A CRL that cannot be read or fetched, saying why."""


def load_crl(data: bytes) -> x509.CertificateRevocationList:
    """A CRL from DER or PEM bytes; ``CrlError`` if it does not parse."""
    try:
        if b"-----BEGIN X509 CRL-----" in data:
            crl = x509.load_pem_x509_crl(data)
        else:
            crl = x509.load_der_x509_crl(data)
        # ``cryptography`` reads these only when asked: read them now, so a malformed one is
        # refused here as CrlError, not deep inside the check (found by fuzzing)
        crl.issuer  # noqa: B018
        crl.signature_algorithm_oid  # noqa: B018
        crl.next_update_utc  # noqa: B018
        crl.last_update_utc  # noqa: B018
        for revoked in crl:
            revoked.serial_number  # noqa: B018
            revoked.revocation_date_utc  # noqa: B018
    # neither InvalidVersion nor a name attribute of a type its OID does not take (TypeError)
    # is a ValueError (fuzzing)
    except (ValueError, TypeError, x509.InvalidVersion) as exc:
        raise CrlError(f"not a CRL (DER or PEM): {exc}") from None
    return crl


def crl_url(product: str, base: str = KDS_URL) -> str:
    """KDS's CRL address for ``product`` (``Milan``, ``Genoa``, ``Turin``)."""
    return f"{base.rstrip('/')}/vcek/v1/{product}/crl"


def fetch_crl(product: str, client: httpx.Client, *, base: str = KDS_URL) -> bytes:
    """The DER CRL KDS serves for ``product``; ``CrlError`` naming the address otherwise."""
    url = crl_url(product, base)
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        raise CrlError(f"{url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise CrlError(f"{url}: HTTP {response.status_code}")
    load_crl(response.content)  # refuse what is not a CRL here, naming the address
    return response.content


def _cn(name: x509.Name) -> str:
    found = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(found[0].value) if found else name.rfc4514_string()


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _signed_by_ark(crl: x509.CertificateRevocationList, ark: x509.Certificate) -> str | None:
    """None when the ARK's key made the CRL's RSA-PSS signature and it names the ARK."""
    if crl.issuer != ark.subject:
        return f"the CRL's issuer is {crl.issuer.rfc4514_string()}, not {_cn(ark.subject)}"
    key = ark.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        return f"{_cn(ark.subject)} has no RSA key"
    if crl.signature_algorithm_oid != SignatureAlgorithmOID.RSASSA_PSS:
        return "the CRL is not signed with RSASSA-PSS"
    try:
        key.verify(crl.signature, crl.tbs_certlist_bytes, _PSS, hashes.SHA384())
    except InvalidSignature:
        return (
            f"the CRL's RSA-PSS SHA-384 (salt 48) signature does not verify with "
            f"{_cn(ark.subject)}'s key"
        )
    return None


def check_crl(
    verdict: Verdict,
    data: bytes | None,
    *,
    ark: x509.Certificate | None,
    below: list[tuple[str, x509.Certificate]],
    now: datetime,
) -> None:
    """Add ``chain.revocation``: ``data`` (AMD's CRL, DER or PEM) is signed by ``ark``, in
    force at ``now``, and lists none of ``below`` (role, certificate: the ASK/ASVK and the
    VCEK/VLEK). ``data`` None: the check is listed as not made."""
    if data is None:
        verdict.add(NAME, None, "no CRL given (--crl): revocation was not checked")
        return
    try:
        crl = load_crl(data)
    except CrlError as exc:
        verdict.add(NAME, False, str(exc))
        return
    if ark is None:
        verdict.add(NAME, False, "no ARK to check the CRL's signature with")
        return
    why = _signed_by_ark(crl, ark)
    if why is not None:
        verdict.add(NAME, False, why)
        return
    start, end = crl.last_update_utc, crl.next_update_utc
    window = f"{_when(start)} .. {_when(end) if end is not None else '(no nextUpdate)'}"
    verdict.facts["crl"] = {"issuer": _cn(crl.issuer), "this_update": _when(start)}
    if end is not None:
        verdict.facts["crl"]["next_update"] = _when(end)
    if end is None or not start <= now <= end:
        verdict.add(NAME, False, f"the CRL is in force {window}, not at {_when(now)}")
        return
    revoked = []
    for role, cert in below:
        entry = crl.get_revoked_certificate_by_serial_number(cert.serial_number)
        if entry is not None:
            revoked.append(
                f"{role} {_cn(cert.subject)} (serial {cert.serial_number:#x}) is revoked since "
                f"{_when(entry.revocation_date_utc)}"
            )
    if revoked:
        verdict.add(NAME, False, "; ".join(revoked))
        return
    roles = [f"{role} (serial {cert.serial_number:#x})" for role, cert in below]
    listed = (
        f"lists neither {roles[0]} nor {roles[1]}"
        if len(roles) == 2
        else (f"does not list {', '.join(roles) or 'anything checked'}")
    )
    verdict.add(NAME, True, f"{_cn(ark.subject)}'s CRL ({window}, {len(crl)} entries) {listed}")
