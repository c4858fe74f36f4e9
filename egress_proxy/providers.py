"""What differs between the wire dialects (OpenAI Chat Completions, OpenAI Responses,
Anthropic Messages), and what they share.

Differences: the route, the credential header sent upstream, which request members a pin may
set (and under which member name), which event ends a stream (Chat Completions
``data: [DONE]``, Responses ``response.completed``/``.incomplete``/``.failed``, Anthropic
``event: message_stop``) and the shape of the annotation event. Shared: the strict reading
of a request body, the split of a request into prompt and params, the JSON splice of a
non-streamed annotation, and reading the provider's fingerprint and the engine's
reproducibility block from a reply.

Headers: the proxy builds the upstream's headers itself. From the client it forwards only
``FORWARDED_HEADERS``; it never forwards or records ``CREDENTIAL_HEADERS`` (the session token
travels there), and in this slice it records no header at all.

Nothing here changes an upstream byte: the annotation is a separate event or one spliced
member, built from values read out of the reply.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import JsonValue

from egress_proxy.errors import MalformedBody, PastLimit
from egress_proxy.sse import Event, iter_events
from record.digest import canonical_json, prompt_fields
from record.limits import JsonRefused, OverLimit, check_counts, load_json

#: Client headers passed upstream as they are (the credential is the proxy's own).
FORWARDED_HEADERS = frozenset({"accept", "anthropic-beta", "openai-beta"})
#: Never forwarded upstream, never recorded, never logged.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "x-api-key", "proxy-authorization", "cookie", "api-key"}
)
#: Upstream response headers relayed to the client; everything else stays behind.
RELAYED_HEADERS = frozenset({"content-type", "retry-after", "request-id", "x-request-id"})
RELAYED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "openai-")
ANTHROPIC_VERSION = "2023-06-01"
USER_AGENT = "affidavit-egress-proxy/0.1"


DialectName = Literal["openai", "anthropic", "responses"]
#: The events that end a Responses stream (the proxy's annotation goes just before).
RESPONSES_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


@dataclass(frozen=True)
class Dialect:
    name: DialectName
    route: str
    pinnable: frozenset[str]  # the sampling pins its API has (``egress_proxy.pins``)
    #: Pins that are engine extension members here: sent only where ``engine_extensions``.
    extensions: frozenset[str] = frozenset({"strict_cache"})
    #: A pin set under another member name (Responses: ``max_output_tokens``).
    renamed: tuple[tuple[str, str], ...] = ()

    def member(self, pin: str) -> str:
        """The request member a pin sets."""
        return dict(self.renamed).get(pin, pin)

    def api_version(self, client: Mapping[str, str], configured: str | None) -> str | None:
        """The API version sent (Anthropic) and recorded as ``provider.api_version``."""
        if self.name == "anthropic":
            return configured or client.get("anthropic-version") or ANTHROPIC_VERSION
        return configured

    def upstream_headers(
        self, client: Mapping[str, str], api_key: str | None, api_version: str | None
    ) -> tuple[tuple[str, str], ...]:
        headers = [
            ("content-type", "application/json"),
            ("accept-encoding", "identity"),  # the record keeps the body as sent, uncompressed
            ("user-agent", USER_AGENT),
        ]
        headers += [(k, v) for k, v in sorted(client.items()) if k in FORWARDED_HEADERS]
        if self.name == "anthropic":
            headers.append(("anthropic-version", api_version or ANTHROPIC_VERSION))
            if api_key is not None:
                headers.append(("x-api-key", api_key))
        elif api_key is not None:
            headers.append(("authorization", f"Bearer {api_key}"))
        return tuple(headers)

    def is_terminal(self, event: Event) -> bool:
        """The event that ends a stream: held back until the reply is committed."""
        if self.name == "openai":
            return event.data is not None and event.data.strip() == "[DONE]"
        ends = RESPONSES_TERMINAL if self.name == "responses" else frozenset({"message_stop"})
        if event.name is not None:
            return event.name in ends
        data = event.json()
        kind = data.get("type") if data is not None else None
        return isinstance(kind, str) and kind in ends  # a list is unhashable (found by fuzzing)

    def annotation_event(self, annotation: dict[str, Any], last: dict[str, Any] | None) -> bytes:
        """The proxy's own event, put just before the stream's terminating event.

        OpenAI: a chunk with ``choices: []``. It repeats the last upstream chunk's ``id``,
        ``created``, ``model``, ``system_fingerprint``, ``service_tier`` and ``usage``, since
        SDK accumulators take those from the latest chunk and would otherwise lose them.
        Anthropic and Responses: ``event: affidavit`` (its data of ``type`` ``affidavit``,
        with no ``sequence_number`` of its own), which SDKs pass over as an unknown event type.
        """
        if self.name != "openai":
            data = _dumps({"type": "affidavit", "affidavit": annotation})
            return b"event: affidavit\ndata: " + data + b"\n\n"
        chunk: dict[str, Any] = {
            "id": "chatcmpl-affidavit",
            "object": "chat.completion.chunk",
            "created": 0,
        }
        for key in ("id", "created", "model", "system_fingerprint", "service_tier", "usage"):
            if last is not None and key in last:
                chunk[key] = last[key]
        chunk["choices"] = []
        chunk["affidavit"] = annotation
        return b"data: " + _dumps(chunk) + b"\n\n"


OPENAI = Dialect(
    "openai",
    "/v1/chat/completions",
    frozenset({"seed", "temperature", "top_p", "top_k", "max_tokens"}),
)
#: The Messages API has no ``seed``: pinned calls to an engine carry it as an engine member.
ANTHROPIC = Dialect(
    "anthropic",
    "/v1/messages",
    frozenset({"seed", "temperature", "top_p", "top_k", "max_tokens"}),
    extensions=frozenset({"strict_cache", "seed"}),
)
#: The Responses API has no ``seed`` or ``top_k``: pinned calls carry them as engine members.
RESPONSES = Dialect(
    "responses",
    "/v1/responses",
    frozenset({"seed", "temperature", "top_p", "top_k", "max_tokens"}),
    extensions=frozenset({"strict_cache", "seed", "top_k"}),
    renamed=(("max_tokens", "max_output_tokens"),),
)
DIALECTS = {d.route: d for d in (OPENAI, ANTHROPIC, RESPONSES)}


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def strict_json(raw: bytes) -> Any:
    """Parse JSON as I-JSON (RFC 7493: no duplicate members, no NaN, UTF-8 only) within
    ``record.limits`` (nesting, number length), or ``MalformedBody`` saying why not."""
    try:
        return load_json(raw, unique_keys=True)
    except OverLimit as exc:
        raise PastLimit(f"the body is past a limit: {exc}") from None
    except JsonRefused as exc:
        raise MalformedBody(f"the body is not I-JSON: {exc}") from None


def parse_request(raw: bytes) -> dict[str, Any]:
    """A request body as one I-JSON object within ``record.limits``, or ``MalformedBody``
    saying why not.

    Duplicate members are refused because the upstream might read the other one; numbers
    outside I-JSON because the record's canonical JSON cannot hold them; anything past the
    limits because every reader of the record must read back what was accepted.
    """
    value = strict_json(raw)
    if not isinstance(value, dict):
        raise MalformedBody(f"the body is a JSON {type(value).__name__}, not an object")
    try:
        check_counts(value)
    except OverLimit as exc:
        raise PastLimit(f"the body is past a limit: {exc}") from None
    try:
        canonical_json(value)
    except ValueError as exc:
        raise MalformedBody(f"the body is not I-JSON: {exc}") from None
    return value


def params_of(request: Mapping[str, Any]) -> dict[str, JsonValue]:
    """The request's parameters as sent: every top-level member that is not prompt."""
    prompt = prompt_fields(request)
    return {k: v for k, v in request.items() if k not in prompt}


