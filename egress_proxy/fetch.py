"""The fetch endpoint, ``POST /s/{session}/v1/fetch``: tools that read the web do it here.

The client posts ``{"method", "url", "headers", "body"}`` (``body`` base64); the proxy builds
the exact HTTP/1.1 request it will send, appends ``fetch.request`` (``content_key`` over those
bytes: request line, header lines and body) and waits until it is durable, then dials through
the one network transport, reads the response to its end and appends ``fetch.response``
(status line, header lines and body as received), and only then answers with status, headers
and body verbatim (the body base64). The shapes are in ``docs/proxy.md``.

Before it dials, the URL's host is resolved and checked (``egress_proxy.fetch_guard``): an
address the rule refuses (loopback, private, link-local, metadata …, unless ``fetch.allow``
opens it) is answered 403 ``egress_refused`` and recorded ``FAILED``; the transport connects to
the checked address only, with ``Host`` and the TLS server name still the URL's host. A name
that does not resolve, or an address that takes no connection, is 502 ``upstream_unreachable``
and also ``FAILED``: not a byte went out, so the call surely did not happen (``UNKNOWN`` is
kept for a request that may have reached the server: no reply, or a cut one).
Redirects are not followed: a 3xx is answered like any response, its ``Location`` never dialed.

A fetch is a web tool's call, so the admission rule (``egress_proxy.admission``) holds for it
as for an MCP ``tools/call``, and is checked before anything is resolved or dialed: a fetch is
admitted only as an unserved ``web_fetch {"url"}`` call of the session's committed reply (a
GET of that URL), or ``web_search {"query"}`` (a GET of the session's search endpoint for that
query), and its ``fetch.request`` names that reply and call. The body may name them
(``reply_seq``, ``call_id``; the harness does); without them the latest committed reply's first
unserved matching call is taken. Anything else is 409, recorded as ``fetch.request`` (naming
no call) and a ``FAILED`` ``fetch.response`` with the refusal.

The proxy sets ``host`` and ``content-length`` itself and ``user-agent`` and
``accept-encoding: identity`` unless the client set them; it refuses credential headers
(the record keeps the request bytes) and framing headers (it frames the request itself).

This module imports no web framework and no HTTP client; the transport is handed in.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable
from urllib.parse import quote, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from egress_proxy.admission import WEB, Admitted
from egress_proxy.errors import (
    EgressRefused,
    MalformedFetch,
    ProxyError,
    ReplayMiss,
    ReplyNotCommitted,
    ResponseTooLarge,
    ToolNotAsked,
    UpstreamCut,
    UpstreamUnavailable,
    UpstreamUnreachable,
    answered_status,
)
from egress_proxy.fetch_guard import EgressRule
from egress_proxy.providers import CREDENTIAL_HEADERS, parse_request
from egress_proxy.replay_plan import ReplayPlan
from egress_proxy.sessions import Session
from egress_proxy.tool_config import FetchConfig
from egress_proxy.tools import MAX_SEQ, NamedReply, ToolAsk, ToolCalls, append
from egress_proxy.transports.base import UpstreamRequest
from record.digest import Domain, canonical_json, digest
from record.log import Appended, Log
from record.schema import FetchRequest, FetchResponse, describe

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
#: Framing and hop-by-hop headers: the proxy frames the request itself.
FRAMING_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
     "trailer", "upgrade", "expect", "proxy-connection"}
)  # fmt: skip
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?|")
_TARGET = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})*")
#: The session label holding ``web_search``'s endpoint, ``{query}`` where the query goes.
SEARCH_LABEL = "affidavit/search_url"
#: The only headers a web tool's fetch may carry: they choose a form of the page, and carry
#: nothing the model did not ask to send.
TOOL_HEADERS = frozenset({"user-agent", "accept", "accept-language"})


class ExactResponse(Protocol):
    status: int
    reason: str
    http_version: str
    raw_headers: tuple[tuple[str, str], ...]  # names as received, in order

    def body(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ExactTransport(Protocol):
    """What fetch needs of a transport: send these very bytes (``transports.network``) over a
    connection to ``address`` (the checked, pinned one), whatever the URL's host resolves to."""

    async def send_exact(self, request: UpstreamRequest, address: str) -> ExactResponse: ...


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: str
    url: str
    headers: dict[str, str] | list[tuple[str, str]] = {}
    body: str | None = None
    reply_seq: int | None = Field(default=None, ge=0, lt=MAX_SEQ, strict=True)
    call_id: str | None = Field(default=None, min_length=1)


