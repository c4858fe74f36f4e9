"""The SEV-SNP certificate table a host hands its guest (``attestation.snp_cert_table``):
``read_cert_table``, then ``chain_pem`` of what it read.

Typed error: ``ValueError`` (``CertTableError``, naming the row).
"""

from __future__ import annotations

from attestation.certs import load_certs
from attestation.snp_cert_table import build_cert_table, chain_pem, read_cert_table
from fuzz._attestation import vector
from fuzz.common import InvariantBroken

ERRORS: tuple[type[BaseException], ...] = (ValueError,)
MAX_LEN = 8_000  # a table of three certificates fits
_VEK = vector("amd-sev-snp/go-sev-guest/vcek.der")
_CHAIN = vector("amd-sev-snp/go-sev-guest/ask_ark_milan.pem")


def seeds() -> list[bytes]:
    made = [b"", bytes(24)]
    if _VEK is not None and _CHAIN is not None:
        from cryptography.hazmat.primitives.serialization import Encoding

        ask, ark = (c.public_bytes(Encoding.DER) for c in load_certs(_CHAIN))
        made += [
            build_cert_table([("vcek", _VEK), ("ask", ask), ("ark", ark)]),
            build_cert_table([("ark", ark)]),
        ]
    return made


def target(data: bytes) -> None:
    try:
        certs = read_cert_table(data)
    except ValueError:
        return
    pem = chain_pem(certs)
    if (pem == b"") != (certs == []) or (certs and len(load_certs(pem)) > len(certs)):
        raise InvariantBroken("the chain does not hold the table's certificates")
