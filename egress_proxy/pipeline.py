"""The proxy's request pipeline: small wrapping stages with one signature.

    Stage = async (call, next) -> Reply

The default chain, outermost first:
``annotate → pins → clock → tool_ids → identity → capture → dial``.

- ``pins`` sets the session's pins on the request (``egress_proxy.pins``); ``clock`` samples
  the clock once and puts it into the prompt (``egress_proxy.clock``); ``tool_ids`` turns
  the derived tool-call ids the session issued, quoted back by the client, into the
  upstream's own. A stage that changes the request re-serialises it (RFC 8785); a request
  no stage changed goes upstream as the very bytes the client sent.
- ``identity`` appends ``model.request`` (content key over the bytes it will send, input
  digest over the bytes as received, prompt digest over the canonical prompt of the request
  it will send) and waits until it is durable. Only then does it call ``next``.
- ``capture`` reads the reply to its end in a task of its own, so a client that leaves
  mid-stream does not stop the recording, keeps every byte, and appends ``model.response``
  (``COMMITTED``, ``FAILED`` or ``UNKNOWN``) before the reply's end reaches outer stages.
- ``annotate`` forwards whole events as they arrive, holds back the stream's terminating
  event, and once the reply is committed sends the proxy's annotation and then the held
  bytes; a non-streamed JSON reply gets a top-level ``affidavit`` member. A provider's error
  reply passes through untouched.
- ``tool_ids``, on the way back in a pinned session, delivers derived tool-call ids in place
  of the upstream's (``egress_proxy.tool_ids``); ``capture`` has already kept the upstream's
  bytes, and records the mapping beside them.
- ``dial`` is the only stage that uses a transport.

This module imports no web framework and no HTTP client: reconstruct can build the same
chain with a record-backed transport. It never changes a byte it records.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from pydantic import JsonValue

from egress_proxy.clock import CLOCK_RULE, Clock, ClockRule, inject_clock
from egress_proxy.errors import (
    ProxyError,
    RecordUnavailable,
    ResponseTooLarge,
    UpstreamCut,
    UpstreamUnavailable,
)
from egress_proxy.pins import PinOutcome, apply_pins, pins_entry
from egress_proxy.providers import Dialect, params_of, reply_facts, splice_member
from egress_proxy.replay_plan import VERDICT_KEY
from egress_proxy.sessions import Session
from egress_proxy.sse import Event, EventSplitter, parse_event
from egress_proxy.tool_ids import RECORD_KEY, Deriver, map_back
from egress_proxy.transports.base import Transport, UpstreamRequest, header
from egress_proxy.transports.recorded import RecordedCall
from record.digest import Domain, canonical_json, digest, prompt_bytes
from record.log import Appended, Log
from record.schema import ModelRequest, ModelResponse, Provider

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Upstream:
    """Where a route's calls go, resolved from the config once at start."""

    name: str
    dialect: Dialect
    url: str
    api_key: str | None = field(repr=False)
    api_version: str | None = None  # as configured; the dialect may fill in a default
    timeout_s: float = 600.0  # the whole reply's deadline, from the dial to its last byte
    connect_timeout_s: float = 10.0
    max_reply_bytes: int = 64 * 1024 * 1024  # read no further: cut, recorded as UNKNOWN
    engine_extensions: bool = False  # takes ``clock`` and ``strict_cache`` request members
    inject_clock: bool = True
    clock_rule: ClockRule = CLOCK_RULE  # a replay uses the rule its record was written under


@dataclass(frozen=True)
class ToolIds:
    """A pinned call derives its reply's tool-call ids with this seed (and the prompt digest
    ``identity`` computes); set by ``tool_ids``, read by ``capture`` for the record."""

    seed: int | None