@dataclass(frozen=True)
class FetchAsk:
    """A fetch, parsed and checked: what goes on the wire, exactly."""

    method: str
    url: str
    target: str  # origin-form: path and query as in the URL
    host: str  # the URL's host, as written (an IPv6 literal in brackets)
    port: int  # the URL's port, or its scheme's
    headers: tuple[tuple[str, str], ...]  # lower-case names, in the order sent
    body: bytes
    given: frozenset[str] = frozenset()  # the names of the headers the client gave
    named: NamedReply | None = None  # the reply and call the body names, if it names one

    def request_bytes(self) -> bytes:
        head = f"{self.method} {self.target} HTTP/1.1\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in self.headers) + "\r\n"
        return head.encode("ascii") + self.body


def parse_fetch(raw: bytes, user_agent: str) -> FetchAsk:
    """The fetch a body asks for, or ``MalformedBody``/``MalformedFetch`` naming why not."""
    try:
        given = _Body.model_validate(parse_request(raw))
    except ValidationError as exc:
        raise MalformedFetch(describe(exc, "fetch")) from None
    if given.method not in METHODS:
        raise MalformedFetch(f"fetch: method must be one of {', '.join(METHODS)}")
    url = given.url
    parts = urlsplit(url) if url.isascii() else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise MalformedFetch(f"fetch: url must be an absolute http(s) URL in ASCII: {url!r}")
    if "@" in parts.netloc or "#" in url:
        raise MalformedFetch("fetch: url must carry no userinfo and no fragment")
    target = (parts.path or "/") + (f"?{parts.query}" if "?" in url else "")
    if not _TARGET.fullmatch(target) or not re.fullmatch(r"[A-Za-z0-9.\-:\[\]]+", parts.netloc):
        raise MalformedFetch("fetch: url has characters that must be percent-encoded")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise MalformedFetch(f"fetch: url has no valid port: {url!r}") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    if {".", ".."} & set(parts.path.split("/")):
        raise MalformedFetch("fetch: url path has dot segments (the client would remove them)")
    try:
        body = base64.b64decode(given.body or "", validate=True)
    except binascii.Error:
        raise MalformedFetch("fetch: body must be standard base64") from None
    pairs = list(given.headers.items()) if isinstance(given.headers, dict) else given.headers
    headers: list[tuple[str, str]] = [("host", parts.netloc.lower())]
    for name, value in pairs:
        key = name.lower()
        if not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(value):
            raise MalformedFetch(f"fetch: header {name!r} is not a valid header line")
        if key in FRAMING_HEADERS or key in CREDENTIAL_HEADERS:
            raise MalformedFetch(f"fetch: header {key!r} is set by the proxy or refused")
        headers.append((key, value))
    named = {k for k, _ in headers}
    for key, value in (("user-agent", user_agent), ("accept-encoding", "identity")):
        if key not in named:
            headers.append((key, value))
    if body or given.method in ("POST", "PUT", "PATCH"):
        headers.append(("content-length", str(len(body))))
    if (given.reply_seq is None) != (given.call_id is None):
        raise MalformedFetch("fetch: reply_seq and call_id name a call together: give both")
    call = None
    if given.reply_seq is not None and given.call_id is not None:
        call = NamedReply(given.reply_seq, given.call_id)
    return FetchAsk(
        given.method, url, target, host, port, tuple(headers), body,
        frozenset(k.lower() for k, _ in pairs), call,
    )  # fmt: skip


