"""The schema: envelope, bodies and the v1.0 record, through a real ``Log`` on real SQLite.

- ``V1Record`` has exactly the reference schema's 16 fields, in its order;
- a ``model.request`` + ``model.response`` appended through ``Log``, read back from the
  store file, opened with a recipient key and projected, gives ``response_bytes`` byte for
  byte as received: an SSE stream with ``event:`` lines, a comment, CRLF, padding and no
  final blank line (the Anthropic captures' shape); no response projects to ``UNKNOWN``;
- unknown fields and wrong types, in a stored line or in a sealed body, raise
  ``SchemaError`` naming the field;
- ``event_id`` is a UUIDv7 (version 7, RFC 9562 variant, time-ordered across appends) and
  ``occurred_at`` is RFC 3339 UTC;
- with ``../shared/vectors/provider-streams`` present, every capture there round-trips as
  ``response_bytes`` through the log byte for byte.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue

from record.digest import Domain, canonical_json, digest
from record.errors import SchemaError
from record.log import Log
from record.reader import StreamKeys, associated_data
from record.schema import (
    BODY_MODELS,
    CLEAR_KINDS,
    Entry,
    Envelope,
    ModelRequest,
    ModelResponse,
    Provider,
    RetrievalItem,
    Strict,
    ToolCall,
    TurnStarted,
    V1Record,
    parse_body,
    parse_entry,
    project_v1,
)
from record.seal import KeyPair, seal
from tests.record.raw_store import stored_lines

STREAM = "schema-test"

V1_FIELDS = [
    "schema_version",
    "event_id",
    "content_key",
    "seq",
    "occurred_at",
    "input_digest",
    "prompt_digest",
    "retrieval",
    "provider",
    "model_id",
    "params",
    "fingerprint",
    "response_bytes",
    "response_digest",
    "error_bytes",
    "outcome",
]

#: An SSE body shaped like Anthropic's captures: named events, a comment, a CRLF line, JSON
#: padded with spaces before its closing brace, non-ASCII UTF-8, and no final blank line
#: (not even a final newline), so a lenient reader that "normalises" framing would lose bytes.
SSE_REPLY = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_01","role":"assistant"}}\n'
    b"\n"
    b": keep-alive\n"
    b"\n"
    b"event: content_block_delta\r\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"text":"caf\xc3\xa9 \xe2\x82\xac"}}'
    b"         }\n"
    b"\n"
    b"event: ping\n"
    b'data: {"type": "ping"}\n'
    b"\n"
    b"event: message_stop\n"
    b'data: {"type":"message_stop"}'
)

RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z$")


# -- helpers -----------------------------------------------------------------------------------


def model_request(question: bytes, *, model_id: str = "affidavit-tiny") -> ModelRequest:
    params: dict[str, JsonValue] = {"seed": 7, "temperature": 0.0, "stop": ["\n\n"]}
    raw = canonical_json({"model": model_id, "messages": [{"role": "user", "content": "q"}]})
    prompt = canonical_json({"messages": [{"role": "user", "content": question.decode("latin-1")}]})
    return ModelRequest(
        content_key=digest(Domain.REQUEST, raw),
        input_digest=digest(Domain.INPUT, question),
        prompt_digest=digest(Domain.PROMPT, prompt),
        request_bytes=raw,
        input_bytes=question,
        prompt_bytes=prompt,
        retrieval=[
            RetrievalItem(
                doc_id="doc-1", doc_version="v3", chunk_digest=digest(Domain.INPUT, b"chunk")
            )
        ],
        provider=Provider(name="anthropic", endpoint="https://api.example/v1/messages"),
        model_id=model_id,
        params=params,
    )


def model_response(request_seq: int, reply: bytes, **extra: Any) -> ModelResponse:
    return ModelResponse(
        request_seq=request_seq,
        outcome="COMMITTED",
        status=200,
        response_bytes=reply,
        response_digest=digest(Domain.RESPONSE, reply),
        fingerprint="fp_0123",
        **extra,
    )


def names(field: str) -> str:
    """A pattern for a message that names ``field`` as a field ("seq 3" is a position)."""
    return rf"\b{re.escape(field)}\b(?! [0-9])"


def jcs_line(value: object) -> bytes:
    """A line written the way the writer writes one (RFC 8785 member order, no whitespace).

    For these ASCII-keyed values without floats this *is* RFC 8785; a float stays as Python
    writes it (``1.0``), which is how a test puts a wrong JSON type into an otherwise
    canonical line.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def open_all(store: Path, stream: str, key: KeyPair) -> list[tuple[Entry, Strict]]:
    entries = [parse_entry(line) for line in stored_lines(store, stream)]
    keys = StreamKeys.collect(stream, entries, key)
    return [(e, keys.open(e)) for e in entries]


