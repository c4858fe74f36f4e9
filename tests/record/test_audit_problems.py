"""The audit's findings, one stream at a time and word for word, from rows held in memory.

``test_audit.py`` and ``test_tamper.py`` tamper with whole stores and bundles and check the
problem codes. Here one real stream (a real ``Log`` on SQLite, real keys and signatures) is
written once, its stored lines and signed checkpoints are read back, and each test hands a
changed copy of them to ``check_stream``: every problem's code, ``seq`` and detail is checked,
so a finding that names the wrong entry or says the wrong thing fails here.
"""

from __future__ import annotations

import base64
import json
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from record import merkle
from record.audit import (
    Problem,
    Report,
    Row,
    StreamAudit,
    audit_stream,
    check_stream,
    verify_store,
)
from record.checkpoint import Checkpoint, Signer, sign_checkpoint
from record.digest import Domain, digest
from record.errors import CannotOpen, SchemaError, StoreMissing
from record.log import Log, entry_line
from record.reader import StreamKeys, associated_data, digest_mismatches
from record.schema import (
    FetchRequest,
    FetchResponse,
    ModelRequest,
    ModelResponse,
    PinsSet,
    Provider,
    Strict,
    ToolCall,
    ToolResult,
    TurnEnded,
    TurnStarted,
    canonical_body,
    parse_entry,
)
from record.seal import KeyPair, open_sealed, seal
from tests.record.raw_store import stored_lines

STREAM = "audit-unit"
OTHER = "audit-other"  # a second stream in the same store: one stream.opened
WHERE = "record.db"


@dataclass(frozen=True)
class Written:
    lines: list[bytes]
    notes: list[bytes]  # the writer's checkpoints, in the order it signed them
    log_key: str
    signer: Signer
    reader: KeyPair
    evidence: bytes  # the archived evidence file's bytes
    store: Path  # the closed store they were read from

    def rows(self, lines: list[bytes] | None = None) -> list[Row]:
        return [
            Row(line, seq, merkle.hash_leaf(line), WHERE)
            for seq, line in enumerate(self.lines if lines is None else lines)
        ]

    def check(self, rows: list[Row] | None = None, **kwargs: object) -> StreamAudit:
        notes = kwargs.pop("notes", None)
        checkpoints = [(f"cp{i}", n) for i, n in enumerate(self.notes if notes is None else notes)]
        log_key = kwargs.pop("log_key", self.log_key)
        return check_stream(
            STREAM,
            self.rows() if rows is None else rows,
            checkpoints,
            log_key,  # type: ignore[arg-type]
            **kwargs,  # type: ignore[arg-type]
        )


def _turn(turn: int) -> TurnStarted:
    data = b"turn %d" % turn
    return TurnStarted(turn=turn, input_bytes=data, input_digest=digest(Domain.INPUT, data))


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Written]:
    """stream.opened, two turn.started, evidence.archived: 4 entries, a checkpoint after each."""
    folder = tmp_path_factory.mktemp("audit-unit")
    store = folder / WHERE
    reader = KeyPair.generate()
    evidence = b"attestation evidence bytes"
    with Log.open(store) as log:
        log.open_stream(STREAM, [reader.recipient])
        log.append(STREAM, _turn(0))
        log.append(STREAM, _turn(1))
        log.archive_evidence(STREAM, "sev-snp", "report.bin", evidence)
        log.open_stream(OTHER, [reader.recipient])
        log_key = log.log_key()
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        notes = [
            bytes(n)
            for (n,) in conn.execute(
                "SELECT note FROM checkpoints WHERE stream = ? ORDER BY id", (STREAM,)
            )
        ]
    finally:
        conn.close()
    signer = Signer.from_skey(store.with_name(WHERE + ".signing-key").read_text())
    yield Written(stored_lines(store, STREAM), notes, log_key, signer, reader, evidence, store)


def _problems(audit: StreamAudit | list[Problem]) -> list[tuple[str, int | None, str]]:
    problems = audit.problems if isinstance(audit, StreamAudit) else audit
    assert {p.stream for p in problems} <= {STREAM}
    return [(p.code, p.seq, p.detail) for p in problems]


