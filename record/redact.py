"""Redaction is a projection at read time: it shapes what is shown, never what is stored.

Rules, comma-separated:

- ``FIELD``       hide that body field in every entry (``input_bytes``)
- ``KIND:FIELD``  only in entries of that kind (``model.response:response_bytes``)
- ``re:PATTERN``  hide every match of a regular expression inside shown text

A redacted view covers every copy of what it hides. Each bytes field is shown as its
digest (the record's own, with its domain) and, beside it under ``decoded``, as the value it
stands for (``record.decoded``: JSON parsed, an event stream reassembled into its reply, an
HTTP message split open), so a pattern meets the text a person would read, not pieces of it
or its ``\\u`` escapes. A value a field rule hides is hidden wherever else in the stream it
appears (the client's request inside the request sent upstream, the user's input inside each
prompt): every string in it of at least ``MIN_COPY`` characters becomes a literal to hide.

This module never touches a store and never changes an entry.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from record.decoded import Decoded, read
from record.digest import Domain, digest
from record.schema import Strict

__all__ = ["MIN_COPY", "REDACTED", "RedactedStream", "RedactionRules", "bytes_digest"]

REDACTED = "[REDACTED]"
MIN_COPY = 8  # shorter strings of a hidden value are not chased into other fields
_FIELD_RE = re.compile(r"^(?:(?P<kind>[a-z]+\.[a-z]+):)?(?P<field>[A-Za-z_][A-Za-z0-9_]*)$")

#: The digest domain of each bytes field, by entry kind (as ``record.reader`` checks them).
BYTES_DOMAINS: dict[tuple[str, str], Domain] = {
    ("model.request", "request_bytes"): Domain.REQUEST,
    ("model.request", "input_bytes"): Domain.INPUT,
    ("model.request", "prompt_bytes"): Domain.PROMPT,
    ("model.response", "response_bytes"): Domain.RESPONSE,
    ("model.response", "error_bytes"): Domain.ERROR,
    ("tool.call", "arguments"): Domain.TOOL_ARGUMENTS,
    ("tool.result", "result_bytes"): Domain.TOOL_RESULT,
    ("tool.result", "error_bytes"): Domain.ERROR,
    ("fetch.request", "request_bytes"): Domain.FETCH_REQUEST,
    ("fetch.response", "response_bytes"): Domain.FETCH_RESPONSE,
    ("fetch.response", "error_bytes"): Domain.ERROR,
    ("turn.started", "input_bytes"): Domain.INPUT,
    ("turn.ended", "answer_bytes"): Domain.RESPONSE,
}


def bytes_digest(kind: str, name: str, data: bytes) -> str:
    """The digest a redacted view shows for a bytes field: the record's own where it has one."""
    domain = BYTES_DOMAINS.get((kind, name))
    if domain is None:
        return "sha256:" + hashlib.sha256(data).hexdigest()
    return digest(domain, data)


@dataclass(frozen=True)
class RedactionRules:
    fields: frozenset[tuple[str | None, str]] = frozenset()
    patterns: tuple[re.Pattern[str], ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, text: str) -> RedactionRules:
        """Parse the ``--redact`` syntax; ``ValueError`` names the rule that is wrong."""
        fields: set[tuple[str | None, str]] = set()
        patterns: list[re.Pattern[str]] = []
        for raw in (part.strip() for part in text.split(",")):
            if not raw:
                continue
            if raw.startswith("re:"):
                try:
                    patterns.append(re.compile(raw[3:]))
                except re.error as exc:
                    raise ValueError(f"rule {raw!r}: bad regular expression ({exc})") from None
                continue
            match = _FIELD_RE.match(raw)
            if match is None:
                raise ValueError(f"rule {raw!r}: expected FIELD, KIND:FIELD or re:PATTERN")
            fields.add((match["kind"], match["field"]))
        return cls(frozenset(fields), tuple(patterns))

    def __bool__(self) -> bool:
        return bool(self.fields or self.patterns)

    def hides(self, kind: str, name: str) -> bool:
        return (None, name) in self.fields or (kind, name) in self.fields

    def stream(self, bodies: Iterable[tuple[str, Strict | dict[str, Any]]]) -> RedactedStream:
        """The redacted projection of one stream's bodies, ``(kind, body)`` in order."""
        return RedactedStream(self, list(bodies))


def _as_json(value: Any) -> Any:
    if isinstance(value, Strict):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    return value


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