def tool_asks(ask: FetchAsk, search_url: str | None) -> tuple[ToolAsk, ...]:
    """The web tool calls a fetch may be admitted as, most specific first:
    ``web_search {"query"}`` when its URL is the search endpoint's for some query, then
    ``web_fetch {"url"}``. None for a fetch no web tool makes: another method than GET, a
    body, or a header beyond ``TOOL_HEADERS``."""
    if ask.method != "GET" or ask.body or not ask.given <= TOOL_HEADERS:
        return ()
    asks: list[ToolAsk] = []
    query = search_query(ask.url, search_url) if search_url else None
    if query is not None:
        asks.append(ToolAsk(WEB, "web_search", canonical_json({"query": query}), ask.named, True))
    asks.append(ToolAsk(WEB, "web_fetch", canonical_json({"url": ask.url}), ask.named, True))
    return tuple(asks)


def search_query(url: str, search_url: str) -> str | None:
    """The query whose search URL is ``url`` (``{query}`` in ``search_url`` replaced by the
    query percent-encoded, as the harness builds it), or None when there is none."""
    prefix, marker, suffix = search_url.partition("{query}")
    if not marker or not url.startswith(prefix) or len(url) < len(prefix) + len(suffix):
        return None
    encoded = url[len(prefix) : len(url) - len(suffix)]
    try:
        query = unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        return None
    return query if search_url.replace("{query}", quote(query, safe="")) == url else None


def _not_a_tool(ask: FetchAsk) -> ToolNotAsked:
    why = (
        f"a {ask.method}"
        if ask.method != "GET"
        else "a body"
        if ask.body
        else "header " + ", ".join(sorted(ask.given - TOOL_HEADERS))
    )
    return ToolNotAsked(
        f"this fetch is no web tool's call ({why}): web_fetch and web_search are a GET with "
        f"no body and no headers but {', '.join(sorted(TOOL_HEADERS))}"
    )


@dataclass(frozen=True)
class FetchAnswer:
    """What the client gets: the proxy's status, its JSON body, where the fetch is recorded."""

    status: int
    body: bytes
    request_seq: int | None


