"""The record's entry parser (``record.schema``): a stored line (``parse_entry`` and its
fast path ``parse_head``, which must agree) and an opened body (``parse_body``; the first
byte picks the kind).

Typed error: ``SchemaError``.
"""

from __future__ import annotations

import contextlib

from fuzz._record import sample
from fuzz.common import InvariantBroken, dumps, nested
from record.errors import SchemaError
from record.schema import BODY_MODELS, parse_body, parse_entry, parse_head

ERRORS: tuple[type[BaseException], ...] = (SchemaError,)
JSON_PREFIX = 0  # the input's JSON starts here: the JSON-aware mutations apply
_KINDS = tuple(sorted(BODY_MODELS))


def seeds() -> list[bytes]:
    lines = list(sample().lines)
    digest = "sha256:" + "0" * 64
    bodies = [
        bytes([_KINDS.index("turn.started")])
        + dumps({"kind": "turn.started", "turn": 0, "input_bytes": "aGk=", "input_digest": digest}),
        bytes([_KINDS.index("model.response")])
        + dumps(
            {
                "kind": "model.response",
                "request_seq": 0,
                "outcome": "COMMITTED",
                "reproducibility": {"deep": nested(150)},
            }
        ),
    ]
    return lines + bodies


def target(data: bytes) -> None:
    try:
        entry = parse_entry(data)
    except SchemaError:
        entry = None
    try:
        head = parse_head(data)
    except SchemaError:
        head = None
    if (entry is None) != (head is None):
        raise InvariantBroken("parse_entry and parse_head disagree on whether the line is valid")
    if entry is not None and head is not None:
        if dict(entry.envelope()) != {k: getattr(head, k) for k in dict(entry.envelope())}:
            raise InvariantBroken("parse_entry and parse_head read different envelopes")
        if isinstance(entry.body, dict):
            with contextlib.suppress(SchemaError):
                parse_body(entry.kind, entry.body)
    if data:
        with contextlib.suppress(SchemaError):
            parse_body(_KINDS[data[0] % len(_KINDS)], data[1:])