def project_all(opened: list[tuple[Entry, Strict]]) -> list[V1Record]:
    """Join every model.request with the model.response that answers it."""
    responses = {
        b.request_seq: b for _, b in opened if isinstance(b, ModelResponse)
    }  # request_seq -> response
    return [
        project_v1(e.envelope(), b, responses.get(e.seq))
        for e, b in opened
        if isinstance(b, ModelRequest)
    ]


@pytest.fixture
def user() -> KeyPair:
    return KeyPair.generate()


@pytest.fixture
def log(tmp_path: Path, user: KeyPair) -> Iterator[Log]:
    with Log.open(tmp_path / "record.db", appliance_key=user) as opened:
        opened.open_stream(STREAM, [user.recipient])
        yield opened


# -- the models --------------------------------------------------------------------------------


def test_v1_record_has_exactly_the_reference_fields() -> None:
    assert list(V1Record.model_fields) == V1_FIELDS


def test_envelope_fields() -> None:
    assert set(Envelope.model_fields) == {
        "schema_version",
        "stream",
        "seq",
        "event_id",
        "kind",
        "occurred_at",
        "key_epoch",
    }
    assert set(Entry.model_fields) == set(Envelope.model_fields) | {"body"}


def test_every_entry_kind_has_a_strict_body_model() -> None:
    assert set(BODY_MODELS) == {
        "stream.opened",
        "key.rotated",
        "model.request",
        "model.response",
        "tool.call",
        "tool.result",
        "tool.unavailable",
        "fetch.request",
        "fetch.response",
        "turn.started",
        "turn.ended",
        "turn.decided",
        "pins.set",
        "evidence.archived",
        "lease.taken",
    }
    assert {"stream.opened", "key.rotated"} == CLEAR_KINDS
    for kind, model in BODY_MODELS.items():
        assert model.model_config.get("extra") == "forbid", kind
        with pytest.raises(SchemaError, match=r"surprise"):
            parse_body(kind, {"kind": kind, "surprise": 1})


# -- the projection through a real log ---------------------------------------------------------


def test_projection_keeps_streamed_bytes_exactly(tmp_path: Path, log: Log, user: KeyPair) -> None:
    assert not SSE_REPLY.endswith(b"\n")
    request = model_request(b"What is \xe2\x82\xac?")
    req = log.append(STREAM, request)
    log.append(STREAM, model_response(req.seq, SSE_REPLY))
    log.close()

    opened = open_all(tmp_path / "record.db", STREAM, user)
    (v1,) = project_all(opened)

    assert v1.response_bytes == SSE_REPLY  # every byte, framing included
    assert v1.response_digest == "sha256:" + hashlib.sha256(b"\x01" + SSE_REPLY).hexdigest()
    assert v1.outcome == "COMMITTED"
    assert v1.fingerprint == "fp_0123"
    assert v1.error_bytes is None
    assert v1.seq == req.seq
    assert v1.event_id == req.event_id
    assert v1.occurred_at == req.occurred_at
    assert v1.schema_version == "1.0"
    assert v1.content_key == request.content_key
    assert v1.input_digest == request.input_digest
    assert v1.prompt_digest == request.prompt_digest
    assert v1.retrieval == request.retrieval
    assert v1.provider == request.provider
    assert v1.model_id == "affidavit-tiny"
    assert v1.params == {"seed": 7, "temperature": 0.0, "stop": ["\n\n"]}

    # The record's JSON form carries the same bytes, and reads back to them.
    as_json = v1.model_dump_json()
    assert json.loads(as_json)["response_bytes"] == base64.b64encode(SSE_REPLY).decode()
    assert V1Record.model_validate_json(as_json).response_bytes == SSE_REPLY
    assert list(json.loads(as_json)) == V1_FIELDS