class Fetcher:
    def __init__(
        self, log: Log, transport: ExactTransport, config: FetchConfig, calls: ToolCalls
    ) -> None:
        self.log, self.transport, self.config, self.calls = log, transport, config, calls
        self.rule = EgressRule(config.allow, config.deny)

    async def fetch(self, session: Session, raw: bytes) -> FetchAnswer:
        """Admit, record, dial, read, record, answer. A body that is no fetch raises
        ``ProxyError`` before anything is recorded; a fetch the model did not ask for is
        answered 409 and recorded as refused, never dialed."""
        ask = parse_fetch(raw, self.config.user_agent)
        admission = await self._admit(session, ask)
        if isinstance(admission, FetchAnswer):
            return admission
        tool, admitted = admission
        request = _request(ask, admitted.reply_seq, admitted.call_id)
        try:
            first = await append(self.log, session, request)
        except BaseException:
            await self.calls.release(session, tool, admitted)
            raise
        upstream = UpstreamRequest(
            ask.method,
            ask.url,
            ask.headers,
            ask.body,
            timeout_s=self.config.timeout_s,
            connect_timeout_s=self.config.connect_timeout_s,
        )
        try:
            pinned = await self.rule.pin(ask.host, ask.port, self.config.connect_timeout_s)
        except (EgressRefused, UpstreamUnreachable) as exc:  # never dialed, or no such name
            return await self._failed(session, first.seq, exc)
        try:
            response = await self.transport.send_exact(upstream, str(pinned))
        except ValueError as exc:  # nothing went out: the client library would change it
            return await self._failed(session, first.seq, MalformedFetch(f"fetch: {exc}"))
        except UpstreamUnreachable as exc:  # no connection: not a byte of the request went out
            return await self._failed(session, first.seq, exc)
        except UpstreamUnavailable as exc:
            await self._record(session, first.seq, "UNKNOWN")
            return FetchAnswer(exc.status, exc.body(), first.seq)
        head = response_head(response)
        received = bytearray()
        try:
            async for chunk in response.body():
                received += chunk
                if len(received) > self.config.max_response_bytes:
                    limit = self.config.max_response_bytes
                    error = ResponseTooLarge(f"the fetched body exceeds {limit} bytes")
                    return await self._failed(session, first.seq, error, response.status)
        except UpstreamCut as exc:
            partial = head + bytes(received)
            await self._record(session, first.seq, "UNKNOWN", response.status, partial)
            return FetchAnswer(exc.status, exc.body(), first.seq)
        finally:
            await response.aclose()
        whole = head + bytes(received)
        entry = await self._record(session, first.seq, "COMMITTED", response.status, whole)
        note = _note(session.id, first.seq, entry.seq, request.content_key, whole)
        return FetchAnswer(200, answer_json(whole, note), first.seq)

    async def replayed(self, session: Session, raw: bytes, plan: ReplayPlan) -> FetchAnswer:
        """Serve a fetch from a session's replay plan: the recorded response is appended again
        with ``replayed_from``; a fetch the plan does not hold raises ``ReplayMiss``. Nothing
        is dialed either way."""
        ask = parse_fetch(raw, self.config.user_agent)
        admission = await self._admit(session, ask)
        if isinstance(admission, FetchAnswer):
            return admission
        tool, admitted = admission
        request = _request(ask, admitted.reply_seq, admitted.call_id)
        try:
            recorded, recorded_seq = plan.fetch_result(ask.url, request.request_bytes)
        except ReplayMiss as exc:
            await self.calls.release(session, tool, admitted)
            return await self._refused(session, ask, exc)
        try:
            first = await append(self.log, session, request)
        except BaseException:
            await self.calls.release(session, tool, admitted)
            raise
        replay = recorded.model_copy(
            update={"request_seq": first.seq, "replayed_from": recorded_seq}
        )
        entry = await append(self.log, session, replay)
        if recorded.outcome != "COMMITTED" or recorded.response_bytes is None:
            body = recorded.error_bytes or b'{"error":{"code":"upstream_unavailable"}}'
            return FetchAnswer(answered_status(body), body, first.seq)
        whole = recorded.response_bytes
        note = _note(session.id, first.seq, entry.seq, request.content_key, whole)
        note["replayed_from"] = recorded_seq
        return FetchAnswer(200, answer_json(whole, note), first.seq)

    async def _admit(
        self, session: Session, ask: FetchAsk
    ) -> tuple[ToolAsk, Admitted] | FetchAnswer:
        """The web tool call the fetch is admitted as, claimed; or the recorded refusal."""
        refusal: ReplyNotCommitted | None = None
        for tool in tool_asks(ask, session.labels.get(SEARCH_LABEL)):
            try:
                return tool, await self.calls.claim(session, tool)
            except ReplyNotCommitted as exc:
                refusal = refusal or exc
        return await self._refused(session, ask, refusal or _not_a_tool(ask))

    async def _refused(self, session: Session, ask: FetchAsk, error: ProxyError) -> FetchAnswer:
        """Record a fetch refused before it could be sent: ``fetch.request`` naming the reply
        it was checked against but no call, then ``FAILED`` with the body answered."""
        if ask.named is not None:
            reply_seq: int | None = ask.named.reply_seq
        else:
            reply_seq = await self.calls.latest_reply(session)
        first = await append(self.log, session, _request(ask, reply_seq, None))
        return await self._failed(session, first.seq, error)

    async def _record(
        self,
        session: Session,
        request_seq: int,
        outcome: Literal["COMMITTED", "UNKNOWN"],
        status: int | None = None,
        data: bytes | None = None,
    ) -> Appended:
        return await record_received(self.log, session, request_seq, outcome, status, data)

    async def _failed(
        self, session: Session, request_seq: int, error: ProxyError, status: int | None = None
    ) -> FetchAnswer:
        await record_failed(self.log, session, request_seq, error, status)
        return FetchAnswer(error.status, error.body(), request_seq)


