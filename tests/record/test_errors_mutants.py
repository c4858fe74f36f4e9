"""``record.errors``, in process: each error's stable code, exit code and diagnostic line.

The code is what scripts and the audit report match on and the exit code is documented
(``docs/record.md``, ``record/cli.py``), so each is held word for word.
"""

from __future__ import annotations

import pytest

from record.errors import (
    BundleError,
    CannotOpen,
    RecordError,
    SchemaError,
    StoreMissing,
    UnknownStream,
)


@pytest.mark.parametrize(
    ("error", "code", "exit_code"),
    [
        (RecordError, "record_error", 1),
        (SchemaError, "schema", 1),
        (CannotOpen, "cannot_open", 1),
        (UnknownStream, "unknown_stream", 1),
        (BundleError, "malformed_bundle", 1),
        (StoreMissing, "missing", 3),
    ],
)
def test_each_error_has_its_code_exit_code_and_diagnostic_line(
    error: type[RecordError], code: str, exit_code: int
) -> None:
    raised = error("entry 3: seq must be 3, not 4")
    assert raised.code == code
    assert raised.exit_code == exit_code
    assert raised.diagnostics() == f"{code}: entry 3: seq must be 3, not 4"
    assert isinstance(raised, RecordError) and isinstance(raised, Exception)


def test_the_diagnostic_line_is_the_message_as_str_gives_it() -> None:
    assert SchemaError().diagnostics() == "schema: "
    assert BundleError("a", "b").diagnostics() == "malformed_bundle: ('a', 'b')"