def splice_member(body: bytes, name: str, value: Any) -> bytes | None:
    """``body`` with one top-level member added before its closing brace, or None if the body
    is not a JSON object. Every upstream byte stays where it was."""
    end = len(body.rstrip(b" \t\r\n"))
    if end == 0 or body[end - 1 : end] != b"}":
        return None
    try:
        parsed = load_json(body)
    except JsonRefused:  # past the limits too: relayed as it is, with no annotation
        return None
    if not isinstance(parsed, dict):
        return None
    member = _dumps(name) + b":" + _dumps(value)
    sep = b"," if parsed else b""
    return body[: end - 1] + sep + member + body[end - 1 :]


def reply_facts(body: bytes, streamed: bool) -> tuple[str | None, dict[str, JsonValue] | None]:
    """``(fingerprint, reproducibility)`` read from a reply: the provider's
    ``system_fingerprint`` and the engine's ``reproducibility`` block, the last seen of each."""
    objects: Iterable[Any]
    if streamed:
        objects = (e.json() for e in iter_events(body))
    else:
        try:
            objects = [strict_json(body)]
        except MalformedBody:
            objects = []
    fingerprint: str | None = None
    block: dict[str, JsonValue] | None = None
    for obj in objects:
        if not isinstance(obj, dict):
            continue
        if isinstance(obj.get("system_fingerprint"), str):
            fingerprint = obj["system_fingerprint"]
        if isinstance(obj.get("reproducibility"), dict):
            block = obj["reproducibility"]
    if block is not None:
        try:
            canonical_json(block)
        except ValueError:
            block = None  # not I-JSON: the bytes keep it, the record's field cannot
    return fingerprint, block


def relayed(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The upstream response headers a client gets back."""
    return [(k, v) for k, v in headers if k in RELAYED_HEADERS or k.startswith(RELAYED_PREFIXES)]
