"""The record's checkpoint notes (``record.checkpoint``): ``parse_note``,
``parse_checkpoint`` and ``open_checkpoint`` against the log's key and the C2SP examples'.

Typed error: ``CheckpointError`` (``MalformedNote``, ``SignatureInvalid``, ``InvalidKey``).
"""

from __future__ import annotations

import contextlib
import functools
import json

from fuzz._record import sample
from fuzz.common import VECTORS
from record.checkpoint import (
    CheckpointError,
    Verifier,
    open_checkpoint,
    parse_checkpoint,
    parse_note,
)

ERRORS: tuple[type[BaseException], ...] = (CheckpointError,)


def _examples() -> list[dict[str, object]]:
    path = VECTORS / "signed-note" / "examples.json"
    if not path.is_file():
        return []
    examples: list[dict[str, object]] = json.loads(path.read_text("utf-8"))["examples"]
    return examples


@functools.cache
def _verifiers() -> tuple[Verifier, ...]:
    keys = {sample().log_key}
    keys |= {str(e["vkey"]) for e in _examples() if isinstance(e.get("vkey"), str)}
    found: dict[tuple[str, bytes], Verifier] = {}
    for vkey in sorted(keys):
        verifier = Verifier.from_vkey(vkey)
        found.setdefault((verifier.name, verifier.key_id), verifier)
    return tuple(found.values())


def seeds() -> list[bytes]:
    notes = [str(e["note_text"]).encode() for e in _examples() if "note_text" in e]
    return [*sample().notes, *notes]


def target(data: bytes) -> None:
    try:
        note = parse_note(data)
        parse_checkpoint(note.text)
    except CheckpointError:
        pass
    with contextlib.suppress(CheckpointError):
        open_checkpoint(data, _verifiers(), now=2**40)