@dataclass
class Call:
    """One model call as it moves through the stages; stages fill in the later fields."""

    session: Session
    upstream: Upstream
    client_headers: Mapping[str, str]  # lower-case names, credential headers removed
    input_bytes: bytes
    request: dict[str, Any]
    request_bytes: bytes
    api_version: str | None = None
    pins: dict[str, Any] | None = None  # the pins set on the request (``ModelRequest.pins``)
    pin_outcome: PinOutcome | None = None  # what ``pins`` did, for the annotation
    clock: str | None = None
    clock_rule: ClockRule | None = None  # where the clock went (``ModelRequest.clock_rule``)
    tool_ids: ToolIds | None = None  # set in pinned sessions: derive tool-call ids
    tool_call_ids: list[tuple[str, str]] | None = None  # (upstream, derived), once committed
    request_seq: int | None = None
    content_key: str | None = None
    prompt_digest: str | None = None
    replay_step: tuple[int, RecordedCall] | None = None  # armed session: the recorded twin
    replay_verdict: dict[str, JsonValue] | None = None  # its verdict, once captured

    def rewrite(self, request: dict[str, Any]) -> None:
        """Replace the request a stage changed, and the bytes that will be sent with it."""
        self.request = request
        self.request_bytes = canonical_json(request)


@dataclass(frozen=True)
class Committed:
    appended: Appended
    outcome: Literal["COMMITTED", "FAILED", "UNKNOWN"]
    response_digest: str | None


@dataclass
class Reply:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: AsyncIterator[bytes]
    committed: asyncio.Future[Committed] | None = None  # resolved by ``capture``
    close: Callable[[], Awaitable[None]] | None = None
    deadline: float | None = None  # the event loop's time by which the whole reply is read

    @property
    def is_sse(self) -> bool:
        content_type = (header(self.headers, "content-type") or "").lower()
        return content_type.startswith("text/event-stream")


Handler = Callable[[Call], Coroutine[Any, Any, Reply]]
Stage = Callable[[Call, Handler], Coroutine[Any, Any, Reply]]


class TaskSet:
    """Tasks that must outlive the request that started them (captures): kept, then drained."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its awaiter may have been cancelled (client gone)

    async def drain(self, timeout: float) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)


def compose(stages: Sequence[Stage], handler: Handler) -> Handler:
    """``stages[0]`` outermost; each stage's ``next`` is the rest of the chain."""
    for stage in reversed(stages):
        handler = _bind(stage, handler)
    return handler


def _bind(stage: Stage, nxt: Handler) -> Handler:
    async def bound(call: Call) -> Reply:
        return await stage(call, nxt)

    return bound


def build_pipeline(
    log: Log, transport: Transport, tasks: TaskSet, clock: Clock | None = None
) -> Handler:
    """The live chain: every call recorded before it is dialed, every reply after.

    ``clock`` is where the time is read (default: the system clock); tests fix it.
    """
    stages = [
        annotate,
        replay_step(log),
        pins,
        clock_stage(clock if clock is not None else Clock.system()),
        tool_ids,
        identity(log),
        capture(log, tasks),
    ]
    return compose(stages, dial(transport))


# -- request stages ----------------------------------------------------------------------------


def replay_step(log: Log) -> Stage:
    """In a session armed with a replay plan: take the next recorded step, put its pins
    (recorded as ``pins.set`` when they change) and its clock (``Clock.fixed``) on the
    session, and let ``capture`` judge the reply against it. Past the plan: ``ReplayMiss``."""

    async def stage(call: Call, next: Handler) -> Reply:
        plan = call.session.replay
        if plan is None:
            return await next(call)
        model = call.request.get("model")
        name = model if isinstance(model, str) else ""
        ordinal, step = plan.next_step(call.upstream.url, name, call.input_bytes)
        body = step.body
        assert isinstance(body, ModelRequest)
        session = call.session
        wanted = plan.pins_override if plan.pins_override is not None else step.pins
        if (wanted or None) != (session.pins or None):
            await _append(log, session, pins_entry(dict(wanted or {})))
            session.pins = dict(wanted) if wanted else None
        session.clock = Clock.fixed(body.clock) if body.clock is not None else None
        call.replay_step = (ordinal, step)
        return await next(call)

    return stage


