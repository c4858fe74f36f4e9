"""AMD SEV-SNP reports (``attestation.snp_report``): ``load_report`` and every derived field,
then ``attestation.snp.verify_snp`` with a real VCEK and chain when the vectors are present.

Typed error: ``ValueError`` (``load_report``); ``verify_snp`` never raises for evidence.
"""

from __future__ import annotations

from attestation.snp import verify_snp
from attestation.snp_report import load_report
from fuzz._attestation import NOW, snp_report, vector, vectors

ERRORS: tuple[type[BaseException], ...] = (ValueError,)
MAX_LEN = 2_400  # the longest input the fuzzer makes: the vectors fit
_VEK = vector("amd-sev-snp/go-sev-guest/vcek.der")
_CHAIN = vector("amd-sev-snp/go-sev-guest/ask_ark_milan.pem")


def seeds() -> list[bytes]:
    built = [snp_report(v) for v in (2, 3, 5)] + [snp_report(3).hex().encode()]
    return built + vectors(
        "amd-sev-snp/go-sev-guest/attestation.bin",
        "amd-sev-snp/virtee-sev/report_milan.hex",
        "amd-sev-snp/trustee/test-report.bin",
        "amd-sev-snp/trustee/test-vlek-report.bin",
        "amd-sev-snp/trustee/az-snp-vtpm/genoa_snp_report.derived.bin",
    )


def target(data: bytes) -> None:
    try:
        report = load_report(data)
    except ValueError:
        report = None
    if report is not None:
        for name in ("debug", "migrate_ma", "smt_allowed", "single_socket", "abi_major",
                     "abi_minor", "author_key_en", "mask_chip_key", "signing_key",
                     "signing_key_kind", "cpuid_product"):  # fmt: skip
            getattr(report, name)
        report.current_tcb.as_dict()
        for product in ("Milan", "Genoa", "Turin"):
            report.with_product(product)
    if _VEK is not None and _CHAIN is not None:
        verify_snp(data, _VEK, _CHAIN, now=NOW)
