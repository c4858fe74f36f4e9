"""The Reproducible Record: an append-only, tamper-evident, gapless, sealed log of every step.

This package stands alone: an auditor installs ``affidavit`` without extras and verifies a
bundle with it, or reads ``docs/record.md`` and writes their own verifier. It imports
nothing else of ours.
"""

from record.audit import Problem, Report, verify_store
from record.bundle import export_stream, verify_bundle
from record.checkpoint import Checkpoint, Signer, Verifier, open_checkpoint, sign_checkpoint
from record.digest import Domain, canonical_json, digest
from record.errors import BundleError, CannotOpen, RecordError, SchemaError, StoreMissing
from record.log import Appended, Log
from record.merkle import (
    RootMismatch,
    inclusion_proof,
    verify_consistency,
    verify_inclusion,
)
from record.schema import Entry, Envelope, V1Record, parse_entry, project_v1
from record.seal import KeyPair, RecipientKey

__all__ = [
    "Appended",
    "BundleError",
    "CannotOpen",
    "Checkpoint",
    "Domain",
    "Entry",
    "Envelope",
    "KeyPair",
    "Log",
    "Problem",
    "RecipientKey",
    "RecordError",
    "Report",
    "RootMismatch",
    "SchemaError",
    "Signer",
    "StoreMissing",
    "V1Record",
    "Verifier",
    "canonical_json",
    "digest",
    "export_stream",
    "inclusion_proof",
    "open_checkpoint",
    "parse_entry",
    "project_v1",
    "sign_checkpoint",
    "verify_bundle",
    "verify_consistency",
    "verify_inclusion",
    "verify_store",
]
