"""The limits on JSON that enters from outside: one set, well inside what every reader accepts.

What is accepted is recorded, and what is recorded must be read back by every reader of the
record: recovery at start, the audit, ``log show``, the panel, reconstruct. Those readers
stop long before Python does: pydantic-core's JSON parser refuses nesting past about 200,
and ``int()`` refuses more than 4,300 digits (CPython's conversion limit). So every parser
of outside JSON in the appliance (client requests at the proxy and the engine, the facts
the proxy reads out of upstream replies) parses through :func:`load_json`:

- nesting of arrays and objects: at most :data:`MAX_DEPTH` (128; an entry adds 3 levels);
- a number's text: at most :data:`MAX_NUMBER_CHARS` characters (real ones have under 30);
- a request's messages (``messages`` or ``input`` items): at most :data:`MAX_MESSAGES`;
- a request's tools: at most :data:`MAX_TOOLS`.

Body size is the proxy's ``max_body_bytes`` (requests) and ``max_reply_bytes`` (replies).

A client request past a limit is refused (400) and recorded as a refusal. An upstream reply
past one is still recorded byte for byte; only the facts read out of it are left empty.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "MAX_MESSAGES",
    "MAX_NUMBER_CHARS",
    "MAX_TOOLS",
    "JsonRefused",
    "OverLimit",
    "check_counts",
    "load_json",
    "nesting_depth",
]

MAX_DEPTH = 128
MAX_NUMBER_CHARS = 100
MAX_MESSAGES = 10_000
MAX_TOOLS = 1_024


class JsonRefused(ValueError):
    """Bytes that are not JSON this appliance reads; the message says what was wrong."""


class OverLimit(JsonRefused):
    """JSON past one of this module's limits; the message names the limit."""


def _number(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if len(text) > MAX_NUMBER_CHARS:
            raise OverLimit(f"a number is {len(text)} characters long (at most {MAX_NUMBER_CHARS})")
        return kind(text)

    return parse


_INT, _FLOAT = _number(int), _number(float)


def _refuse_constant(name: str) -> Any:
    raise JsonRefused(f"{name} is not JSON")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise JsonRefused(f"the member {key!r} appears twice in one object")
        result[key] = value
    return result


def load_json(raw: bytes | str, *, unique_keys: bool = False) -> Any:
    """``raw`` parsed as JSON within the limits, or :class:`JsonRefused` (:class:`OverLimit`
    past a limit) saying why not. NaN and Infinity are refused; with ``unique_keys``, so is
    a member named twice in one object (I-JSON, RFC 7493)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
    except UnicodeDecodeError as exc:
        raise JsonRefused(f"not UTF-8: {exc}") from None
    try:
        value = json.loads(
            text,
            parse_int=_INT,
            parse_float=_FLOAT,
            parse_constant=_refuse_constant,
            object_pairs_hook=_unique if unique_keys else None,
        )
    except RecursionError:
        raise OverLimit(f"arrays and objects nest more than {MAX_DEPTH} deep") from None
    except JsonRefused:
        raise
    except ValueError as exc:  # JSONDecodeError, and whatever a hook's conversion raised
        raise JsonRefused(f"not JSON: {exc}") from None
    # Nesting is counted only when there are enough brackets for it to matter.
    if text.count("[") + text.count("{") > MAX_DEPTH:
        depth = nesting_depth(value)
        if depth > MAX_DEPTH:
            raise OverLimit(f"arrays and objects nest more than {MAX_DEPTH} deep ({depth} levels)")
    return value


def nesting_depth(value: Any) -> int:
    """How deep arrays and objects nest in a parsed JSON value (a scalar is 0); iterative,
    so a value nested past the interpreter's recursion limit is measured too."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        todo.extend((child, depth + 1) for child in children)
    return deepest


def check_counts(request: Mapping[str, Any]) -> None:
    """:class:`OverLimit` when a request carries more messages or tools than the limits."""
    for member in ("messages", "input"):
        items = request.get(member)
        if isinstance(items, list) and len(items) > MAX_MESSAGES:
            raise OverLimit(f"{member!r} has {len(items)} items (at most {MAX_MESSAGES})")
    tools = request.get("tools")
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        raise OverLimit(f"'tools' has {len(tools)} items (at most {MAX_TOOLS})")