def _with_envelope(written: Written, index: int, **changes: object) -> bytes:
    """Entry ``index`` with envelope fields changed and its body kept (a sealed body then no
    longer opens: the envelope is its associated data)."""
    entry = json.loads(written.lines[index])
    body = entry.pop("body")
    entry.update(changes)
    return entry_line(entry, body)[0]


def test_the_written_stream_is_clean(written: Written) -> None:
    audit = written.check(key=written.reader, evidence={"report.bin": written.evidence}.get)
    assert _problems(audit) == []
    assert (audit.entries, audit.covered, audit.unsigned) == (4, 4, 0)
    assert [int(n.split(b"\n")[1]) for n in written.notes] == [1, 2, 3, 4]


def _of(audit: StreamAudit, code: str) -> list[tuple[int | None, str]]:
    return [(p.seq, p.detail) for p in audit.problems if p.code == code]


def _tail(n: int, covered: int) -> tuple[str, int, str]:
    return (
        "unsigned_tail",
        covered,
        f"{n - covered} of {n} entries (from position {covered}) are covered by no checkpoint "
        "signed by the log key: anyone holding only public keys could have written them",
    )


def _resealed(written: Written, seq: int, plaintext: bytes) -> bytes:
    """Entry ``seq`` with ``plaintext`` sealed under the stream's own data key, envelope kept."""
    entries = [parse_entry(line) for line in written.lines]
    data_key = StreamKeys.collect(STREAM, entries, written.reader).keys[0]
    entry = json.loads(written.lines[seq])
    del entry["body"]
    sealed = seal(data_key, plaintext, associated_data(entries[seq]))
    return entry_line(entry, base64.b64encode(sealed).decode("ascii"))[0]


def _note(written: Written, size: int, root_hash: bytes) -> bytes:
    origin = written.notes[0].split(b"\n", 1)[0].decode()
    return sign_checkpoint(written.signer, Checkpoint(origin, size, root_hash))


# -- rows: leaf hashes, streams and seq numbers -------------------------------------------------


def test_a_stored_leaf_hash_that_is_not_the_lines(written: Written) -> None:
    rows = written.rows()
    rows[2] = replace(rows[2], leaf_hash=bytes(32))
    assert _problems(written.check(rows)) == [
        ("leaf_mismatch", 2, "record.db seq 2: stored leaf hash is not the line's")
    ]


def test_an_entry_of_another_stream(written: Written) -> None:
    lines = list(written.lines)
    lines[1] = _with_envelope(written, 1, stream="elsewhere")
    audit = written.check(written.rows(lines))
    assert _of(audit, "stream_mismatch") == [(1, "record.db seq 1: entry names 'elsewhere'")]


def test_seq_numbers_out_of_place(written: Written) -> None:
    lines = list(written.lines)
    lines[2] = _with_envelope(written, 2, seq=1)  # seq 1 twice, seq 2 missing
    audit = written.check(written.rows(lines))
    assert _of(audit, "seq_order") == [(1, "record.db seq 2: the entry says seq 1")]
    assert _of(audit, "seq_duplicate") == [(1, "record.db seq 2: seq 1 appears again")]
    assert _of(audit, "seq_gap") == [(2, "seq 2 is missing")]
    swapped = [written.lines[0], written.lines[2], written.lines[1], written.lines[3]]
    rows = [Row(line, None, None, "entries.jsonl") for line in swapped]  # a bundle's rows
    audit = written.check(rows)
    assert _of(audit, "seq_order") == [(1, "entries.jsonl: seq 1 after 2")]
    assert _of(audit, "seq_gap") == _of(audit, "seq_duplicate") == []


def test_gaps_are_named_up_to_fifty_then_counted(written: Written) -> None:
    lines = [written.lines[0], _with_envelope(written, 1, seq=60)]
    audit = written.check([*written.rows(lines)[:1], Row(lines[1], None, None, "x")])
    gaps = _of(audit, "seq_gap")
    assert gaps[:2] == [(1, "seq 1 is missing"), (2, "seq 2 is missing")]
    assert gaps[49] == (50, "seq 50 is missing")
    assert gaps[50:] == [(None, "… and 9 more")]
    assert {p.stream for p in audit.problems} == {STREAM}  # the counted rest too