async def pins(call: Call, next: Handler) -> Reply:
    """Set the session's pins (read once: a ``set_pins`` meanwhile applies to the next call)."""
    up = call.upstream
    outcome = apply_pins(
        up.dialect,
        call.request,
        call.session.pins,
        provider=up.name,
        engine_extensions=up.engine_extensions,
    )
    call.pin_outcome = outcome
    if outcome.session is not None:
        call.pins = outcome.applied
        if outcome.applied:
            call.rewrite(outcome.request)
    return await next(call)


def clock_stage(clock: Clock) -> Stage:
    """Sample the clock once for this call and put it into the prompt (unless the provider's
    config says ``inject_clock = false``); a session's own clock, if set, wins."""

    async def stage(call: Call, next: Handler) -> Reply:
        up = call.upstream
        if up.inject_clock:
            now = (call.session.clock or clock).sample()
            sent = inject_clock(
                up.dialect.name,
                call.request,
                now,
                engine_field=up.engine_extensions,
                rule=up.clock_rule,
            )
            if sent is not None:
                call.clock, call.clock_rule = now, up.clock_rule
                call.rewrite(sent)
        return await next(call)

    return stage


async def tool_ids(call: Call, next: Handler) -> Reply:
    """Upstream ids go out for derived ids the session issued (even after it is unpinned);
    in a pinned session, derived ids come back to the client in place of the upstream's."""
    session = call.session
    dialect = call.upstream.dialect.name
    back = map_back(dialect, call.request, session.tool_ids)
    if back is not None:
        call.rewrite(back)
    # The pins the ``pins`` stage read, so a ``set_pins`` meanwhile cannot split the call.
    in_force = call.pin_outcome.session if call.pin_outcome is not None else session.pins
    if not in_force:
        return await next(call)
    seed = call.request.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        pinned = in_force.get("seed")
        seed = pinned if isinstance(pinned, int) and not isinstance(pinned, bool) else None
    call.tool_ids = ToolIds(seed)
    reply = await next(call)
    if reply.committed is None or not 200 <= reply.status < 300:
        return reply
    assert call.prompt_digest is not None, "identity ran"
    deriver = Deriver(dialect, call.prompt_digest, seed, on_new=session.tool_ids.add)
    body = deriver.rewrite_stream(reply.body) if reply.is_sse else deriver.rewrite_whole(reply.body)
    return replace(reply, body=body)


def identity(log: Log) -> Stage:
    async def stage(call: Call, next: Handler) -> Reply:
        prompt = prompt_bytes(call.request)
        model = call.request.get("model")
        body = ModelRequest(
            content_key=digest(Domain.REQUEST, call.request_bytes),
            input_digest=digest(Domain.INPUT, call.input_bytes),
            prompt_digest=digest(Domain.PROMPT, prompt),
            request_bytes=call.request_bytes,
            input_bytes=call.input_bytes,
            prompt_bytes=prompt,
            provider=_provider(call),
            model_id=model if isinstance(model, str) else "",
            params=params_of(call.request),
            pins=call.pins,
            clock=call.clock,
            clock_rule=call.clock_rule,
            turn=_position(call.client_headers, TURN_HEADER),
            step=_position(call.client_headers, STEP_HEADER),
        )
        appended = await _append(log, call.session, body)
        call.request_seq, call.content_key = appended.seq, body.content_key
        call.prompt_digest = body.prompt_digest
        return await next(call)

    return stage


#: Headers a harness sets to say which turn and step a model call belongs to; recorded in the
#: ``model.request`` (never sent upstream: they are not part of the request bytes).
TURN_HEADER = "x-affidavit-turn"
STEP_HEADER = "x-affidavit-step"


