"""The OpenAI tool-calling protocol around the engine: tools in, calls out.

- :func:`validate_tools` checks a ``tools`` list, and :func:`compile_schema` turns each
  function's parameters into the nodes of :mod:`inference.json_acceptor` (the grammar of
  :mod:`inference.constrained` is built from them);
- :func:`parse_tool_calls` reads ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``
  blocks (the chat template's layout) out of free text, for ``tool_choice`` ``"auto"``;
- :func:`openai_tool_calls` gives calls OpenAI's shape, with derived ids.

The JSON Schema subset (anything else is a ``ValueError`` naming its path): ``type`` (a
name or a list), ``enum``, ``const``, ``properties``, ``required``,
``additionalProperties``, ``items``, ``minItems``, ``maxItems``, ``minLength``,
``maxLength``, and the annotations in :data:`ANNOTATIONS`. Policies that keep the
grammar deterministic: properties come in the order of ``properties``, every required one
is emitted and an optional one may be skipped; undeclared properties are never emitted (so
the result is valid whatever ``additionalProperties`` says), except that an object
declaring no properties is a free-form map unless ``additionalProperties`` is false. Keys
and ``enum``/``const`` values are spelled as ``json.dumps(..., ensure_ascii=True)`` does,
so they need only ASCII tokens. ``maxLength`` counts an escape as the one character it
stands for, as the decoded string does.

A tool-call id is quoted back by the next request (the ``tool`` message's
``tool_call_id``), so a random id would make that request's prompt, and everything after
it, impossible to replay. The id of the ``ordinal``-th call of a reply is instead
``record.digest.tool_call_id(prompt_digest, seed, ordinal)``: the same prompt and seed give
the same ids, and calls in one reply, or replies under other seeds, get different ones.

This module needs no torch: the proxy side can check tools and rebuild ids and shapes.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from inference.json_acceptor import (
    Arr,
    Enum,
    MapObj,
    Node,
    Num,
    Obj,
    Str,
    Syntax,
    Union,
    first_chars,
)
from record.digest import tool_call_id

__all__ = [
    "ANNOTATIONS",
    "CLOSE_TAG",
    "OPEN_TAG",
    "chosen_names",
    "compile_schema",
    "derived_tool_call_ids",
    "openai_tool_call_deltas",
    "openai_tool_calls",
    "parameters_node",
    "parse_tool_calls",
    "validate_tools",
]

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly"}
    | {"writeOnly", "$schema"}
)
_TYPE_KEYWORDS: dict[str, frozenset[str]] = {
    "string": frozenset({"minLength", "maxLength"}),
    "integer": frozenset(),
    "number": frozenset(),
    "boolean": frozenset(),
    "null": frozenset(),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
}
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
        parameters_node(function, Syntax(), f"{where}.function.parameters")
        out.append({"type": "function", "function": copy.deepcopy(dict(function))})
    return out


def parameters_node(function: Mapping[str, Any], syntax: Syntax, path: str) -> Node:
    """The arguments node: an object schema (missing: no arguments; ``{}``: any object)."""
    schema = function.get("parameters", _NO_PARAMETERS)
    if isinstance(schema, Mapping) and not set(schema) - {"title", "description", "$schema"}:
        schema = {"type": "object"}
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise ValueError(f'{path} must be an object schema ("type": "object")')
    node = compile_schema(schema, syntax, path)
    if not isinstance(node, Obj | MapObj):
        raise ValueError(f"{path} must be an object schema, not an enum or const")
    return node


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


def compile_schema(schema: Any, syntax: Syntax, path: str = "schema") -> Node:
    """The node of a schema; ``ValueError`` naming the path and what is unsupported."""
    if schema is True:
        return syntax.any
    if schema is False:
        raise ValueError(f"{path}: the schema false accepts nothing")
    if not isinstance(schema, Mapping):
        raise ValueError(f"{path}: a schema must be a JSON object, not {_kind(schema)}")
    keywords = set(schema) - ANNOTATIONS
    types = _types(schema.get("type"), path) if "type" in schema else None
    if "enum" in schema or "const" in schema:
        return _enum(schema, keywords, types, syntax, path)
    if types is None:
        if keywords:
            raise ValueError(f"{path}: 'type' is required alongside {sorted(keywords)}")
        return syntax.any
    allowed = frozenset({"type"}).union(*(_TYPE_KEYWORDS[t] for t in types))
    for keyword in sorted(keywords - allowed):
        others = [t for t, kws in _TYPE_KEYWORDS.items() if keyword in kws]
        if others:
            raise ValueError(f"{path}: '{keyword}' does not apply to type {'/'.join(types)}")
        raise ValueError(f"{path}: unsupported schema keyword '{keyword}'")
    if "integer" in types and "number" in types:
        types = [t for t in types if t != "integer"]  # every integer is a number
    nodes = [_typed(t, schema, syntax, path) for t in types]
    if len(nodes) == 1:
        return nodes[0]
    dispatch: dict[str, Node] = {}
    for node in nodes:
        dispatch.update(dict.fromkeys(first_chars(node), node))
    return Union(dispatch)


def _typed(kind: str, schema: Mapping[str, Any], syntax: Syntax, path: str) -> Node:
    if kind == "string":
        low = _count(schema, "minLength", path) or 0
        high = _count(schema, "maxLength", path)
        if high is not None and high < low:
            raise ValueError(f"{path}: maxLength {high} is below minLength {low}")
        return Str(low, high)
    if kind in ("integer", "number"):
        return Num(integer=kind == "integer")
    if kind == "boolean":
        return Enum(("true", "false"))
    if kind == "null":
        return Enum(("null",))
    if kind == "array":
        items = schema.get("items", True)
        if isinstance(items, list):
            raise ValueError(f"{path}.items: a list of schemas (tuple form) is not supported")
        low = _count(schema, "minItems", path) or 0
        high = _count(schema, "maxItems", path)
        if high is not None and high < low:
            raise ValueError(f"{path}: maxItems {high} is below minItems {low}")
        return Arr(compile_schema(items, syntax, f"{path}.items"), low, high, syntax)
    return _object(schema, syntax, path)


def _object(schema: Mapping[str, Any], syntax: Syntax, path: str) -> Node:
    props = schema.get("properties", {})
    if not isinstance(props, Mapping) or not all(isinstance(k, str) for k in props):
        raise ValueError(f"{path}.properties must be an object of schemas")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"{path}.required must be a list of property names")
    if len(set(required)) != len(required):
        raise ValueError(f"{path}.required lists a property twice")
    for name in required:
        if name not in props:
            raise ValueError(f"{path}.required names '{name}', which is not in properties")
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, bool | Mapping):
        raise ValueError(f"{path}.additionalProperties must be a boolean or a schema")
    extra_node = (
        compile_schema(extra, syntax, f"{path}.additionalProperties")
        if isinstance(extra, Mapping)
        else syntax.any
    )
    if not props and extra is not False:
        return MapObj(extra_node, syntax)
    entries = [
        (
            json.dumps(name, ensure_ascii=True),
            compile_schema(sub, syntax, f"{path}.properties.{name}"),
            name in required,
        )
        for name, sub in props.items()
    ]
    return Obj(entries, syntax)


def _enum(
    schema: Mapping[str, Any],
    keywords: set[str],
    types: list[str] | None,
    syntax: Syntax,
    path: str,
) -> Node:
    if "enum" in schema and "const" in schema:
        raise ValueError(f"{path}: use 'enum' or 'const', not both")
    extra = keywords - {"enum", "const", "type"}
    if extra:
        raise ValueError(f"{path}: {sorted(extra)} alongside enum/const is not supported")
    values = schema["enum"] if "enum" in schema else [schema["const"]]
    if not isinstance(values, list) or not values:
        raise ValueError(f"{path}.enum must be a non-empty list")
    item, key = syntax.item.text, syntax.key.text
    texts = []
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**53:
            raise ValueError(f"{path}: enum value {value} is outside I-JSON's exact integers")
        if types is not None and not any(_is_type(value, t) for t in types):
            raise ValueError(f"{path}: enum value {value!r} is not of type {'/'.join(types)}")
        try:
            texts.append(
                json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(item, key))
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: enum value {value!r} is not JSON: {exc}") from None
    return Enum(tuple(texts))


def _types(value: Any, path: str) -> list[str]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}.type must be a type name or a non-empty list of them")
    for name in names:
        if name not in _TYPE_KEYWORDS:
            raise ValueError(f"{path}.type: unknown type '{name}'")
    return list(dict.fromkeys(names))


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and math.isfinite(value) and value.is_integer()
        )
    checks: dict[str, Any] = {
        "string": str,
        "number": int | float,
        "boolean": bool,
        "null": type(None),
        "array": list,
        "object": dict,
    }
    if kind == "number" and isinstance(value, bool):
        return False
    return isinstance(value, checks[kind])


def _count(schema: Mapping[str, Any], keyword: str, path: str) -> int | None:
    value = schema.get(keyword)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{path}.{keyword} must be a non-negative integer")
    return value


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


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
        call = _parse_call(text[start + len(OPEN_TAG) : end])
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


def _parse_call(body: str) -> tuple[str, str] | None:
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
