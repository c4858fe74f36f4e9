"""``record.show`` in process, each line written out, on a store ``record.log.Log`` writes here.

``tests/record/test_cli.py`` holds ``affidavit log show`` as a subprocess (a second a run,
and out of ``make mutate``'s reach); this holds ``show_stream`` and ``readable`` word for word:
the text and JSON line of a clear, a sealed, an opened and an unopenable entry, bytes as text
or ``base64:``, nested models and lists of them, and the redacted views in their place.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from record.digest import Domain, digest
from record.errors import CannotOpen, StoreMissing, UnknownStream
from record.log import Log
from record.redact import REDACTED, RedactionRules
from record.schema import (
    ModelRequest,
    Provider,
    RetrievalItem,
    ToolResult,
    TurnStarted,
    parse_entry,
)
from record.seal import KeyPair
from record.show import readable, show_stream
from tests.record.raw_store import stored_lines

STREAM = "show-1"
QUESTION = "Où est la page? secret-1234".encode()
NOT_UTF8 = b"\xff\xfe page \x80"
CHUNK = digest(Domain.TOOL_RESULT, b"chunk")


@dataclass
class Shown:
    store: Path
    user: KeyPair
    stranger: KeyPair
    lines: list[bytes]


def _request() -> ModelRequest:
    raw = b'{"model":"m","messages":[]}'
    return ModelRequest(
        content_key=digest(Domain.REQUEST, raw),
        input_digest=digest(Domain.INPUT, raw),
        prompt_digest=digest(Domain.PROMPT, raw),
        request_bytes=raw,
        input_bytes=raw,
        prompt_bytes=raw,
        retrieval=[RetrievalItem(doc_id="d1", doc_version="v2", chunk_digest=CHUNK)],
        provider=Provider(name="embedded", endpoint="http://127.0.0.1/v1"),
        model_id="m",
        params={"seed": 7},
    )


@pytest.fixture
def shown(tmp_path: Path) -> Shown:
    user, appliance, stranger = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    store = tmp_path / "record.db"
    with Log.open(store, appliance_key=appliance) as log:
        log.open_stream(STREAM, [user.recipient, appliance.recipient])
        log.append(
            STREAM,
            TurnStarted(turn=0, input_bytes=QUESTION, input_digest=digest(Domain.INPUT, QUESTION)),
        )
        log.append(STREAM, _request())
        log.append(
            STREAM,
            ToolResult(
                call_seq=2,
                outcome="COMMITTED",
                result_bytes=NOT_UTF8,
                result_digest=digest(Domain.TOOL_RESULT, NOT_UTF8),
            ),
        )
    return Shown(store, user, stranger, stored_lines(store, STREAM))


def _envelope(line: bytes) -> dict[str, Any]:
    return {k: v for k, v in json.loads(line).items() if k != "body"}


def _head(line: bytes) -> str:
    entry = json.loads(line)
    return f"{entry['seq']:>6} {entry['occurred_at']} {entry['kind']}"


def test_an_unknown_stream_is_named_with_its_store(shown: Shown) -> None:
    with pytest.raises(UnknownStream) as caught:
        list(show_stream(shown.store, "nope"))
    assert str(caught.value) == f"store {shown.store} holds no stream 'nope'"


def test_a_missing_store_is_refused_and_never_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    with pytest.raises(StoreMissing) as caught:
        list(show_stream(missing, STREAM))
    assert str(caught.value) == f"store {missing} does not exist"
    assert list(tmp_path.iterdir()) == []


def test_without_a_key_clear_bodies_are_shown_and_sealed_ones_counted(shown: Shown) -> None:
    lines = shown.lines
    assert len(lines) == 4
    text = list(show_stream(shown.store, STREAM))
    opened = json.loads(lines[0])["body"]
    assert text[0] == _head(lines[0]) + "  " + json.dumps(opened, ensure_ascii=False)
    for line, out in zip(lines[1:], text[1:], strict=True):
        sealed = json.loads(line)["body"]
        assert isinstance(sealed, str)
        assert out == _head(line) + f"  (sealed, {len(sealed)} base64 characters)"

    rows = [json.loads(s) for s in show_stream(shown.store, STREAM, as_json=True)]
    assert rows[0] == {"envelope": _envelope(lines[0]), "body": opened, "note": None}
    for line, row in zip(lines[1:], rows[1:], strict=True):
        note = f"sealed, {len(json.loads(line)['body'])} base64 characters"
        assert row == {"envelope": _envelope(line), "body": None, "note": note}


def test_with_a_key_every_body_is_shown_with_bytes_as_text_or_base64(shown: Shown) -> None:
    lines = shown.lines
    rows = [json.loads(s) for s in show_stream(shown.store, STREAM, key=shown.user, as_json=True)]
    assert [r["envelope"] for r in rows] == [_envelope(line) for line in lines]
    assert all(r["note"] is None for r in rows)
    opened = rows[0]["body"]
    stored = json.loads(lines[0])["body"]
    assert opened["recipients"] == stored["recipients"]  # models in a list, as JSON
    assert opened["labels"] == {} and opened["key_epoch"] == 0
    assert rows[1]["body"] == {
        "kind": "turn.started",
        "turn": 0,
        "input_bytes": QUESTION.decode(),
        "input_digest": digest(Domain.INPUT, QUESTION),
    }
    request = rows[2]["body"]
    assert request["retrieval"] == [{"doc_id": "d1", "doc_version": "v2", "chunk_digest": CHUNK}]
    assert request["provider"] == {
        "name": "embedded",
        "endpoint": "http://127.0.0.1/v1",
        "api_version": None,
    }
    assert request["params"] == {"seed": 7} and request["pins"] is None
    assert request["request_bytes"] == '{"model":"m","messages":[]}'
    result = rows[3]["body"]
    assert result["result_bytes"] == "base64:" + base64.b64encode(NOT_UTF8).decode()
    assert result["call_seq"] == 2 and result["outcome"] == "COMMITTED"

    text = list(show_stream(shown.store, STREAM, key=shown.user))
    for line, row, out in zip(lines, rows, text, strict=True):
        assert out == _head(line) + "  " + json.dumps(row["body"], ensure_ascii=False)
    assert "Où est la page? secret-1234" in text[1]  # not escaped


def test_readable_keeps_every_field_in_order() -> None:
    body = TurnStarted(turn=3, input_bytes=b"hi", input_digest=digest(Domain.INPUT, b"hi"))
    out = readable(body)
    assert list(out) == ["kind", "turn", "input_bytes", "input_digest"]
    assert out == {
        "kind": "turn.started",
        "turn": 3,
        "input_bytes": "hi",
        "input_digest": digest(Domain.INPUT, b"hi"),
    }


def test_a_key_that_is_not_a_recipient_opens_only_what_is_clear(shown: Shown) -> None:
    # collect refuses a stream sealed to no key of ours before any line is shown
    with pytest.raises(CannotOpen, match="not sealed to this key"):
        list(show_stream(shown.store, STREAM, key=shown.stranger))


def test_an_entry_that_does_not_open_is_noted_and_the_rest_shown(shown: Shown) -> None:
    tampered = shown.store.with_name("tampered.db")
    src = sqlite3.connect(shown.store)
    dst = sqlite3.connect(tampered)
    src.backup(dst)
    src.close()
    entry = json.loads(shown.lines[1])
    body = entry["body"]
    entry["body"] = ("A" if body[0] != "A" else "B") + body[1:]
    dst.execute("DROP TRIGGER entries_no_update")
    dst.execute(
        "UPDATE entries SET line = ? WHERE stream = ? AND seq = 1",
        (json.dumps(entry, separators=(",", ":"), sort_keys=True).encode(), STREAM),
    )
    dst.commit()
    dst.close()

    rows = [json.loads(s) for s in show_stream(tampered, STREAM, key=shown.user, as_json=True)]
    assert rows[1]["body"] is None
    assert rows[1]["note"].startswith("cannot open: ")
    assert rows[2]["body"]["model_id"] == "m" and rows[2]["note"] is None
    text = list(show_stream(tampered, STREAM, key=shown.user))
    assert text[1] == _head(stored_lines(tampered, STREAM)[1]) + f"  ({rows[1]['note']})"


def test_redacted_views_take_the_place_of_the_opened_bodies(shown: Shown) -> None:
    rules = RedactionRules.parse(r"re:secret-\d+,model.request:params")
    rows = [
        json.loads(s)
        for s in show_stream(shown.store, STREAM, key=shown.user, rules=rules, as_json=True)
    ]
    entries = [parse_entry(line) for line in shown.lines]
    assert [r["envelope"]["seq"] for r in rows] == [e.seq for e in entries]
    started = rows[1]["body"]
    assert started["input_bytes"] == digest(Domain.INPUT, QUESTION)
    assert started["decoded"] == {"input_bytes": f"Où est la page? {REDACTED}"}
    assert rows[2]["body"]["params"] == REDACTED
    assert rows[3]["body"]["result_bytes"] == digest(Domain.TOOL_RESULT, NOT_UTF8)
    assert all(r["note"] is None for r in rows)
    text = list(show_stream(shown.store, STREAM, key=shown.user, rules=rules))
    assert "secret-1234" not in "\n".join(text)
    assert text[1] == _head(shown.lines[1]) + "  " + json.dumps(started, ensure_ascii=False)


def test_redaction_without_a_key_redacts_the_clear_bodies(shown: Shown) -> None:
    rules = RedactionRules.parse("labels")
    rows = [json.loads(s) for s in show_stream(shown.store, STREAM, rules=rules, as_json=True)]
    assert rows[0]["body"]["labels"] == REDACTED
    assert [r["note"] for r in rows[1:]] == [
        f"sealed, {len(json.loads(line)['body'])} base64 characters" for line in shown.lines[1:]
    ]