def test_a_line_that_is_not_an_entry(written: Written) -> None:
    rows = written.rows()
    rows[1] = Row(b"not json", 1, merkle.hash_leaf(b"not json"), WHERE)
    rows[3] = replace(rows[3], leaf_hash=bytes(32))
    audit = written.check(rows)
    [(seq, detail)] = _of(audit, "malformed_entry")
    assert seq == 1 and detail.startswith("record.db seq 1: ")
    # the rows after it are still read
    assert audit.entries == 4
    assert _of(audit, "leaf_mismatch") == [
        (3, "record.db seq 3: stored leaf hash is not the line's")
    ]


def test_fifty_problems_of_a_code_are_listed_then_counted(written: Written) -> None:
    rows = [replace(r, leaf_hash=bytes(32)) for r in written.rows()] * 15  # 60 rows
    audit = written.check(rows)
    leaf = _of(audit, "leaf_mismatch")
    assert len(leaf) == 51 and leaf[-1] == (None, "… and 10 more")
    assert {p.stream for p in audit.problems} == {STREAM}  # the counted rest too


# -- the opening entry and key epochs ----------------------------------------------------------


def test_a_stream_that_does_not_open_with_stream_opened(written: Written) -> None:
    audit = written.check([Row(written.lines[1], None, None, "entries.jsonl")])
    assert (0, "the stream starts with turn.started, not stream.opened") in _of(
        audit, "malformed_entry"
    )
    assert _of(audit, "seq_gap") == [(0, "seq 0 is missing")]


def test_key_epochs_count_up_by_one(written: Written) -> None:
    lines = list(written.lines)
    lines[0] = _with_envelope(written, 0, key_epoch=1)
    audit = written.check(written.rows(lines))
    assert _of(audit, "malformed_entry") == [
        (0, "stream.opened brings key epoch 0 (envelope 1); expected 0")
    ]


def test_a_second_stream_opened(written: Written) -> None:
    again = [_with_envelope(written, 0, seq=seq) for seq in (4, 5)]
    audit = written.check(written.rows([*written.lines, *again]))
    # the k-th clear entry brings epoch k (docs/record.md §12 step 5)
    assert _of(audit, "malformed_entry") == [
        (4, "stream.opened brings key epoch 0 (envelope 0); expected 1"),
        (4, "a second stream.opened"),
        (5, "stream.opened brings key epoch 0 (envelope 0); expected 2"),
        (5, "a second stream.opened"),
    ]


def test_the_opening_names_another_origin(written: Written) -> None:
    entry = json.loads(written.lines[0])
    body = entry.pop("body")
    origin = body["origin"]
    body["origin"] = "elsewhere/0000/x"
    lines = [entry_line(entry, body)[0], *written.lines[1:]]
    audit = written.check(written.rows(lines))
    assert _of(audit, "malformed_entry") == [
        (0, f"stream.opened names origin 'elsewhere/0000/x'; the log key's is {origin!r}")
    ]


def test_the_opening_names_another_log_key(written: Written) -> None:
    other = Signer.generate("affidavit-log").vkey()
    audit = written.check(log_key=other)
    assert _of(audit, "checkpoint_invalid")[0] == (
        0,
        f"the stream names log key {written.log_key}, not {other}, the key it is checked against",
    )


# -- checkpoints: signatures, origins, sizes and roots -----------------------------------------


def test_no_log_key_or_a_malformed_one(written: Written) -> None:
    audit = written.check(log_key=None)
    assert _of(audit, "checkpoint_invalid")[0] == (
        None,
        "no log key to check checkpoint signatures with",
    )
    assert _of(written.check(log_key=None, notes=[]), "checkpoint_invalid") == []
    audit = written.check(log_key="nonsense")
    assert (
        None,
        "log key 'nonsense' is malformed: vkey must be <name>+<hex key ID>+<base64 key>",
    ) in _of(audit, "checkpoint_invalid")


def test_a_checkpoint_not_signed_by_the_log_key(written: Written) -> None:
    stranger = Signer.generate("affidavit-log")
    origin = written.notes[0].split(b"\n", 1)[0].decode()
    forged = sign_checkpoint(stranger, Checkpoint(origin, 1, merkle.hash_leaf(written.lines[0])))
    audit = written.check(notes=[*written.notes, forged])
    [(seq, detail)] = _of(audit, "checkpoint_invalid")
    assert seq is None and detail.startswith("cp4: no signature from a trusted key")