def _position(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else None


def _provider(call: Call) -> Provider:
    return Provider(
        name=call.upstream.name, endpoint=call.upstream.url, api_version=call.api_version
    )


async def _append(log: Log, session: Session, body: Any) -> Appended:
    try:
        appended = await log.append_async(session.id, body)
    except Exception as exc:
        raise RecordUnavailable(f"the record refused the {body.kind} entry: {exc}") from exc
    session.noted(appended)
    return appended


def dial(transport: Transport) -> Handler:
    async def handler(call: Call) -> Reply:
        up = call.upstream
        request = UpstreamRequest(
            method="POST",
            url=up.url,
            headers=up.dialect.upstream_headers(call.client_headers, up.api_key, call.api_version),
            body=call.request_bytes,
            timeout_s=up.timeout_s,
            connect_timeout_s=up.connect_timeout_s,
        )
        # ``timeout_s`` bounds the whole reply: the transport's timeouts are per read, so a
        # slow drip would never trip them. Headers must come by the deadline, and ``capture``
        # stops reading the body there.
        deadline = asyncio.get_running_loop().time() + up.timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                response = await transport.send(request)
        except TimeoutError:
            raise UpstreamUnavailable(
                f"{up.url}: no reply within timeout_s ({up.timeout_s:g} s)"
            ) from None
        return Reply(
            response.status,
            response.headers,
            response.body(),
            close=response.aclose,
            deadline=deadline,
        )

    return handler


# -- reply stages ------------------------------------------------------------------------------


def capture(log: Log, tasks: TaskSet) -> Stage:
    async def stage(call: Call, next: Handler) -> Reply:
        assert call.request_seq is not None, "capture runs after identity"
        try:
            reply = await next(call)
        except UpstreamUnavailable:
            unknown = ModelResponse(request_seq=call.request_seq, outcome="UNKNOWN")
            await _append(log, call.session, unknown)
            raise
        pump = _Pump(log, call, reply)
        tasks.spawn(pump.run())
        return replace(reply, body=pump.read(), committed=pump.committed, close=None)

    return stage


_END = object()


class _Pump:
    """Reads one reply to its end whatever its reader does, then commits it."""

    def __init__(self, log: Log, call: Call, reply: Reply) -> None:
        self.log, self.call, self.reply = log, call, reply
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.committed: asyncio.Future[Committed] = asyncio.get_running_loop().create_future()
        self.reader_gone = False

    async def run(self) -> None:
        try:
            body, cut = await self._read_to_end()
            entry = self._recordable(body, cut)
            del body  # the entry holds the bytes now: one copy fewer while it is written
            appended = await _append(self.log, self.call.session, entry)
        except BaseException as exc:  # not committed: whoever still reads must learn it
            error = exc if isinstance(exc, ProxyError) else RecordUnavailable(repr(exc))
            self.committed.set_exception(error)
            self.committed.exception()  # marked retrieved: the reader may be long gone
            self.queue.put_nowait(error)
            if not isinstance(exc, Exception):
                raise
            call = self.call
            logger.error("reply %s/%s not committed: %s", call.session.id, call.request_seq, exc)
            return
        self.committed.set_result(Committed(appended, entry.outcome, entry.response_digest))
        self.queue.put_nowait(cut or _END)

    async def _read_to_end(self) -> tuple[bytes, UpstreamCut | ResponseTooLarge | None]:
        """The reply's bytes, read to its end, to ``max_reply_bytes`` or to the deadline,
        whichever comes first; and why it stopped early, if it did."""
        up = self.call.upstream
        received = bytearray()
        cut: UpstreamCut | ResponseTooLarge | None = None
        try:
            async with asyncio.timeout_at(self.reply.deadline) as within:
                async for chunk in self.reply.body:
                    room = up.max_reply_bytes - len(received)
                    if len(chunk) > room:
                        chunk = chunk[:room]
                        cut = ResponseTooLarge(
                            f"{up.url}: the reply exceeds max_reply_bytes "
                            f"({up.max_reply_bytes}); what arrived before it is recorded"
                        )
                    received += chunk
                    if chunk and not self.reader_gone:
                        self.queue.put_nowait(chunk)
                    if cut is not None:
                        break
        except UpstreamCut as exc:
            cut = exc
        except TimeoutError as exc:
            if not within.expired():
                cut = UpstreamCut(f"TimeoutError: {exc}")
            else:
                cut = UpstreamCut(
                    f"{up.url}: the reply did not end within timeout_s ({up.timeout_s:g} s)"
                )
        except Exception as exc:  # whatever stopped the body, the reply is incomplete
            cut = UpstreamCut(f"{type(exc).__name__}: {exc}")
        finally:
            if self.reply.close is not None:
                await self.reply.close()
        return bytes(received), cut

    def _recordable(self, body: bytes, cut: ProxyError | None) -> ModelResponse:
        """The entry for this reply. Its bytes are always recorded: if reading facts out of
        them fails (JSON past ``record.limits``, or anything else odd), the facts are left
        empty rather than the reply unrecorded."""
        try:
            return self._response(body, cut)
        except Exception as exc:
            call = self.call
            logger.warning(
                "reply %s/%s recorded without facts: %s", call.session.id, call.request_seq, exc
            )
            return self._response_of(body, cut, facts=False)

    def _response(self, body: bytes, cut: ProxyError | None) -> ModelResponse:
        entry = self._response_of(body, cut)
        call = self.call
        if call.replay_step is None or call.session.replay is None:
            return entry
        ordinal, step = call.replay_step
        verdict = call.session.replay.verdict(
            ordinal,
            step,
            prompt_digest=call.prompt_digest,
            clock=call.clock,
            content_key=call.content_key,
            reply=body if cut is None else b"",
            status=self.reply.status if cut is None else 0,
        )
        call.replay_verdict = verdict
        block = {**(entry.reproducibility or {}), VERDICT_KEY: cast(JsonValue, verdict)}
        return entry.model_copy(update={"reproducibility": block})

    def _response_of(
        self, body: bytes, cut: ProxyError | None, *, facts: bool = True
    ) -> ModelResponse:
        assert self.call.request_seq is not None
        seq, status = self.call.request_seq, self.reply.status
        if cut is not None:  # what arrived before the cut, kept as evidence
            kept = body or None
            ids = (
                self._with_tool_call_ids(None, body)
                if facts and kept and 200 <= status < 300
                else None
            )
            return ModelResponse(
                request_seq=seq,
                outcome="UNKNOWN",
                status=status,
                response_bytes=kept,
                response_digest=digest(Domain.RESPONSE, body) if kept else None,
                reproducibility=ids,  # ids delivered before the cut, if any
            )
        if 200 <= status < 300:
            fingerprint, block = reply_facts(body, self.reply.is_sse) if facts else (None, None)
            block = self._with_tool_call_ids(block, body) if facts else None
            return ModelResponse(
                request_seq=seq,
                outcome="COMMITTED",
                status=status,
                response_bytes=body,
                response_digest=digest(Domain.RESPONSE, body),
                fingerprint=fingerprint,
                reproducibility=block,
            )
        return ModelResponse(
            request_seq=seq,
            outcome="FAILED",
            status=status,
            error_bytes=body,
            error_digest=digest(Domain.ERROR, body),
        )

    def _with_tool_call_ids(
        self, block: dict[str, JsonValue] | None, body: bytes
    ) -> dict[str, JsonValue] | None:
        """``block`` plus a pinned reply's tool-call id mapping, read from the whole body (so
        it holds whatever the client read); the session's table learns the ids too."""
        call = self.call
        if call.tool_ids is None or call.prompt_digest is None:
            return block
        table = call.session.tool_ids
        deriver = Deriver(
            call.upstream.dialect.name, call.prompt_digest, call.tool_ids.seed, on_new=table.add
        )
        call.tool_call_ids = deriver.scan(body, self.reply.is_sse) or None
        if call.tool_call_ids is None:
            return block
        pairs = [{"upstream": u, "derived": d} for u, d in call.tool_call_ids]
        return {**(block or {}), RECORD_KEY: cast(list[JsonValue], pairs)}

    async def read(self) -> AsyncIterator[bytes]:
        try:
            while True:
                item = await self.queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.reader_gone = True


async def annotate(call: Call, next: Handler) -> Reply:
    reply = await next(call)
    if reply.committed is None or not 200 <= reply.status < 300:
        return reply
    body = _annotated_stream(call, reply) if reply.is_sse else _annotated_json(call, reply)
    return replace(reply, body=body)


async def _annotated_stream(call: Call, reply: Reply) -> AsyncIterator[bytes]:
    assert reply.committed is not None
    dialect = call.upstream.dialect
    splitter = EventSplitter()
    held = bytearray()  # the terminating event and everything after it
    last: Event | None = None
    async for chunk in reply.body:
        ready = bytearray()  # the whole events this chunk completed, sent in one write
        for block in splitter.feed(chunk):
            if not held:
                event = parse_event(block)
                if not dialect.is_terminal(event):
                    last = event if event.data is not None else last
                    ready += block
                    continue
            held += block
        if ready:
            yield bytes(ready)
    committed = await reply.committed
    yield dialect.annotation_event(annotation(call, committed), last.json() if last else None)
    if held or splitter.tail:
        yield bytes(held) + splitter.tail


async def _annotated_json(call: Call, reply: Reply) -> AsyncIterator[bytes]:
    assert reply.committed is not None
    body = b"".join([chunk async for chunk in reply.body])
    committed = await reply.committed
    spliced = splice_member(body, "affidavit", annotation(call, committed))
    yield body if spliced is None else spliced


def annotation(call: Call, committed: Committed) -> dict[str, Any]:
    """What the client learns once its reply is durable (see ``docs/proxy.md``)."""
    appended = committed.appended
    # The note signed with the reply's own commit covers it; the session's newest one is a
    # fallback for a reply the log did not write (reconstruct).
    note = appended.checkpoint or call.session.latest_checkpoint
    pinned = call.pin_outcome if call.pin_outcome is not None else PinOutcome(call.request)
    mapping = call.tool_call_ids
    return {
        "stream": appended.stream,
        "request_seq": call.request_seq,
        "seq": appended.seq,
        "outcome": committed.outcome,
        "content_key": call.content_key,
        "prompt_digest": call.prompt_digest,
        "response_digest": committed.response_digest,
        "pins": pinned.session,
        "pins_applied": call.pins,
        "pins_not_applied": pinned.not_applied,
        "pins_overrode": pinned.overrode,
        "clock": call.clock,
        "tool_call_ids": [{"upstream": u, "derived": d} for u, d in mapping] if mapping else None,
        "tree_size": appended.tree_size,
        "root_hash": base64.b64encode(appended.root_hash).decode("ascii"),
        "checkpoint": note.decode("utf-8") if note is not None else None,
        "replay": call.replay_verdict,
    }


async def record_refusal(log: Log, call: Call, error: ProxyError) -> tuple[Appended, Appended]:
    """Record a request the proxy refused after reading it (malformed): nothing was sent, so
    ``request_bytes`` is empty; ``error_bytes`` is the error body the client got."""
    prompt = prompt_bytes({})
    request = ModelRequest(
        content_key=digest(Domain.REQUEST, b""),
        input_digest=digest(Domain.INPUT, call.input_bytes),
        prompt_digest=digest(Domain.PROMPT, prompt),
        request_bytes=b"",
        input_bytes=call.input_bytes,
        prompt_bytes=prompt,
        provider=_provider(call),
        model_id="",
        params={},
    )
    first = await _append(log, call.session, request)
    error_body = error.body()
    failed = ModelResponse(
        request_seq=first.seq,
        outcome="FAILED",
        status=error.status,
        error_bytes=error_body,
        error_digest=digest(Domain.ERROR, error_body),
    )
    return first, await _append(log, call.session, failed)
