"""Reading bodies: turn a stream's stored lines into envelopes and opened bodies.

Only a recipient key of the stream opens anything: the data key of each epoch is unwrapped
from the stream's clear ``stream.opened`` / ``key.rotated`` entries with the reader's
private key. This module never writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from record.digest import Domain, digest
from record.errors import CannotOpen, SchemaError
from record.schema import (
    CLEAR_KINDS,
    Entry,
    FetchRequest,
    FetchResponse,
    KeyRotated,
    ModelRequest,
    ModelResponse,
    StreamOpened,
    Strict,
    ToolCall,
    ToolResult,
    TurnEnded,
    TurnStarted,
    canonical_b64decode,
    envelope_json,
    parse_body,
)
from record.seal import KeyPair, open_sealed


def associated_data(entry: Entry) -> bytes:
    """The AEAD associated data of an entry: the canonical JSON of its envelope."""
    return envelope_json(entry)


@dataclass
class StreamKeys:
    """The data keys of one stream that a private key can open, by epoch."""

    stream: str
    keys: dict[int, bytes]

    @classmethod
    def collect(
        cls,
        stream: str,
        entries: Iterable[Entry],
        key: KeyPair,
        *,
        failed: list[tuple[int, CannotOpen]] | None = None,
    ) -> StreamKeys:
        """The data keys the clear ``entries`` wrap to ``key``; ``CannotOpen`` when none names it.

        ``failed``: a wrapped key that names ``key`` but does not open is added there, with its
        entry's ``seq``, and the others are still collected (the audit reports each one);
        without it, the first such key raises.
        """
        mine = key.recipient.text()
        keys: dict[int, bytes] = {}
        named = False
        for entry in entries:
            if entry.kind not in CLEAR_KINDS or not isinstance(entry.body, dict):
                continue
            body = parse_body(entry.kind, entry.body, stored=True)
            assert isinstance(body, StreamOpened | KeyRotated)
            for wrapped in body.recipients:
                if wrapped.recipient != mine:
                    continue
                named = True
                try:
                    keys[body.key_epoch] = key.unwrap(wrapped.sealed_key, stream, body.key_epoch)
                except CannotOpen as exc:
                    if failed is None:
                        raise
                    failed.append((entry.seq, exc))
        if not named:
            raise CannotOpen(f"stream {stream!r} is not sealed to this key")
        return cls(stream, keys)

    def open(self, entry: Entry) -> Strict:
        """The entry's body, opened and validated; ``CannotOpen`` or ``SchemaError``."""
        if isinstance(entry.body, dict):
            return parse_body(entry.kind, entry.body, stored=True)
        data_key = self.keys.get(entry.key_epoch)
        if data_key is None:
            raise CannotOpen(f"no data key for epoch {entry.key_epoch} under this private key")
        try:
            sealed = canonical_b64decode(entry.body)
        except ValueError:
            raise CannotOpen("sealed body is not canonical base64") from None
        plaintext = open_sealed(data_key, sealed, associated_data(entry))
        try:
            return parse_body(entry.kind, plaintext, stored=True)
        except SchemaError as exc:
            raise SchemaError(f"seq {entry.seq}: {exc}") from None


def digest_mismatches(body: Strict) -> list[str]:
    """Each digest field of a body whose bytes do not hash to it, named for the audit."""
    checks: list[tuple[str, Domain, bytes | None, str | None]] = []
    if isinstance(body, ModelRequest):
        checks += [
            ("content_key", Domain.REQUEST, body.request_bytes, body.content_key),
            ("input_digest", Domain.INPUT, body.input_bytes, body.input_digest),
            ("prompt_digest", Domain.PROMPT, body.prompt_bytes, body.prompt_digest),
        ]
    elif isinstance(body, ModelResponse):
        checks += [
            ("response_digest", Domain.RESPONSE, body.response_bytes, body.response_digest),
            ("error_digest", Domain.ERROR, body.error_bytes, body.error_digest),
        ]
    elif isinstance(body, ToolCall):
        checks.append(
            ("arguments_digest", Domain.TOOL_ARGUMENTS, body.arguments, body.arguments_digest)
        )
    elif isinstance(body, ToolResult):
        checks += [
            ("result_digest", Domain.TOOL_RESULT, body.result_bytes, body.result_digest),
            ("error_digest", Domain.ERROR, body.error_bytes, body.error_digest),
        ]
    elif isinstance(body, FetchRequest):
        checks.append(("content_key", Domain.FETCH_REQUEST, body.request_bytes, body.content_key))
    elif isinstance(body, FetchResponse):
        checks += [
            ("response_digest", Domain.FETCH_RESPONSE, body.response_bytes, body.response_digest),
            ("error_digest", Domain.ERROR, body.error_bytes, body.error_digest),
        ]
    elif isinstance(body, TurnStarted):
        checks.append(("input_digest", Domain.INPUT, body.input_bytes, body.input_digest))
    elif isinstance(body, TurnEnded):
        checks.append(("answer_digest", Domain.RESPONSE, body.answer_bytes, body.answer_digest))
    problems = []
    for name, domain, data, claimed in checks:
        if data is None and claimed is None:
            continue
        if data is None or claimed is None:
            problems.append(f"{name} is set without its bytes, or its bytes without it")
        elif digest(domain, data) != claimed:
            problems.append(f"{name} {claimed} does not match its bytes")
    return problems