async def record_received(
    log: Log,
    session: Session,
    request_seq: int,
    outcome: Literal["COMMITTED", "UNKNOWN"],
    status: int | None = None,
    data: bytes | None = None,
) -> Appended:
    """Append the ``fetch.response`` of what arrived: all of it, or (``UNKNOWN``) a part."""
    entry = FetchResponse(
        request_seq=request_seq,
        outcome=outcome,
        status=status,
        response_bytes=data,
        response_digest=digest(Domain.FETCH_RESPONSE, data) if data is not None else None,
    )
    return await append(log, session, entry)


async def record_failed(
    log: Log, session: Session, request_seq: int, error: ProxyError, status: int | None = None
) -> Appended:
    """Append the ``FAILED`` ``fetch.response`` carrying the error the client is answered."""
    body = error.body()
    entry = FetchResponse(
        request_seq=request_seq,
        outcome="FAILED",
        status=status,
        error_bytes=body,
        error_digest=digest(Domain.ERROR, body),
    )
    return await append(log, session, entry)


def _request(ask: FetchAsk, reply_seq: int | None, call_id: str | None) -> FetchRequest:
    """The ``fetch.request`` of ``ask``: the call it was admitted as, or (a refusal) the reply
    it was checked against and no call."""
    sent = ask.request_bytes()
    return FetchRequest(
        method=ask.method,
        url=ask.url,
        request_bytes=sent,
        content_key=digest(Domain.FETCH_REQUEST, sent),
        reply_seq=reply_seq,
        call_id=call_id,
    )


def _note(
    stream: str, request_seq: int, seq: int, content_key: str, whole: bytes
) -> dict[str, object]:
    return {
        "stream": stream,
        "request_seq": request_seq,
        "seq": seq,
        "outcome": "COMMITTED",
        "content_key": content_key,
        "response_digest": digest(Domain.FETCH_RESPONSE, whole),
    }


def answer_json(whole: bytes, note: dict[str, object] | None = None) -> bytes:
    """The client's JSON answer for a response recorded as ``whole`` (status line, header
    lines, blank line, body): live, replayed and reconstructed fetches answer alike."""
    head, _, body = whole.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, status, reason = [*status_line.split(" ", 2), "", ""][:3]
    headers = [list(line.split(": ", 1)) for line in lines if line]
    answer: dict[str, object] = {
        "status": int(status),
        "reason": reason,
        "http_version": version,
        "headers": headers,
        "body": base64.b64encode(body).decode("ascii"),
    }
    if note is not None:
        answer["affidavit"] = note
    return json.dumps(answer, separators=(",", ":")).encode()


def recorded_fetch(response: FetchResponse) -> tuple[int, bytes]:
    """Status and JSON answer of a recorded fetch with a known outcome, as the proxy gave
    them live (the note aside): what resume and reconstruct hand the tool again."""
    if response.outcome == "COMMITTED" and response.response_bytes is not None:
        return 200, answer_json(response.response_bytes)
    error = response.error_bytes or b'{"error":{"code":"upstream_unavailable"}}'
    return answered_status(error), error


def response_head(response: ExactResponse) -> bytes:
    """The status line, header lines and blank line of ``response``, as received: what a
    ``fetch.response``'s ``response_bytes`` start with."""
    status = f"{response.http_version} {response.status} {response.reason}\r\n"
    lines = "".join(f"{k}: {v}\r\n" for k, v in response.raw_headers)
    return (status + lines + "\r\n").encode("latin-1")
