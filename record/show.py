"""``affidavit log show``: a stream's entries for people, opened with a key, redacted.

Without rules, bytes fields are shown as text when they are UTF-8 and as ``base64:…``
otherwise. With rules, every body goes through ``record.redact``: bytes fields become their
digests with their decoded values beside them, and the rules apply to those across the whole
stream. This module only reads; redaction happens on the copy it prints.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from record.backends import open_store
from record.errors import CannotOpen, SchemaError, UnknownStream
from record.reader import StreamKeys
from record.redact import RedactionRules
from record.schema import Strict, parse_entry
from record.seal import KeyPair


def readable(body: Strict) -> dict[str, Any]:
    """The body as JSON values, with bytes decoded for reading."""
    out: dict[str, Any] = {}
    for name in type(body).model_fields:
        value = getattr(body, name)
        if isinstance(value, bytes):
            try:
                out[name] = value.decode("utf-8")
            except UnicodeDecodeError:
                out[name] = "base64:" + base64.b64encode(value).decode("ascii")
        elif isinstance(value, Strict):
            out[name] = value.model_dump(mode="json")
        elif isinstance(value, list):
            out[name] = [v.model_dump(mode="json") if isinstance(v, Strict) else v for v in value]
        else:
            out[name] = value
    return out


def show_stream(
    store_path: Path | str,
    stream: str,
    *,
    key: KeyPair | None = None,
    rules: RedactionRules | None = None,
    as_json: bool = False,
) -> Iterator[str]:
    """Yield one printable line (or JSON object) per entry of ``stream``."""
    rules = rules or RedactionRules()
    store = open_store(store_path, readonly=True)
    try:
        entries = [parse_entry(e.line) for e in store.entries(stream)]
        if not entries:
            raise UnknownStream(f"store {store_path} holds no stream {stream!r}")
        keys = StreamKeys.collect(stream, entries, key) if key is not None else None
        shown: list[tuple[dict[str, Any] | None, str]] = []
        opened: list[tuple[int, str, Strict | dict[str, Any]]] = []
        for i, entry in enumerate(entries):
            if isinstance(entry.body, dict) or keys is not None:
                try:
                    clear = keys.open(entry) if keys is not None else dict(entry.body)  # type: ignore[arg-type]
                except (CannotOpen, SchemaError) as exc:
                    shown.append((None, f"cannot open: {exc}"))
                    continue
                opened.append((i, entry.kind, clear))
                shown.append((readable(clear) if isinstance(clear, Strict) else clear, ""))
            else:
                shown.append((None, f"sealed, {len(entry.body)} base64 characters"))
        if rules:
            views = rules.stream((kind, clear) for _, kind, clear in opened).views()
            for (i, _, _), view in zip(opened, views, strict=True):  # pragma: no mutate
                shown[i] = (view, "")
        for entry, (body, note) in zip(entries, shown, strict=True):  # pragma: no mutate
            envelope = entry.model_dump(mode="json", exclude={"body"})  # pragma: no mutate
            if as_json:
                yield json.dumps({"envelope": envelope, "body": body, "note": note or None})
            else:
                head = f"{entry.seq:>6} {entry.occurred_at} {entry.kind}"
                yield head + (
                    f"  ({note})" if note else "  " + json.dumps(body, ensure_ascii=False)
                )
    finally:
        store.close()