def test_missing_response_projects_to_unknown(tmp_path: Path, log: Log, user: KeyPair) -> None:
    answered = log.append(STREAM, model_request(b"first"))
    log.append(STREAM, model_response(answered.seq, b"data: ok\n\n"))
    pending = log.append(STREAM, model_request(b"second"))  # the call's fate is not known
    log.close()

    first, second = project_all(open_all(tmp_path / "record.db", STREAM, user))
    assert (first.seq, first.outcome, first.response_bytes) == (
        answered.seq,
        "COMMITTED",
        b"data: ok\n\n",
    )
    assert second.seq == pending.seq
    assert second.outcome == "UNKNOWN"
    assert second.response_bytes is None
    assert second.response_digest is None
    assert second.fingerprint is None
    assert second.error_bytes is None


def test_failed_call_projects_error_bytes(tmp_path: Path, log: Log, user: KeyPair) -> None:
    error = b'{"error":{"type":"overloaded_error"}}\xff'
    req = log.append(STREAM, model_request(b"q"))
    log.append(
        STREAM,
        ModelResponse(
            request_seq=req.seq,
            outcome="FAILED",
            status=529,
            error_bytes=error,
            error_digest=digest(Domain.ERROR, error),
        ),
    )
    log.close()
    (v1,) = project_all(open_all(tmp_path / "record.db", STREAM, user))
    assert (v1.outcome, v1.error_bytes, v1.response_bytes) == ("FAILED", error, None)


def test_projection_refuses_a_response_to_another_request(log: Log) -> None:
    req = log.append(STREAM, model_request(b"q"))
    envelope = Envelope(
        schema_version="1.0",
        stream=STREAM,
        seq=req.seq,
        event_id=req.event_id,
        kind="model.request",
        occurred_at=req.occurred_at,
        key_epoch=0,
    )
    with pytest.raises(ValueError, match="request seq"):
        project_v1(envelope, model_request(b"q"), model_response(req.seq + 5, b"x"))


# -- unknown fields and wrong types, naming the field ------------------------------------------


def _a_stored_line(tmp_path: Path, log: Log) -> dict[str, Any]:
    log.append(STREAM, model_request(b"q"))
    log.close()
    line = stored_lines(tmp_path / "record.db", STREAM)[1]
    parse_entry(line)  # the untouched line is valid
    parsed: dict[str, Any] = json.loads(line)
    return parsed


def test_entry_line_with_unknown_field_names_it(tmp_path: Path, log: Log) -> None:
    entry = _a_stored_line(tmp_path, log)
    entry["colour"] = "red"
    with pytest.raises(SchemaError, match=names("colour")):
        parse_entry(jcs_line(entry))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seq", "one"),
        ("seq", -1),
        ("key_epoch", None),
        ("event_id", str(uuid.uuid4())),  # a UUID, but not a v7
        ("occurred_at", "2026-11-30T12:00:00+01:00"),  # RFC 3339, but not UTC "Z"
        ("occurred_at", "30/11/2026"),
        ("stream", "no spaces allowed"),
        ("kind", 7),
        ("body", 5),
        # JSON values of the wrong type that lax validation would coerce:
        pytest.param("seq", "1", id="seq-string-1"),
        pytest.param("seq", True, id="seq-true"),
        pytest.param("seq", 1.0, id="seq-float-1.0"),
        pytest.param("key_epoch", "0", id="key_epoch-string-0"),
    ],
)
def test_entry_line_with_wrong_type_names_the_field(
    tmp_path: Path, log: Log, field: str, value: object
) -> None:
    entry = _a_stored_line(tmp_path, log)
    entry[field] = value
    with pytest.raises(SchemaError, match=names(field)):
        parse_entry(jcs_line(entry))