def test_a_checkpoint_for_another_origin(written: Written) -> None:
    other = sign_checkpoint(written.signer, Checkpoint("elsewhere", 1, bytes(32)))
    audit = written.check(notes=[*written.notes, other])
    origin = written.notes[0].split(b"\n", 1)[0].decode()
    assert _problems(audit) == [
        (
            "checkpoint_invalid",
            None,
            f"cp4: origin 'elsewhere' is not this stream's ({origin!r})",
        )
    ]


def test_two_checkpoints_give_one_size_two_roots(written: Written) -> None:
    audit = written.check(notes=[*written.notes, _note(written, 2, bytes(32))])
    assert _of(audit, "checkpoint_inconsistent") == [
        (1, "cp1 and cp4 give tree size 2 two roots"),
        (1, "cp4 (size 2) is not consistent with cp3 (size 4), which the log matches"),
    ]


def test_a_root_that_is_not_the_trees(written: Written) -> None:
    root4 = merkle.root([merkle.hash_leaf(line) for line in written.lines])
    audit = written.check(notes=[_note(written, 4, bytes(32))])
    assert _problems(audit) == [
        (
            "root_mismatch",
            3,
            f"cp0: tree of 4 entries has root {root4.hex()}, the checkpoint says {'00' * 32}",
        ),
        _tail(4, 0),
    ]


def test_a_checkpoint_beyond_the_log(written: Written) -> None:
    audit = written.check(written.rows()[:3], notes=written.notes[:3])
    assert _problems(audit) == []
    audit = written.check(written.rows()[:3])
    assert _problems(audit) == [
        ("truncated", 3, "cp3: a checkpoint the log holds covers 4 entries; the log has 3")
    ]
    audit = written.check(
        written.rows()[:3], notes=written.notes[:3], kept=[("k", written.notes[3])]
    )
    assert _problems(audit) == [
        ("truncated", 3, "k: a checkpoint you kept covers 4 entries; the log has 3 (rolled back)")
    ]


def test_a_kept_checkpoint_of_a_forked_log(written: Written) -> None:
    forked = _note(written, 3, bytes(32))
    audit = written.check(kept=[("k", forked)])
    assert _problems(audit) == [
        ("checkpoint_inconsistent", 2, "cp2 and k give tree size 3 two roots"),
        (
            "checkpoint_inconsistent",
            2,
            "k (size 3) is not consistent with cp3 (size 4), which the log matches: "
            "the log was forked",
        ),
    ]


def test_entries_after_the_last_checkpoint_are_an_unsigned_tail(written: Written) -> None:
    audit = written.check(notes=written.notes[:2])
    assert _problems(audit) == [_tail(4, 2)]
    assert (audit.entries, audit.covered, audit.unsigned) == (4, 2, 2)
    report = Report(allow_unsigned_tail=True)
    report.add_stream(audit)
    assert report.ok and report.unsigned == {STREAM: 2} and report.streams == [STREAM]
    strict = Report()
    strict.add_stream(audit)
    strict.entries = 4
    assert not strict.ok and strict.codes() == {"unsigned_tail"}
    assert json.loads(strict.dumps()) == {
        "ok": False,
        "entries": 4,
        "problems": [
            {"code": c, "stream": STREAM, "seq": s, "detail": d} for c, s, d in [_tail(4, 2)]
        ],
        "unsigned_tail": {STREAM: 2},
    }


# -- with a key: bodies, digests and evidence --------------------------------------------------


def test_audit_stream_passes_every_argument_on(written: Written) -> None:
    rows = written.rows()
    rows[2] = replace(rows[2], leaf_hash=bytes(32))
    evidence = {"report.bin": b"other bytes"}.get
    stranger_key = Signer.generate("affidavit-log").vkey()
    kept = [("k", _note(written, 3, bytes(32)))]
    full = written.check(rows, key=written.reader, kept=kept, evidence=evidence)
    problems = audit_stream(
        STREAM,
        rows,
        [(f"cp{i}", n) for i, n in enumerate(written.notes)],
        written.log_key,
        key=written.reader,
        kept=kept,
        evidence=evidence,
    )
    assert problems == full.problems
    assert {p.code for p in problems} == {
        "leaf_mismatch",
        "checkpoint_inconsistent",
        "evidence_digest_mismatch",
    }
    assert audit_stream("other", rows, [], stranger_key) != audit_stream(
        STREAM, rows, [], stranger_key
    )
    assert audit_stream(STREAM, rows, [], None) != audit_stream(STREAM, rows, [], stranger_key)


