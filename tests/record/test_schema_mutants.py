"""``record.schema``'s rules word for word, where ``make mutate`` showed no test held them.

Pure functions on values written out here: the canonical base64 reader and checker, and the
messages a reader of the record is shown.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from record.digest import Domain, canonical_json, digest
from record.errors import SchemaError
from record.log import Log
from record.schema import (
    Entry,
    EntryHead,
    Strict,
    ToolResult,
    TurnStarted,
    _sealed_head,
    body_kind,
    canonical_b64decode,
    canonical_body,
    is_canonical_b64,
    parse_body,
    parse_entry,
    parse_head,
    utc_timestamp,
)
from record.seal import KeyPair
from tests.record.raw_store import stored_lines

NOT_CANONICAL = "not the canonical base64 encoding (padding bits or padding)"


def test_base64_outside_the_alphabet_is_not_standard_base64() -> None:
    # without validate=True the "!" would be dropped and "QUJD" read as b"ABC"
    for text in ("QU!JD", "QUJD!", "QUJ\nD"):
        with pytest.raises(ValueError, match=r"^not standard base64: ") as caught:
            canonical_b64decode(text)
        assert NOT_CANONICAL not in str(caught.value)


def test_a_second_spelling_of_the_same_bytes_is_refused_word_for_word() -> None:
    assert canonical_b64decode("NA==") == b"4"
    for text in ("NB==", "TWF=", "TWFu===="):
        with pytest.raises(ValueError) as caught:
            canonical_b64decode(text)
        assert str(caught.value) == NOT_CANONICAL


def test_padding_is_only_at_the_end_and_never_the_whole_quantum() -> None:
    assert is_canonical_b64(b"TWE=") and is_canonical_b64(b"TQ==") and is_canonical_b64(b"")
    # "TE==": the last digit's low four bits must be clear under two "=", not only its low two
    for data in (b"====", b"=AAA", b"==AA", b"A===", b"T===", b"TW=E", b"TWF", b"TR==", b"TE=="):
        assert not is_canonical_b64(data), data


def test_every_sealed_line_the_writer_makes_takes_the_fast_path_to_the_same_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_sealed_head`` is a fast path: a break that only makes it decline would go unseen
    through ``parse_entry``'s full path, so its answer is compared with the full path's."""
    reader = KeyPair.generate()
    store = tmp_path / "record.db"
    with Log.open(store) as log:
        log.open_stream("fast-path", [reader.recipient])
        for turn in range(12):  # seq 1..12: one and two digits
            data = b"turn %d" % turn
            log.append("fast-path", TurnStarted(turn=turn, input_bytes=data, input_digest=digest(Domain.INPUT, data)))  # fmt: skip
        log.rotate_key("fast-path", [reader.recipient])
        data = b"turn 12"
        log.append("fast-path", TurnStarted(turn=12, input_bytes=data, input_digest=digest(Domain.INPUT, data)))  # fmt: skip
    lines = stored_lines(store, "fast-path")
    sealed = [line for line in lines if b'"body":"' in line]
    assert len(sealed) == 13
    fulls = [Entry.model_validate_json(line, strict=True) for line in sealed]

    def unplugged(*args: object, **kwargs: object) -> Entry:
        raise AssertionError("a sealed line as the writer makes it took the full path")

    monkeypatch.setattr(Entry, "model_validate_json", unplugged)
    for line, full in zip(sealed, fulls, strict=True):
        fast = _sealed_head(line)
        assert fast is not None, line
        assert fast == (
            EntryHead(sealed=True, **dict(full.envelope())),
            str(full.body).encode("ascii"),
        )
        assert parse_head(line) == fast[0]
        assert parse_entry(line) == full
    monkeypatch.undo()
    assert {h.key_epoch for h in (parse_head(line) for line in sealed)} == {0, 1}
    # a clear line, or a sealed one changed anywhere, takes the full path
    assert _sealed_head(lines[0]) is None
    for old, new in ((b'"seq":1,', b'"seq":01,'), (b'"body":"', b'"body":"=')):
        assert _sealed_head(sealed[0].replace(old, new, 1)) is None


