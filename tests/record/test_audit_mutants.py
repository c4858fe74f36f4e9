"""The audit's findings that ``make mutate`` showed no test held word for word.

The same one real stream as ``test_audit_problems.py`` (a real ``Log`` on SQLite, real keys
and signatures), handed changed to ``check_stream`` / ``audit_stream``: the file in a
bundle's ``evidence/`` that no entry names, as ``audit_stream`` passes the names on, and a
stream key that does not open, named at the entry that wraps it.
"""

from __future__ import annotations

import base64
import json

from record.audit import audit_stream
from record.errors import CannotOpen
from record.log import entry_line
from record.reader import StreamKeys
from record.schema import parse_entry
from tests.record.test_audit_problems import STREAM, Written, _of, _problems
from tests.record.test_audit_problems import written as written  # the module's fixture

UNLISTED = "evidence/stray.bin is named by no evidence.archived entry: nothing vouches for it"


def test_audit_stream_names_a_file_no_entry_vouches_for(written: Written) -> None:
    notes = [(f"cp{i}", n) for i, n in enumerate(written.notes)]
    problems = audit_stream(
        STREAM,
        written.rows(),
        notes,
        written.log_key,
        key=written.reader,
        evidence={"report.bin": written.evidence}.get,
        evidence_names=["report.bin", "stray.bin"],
    )
    assert _problems(problems) == [("evidence_unlisted", None, UNLISTED)]
    # every file named by an entry: nothing to say
    clean = audit_stream(
        STREAM,
        written.rows(),
        notes,
        written.log_key,
        key=written.reader,
        evidence={"report.bin": written.evidence}.get,
        evidence_names=["report.bin"],
    )
    assert _problems(clean) == []


def test_a_wrapped_stream_key_that_does_not_open_is_named_at_its_entry(
    written: Written,
) -> None:
    entry = json.loads(written.lines[0])
    body = entry.pop("body")
    mine = written.reader.recipient.text()
    [wrapped] = [w for w in body["recipients"] if w["recipient"] == mine]
    raw = bytearray(base64.b64decode(wrapped["sealed_key"]))
    raw[-1] ^= 1  # the AEAD tag no longer matches
    wrapped["sealed_key"] = base64.b64encode(bytes(raw)).decode("ascii")
    line = entry_line(entry, body)[0]
    failed: list[tuple[int, CannotOpen]] = []
    StreamKeys.collect(STREAM, [parse_entry(line)], written.reader, failed=failed)
    [(_, error)] = failed
    audit = written.check(written.rows([line, *written.lines[1:]]), key=written.reader)
    cannot_open = _of(audit, "cannot_open")
    assert cannot_open[0] == (0, f"wrapped data key: {error}")
    assert [seq for seq, _ in cannot_open] == [0, 1, 2, 3]
