"""Errors of the record, sorted by who is at fault.

::

    RecordError                      base; carries a stable ``code`` and ``diagnostics()``
    ├── SchemaError                  bytes or fields that do not match the schema (exit 1)
    ├── CannotOpen                   a sealed body could not be opened: wrong key or tampered
    ├── UnknownStream                a stream that the store does not hold (exit 1)
    ├── BundleError                  an exported bundle that is truncated or malformed (exit 1)
    ├── LeaseHeld                    another live writer holds the stream (exit 1)
    │   └── LeaseLost                the writer's lease was taken from it mid-write (exit 1)
    ├── NotOwner                     a stream another appliance's log key opened (exit 1)
    └── StoreMissing                 a store, bundle or key file that is not there (exit 3)

Misuse (wrong lengths, wrong types from our own callers) raises ``ValueError`` instead.
"""

from __future__ import annotations


class RecordError(Exception):
    """Base of every record error; ``code`` is stable, the message is for people."""

    code = "record_error"
    exit_code = 1

    def diagnostics(self) -> str:
        return f"{self.code}: {self}"


class SchemaError(RecordError):
    code = "schema"


class CannotOpen(RecordError):
    """One error for every failure to open a body: it never says which input was at fault."""

    code = "cannot_open"


class UnknownStream(RecordError):
    code = "unknown_stream"


class BundleError(RecordError):
    code = "malformed_bundle"


class LeaseHeld(RecordError):
    """One writer per stream: a second one is refused while the first is alive."""

    code = "lease_held"


class LeaseLost(LeaseHeld):
    code = "lease_lost"


class NotOwner(RecordError):
    """A stream is written only by the appliance whose log key opened it, for life."""

    code = "not_owner"


class BadStoreLocation(RecordError):
    """A store named in a form no backend reads (a malformed ``postgresql://`` URL): the
    caller's mistake, a usage error."""

    code = "error"
    exit_code = 2


class StoreMissing(RecordError):
    code = "missing"
    exit_code = 3
