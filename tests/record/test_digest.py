"""Digest domains and canonical JSON: ``record.digest`` against hashlib, RFC 8785 and the source.

- every domain byte is listed once in ``record.digest.Domain``; no two share a byte (aliases
  included: ``IntEnum`` silently turns a repeated value into an alias);
- the reference domains are exactly 0x00 request, 0x01 response, 0x02 input, 0x03 prompt;
- ``digest()`` equals ``sha256(domain || data)`` computed here with hashlib alone;
- ``canonical_json`` gives RFC 8785's own examples byte for byte (sorting by UTF-16 code
  units, ECMAScript number formatting, escapes, no whitespace); the expected strings are the
  RFC's (section 3.2.2, 3.2.3 and Appendix B), cross-checked with a JavaScript engine;
- no other module under ``record/`` writes a domain byte of its own.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import json
import re
import struct
from pathlib import Path

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from record.digest import (
    PREFIX,
    Domain,
    canonical_json,
    digest,
    digest_hex,
    parse_digest,
    tool_call_id,
)

# The module by name: ``record/__init__`` re-exports a function called ``digest``, and under
# pytest ``record`` may even resolve as a namespace package (``tests/record`` is on sys.path).
DIGEST_MODULE = Path(importlib.import_module("record.digest").__file__ or "").resolve()
RECORD_DIR = DIGEST_MODULE.parent


# -- the domain list ---------------------------------------------------------------------------


def test_no_two_domains_share_a_byte() -> None:
    # __members__ includes aliases: Domain(X=0x01, Y=0x01) would show Y mapped to X's member.
    members = Domain.__members__
    values = [int(member) for member in members.values()]
    assert len(values) == len(set(values)), {
        name: int(m) for name, m in members.items() if values.count(int(m)) > 1
    }
    for name, member in members.items():
        assert member.name == name, f"{name} is an alias of {member.name} (same byte)"
        assert 0 <= int(member) <= 0xFF, f"{name} = {int(member)} is not one byte"


def test_no_two_domains_share_a_byte_in_the_source() -> None:
    """Parse the class body itself, so an alias can't hide behind ``IntEnum`` semantics."""
    tree = ast.parse(DIGEST_MODULE.read_text("utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Domain"]
    assigned: dict[str, int] = {}
    for node in cls.body:
        if isinstance(node, ast.Assign):
            (target,) = node.targets
            assert isinstance(target, ast.Name)
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, int), (
                f"Domain.{target.id} must be a literal byte"
            )
            assigned[target.id] = node.value.value
    assert assigned == {name: int(m) for name, m in Domain.__members__.items()}
    assert len(set(assigned.values())) == len(assigned)


def test_reference_domains_are_exactly_0x00_to_0x03() -> None:
    assert int(Domain.REQUEST) == 0x00
    assert int(Domain.RESPONSE) == 0x01
    assert int(Domain.INPUT) == 0x02
    assert int(Domain.PROMPT) == 0x03
    # and no other name claims those four bytes
    low = {name for name, m in Domain.__members__.items() if int(m) <= 0x03}
    assert low == {"REQUEST", "RESPONSE", "INPUT", "PROMPT"}


# -- digest() against hashlib ------------------------------------------------------------------

SAMPLES = [b"", b"\x00", b"hello", bytes(range(256)), b"\xff" * 1000, "café €".encode()]


@pytest.mark.parametrize("domain", list(Domain), ids=lambda d: d.name)
@pytest.mark.parametrize("data", SAMPLES, ids=lambda d: f"{len(d)}B")
def test_digest_is_sha256_of_domain_byte_then_data(domain: Domain, data: bytes) -> None:
    expected = hashlib.sha256(bytes([int(domain)]) + data).hexdigest()
    assert digest_hex(domain, data) == expected
    assert digest(domain, data) == "sha256:" + expected
    assert PREFIX == "sha256:"
    assert parse_digest(digest(domain, data)) == bytes.fromhex(expected)


def test_same_bytes_under_each_domain_give_distinct_digests() -> None:
    data = b'{"model":"m","messages":[]}'
    digests = {digest(d, data) for d in Domain}
    assert len(digests) == len(list(Domain))
    assert hashlib.sha256(data).hexdigest() not in {d[len(PREFIX) :] for d in digests}


def test_known_answers_from_coreutils() -> None:
    # printf '\0abc' | sha256sum ; printf '\1abc' | sha256sum  (computed outside Python)
    assert digest(Domain.REQUEST, b"abc") == (
        "sha256:609f6e36d2405585188d5cfd761f407c7cc46a7d3f314c88270469dde315fcd1"
    )
    assert digest(Domain.RESPONSE, b"abc") == (
        "sha256:1e18834c426d00e57788444cb3ccd62c771b420c095bb0c4e040a8c122c4570d"
    )