def test_a_key_the_stream_is_not_sealed_to(written: Written) -> None:
    audit = written.check(key=KeyPair.generate())
    assert _problems(audit) == [
        ("cannot_open", None, f"stream {STREAM!r} is not sealed to this key")
    ]


def test_bodies_that_do_not_open_or_are_not_valid(written: Written) -> None:
    lines = list(written.lines)
    lines[1] = _with_envelope(written, 1, occurred_at="2026-01-01T00:00:00.000000Z")
    lines[2] = _resealed(written, 2, b'{"turn": "one"}')
    audit = written.check(written.rows(lines), notes=[], key=written.reader, evidence={}.get)
    assert _of(audit, "cannot_open") == [
        (1, "turn.started: body does not open with this stream key")
    ]
    [(seq, detail)] = _of(audit, "malformed_body")
    assert seq == 2 and detail.startswith("seq 2: ")
    assert _of(audit, "body_digest_mismatch") == []
    # the entries after each of them are still opened and checked
    assert _of(audit, "evidence_missing") == [(3, "evidence/report.bin is missing")]


def test_a_body_whose_digest_is_not_its_bytes(written: Written) -> None:
    wrong = TurnStarted(turn=1, input_bytes=b"turn 1", input_digest=digest(Domain.INPUT, b"x"))
    lines = list(written.lines)
    lines[2] = _resealed(written, 2, canonical_body(wrong))
    audit = written.check(written.rows(lines), notes=[], key=written.reader)
    assert _of(audit, "body_digest_mismatch") == [
        (
            2,
            f"turn.started: input_digest {digest(Domain.INPUT, b'x')} does not match its bytes",
        )
    ]


def test_archived_evidence_is_checked_against_its_digest(written: Written) -> None:
    audit = written.check(key=written.reader, evidence={}.get)
    assert _problems(audit) == [("evidence_missing", 3, "evidence/report.bin is missing")]
    audit = written.check(key=written.reader, evidence={"report.bin": b"changed"}.get)
    assert _problems(audit) == [
        ("evidence_digest_mismatch", 3, "evidence/report.bin does not match its evidence_digest")
    ]


# -- a whole store -----------------------------------------------------------------------------


def _tampered_copy(written: Written, folder: Path) -> Path:
    """A copy of the store whose seq 2 has a stored leaf hash that is not its line's."""
    copy = folder / WHERE
    shutil.copyfile(written.store, copy)
    conn = sqlite3.connect(copy, isolation_level=None)
    try:
        conn.execute("DROP TRIGGER entries_no_update")
        conn.execute(
            "UPDATE entries SET leaf_hash = ? WHERE stream = ? AND seq = 2", (bytes(32), STREAM)
        )
    finally:
        conn.close()
    return copy


def test_verify_store_reads_every_stream_of_the_file(written: Written, tmp_path: Path) -> None:
    report = verify_store(_tampered_copy(written, tmp_path))
    assert (report.entries, sorted(report.streams)) == (5, sorted([STREAM, OTHER]))
    assert [(p.code, p.seq, p.detail) for p in report.problems] == [
        ("leaf_mismatch", 2, "record.db seq 2: stored leaf hash is not the line's")
    ]
    assert report.dumps().startswith(
        '{"entries": 5, "ok": false, "problems": [{"code": "leaf_mismatch", '
        '"detail": "record.db seq 2: stored leaf hash is not the line\'s", "seq": 2, '
    )
    assert verify_store(written.store).ok


def test_verify_store_never_creates_a_store(tmp_path: Path) -> None:
    with pytest.raises(StoreMissing):
        verify_store(tmp_path / "absent.db")
    assert list(tmp_path.iterdir()) == []


