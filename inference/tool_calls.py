"""The OpenAI tool-calling protocol around the engine: tools in, calls out.

- :func:`validate_tools` checks a ``tools`` list: the OpenAI shape, and each function's
  parameters as valid JSON Schema describing an object (:func:`parameters_schema`; any
  draft-2020-12 schema, prepared for the grammar by :mod:`inference.schema`);
- :func:`parse_tool_calls` reads ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``
  blocks (the chat template's layout) out of free text, for ``tool_choice`` ``"auto"``;
- :func:`openai_tool_calls` gives calls OpenAI's shape, with derived ids.

A tool-call id is quoted back by the next request (the ``tool`` message's
``tool_call_id``), so a random id would make that request's prompt, and everything after
it, impossible to replay. The id of the ``ordinal``-th call of a reply is instead
``record.digest.tool_call_id(prompt_digest, seed, ordinal)``: the same prompt and seed give
the same ids, and calls in one reply, or replies under other seeds, get different ones.

This module needs neither torch nor llguidance: the proxy side can check tools and rebuild
ids and shapes.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from inference.schema import check_schema
from record.digest import tool_call_id

__all__ = [
    "CLOSE_TAG",
    "OPEN_TAG",
    "chosen_names",
    "derived_tool_call_ids",
    "openai_tool_call_deltas",
    "openai_tool_calls",
    "parameters_schema",
    "parse_call",
    "parse_tool_calls",
    "validate_tools",
]

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_ANNOTATIONS_ONLY = frozenset({"title", "description", "$schema", "$comment"})
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOOL_KEYS = frozenset({"type", "function"})
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def validate_tools(tools: Any) -> list[dict[str, Any]]:
    """Check an OpenAI ``tools`` list; a deep copy of it, or ``ValueError`` naming the problem."""
    if not isinstance(tools, list) or not tools:
        raise ValueError("tools must be a non-empty list")
    seen: set[str] = set()
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise ValueError(f"{where} must be an object")
        if tool.get("type") != "function":
            raise ValueError(f"{where}.type must be 'function'")
        if set(tool) - _TOOL_KEYS:
            raise ValueError(f"{where} has unsupported members {sorted(set(tool) - _TOOL_KEYS)}")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise ValueError(f"{where}.function must be an object")
        if set(function) - _FUNCTION_KEYS:
            extra = sorted(set(function) - _FUNCTION_KEYS)
            raise ValueError(f"{where}.function has unsupported members {extra}")
        name = function.get("name")
        if name is None:
            raise ValueError(f"{where}.function.name is missing")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{where}.function.name must be 1-64 of a-z, A-Z, 0-9, _ and -")
        if name in seen:
            raise ValueError(f"{where}.function.name '{name}' is declared twice")
        seen.add(name)
        if not isinstance(function.get("description", ""), str):
            raise ValueError(f"{where}.function.description must be a string")
        if not isinstance(function.get("strict", False), bool):
            raise ValueError(f"{where}.function.strict must be a boolean")
        parameters_schema(function, f"{where}.function.parameters")
        out.append({"type": "function", "function": copy.deepcopy(dict(function))})
    return out


def parameters_schema(function: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """A function's parameters: any valid JSON Schema that describes an object (missing: no
    arguments; annotations only: any object). ``ValueError`` naming ``path`` otherwise."""
    schema = function.get("parameters", _NO_PARAMETERS)
    if isinstance(schema, Mapping) and not set(schema) - _ANNOTATIONS_ONLY:
        return {**schema, "type": "object"}
    check_schema(schema, path)
    if not isinstance(schema, Mapping):
        raise ValueError(f'{path} must be an object schema ("type": "object")')
    kind = schema.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise ValueError(f'{path} must describe an object ("type": "object"), not {kind!r}')
    if kind != "object":
        return {**schema, "type": "object"}
    return schema


def chosen_names(tools: list[dict[str, Any]], choice: str | Mapping[str, Any]) -> list[str]:
    """The tools a ``tool_choice`` lets the grammar call (``"required"``: all of them)."""
    names = [tool["function"]["name"] for tool in tools]
    if choice == "required":
        return names
    if isinstance(choice, Mapping):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise ValueError('tool_choice must be {"type": "function", "function": {"name": …}}')
        if name not in names:
            raise ValueError(f"tool_choice names '{name}', which is not among the tools")
        return [name]
    raise ValueError(f"tool_choice {choice!r} does not constrain decoding (use parse_tool_calls)")


def derived_tool_call_ids(prompt_digest: str, seed: int | None, count: int) -> list[str]:
    """Ids for the ``count`` calls of one reply, in order (ordinals ``0..count-1``)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, not {count}")
    return [tool_call_id(prompt_digest, seed, ordinal) for ordinal in range(count)]