def test_missing_envelope_field_is_named(tmp_path: Path, log: Log) -> None:
    entry = _a_stored_line(tmp_path, log)
    del entry["occurred_at"]
    with pytest.raises(SchemaError, match=names("occurred_at")):
        parse_entry(jcs_line(entry))


def _reseal(entry: Entry, keys: StreamKeys, body: dict[str, Any]) -> Entry:
    """A stored entry with another plaintext body, sealed properly under the stream key."""
    sealed = seal(keys.keys[entry.key_epoch], json.dumps(body).encode(), associated_data(entry))
    line = json.loads(entry.model_dump_json())
    line["body"] = base64.b64encode(sealed).decode()
    return parse_entry(jcs_line(line))


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("model.response", "colour", "red"),  # unknown field
        ("model.response", "outcome", "MAYBE"),
        ("model.response", "response_digest", "md5:abc"),
        ("model.response", "response_bytes", "not base64!"),
        ("model.response", "request_seq", "zero"),
        # wrong JSON types that lax validation would coerce:
        pytest.param("model.response", "request_seq", "0", id="request_seq-string-0"),
        pytest.param("model.response", "status", 200.0, id="status-float-200.0"),
        pytest.param("tool.call", "idempotent", "true", id="idempotent-string-true"),
        ("tool.call", "call_id", 12),  # an int where a string belongs
    ],
)
def test_sealed_body_with_bad_field_names_it(
    tmp_path: Path, log: Log, user: KeyPair, kind: str, field: str, value: object
) -> None:
    req = log.append(STREAM, model_request(b"q"))
    reply = log.append(STREAM, model_response(req.seq, b"data: x\n\n"))
    args = canonical_json({"q": 1})
    log.append(
        STREAM,
        ToolCall(
            reply_seq=reply.seq,
            call_id="c1",
            server="builtin",
            tool="search",
            arguments=args,
            arguments_digest=digest(Domain.TOOL_ARGUMENTS, args),
            idempotent=False,
        ),
    )
    log.close()
    opened = open_all(tmp_path / "record.db", STREAM, user)
    entries = [e for e, _ in opened]
    keys = StreamKeys.collect(STREAM, entries, user)
    entry, body = next((e, b) for e, b in opened if e.kind == kind)
    plain = json.loads(canonical_json(body.model_dump(mode="json")))
    assert keys.open(_reseal(entry, keys, plain)) == body  # resealing itself is harmless
    plain[field] = value
    with pytest.raises(SchemaError, match=names(field)) as caught:
        keys.open(_reseal(entry, keys, plain))
    assert f"seq {entry.seq}" in str(caught.value)


# -- event ids and times -----------------------------------------------------------------------