def test_verify_store_passes_its_key_and_kept_checkpoints_on(
    written: Written, tmp_path: Path
) -> None:
    assert verify_store(written.store, key=written.reader).ok
    stranger = verify_store(written.store, key=KeyPair.generate())
    assert sorted((p.code, p.stream) for p in stranger.problems) == [
        ("cannot_open", OTHER),
        ("cannot_open", STREAM),
    ]
    origin = written.notes[0].split(b"\n", 1)[0].decode()
    beyond = _note(written, 5, bytes(32))
    elsewhere = sign_checkpoint(written.signer, Checkpoint("a/b/gone", 1, bytes(32)))
    report = verify_store(written.store, kept=[beyond, elsewhere])
    assert [(p.code, p.stream, p.seq, p.detail) for p in report.problems] == [
        (
            "truncated",
            STREAM,
            4,
            f"kept checkpoint #0 ({origin}): a checkpoint you kept covers 5 entries; "
            "the log has 4 (rolled back)",
        ),
        (
            "truncated",
            "gone",
            None,
            "kept checkpoint #1 (a/b/gone): the log holds no stream 'gone'",
        ),
    ]


# -- the digests an audit with a key recomputes (record.reader.digest_mismatches) --------------

_B = b"bytes"


def _bodies() -> list[tuple[Strict, list[tuple[str, str, Domain]]]]:
    """One body of each kind that carries digests, and its (digest, bytes field, domain)."""
    provider = Provider(name="p", endpoint="https://p.example/v1")
    return [
        (
            ModelRequest(
                content_key=digest(Domain.REQUEST, _B),
                input_digest=digest(Domain.INPUT, _B),
                prompt_digest=digest(Domain.PROMPT, _B),
                request_bytes=_B,
                input_bytes=_B,
                prompt_bytes=_B,
                provider=provider,
                model_id="m",
                params={},
            ),
            [
                ("content_key", "request_bytes", Domain.REQUEST),
                ("input_digest", "input_bytes", Domain.INPUT),
                ("prompt_digest", "prompt_bytes", Domain.PROMPT),
            ],
        ),
        (
            ModelResponse(
                request_seq=1,
                outcome="COMMITTED",
                response_bytes=_B,
                response_digest=digest(Domain.RESPONSE, _B),
                error_bytes=_B,
                error_digest=digest(Domain.ERROR, _B),
            ),
            [
                ("response_digest", "response_bytes", Domain.RESPONSE),
                ("error_digest", "error_bytes", Domain.ERROR),
            ],
        ),
        (
            ToolCall(
                reply_seq=1,
                call_id="c",
                server="s",
                tool="t",
                arguments=_B,
                arguments_digest=digest(Domain.TOOL_ARGUMENTS, _B),
                idempotent=True,
            ),
            [("arguments_digest", "arguments", Domain.TOOL_ARGUMENTS)],
        ),
        (
            ToolResult(
                call_seq=1,
                outcome="COMMITTED",
                result_bytes=_B,
                result_digest=digest(Domain.TOOL_RESULT, _B),
                error_bytes=_B,
                error_digest=digest(Domain.ERROR, _B),
            ),
            [
                ("result_digest", "result_bytes", Domain.TOOL_RESULT),
                ("error_digest", "error_bytes", Domain.ERROR),
            ],
        ),
        (
            FetchRequest(
                method="GET",
                url="https://example.org/",
                request_bytes=_B,
                content_key=digest(Domain.FETCH_REQUEST, _B),
            ),
            [("content_key", "request_bytes", Domain.FETCH_REQUEST)],
        ),
        (
            FetchResponse(
                request_seq=1,
                outcome="COMMITTED",
                response_bytes=_B,
                response_digest=digest(Domain.FETCH_RESPONSE, _B),
                error_bytes=_B,
                error_digest=digest(Domain.ERROR, _B),
            ),
            [
                ("response_digest", "response_bytes", Domain.FETCH_RESPONSE),
                ("error_digest", "error_bytes", Domain.ERROR),
            ],
        ),
        (
            TurnStarted(turn=0, input_bytes=_B, input_digest=digest(Domain.INPUT, _B)),
            [("input_digest", "input_bytes", Domain.INPUT)],
        ),
        (
            TurnEnded(
                turn=0,
                outcome="ANSWERED",
                answer_bytes=_B,
                answer_digest=digest(Domain.RESPONSE, _B),
            ),
            [("answer_digest", "answer_bytes", Domain.RESPONSE)],
        ),
    ]


