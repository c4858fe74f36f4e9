"""``record.redact`` in process, each view written out, on bodies built here.

``tests/record/test_redact.py`` holds redaction end to end on a session recorded through the
real proxy (seconds a run, with subprocesses mutmut cannot reach); this holds the rules, the
views and the pages' copies word for word: the rule syntax and its errors, which field a rule
hides, the digests shown for bytes, copies chased from the shortest kept length, the longest
literal first, and the shape a hidden value keeps.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import pytest

from record.digest import Domain, digest
from record.redact import (
    BYTES_DOMAINS,
    MIN_COPY,
    REDACTED,
    RedactionRules,
    bytes_digest,
)
from record.schema import (
    FetchResponse,
    ModelRequest,
    ModelResponse,
    Provider,
    RetrievalItem,
    StreamOpened,
    ToolResult,
    TurnStarted,
    WrappedKey,
)
from record.seal import KeyPair

CHUNK = digest(Domain.TOOL_RESULT, b"chunk")


def _started(text: bytes, turn: int = 0) -> TurnStarted:
    return TurnStarted(turn=turn, input_bytes=text, input_digest=digest(Domain.INPUT, text))


def _request(raw: bytes, *, model_id: str = "m", params: dict[str, Any] | None = None) -> Any:
    return ModelRequest(
        content_key=digest(Domain.REQUEST, raw),
        input_digest=digest(Domain.INPUT, raw),
        prompt_digest=digest(Domain.PROMPT, raw),
        request_bytes=raw,
        input_bytes=raw,
        prompt_bytes=raw,
        retrieval=[RetrievalItem(doc_id="doc-secret-77", doc_version="v1", chunk_digest=CHUNK)],
        provider=Provider(name="embedded", endpoint="http://127.0.0.1/secret-77"),
        model_id=model_id,
        params=params if params is not None else {"seed": 7},
    )


def _response(data: bytes | None, error: bytes | None = None) -> ModelResponse:
    return ModelResponse(
        request_seq=1,
        outcome="COMMITTED",
        status=200,
        response_bytes=data,
        response_digest=digest(Domain.RESPONSE, data) if data is not None else None,
        error_bytes=error,
        error_digest=digest(Domain.ERROR, error) if error is not None else None,
    )


# -- the rules -------------------------------------------------------------------------------


def test_rules_parse_fields_kinds_and_patterns_and_skip_empty_parts() -> None:
    rules = RedactionRules.parse(" input_bytes , model.response:response_bytes,, re:a+b ,")
    assert rules.fields == frozenset({(None, "input_bytes"), ("model.response", "response_bytes")})
    assert [p.pattern for p in rules.patterns] == ["a+b"]
    assert bool(rules)
    assert not RedactionRules.parse("")
    assert not RedactionRules.parse(" , ,")
    assert RedactionRules.parse("re:x") and RedactionRules.parse("_f9")
    assert RedactionRules.parse("Field_2").fields == frozenset({(None, "Field_2")})
    assert not RedactionRules()


@pytest.mark.parametrize(
    "rule", ["9field", "a-b", "Model.Response:x", "model:x", "model.response:", ":x", "a.b.c:x"]
)
def test_a_rule_that_is_not_a_field_is_named_word_for_word(rule: str) -> None:
    with pytest.raises(ValueError) as caught:
        RedactionRules.parse(f"ok_field,{rule}")
    assert str(caught.value) == f"rule {rule!r}: expected FIELD, KIND:FIELD or re:PATTERN"


def test_a_bad_pattern_is_named_with_the_reason() -> None:
    try:
        re.compile("(unclosed")
    except re.error as exc:
        reason = str(exc)
    with pytest.raises(ValueError) as caught:
        RedactionRules.parse("re:(unclosed")
    assert str(caught.value) == f"rule 're:(unclosed': bad regular expression ({reason})"


def test_a_field_rule_hides_in_every_kind_and_a_kind_rule_in_its_own() -> None:
    rules = RedactionRules.parse("input_bytes,model.response:response_bytes")
    assert rules.hides("turn.started", "input_bytes")
    assert rules.hides("model.request", "input_bytes")
    assert rules.hides("model.response", "response_bytes")
    assert not rules.hides("fetch.response", "response_bytes")
    assert not rules.hides("model.response", "error_bytes")
    assert not RedactionRules.parse("re:input_bytes").hides("turn.started", "input_bytes")


def test_bytes_are_shown_as_the_record_s_digest_or_a_plain_sha256() -> None:
    for (kind, name), domain in BYTES_DOMAINS.items():
        assert bytes_digest(kind, name, b"abc") == digest(domain, b"abc")
    assert bytes_digest("model.response", "error_bytes", b"e") == digest(Domain.ERROR, b"e")
    assert bytes_digest("x.y", "data", b"abc") == "sha256:" + hashlib.sha256(b"abc").hexdigest()
    assert bytes_digest("turn.started", "answer_bytes", b"a") == (
        "sha256:" + hashlib.sha256(b"a").hexdigest()
    )


# -- views -----------------------------------------------------------------------------------


def test_without_rules_a_view_is_the_body_with_digests_and_decoded_values() -> None:
    body = _started(b'{"q": "hello \\u00e9"}', turn=4)
    view = RedactionRules().stream([("turn.started", body)]).view(0)
    assert view == {
        "kind": "turn.started",
        "turn": 4,
        "input_bytes": digest(Domain.INPUT, b'{"q": "hello \\u00e9"}'),
        "input_digest": digest(Domain.INPUT, b'{"q": "hello \\u00e9"}'),
        "decoded": {"input_bytes": {"q": "hello \u00e9"}},
    }
    assert list(view) == ["kind", "turn", "input_bytes", "input_digest", "decoded"]


def test_a_body_without_bytes_has_no_decoded_member() -> None:
    stream = RedactionRules.parse("re:zz").stream([("custom.kind", {"a": "xzzx", "n": 3})])
    assert stream.views() == [{"a": f"x{REDACTED}x", "n": 3}]


def test_a_hidden_field_is_redacted_and_every_long_enough_copy_of_it_too() -> None:
    secret = b"secret-4711"
    short = b"tiny-77"  # MIN_COPY - 1 characters: not chased
    assert len(short) == MIN_COPY - 1 and len(b"exactly8") == MIN_COPY
    bodies: list[tuple[str, Any]] = [
        ("turn.started", _started(b'{"a": "secret-4711", "b": ["exactly8", "tiny-77"]}')),
        ("model.request", _request(b'{"messages": "say secret-4711 exactly8 tiny-77"}')),
        ("custom.kind", {"note": "secret-4711 and exactly8", "m": {"secret-4711": 1}}),
    ]
    views = RedactionRules.parse("turn.started:input_bytes").stream(bodies).views()
    assert views[0]["decoded"] == {"input_bytes": REDACTED}
    assert views[0]["input_bytes"] == digest(Domain.INPUT, bodies[0][1].input_bytes)
    request = views[1]["decoded"]
    for name in ("request_bytes", "input_bytes", "prompt_bytes"):
        assert request[name] == {"messages": f"say {REDACTED} {REDACTED} tiny-77"}
    assert views[2] == {"note": f"{REDACTED} and {REDACTED}", "m": {REDACTED: 1}}
    assert secret.decode() not in json.dumps(views) and short.decode() in json.dumps(views)


def test_the_longest_hidden_copy_is_replaced_first() -> None:
    bodies: list[tuple[str, Any]] = [
        ("custom.kind", {"hide": ["abcdefgh", "abcdefghijkl"], "keep": "xx abcdefghijkl yy"}),
    ]
    view = RedactionRules.parse("hide").stream(bodies).view(0)
    assert view == {"hide": REDACTED, "keep": f"xx {REDACTED} yy"}


def test_a_hidden_field_that_is_not_bytes_is_chased_as_json() -> None:
    body = _request(b"{}", model_id="model-secret-99", params={"k": "param-secret-1"})
    other = ("custom.kind", {"x": "uses model-secret-99 with param-secret-1"})
    views = RedactionRules.parse("model_id,params").stream([("model.request", body), other])
    assert views.view(0)["model_id"] == REDACTED and views.view(0)["params"] == REDACTED
    assert views.view(1) == {"x": f"uses {REDACTED} with {REDACTED}"}
    # nested models are hidden and chased too
    hidden = RedactionRules.parse("retrieval").stream([("model.request", body), other]).view(0)
    assert hidden["retrieval"] == REDACTED
    assert hidden["provider"] == {
        "name": "embedded",
        "endpoint": "http://127.0.0.1/secret-77",
        "api_version": None,
    }


def test_patterns_scrub_keys_values_lists_and_leave_other_values() -> None:
    stream = RedactionRules.parse(r"re:s\d").stream([])
    assert stream.scrub({"s1": ["a s2", 3, None, True, {"k": "s3s4"}]}) == {
        REDACTED: [f"a {REDACTED}", 3, None, True, {"k": REDACTED * 2}]
    }
    assert stream.scrub(5) == 5
    both = RedactionRules.parse(r"re:ab,re:b\[").stream([])
    assert both.scrub("ab[ b[") == f"{REDACTED}[ {REDACTED}"
    plain = RedactionRules().stream([])
    value = {"s1": ["s2"]}
    assert plain.scrub(value) is value


def test_nested_models_are_shown_as_json() -> None:
    body = _request(b"[1]")
    view = RedactionRules().stream([("model.request", body)]).view(0)
    assert view["retrieval"] == [
        {"doc_id": "doc-secret-77", "doc_version": "v1", "chunk_digest": CHUNK}
    ]
    assert view["provider"]["endpoint"] == "http://127.0.0.1/secret-77"
    assert view["decoded"]["request_bytes"] == [1]
    scrubbed = RedactionRules.parse(r"re:secret-\d+").stream([("model.request", body)]).view(0)
    assert scrubbed["retrieval"][0]["doc_id"] == f"doc-{REDACTED}"
    assert scrubbed["provider"]["endpoint"] == f"http://127.0.0.1/{REDACTED}"


# -- what a page shows -----------------------------------------------------------------------


def test_shown_bytes_of_each_form() -> None:
    sse = (
        b'data: {"choices":[{"index":0,"delta":{"content":"the secret-4711"}}]}\n\ndata: [DONE]\n\n'
    )
    http = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nbody secret-4711 \xc3\xa9"
    http_json = b'HTTP/1.1 200 OK\r\n\r\n{"v": "secret-4711 \\u00e9"}'
    bodies: list[tuple[str, Any]] = [
        ("model.response", _response(b"\xff\xfe binary")),
        ("model.response", _response(sse)),
        ("fetch.response", FetchResponse(**_fetch(http))),
        ("fetch.response", FetchResponse(**_fetch(http_json))),
        ("model.response", _response(b'{"text": "secret-4711 \\u00e9"}')),
        ("model.response", _response(b"plain secret-4711 text")),
        ("model.response", _response(None, b"error secret-4711")),
    ]
    stream = RedactionRules.parse(r"re:secret-\d+").stream(bodies)
    binary_digest = digest(Domain.RESPONSE, b"\xff\xfe binary")
    assert (
        stream.shown_bytes(0, "response_bytes") == f"(9 bytes, not text: {binary_digest})".encode()
    )
    shown_sse = json.loads(stream.shown_bytes(1, "response_bytes") or b"")
    assert shown_sse["object"] == "chat.completion"
    assert shown_sse["choices"][0]["message"] == {"content": f"the {REDACTED}"}
    assert stream.shown_bytes(2, "response_bytes") == (
        f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nbody {REDACTED} \u00e9".encode()
    )
    assert stream.shown_bytes(3, "response_bytes") == (
        f'HTTP/1.1 200 OK\r\n\r\n{{"v": "{REDACTED} \u00e9"}}'.encode()
    )
    assert stream.shown_bytes(4, "response_bytes") == f'{{"text": "{REDACTED} \u00e9"}}'.encode()
    assert stream.shown_bytes(5, "response_bytes") == f"plain {REDACTED} text".encode()
    assert stream.shown_bytes(6, "response_bytes") is None
    assert stream.shown_bytes(6, "error_bytes") == f"error {REDACTED}".encode()
    hidden = RedactionRules.parse("error_bytes").stream(bodies)
    assert hidden.shown_bytes(6, "error_bytes") == REDACTED.encode()
    assert hidden.shown_bytes(5, "response_bytes") == b"plain secret-4711 text"


def test_an_event_stream_with_no_reply_is_shown_as_its_events() -> None:
    sse = b'data: {"odd": "secret-4711"}\n\n'
    stream = RedactionRules.parse(r"re:secret-\d+").stream([("model.response", _response(sse))])
    shown = json.loads(stream.shown_bytes(0, "response_bytes") or b"")
    assert shown == {"events": 1, "reply": None, "other": [{"odd": REDACTED}]}


def _fetch(data: bytes) -> dict[str, Any]:
    return {
        "request_seq": 1,
        "outcome": "COMMITTED",
        "status": 200,
        "response_bytes": data,
        "response_digest": digest(Domain.FETCH_RESPONSE, data),
    }


def test_shown_body_keeps_the_model_with_shown_bytes_and_hidden_shapes() -> None:
    raw = b'{"q": "secret-4711"}'
    body = _request(raw, params={"k": "v", "secret-4711": 2})
    rules = RedactionRules.parse(r"params,provider,retrieval,model_id,re:secret-\d+")
    stream = rules.stream([("model.request", body)])
    shown = stream.shown_body(0)
    assert isinstance(shown, ModelRequest)
    assert shown.request_bytes == f'{{"q": "{REDACTED}"}}'.encode()
    assert shown.input_bytes == shown.request_bytes and shown.prompt_bytes == shown.request_bytes
    assert shown.params == {REDACTED: REDACTED}
    assert shown.provider == Provider(name=REDACTED, endpoint=REDACTED, api_version=None)
    assert shown.retrieval == []
    assert shown.model_id == REDACTED
    assert shown.content_key == body.content_key and shown.turn is None
    assert body.request_bytes == raw  # the recorded body is left as it was


def test_shown_body_scrubs_models_lists_and_keeps_wrapped_keys() -> None:
    body = _request(b"{}")
    stream = RedactionRules.parse(r"re:secret-\d+").stream([("model.request", body)])
    shown = stream.shown_body(0)
    assert isinstance(shown, ModelRequest)
    assert shown.provider == Provider(name="embedded", endpoint=f"http://127.0.0.1/{REDACTED}")
    assert shown.retrieval == [
        RetrievalItem(doc_id=f"doc-{REDACTED}", doc_version="v1", chunk_digest=CHUNK)
    ]
    assert shown.params == {"seed": 7}
    recipient = KeyPair.generate().recipient
    wrapped = WrappedKey(recipient=recipient.text(), sealed_key=b"\x01" * 80)
    opened = StreamOpened(
        origin="o", log_key="k", key_epoch=0, recipients=[wrapped], labels={"l": "secret-4711"}
    )
    shown_opened = RedactionRules.parse(r"re:secret-\d+").stream([("stream.opened", opened)])
    copy = shown_opened.shown_body(0)
    assert isinstance(copy, StreamOpened)
    assert copy.recipients == [wrapped] and copy.labels == {"l": REDACTED}


def test_shown_body_of_a_clear_dict_is_its_view() -> None:
    stream = RedactionRules.parse("a").stream([("custom.kind", {"a": "x", "b": "y"})])
    assert stream.shown_body(0) == {"a": REDACTED, "b": "y"}


def test_a_hidden_number_keeps_its_value_and_a_hidden_result_its_shape() -> None:
    result = ToolResult(
        call_seq=3,
        outcome="COMMITTED",
        result_bytes=b"r",
        result_digest=digest(Domain.TOOL_RESULT, b"r"),
    )
    shown = RedactionRules.parse("call_seq,outcome").stream([("tool.result", result)]).shown_body(0)
    assert isinstance(shown, ToolResult)
    assert shown.call_seq == 3 and shown.outcome == REDACTED and shown.result_bytes == b"r"


def test_a_kind_rule_hides_nothing_in_other_kinds() -> None:
    # hidden values under MIN_COPY characters, so that no copy of them is chased
    reply, page = b"hi!", b"HTTP/1.1 200 OK\r\n\r\npage says hi"
    failed = _response(reply).model_copy(update={"outcome": "FAILED"})
    fetch = FetchResponse(**_fetch(page))
    bodies: list[tuple[str, Any]] = [
        ("model.response", failed),
        ("fetch.response", fetch),
        ("custom.kind", {"outcome": "kept", "response_bytes": "kept too"}),
    ]
    stream = RedactionRules.parse("model.response:response_bytes,model.response:outcome").stream(
        bodies
    )
    views = stream.views()
    assert views[0]["decoded"] == {"response_bytes": REDACTED}
    assert views[0]["outcome"] == REDACTED
    assert views[1]["decoded"]["response_bytes"] == {
        "head": "HTTP/1.1 200 OK",
        "body": "page says hi",
    }
    assert views[1]["outcome"] == "COMMITTED"
    assert views[2] == {"outcome": "kept", "response_bytes": "kept too"}
    assert stream.shown_bytes(0, "response_bytes") == REDACTED.encode()
    assert stream.shown_bytes(1, "response_bytes") == page
    shown = stream.shown_body(1)
    assert isinstance(shown, FetchResponse)
    assert shown.outcome == "COMMITTED" and shown.response_bytes == page
    hidden = stream.shown_body(0)
    assert isinstance(hidden, ModelResponse)
    assert hidden.outcome == REDACTED and hidden.response_bytes == REDACTED.encode()


def test_a_short_hidden_value_is_still_redacted_where_it_is() -> None:
    bodies: list[tuple[str, Any]] = [("model.response", _response(None, b"err"))]
    stream = RedactionRules.parse("error_bytes").stream(bodies)
    assert stream.shown_bytes(0, "error_bytes") == REDACTED.encode()
    assert RedactionRules().stream(bodies).shown_bytes(0, "error_bytes") == b"err"


def test_wrapped_keys_are_shown_as_json_and_hidden_ones_chased_as_json() -> None:
    recipient = KeyPair.generate().recipient.text()
    wrapped = WrappedKey(recipient=recipient, sealed_key=b"\x02" * 80)
    opened = StreamOpened(origin="o", log_key="k", key_epoch=0, recipients=[wrapped])
    as_json = [{"recipient": recipient, "sealed_key": base64.b64encode(b"\x02" * 80).decode()}]
    assert RedactionRules().stream([("stream.opened", opened)]).view(0)["recipients"] == as_json
    bodies: list[tuple[str, Any]] = [("stream.opened", opened), ("custom.kind", {"r": recipient})]
    views = RedactionRules.parse("recipients").stream(bodies).views()
    assert views[0]["recipients"] == REDACTED
    assert views[1] == {"r": REDACTED}