def openai_tool_calls(calls: list[tuple[str, str]], ids: list[str]) -> list[dict[str, Any]]:
    """``message.tool_calls`` of a chat completion: one entry per ``(name, arguments)``.

    ``arguments`` stays the JSON text the model wrote (OpenAI sends a string, not an
    object), so the record keeps exactly what was generated.
    """
    _check(calls, ids)
    return [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        for (name, arguments), call_id in zip(calls, ids, strict=True)
    ]


def openai_tool_call_deltas(calls: list[tuple[str, str]], ids: list[str]) -> list[dict[str, Any]]:
    """``delta.tool_calls`` for a stream: as :func:`openai_tool_calls`, each with its ``index``.

    Each call travels whole in one delta (the grammar knows a call only once it is
    complete); clients that concatenate ``arguments`` fragments read the same text.
    """
    return [
        {"index": ordinal, **call} for ordinal, call in enumerate(openai_tool_calls(calls, ids))
    ]


def _check(calls: list[tuple[str, str]], ids: list[str]) -> None:
    if len(calls) != len(ids):
        raise ValueError(f"{len(calls)} tool calls but {len(ids)} ids")
    if len(set(ids)) != len(ids):
        raise ValueError("tool-call ids must be distinct")
    for name, arguments in calls:
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise ValueError("each tool call is a (name, arguments JSON text) pair of strings")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder(parse_constant=_no_constant)  # NaN and Infinity are not JSON


def parse_tool_calls(text: str) -> tuple[str, list[tuple[str, str]]]:
    """Split free generation (``tool_choice`` ``"auto"``) into content and tool calls.

    Each ``<tool_call>…</tool_call>`` block holding ``{"name": <string>, "arguments":
    <object>}`` (with any JSON whitespace; ``arguments`` may also be a string holding a JSON
    object) becomes ``(name, arguments_json)`` with the arguments exactly as written. Malformed or
    unclosed blocks stay in the content. Without any call the text comes back unchanged;
    otherwise the content is what is left, stripped of surrounding whitespace.
    """
    calls: list[tuple[str, str]] = []
    content: list[str] = []
    pos = 0
    while (start := text.find(OPEN_TAG, pos)) >= 0:
        end = text.find(CLOSE_TAG, start + len(OPEN_TAG))
        if end < 0:
            break
        start = text.rfind(OPEN_TAG, start, end)  # the innermost opening tag
        call = parse_call(text[start + len(OPEN_TAG) : end])
        after = end + len(CLOSE_TAG)
        if call is None:
            content.append(text[pos:after])
        else:
            content.append(text[pos:start])
            calls.append(call)
        pos = after
    if not calls:
        return text, []
    content.append(text[pos:])
    return "".join(content).strip(), calls


def parse_call(body: str) -> tuple[str, str] | None:
    """``(name, arguments text)`` of one block's JSON, or ``None`` if it is not a call."""
    s = body.strip(" \t\n\r")
    try:
        value, end = _DECODER.raw_decode(s)
    except ValueError:
        return None
    if end != len(s) or not isinstance(value, dict) or set(value) != {"name", "arguments"}:
        return None
    name, arguments = value["name"], value["arguments"]
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):
        try:
            parsed = _DECODER.decode(arguments)
        except ValueError:
            return None
        return (name, arguments) if isinstance(parsed, dict) else None
    if not isinstance(arguments, dict):
        return None
    return name, _raw_members(s)["arguments"]


def _raw_members(s: str) -> dict[str, str]:
    """The raw text of each member value of a JSON object already known to be valid."""
    raw: dict[str, str] = {}
    i = _skip(s, 1)
    while s[i] != "}":
        key, i = _DECODER.raw_decode(s, i)
        i = _skip(s, _skip(s, i) + 1)  # past ':'
        _, after = _DECODER.raw_decode(s, i)
        raw[key] = s[i:after]
        i = _skip(s, after)
        if s[i] == ",":
            i = _skip(s, i + 1)
    return raw


def _skip(s: str, i: int) -> int:
    match = _WS.match(s, i)
    return match.end() if match else i
