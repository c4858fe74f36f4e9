"""NVIDIA H100 SPDM evidence (``attestation.nvidia``): ``parse_nvidia_evidence``, then
``verify_nvidia`` against a real certificate chain when the vectors are present.

Typed error: ``ValueError`` (evidence that does not parse, naming the field).
"""

from __future__ import annotations

import contextlib

from attestation.nvidia import parse_nvidia_evidence, verify_nvidia
from fuzz._attestation import NOW, spdm_evidence, vector, vectors

ERRORS: tuple[type[BaseException], ...] = (ValueError,)
MAX_LEN = 8_400  # the longest input the fuzzer makes: the vectors fit
_CERTS = vector("nvidia-h100/nvtrust/hopperCertChain.pem") or b""


def seeds() -> list[bytes]:
    return [
        spdm_evidence(),
        *vectors(
            "nvidia-h100/nvtrust/hopperAttestationReport.hex",
            "nvidia-h100/trustee/hopper_coco_report1.hex",
        ),
    ]


def target(data: bytes) -> None:
    try:
        evidence = parse_nvidia_evidence(data)
    except ValueError:
        return
    evidence.signed_bytes  # noqa: B018 - a derived field, read for what it might raise
    for field in evidence.response.opaque:
        field.name  # noqa: B018 - a derived field, read for what it might raise
    with contextlib.suppress(ValueError):
        verify_nvidia(data, _CERTS, now=NOW, nonce=evidence.request.nonce)