def test_event_ids_are_time_ordered_uuidv7(tmp_path: Path, log: Log) -> None:
    before = datetime.now(UTC)
    appended = [
        log.append(
            STREAM, TurnStarted(turn=i, input_bytes=b"q", input_digest=digest(Domain.INPUT, b"q"))
        )
        for i in range(40)
    ]
    after = datetime.now(UTC)
    log.close()
    entries = [parse_entry(line) for line in stored_lines(tmp_path / "record.db", STREAM)]
    assert [e.event_id for e in entries[1:]] == [a.event_id for a in appended]

    ids = [uuid.UUID(e.event_id) for e in entries]
    for e, u in zip(entries, ids, strict=True):
        assert u.version == 7, e.event_id
        assert u.variant == uuid.RFC_4122, e.event_id
        assert str(u) == e.event_id  # lowercase, canonical form
        assert int.from_bytes(u.bytes[:6], "big") / 1000 > before.timestamp() - 60
    assert ids == sorted(ids, key=lambda u: u.bytes), "event ids are not time-ordered"
    assert len(set(ids)) == len(ids)

    for e in entries:
        assert RFC3339_UTC.match(e.occurred_at), e.occurred_at
        moment = datetime.fromisoformat(e.occurred_at)
        assert moment.utcoffset() == timedelta(0)
        assert before - timedelta(seconds=60) <= moment <= after + timedelta(seconds=1)
    # the uuid's millisecond clock and occurred_at agree (both read when the entry is built)
    for e, u in zip(entries, ids, strict=True):
        uuid_ms = int.from_bytes(u.bytes[:6], "big")
        at_ms = datetime.fromisoformat(e.occurred_at).timestamp() * 1000
        assert abs(uuid_ms - at_ms) < 5_000, (e.seq, uuid_ms, at_ms)


def test_event_ids_stay_ordered_across_a_restart(tmp_path: Path, user: KeyPair) -> None:
    path = tmp_path / "record.db"
    with Log.open(path, appliance_key=user) as log:
        log.open_stream(STREAM, [user.recipient])
        log.append(
            STREAM, TurnStarted(turn=0, input_bytes=b"a", input_digest=digest(Domain.INPUT, b"a"))
        )
    time.sleep(0.002)
    with Log.open(path, appliance_key=user) as log:
        log.append(
            STREAM, TurnStarted(turn=1, input_bytes=b"b", input_digest=digest(Domain.INPUT, b"b"))
        )
    ids = [uuid.UUID(parse_entry(line).event_id) for line in stored_lines(path, STREAM)]
    assert [u.version for u in ids] == [7, 7, 7]
    assert ids == sorted(ids, key=lambda u: u.bytes)


# -- real provider captures (../shared/vectors/provider-streams) -------------------------------


def _captures(vectors: Path) -> list[tuple[str, bytes, str]]:
    root = vectors / "provider-streams"
    found = []
    for provider in ("openai", "anthropic"):
        folder = root / provider
        manifest = json.loads((folder / "manifest.json").read_text("utf-8"))["files"]
        on_disk = {p.name for p in folder.iterdir()} - {"README.md", "manifest.json"}
        assert set(manifest) == on_disk, f"{folder}: manifest and files disagree"
        for name in sorted(manifest):
            data = (folder / name).read_bytes()
            assert len(data) == manifest[name]["bytes"]
            found.append((f"{provider}/{name}", data, manifest[name]["sha256"]))
    return found


def test_every_provider_capture_round_trips_byte_for_byte(
    vectors: Path, tmp_path: Path, user: KeyPair
) -> None:
    captures = _captures(vectors)
    assert len(captures) == 22
    # The Anthropic .txt captures end without a blank line; keep at least one of those.
    assert any(not data.endswith(b"\n\n") for _, data, _ in captures)
    assert any(b"event: " in data for _, data, _ in captures)

    path = tmp_path / "record.db"
    with Log.open(path, appliance_key=user) as log:
        log.open_stream(STREAM, [user.recipient])
        for name, data, _ in captures:
            req = log.append(STREAM, model_request(name.encode()))
            log.append(STREAM, model_response(req.seq, data))

    records = project_all(open_all(path, STREAM, user))
    assert len(records) == len(captures)
    for v1, (name, data, sha) in zip(records, captures, strict=True):
        assert v1.response_bytes is not None
        assert hashlib.sha256(v1.response_bytes).hexdigest() == sha, name
        assert v1.response_bytes == data, name
        assert v1.response_digest == digest(Domain.RESPONSE, data), name