# -- the messages a reader of the record is shown, word for word --------------------------------

INPUT_DIGEST = digest(Domain.INPUT, b"x")
TURN = {"kind": "turn.started", "turn": 1, "input_bytes": "eA==", "input_digest": INPUT_DIGEST}
ARCHIVED = {"kind": "evidence.archived", "evidence_kind": "sev-snp", "evidence_digest": "sha256:" + "0" * 64}  # fmt: skip
NOT_PLAIN = "not a plain file name (no '/', not starting with '.')"


def _refused(kind: str, data: dict[str, object] | bytes) -> str:
    with pytest.raises(SchemaError) as caught:
        parse_body(kind, data)
    return str(caught.value)


def test_each_body_value_refused_is_named_word_for_word() -> None:
    assert parse_body("turn.started", TURN) == parse_body("turn.started", json.dumps(TURN).encode())
    # strict: a number in a string is not a number, from an object or from JSON bytes
    wrong = {**TURN, "turn": "1"}
    for data in (wrong, json.dumps(wrong).encode()):
        assert _refused("turn.started", data) == (
            "turn.started body: turn: Input should be a valid integer"
        )
    assert _refused("no.such", TURN) == "unknown entry kind 'no.such'"
    assert _refused("turn.started", {**TURN, "input_bytes": 7}) == (
        "turn.started body: input_bytes: Value error, expected a base64 string"
    )
    assert _refused("turn.started", {**TURN, "input_digest": "sha256:00"}) == (
        "turn.started body: input_digest: Value error, not a digest of the form "
        "sha256:<64 hex>: 'sha256:00'"
    )
    assert parse_body("evidence.archived", {**ARCHIVED, "file": "snp.report"})
    for name in ("a/b", "", ".hidden", "../up"):
        assert _refused("evidence.archived", {**ARCHIVED, "file": name}) == (
            f"evidence.archived body: file: Value error, {NOT_PLAIN}: {name!r}"
        )


def test_a_wrapped_key_and_a_recipient_of_the_wrong_size_are_named() -> None:
    key = KeyPair.generate().recipient.text()
    wrapped = {"recipient": key, "sealed_key": base64.b64encode(bytes(80)).decode()}
    opened = {"kind": "key.rotated", "key_epoch": 1, "recipients": [wrapped]}
    assert parse_body("key.rotated", opened)
    short = {**wrapped, "sealed_key": base64.b64encode(bytes(79)).decode()}
    assert _refused("key.rotated", {**opened, "recipients": [short]}) == (
        "key.rotated body: recipients.0.sealed_key: Value error, a wrapped data key must be 80 "
        "bytes, not 79"
    )
    narrow = {**wrapped, "recipient": base64.b64encode(bytes(31)).decode()}
    assert _refused("key.rotated", {**opened, "recipients": [narrow]}) == (
        "key.rotated body: recipients.0.recipient: Value error, a recipient is base64 of a "
        "32-byte X25519 key, not 31 bytes"
    )


def test_body_kind_names_what_is_not_an_entry_body() -> None:
    class Other(Strict):
        kind: str = "no.such"

    for body, name in ((Other(), "Other"), (object(), "object")):
        with pytest.raises(ValueError) as caught:
            body_kind(body)  # type: ignore[arg-type]
        assert str(caught.value) == f"not an entry body: {name}"