@pytest.mark.parametrize(
    "text",
    ["sha256:" + "ab" * 31, "sha1:" + "ab" * 32, "ab" * 32, "sha256:" + "zz" * 32],
)
def test_parse_digest_refuses_malformed(text: str) -> None:
    with pytest.raises(ValueError):
        parse_digest(text)


def test_parse_digest_names_what_is_wrong() -> None:
    with pytest.raises(ValueError) as prefix:
        parse_digest("sha1:abcd")
    assert str(prefix.value) == "digest 'sha1:abcd' does not start with 'sha256:'"
    with pytest.raises(ValueError) as length:
        parse_digest("sha256:abcd")
    assert str(length.value) == "digest 'sha256:abcd' is 2 bytes, not 32"


def test_canonical_json_refuses_what_jcs_refuses() -> None:
    """A non-string key or an integer past 2**53 - 1 is the library's refusal, on every path."""
    with pytest.raises(rfc8785.CanonicalizationError, match="object keys must be strings"):
        canonical_json({1: "x"})
    with pytest.raises(rfc8785.IntegerDomainError):
        canonical_json({"a": [2**53]})
    assert canonical_json([2**53 - 1, -(2**53 - 1)]) == b"[9007199254740991,-9007199254740991]"


def test_tool_call_id_is_derived_from_prompt_seed_and_ordinal() -> None:
    """call_ and the first 24 hex digits of SHA-256(0x06 || JCS [prompt digest, seed, ordinal])."""
    prompt = "sha256:" + "ab" * 32
    for seed, ordinal in [(7, 2), (None, 0)]:
        material = json.dumps([prompt, seed, ordinal], separators=(",", ":")).encode()
        expected = "call_" + hashlib.sha256(b"\x06" + material).hexdigest()[:24]
        assert tool_call_id(prompt, seed, ordinal) == expected


# -- canonical JSON: RFC 8785 ------------------------------------------------------------------

# RFC 8785 section 3.2.2, input and output verbatim.
RFC_322_INPUT = r"""{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"""
RFC_322_OUTPUT = (
    r"""{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"""
    r""""string":"€$\u000f\nA'B\"\\\\\"/"}"""
)

# RFC 8785 section 3.2.3: property sorting by UTF-16 code units.
RFC_323_INPUT = r"""{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}"""
RFC_323_ORDER = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


def test_rfc8785_section_3_2_2_example() -> None:
    assert canonical_json(json.loads(RFC_322_INPUT)) == RFC_322_OUTPUT.encode("utf-8")


def test_rfc8785_section_3_2_3_sorting_by_utf16_code_units() -> None:
    out = canonical_json(json.loads(RFC_323_INPUT))
    expected = (
        '{"\\r":"Carriage Return","1":"One","\u0080":"Control",'
        '"\u00f6":"Latin Small Letter O With Diaeresis","\u20ac":"Euro Sign",'
        '"\U0001f600":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}'
    ).encode("utf-8")
    assert out == expected
    assert list(json.loads(out)) == RFC_323_ORDER
    # the emoji (a surrogate pair, D83D) sorts before U+FB33, unlike code-point order
    assert sorted(RFC_323_ORDER) != RFC_323_ORDER


# RFC 8785 Appendix B: IEEE 754 bit patterns and their canonical JSON number text.
RFC_APPENDIX_B = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


@pytest.mark.parametrize(("bits", "text"), RFC_APPENDIX_B, ids=[b for b, _ in RFC_APPENDIX_B])
def test_rfc8785_appendix_b_numbers(bits: str, text: str) -> None:
    (value,) = struct.unpack(">d", bytes.fromhex(bits))
    assert canonical_json(value) == text.encode("ascii")
    assert canonical_json([value]) == b"[" + text.encode("ascii") + b"]"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e21, "1e+21"),  # ECMAScript switches to exponent form at 1e21 ...
        (1e20, "100000000000000000000"),  # ... but not below it
        (1e-7, "1e-7"),  # and below 1e-6 (no "E", no leading zero in the exponent)
        (1e-6, "0.000001"),
        (json.loads("1E-7"), "1e-7"),
        (4.50, "4.5"),
        (-0.0, "0"),
        (10, "10"),
    ],
)
def test_number_formatting_thresholds(value: float, text: str) -> None:
    assert canonical_json(value) == text.encode("ascii")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused(value: float) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the library's own error type
        canonical_json({"x": value})


