"""``record.limits`` at each edge and word for word, in process.

``tests/egress_proxy/test_limits.py`` holds the limits end to end (a proxy, a store, every
reader), twenty seconds a run; ``make mutate`` needs the rules themselves held in under a
second: each limit at its value and one past it, each refusal's class and message.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from record.limits import (
    MAX_DEPTH,
    MAX_MESSAGES,
    MAX_NUMBER_CHARS,
    MAX_TOOLS,
    JsonRefused,
    OverLimit,
    check_counts,
    load_json,
    nesting_depth,
)


def _refusal(raw: bytes | str, **kwargs: Any) -> JsonRefused:
    with pytest.raises(JsonRefused) as caught:
        load_json(raw, **kwargs)
    return caught.value


def test_a_number_of_the_longest_text_is_read_and_one_character_more_is_refused() -> None:
    longest_int = "9" * MAX_NUMBER_CHARS
    longest_float = "1." + "5" * (MAX_NUMBER_CHARS - 2)
    assert load_json(f"[{longest_int}, {longest_float}]") == [
        int(longest_int),
        float(longest_float),
    ]
    for text in ("9" * (MAX_NUMBER_CHARS + 1), "1." + "5" * (MAX_NUMBER_CHARS - 1)):
        refused = _refusal(f'{{"n": {text}}}')
        assert type(refused) is OverLimit
        assert str(refused) == (
            f"a number is {MAX_NUMBER_CHARS + 1} characters long (at most {MAX_NUMBER_CHARS})"
        )


def test_numbers_keep_their_kind() -> None:
    value = load_json(b'{"i": 12, "f": 1.5, "e": 2e3, "s": "7"}')
    assert value == {"i": 12, "f": 1.5, "e": 2000.0, "s": "7"}
    assert type(value["i"]) is int and type(value["f"]) is float and type(value["e"]) is float


@pytest.mark.parametrize("name", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused_by_name(name: str) -> None:
    refused = _refusal(f"[1, {name}]")
    assert type(refused) is JsonRefused
    assert str(refused) == f"{name} is not JSON"


def test_a_member_named_twice_is_refused_only_when_keys_must_be_unique() -> None:
    raw = b'{"a": 1, "b": {"c": 2, "d": [3]}, "a": 4}'
    assert load_json(raw) == {"a": 4, "b": {"c": 2, "d": [3]}}
    refused = _refusal(raw, unique_keys=True)
    assert type(refused) is JsonRefused
    assert str(refused) == "the member 'a' appears twice in one object"
    nested = _refusal(b'[{"x": {"k": 1, "k": 1}}]', unique_keys=True)
    assert str(nested) == "the member 'k' appears twice in one object"
    # unique members are read as they are, nested objects included
    unique = load_json(b'{"a": 1, "b": {"c": 2, "d": [{"e": null}]}}', unique_keys=True)
    assert unique == {"a": 1, "b": {"c": 2, "d": [{"e": None}]}}
    assert type(unique) is dict and type(unique["b"]) is dict


def test_bytes_bytearray_and_text_are_read_alike() -> None:
    # a bytearray is read as bytes are (the check is ``isinstance(raw, bytes | bytearray)``)
    for raw in (b'{"k": "\xc3\xa9"}', bytearray(b'{"k": "\xc3\xa9"}'), '{"k": "\u00e9"}'):
        assert load_json(raw) == {"k": "\u00e9"}  # type: ignore[arg-type]


def test_bytes_that_are_not_utf8_are_refused_as_such() -> None:
    raw = b'{"k": "\xff"}'
    refused = _refusal(raw)
    assert type(refused) is JsonRefused
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        assert str(refused) == f"not UTF-8: {exc}"
    refused = _refusal(bytearray(raw))  # type: ignore[arg-type]
    assert str(refused).startswith("not UTF-8: ")


@pytest.mark.parametrize("raw", ["{", "[1,]", "", "nope", '{"a" 1}'])
def test_text_that_is_not_json_is_refused_with_the_parser_s_reason(raw: str) -> None:
    refused = _refusal(raw)
    assert type(refused) is JsonRefused
    try:
        json.loads(raw)
    except ValueError as exc:
        assert str(refused) == f"not JSON: {exc}"


def _arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


def _objects(depth: int) -> str:
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


@pytest.mark.parametrize("nest", [_arrays, _objects])
def test_nesting_to_the_limit_is_read_and_one_level_more_is_refused(nest: Any) -> None:
    assert nesting_depth(load_json(nest(MAX_DEPTH))) == MAX_DEPTH
    # at the limit with more brackets than levels, so the depth is measured and let through
    wider = "[" + nest(MAX_DEPTH - 1) + ", [], {}]"
    assert nesting_depth(load_json(wider)) == MAX_DEPTH
    refused = _refusal(nest(MAX_DEPTH + 1))
    assert type(refused) is OverLimit
    assert str(refused) == (
        f"arrays and objects nest more than {MAX_DEPTH} deep ({MAX_DEPTH + 1} levels)"
    )


def test_nesting_mixed_arrays_and_objects_is_counted_together() -> None:
    half = MAX_DEPTH // 2 + 1  # each kind alone is well under the limit
    raw = '[{"a":' * half + "1" + "}]" * half
    refused = _refusal(raw)
    assert type(refused) is OverLimit
    assert str(refused) == f"arrays and objects nest more than {MAX_DEPTH} deep ({2 * half} levels)"


def test_nesting_past_the_interpreter_s_recursion_is_refused_as_over_the_limit() -> None:
    refused = _refusal(_arrays(200_000))
    assert type(refused) is OverLimit
    assert str(refused) == f"arrays and objects nest more than {MAX_DEPTH} deep"


def test_many_brackets_that_do_not_nest_are_read() -> None:
    wide = "[" + ",".join(["[]"] * (MAX_DEPTH * 2)) + "]"
    assert load_json(wide) == [[]] * (MAX_DEPTH * 2)
    in_strings = json.dumps(["[{" * MAX_DEPTH])
    assert load_json(in_strings) == ["[{" * MAX_DEPTH]


@pytest.mark.parametrize(
    ("value", "depth"),
    [
        (None, 0),
        (7, 0),
        ("[]", 0),
        ([], 1),
        ({}, 1),
        ([1, 2], 1),
        ([[1]], 2),
        ({"a": [{}]}, 3),
        ([[[[]]], []], 4),
        ([[], [[[]]]], 4),
        ({"a": {}, "b": {"c": [1, {"d": []}]}}, 5),
        ([{"a": 1}, [[2]], 3], 3),
    ],
)
def test_nesting_depth_counts_the_deepest_branch(value: Any, depth: int) -> None:
    assert nesting_depth(value) == depth


def test_nesting_depth_measures_past_the_recursion_limit() -> None:
    value: Any = []
    for _ in range(10_000):
        value = [value]
    assert nesting_depth(value) == 10_001


@pytest.mark.parametrize("member", ["messages", "input"])
def test_message_counts_up_to_the_limit_pass_and_one_more_is_refused(member: str) -> None:
    check_counts({member: [{}] * MAX_MESSAGES, "tools": [{}] * MAX_TOOLS})
    with pytest.raises(OverLimit) as caught:
        check_counts({"messages": [], "input": [], member: [{}] * (MAX_MESSAGES + 1)})
    assert str(caught.value) == f"{member!r} has {MAX_MESSAGES + 1} items (at most {MAX_MESSAGES})"


def test_messages_and_input_are_both_counted() -> None:
    with pytest.raises(OverLimit) as caught:
        check_counts({"messages": [{}], "input": [{}] * (MAX_MESSAGES + 1)})
    assert str(caught.value) == f"'input' has {MAX_MESSAGES + 1} items (at most {MAX_MESSAGES})"


def test_tool_counts_up_to_the_limit_pass_and_one_more_is_refused() -> None:
    check_counts({"tools": [{}] * MAX_TOOLS})
    with pytest.raises(OverLimit) as caught:
        check_counts({"messages": [{}], "tools": [{}] * (MAX_TOOLS + 1)})
    assert str(caught.value) == f"'tools' has {MAX_TOOLS + 1} items (at most {MAX_TOOLS})"


def test_members_that_are_not_lists_are_not_counted() -> None:
    long_text = "x" * (MAX_MESSAGES + MAX_TOOLS)
    many = {str(i): i for i in range(MAX_MESSAGES + 1)}
    check_counts({"messages": long_text, "input": many, "tools": long_text})
    check_counts({"tools": many})
    check_counts({})