def test_canonical_body_is_the_canonical_json_of_the_bodys_json_form() -> None:
    key = KeyPair.generate().recipient.text()
    wrapped = {"recipient": key, "sealed_key": base64.b64encode(bytes(range(80))).decode()}
    body = parse_body("key.rotated", {"kind": "key.rotated", "key_epoch": 1, "recipients": [wrapped]})  # fmt: skip
    turn = parse_body("turn.started", TURN)
    for each in (body, turn):
        assert canonical_body(each) == canonical_json(each.model_dump(mode="json"))
    # both ways of building it: in one call (small bytes) and member by member (large)
    for size in (0, 1, 2, 3, 64 * 1024, 64 * 1024 + 1, 200_000):
        data = bytes(range(256)) * (size // 256) + bytes(size % 256)
        result = ToolResult(
            call_seq=7,
            outcome="COMMITTED",
            result_bytes=data,
            result_digest=digest(Domain.TOOL_RESULT, data),
            error_bytes=b"\x00\xff" if size % 2 else None,
            error_digest=digest(Domain.ERROR, b"\x00\xff") if size % 2 else None,
        )
        assert canonical_body(result) == canonical_json(result.model_dump(mode="json"))


def _line(line: bytes, **changes: object) -> bytes:
    entry = json.loads(line)
    entry.update(changes)
    return json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()


def test_each_line_refused_is_named_word_for_word(tmp_path: Path) -> None:
    reader = KeyPair.generate()
    store = tmp_path / "record.db"
    with Log.open(store) as log:
        log.open_stream("lines", [reader.recipient])
        log.append("lines", TurnStarted(turn=0, input_bytes=b"x", input_digest=INPUT_DIGEST))
    opened, sealed = stored_lines(store, "lines")
    assert parse_head(opened).sealed is False and parse_head(sealed).sealed is True

    def refused(line: bytes) -> str:
        with pytest.raises(SchemaError) as caught:
            parse_entry(line)
        return str(caught.value)

    assert refused(_line(sealed, schema_version="9.9")) == (
        "unknown schema_version '9.9': this reader knows ['1.0']"
    )
    assert refused(_line(sealed, seq="1")) == "entry: seq: Input should be a valid integer"
    assert refused(_line(opened, body="QUJD")) == (
        "entry: body of stream.opened must be a clear JSON object"
    )
    assert refused(_line(sealed, body={"a": 1})) == (
        "entry: body of turn.started must be a sealed base64 string"
    )
    assert refused(_line(sealed, body="QU!D")) == (
        "entry seq 1: body: a sealed body must be canonical base64"
    )
    assert refused(json.dumps(json.loads(sealed)).encode()) == (
        "entry seq 1: not in canonical form (RFC 8785): every reader must see the same members"
    )
    # past the fast path's 15 digits, still below 2**53: the full path accepts it
    far = _line(sealed, seq=10**15)
    assert _sealed_head(far) is None and parse_entry(far).seq == 10**15


def test_more_line_and_body_faults_word_for_word(tmp_path: Path) -> None:
    reader = KeyPair.generate()
    store = tmp_path / "record.db"
    with Log.open(store) as log:
        log.open_stream("more", [reader.recipient])
        log.append("more", TurnStarted(turn=0, input_bytes=b"x", input_digest=INPUT_DIGEST))
    opened, sealed = stored_lines(store, "more")

    def refused(line: bytes) -> str:
        with pytest.raises(SchemaError) as caught:
            parse_entry(line)
        return str(caught.value)

    assert refused(b"[]") == "entry: (root): Input should be an object"
    assert refused(_line(sealed, seq=-1, key_epoch="0")) == (
        "entry: seq: Input should be greater than or equal to 0; key_epoch: Input should be a "
        "valid integer"
    )
    assert refused(_line(sealed, kind="no.such")) == "entry: unknown kind 'no.such'"
    body = json.loads(opened)["body"]
    assert refused(_line(opened, body={**body, "labels": {"n": 2**60}})).startswith(
        "entry seq 0: body: "
    )
    # a body built by a writer may leave its kind out; one read from the record may not
    bare = {k: v for k, v in TURN.items() if k != "kind"}
    assert parse_body("turn.started", bare) == parse_body("turn.started", TURN)
    with pytest.raises(SchemaError, match=r"^turn\.started body: kind: Field required$"):
        parse_body("turn.started", bare, stored=True)


def test_timestamps_are_utc_whatever_the_process_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/Los_Angeles")
    time.tzset()
    try:
        moment = datetime(2026, 12, 1, 12, 0, 0, 5, tzinfo=UTC)
        assert utc_timestamp(moment) == "2026-12-01T12:00:00.000005Z"
        assert utc_timestamp(moment.astimezone(timezone(timedelta(hours=-8)))) == (
            "2026-12-01T12:00:00.000005Z"
        )
    finally:
        monkeypatch.undo()
        time.tzset()
