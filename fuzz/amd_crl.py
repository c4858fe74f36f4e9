"""AMD's certificate revocation list (``attestation.amd_crl``): ``load_crl``, then
``check_crl`` against a real ARK, ASK and VCEK when the vectors are present.

Typed error: ``ValueError`` (``CrlError``: not a CRL); ``check_crl`` never raises for a CRL.
"""

from __future__ import annotations

from attestation.amd_crl import check_crl, load_crl
from attestation.certs import load_certs
from attestation.verdict import Verdict
from fuzz._attestation import NOW, vector, vectors

ERRORS: tuple[type[BaseException], ...] = (ValueError,)
MAX_LEN = 4_000
_VEK = vector("amd-sev-snp/go-sev-guest/vcek.der")
_CHAIN = vector("amd-sev-snp/go-sev-guest/ask_ark_milan.pem")
#: the real ASK, ARK and VCEK, parsed once (not per input): None without the vectors
_CERTS = (
    (*load_certs(_CHAIN), *load_certs(_VEK)) if _VEK is not None and _CHAIN is not None else None
)


def seeds() -> list[bytes]:
    # CRLs of another PKI (Intel's), for their structure: AMD's is not among the vectors
    pem = b"-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"
    return [
        pem,
        *vectors("intel-tdx/go-tdx-guest/rootcrl.der", "intel-tdx/go-tdx-guest/pckcrl.der"),
    ]


def target(data: bytes) -> None:
    try:
        load_crl(data)
    except ValueError:
        return
    if _CERTS is None:
        return
    ask, ark, vek = _CERTS
    verdict = Verdict("snp")
    check_crl(verdict, data, ark=ark, below=[("ASK", ask), ("VCEK", vek)], now=NOW)
