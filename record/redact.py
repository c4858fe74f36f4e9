"""Redaction is a projection at read time: it shapes what is shown, never what is stored.

Rules, comma-separated:

- ``FIELD``       hide that body field in every entry (``input_bytes``)
- ``KIND:FIELD``  only in entries of that kind (``model.response:response_bytes``)
- ``re:PATTERN``  hide every match of a regular expression inside shown text

This module works on already-decoded JSON values and never touches a store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

REDACTED = "[REDACTED]"
_FIELD_RE = re.compile(r"^(?:(?P<kind>[a-z]+\.[a-z]+):)?(?P<field>[A-Za-z_][A-Za-z0-9_]*)$")


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

    def apply(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """A redacted copy of ``body``; the input is left untouched."""
        out: dict[str, Any] = {}
        for name, value in body.items():
            if (None, name) in self.fields or (kind, name) in self.fields:
                out[name] = REDACTED
            else:
                out[name] = self._scrub(value)
        return out

    def _scrub(self, value: Any) -> Any:
        if not self.patterns:
            return value
        if isinstance(value, str):
            for pattern in self.patterns:
                value = pattern.sub(REDACTED, value)
            return value
        if isinstance(value, dict):
            return {k: self._scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._scrub(v) for v in value]
        return value
