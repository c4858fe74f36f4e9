"""JSON Schema as clients write it, made ready for the grammar engine.

Tools and ``response_format`` arrive with the schemas pydantic, MCP servers and hand-written
clients emit: ``$defs``/``$ref``, ``anyOf`` with ``null``, ``oneOf``, ``const``, numeric
bounds, ``pattern``. :func:`check_schema` accepts any valid JSON Schema (draft 2020-12
unless ``$schema`` names another) and refuses only an invalid one, naming where it is
wrong. :func:`grammar_schema` returns the copy llguidance compiles (the request itself is
never changed, so the record keeps what the client sent), with two narrowings that keep
every output valid against the original:

- an object that declares ``properties`` and says nothing of ``additionalProperties`` gets
  ``additionalProperties: false``: a model may leave out an optional property but never
  invents one (outside ``allOf``, whose members see each other's properties);
- an ``integer`` without bounds is kept within I-JSON's exact integers (``±(2**53 - 1)``),
  so the record's canonical JSON can hold every argument.

A ``pattern`` the grammar engine cannot compile (look-around, back-references) is dropped
from the copy. Keywords the grammar does not enforce are :data:`UNCONSTRAINED_KEYWORDS`
(``inference/README.md`` lists them); a value generated under a schema is valid against that
schema less those keywords.

This module needs neither torch nor llguidance: it only rewrites dictionaries.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

from jsonschema import exceptions as schema_errors
from jsonschema import validators

__all__ = [
    "GRAMMAR_OPTIONS",
    "UNCONSTRAINED_FORMATS",
    "UNCONSTRAINED_KEYWORDS",
    "check_schema",
    "grammar_schema",
    "without_unconstrained",
]

#: Keywords llguidance reads but does not enforce (it reports them as unimplemented).
UNCONSTRAINED_KEYWORDS = frozenset(
    {
        "uniqueItems",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "propertyNames",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
#: ``format`` values the grammar does not enforce (others it knows, such as ``date-time``,
#: ``uri``, ``email``, ``uuid`` and ``ipv4``, it does).
UNCONSTRAINED_FORMATS = frozenset({"regex"})
#: llguidance's JSON options: the separators of ``json.dumps`` (and of the chat template's
#: ``tojson``), no other whitespace, and the escapes ``json.dumps`` writes, so a call
#: re-rendered into the next prompt reads as the model wrote it.
GRAMMAR_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "json_allowed_escapes": '"\\bfnrtu',
    "lenient": True,
}
_EXACT_INT = 2**53 - 1
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_UNSUPPORTED_REGEX = re.compile(r"\(\?[=!<]|\\[1-9]|\\k<")


def check_schema(schema: Any, path: str) -> None:
    """``ValueError`` naming ``path`` and the fault unless ``schema`` is valid JSON Schema."""
    if not isinstance(schema, Mapping | bool):
        raise ValueError(f"{path}: a schema is a JSON object or a boolean, not {_kind(schema)}")
    validator = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        validator.check_schema(schema)  # type: ignore[arg-type]  # booleans are schemas too
    except schema_errors.SchemaError as exc:
        where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise ValueError(f"{path}{where}: not valid JSON Schema: {exc.message}") from None
    _check_refs(schema, schema, path)


def grammar_schema(schema: Mapping[str, Any] | bool) -> dict[str, Any]:
    """The copy the grammar compiles: narrowed as the module docstring says, with options."""
    if schema is True or schema == {}:
        prepared: dict[str, Any] = {}
    elif schema is False:
        raise ValueError("the schema false accepts nothing")
    else:
        prepared = _narrow(copy.deepcopy(dict(schema)), in_all_of=False)
    prepared["x-guidance"] = dict(GRAMMAR_OPTIONS)
    return prepared


def without_unconstrained(schema: Any) -> Any:
    """``schema`` less :data:`UNCONSTRAINED_KEYWORDS` and unenforced formats (for tests and
    auditors: what a generated value is guaranteed to satisfy)."""
    if isinstance(schema, list):
        return [without_unconstrained(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for key, value in schema.items():
        if key in UNCONSTRAINED_KEYWORDS:
            continue
        if key == "format" and value in UNCONSTRAINED_FORMATS:
            continue
        if key == "pattern" and isinstance(value, str) and _UNSUPPORTED_REGEX.search(value):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties"):
            out[key] = {k: without_unconstrained(v) for k, v in value.items()}
        else:
            out[key] = without_unconstrained(value)
    return out


def _narrow(schema: dict[str, Any], *, in_all_of: bool) -> dict[str, Any]:
    def each(sub: Any, *, all_of: bool = False) -> Any:
        return _narrow(sub, in_all_of=all_of) if isinstance(sub, dict) else sub

    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            schema[key] = {name: each(sub) for name, sub in schema[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            schema[key] = [each(sub) for sub in schema[key]]
    if isinstance(schema.get("allOf"), list):
        schema["allOf"] = [each(sub, all_of=True) for sub in schema["allOf"]]
    for key in _SUBSCHEMAS:
        if key in schema:
            schema[key] = each(schema[key])
    if (
        not in_all_of
        and isinstance(schema.get("properties"), dict)
        and schema["properties"]
        and "additionalProperties" not in schema
        and "patternProperties" not in schema
        and "unevaluatedProperties" not in schema
        and "allOf" not in schema
    ):
        schema["additionalProperties"] = False
    types = schema.get("type")
    if (types == "integer" or (isinstance(types, list) and "integer" in types)) and not any(
        k in schema for k in ("enum", "const")
    ):
        low = _given(schema, "minimum", "exclusiveMinimum")
        high = _given(schema, "maximum", "exclusiveMaximum")
        if high is None or high >= -_EXACT_INT:  # never narrowed into nothing
            _bound(schema, "minimum", "exclusiveMinimum", -_EXACT_INT, max)
        if low is None or low <= _EXACT_INT:
            _bound(schema, "maximum", "exclusiveMaximum", _EXACT_INT, min)
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and _UNSUPPORTED_REGEX.search(pattern):
        del schema["pattern"]
    if schema.get("format") in UNCONSTRAINED_FORMATS:
        del schema["format"]
    return schema


def _bound(
    schema: dict[str, Any], key: str, exclusive: str, limit: int, pick: Callable[..., Any]
) -> None:
    if exclusive in schema:
        return
    value = schema.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        schema[key] = pick(value, limit)
    else:
        schema[key] = limit


def _given(schema: Mapping[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = schema.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
    return None


def _check_refs(node: Any, root: Any, path: str) -> None:
    """A local ``$ref`` must point at something: the grammar cannot compile a dangling one.
    Remote references are refused too: the engine fetches nothing."""
    if isinstance(node, list):
        for item in node:
            _check_refs(item, root, path)
        return
    if not isinstance(node, Mapping):
        return
    ref = node.get("$ref")
    if isinstance(ref, str):
        if not ref.startswith("#"):
            raise ValueError(f"{path}: $ref {ref!r} is not local (the engine fetches nothing)")
        target: Any = root
        for part in ref[1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, Mapping) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise ValueError(f"{path}: $ref {ref!r} points at nothing in the schema")
    for key, value in node.items():
        if key not in ("enum", "const", "default", "examples"):
            _check_refs(value, root, path)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
