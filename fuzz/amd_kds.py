"""AMD KDS's two answers as the appliance gets them (``attestation.amd_kds``):
``chain_from_kds`` of a VCEK answer and a ``cert_chain`` answer, for the real go-sev-guest
report (a Milan of version 2, which names no product: "Milan" is given, as the guest's CPUID
would) when the vectors are present (else a made-up one). The input is the two answers,
split at the first ``\\x00\\xff`` (none: all of it is the VCEK answer, the real chain the other).

Typed error: ``ValueError`` (``KdsError``, naming which answer is wrong).
"""

from __future__ import annotations

from attestation.amd_kds import chain_from_kds
from attestation.certs import load_certs
from attestation.snp_report import parse_report
from fuzz._attestation import snp_report, vector
from fuzz.common import InvariantBroken

ERRORS: tuple[type[BaseException], ...] = (ValueError,)
MAX_LEN = 8_000  # a VCEK and two certificates fit
SPLIT = b"\x00\xff"
_VEK = vector("amd-sev-snp/go-sev-guest/vcek.der")
_CHAIN = vector("amd-sev-snp/go-sev-guest/ask_ark_milan.pem") or b""
_REPORT = parse_report(vector("amd-sev-snp/go-sev-guest/attestation.bin") or snp_report(3))


def seeds() -> list[bytes]:
    made = [b"", SPLIT, b"0\x82\x01\x00" + SPLIT + b"-----BEGIN CERTIFICATE-----\n"]
    if _VEK is not None:
        made += [_VEK, _VEK + SPLIT + _CHAIN, _VEK + SPLIT + _CHAIN[: len(_CHAIN) // 2]]
    return made


def target(data: bytes) -> None:
    vcek, found, chain = data.partition(SPLIT)
    try:
        pem = chain_from_kds(_REPORT, vcek, chain if found else _CHAIN, "Milan")
    except ValueError:
        return
    if len(load_certs(pem)) != 3:
        raise InvariantBroken("a chain from KDS is not three certificates (VCEK, ASK, ARK)")
