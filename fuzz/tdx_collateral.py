"""Intel's collateral for a TDX quote (``attestation.tdx_collateral``): one real quote (from
the vectors; a quote built in code without them) verified with the input as its collateral
JSON: the exact-text extraction, signatures, issuer chains, CRLs and the TCB levels.

Typed error: ``ValueError`` (collateral that is not a JSON object); every other problem is
a failed check in the verdict.
"""

from __future__ import annotations

import contextlib

from attestation.tdx import verify_tdx
from fuzz._attestation import NOW, tdx_quote, vector, vectors
from fuzz.common import dumps

ERRORS: tuple[type[BaseException], ...] = (ValueError,)
JSON_PREFIX = 0  # the input's JSON starts here: the JSON-aware mutations apply
MAX_LEN = 20_000  # the longest input the fuzzer makes: the vectors fit
_QUOTE = vector("intel-tdx/dcap-qvl/tdx_quote") or tdx_quote(4)


def seeds() -> list[bytes]:
    built = dumps(
        {
            "tcb_info": '{"tcbInfo":{"id":"TDX","version":3,"fmspc":"00806f050000",'
            '"issueDate":"2024-01-01T00:00:00Z","nextUpdate":"2026-01-01T00:00:00Z",'
            '"tcbLevels":[]},"signature":"' + "00" * 64 + '"}',
            "qe_identity": '{"id":"TD_QE","version":2,"enclaveIdentity":{}}',
            "qe_identity_signature": "00" * 64,
            "tcb_info_issuer_chain": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
            "qe_identity_issuer_chain": "",
            "root_ca_crl": "3000",
            "pck_crl": "-----BEGIN X509 CRL-----\nMIIB\n-----END X509 CRL-----\n",
        }
    )
    return [
        built,
        *vectors(
            "intel-tdx/dcap-qvl/tdx_quote_collateral.json",
            "intel-tdx/dcap-qvl/tdx_quote_outdated_collateral.json",
            "intel-tdx/go-tdx-guest/collateral_v4.derived.json",
        ),
    ]


def target(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        verify_tdx(_QUOTE, now=NOW, collateral=data)