@pytest.mark.parametrize("index", range(8))
def test_every_digest_of_a_body_is_recomputed_in_its_domain(index: int) -> None:
    body, fields = _bodies()[index]
    assert digest_mismatches(body) == []
    for name, data_field, domain in fields:
        other = digest(domain, b"other bytes")
        wrong = body.model_copy(update={name: other})
        assert digest_mismatches(wrong) == [f"{name} {other} does not match its bytes"]
        unpaired = f"{name} is set without its bytes, or its bytes without it"
        assert digest_mismatches(body.model_copy(update={data_field: None})) == [unpaired]
        assert digest_mismatches(body.model_copy(update={name: None})) == [unpaired]
    assert digest_mismatches(PinsSet(pins={})) == []


def test_kept_checkpoints_are_routed_by_the_last_part_of_their_first_line(
    written: Written,
) -> None:
    """Whatever that line holds (spaces, bytes that are not UTF-8), it is named, not fatal."""
    spaced = sign_checkpoint(written.signer, Checkpoint("a b/gone", 1, bytes(32)))
    garbled = b"\xff/lost\n1\n" + b"A" * 43 + b"=\n\n"
    plain = sign_checkpoint(written.signer, Checkpoint("plain", 1, bytes(32)))
    report = verify_store(written.store, kept=[spaced, garbled, plain])
    assert [(p.code, p.stream, p.detail) for p in report.problems] == [
        ("truncated", "gone", "kept checkpoint #0 (a b/gone): the log holds no stream 'gone'"),
        ("truncated", "lost", "kept checkpoint #1 (\ufffd/lost): the log holds no stream 'lost'"),
        ("truncated", "plain", "kept checkpoint #2 (plain): the log holds no stream 'plain'"),
    ]


def test_a_clear_body_that_is_not_valid(written: Written) -> None:
    """Named at its seq, once; it still takes epoch 0's place, and the opening entries after
    it are still checked."""
    entry = json.loads(written.lines[0])
    del entry["body"]
    bad = entry_line(entry, {"key_epoch": "x"})[0]
    again = [_with_envelope(written, 0, seq=seq) for seq in (4, 5)]
    audit = written.check(written.rows([bad, *written.lines[1:], *again]))
    problems = _of(audit, "malformed_entry")
    assert problems[0][0] == 0 and problems[0][1].startswith("stream.opened body: ")
    assert problems[1:] == [
        (4, "stream.opened brings key epoch 0 (envelope 0); expected 1"),
        (4, "a second stream.opened"),
        (5, "stream.opened brings key epoch 0 (envelope 0); expected 2"),
        (5, "a second stream.opened"),
    ]


def test_checkpoints_after_a_refused_one_still_count(written: Written) -> None:
    stranger = Signer.generate("affidavit-log")
    origin = written.notes[0].split(b"\n", 1)[0].decode()
    forged = sign_checkpoint(stranger, Checkpoint(origin, 1, bytes(32)))
    other = sign_checkpoint(written.signer, Checkpoint("elsewhere", 1, bytes(32)))
    for refused in (forged, other):
        audit = written.check(notes=[refused, *written.notes])
        assert [p.code for p in audit.problems] == ["checkpoint_invalid"]
        assert audit.covered == 4


def test_a_checkpoint_of_the_empty_tree(written: Written) -> None:
    assert (
        _problems(written.check(notes=[*written.notes, _note(written, 0, merkle.EMPTY_ROOT)])) == []
    )
    audit = written.check(notes=[_note(written, 0, bytes(32))])
    assert _problems(audit) == [
        (
            "root_mismatch",
            -1,
            f"cp0: tree of 0 entries has root {merkle.EMPTY_ROOT.hex()}, "
            f"the checkpoint says {'00' * 32}",
        ),
        _tail(4, 0),
    ]


def test_a_second_root_at_the_size_the_log_matches(written: Written) -> None:
    root4 = merkle.root([merkle.hash_leaf(line) for line in written.lines])
    audit = written.check(notes=[*written.notes, _note(written, 4, bytes(32))])
    assert _problems(audit) == [
        ("checkpoint_inconsistent", 3, "cp3 and cp4 give tree size 4 two roots"),
        (
            "root_mismatch",
            3,
            f"cp4: tree of 4 entries has root {root4.hex()}, the checkpoint says {'00' * 32}",
        ),
    ]


