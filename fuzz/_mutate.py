"""A JSON-aware mutation for the JSON-carrying targets: libFuzzer's byte mutations rarely
keep JSON valid, and the bugs that matter here are in values of the wrong type or shape
(a list where a string was, a number past a limit, an object nested too deep).

``mutate_json`` finds the JSON in an input (the whole input after ``prefix`` bytes, or one
``data:`` line of an SSE stream), replaces, removes or duplicates one of its values, and
writes it back; None when the input holds no JSON to mutate.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

_KEYS = ("type", "role", "content", "id", "name", "arguments", "input", "tools", "text",
         "messages", "model", "stream", "seed", "reproducibility", "system_fingerprint",
         "choices", "delta", "tool_calls", "function", "params", "method", "_meta", "body",
         "kind", "recipients", "call_id", "output", "item", "format", "schema")  # fmt: skip


def _scalar(rng: random.Random) -> Any:
    return rng.choice([
        None, True, False, 0, -1, 1, 2**53 + 1, -(2**63) - 1, 10**400, 0.5, -0.0, 1e308,
        "", "x", "\u0000", "\ud800", "call_1", "message", "function", "user", "tool_use",
        "2026-01-01T00:00:00Z", "[DONE]", "a" * 300,
    ])  # fmt: skip


def _value(rng: random.Random, like: Any, pool: list[Any]) -> Any:
    roll = rng.randrange(10)
    if roll == 0:
        value: Any = _scalar(rng)
        for _ in range(rng.choice((2, 64, 127, 129, 200, 260, 600))):
            value = [value] if rng.randrange(2) else {"k": value}
        return value
    if roll == 1:
        return [copy.deepcopy(like)]
    if roll == 2:
        return {rng.choice(_KEYS): copy.deepcopy(like)}
    if roll == 3 and pool:
        return rng.choice(pool)
    if roll == 4:
        return [] if rng.randrange(2) else {}
    return _scalar(rng)


def _nodes(root: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in ``root``, iteratively."""
    found: list[tuple[Any, Any]] = []
    todo = [root]
    while todo and len(found) < 10_000:
        node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in list(items):
            found.append((node, key))
            if isinstance(child, dict | list):
                todo.append(child)
    return found


def _mutate_value(root: Any, rng: random.Random) -> Any:
    nodes = _nodes(root) if isinstance(root, dict | list) else []
    if not nodes:
        return _value(rng, root, [])
    container, key = rng.choice(nodes)
    pool = [copy.deepcopy(c[k]) for c, k in rng.sample(nodes, min(8, len(nodes)))]
    roll = rng.randrange(6)
    if roll == 0 and isinstance(container, dict):
        del container[key]
    elif roll == 1 and isinstance(container, dict):
        container[rng.choice(_KEYS)] = copy.deepcopy(container[key])
    elif roll == 2 and isinstance(container, list):
        container.append(copy.deepcopy(container[key]))
    else:
        container[key] = _value(rng, container[key], pool)
    return root


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace")


def mutate_json(data: bytes, seed: int, prefix: int = 0) -> bytes | None:
    """``data`` with one JSON value changed, or None when it holds no JSON (see module)."""
    rng = random.Random(seed)
    head, body = data[:prefix], data[prefix:]
    try:
        return head + _dump(_mutate_value(json.loads(body), rng))
    except (ValueError, RecursionError):
        pass
    lines = body.split(b"\n")
    spots = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
    rng.shuffle(spots)
    for i in spots[:4]:
        try:
            value = json.loads(lines[i][5:])
        except (ValueError, RecursionError):
            continue
        lines[i] = b"data: " + _dump(_mutate_value(value, rng))
        return head + b"\n".join(lines)
    return None
