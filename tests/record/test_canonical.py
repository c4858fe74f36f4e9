"""The fast canonical-JSON paths must equal RFC 8785 as the ``rfc8785`` library writes it."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from record.digest import canonical_json
from record.schema import envelope_json, parse_entry, parse_head

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=2000, deadline=None)
@given(json_values)
def test_canonical_json_equals_the_library(value: Any) -> None:
    try:
        expected = rfc8785.dumps(value)
    except Exception:
        try:
            canonical_json(value)
        except Exception:
            return
        raise AssertionError(f"the library refuses {value!r}, canonical_json accepts it") from None
    assert canonical_json(value) == expected


def test_floats_and_big_integers_go_to_the_library() -> None:
    assert canonical_json({"a": 1e21, "b": 0.1}) == rfc8785.dumps({"a": 1e21, "b": 0.1})
    assert canonical_json({"€": 1, "a": 2}) == rfc8785.dumps({"€": 1, "a": 2})


envelopes = st.fixed_dictionaries(
    {
        "schema_version": st.just("1.0"),
        "stream": st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
        "seq": st.integers(0, 2**53 - 1),
        "event_id": st.uuids(version=4).map(lambda u: str(u)[:14] + "7" + str(u)[15:]),
        "kind": st.sampled_from(["model.request", "tool.result", "turn.ended", "stream.opened"]),
        "occurred_at": st.just("2026-11-30T14:20:30.123456Z"),
        "key_epoch": st.integers(0, 1000),
    }
)


@settings(max_examples=500, deadline=None)
@given(envelopes)
def test_envelope_json_equals_jcs(envelope: dict[str, Any]) -> None:
    assert envelope_json(envelope) == rfc8785.dumps(envelope)


@settings(max_examples=300, deadline=None)
@given(envelopes.filter(lambda e: e["kind"] != "stream.opened"), st.binary(max_size=64))
def test_fast_and_full_parse_agree_on_sealed_lines(envelope: dict[str, Any], raw: bytes) -> None:
    import base64

    line = rfc8785.dumps({**envelope, "body": base64.b64encode(raw).decode()})
    entry = parse_entry(line)
    head = parse_head(line)
    assert entry.model_dump(exclude={"body"}) == {k: getattr(head, k) for k in envelope} == envelope
    assert head.sealed


def test_plain_values_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record lines are canonicalized on every append: a value the standard library already
    writes as JCS (no floats, only I-JSON-safe integers, ASCII keys) must never pay for the
    library. Here the library is unplugged, and every plain value still comes out (its bytes
    checked against the library's, taken before)."""
    safe = 2**53 - 1
    plain = [
        "text",
        None,
        True,
        False,
        safe,
        -safe,
        0,
        [1, "a", None, [True, {"k": -safe}]],
        {"b": {"c": [safe, "é"]}, "a": None},
    ]
    expected = [rfc8785.dumps(value) for value in plain]

    def unplugged(value: Any) -> bytes:
        raise AssertionError(f"{value!r} went to the library")

    monkeypatch.setattr(rfc8785, "dumps", unplugged)
    assert [canonical_json(value) for value in plain] == expected