def test_stream_keys_are_the_streams_by_epoch(written: Written) -> None:
    entries = [parse_entry(line) for line in written.lines]
    keys = StreamKeys.collect(STREAM, entries, written.reader)
    assert keys.stream == STREAM and sorted(keys.keys) == [0]
    later = parse_entry(_with_envelope(written, 1, key_epoch=1))
    with pytest.raises(CannotOpen) as info:
        keys.open(later)
    assert str(info.value) == "no data key for epoch 1 under this private key"


def test_a_pair_left_out_does_not_stop_the_next_check() -> None:
    other = digest(Domain.ERROR, b"other bytes")
    response = ModelResponse(request_seq=1, outcome="FAILED", error_bytes=_B, error_digest=other)
    assert digest_mismatches(response) == [f"error_digest {other} does not match its bytes"]


def test_a_stored_body_must_state_its_kind_clear_or_sealed(written: Written) -> None:
    entries = [parse_entry(line) for line in written.lines]
    keys = StreamKeys.collect(STREAM, entries, written.reader)
    opened = entries[0]
    assert isinstance(opened.body, dict) and opened.body.get("kind") == opened.kind
    kindless = opened.model_copy(
        update={"body": {k: v for k, v in opened.body.items() if k != "kind"}}
    )
    for read in (
        lambda: keys.open(kindless),
        lambda: StreamKeys.collect(STREAM, [kindless], written.reader),
    ):
        with pytest.raises(SchemaError) as info:
            read()
        assert str(info.value) == f"{opened.kind} body: kind: Field required"
    sealed = entries[2]
    plaintext = open_sealed(
        keys.keys[0], base64.b64decode(str(sealed.body)), associated_data(sealed)
    )
    body = json.loads(plaintext)
    del body["kind"]
    resealed = parse_entry(_resealed(written, 2, json.dumps(body).encode()))
    with pytest.raises(SchemaError) as info:
        keys.open(resealed)
    assert str(info.value) == f"seq 2: {sealed.kind} body: kind: Field required"


def test_a_wrapped_key_that_does_not_open_is_listed_when_asked_and_raised_otherwise(
    written: Written,
) -> None:
    opened = parse_entry(written.lines[0])
    assert isinstance(opened.body, dict)
    body = json.loads(json.dumps(opened.body))
    mine = written.reader.recipient.text()
    [wrapped] = [w for w in body["recipients"] if w["recipient"] == mine]
    raw = bytearray(base64.b64decode(wrapped["sealed_key"]))
    raw[-1] ^= 1  # the AEAD tag no longer matches
    wrapped["sealed_key"] = base64.b64encode(bytes(raw)).decode("ascii")
    broken = opened.model_copy(update={"body": body})
    failed: list[tuple[int, CannotOpen]] = []
    keys = StreamKeys.collect(STREAM, [broken], written.reader, failed=failed)
    assert keys.keys == {} and [seq for seq, _ in failed] == [opened.seq]
    assert isinstance(failed[0][1], CannotOpen)
    with pytest.raises(CannotOpen):
        StreamKeys.collect(STREAM, [broken], written.reader)


def test_many_notes_are_checked_beside_the_scan_with_the_same_findings(
    written: Written, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream with a note per commit batch has its notes verified in a thread while the
    entries are read; the findings, and their order, are those of checking them after."""
    import record.audit as audit

    other = Signer.generate("someone-else")
    forged = sign_checkpoint(other, Checkpoint("x/y/z", 1, b"\x00" * 32))
    notes = [*written.notes * 10, written.notes[0][:-3] + b"xx\n", forged, *written.notes]
    kept = [("kept #0", forged), ("kept #1", written.notes[-1])]
    assert len(notes) + len(kept) >= audit._NOTES_IN_A_THREAD

    beside = written.check(notes=notes, kept=kept)
    monkeypatch.setattr(audit, "_NOTES_IN_A_THREAD", 10**9)  # checked after the scan
    after = written.check(notes=notes, kept=kept)
    assert beside == after
    invalid = [p.detail.split(":")[0] for p in beside.problems if p.code == "checkpoint_invalid"]
    assert invalid == [
        f"cp{len(written.notes) * 10}",
        f"cp{len(written.notes) * 10 + 1}",
        "kept #0",
    ]
    assert beside.covered == len(written.lines)
