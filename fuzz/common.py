"""What every fuzz target shares: the list of parsers, the vectors folder, an invariant error."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: Every parser with a fuzz target, in the order ``make fuzz`` runs them (module ``fuzz.<name>``).
PARSERS = (
    "sse",
    "request_openai",
    "request_responses",
    "request_anthropic",
    "reply_openai",
    "reply_responses",
    "reply_anthropic",
    "mcp",
    "entry",
    "bundle",
    "checkpoint",
    "snp_report",
    "tdx_quote",
    "tdx_collateral",
    "spdm",
    "snp_cert_table",
    "amd_crl",
    "amd_kds",
    "nvidia_rim",
)

#: Crashing inputs are kept here, one folder per parser, and replayed by ``make test``.
REGRESSIONS = Path(__file__).resolve().parent / "regressions"

#: The public test vectors, read in place (never copied): ``../shared/vectors`` beside the
#: repository, or ``AFFIDAVIT_VECTORS``.
VECTORS = Path(
    os.environ.get("AFFIDAVIT_VECTORS")
    or Path(__file__).resolve().parents[1].parent / "shared" / "vectors"
)


class InvariantBroken(AssertionError):
    """A parser returned, but what it returned breaks a property it promises."""


def vector_files(folder: str, *suffixes: str) -> list[Path]:
    """The vector files under ``folder`` ending in one of ``suffixes`` (none when absent)."""
    root = VECTORS / folder
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(suffixes))


def vector_bytes(folder: str, *suffixes: str, limit: int = 1 << 20) -> list[bytes]:
    """The bytes of each such vector file no larger than ``limit``."""
    return [p.read_bytes() for p in vector_files(folder, *suffixes) if p.stat().st_size <= limit]


def dumps(value: Any) -> bytes:
    """Compact JSON bytes for a seed."""
    return json.dumps(value, separators=(",", ":")).encode()


def nested(depth: int, leaf: Any = 0) -> Any:
    """A JSON value of arrays nested ``depth`` deep: the shape a review broke the reader with."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value