def test_no_whitespace_and_string_escapes() -> None:
    value = {"b": [1, 2, {"c": None}], "a": '\x00\x1f\x7f\b\t\n\f\r"\\/é€😀'}
    out = canonical_json(value)
    assert out == (
        b'{"a":"\\u0000\\u001f\x7f\\b\\t\\n\\f\\r\\"\\\\/'
        + "é€😀".encode()
        + b'","b":[1,2,{"c":null}]}'
    )
    assert b" " not in out and b"\n" not in out


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=6),
        st.one_of(
            st.none(), st.booleans(), st.integers(-(2**53) + 1, 2**53 - 1), st.text(max_size=8)
        ),
        max_size=8,
    )
)
def test_keys_sorted_by_utf16_and_output_is_a_fixed_point(value: dict[str, object]) -> None:
    out = canonical_json(value)
    parsed = json.loads(out)
    assert parsed == value
    assert list(parsed) == sorted(value, key=lambda k: k.encode("utf-16-be"))
    assert canonical_json(parsed) == out


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(JSON_VALUES)
def test_canonical_json_is_exactly_the_rfc8785_library(value: object) -> None:
    """Whatever shortcut ``canonical_json`` takes, its bytes are the maintained library's."""
    assert canonical_json(value) == rfc8785.dumps(value)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=6),
        st.text(alphabet=st.characters(max_codepoint=0x9F), max_size=8) | st.integers(-9, 9),
        max_size=8,
    )
)
def test_control_characters_and_ascii_keys_match_rfc8785(value: dict[str, object]) -> None:
    """ASCII keys with C0/C1 controls, DEL, quotes and backslashes in the values."""
    assert canonical_json(value) == rfc8785.dumps(value)


def test_canonical_json_and_uuidv7_come_from_maintained_libraries() -> None:
    requires = " ".join(importlib.metadata.requires("affidavit") or [])
    assert re.search(r"\brfc8785\b", requires)
    assert re.search(r"\buuid6\b", requires)
    tree = ast.parse(DIGEST_MODULE.read_text("utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "rfc8785" in imported


# -- nobody else writes a domain byte ----------------------------------------------------------


def _record_sources() -> dict[str, str]:
    sources = {p.name: p.read_text("utf-8") for p in sorted(RECORD_DIR.rglob("*.py"))}
    assert "digest.py" in sources and "log.py" in sources
    return sources


def test_only_digest_module_prefixes_sha256_with_a_domain_byte() -> None:
    pattern = re.compile(r"sha256\(\s*bytes\(\s*[(\[]")
    hits = {name for name, text in _record_sources().items() if pattern.search(text)}
    assert hits == {"digest.py"}


def test_no_module_constructs_a_domain_or_passes_a_literal_domain() -> None:
    problems = []
    for name, text in _record_sources().items():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if called == "Domain" and name != "digest.py":
                problems.append(f"{name}:{node.lineno}: Domain(...) built outside digest.py")
            if called in {"digest", "digest_hex"} and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant):
                    problems.append(f"{name}:{node.lineno}: {called}() with literal domain")
            if called == "sha256" and node.args and name not in {"digest.py", "merkle.py"}:
                first = node.args[0]
                literal = first.left if isinstance(first, ast.BinOp) else first
                if isinstance(literal, ast.Constant) and isinstance(literal.value, bytes):
                    value = literal.value
                    if value[:1] and value[0] in {int(d) for d in Domain}:
                        problems.append(f"{name}:{node.lineno}: sha256 of a literal domain byte")
    assert problems == []


def test_a_chat_or_messages_prompt_keeps_its_digest_and_a_responses_prompt_is_covered() -> None:
    from record.digest import prompt_bytes, prompt_digest

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 1,
            "tools": [], "input": "stray", "instructions": "stray", "text": {}}  # fmt: skip
    # the definition before Responses, written out: these members, nothing else
    old = canonical_json({k: chat[k] for k in ("model", "messages", "tools")})
    assert prompt_bytes(chat) == old
    assert prompt_digest(chat) == digest(Domain.PROMPT, old)
    messages = {"model": "c", "system": "be brief", "messages": [], "max_tokens": 9}
    assert prompt_bytes(messages) == canonical_json(
        {"model": "c", "system": "be brief", "messages": []}
    )
    responses = {
        "model": "m", "instructions": "be brief", "input": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "name": "f"}], "tool_choice": "auto",
        "text": {"format": {"type": "json_object"}}, "seed": 1, "max_output_tokens": 9,
        "temperature": 0.5, "stream": True,
    }  # fmt: skip
    prompt = json.loads(prompt_bytes(responses))
    assert sorted(prompt) == ["input", "instructions", "model", "text", "tool_choice", "tools"]
    # every prompt member changes the digest; sampling members do not
    for member in prompt:
        assert prompt_digest({**responses, member: "changed"}) != prompt_digest(responses)
    for member in ("seed", "max_output_tokens", "temperature", "stream"):
        assert prompt_digest({**responses, member: 2}) == prompt_digest(responses)