class RedactedStream:
    """A stream's bodies as a redacted view shows them.

    Built from every body at once, because a value a field rule hides in one entry is hidden
    in every other entry that repeats it. ``bodies()`` gives the views, one per body.
    """

    def __init__(self, rules: RedactionRules, bodies: list[tuple[str, Strict | dict[str, Any]]]):
        self.rules = rules
        self._bodies = bodies
        self._decoded: list[dict[str, Decoded]] = []
        hidden: set[str] = set()
        for kind, body in bodies:
            decoded: dict[str, Decoded] = {}
            for name, value in _members(body):
                if isinstance(value, bytes):
                    decoded[name] = read(value)
                if rules.hides(kind, name):
                    shown = decoded[name].value if isinstance(value, bytes) else _as_json(value)
                    hidden.update(s for s in _strings(shown) if len(s) >= MIN_COPY)
            self._decoded.append(decoded)
        literals = sorted(hidden, key=len, reverse=True)
        chased = [re.compile("|".join(map(re.escape, literals)))] if literals else []
        self._patterns = (*chased, *rules.patterns)

    def scrub(self, value: Any) -> Any:
        """``value`` (decoded JSON) with every pattern's match and hidden copy replaced."""
        if not self._patterns:
            return value
        if isinstance(value, str):
            for pattern in self._patterns:
                value = pattern.sub(REDACTED, value)
            return value
        if isinstance(value, dict):
            return {self.scrub(k): self.scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub(v) for v in value]
        return value

    def view(self, index: int) -> dict[str, Any]:
        """Body ``index`` as JSON: bytes fields as their digests, their decoded values (or
        ``[REDACTED]``) under ``decoded``, every other field hidden or scrubbed."""
        kind, body = self._bodies[index]
        out: dict[str, Any] = {}
        decoded: dict[str, Any] = {}
        for name, value in _members(body):
            if isinstance(value, bytes):
                out[name] = bytes_digest(kind, name, value)
                decoded[name] = (
                    REDACTED
                    if self.rules.hides(kind, name)
                    else self.scrub(self._decoded[index][name].value)
                )
            elif self.rules.hides(kind, name):
                out[name] = REDACTED
            else:
                out[name] = self.scrub(_as_json(value))
        if decoded:
            out["decoded"] = decoded
        return out

    def views(self) -> list[dict[str, Any]]:
        return [self.view(i) for i in range(len(self._bodies))]

    def shown_bytes(self, index: int, name: str) -> bytes | None:
        """What a page shows for bytes field ``name`` of body ``index``: its decoded value,
        redacted, as UTF-8 (JSON for structures; a reassembled stream as its whole reply; an
        HTTP message as head, blank line, body), or a note naming its digest when it is not
        text. None when the field is None."""
        kind, body = self._bodies[index]
        value = dict(_members(body)).get(name)
        if value is None:
            return None
        assert isinstance(value, bytes)
        if self.rules.hides(kind, name):
            return REDACTED.encode()
        form, decoded = self._decoded[index][name].form, self._decoded[index][name].value
        if form == "binary":
            return f"({len(value)} bytes, not text: {bytes_digest(kind, name, value)})".encode()
        if form == "event-stream" and decoded["reply"] is not None:
            decoded = decoded["reply"]
        if form == "http":
            head, tail = self.scrub(decoded["head"]), self.scrub(decoded["body"])
            text = tail if isinstance(tail, str) else json.dumps(tail, ensure_ascii=False)
            return f"{head}\r\n\r\n{text}".encode()
        decoded = self.scrub(decoded)
        if isinstance(decoded, str):
            return decoded.encode()
        return json.dumps(decoded, ensure_ascii=False).encode()

    def shown_body(self, index: int) -> Strict | dict[str, Any]:
        """Body ``index`` as a page renders it: a copy whose bytes fields hold
        ``shown_bytes`` and whose other fields are hidden or scrubbed. For display only: its
        bytes are not the recorded ones, so nothing may be checked or replayed from it."""
        kind, body = self._bodies[index]
        if not isinstance(body, Strict):
            return self.view(index)
        update: dict[str, Any] = {}
        for name, value in _members(body):
            if isinstance(value, bytes):
                update[name] = self.shown_bytes(index, name)
            elif self.rules.hides(kind, name):
                update[name] = _hidden_like(value)
            else:
                update[name] = self._scrub_like(value)
        return body.model_copy(update=update)

    def _scrub_like(self, value: Any) -> Any:
        """``scrub`` that keeps models as models (a page reads their attributes)."""
        if isinstance(value, Strict):
            update = {n: self._scrub_like(getattr(value, n)) for n in type(value).model_fields}
            return value.model_copy(update=update)
        if isinstance(value, list):
            return [self._scrub_like(v) for v in value]
        if isinstance(value, bytes):
            return value  # nested bytes are only ever wrapped keys, in clear kinds
        return self.scrub(value)


def _hidden_like(value: Any) -> Any:
    """A hidden value of the same shape, so a page that reads it still can."""
    if isinstance(value, str):
        return REDACTED
    if isinstance(value, dict):
        return {REDACTED: REDACTED}
    if isinstance(value, list):
        return []
    if isinstance(value, Strict):
        return value.model_copy(
            update={n: _hidden_like(getattr(value, n)) for n in type(value).model_fields}
        )
    return value


def _members(body: Strict | dict[str, Any]) -> Iterable[tuple[str, Any]]:
    if isinstance(body, dict):
        return body.items()
    return ((name, getattr(body, name)) for name in type(body).model_fields)
