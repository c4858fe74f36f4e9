"""Intel TDX quotes (``attestation.tdx_quote``): ``parse_tdx_quote``, then
``attestation.tdx.verify_tdx`` without collateral (the quote's own signatures and its PCK
chain).

Typed error: ``ValueError`` (a quote that does not parse, naming the field).
"""

from __future__ import annotations

import contextlib

from attestation.tdx import verify_tdx
from attestation.tdx_quote import parse_tdx_quote
from fuzz._attestation import NOW, tdx_quote, vectors

ERRORS: tuple[type[BaseException], ...] = (ValueError,)
MAX_LEN = 5_200  # the longest input the fuzzer makes: the vectors fit


def seeds() -> list[bytes]:
    return [
        tdx_quote(4),
        tdx_quote(5),
        *vectors(
            "intel-tdx/dcap-qvl/tdx_quote",
            "intel-tdx/dcap-qvl/tdx_quote_outdated",
            "intel-tdx/go-tdx-guest/tdx_prod_quote_SPR_E4.dat",
            "intel-tdx/go-tdx-guest/quote_v5_sample.dat",
            "intel-tdx/trustee/tdx_quote_4.dat",
            "intel-tdx/trustee/tdx_quote_5.dat",
        ),
    ]


def target(data: bytes) -> None:
    try:
        quote = parse_tdx_quote(data)
    except ValueError:
        return
    quote.body.rtmrs  # noqa: B018 - a derived field, read for what it might raise
    quote.signature_data.qe_certification.pck_chain_pem  # noqa: B018
    with contextlib.suppress(ValueError):
        verify_tdx(data, now=NOW)
